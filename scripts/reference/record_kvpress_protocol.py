"""Record kvpress's PyramidKVPress layer budgets where ``S (1 - c)`` is not an integer (issue #43, protocol item 1).

Runs ONLY inside kvpress's own virtual environment (kvpress 0.5.5, transformers 5.2; see
``scripts/reference/record_kvpress.py``); it never imports kvbench and kvbench never imports it::

    OMP_NUM_THREADS=1 /work/venvs/kvpress/bin/python scripts/reference/record_kvpress_protocol.py

Output: ``tests/fixtures/reference/kvpress_protocol/PyramidKVPress_layer_budgets.json``: per case (context length
``q_len``, compression ratio, ``window_size``, ``beta``, number of layers) the tokens kvpress keeps at every layer,
``PyramidKVPress.get_layer_budget(module, q_len)`` with a stand-in module (``layer_idx``,
``config.num_hidden_layers``: all the method reads).  ``compress`` keeps exactly that many tokens per KV head (one
top-k); the recorded tiny-Llama cases of ``record_kvpress.py`` check the selection itself.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from kvpress import PyramidKVPress

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "reference" / "kvpress_protocol"
#: Context lengths: the tiny Llama's, RULER 4K prompts (a few tokens under and at 4096), longer ones.
LENGTHS = (48, 128, 300, 1000, 2000, 3987, 4001, 4096, 8191)
#: Ratios whose ``S (1 - c)`` is mostly fractional, and the leaderboard's four.
RATIOS = (0.1, 0.25, 0.3, 0.45, 0.5, 0.6, 0.75, 0.875, 0.9)
#: (window_size, beta, num_hidden_layers): kvpress's defaults on Qwen3-8B (36 layers) and the tiny Llama (2).
SHAPES = ((64, 20, 36), (64, 20, 2), (16, 20, 2), (16, 5, 36), (64, 5, 32))


def layer_budgets(q_len: int, ratio: float, window: int, beta: int, layers: int) -> list[int]:
    press = PyramidKVPress(compression_ratio=ratio, window_size=window, beta=beta)
    config = SimpleNamespace(num_hidden_layers=layers)
    return [press.get_layer_budget(SimpleNamespace(layer_idx=i, config=config), q_len) for i in range(layers)]


def main() -> int:
    cases = [
        {"q_len": q_len, "compression_ratio": ratio, "window_size": window, "beta": beta, "num_layers": layers,
         "budgets": layer_budgets(q_len, ratio, window, beta, layers)}
        for q_len in LENGTHS
        for ratio in RATIOS
        for window, beta, layers in SHAPES
        if q_len > window
    ]  # fmt: skip
    payload = {
        "press": "PyramidKVPress.get_layer_budget",
        "note": "tokens kept per layer (window included) for a context of q_len tokens at compression_ratio",
        "versions": {"kvpress": metadata.version("kvpress"), "python": sys.version.split()[0]},
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "PyramidKVPress_layer_budgets.json").write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"PyramidKVPress_layer_budgets: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
