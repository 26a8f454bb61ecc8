"""One colour and one display name per method, for every view of the results: the site, the matplotlib plots, the
paper-table plots and the W&B report.

A method's colour depends on its name only, never on which other methods a view happens to show, so SnapKV has
the same colour on every page, plot and panel.  The methods of ``conf/method/`` that the papers compare get a fixed
entry of :data:`METHOD_STYLES` (a name as the papers print it and a colour; variants of one family share a hue
family); any other method name (an ablation, a user's own method) gets its colour from :data:`EXTRA_COLOURS` by a
hash of its name (stable across processes: ``zlib.crc32``) and its own name as display name.  The full cache is
always black (drawn as a horizontal reference line).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

#: The full cache's colour (a reference line, never a method line).
FULL_CACHE_COLOUR = "#000000"


@dataclass(frozen=True)
class MethodStyle:
    """How one method is shown: ``label`` (as the papers print it) and ``colour`` (``#rrggbb``)."""

    label: str
    colour: str


#: Fixed styles of the methods the papers compare (``conf/method/<name>.yaml`` names).
METHOD_STYLES: dict[str, MethodStyle] = {
    "full": MethodStyle("Full cache", FULL_CACHE_COLOUR),
    "streamingllm": MethodStyle("StreamingLLM", "#7f7f7f"),
    "h2o": MethodStyle("H2O", "#ff7f0e"),
    "tova": MethodStyle("TOVA", "#bcbd22"),
    "snapkv": MethodStyle("SnapKV", "#1f77b4"),
    "pyramidkv": MethodStyle("PyramidKV", "#2ca02c"),
    "ada_snapkv": MethodStyle("Ada-SnapKV", "#17becf"),
    "ada_pyramidkv": MethodStyle("Ada-PyramidKV", "#98df8a"),
    "pyramidkv_adakv": MethodStyle("PyramidKV (Ada-KV)", "#2e8b57"),
    "cake": MethodStyle("CAKE", "#8c564b"),
    "nacl": MethodStyle("NACL", "#e377c2"),
    "ahakv": MethodStyle("AhaKV", "#d62728"),
    "xkv": MethodStyle("XKV", "#9467bd"),
}

#: Colours of the methods without a fixed style (picked by a hash of the name; none is a fixed style's colour).
EXTRA_COLOURS: tuple[str, ...] = (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
    "#e6550d",
    "#31a354",
    "#756bb1",
    "#636363",
    "#fd8d3c",
    "#6baed6",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
)


def method_style(method: str) -> MethodStyle:
    """The style of ``method``: its fixed entry, else its own name and a colour picked by a hash of the name."""
    style = METHOD_STYLES.get(method)
    if style is not None:
        return style
    return MethodStyle(method, EXTRA_COLOURS[zlib.crc32(method.encode("utf-8")) % len(EXTRA_COLOURS)])


def method_label(method: str) -> str:
    """The method's display name (``snapkv`` -> ``SnapKV``; an unknown name is shown as it is)."""
    return method_style(method).label


def method_colour(method: str) -> str:
    """The method's colour as ``#rrggbb`` (the same in every view, whatever other methods it shows)."""
    return method_style(method).colour


def palette(methods: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{method: {"label", "colour"}}`` of ``methods`` (the site embeds this for its plots and tables)."""
    return {m: {"label": method_label(m), "colour": method_colour(m)} for m in sorted(set(methods))}
