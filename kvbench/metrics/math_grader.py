"""Grading for the long-reasoning benchmarks: Qwen2.5-Math ``evaluation/grader.py``'s ``math_equal`` (commit
``a45202b``) re-implemented -- case-insensitive string equality, multiple-choice letters, numeric equality with a
relative tolerance of 1e-4 (also against ``reference/100`` and ``reference*100``), bracket-insensitive equality,
element-wise tuples / intervals and matrices, equations, then symbolic equality.

Symbolic equality differs from the official code by construction: the official ``symbolic_equal`` parses with
sympy's ``parse_latex``, then ``parse_expr``, then ``latex2sympy2`` -- ``latex2sympy2`` pins antlr4 4.7.2, which
conflicts with kvbench's antlr4 4.9.3 (omegaconf), and sympy's own ``parse_latex`` needs antlr4 4.11 (or ``lark``).
Here :func:`latex_to_sympy` rewrites the common LaTeX forms (``\\frac``, ``\\sqrt``, ``^{}``, ``\\pi``, ``\\cdot``,
``\\infty``, braces) into Python syntax for sympy's ``parse_expr`` with implicit multiplication.  Measured agreement on
the recorded cases: ``tests/tasks/recorded/reasoning_official.json`` (docs/benchmarks/reasoning.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

_CHOICES = ("A", "B", "C", "D", "E")


def choice_answer_clean(prediction: str) -> str:
    """The last standalone letter A-E of ``prediction`` (upper-cased), else the stripped text."""
    text = prediction.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", text.upper())
    picked = letters[-1] if letters else text.strip().strip(".")
    return picked.rstrip(".").rstrip("/")


def parse_digits(text: Any) -> float | None:
    """``float`` of ``text`` without commas; ``"25%"`` / ``"25\\%"`` -> 0.25; ``None`` when not a number."""
    number = str(text).replace(",", "")
    try:
        return float(number)
    except ValueError:
        pass
    if number.endswith("%"):
        number = number[:-1].removesuffix("\\")
        try:
            return float(number) / 100
        except ValueError:
            pass
    return None


def numeric_equal(prediction: float, reference: float) -> bool:
    """``math.isclose`` with ``rel_tol=1e-4`` (the official tolerance)."""
    return math.isclose(reference, prediction, rel_tol=1e-4)


def _pmatrix_from_braces(text: str) -> str:
    rows = [m.strip("{}") for m in re.findall(r"\{.*,.*\}", text.strip())]
    return ", ".join(r"\begin{pmatrix}" + row.replace(",", "\\") + r"\end{pmatrix}" for row in rows)


def _matrix_rows(text: str) -> list[str]:
    body = text[len("\\begin{pmatrix}") : -len("\\end{pmatrix}")]
    return [line.strip() for line in body.split("\\\\") if line.strip()]


def _is_matrix(text: str) -> bool:
    return text.startswith(("\\begin{pmatrix}", "\\begin{bmatrix}")) and text.endswith(
        ("\\end{pmatrix}", "\\end{bmatrix}")
    )


def math_equal(prediction: Any, reference: Any, include_percentage: bool = True) -> bool:
    """Whether ``prediction`` equals ``reference`` (both normalised answer strings), by the official rules in order."""
    if prediction is None or reference is None:
        return False
    prediction, reference = str(prediction), str(reference)
    if prediction.strip().lower() == reference.strip().lower():
        return True
    if reference in _CHOICES and choice_answer_clean(prediction) == reference:
        return True
    pred_number, ref_number = parse_digits(prediction), parse_digits(reference)
    if pred_number is not None and ref_number is not None:
        candidates = [ref_number / 100, ref_number, ref_number * 100] if include_percentage else [ref_number]
        return any(numeric_equal(pred_number, item) for item in candidates)
    if not prediction:
        return False
    reference, prediction = reference.strip(), prediction.strip()
    if "pmatrix" in prediction and "pmatrix" not in reference:
        reference = _pmatrix_from_braces(reference)
    pred_str, ref_str = prediction, reference
    if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        pred_str, ref_str = pred_str.strip("[]()"), ref_str.strip("[]()")
    for bracket in "{}()":
        pred_str, ref_str = pred_str.replace(bracket, ""), ref_str.replace(bracket, "")
    if pred_str.lower() == ref_str.lower():
        return True
    pattern = r"(\(|\[).+(\)|\])"
    if re.match(pattern, prediction) and re.match(pattern, reference):
        pred_parts, ref_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and all(
            math_equal(p, r, include_percentage) for p, r in zip(pred_parts, ref_parts, strict=True)
        ):
            return True
    if _is_matrix(prediction) and _is_matrix(reference) and _matrices_equal(prediction, reference, include_percentage):
        return True
    if prediction.count("=") == 1 and reference.count("=") == 1:
        pred_eq = "{} - ({})".format(*(side.strip() for side in prediction.split("=")))
        ref_eq = "{} - ({})".format(*(side.strip() for side in reference.split("=")))
        if symbolic_equal(pred_eq, ref_eq) or symbolic_equal(f"-({pred_eq})", ref_eq):
            return True
    elif prediction.count("=") == 1 and len(prediction.split("=")[0].strip()) <= 2 and "=" not in reference:
        if math_equal(prediction.split("=")[1], reference, include_percentage):
            return True
    elif (
        reference.count("=") == 1
        and len(reference.split("=")[0].strip()) <= 2
        and "=" not in prediction
        and math_equal(prediction, reference.split("=")[1], include_percentage)
    ):
        return True
    return symbolic_equal(prediction, reference)


def _matrices_equal(prediction: str, reference: str, include_percentage: bool) -> bool:
    pred_rows, ref_rows = _matrix_rows(prediction), _matrix_rows(reference)
    if len(pred_rows) != len(ref_rows):
        return False
    for pred_row, ref_row in zip(pred_rows, ref_rows, strict=True):
        pred_cells, ref_cells = pred_row.split("&"), ref_row.split("&")
        if len(pred_cells) != len(ref_cells) or not all(
            math_equal(p, r, include_percentage) for p, r in zip(pred_cells, ref_cells, strict=True)
        ):
            return False
    return True


def _replace_command(text: str, command: str, arity: int, build: Any) -> str:
    """Replace ``\\command{a}{b}`` (balanced braces, ``arity`` groups) by ``build(a, b)``, innermost last."""
    while True:
        start = text.find(command + "{")
        if start < 0:
            return text
        position, groups = start + len(command), []
        for _ in range(arity):
            if position >= len(text) or text[position] != "{":
                return text
            depth, end = 0, position
            while end < len(text):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    break
                end += 1
            if depth != 0:
                return text
            groups.append(text[position + 1 : end])
            position = end + 1
        text = text[:start] + build(*groups) + text[position:]


#: LaTeX functions read as sympy's ``parse_latex`` reads them (``\\ln`` is the natural log).
_FUNCTIONS = {"\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\ln": "log", "\\log": "log", "\\exp": "exp"}


def _symbols() -> dict[str, Any]:
    """Every letter (and ``pi``) as a plain symbol: sympy's ``parse_latex`` reads ``\\pi``, ``e`` and ``i`` as symbols
    (``2\\pi`` is not 6.2832 there, ``e^{i\\pi}`` not -1), and ``E``, ``I``, ``N``, ``S`` as letters."""
    from sympy import Symbol

    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return {**{letter: Symbol(letter) for letter in letters}, "pi": Symbol("pi")}


def _rewrite_functions(text: str) -> str:
    """``\\log_{b}x`` -> ``log(x, b)``; ``\\sin^{2}x`` -> ``sin(x)**(2)``; ``\\sin x`` -> ``sin(x)``; ``|x|`` ->
    ``Abs(x)``; ``\\binom{a}{b}`` -> ``binomial(a, b)`` (the argument: a braced group, a parenthesised one, or one
    letter / number)."""
    text = _replace_command(text, "\\binom", 2, lambda a, b: f"binomial({a},{b})")
    text = re.sub(r"\|([^|]+)\|", r"Abs(\1)", text)
    argument = r"(\{[^{}]*\}|\([^()]*\)|[A-Za-z]|\d+(?:\.\d+)?)"
    text = re.sub(r"\\log_\{?(\w+)\}?\s*" + argument, lambda m: f"log({_bare(m.group(2))},{m.group(1)})", text)
    for latex, name in _FUNCTIONS.items():
        power = r"(?:\^\{?([^{}\s]+)\}?)?"
        pattern = re.escape(latex) + r"(?![A-Za-z])" + power + r"\s*" + argument
        text = re.sub(pattern, lambda m, n=name: _applied(n, m.group(2), m.group(1)), text)
    return text


def _bare(argument: str) -> str:
    return argument[1:-1] if argument[:1] in "{(" else argument


def _applied(name: str, argument: str, power: str | None) -> str:
    call = f"{name}({_bare(argument)})"
    return f"({call})**({power})" if power else call


def latex_to_sympy(text: str) -> Any:
    """A sympy expression for a normalised LaTeX answer (``\\frac``, ``\\sqrt``, powers, ``\\pi``, logs,
    trigonometric functions, ``\\binom``, ``|x|``); raises on what it cannot read.  Letters are symbols, as in sympy's
    ``parse_latex``."""
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    text = text.replace("\\\\", "\\").replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac")
    text = _rewrite_functions(text)
    text = _replace_command(text, "\\frac", 2, lambda a, b: f"(({a})/({b}))")
    text = re.sub(r"\\sqrt\[(\w+)\]\{", r"\\root{\1}{", text)
    text = _replace_command(text, "\\root", 2, lambda n, a: f"(({a})**(1/({n})))")
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = _replace_command(text, "\\sqrt", 1, lambda a: f"sqrt({a})")
    text = re.sub(r"\\pi(?![A-Za-z])", " pi ", text)  # ``\\pir`` is no command: left to fail, as there
    for latex, python in (("\\cdot", "*"), ("\\times", "*"), ("\\infty", "oo"), ("^", "**")):
        text = text.replace(latex, f" {python} " if python in "*" else python)
    text = text.replace("{", "(").replace("}", ")")
    if "\\" in text:
        raise ValueError(f"unsupported LaTeX in {text!r}")
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    return parse_expr(text, local_dict=_symbols(), transformations=transformations, evaluate=True)


def symbolic_equal(a: str, b: str) -> bool:
    """Whether two answers parse (:func:`latex_to_sympy`) to equal expressions: same text, ``==``, ``equals`` or
    ``simplify(a - b) == 0``, equal equations, numerically equal (rel. 1e-4), or equal matrices rounded to 3 places."""
    from sympy import N, simplify

    def parse(text: str) -> Any:
        try:
            return latex_to_sympy(text)
        except Exception:
            return text

    left, right = parse(a), parse(b)
    checks = (
        lambda: str(left) == str(right) or left == right,
        lambda: left.equals(right) or simplify(left - right) == 0,
        lambda: abs(left.lhs - left.rhs).equals(abs(right.lhs - right.rhs)),
        lambda: numeric_equal(float(N(left)), float(N(right))),
    )
    for check in checks:
        try:
            if check():
                return True
        except Exception:  # the official code tries each rule and moves on
            continue
    return False
