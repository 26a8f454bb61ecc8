"""Train small RestoreKV weights for a model, on CPU in minutes, in the published format (issue #58).

RestoreKV (arXiv 2608.01247; NVIDIA/kvpress ``RestoreKVPress``) trains only ``n`` restore-token embeddings and a LoRA
adapter, by self-distillation from the full-cache teacher: the model with the whole context is the teacher; the
student is the same model whose cache holds KVzip's kept tokens plus the restore tokens' keys and values, made by one
LoRA-adapted pass of the restore embeddings over the full cache.  This script follows that on local text:

1. per text (``texts_for`` of ``scripts/train_kvzap.py``: ``tiny_niah`` haystacks for ``tiny``; the context, then its
   question and answers as the continuation), the kept prompt tokens per layer and KV head are the ones kvbench's
   ``method=restorekv`` keeps at a compression ratio drawn from ``--ratios`` (KVzip's scores, the budget lowered by
   the ``n`` restore slots; the kept set does not depend on the weights);
2. one forward of ``[context, restore embeddings, continuation]`` (positions ``0 .. S+n+m-1``, as kvbench feeds
   them) through a training attention function registered here (a per-layer, per-head mask: the continuation sees
   the kept context tokens, every restore token and itself; the restore tokens see the whole context), the LoRA added
   (forward hooks) on the restore tokens' rows only;
3. loss: KL(teacher || student) of the next-token distributions over the continuation (the teacher: the full
   context, then the continuation at positions ``S ..``), Adam on the embeddings and the LoRA (``B`` starts at 0).

Output: ``<out>/adapter_config.json`` + ``adapter_model.safetensors`` (a PEFT LoRA adapter: ``r``, ``lora_alpha``,
``target_modules`` q/k/v/o_proj), ``restore_embeddings.safetensors`` (float32) and ``kvbench_training.json`` (how it
was made, and the held-out KL with the restore tokens against the same budget with untrained ones).  The weights
kvbench ships (``models/restorekv/``) were made by::

    python scripts/train_restorekv.py --model tiny --out models/restorekv/tiny-niah
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.nn import functional as F
from transformers import AttentionInterface

from kvbench.attention.function import ATTENTION_NAME
from kvbench.budget import parse_budget
from kvbench.eviction.base import build_method
from kvbench.eviction.restore_weights import TRAINING_FILE, RestoreWeights, load_restore
from kvbench.inference.prefill import prefill

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_kvzap import load

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
TRAIN_ATTENTION = "restorekv_train"


def train_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA with this script's per-layer, per-head boolean mask ``restore_masks[layer]`` ``[1, H_q, T, T]``."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    mask = kwargs["restore_masks"][module.layer_idx]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TRAIN_ATTENTION, train_attention)


def instances(count: int, tokens: int, seed: int, tokenizer) -> list[tuple[list[int], list[int]]]:
    """``(context ids, continuation ids)``: ``tiny_niah`` haystacks, then their question and first answer."""
    from kvbench.tasks.tiny_niah import VARIANTS, build_instance

    rng, out = random.Random(seed), []
    for index in range(count):
        instance = build_instance(VARIANTS[index % len(VARIANTS)], tokens // 10, rng.uniform(0, 100), f"rkv{index}")
        context = tokenizer.encode(" ".join(instance.context), add_special_tokens=False)[:tokens]
        tail = " ".join(instance.question) + " " + instance.answers[0]
        out.append((context, tokenizer.encode(tail, add_special_tokens=False)))
    return out


def write_checkpoint(folder: Path, embeddings, lora, rank: int, alpha: float, training: dict | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": list(TARGETS), "bias": "none", "use_rslora": False, "fan_in_fan_out": False,
        "base_model_name_or_path": None,
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for name, (a, b) in lora.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.detach().float().contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.detach().float().contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    save_file(
        {"restore_embeddings": embeddings.detach().float().contiguous()}, str(folder / "restore_embeddings.safetensors")
    )
    if training is not None:
        (folder / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")


def kept_sets(model, tokenizer, context: list[int], ratio: float, folder: Path) -> list[list[torch.Tensor]]:
    """Per layer, per KV head, the context positions ``method=restorekv`` keeps at ``<ratio>cr``."""
    method = build_method({"name": "restorekv", "family": "restorekv", "params": {"checkpoint": str(folder)}})
    with torch.inference_mode():
        state = prefill(model, context, method=method, budget=parse_budget(f"{ratio}cr"), tokenizer=tokenizer)
    return [[p[p < len(context)].clone() for p in layer.positions] for layer in state.cache.headwise_layers]


def masks_for(kept, context: int, restore: int, cont: int, groups: int, full: bool) -> list[torch.Tensor]:
    """Per layer ``[1, H_q, T, T]`` allowed attention (module docstring, step 2); ``full``: no eviction."""
    total = context + restore + cont
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    out = []
    for heads in kept:
        layer = causal.expand(len(heads), total, total).clone()
        if not full:
            for h, positions in enumerate(heads):
                evicted = torch.ones(context, dtype=torch.bool)
                evicted[positions] = False
                layer[h, context + restore :, :context] &= ~evicted
        out.append(layer.repeat_interleave(groups, dim=0)[None])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="kvbench model preset (only tiny's data is built in)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--restore", type=int, default=8, help="restore tokens n (the published adapters: 8)")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=8.0)
    parser.add_argument("--ratios", default="0.5,0.75")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    started = time.time()
    model, tokenizer = load(args.model)
    model.set_attn_implementation(ATTENTION_NAME)  # kvbench's own, for the kept sets (step 1)
    config = model.config
    groups = config.num_attention_heads // config.num_key_value_heads
    embed = model.get_input_embeddings().weight
    modules = dict(model.named_modules())
    generator = torch.Generator().manual_seed(args.seed)
    picks = torch.randint(0, embed.shape[0], (args.restore,), generator=generator)
    restore = embed[picks].detach().clone().requires_grad_(True)
    lora = {}
    for name, module in modules.items():
        if name.split(".")[-1] in TARGETS and isinstance(module, torch.nn.Linear):
            a = torch.empty(args.rank, module.in_features)
            torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
            lora[name] = (a.requires_grad_(True), torch.zeros(module.out_features, args.rank, requires_grad=True))
    scaling = args.alpha / args.rank
    ratios = [float(r) for r in args.ratios.split(",")]
    data = instances(args.texts, args.tokens, args.seed, tokenizer)
    held = max(2, args.texts // 8)
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp), restore, lora, args.rank, args.alpha, None)
        prepared = [
            (ctx, cont, kept_sets(model, tokenizer, ctx, ratios[i % len(ratios)], Path(tmp)))
            for i, (ctx, cont) in enumerate(data)
        ]
    model.set_attn_implementation(TRAIN_ATTENTION)
    rows: dict[str, torch.Tensor] = {}

    def hook_for(a, b):
        def hook(module, inputs, output):
            return output + (F.linear(F.linear(inputs[0], a), b) * scaling) * rows["restore"]

        return hook

    handles = [modules[name].register_forward_hook(hook_for(a, b)) for name, (a, b) in lora.items()]

    def distill_loss(ctx, cont, kept) -> torch.Tensor:
        s, n, m = len(ctx), args.restore, len(cont)
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            rows["restore"] = torch.zeros(1, s + m, 1)
            teacher_masks = masks_for(kept, s, 0, m, groups, full=True)
            teacher = model(input_ids=ids, restore_masks=teacher_masks).logits[0, s : s + m - 1]
        embeds = torch.cat([embed[ctx], restore, embed[cont]])[None]
        flags = torch.zeros(1, s + n + m, 1)
        flags[:, s : s + n] = 1.0
        rows["restore"] = flags
        position_ids = torch.arange(s + n + m)[None]
        masks = masks_for(kept, s, n, m, groups, full=False)
        logits = model(inputs_embeds=embeds, position_ids=position_ids, restore_masks=masks).logits[0]
        student = logits[s + n : s + n + m - 1]  # the continuation's own next-token predictions, as the teacher's
        return F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean")

    params = [restore] + [t for pair in lora.values() for t in pair]
    optimizer = torch.optim.Adam(params, lr=args.lr)
    valid, train = prepared[:held], prepared[held:]
    with torch.no_grad():
        before = sum(float(distill_loss(*item)) for item in valid) / len(valid)
    for _ in range(args.epochs):
        for index in torch.randperm(len(train), generator=generator).tolist():
            optimizer.zero_grad()
            distill_loss(*train[index]).backward()
            optimizer.step()
    with torch.no_grad():
        after = sum(float(distill_loss(*item)) for item in valid) / len(valid)
    for handle in handles:
        handle.remove()
    training = {
        "by": "kvbench scripts/train_restorekv.py (NOT the authors' published adapters)",
        "command": "python scripts/train_restorekv.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "texts": len(data),
        "held_out_kl_untrained": round(before, 4),
        "held_out_kl_trained": round(after, 4),
        "seconds": round(time.time() - started, 1),
    }
    write_checkpoint(args.out, restore, lora, args.rank, args.alpha, training)
    weights: RestoreWeights = load_restore.__wrapped__(str(args.out))  # read back as kvbench reads it
    print(json.dumps({"out": str(args.out), "restore_tokens": weights.num_tokens, **training}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
