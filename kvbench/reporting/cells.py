"""How one table cell is printed: the paper's own precision, the missing-cell marks, and LaTeX escaping.

A paper cell is printed exactly as the paper prints it (the reference CSV's ``printed`` text: ``64.0``,
``28.3 ± 0.2``, ``8``, the paper's own ``-``).  One of our cells is printed with its column's precision, which
is read off the paper's printed cells of that column (:func:`column_decimals`): two decimals for LongBench
scores, none for counts, batch sizes or total runtimes.  Two marks keep the two kinds of gap apart:

* :data:`NOT_RUN` (``–``): we have no (complete) run for this cell;
* :data:`NOT_PRINTED` (``?``): the paper's cell is not printed or illegible in the source (see the cell's note).
"""

from __future__ import annotations

import math
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterable

#: Our cell without a value: no run, or an incomplete one (listed under "missing runs").
NOT_RUN = "–"
#: A paper cell the source does not give: garbled, illegible, or not assignable to a row.
NOT_PRINTED = "?"
#: Precision of a column whose paper cells give no number to copy.
DEFAULT_DECIMALS = 2

_NUMBER_RE = re.compile(r"^\s*[-+−]?\d+(?:\.(?P<frac>\d+))?")


def printed_decimals(text: str) -> int | None:
    """Decimals of a printed number (``28.3 ± 0.2`` -> 1, ``8`` -> 0); ``None`` if ``text`` is not a number."""
    match = _NUMBER_RE.match(str(text))
    if match is None:
        return None
    return len(match.group("frac") or "")


def column_decimals(printed: Iterable[str], default: int = DEFAULT_DECIMALS) -> int:
    """The precision a column's paper cells are printed with: the most common one (the larger on a tie).

    A paper printing ``64.0`` among two-decimal scores (a dropped trailing zero) still gives two decimals.
    """
    counts = Counter(d for d in (printed_decimals(t) for t in printed if str(t).strip()) if d is not None)
    if not counts:
        return default
    top = max(counts.values())
    return max(d for d, n in counts.items() if n == top)


def format_number(value: float | None, decimals: int) -> str:
    """``value`` with ``decimals`` decimals, or :data:`NOT_RUN` when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NOT_RUN
    return f"{value:.{decimals}f}"


def format_diff(value: float | None, decimals: int) -> str:
    """A signed difference (``+0.31``, ``-2.00``, ``0.00``); empty when either side is missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:+.{decimals}f}"
    return text[1:] if float(text) == 0 else text


# ------------------------------------------------------------------------------------------------------ LaTeX
#: LaTeX for the non-ASCII characters the papers' labels and our marks use (Greek letters are found by name).
_TEX_SYMBOLS: dict[str, str] = {
    "–": "--",
    "—": "---",
    "−": "$-$",
    "±": "$\\pm$",
    "×": "$\\times$",
    "·": "$\\cdot$",
    "✓": "\\checkmark{}",
    "✗": "$\\times$",
    "≈": "$\\approx$",
    "≤": "$\\leq$",
    "≥": "$\\geq$",
    "→": "$\\rightarrow$",
    "←": "$\\leftarrow$",
    "†": "\\textdagger{}",
    "‡": "\\textdaggerdbl{}",
    "…": "\\ldots{}",
    "°": "\\textdegree{}",
    "“": "``",
    "”": "''",
    "‘": "`",
    "’": "'",
    "\u00a0": "~",
}
_TEX_SPECIAL: dict[str, str] = {
    "\\": "\\textbackslash{}",
    "&": "\\&",
    "%": "\\%",
    "$": "\\$",
    "#": "\\#",
    "_": "\\_",
    "{": "\\{",
    "}": "\\}",
    "~": "\\textasciitilde{}",
    "^": "\\textasciicircum{}",
}


def _greek(char: str) -> str | None:
    """``$\\alpha$`` for α, ``$\\Delta$`` for Δ (capitals without a LaTeX command, e.g. Α, fall back to Latin)."""
    name = unicodedata.name(char, "")
    match = re.fullmatch(r"GREEK (SMALL|CAPITAL) LETTER ([A-Z]+)", name)
    if match is None:
        return None
    letter = match.group(2).lower()
    letter = {"lamda": "lambda"}.get(letter, letter)
    if match.group(1) == "SMALL":
        return f"$\\{letter}$" if letter != "omicron" else "o"
    capital = letter.capitalize()
    if capital in ("Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"):
        return f"$\\{capital}$"
    return unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode() or capital[0]


def tex_escape(text: str) -> str:
    """``text`` as plain-ASCII LaTeX: specials escaped, known symbols and Greek letters as commands.

    Accented letters lose their accent (NFKD); any other character becomes ``?`` with a warning, so the output
    always compiles with ``booktabs``, ``graphicx`` and ``amssymb`` (for ``\\checkmark``) and no Unicode engine.
    """
    out = []
    for char in str(text):
        if char in _TEX_SPECIAL:
            out.append(_TEX_SPECIAL[char])
        elif ord(char) < 128:
            out.append(char)
        elif char in _TEX_SYMBOLS:
            out.append(_TEX_SYMBOLS[char])
        elif (greek := _greek(char)) is not None:
            out.append(greek)
        else:
            ascii_text = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
            if not ascii_text:
                warnings.warn(f"no LaTeX for {char!r} (U+{ord(char):04X}); printed as '?'", stacklevel=2)
            out.append(tex_escape(ascii_text) if ascii_text else "?")
    return "".join(out)
