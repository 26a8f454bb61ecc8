"""Write the tiny LongBench fixtures in ``tasks/longbench/fixtures`` (our own text, official jsonl schema).

Three lines per dataset for all 21 datasets (``<name>.jsonl``) and for the 13 LongBench-E ones (``<name>_e.jsonl``,
with ``length`` values in the three buckets 0-4k / 4-8k / 8k+).  The text is written for these fixtures and
only mimics the *shape* of each dataset (few-shot blocks, numbered paragraphs, code), so prompts, splits and
scorers can be tested offline.  Re-run with ``python tasks/longbench/make_fixtures.py``; the output is
deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "fixtures"

STORY = (
    "Mara kept the lighthouse on Gull Rock for eleven winters. Each evening she climbed the ninety steps, "
    "trimmed the wick and wrote the weather in a green ledger. When the supply boat failed to come in March, "
    "she rationed the oil and burned only the small lamp, and the fishermen of Port Ellin still found their way."
)
ARTICLE = (
    "We study sparse key-value caches for long documents. Our method scores each cached token by the attention "
    "it receives from a short observation window and keeps the highest scoring tokens. On a corpus of 3,000 "
    "reports the method keeps 92 percent of the full-cache accuracy with one tenth of the memory."
)
PASSAGES = [
    "Passage 1:\nThe Verrin Bridge crosses the Alda river and was opened in 1911 by the engineer Tomas Hale.",
    "Passage 2:\nTomas Hale was born in Corrick and later taught mechanics at the Northfield Institute.",
    "Passage 3:\nThe Northfield Institute is a technical college founded in 1887 in the town of Brill.",
]
REPORT = (
    "The agency reviewed the maintenance of rural water systems in twelve districts. Inspectors found that "
    "half of the pumps lacked service records. The agency recommends a shared register of repairs and yearly "
    "audits. Officials agreed with the recommendations and plan to start the register next year."
)
MEETING = (
    "Chair: Let us start with the budget for the reading room.\nAnna: We need new shelves and two lamps.\n"
    "Ben: The shelves can wait; the lamps are urgent because the room is dark in winter.\n"
    "Chair: Then we buy the lamps now and revisit the shelves in spring."
)
NEWS = (
    "Passage 1: Heavy rain closed the coastal road near Selby on Tuesday, and crews cleared the mud by evening.\n"
    "Passage 2: Residents of Selby said the road floods every autumn and asked the council for a new drain."
)
TREC_SHOTS = (
    "Question: Where is the tallest tower of the old port ?\nType: Other location\n"
    "Question: Who painted the blue ceiling of the town hall ?\nType: Individual\n"
    "Question: How many steps lead to the lighthouse lamp ?\nType: Number of something\n"
)
TRIVIA_SHOTS = (
    "Passage: The river Alda flows into the Grey Sea at the port of Brill.\n"
    "Question: Into which sea does the Alda flow?\nAnswer: the Grey Sea\n"
)
SAMSUM_SHOTS = (
    "Dialogue: Kim: Are you coming to the market? Leo: Yes, at ten. Kim: Great, bring bags.\n"
    "Summary: Leo will meet Kim at the market at ten and bring bags.\n"
)
PARAGRAPHS = [
    "The orchard on the hill grows late apples that ripen after the first frost.",
    "A narrow canal links the mill pond to the river and carries timber in spring.",
    "The village choir sings every Sunday in the stone chapel by the square.",
    "Old maps show a ferry crossing where the new bridge now stands.",
]
CODE = (
    "import math\n\n\nclass Circle:\n    def __init__(self, radius):\n        self.radius = radius\n\n"
    "    def area(self):\n        return math.pi * self.radius ** 2\n\n    def perimeter(self):\n"
)
ZH_TEXT = "小镇的图书馆在周末开放到晚上九点。馆里新添了三百本儿童读物，还开设了每周一次的读书会。"
ZH_DOCS = "文章1：西河大桥于一九一一年建成，全长四百米。\n文章2：大桥的设计者是工程师何明，他后来在北原学院任教。"
ZH_MEETING = "主持人：今天讨论阅览室的预算。\n小王：我们需要新书架和两盏台灯。\n小李：台灯更急，冬天屋里太暗。"
LSHT_SHOTS = (
    "新闻：本市新建的体育馆将于下月开放，可容纳五千名观众。\n类别：体育\n新闻：央行宣布下调存款利率。\n类别：财经\n"
)
ZH_PARAGRAPHS = ["山上的果园种着晚熟的苹果。", "一条小运河连接磨坊池塘和河流。", "村里的合唱团每周日在教堂唱歌。"]

TREC_CLASSES = [
    "Abbreviation",
    "Expression abbreviated",
    "Individual",
    "Number of something",
    "Other location",
    "City",
    "Country",
    "Date",
    "Definition of something",
]
LSHT_CLASSES = ["体育", "财经", "教育", "科技", "文化"]


def line(
    dataset: str,
    language: str,
    index: int,
    context: str,
    input_: str,
    answers: list[str],
    all_classes: list[str] | None = None,
) -> dict[str, Any]:
    """One fixture line in the official field order; ``length`` = words (en/code) or characters (zh)."""
    text = input_ + context + "".join(answers)
    length = len(text) if language == "zh" else len(text.split())
    return {
        "input": input_,
        "context": context,
        "answers": answers,
        "length": length,
        "dataset": dataset,
        "language": language,
        "all_classes": all_classes,
        "_id": f"fixture-{dataset}-{index}",
    }


def numbered(paragraphs: list[str], word: str = "Paragraph") -> str:
    """``Paragraph 1: ...`` blocks as in passage_count / passage_retrieval."""
    sep = " " if word == "Paragraph" else ""
    return "\n\n".join(f"{word}{sep}{i}: {p}" for i, p in enumerate(paragraphs, start=1))


def fixtures() -> dict[str, list[dict[str, Any]]]:
    """All fixture lines by dataset name."""
    docs = "\n\n".join(PASSAGES)
    data: dict[str, list[dict[str, Any]]] = {
        "narrativeqa": [
            ("How many winters did Mara keep the lighthouse?", ["eleven winters", "eleven"]),
            ("Where is the lighthouse?", ["On Gull Rock"]),
            ("What did Mara burn when oil ran short?", ["only the small lamp"]),
        ],
        "qasper": [
            ("How much memory does the method use?", ["one tenth of the memory"]),
            ("How large is the corpus?", ["3,000 reports"]),
            ("Is the method evaluated on speech?", ["unanswerable"]),
        ],
        "multifieldqa_en": [
            ("How many steps lead to the lamp?", ["ninety"]),
            ("What colour is the ledger?", ["green"]),
            ("Which town's fishermen relied on the light?", ["Port Ellin"]),
        ],
        "hotpotqa": [
            ("Where was the engineer of the Verrin Bridge born?", ["Corrick"]),
            ("In which town is the institute where Tomas Hale taught?", ["Brill"]),
            ("When was the bridge opened?", ["1911"]),
        ],
        "2wikimqa": [
            ("Which was founded first, the Northfield Institute or the Verrin Bridge?", ["Northfield Institute"]),
            ("Who opened the Verrin Bridge?", ["Tomas Hale"]),
            ("What river does the Verrin Bridge cross?", ["Alda"]),
        ],
        "musique": [
            ("What subject was taught by the man who opened the Verrin Bridge?", ["mechanics"]),
            ("In what year was the college where Hale taught founded?", ["1887"]),
            ("What did Tomas Hale build?", ["the Verrin Bridge"]),
        ],
    }
    out: dict[str, list[dict[str, Any]]] = {}
    contexts = {"narrativeqa": STORY, "qasper": ARTICLE, "multifieldqa_en": STORY}
    for name, qas in data.items():
        ctx = contexts.get(name, docs)
        out[name] = [line(name, "en", i, ctx, q, a) for i, (q, a) in enumerate(qas)]
    out["gov_report"] = [
        line("gov_report", "en", 0, REPORT, "", ["Pumps lacked service records. The agency recommends a register."]),
        line("gov_report", "en", 1, REPORT + " A pilot will run in two districts.", "", ["A pilot of the register."]),
        line("gov_report", "en", 2, REPORT, "", ["Half of the pumps had no records. Audits are recommended."]),
    ]
    out["qmsum"] = [
        line("qmsum", "en", 0, MEETING, "What did the group decide to buy?", ["They decided to buy the lamps now."]),
        line("qmsum", "en", 1, MEETING, "Why were the lamps urgent?", ["The room is dark in winter."]),
        line("qmsum", "en", 2, MEETING, "Summarize the discussion.", ["Lamps now, shelves in spring."]),
    ]
    out["multi_news"] = [
        line("multi_news", "en", 0, NEWS, "", ["Rain closed the Selby road; residents want a new drain."]),
        line("multi_news", "en", 1, NEWS, "", ["The coastal road near Selby floods every autumn."]),
        line("multi_news", "en", 2, NEWS, "", ["Crews cleared mud after heavy rain near Selby."]),
    ]
    out["trec"] = [
        line(
            "trec",
            "en",
            0,
            TREC_SHOTS,
            "Question: What does NATO stand for ?\nType:",
            ["Expression abbreviated"],
            TREC_CLASSES,
        ),
        line("trec", "en", 1, TREC_SHOTS, "Question: In which city is the old mill ?\nType:", ["City"], TREC_CLASSES),
        line(
            "trec",
            "en",
            2,
            TREC_SHOTS,
            "Question: How many bells hang in the tower ?\nType:",
            ["Number of something"],
            TREC_CLASSES,
        ),
    ]
    out["triviaqa"] = [
        line(
            "triviaqa",
            "en",
            0,
            TRIVIA_SHOTS,
            "Passage: Brill has a stone harbour.\nQuestion: What is the harbour of Brill made of?\nAnswer:",
            ["stone", "Stone"],
        ),
        line(
            "triviaqa",
            "en",
            1,
            TRIVIA_SHOTS,
            "Passage: The Alda is 300 km long.\nQuestion: How long is the Alda?\nAnswer:",
            ["300 km"],
        ),
        line(
            "triviaqa",
            "en",
            2,
            TRIVIA_SHOTS,
            "Passage: Gull Rock has one lighthouse.\nQuestion: What stands on Gull Rock?\nAnswer:",
            ["a lighthouse", "lighthouse"],
        ),
    ]
    out["samsum"] = [
        line(
            "samsum",
            "en",
            0,
            SAMSUM_SHOTS,
            "Dialogue: Ana: Lunch at noon? Tom: Sure, at the cafe.\nSummary:",
            ["Ana and Tom will have lunch at the cafe at noon."],
        ),
        line(
            "samsum",
            "en",
            1,
            SAMSUM_SHOTS,
            "Dialogue: Eva: I lost my keys. Max: Check the car.\nSummary:",
            ["Eva lost her keys and Max suggests checking the car."],
        ),
        line(
            "samsum",
            "en",
            2,
            SAMSUM_SHOTS,
            "Dialogue: Sam: Game tonight? Joe: Can't, exam tomorrow.\nSummary:",
            ["Joe can't play tonight because of an exam."],
        ),
    ]
    count_ctxs = [
        ([*PARAGRAPHS[:3], PARAGRAPHS[0]], "3"),
        (PARAGRAPHS, "4"),
        ([PARAGRAPHS[1], PARAGRAPHS[1], PARAGRAPHS[2]], "2"),
    ]
    out["passage_count"] = [
        line("passage_count", "en", i, numbered(ps), "", [ans]) for i, (ps, ans) in enumerate(count_ctxs)
    ]
    abstracts = ["Late apples ripen after frost.", "A canal carries timber.", "A choir sings on Sundays."]
    out["passage_retrieval_en"] = [
        line("passage_retrieval_en", "en", i, numbered(PARAGRAPHS), abstracts[i], [f"Paragraph {i + 1}"])
        for i in range(3)
    ]
    out["lcc"] = [
        line("lcc", "code", 0, CODE, "", ["        return 2 * math.pi * self.radius"]),
        line("lcc", "code", 1, "def add(a, b):\n    # sum two numbers\n", "", ["    return a + b"]),
        line("lcc", "code", 2, "for i in range(10):\n", "", ["    print(i)"]),
    ]
    out["repobench-p"] = [
        line("repobench-p", "code", 0, "# shapes/circle.py\n" + CODE, "c = Circle(2)\n", ["print(c.area())"]),
        line(
            "repobench-p",
            "code",
            1,
            "# util.py\ndef add(a, b):\n    return a + b\n",
            "total = 0\n",
            ["total = add(total, 1)"],
        ),
        line(
            "repobench-p",
            "code",
            2,
            "# io.py\nimport json\n",
            "def load(path):\n",
            ["    return json.load(open(path))"],
        ),
    ]
    out["multifieldqa_zh"] = [
        line("multifieldqa_zh", "zh", 0, ZH_TEXT, "图书馆周末开放到几点？", ["晚上九点"]),
        line("multifieldqa_zh", "zh", 1, ZH_TEXT, "新添了多少本儿童读物？", ["三百本"]),
        line("multifieldqa_zh", "zh", 2, ZH_TEXT, "读书会多久举办一次？", ["每周一次"]),
    ]
    out["dureader"] = [
        line("dureader", "zh", 0, ZH_DOCS, "西河大桥是哪一年建成的？", ["一九一一年建成。"]),
        line("dureader", "zh", 1, ZH_DOCS, "大桥有多长？", ["全长四百米。"]),
        line("dureader", "zh", 2, ZH_DOCS, "大桥的设计者是谁？", ["工程师何明设计了大桥。"]),
    ]
    out["vcsum"] = [
        line("vcsum", "zh", 0, ZH_MEETING, "", ["会议讨论了阅览室预算，决定先买台灯。"]),
        line("vcsum", "zh", 1, ZH_MEETING, "", ["大家认为台灯比书架更急。"]),
        line("vcsum", "zh", 2, ZH_MEETING, "", ["阅览室需要书架和台灯。"]),
    ]
    out["lsht"] = [
        line("lsht", "zh", 0, LSHT_SHOTS, "新闻：新学期全市中小学将增加体育课时。\n类别：", ["教育"], LSHT_CLASSES),
        line("lsht", "zh", 1, LSHT_SHOTS, "新闻：一家公司发布了新型手机芯片。\n类别：", ["科技"], LSHT_CLASSES),
        line("lsht", "zh", 2, LSHT_SHOTS, "新闻：市博物馆举办古代书画展。\n类别：", ["文化"], LSHT_CLASSES),
    ]
    zh_abstracts = ["晚熟的苹果。", "运河连接池塘和河流。", "合唱团周日唱歌。"]
    out["passage_retrieval_zh"] = [
        line("passage_retrieval_zh", "zh", i, numbered(ZH_PARAGRAPHS, "段落"), zh_abstracts[i], [f"段落{i + 1}"])
        for i in range(3)
    ]
    return out


LONGBENCH_E = [
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
]
#: Declared ``length`` of the three LongBench-E fixture lines: one per bucket (0-4k, 4-8k, 8k+).
E_LENGTHS = (1200, 5000, 9000)


def main() -> None:
    """Write every fixture file."""
    OUT.mkdir(exist_ok=True)
    data = fixtures()
    for name, lines in data.items():
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for obj in lines:
                handle.write(json.dumps(obj, ensure_ascii=False) + "\n")
    for name in LONGBENCH_E:
        with open(OUT / f"{name}_e.jsonl", "w", encoding="utf-8") as handle:
            for obj, length in zip(data[name], E_LENGTHS, strict=True):
                record = {**obj, "length": length, "_id": obj["_id"].replace("fixture-", "fixture-e-")}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {len(data)} + {len(LONGBENCH_E)} fixture files to {OUT}")


if __name__ == "__main__":
    main()
