"""Record what the official graders compute on the cases of issue #54 (item 4), for
``tests/metrics/test_grader_recordings.py``.

Each sub-command runs one benchmark's official code from a checkout given on the command line, in a virtual
environment with what that repository pins; it never imports kvbench (except ``tokenizers``, which runs in kvbench's
environment and writes kvbench's offline tokenizers for the ``infinitebench`` step).  Reproduce with::

    # Qwen2.5-Math evaluation (QwenLM/Qwen2.5-Math a45202b, evaluation/requirements.txt: sympy 1.12, antlr4 4.11.1,
    # the vendored latex2sympy installed with `pip install -e evaluation/latex2sympy`, word2number, regex, Pebble)
    python -m venv /tmp/qwenmath && /tmp/qwenmath/bin/pip install sympy==1.12 antlr4-python3-runtime==4.11.1 \\
        word2number regex Pebble timeout-decorator numpy tqdm python_dateutil multiprocess \\
        && /tmp/qwenmath/bin/pip install -e QWEN/evaluation/latex2sympy
    /tmp/qwenmath/bin/python scripts/reference/record_graders.py math QWEN --out tests/fixtures/reference/graders

    # InfiniteBench (OpenBMB/InfiniteBench 88b3daa, requirements.txt: transformers 4.35.0 -> tokenizers 0.14.1)
    python scripts/reference/record_graders.py tokenizers /tmp/kvbench-tokenizers      # kvbench's environment
    python -m venv /tmp/infbench && /tmp/infbench/bin/pip install transformers==4.35.0
    /tmp/infbench/bin/python scripts/reference/record_graders.py infinitebench INFINITEBENCH \\
        --tokenizers /tmp/kvbench-tokenizers --out tests/fixtures/reference/graders

    # SCBench (microsoft/MInference fb56c91, scbench/requirements.txt: tree_sitter 0.21.3, tree_sitter_languages,
    # nltk, evaluate, rouge_score, rich, tempdir, jieba, transformers)
    /tmp/scbench/bin/python scripts/reference/record_graders.py scbench MINFERENCE \\
        --out tests/fixtures/reference/graders

What runs, and the shims (none touches a number):

* ``math``: ``evaluation/parser.py`` ``parse_ground_truth`` and ``run_execute`` (prompt type ``qwen25-math-cot``),
  the multiple-choice clean-up loop of ``math_eval.py``'s ``main`` (its statements and ``is_multi_choice``, taken from
  the file with :mod:`ast` and executed: the module imports vLLM at its top), then ``evaluate.py``'s ``evaluate`` (the
  Pebble pool with its 3 s timeout, ``math_equal_process``) per data name; and ``grader.math_equal`` (``timeout=False``,
  as ``math_equal_process``) on normalised answer pairs.
* ``infinitebench``: ``src/eval_yarn_mistral.py``'s ``truncate_input`` and ``truncate_by_tokens`` (taken with
  :mod:`ast`: the module imports torch and the Yarn-Mistral model) on prompts with special-token text, through
  kvbench's llama3 and qwen2 tokenizers loaded as ``PreTrainedTokenizerFast`` (their ``tokenizer.json`` written in
  the format tokenizers 0.14 reads: merges as ``"a b"`` strings, no ``ignore_merges``; the ids are those kvbench's
  tokenizers give).  Not mistral-v1: tokenizers 0.14 has no Metaspace ``prepend_scheme="first"`` as kvbench's
  converted SentencePiece tokenizer uses it (it prepends "▁" after a special token too, other ids); and
  ``src/compute_scores.py``'s ``get_score_one`` (``evaluate.load`` stubbed: no case scores a summary), exceptions
  recorded.
* ``scbench``: ``scbench/compute_scores.py``'s ``get_score_one`` and ``compute_scores`` (multi-turn and
  ``scdq_mode``) on written prediction files; ``evaluate.load("rouge")`` is stubbed (no case scores a summary) and
  so is the ``args`` module (``compute_scores`` imports ``parse_args`` from it and never calls it here; it imports
  torch and MInference).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

#: Generations (``code``: the output as ``math_eval.py`` hands it on) per data name, with their reference examples.
MATH_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("math", {"solution": "So the answer is $\\boxed{18}$."}, "The count is \\boxed{\\text{eighteen}}."),
    ("math", {"solution": "Thus $\\boxed{[1,2]}$."}, "The set is \\boxed{x \\in [1,2]}."),
    ("math", {"solution": "$\\boxed{49}$"}, "So \\boxed{7²}."),
    ("math", {"solution": "$\\boxed{49}$"}, "The answer is 7²"),
    ("math", {"solution": "$\\boxed{49}$"}, "We get \\boxed{forty-nine}."),
    ("math", {"solution": "$\\boxed{\\text{(C)}}$"}, "Checking each option, \\boxed{C}."),
    ("math", {"solution": "$\\boxed{\\text{E}}$"}, "Options A and B fail, so the answer is E."),
    ("math", {"solution": "$\\boxed{\\text{E}}$"}, "Only option E works: \\boxed{5}."),
    ("math", {"solution": "$\\boxed{\\text{A}}$"}, "The answer is (B), not A."),
    ("math", {"solution": "$\\boxed{\\text{BD}}$"}, "Both hold: \\boxed{B, D}."),
    ("math", {"solution": "$\\boxed{\\text{ACE}}$"}, "So \\boxed{A,C and E}."),
    ("math", {"solution": "$\\boxed{\\frac{a}{b}}$"}, "Hence \\boxed{\\dfrac{a}{b}}."),
    ("math", {"solution": "$\\boxed{\\frac{\\sqrt{3}}{2}}$"}, "\\boxed{\\frac{\\sqrt3}{2}}"),
    ("math", {"solution": "$\\boxed{2\\sqrt{2}}$"}, "\\boxed{\\sqrt{8}}"),
    ("math", {"solution": "$\\boxed{\\text{twelve}}$"}, "\\boxed{12}"),
    ("math", {"solution": "$\\boxed{5}$"}, "\\boxed{\\text{five apples}}"),
    ("math", {"solution": "$\\boxed{1000}$"}, "\\boxed{one thousand}"),
    ("math", {"solution": "$\\boxed{\\frac{1}{2}}$"}, "The probability is $0.5$."),
    ("math", {"solution": "$\\boxed{3}$"}, "\\boxed{x = 3}"),
    ("math", {"solution": "$\\boxed{(1,2)}$"}, "\\boxed{\\left(1, 2\\right)}"),
    ("math", {"solution": "$\\boxed{\\$18.90}$"}, "It costs \\boxed{\\$18.9}."),
    ("math", {"solution": "$\\boxed{10\\%}$"}, "\\boxed{0.1}"),
    ("math", {"solution": "$\\boxed{4}$"}, ""),
    ("gsm8k", {"answer": "He pays 18 dollars.\n#### 18"}, "So he pays eighteen dollars. The answer is eighteen."),
    ("gsm8k", {"answer": "#### 1000"}, "The answer is 1,000."),
    ("gsm8k", {"answer": "#### 49"}, "The area is 7² = 49 square feet. The answer is 7²."),
    ("gsm8k", {"answer": "#### 7"}, "So the total is 7.0"),
    ("aime24", {"answer": "33"}, "Therefore $m+n=\\boxed{033}$."),
    ("aime24", {"answer": "204"}, "\\boxed{204}\n\nThe answer is C."),
    ("aime24", {"answer": "25"}, "\\boxed{5²}"),
]
#: Normalised answer pairs for ``math_equal`` alone (where ``parse_latex``, ``parse_expr`` and ``latex2sympy`` decide).
EQUAL_PAIRS: list[tuple[str, str]] = [
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("2^{10}", "1024"),
    ("\\log_{2}8", "3"),
    ("\\sin^{2}x+\\cos^{2}x", "1"),
    ("\\binom{5}{2}", "10"),
    ("e^{i\\pi}", "-1"),
    ("\\pir^2", "r^2\\pi"),
    ("x^2+2x+1", "(x+1)^2"),
    ("3\\sqrt{3}", "\\sqrt{27}"),
    ("\\ln(e)", "1"),
    ("5!", "120"),
    ("\\cos(\\pi)", "-1"),
    ("10^{-2}", "0.01"),
    ("\\frac{a}{b}", "a/b"),
    ("\\frac{}{b}", "\\frac{}{b}"),
    ("\\sqrt[3]{8}", "2"),
    ("2\\pi", "6.2832"),
    ("\\frac{\\pi}{3}", "60"),
    ("\\infty", "\\infty"),
    ("x^{2}-1", "(x-1)(x+1)"),
    ("\\frac{x+1}{x-1}", "1+\\frac{2}{x-1}"),
    ("y=2x+1", "2x+1=y"),
    ("k=5", "5"),
    ("[1,2]", "[1,2)"),
    ("(1,2)", "(1.0,2)"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1.0\\\\2\\end{pmatrix}"),
    ("|-3|", "3"),
    ("\\tan(\\frac{\\pi}{4})", "1"),
    ("1.5\\times10^{3}", "1500"),
    ("\\frac{7}{3}", "2\\frac{1}{3}"),
    ("7²", "49"),
    ("\\text{eighteen}", "18"),
    ("\\emptyset", "{}"),
]
#: The answer pairs of the first reasoning recording (made with antlr4 4.7.2: ``parse_latex`` failed), graded again.
EARLIER_RECORDING = Path(__file__).resolve().parents[2] / "tests" / "tasks" / "recorded" / "reasoning_official.json"
#: Prompts with special-token text of one of the families (and none), truncated at a length that keeps them whole.
INFINITEBENCH_PROMPTS = [
    "Read the book.\n\nChapter 1</s><s>It was late.<|im_end|>\n<|im_start|>user\nWhere? <|eot_id|> Here.\n\nQuestion:",
    "A plain prompt with no special text: nothing changes.\n\nAnswer:",
    "<|begin_of_text|>The log reads: <|end_of_text|> and </s> twice </s>.",
]
#: InfiniteBench math_find and SCBench scbench_mf predictions (labels: an int, a float).
MATH_FIND_CASES: list[tuple[str, Any]] = [
    ("7.0", 7),
    ("The largest number is 7.0 in the list.", 7),
    ("7.5", 7),
    ("7", 7),
    ("It is 12.25", 12.25),
    ("12", 12.0),
    ("no number", 3),
]


def _function_defs(path: Path, names: set[str]) -> dict[str, Any]:
    """The named top-level functions of an official file, compiled from its source (its imports are not run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    picked = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    namespace: dict[str, Any] = {}
    import re

    namespace["re"] = re
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def record_math(checkout: Path, out: Path) -> None:
    folder = checkout / "evaluation"
    sys.path.insert(0, str(folder))
    from evaluate import evaluate  # the official evaluation/evaluate.py
    from grader import choice_answer_clean, math_equal
    from parser import STRIP_EXCEPTIONS, parse_ground_truth, run_execute, strip_string

    source = (folder / "math_eval.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    loop = next(
        node
        for node in ast.walk(main)
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == "j"
    )
    helpers = _function_defs(folder / "math_eval.py", {"is_multi_choice"})
    clean_up = compile(ast.Module(body=[loop], type_ignores=[]), str(folder / "math_eval.py"), "exec")
    from parser import choice_answer_clean as parser_choice_answer_clean

    rows = []
    for index, (data_name, example, code) in enumerate(MATH_CASES):
        gt = parse_ground_truth(dict(example), data_name)[1]
        pred, _ = run_execute(None, code, "qwen25-math-cot", data_name)
        scope = {
            "preds": [pred],
            "code": [code],
            "sample": {"gt": gt},
            "choice_answer_clean": parser_choice_answer_clean,
            "is_multi_choice": helpers["is_multi_choice"],
        }
        try:
            exec(clean_up, scope)
            cleaned, error = scope["preds"][0], None
        except Exception as err:  # the official main() stops here (is_multi_choice(None))
            cleaned, error = None, f"{type(err).__name__}: {err}"
        sample = {"idx": index, **example, "pred": [cleaned]}
        scored, _ = evaluate(data_name, "qwen25-math-cot", samples=[sample], execute=True)
        rows.append(
            {
                "data_name": data_name,
                "example": example,
                "code": code,
                "gt": gt,
                "run_execute": pred,
                "pred": cleaned,
                "clean_up_error": error,
                "score": bool(scored[0]["score"][0]),
            }
        )
    earlier = json.loads(EARLIER_RECORDING.read_text(encoding="utf-8"))["equal"]  # kvbench's own file: the inputs
    pairs = [[a, b, bool(math_equal(a, b))] for a, b in EQUAL_PAIRS + [(a, b) for a, b, _ in earlier]]
    strips = sorted({case[2] for case in MATH_CASES} | {a for a, _ in EQUAL_PAIRS})
    once = [[text, strip_string(text), strip_string(strip_string(text))] for text in strips]
    choices = [[code, parser_choice_answer_clean(code), choice_answer_clean(code)] for _, _, code in MATH_CASES]
    payload = {
        "about": "QwenLM/Qwen2.5-Math evaluation/ (see scripts/reference/record_graders.py): per case the official "
        "gt (parse_ground_truth), run_execute's answer, the answer after math_eval.py's A-E clean-up and evaluate()'s "
        "score; math_equal on answer pairs; strip_string once and twice; parser.py's and grader.py's "
        "choice_answer_clean.",
        "strip_exceptions": list(STRIP_EXCEPTIONS),
        "versions": _versions("sympy", "antlr4-python3-runtime", "word2number", "regex", "Pebble"),
        "cases": rows,
        "math_equal": pairs,
        "strip_string": once,
        "choice_answer_clean": choices,
    }
    _write(out / "math.json", payload)


def _versions(*names: str) -> dict[str, str]:
    import importlib.metadata as metadata

    return {name: metadata.version(name) for name in names}


def _write(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def export_tokenizers(out: Path) -> None:
    """kvbench's offline tokenizers (``tokenizer.json`` + their special tokens), for the ``infinitebench`` step."""
    from kvbench.models.tokenizers import build_tokenizer

    for family in ("llama3", "mistral-v1", "qwen2"):
        tokenizer = build_tokenizer(family)
        folder = out / family
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
        specials = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
        (folder / "specials.json").write_text(json.dumps(specials), encoding="utf-8")


def _old_format_tokenizer(folder: Path) -> Any:
    """The tokenizer of ``folder`` as tokenizers 0.14 (transformers 4.35's) reads it (see the module docstring)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    model["merges"] = [" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]]
    model.pop("ignore_merges", None)
    if (data.get("pre_tokenizer") or {}).get("type") == "Metaspace":
        data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
        data["pre_tokenizer"]["prepend_scheme"] = "first"
    specials = json.loads((folder / "specials.json").read_text(encoding="utf-8"))
    backend = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **specials)


def _stub_evaluate() -> None:
    """``evaluate.load`` (called at import time by both ``compute_scores.py``), offline: a scorer no case uses."""

    class _NoRouge:
        def compute(self, **_: Any) -> Any:
            raise RuntimeError("rouge is not recorded here")

    module = types.ModuleType("evaluate")
    module.load = lambda *args, **kwargs: _NoRouge()  # type: ignore[attr-defined]
    sys.modules["evaluate"] = module


def _scored(function: Any, *args: Any) -> Any:
    try:
        return float(function(*args))
    except Exception as err:  # recorded: the official code raises here and its run stops
        return f"{type(err).__name__}: {err}"


def record_infinitebench(checkout: Path, tokenizers: Path, out: Path) -> None:
    src = checkout / "src"
    truncation = _function_defs(src / "eval_yarn_mistral.py", {"truncate_input", "truncate_by_tokens"})
    prompts = {}
    for family in ("llama3", "qwen2"):  # byte-level BPE: the same ids in tokenizers 0.14 (mistral-v1: see above)
        tokenizer = _old_format_tokenizer(tokenizers / family)
        for length in (131072, 24):
            key = f"{family}/{length}"
            prompts[key] = [truncation["truncate_by_tokens"](p, tokenizer, length) for p in INFINITEBENCH_PROMPTS]
    sys.path.insert(0, str(src))
    _stub_evaluate()
    import compute_scores  # the official src/compute_scores.py

    math_find = [
        [p, label, _scored(compute_scores.get_score_one, p, label, "math_find", "")] for p, label in MATH_FIND_CASES
    ]
    payload = {
        "about": "OpenBMB/InfiniteBench src/ (see scripts/reference/record_graders.py): truncate_by_tokens of "
        "each prompt with kvbench's tokenizers (key: family/max_tokens), and get_score_one for math_find (a string: "
        "the error the official code raises).",
        "versions": _versions("transformers", "tokenizers"),
        "prompts": INFINITEBENCH_PROMPTS,
        "truncate_by_tokens": prompts,
        "math_find": math_find,
    }
    _write(out / "infinitebench.json", payload)


def record_scbench(checkout: Path, out: Path) -> None:
    folder = checkout / "scbench"
    sys.path.insert(0, str(folder))
    _stub_evaluate()
    # compute_scores imports parse_args (from args, which imports torch and MInference) and never calls it here
    sys.modules["args"] = types.ModuleType("args")
    sys.modules["args"].parse_args = None  # type: ignore[attr-defined]
    import compute_scores  # the official scbench/compute_scores.py

    math_find = [
        [p, label, _scored(compute_scores.get_score_one, p, label, "math_find", "")] for p, label in MATH_FIND_CASES
    ]
    # scbench_repoqa_and_kv: two examples, a RepoQA turn and two kv turns each, written as run_scbench.py does
    needle = "def add(a, b):\n    return a + b"
    other = "def mul(a, b):\n    return a * b"
    rows = []
    for example, (name, function) in enumerate((("add", needle), ("mul", other))):
        turns = [
            ("scbench_repoqa", f"```python\n{function}\n```", function, name),
            ("scbench_kv", "The value is 1f2e-33aa.", "1f2e-33aa", None),
            ("scbench_kv", "prediction", "prediction", None),
        ]
        for turn_idx, (task, prediction, truth, func_name) in enumerate(turns):
            row = {"id": example, "turn_idx": turn_idx, "prediction": prediction, "ground_truth": truth}
            row.update({"task": task, "lang": "python", "repo": "demo"})
            if func_name is not None:
                row["func_name"] = func_name
            rows.append(row)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "preds.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        for scdq in (False, True):
            results["scdq" if scdq else "multi_turn"] = compute_scores.compute_scores(
                path, "scbench_repoqa_and_kv", "model", scdq_mode=scdq
            )
    payload = {
        "about": "microsoft/MInference scbench/ (see scripts/reference/record_graders.py): get_score_one for "
        "scbench_mf's math_find (a string: the error raised), and compute_scores on the scbench_repoqa_and_kv rows "
        "below (its returned summary string: repoqa,kv per turn, x100).",
        "versions": _versions("tree-sitter", "tree-sitter-languages", "nltk"),
        "math_find": math_find,
        "repoqa_and_kv_rows": rows,
        "repoqa_and_kv": results,
    }
    _write(out / "scbench.json", payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("math", "infinitebench", "scbench"):
        command = commands.add_parser(name)
        command.add_argument("checkout", type=Path, help="the official repository's checkout")
        command.add_argument("--out", type=Path, default=Path("tests/fixtures/reference/graders"))
        if name == "infinitebench":
            command.add_argument("--tokenizers", type=Path, required=True, help="written by the tokenizers command")
    commands.add_parser("tokenizers").add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "tokenizers":
        export_tokenizers(args.out)
    elif args.command == "math":
        record_math(args.checkout.resolve(), args.out)
    elif args.command == "infinitebench":
        record_infinitebench(args.checkout.resolve(), args.tokenizers, args.out)
    else:
        record_scbench(args.checkout.resolve(), args.out)


if __name__ == "__main__":
    main()
