"""One-off: write conf/experiment/*.yaml from the reference CSVs (grid = the table's compressed rows)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kvbench.reporting.paper_refs import TABLES, load_reference  # noqa: E402

OUT = Path(__file__).resolve().parents[3] / "conf" / "experiment"
LB14 = "[narrativeqa, qasper, multifieldqa_en, hotpotqa, 2wikimqa, musique, gov_report, qmsum, multi_news, trec, triviaqa, samsum, lcc, repobench-p]"
NB32 = "  options:\n    size: 32k\n"
NB8 = "  options:\n    size: 8k\n"
KVPRESS_LB = ("task:\n  question_mode: agnostic\n  length: 4096\n  options:\n    chat_template: model\n"
              "    answer_prefix: assistant\n")

EXTRA = {  # table -> (yaml body added under the top level, comment lines)
    "adakv_early_t1": ("method:\n  gqa_granularity: query_head\n", [
        "Ada-KV v1 did not handle GQA: the KV cache is replicated per query head (h = 32).",
        "Ada-KV v1 used the safeguard alpha = 0.5 (the late version 0.2): set it on ada_snapkv / ada_pyramidkv",
        "(method.params) for this tag once their option files exist."]),
    "adakv_early_t2": ("method:\n  gqa_granularity: query_head\n", [
        "Ada-KV v1: KV replicated per query head; safeguard alpha = 0.5 for the Ada-* methods (see adakv_early_t1)."]),
    "adakv_early_niah": ("", [
        "Needle-in-a-Haystack of Ada-KV v1 (LWM-Text-Chat-1M, B = 128h); the paper gives no length/depth grid",
        "(only that full cache reaches 37K tokens and the compressed methods up to 429K on an A800-80G).",
        "Safeguard alpha = 0.5 for the Ada-* methods (see adakv_early_t1)."]),
    "adakv_late_t4": ("task:\n  question_mode: agnostic\n", ["Question-agnostic: context compressed first, question fed after."]),
    "adakv_late_t5": ("task:\n  question_mode: agnostic\n", ["Question-agnostic: context compressed first, question fed after."]),
    "adakv_late_ruler_text": ("task:\n  question_mode: agnostic\n  length: 16384\n", [
        "RULER-16K (13 tasks), question-agnostic; budgets are fractions of the full cache (ratio0.2 = 20 %)."]),
    "ahakv_t2": ("task:\n  datasets: [2wikimqa, triviaqa, multifieldqa_en, lcc, samsum]\n", [
        "Only the five datasets of the ablation; the AhaKV row reuses ahakv_t1's LLaMA2 run (same tag)."]),
    "cake_t10": ("task:\n" + NB32, ["NeedleBench v1 32K (OpenCompass 32k config: lengths 9K-32K, 11 depths)."]),
    "cake_t12": ("task:\n" + NB32, ["NeedleBench v1 32K (OpenCompass 32k config: lengths 9K-32K, 11 depths)."]),
    "cake_t11": ("task:\n" + NB8, ["NeedleBench v1 8K (OpenCompass 8k config: lengths 5K-8K, 20 depths)."]),
    "xkv_t3": (f"task:\n  datasets: {LB14}\n", [
        "XKV's 14 LongBench datasets (no passage_count / passage_retrieval_en).",
        "Compression ratios 1.6 % and 1.2 % are run as 128L and 96L (the spec's hypothesis: ratio = per-layer",
        "budget / 8000 tokens of Llama-3's truncated prompts)."]),
    "kvpress_leaderboard": (KVPRESS_LB, [
        "NVIDIA/kvpress's leaderboard (evaluation/leaderboard.sh @ 8bb29b9): RULER 4K, the model's chat template,",
        "only the context compressed; budgets cr<c> are kvpress's compression ratios (see the preset's comments)."]),
}
FULL_EXTRA = {"cake_nb32k": "task:\n" + NB32, "cake_nb8k": "task:\n" + NB8, "kvpress_lb": KVPRESS_LB}


def write(name, models, methods, budgets, task, tag, title, body="", comments=(), full_cmd=None):
    lines = ["# @package _global_", f"# {title}"]
    lines += [f"# {c}" for c in comments]
    lines.append(f"# Run: python run.py -m +experiment={name}")
    if full_cmd:
        lines.append(f"# Full-cache row: python run.py -m +experiment={full_cmd}")
    lines += ["run:", f"  experiment: {name}", f"  tag: {tag}"]
    text = "\n".join(lines) + "\n" + body
    text += ("hydra:\n  sweeper:\n    params:\n"
             f"      model: {','.join(models)}\n      task: {task}\n"
             f"      method: {','.join(methods)}\n      budget: {','.join(budgets)}\n")
    (OUT / f"{name}.yaml").write_text(text)


full_groups = {}
for tid, spec in TABLES.items():
    if spec.kind != "scores":
        continue
    ref = load_reference(tid)
    rows = ref.drop_duplicates("row")
    comp = rows[(rows.method != "full") & (rows.method != "")]
    task = rows.task.iloc[0]
    tag = spec.tags[0]
    body, comments = EXTRA.get(tid, ("", []))
    title = f"{spec.paper}, {spec.title}. Reference numbers: results/paper/{tid}.csv"
    models = list(dict.fromkeys(comp.model))
    by_model_budget = {m: tuple(dict.fromkeys(comp[comp.model == m].budget)) for m in models}
    groups = {}
    for m, b in by_model_budget.items():
        groups.setdefault(b, []).append(m)
    full_tag = "adakv_late" if tag == "adakv_late_agnostic" else tag
    has_full = (rows.method == "full").any()
    if has_full:
        g = full_groups.setdefault(full_tag, {"models": [], "task": task, "body": FULL_EXTRA.get(full_tag, "")})
        for m in dict.fromkeys(rows[rows.method == "full"].model):
            if m not in g["models"]:
                g["models"].append(m)
    for i, (budgets, ms) in enumerate(groups.items()):
        name = tid if i == 0 else f"{tid}_{ms[0].split('-')[0]}"
        methods = list(dict.fromkeys(comp[comp.model.isin(ms)].method))
        extra_c = list(comments)
        if len(groups) > 1:
            others = [f"{tid}_{m[0].split('-')[0]}" if j else tid for j, (_, m) in enumerate(groups.items())]
            extra_c.append("This table's models use different budgets; its grid is split over: " + ", ".join(others))
        write(name, ms, methods, list(budgets), task, tag, title, body, extra_c,
              full_cmd=f"{full_tag}_full" if has_full else None)
for ftag, g in full_groups.items():
    write(f"{ftag}_full", g["models"], ["full"], ["full"], g["task"], ftag,
          f"Full-cache reference runs shared by the {ftag} tables (tag {ftag}).", g["body"])
print(sorted(p.name for p in OUT.glob("*.yaml")))
