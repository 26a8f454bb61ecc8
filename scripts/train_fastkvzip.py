"""Train small Fast KVzip gates for a model, on CPU in minutes, in the published gate format.

Fast KVzip (arXiv 2601.17668) distils KVzip's scores into a light gate per layer (Janghyun1230/FastKVzip
``optim.py``: binary cross-entropy between the gate's score and the KVzip score of each token and KV head, SGD with
momentum 0.9, learning rate 0.2 with a warm-up and two decays, 5000 steps of 1000 tokens on a GPU).  This script
follows that recipe on local text, small enough for a CPU:

1. targets: KVzip's score of every text token per KV head -- the largest attention probability it receives from the
   repeated text's queries over the KV head's query group, in KVzip's reconstruction layout
   (``scripts/train_kvzap.py``'s ``collect`` with ``plus=False``); inputs: the layer's attention input;
2. one gate per layer of kvpress's ``FastKVzipGate`` form (:class:`kvbench.eviction.surrogates.FastKVzipGates`: output
   dimension 16, 16 sink keys, one logit bias per group member), trained with that loss and schedule (``--steps``).
   The authors' training module adds the bias twice; kvpress's inference module (the reference) once: trained here as
   kvpress infers.

Output ``<out>/q<G>_dim16_sink16.pt`` (``torch.save({"module": [state dict per layer], "kvbench_training": {...}})``,
the published layout, float32), ``G`` the model's query heads per KV head.  The gates kvbench ships
(``models/fastkvzip/``) were made by::

    python scripts/train_fastkvzip.py --model tiny --out models/fastkvzip/tiny-niah --texts 48
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from kvbench.eviction.surrogates import FastKVzipGates, gate_file_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_kvzap import collect, load, texts_for

DIM, SINK = 16, 16


def new_gate(hidden: int, heads: int, groups: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A gate's tensors (``GATE_KEYS``), linear maps initialised as ``nn.Linear``, the rest as the authors'."""
    bound = 1 / math.sqrt(hidden)

    def uniform(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=generator) * 2 - 1) * bound

    return {
        "q_proj.weight": uniform(heads * groups * DIM, hidden),
        "q_proj.bias": uniform(heads * groups * DIM),
        "k_proj.weight": uniform(heads * DIM, hidden),
        "q_norm.weight": torch.ones(DIM),
        "k_norm.weight": torch.ones(DIM),
        "k_base": torch.zeros(heads, 1, SINK, DIM),
        "b": torch.zeros(heads, 1, groups),
    }


def lr_factor(step: int, steps: int) -> float:
    """The authors' schedule: linear warm-up over the first 1%, then 1, 0.5 from half way, 0.25 from three quarters."""
    if step < 0.01 * steps:
        return step / max(1.0, 0.01 * steps)
    return 1.0 if step < 0.5 * steps else 0.5 if step < 0.75 * steps else 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="kvbench model preset (tiny, smollm2-135m-instruct, ...)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    model, tokenizer = load(args.model)
    x, y = collect(model, tokenizer, texts_for(args.model, tokenizer, args.texts, args.tokens, args.seed), plus=False)
    y = y.clamp(0, 1)
    config = model.config
    heads, groups = config.num_key_value_heads, config.num_attention_heads // config.num_key_value_heads
    generator = torch.Generator().manual_seed(args.seed)
    gates = [new_gate(x.shape[2], heads, groups, generator) for _ in range(x.shape[1])]
    params = [t.requires_grad_(True) for gate in gates for t in gate.values()]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    held = max(1, int(0.05 * x.shape[0]))
    order = torch.randperm(x.shape[0], generator=generator)
    valid, train = order[:held], order[held:]

    def loss_of(rows: torch.Tensor) -> torch.Tensor:
        model_gates = FastKVzipGates(tuple(gates), {"path": "training"})
        total = x.new_zeros(())
        for layer in range(x.shape[1]):
            pred = model_gates.scores(layer, x[rows, layer]).clamp(1e-7, 1 - 1e-7)  # [H, n]
            total = total + F.binary_cross_entropy(pred, y[rows, layer].T, reduction="none").mean(-1).sum()
        return total

    for step in range(args.steps):
        rows = train[torch.randint(train.numel(), (min(args.batch, train.numel()),), generator=generator)]
        optimizer.zero_grad()
        loss_of(rows).backward()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.steps)
        optimizer.step()
    with torch.no_grad():
        valid_loss = round(float(loss_of(valid)) / x.shape[1], 4)
    training = {
        "by": "kvbench scripts/train_fastkvzip.py (NOT the authors' published gates)",
        "command": "python scripts/train_fastkvzip.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "tokens": str(int(x.shape[0])),
        "target": "KVzip score (max attention from the repeated text over the KV head's query group)",
        "valid_bce_per_layer": str(valid_loss),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / gate_file_name(config.num_attention_heads, config.num_key_value_heads)
    states = [{key: t.detach().clone().contiguous() for key, t in gate.items()} for gate in gates]
    torch.save({"module": states, "kvbench_training": training}, path)
    path.chmod(0o644)
    print(json.dumps({"file": str(path), "valid_bce": valid_loss, "seconds": round(time.time() - started, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
