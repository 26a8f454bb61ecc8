"""Answer extraction for the long-reasoning benchmarks: Qwen2.5-Math ``evaluation/parser.py`` (commit ``a45202b``)
re-implemented -- :func:`extract_answer` (the boxed / "the answer is" / last-number rules) and :func:`strip_string`
(its normalisation: ``\\dfrac``/``\\tfrac`` to ``\\frac``, units, ``\\text{}``, degrees, dollars, percent,
``x=`` prefixes, trailing zeros, ``\\frac12`` and ``a/b`` to ``\\frac{a}{b}``).  Tested against the official code's
recorded outputs (``tests/tasks/recorded/reasoning_official.json``, ``tests/fixtures/reference/graders/math.json``).
Number words ("five") are read as the ``word2number`` package the official code calls (:func:`word_to_num`).
:func:`official_prediction` is the whole official path from a generation to the graded answer: ``run_execute``
(``extract_answer``, then ``strip_string`` once more) and ``math_eval.py``'s multiple-choice clean-up.
"""

from __future__ import annotations

import re

#: The official list of unit words removed from answers (``parser.py``'s ``unit_texts``, mainly from MathQA), each
#: also with a plural ``s``; order matters (applied in sequence, twice).
_UNIT_WORDS: tuple[str, ...] = (
    "east",
    "degree",
    "mph",
    "kmph",
    "ft",
    "m sqaure",
    " m east",
    "sq m",
    "deg",
    "mile",
    "q .",
    "monkey",
    "prime",
    "ratio",
    "profit of rs",
    "rd",
    "o",
    "gm",
    "p . m",
    "lb",
    "tile",
    "per",
    "dm",
    "lt",
    "gain",
    "ab",
    "way",
    "west",
    "a .",
    "b .",
    "c .",
    "d .",
    "e .",
    "f .",
    "g .",
    "h .",
    "t",
    "a",
    "h",
    "no change",
    "men",
    "soldier",
    "pie",
    "bc",
    "excess",
    "st",
    "inches",
    "noon",
    "percent",
    "by",
    "gal",
    "kmh",
    "c",
    "acre",
    "rise",
    "a . m",
    "th",
    "π r 2",
    "sq",
    "mark",
    "l",
    "toy",
    "coin",
    "sq . m",
    "gallon",
    "° f",
    "profit",
    "minw",
    "yr",
    "women",
    "feet",
    "am",
    "pm",
    "hr",
    "cu cm",
    "square",
    "v â € ™",
    "are",
    "rupee",
    "rounds",
    "cubic",
    "cc",
    "mtr",
    "s",
    "ohm",
    "number",
    "kmph",
    "day",
    "hour",
    "minute",
    "min",
    "second",
    "man",
    "woman",
    "sec",
    "cube",
    "mt",
    "sq inch",
    "mp",
    "∏ cm ³",
    "hectare",
    "more",
    "sec",
    "unit",
    "cu . m",
    "cm 2",
    "rs .",
    "rs",
    "kg",
    "g",
    "month",
    "km",
    "m",
    "cm",
    "mm",
    "apple",
    "liter",
    "loss",
    "yard",
    "pure",
    "year",
    "increase",
    "decrease",
    "d",
    "less",
    "Surface",
    "litre",
    "pi sq m",
    "s .",
    "metre",
    "meter",
    "inch",
)
UNIT_TEXTS: tuple[str, ...] = _UNIT_WORDS + tuple(word + "s" for word in _UNIT_WORDS)

#: ``word2number``'s American number words and their values (``"point"`` starts the decimals).
_NUMBER_WORDS: dict[str, int] = {
    word: value
    for value, word in enumerate(
        (
            *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
            *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"),
        )
    )
}
_NUMBER_WORDS.update({"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70})
_NUMBER_WORDS.update({"eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "million": 10**6})
_NUMBER_WORDS["billion"] = 10**9
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SCALES = ("billion", "million", "thousand")


def _group_value(words: list[str]) -> int:
    """``word2number``'s ``number_formation``: the value of the words before a scale word (at most four are read:
    ``a*b + c + d``, ``a*b + c``, ``a*b`` with a hundred else ``a + b``, ``a``; raises on an empty group)."""
    values = [_NUMBER_WORDS[word] for word in words]
    if len(values) == 4:
        return values[0] * values[1] + values[2] + values[3]
    if len(values) == 3:
        return values[0] * values[1] + values[2]
    if len(values) == 2:
        return values[0] * values[1] if 100 in values else values[0] + values[1]
    return values[0]


def _decimal_value(words: list[str]) -> float:
    """The digits named after ``point`` as a fraction (``"five"`` -> 0.5); 0 when a word is not a digit."""
    if any(word not in _DIGIT_WORDS for word in words):
        return 0
    return float("0." + "".join(str(_DIGIT_WORDS.index(word)) for word in words))


def word_to_num(text: str) -> int | float:
    """``word2number.w2n.word_to_num`` (1.1), rule for rule: a digit string is ``int(text)`` (raises on digits
    ``int`` does not read, "7²"); otherwise the number words of the text (other words are skipped: "a + one" is
    1) make billions, millions, thousands and the rest, then the ``point`` decimals; raises ``ValueError`` with no
    number word, a repeated scale or ``point``, or scales out of order (``IndexError`` where word2number does)."""
    text = text.replace("-", " ").lower()
    if text.isdigit():
        return int(text)
    words = [word for word in text.strip().split() if word in _NUMBER_WORDS or word == "point"]
    if not words:
        raise ValueError("no number word")
    if any(words.count(word) > 1 for word in (*_SCALES, "point")):
        raise ValueError("redundant number word")
    decimals: list[str] = []
    if "point" in words:
        decimals, words = words[words.index("point") + 1 :], words[: words.index("point")]
    at = {scale: words.index(scale) if scale in words else -1 for scale in _SCALES}
    billion, million, thousand = at["billion"], at["million"], at["thousand"]
    if (thousand > -1 and (thousand < million or thousand < billion)) or (million > -1 and million < billion):
        raise ValueError("malformed number")
    total: int | float = 0
    if len(words) == 1:
        total += _NUMBER_WORDS[words[0]]
    elif words:
        if billion > -1:
            total += _group_value(words[:billion]) * 10**9
        if million > -1:
            total += _group_value(words[billion + 1 if billion > -1 else 0 : million]) * 10**6
        if thousand > -1:
            start = million + 1 if million > -1 else billion + 1 if billion > -1 else 0
            total += _group_value(words[start:thousand]) * 1000
        # the rest after the first scale (thousand, million, billion) that is not the last word, as word2number
        # reads it: "two million three thousand" adds "three thousand" once more (2004003)
        rest = next((index for index in (thousand, million, billion) if -1 < index != len(words) - 1), None)
        if rest is not None:
            total += _group_value(words[rest + 1 :])
        elif max(at.values()) == -1:
            total += _group_value(words)
    if decimals:
        total += _decimal_value(decimals)
    return total


def word_to_number(text: str) -> str:
    """``convert_word_number``: ``str(word_to_num(text))``, the text unchanged when that raises (as the official
    ``try``/``except``: "7²" stays "7²", a sentence without number words stays itself)."""
    try:
        return str(word_to_num(text))
    except Exception:  # the official code swallows every error of word2number
        return text


def _fix_fracs(string: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}`` (malformed: the input unchanged)."""
    pieces = string.split("\\frac")
    result = pieces[0]
    for piece in pieces[1:]:
        result += "\\frac"
        if piece.startswith("{"):
            result += piece
            continue
        if len(piece) < 2:
            return string
        numerator, second, rest = piece[0], piece[1], piece[2:]
        if second != "{":
            result += "{" + numerator + "}{" + second + "}" + rest
        else:
            result += "{" + numerator + "}" + second + rest
    return result


def _fix_a_slash_b(string: str) -> str:
    """``"3/4"`` -> ``\\frac{3}{4}`` when both sides are plain integers (or contain ``sqrt``)."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    numerator, denominator = parts
    try:
        a = numerator if "sqrt" in numerator else int(numerator)
        b = denominator if "sqrt" in denominator else int(denominator)
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def strip_string(string: object, skip_unit: bool = False) -> str:
    """The official answer normalisation (``parser.py``'s ``strip_string``), step for step."""
    text = str(string).strip().replace("\n", "").rstrip(".").replace("\\!", "")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", text).replace("bmatrix", "pmatrix")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    text = text.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    without_unit = re.sub(r"\\text{.*?}$", "", text).strip()
    if without_unit != "" and without_unit != text:
        text = without_unit
    if not skip_unit:
        for _ in range(2):
            for unit in UNIT_TEXTS:
                candidate = re.sub(r"(^|\W)" + unit + r"($|\W)", r"\1\2", text)
                if candidate != "":
                    text = candidate
    text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    text = text.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    text = word_to_number(text)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"):
        text = text.replace(key, "")
    text = text.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if text.isalnum() and (text[:1], text[-1:]) in (("{", "}"), ("(", ")"), ("[", "]")):
        text = text[1:-1]  # unreachable for alphanumeric text, as in the official code; kept for parity
    text = text.replace("infinity", "\\infty")
    if "\\infty" not in text:
        text = text.replace("inf", "\\infty")
    text = text.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    text = re.sub(r"\\mbox{.*?}", "", text)
    if "j" in text and "i" not in text:
        text = text.replace("j", "i")
    text = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", text)
    text = re.sub(r"(\d+)\.0*$", r"\1", text)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", text).replace(" ", "")
    return _fix_a_slash_b(_fix_fracs(text))


def _last_boxed(text: str) -> str:
    """The content of the last ``boxed``: balanced braces after ``boxed{``, else up to the next ``$``."""
    tail = text.split("boxed")[-1]
    if not tail:
        return ""
    if tail[0] != "{":
        return tail.split("$")[0].strip()
    depth, content = 1, ""
    for char in tail[1:]:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                break
        content += char
    return content


def extract_answer(text: str, data_name: str, use_last_number: bool = True) -> str:
    """The official ``extract_answer`` for the free-form datasets (gsm8k, math, aime24): Minerva's "final answer is
    $...$. I hope", else the last ``\\boxed{}``, else after "he answer is" / "final answer is", else the last number;
    then light cleaning and :func:`strip_string`."""
    text = text.replace("\u043a\u0438", "")
    if "final answer is $" in text and "$. I hope" in text:
        pred = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        if not text.split("boxed")[-1]:
            return ""
        pred = _last_boxed(text)
    elif "he answer is" in text:
        pred = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        pred = text.split("final answer is")[-1].strip()
    elif "答案是" in text:
        pred = text.split("答案是")[1].strip().split("\n\n")[0].strip()
    elif use_last_number:
        numbers = re.findall(r"-?\d*\.?\d+", text.replace(",", ""))
        pred = numbers[-1] if numbers else ""
    else:
        pred = ""
    pred = re.sub(r"\n\s*", "", pred)
    if pred[:1] == ":":
        pred = pred[1:]
    if pred[-1:] == ".":
        pred = pred[:-1]
    if pred[-1:] == "/":
        pred = pred[:-1]
    return strip_string(pred, skip_unit=data_name in ("carp_en", "minerva_math"))


def ground_truth(example: dict, data_name: str) -> str:
    """The reference answer as the official ``parse_ground_truth`` normalises it: ``math`` -- the last boxed answer
    of ``solution``; ``gsm8k`` -- the text after ``####``; ``aime24`` -- the ``answer`` field; then
    :func:`strip_string`."""
    if data_name == "math":
        answer = extract_answer(example["solution"], data_name)
    elif data_name == "gsm8k":
        answer = example["answer"].split("####")[1]
    elif data_name == "aime24":
        answer = example["answer"]
    else:
        raise ValueError(f"unknown official data name {data_name!r}; valid: math, gsm8k, aime24")
    return strip_string(answer)


#: The data names whose answers keep their units (``parser.py``'s ``STRIP_EXCEPTIONS``).
STRIP_EXCEPTIONS = ("carp_en", "minerva_math")
_CHOICES = ("A", "B", "C", "D", "E")


def choice_from_text(text: str) -> str:
    """``parser.py``'s ``choice_answer_clean`` (not ``grader.py``'s): the text after the last "answer is" /
    "choice is" (only the first paragraph when either occurs twice), then its first standalone letter A-E after such
    a trigger, else its last one, else the cleaned text itself."""
    text = text.strip("\n")
    if any(text.count(trigger) > 1 for trigger in ("choice is", "answer is")):
        text = text.split("\n\n")[0]
    pieces = re.split("choice is|answer is", text)
    after_trigger = len(pieces) > 1
    if after_trigger:
        text = pieces[-1]
    text = text.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", text.upper()) or [text.strip().strip(".")]
    picked = letters[0] if after_trigger else letters[-1]
    return picked.rstrip(".").rstrip("/")


def _all_choices(text: str) -> bool:
    return all(char in _CHOICES for char in text)


def official_prediction(code: str, data_name: str, reference: str) -> str | None:
    """The answer the official evaluation grades for the generation ``code`` (the output, stripped and cut at the
    stop words): ``run_execute`` -- ``None`` for an empty output, else :func:`extract_answer` then :func:`strip_string`
    once more (the second pass turns ``\\text{eighteen}`` into ``18``, ``x\\in[1,2]`` into ``[1,2]``) -- then
    ``math_eval.py``'s clean-up: a reference that is one letter A-E and a prediction that is not get
    :func:`choice_from_text` of the whole output; a reference made of letters A-E (the empty one too) and a prediction
    that is not keep only the prediction's letters A-E."""
    if not code or code == "error":
        return None
    prediction = strip_string(extract_answer(code, data_name), skip_unit=data_name in STRIP_EXCEPTIONS)
    if reference in _CHOICES and prediction not in _CHOICES:
        return choice_from_text(code)
    if _all_choices(reference) and not _all_choices(prediction):
        return "".join(char for char in prediction if char in _CHOICES)
    return prediction


def reference_text(example: dict, data_name: str) -> str:
    """The reference answer as written, before any normalisation (for graders that parse LaTeX themselves):
    ``math`` -- the last ``\\boxed{}`` of ``solution``; ``gsm8k`` -- the text after ``####``; ``aime24`` --
    ``answer``."""
    if data_name == "math":
        return _last_boxed(example["solution"]) if "boxed" in example["solution"] else ground_truth(example, data_name)
    if data_name == "gsm8k":
        return example["answer"].split("####")[1].strip()
    return str(example["answer"]).strip()
