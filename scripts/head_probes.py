"""Needle probes for the head-pattern estimators (``estimate_duo_pattern.py``, ``estimate_headkv_scores.py``).

A probe is one prompt (``context + question``) with the token span of the needle it hides.  Probes come from a JSONL
file (``{"context": ..., "needle": ..., "question": ...}`` per line; the needle must occur once in the context), or,
for the embedded tiny model, from kvbench's own ``tiny_niah`` generator (``--tiny-niah N``: N single-needle prompts
at spread depths).  The model is a local path or Hub id (transformers) or ``builtin:<name>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Probe:
    """``input_ids [1, N]`` of the prompt and the needle's token span ``[start, end)``."""

    input_ids: torch.Tensor
    needle_start: int
    needle_end: int


def load_model(name: str, attn_implementation: str | None = None) -> tuple[Any, Any]:
    """``builtin:<name>`` (kvbench's seeded random models) or a transformers checkpoint, with its tokenizer."""
    if name.startswith("builtin:"):
        from kvbench.models.loading import build_builtin

        return build_builtin(name.removeprefix("builtin:"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return AutoModelForCausalLM.from_pretrained(name, **kwargs).eval(), AutoTokenizer.from_pretrained(name)


def make_probe(tokenizer: Any, context: str, needle: str, question: str) -> Probe:
    """Tokenise ``context + question`` and locate the needle's tokens (by character offsets)."""
    start_char = context.find(needle)
    if start_char < 0 or context.find(needle, start_char + 1) >= 0:
        raise ValueError(f"the needle {needle[:60]!r} must occur exactly once in its context")
    encoded = tokenizer(context + question, return_offsets_mapping=True, add_special_tokens=False)
    spans = encoded["offset_mapping"]
    end_char = start_char + len(needle)
    inside = [i for i, (lo, hi) in enumerate(spans) if hi > start_char and lo < end_char]
    ids = torch.tensor([encoded["input_ids"]])
    return Probe(ids, inside[0], inside[-1] + 1)


def probes_from_jsonl(tokenizer: Any, path: Path) -> list[Probe]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [make_probe(tokenizer, row["context"], row["needle"], row["question"]) for row in rows]


def tiny_niah_probes(tokenizer: Any, count: int, length: int) -> list[Probe]:
    """``count`` single-needle ``tiny_niah`` prompts of about ``length`` tokens at spread depths."""
    from kvbench.tasks.tiny_niah import needle_words, sized_instance, spread_depth

    probes = []
    for index in range(count):
        instance, _ = sized_instance("niah_single", length, spread_depth(index), f"head-probe-{index}", tokenizer)
        context, question = " ".join(instance.context) + "\n", " ".join(instance.question)
        needle = " ".join(needle_words(instance.key, instance.answers[0]))
        probes.append(make_probe(tokenizer, context, needle, question))
    return probes


def add_probe_arguments(parser: Any) -> None:
    parser.add_argument("--model", required=True, help="local path, Hub id or builtin:<name>")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--probes", type=Path, help='JSONL: {"context", "needle", "question"} per line')
    source.add_argument("--tiny-niah", type=int, metavar="N", help="N tiny_niah prompts (the embedded model)")
    parser.add_argument("--length", type=int, default=512, help="tokens per tiny_niah prompt")


def read_probes(args: Any, tokenizer: Any) -> list[Probe]:
    if args.probes is not None:
        if not args.probes.is_file():
            raise ValueError(f"--probes {str(args.probes)!r} is not a file")
        return probes_from_jsonl(tokenizer, args.probes)
    if args.tiny_niah < 1:
        raise ValueError(f"--tiny-niah {args.tiny_niah} must be at least 1")
    return tiny_niah_probes(tokenizer, args.tiny_niah, args.length)
