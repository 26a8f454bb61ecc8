#!/usr/bin/env python
"""Train the tiny retrieval model shipped in ``models/tiny-niah`` (CPU-friendly, reproducible).

The model is a small Llama (GQA, tied embeddings) with the word-level tokenizer of :mod:`kvbench.models.tiny`,
trained on the synthetic needle/question sequences of :func:`kvbench.tasks.tiny_niah_training.training_example`
mixed with dense associative-recall sequences (:func:`kvbench.tasks.tiny_niah_training.compact_example`).  Only answer
tokens are supervised (many per sequence), multi-value answers included (``v1 , <key> second v2 , ...``).
A fixed length curriculum (``--schedule``: 128 -> 4096 tokens) reaches the longest evaluation length, then drills
multi-value.

Retrieval by key needs an induction circuit (a previous-token head feeding a head that matches the current token
against those copies), and from a random initialisation that pair forms only after a long loss plateau: hours on
a CPU.  For the first ``--guide-steps`` steps an auxiliary loss (:func:`guidance_loss`) shapes the two attention
patterns directly (head 0 of layer 0 attends to the previous token; head 0 of layer 1 attends, at every answer
position, to the context positions holding the answer), after which the answer loss alone trains every weight.
With it, retrieval appears within a few hundred steps.  The shipped weights are an ordinary ``LlamaForCausalLM``.

One command retrains it (23 min on 2 CPU cores, measured)::

    python scripts/train_tiny.py --out models/tiny-niah --threads 2

and ``--evaluate-only --out models/tiny-niah`` prints its full-cache accuracy table.  The same seed and thread
count give the same weights (data come from ``random.Random(f"{seed}-{step}")``, torch is seeded and set to
deterministic algorithms).  ``--resume`` continues from ``<ckpt-dir>/last.pt``; a resumed run equals an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch

from kvbench import resources
from kvbench.models.tiny import VALUE_WORDS, build_config, build_tokenizer
from kvbench.tasks.tiny_niah import (
    MULTI_FOCUS_SHARE,
    VARIANTS,
    TinyNiahDataset,
    evaluate_dataset,
)
from kvbench.tasks.tiny_niah_training import training_example

log = logging.getLogger("train_tiny")

#: The default length curriculum: ``<sequence length>:<steps>:<share of dense associative-recall sequences>``
#: ``[:<share of multi-value drill sequences>]`` per stage (5300 steps, 23 min on 2 CPU cores).
DEFAULT_SCHEDULE = (
    "128:500:0.7,256:1000:0.3,512:1000:0.2,1024:1000:0.1,2048:800:0.1,4096:600:0.1,"
    # multi-value drill: 60 % of the sequences hold 1-2 multi-value keys and ask them most of the time
    "2048:400:0.0:0.6"
)


def parse_schedule(text: str) -> list[tuple[int, int, float, float]]:
    """``"128:500:0.7,256:1000:0.3:0.6"`` -> ``[(128, 500, 0.7, MULTI_FOCUS_SHARE), (256, 1000, 0.3, 0.6)]``.

    Each stage is ``<tokens>:<steps>:<compact share>[:<multi-value drill share>]``.
    """
    stages = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            if len(parts) not in (3, 4):
                raise ValueError(item)
            length, steps, compact = int(parts[0]), int(parts[1]), float(parts[2])
            multi = float(parts[3]) if len(parts) == 4 else MULTI_FOCUS_SHARE
        except ValueError:
            raise SystemExit(
                f"bad --schedule stage {item!r}: expected <tokens>:<steps>:<compact share>[:<multi-value share>]"
            ) from None
        stages.append((length, steps, compact, multi))
    return stages


def stage_at(schedule: list[tuple[int, int, float, float]], step: int) -> int:
    """Index of the schedule stage that ``step`` (0-based) falls in."""
    end = 0
    for index, (_, steps, _, _) in enumerate(schedule):
        end += steps
        if step < end:
            return index
    return len(schedule) - 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(resources.models_dir() / "tiny-niah"), help="output model folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--rope-theta", type=float, default=100_000.0)
    parser.add_argument("--init-std", type=float, default=0.02, help="initializer_range of the weights")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--guide-steps", type=int, default=500, help="steps with the attention-guidance loss")
    parser.add_argument("--guide-prev", type=float, default=1.0, help="weight of the previous-token guidance")
    parser.add_argument(
        "--guide-induction",
        type=float,
        default=0.1,
        help="weight of the induction guidance (1.0 blocks learning to copy: the answer loss stays at chance)",
    )
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--tokens-per-step", type=int, default=4096, help="batch size x sequence length")
    parser.add_argument(
        "--schedule",
        default=DEFAULT_SCHEDULE,
        help="length curriculum: comma-separated <tokens>:<steps>:<compact share>[:<multi-value drill share>] stages",
    )
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-samples", type=int, default=8, help="held-out samples per variant and length")
    parser.add_argument("--final-lengths", default="1024,2048,4096", help="lengths checked at the last stage")
    parser.add_argument("--ckpt-dir", default="/tmp/tiny_niah_ckpt")
    parser.add_argument("--resume", action="store_true", help="continue from <ckpt-dir>/last.pt")
    parser.add_argument("--log-file", default="/tmp/tiny_niah_train.log")
    parser.add_argument(
        "--evaluate-only",
        action="store_true",
        help="no training: print the full-cache accuracy of the model in --out (tiny_niah seed 42, --eval-samples)",
    )
    return parser.parse_args(argv)


def copy_sources(example: Any, value_ids: frozenset[int]) -> list[tuple[int, list[int]]]:
    """Attention targets of the guidance loss: for every supervised position whose answer is a value token, the
    earlier positions (up to and including the supervised one) that hold that token.

    Returns ``(position, sources)`` pairs; positions without a source (or with a non-value answer) are left out.
    """
    ids = example.input_ids
    pairs = []
    for position, target in zip(example.positions, example.targets(), strict=True):
        if target not in value_ids:
            continue
        sources = [j for j in range(position + 1) if ids[j] == target]
        if sources:
            pairs.append((position, sources))
    return pairs


def guidance_loss(
    attentions: tuple[torch.Tensor, ...], batch: list[Any], value_ids: frozenset[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention guidance towards an induction circuit (used only at the start of training).

    Retrieval by key needs two heads that only help together -- one that copies each token's predecessor into it,
    one that matches the current token against those copies and copies the token found -- and from a random
    initialisation the pair forms only after a long loss plateau.  This loss shapes the two attention patterns
    directly: head 0 of layer 0 attends to the previous token, and head 0 of layer 1, at every answer position
    whose answer is a value token, attends to the earlier positions holding that answer (the token after
    the earlier occurrence of the current token).  ``attentions[l]`` is ``[batch, heads, seq, seq]`` (eager
    attention probabilities).

    Returns the two losses ``(previous_token, induction)``, each a mean of ``-log(attention mass on the targets)``.
    """
    prev = attentions[0][:, 0]
    seq = prev.shape[-1]
    steps = torch.arange(1, seq, device=prev.device)
    prev_loss = -torch.log(prev[:, steps, steps - 1] + 1e-6).mean()
    rows, masks = [], []
    for b, example in enumerate(batch):
        for position, sources in copy_sources(example, value_ids):
            mask = torch.zeros(seq, dtype=torch.bool, device=prev.device)
            mask[sources] = True
            rows.append((b, position))
            masks.append(mask)
    if not rows:
        return prev_loss, prev_loss * 0.0
    induction = attentions[1][:, 0]
    picked = induction[[r[0] for r in rows], [r[1] for r in rows]]  # [n, seq]
    mass = (picked * torch.stack(masks)).sum(-1)
    return prev_loss, (-torch.log(mass + 1e-6)).mean()


def answer_loss(
    model: Any,
    batch: list[Any],
    device: torch.device,
    guide: tuple[float, float] = (0.0, 0.0),
    value_ids: frozenset[int] = frozenset(),
) -> torch.Tensor:
    """Mean over supervised positions of ``-log p(answer token)``, plus the two :func:`guidance_loss` terms
    weighted by ``guide`` = (previous-token weight, induction weight); guidance needs eager attention."""
    guiding = any(weight > 0 for weight in guide)
    input_ids = torch.tensor([ex.input_ids for ex in batch], device=device)
    output = model.model(input_ids=input_ids, output_attentions=guiding)
    hidden = output.last_hidden_state
    rows = [b for b, ex in enumerate(batch) for _ in ex.positions]
    cols = [p for ex in batch for p in ex.positions]
    targets = [t for ex in batch for t in ex.targets()]
    if not targets:  # nothing supervised (only possible for very short sequences): a zero loss with a graph
        return hidden.sum() * 0.0
    logp = torch.log_softmax(model.lm_head(hidden[rows, cols]).float(), dim=-1)  # [n, vocab]
    loss = -logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1).mean()
    if guiding:
        prev_loss, induction_loss = guidance_loss(output.attentions, batch, value_ids)
        loss = loss + guide[0] * prev_loss + guide[1] * induction_loss
    return loss


def evaluate(model: Any, tokenizer: Any, lengths: list[int], num_samples: int) -> dict[str, float]:
    """Greedy full-cache accuracy (0-1) per ``<variant>@<length>`` on held-out prompts (task seed 1234)."""
    model.eval()
    scores = {}
    for length in lengths:
        for variant in VARIANTS:
            dataset = TinyNiahDataset(variant, length, num_samples, 1234, tokenizer, None)
            scores[f"{variant}@{length}"] = evaluate_dataset(model, tokenizer, dataset)["score"] / 100.0
    model.train()
    return scores


def evaluate_saved(args: argparse.Namespace) -> int:
    """Print the full-cache greedy accuracy table (variant x length) of the model saved in ``args.out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    model = AutoModelForCausalLM.from_pretrained(args.out).eval()
    lengths = [int(n) for n in args.final_lengths.split(",")]
    print("variant          " + "".join(f"{n:>8}" for n in lengths))
    for variant in VARIANTS:
        row = []
        for length in lengths:
            dataset = TinyNiahDataset(variant, length, args.eval_samples, 42, tokenizer, None)
            row.append(evaluate_dataset(model, tokenizer, dataset)["score"])
        print(f"{variant:<17}" + "".join(f"{score:>8.1f}" for score in row), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Train, checkpoint, and save the final model in Hugging Face format."""
    args = parse_args(argv)
    if args.evaluate_only:
        return evaluate_saved(args)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(args.log_file)],
    )
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)

    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    config = build_config(
        len(vocab),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate,
        rope_theta=args.rope_theta,
        initializer_range=args.init_std,
    )
    config._attn_implementation = "eager" if args.guide_steps > 0 else "sdpa"  # guidance reads attention probs
    model = LlamaForCausalLM(config)
    value_ids = frozenset(vocab[v] for v in VALUE_WORDS)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    schedule = parse_schedule(args.schedule)
    if args.layers < 2 and args.guide_steps > 0:
        raise SystemExit(f"attention guidance needs 2+ layers (an induction circuit), got --layers {args.layers}")
    total_steps = sum(stage[1] for stage in schedule)
    final_lengths = [int(n) for n in args.final_lengths.split(",")]
    step, history = 0, []
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if args.resume and (ckpt_dir / "last.pt").exists():
        state = torch.load(ckpt_dir / "last.pt", map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        log.info("resumed at step %d", step)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "model: %d parameters, %s", n_params, {k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers")}
    )
    start, losses = time.time(), []
    while step < total_steps:
        rng = random.Random(f"{args.seed}-{step}")
        stage = stage_at(schedule, step)
        top, _, compact, multi = schedule[stage]
        length = top if rng.random() < 0.7 or stage == 0 else rng.choice([n[0] for n in schedule[:stage]])
        batch = [
            training_example(rng, length, vocab.__getitem__, compact, multi)
            for _ in range(max(1, args.tokens_per_step // length))
        ]
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        guiding = step < args.guide_steps
        if not guiding and model.config._attn_implementation != "sdpa":
            model.set_attn_implementation("sdpa")  # the guidance needs attention probabilities; sdpa is faster
        guide = (args.guide_prev, args.guide_induction) if guiding else (0.0, 0.0)
        loss = answer_loss(model, batch, device, guide, value_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        step += 1
        stage_end = step == total_steps or stage_at(schedule, step) != stage
        if step % args.eval_every == 0 or stage_end:
            lengths = final_lengths if step == total_steps else [max(top, 256)]  # 16 multikey needles: >128 tokens
            scores = evaluate(model, tokenizer, lengths, args.eval_samples)
            record = {
                "step": step,
                "stage_length": top,
                "loss": sum(losses) / len(losses),
                "minutes": (time.time() - start) / 60,
                "scores": scores,
            }
            history.append(record)
            mean = sum(scores.values()) / len(scores)
            log.info("step %d len %d loss %.4f acc %.3f %s", step, top, record["loss"], mean, json.dumps(scores))
            losses = []
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "history": history}
            torch.save(state, ckpt_dir / "last.pt")
            model.save_pretrained(ckpt_dir / f"step{step}")
        elif step % 25 == 0:
            log.info("step %d len %d loss %.4f (%.1f min)", step, length, losses[-1], (time.time() - start) / 60)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "training_log.json").write_text(
        json.dumps({"args": vars(args), "steps": step, "history": history}, indent=1) + "\n"
    )
    log.info("saved %s after %d steps (%.1f min)", out, step, (time.time() - start) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
