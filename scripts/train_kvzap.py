"""Train small KVzap surrogates (linear and MLP) for a model, on CPU in minutes, in the published checkpoint format.

KVzap (arXiv 2601.07891) learns to predict KVzip+ scores from the hidden states; NVIDIA trains its checkpoints
(``nvidia/KVzap-{linear,mlp}-<model>``) with kvpress's ``kvzap/train.py`` on 1.2M tokens of
Nemotron-Pretraining-Dataset-sample on a GPU.  This script follows the same recipe on local text, small enough for a
CPU, for models NVIDIA publishes nothing for (kvbench's embedded ``tiny`` model, SmolLM2):

1. each text ``x`` is laid out as KVzip's reconstruction: the chat template's prefix, ``x``, ``"\\n\\nRepeat the
   previous context exactly."``, the assistant turn's opening (``"\\n"`` without a template), ``x`` again
   (:func:`kvbench.methods.kvzip.chat_template_parts`);
2. one forward with eager attention; at every layer, the KVzip+ score of a token of the first ``x`` for a KV head is
   the largest, over the repeated ``x``'s queries and the head's query group, of ``A[q, t] / ||h_q|| * ||W_O v_t||``
   (``A`` the attention probability, ``h`` the layer's attention input, ``W_O v`` the value through the head's slice
   of the output projection); the target is its log;
3. inputs: the layer's attention input (after ``input_layernorm``) at those tokens;
4. ``linear``: per layer a ridge regression (alpha 1, intercept unpenalised: scikit-learn's ``Ridge()``, in closed
   form in float64); ``mlp``: ``Linear -> GELU -> Linear`` per layer, all layers at once, AdamW, MSE, cosine
   learning rate, gradient norm clipped at 1, 5% of the tokens held out (kvpress's settings, fewer epochs).

Output: ``<out>/linear`` and ``<out>/mlp``, each a folder in the published format (``config.json`` +
``model.safetensors``, :func:`kvbench.eviction.surrogates.save_kvzap`) whose config records how it was trained
(``kvbench_training``: not NVIDIA's weights).  The checkpoints kvbench ships (``models/kvzap/``) were made by::

    python scripts/train_kvzap.py --model tiny --out models/kvzap/tiny-niah --texts 48 --hidden-dim 32
    python scripts/train_kvzap.py --model smollm2-135m-instruct --out models/kvzap/SmolLM2-135M-Instruct \\
        --texts 40 --tokens 300 --hidden-dim 8

Texts: ``tiny`` gets ``tiny_niah`` haystacks (its vocabulary); other models the shipped essays
(``tasks/needle_grid/essays``) and Python's documentation topics (``pydoc_data.topics``, in every Python install)
cut into pieces of ``--tokens`` tokens, shuffled with ``--seed`` -- local English text, not NVIDIA's Nemotron data.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from kvbench import resources
from kvbench.eviction.surrogates import save_kvzap
from kvbench.methods.kvzip import FIRST_PROMPT

REPEAT_PROMPT = FIRST_PROMPT  # "\n\nRepeat the previous context exactly."


def load(preset: str):
    """The model of a kvbench preset (eager attention, float32, CPU) and its tokenizer."""
    import kvbench
    from kvbench.models.loading import load_model

    cfg = kvbench.compose_config(model=preset).model
    cfg.device, cfg.dtype = "cpu", "float32"
    loaded = load_model(cfg)
    model = loaded.model.eval()
    model.set_attn_implementation("eager")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, loaded.tokenizer


def texts_for(preset: str, tokenizer, count: int, tokens: int, seed: int) -> list[list[int]]:
    """``count`` token sequences of about ``tokens`` tokens (module docstring)."""
    if preset == "tiny":
        from kvbench.tasks.tiny_niah import VARIANTS, build_instance

        rng = random.Random(seed)
        out = []
        for index in range(count):
            variant = VARIANTS[index % len(VARIANTS)]
            instance = build_instance(variant, tokens // 10, rng.uniform(0, 100), f"kvzap-{seed}-{index}")
            ids = tokenizer.encode(" ".join(instance.context), add_special_tokens=False)
            out.append(ids[:tokens])
        return out
    from pydoc_data.topics import topics  # Python's own documentation text: English, offline, in every install

    essays = [p.read_text(encoding="utf-8") for p in sorted((resources.tasks_dir() / "needle_grid/essays").glob("*"))]
    words = "\n\n".join(essays + [topics[name] for name in sorted(topics)])
    ids = tokenizer.encode(words, add_special_tokens=False)
    pieces = [ids[start : start + tokens] for start in range(0, len(ids) - tokens, tokens)]
    random.Random(seed).shuffle(pieces)
    return pieces[:count]


def template_parts(tokenizer) -> tuple[list[int], list[int]]:
    """The chat template's prefix ids (before the user's text) and the assistant turn's opening ids."""
    if getattr(tokenizer, "chat_template", None) is None:
        return [], tokenizer.encode("\n", add_special_tokens=False)
    dummy, separator = "dummy context", "\n" + "#" * len("dummy context")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": dummy + separator}], add_generation_prompt=True, tokenize=False
    )
    before, suffix = rendered.split(separator)
    prefix = before.split(dummy)[0]
    return tokenizer.encode(prefix, add_special_tokens=False), tokenizer.encode(suffix, add_special_tokens=False)


class ScoreHooks:
    """Forward hooks on every ``self_attn``: the layer's attention input at the text's tokens and the log KVzip+
    scores ``[n, H_kv]`` of those tokens (module docstring, step 2); ``plus=False``: KVzip's own scores (the largest
    attention probability, no normalisation, no log: Fast KVzip's targets)."""

    def __init__(self, model, plus: bool = True) -> None:
        self.plus = plus
        self.span = (0, 0)
        self.repeat = (0, 0)
        self.rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.handles = [
            layer.self_attn.register_forward_hook(self.hook, with_kwargs=True) for layer in model.model.layers
        ]

    def hook(self, module, args, kwargs, output) -> None:
        hidden = kwargs["hidden_states"][0]  # [T, hidden]
        weights = output[1][0]  # [H_q, T, T]
        config = module.config
        heads_kv, heads_q, dim = config.num_key_value_heads, config.num_attention_heads, module.head_dim
        cache = kwargs["past_key_values"]
        values = cache.layers[module.layer_idx].values[0]  # [H_kv, T, D]
        values = values.repeat_interleave(heads_q // heads_kv, dim=0)  # [H_q, T, D]
        out_proj = module.o_proj.weight.T.reshape(heads_q, dim, -1)  # [H_q, D, hidden]
        value_norm = torch.einsum("hid,hti->htd", out_proj, values).norm(dim=-1)  # [H_q, T]
        scores = weights / hidden.norm(dim=-1)[None, :, None] * value_norm[:, None, :] if self.plus else weights
        (first, last), (r_first, r_last) = self.span, self.repeat
        best = scores[:, r_first:r_last, first:last].amax(dim=1)  # [H_q, n]
        best = best.view(heads_kv, heads_q // heads_kv, -1).amax(dim=1)  # [H_kv, n]
        target = best.log() if self.plus else best
        self.rows[int(module.layer_idx)] = (hidden[first:last].clone(), target.T.contiguous())


def collect(model, tokenizer, texts: list[list[int]], plus: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``X [N, L, hidden]`` attention inputs and ``y [N, L, H_kv]`` log KVzip+ scores (``plus=False``: KVzip's
    scores) of every text token."""
    from transformers import DynamicCache

    prefix, suffix = template_parts(tokenizer)
    repeat = tokenizer.encode(REPEAT_PROMPT, add_special_tokens=False)
    hooks = ScoreHooks(model, plus)
    xs, ys = [], []
    try:
        for ids in texts:
            sequence = prefix + ids + repeat + suffix + ids
            hooks.span = (len(prefix), len(prefix) + len(ids))
            hooks.repeat = (len(sequence) - len(ids), len(sequence))
            hooks.rows.clear()
            with torch.no_grad():
                model.model(input_ids=torch.tensor([sequence]), past_key_values=DynamicCache(), use_cache=True)
            layers = sorted(hooks.rows)
            xs.append(torch.stack([hooks.rows[i][0] for i in layers], dim=1))
            ys.append(torch.stack([hooks.rows[i][1] for i in layers], dim=1))
    finally:
        for handle in hooks.handles:
            handle.remove()
    return torch.cat(xs), torch.cat(ys)


def train_linear(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> list[tuple[torch.Tensor, ...]]:
    """Per layer ``(W [H, hidden], b [H])`` of ridge regression with an unpenalised intercept (float64)."""
    layers = []
    for layer in range(x.shape[1]):
        inputs, targets = x[:, layer].double(), y[:, layer].double()
        x_mean, y_mean = inputs.mean(0), targets.mean(0)
        centered = inputs - x_mean
        gram = centered.T @ centered + alpha * torch.eye(inputs.shape[1], dtype=torch.float64)
        weight = torch.linalg.solve(gram, centered.T @ (targets - y_mean)).T  # [H, hidden]
        layers.append((weight.float(), (y_mean - weight @ x_mean).float()))
    return layers


def train_mlp(
    x: torch.Tensor, y: torch.Tensor, hidden_dim: int, epochs: int, lr: float, batch: int, seed: int
) -> tuple[list[tuple[torch.Tensor, ...]], dict]:
    """Per layer ``(W1, b1, W2, b2)`` of ``Linear -> GELU -> Linear``, trained on all layers at once."""
    torch.manual_seed(seed)
    layers, inputs, heads = x.shape[1], x.shape[2], y.shape[2]
    modules = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(inputs, hidden_dim), torch.nn.GELU(), torch.nn.Linear(hidden_dim, heads))
        for _ in range(layers)
    )
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    held = max(1, int(0.05 * x.shape[0]))
    valid, train = order[:held], order[held:]
    optimizer = torch.optim.AdamW(modules.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)

    def predict(rows: torch.Tensor) -> torch.Tensor:
        return torch.stack([module(x[rows, i]) for i, module in enumerate(modules)], dim=1)

    log = []
    for _ in range(epochs):
        shuffled = train[torch.randperm(train.numel())]
        for start in range(0, shuffled.numel(), batch):
            rows = shuffled[start : start + batch]
            loss = F.mse_loss(predict(rows), y[rows])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
            optimizer.step()
        scheduler.step()
        with torch.no_grad():
            log.append(round(float(F.mse_loss(predict(valid), y[valid])), 5))
    params = [(m[0].weight.data, m[0].bias.data, m[2].weight.data, m[2].bias.data) for m in modules]
    return params, {"valid_mse_per_epoch": log}


def r2(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Coefficient of determination over every layer and head."""
    return float(1 - ((pred - target) ** 2).sum() / ((target - target.mean((0,), keepdim=True)) ** 2).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="kvbench model preset (tiny, smollm2-135m-instruct, ...)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=48, help="texts to score (5%% of their tokens held out)")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per text")
    parser.add_argument("--hidden-dim", type=int, default=512, help="MLP hidden size (kvpress: 512)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    model, tokenizer = load(args.model)
    texts = texts_for(args.model, tokenizer, args.texts, args.tokens, args.seed)
    x, y = collect(model, tokenizer, texts)
    linear = train_linear(x, y)
    mlp, mlp_log = train_mlp(x, y, args.hidden_dim, args.epochs, args.lr, args.batch, args.seed)
    with torch.no_grad():
        fit_linear = torch.stack([x[:, i] @ w.T + b for i, (w, b) in enumerate(linear)], dim=1)
        fit_mlp = torch.stack([F.linear(F.gelu(F.linear(x[:, i], w1, b1)), w2, b2) for i, (w1, b1, w2, b2)
                               in enumerate(mlp)], dim=1)  # fmt: skip
    training = {
        "by": "kvbench scripts/train_kvzap.py (NOT NVIDIA's published weights)",
        "command": "python scripts/train_kvzap.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "device": f"cpu ({platform.processor() or platform.machine()}, {args.threads} thread(s))",
        "texts": len(texts),
        "tokens": int(x.shape[0]),
        "target": "log KVzip+ score (max over the repeated text's queries and the KV head's query group)",
    }
    layers, heads, hidden = x.shape[1], y.shape[2], x.shape[2]
    elapsed = round(time.time() - started, 1)
    for name, params, fit, extra in (
        ("linear", linear, fit_linear, {"fit": "ridge, alpha 1, closed form (float64)"}),
        ("mlp", mlp, fit_mlp, {"fit": f"AdamW lr {args.lr}, {args.epochs} epochs, batch {args.batch}", **mlp_log}),
    ):
        record = {**training, **extra, "train_r2": round(r2(fit, y), 4)}
        folder = save_kvzap(args.out / name, params, hidden, heads, None if name == "linear" else args.hidden_dim,
                            record)  # fmt: skip
        for file in folder.iterdir():
            file.chmod(0o644)
        print(json.dumps({name: {"tokens": record["tokens"], "train_r2": record["train_r2"], "seconds": elapsed}}))
    assert layers == len(model.model.layers)
    if math.isnan(float(y.sum())):
        raise SystemExit("NaN in the targets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
