"""The batch phase's helpers of ``scripts/gpu_validate.py``: LongBench-like requests on a real tokenizer, the
generation at one decode batch size with each step's logits recorded, and the comparison of batch-N outputs with
batch 1's (:func:`batch_row`).  Imports of torch and kvbench are deferred to the calls, as in the script (the
environment it sets must be in place first)."""

from __future__ import annotations

import math
from typing import Any

#: Appended to every batch-phase context (LongBench-like: a question after the document).
BATCH_QUESTION = "\n\nQuestion: What is the main topic of the text above?\nAnswer:"


def batch_requests(tokenizer: Any, vocab_size: int, samples: int, length: int, max_new: int) -> list[Any]:
    """``samples`` LongBench-like requests: BOS (if the tokenizer has one) and ``length`` seeded random ordinary tokens
    of the real tokenizer (no special tokens) as the context, :data:`BATCH_QUESTION` as the question.  No stop token:
    every sample decodes ``max_new`` tokens, so a decode batch stays full (steady state) and the tokens compared are as
    many at every batch size."""
    import torch

    from kvbench.inference.batched_decode import DecodeRequest

    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    question = tokenizer.encode(BATCH_QUESTION, add_special_tokens=False)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ordinary = min(vocab_size, int(tokenizer.vocab_size))
    requests = []
    for seed in range(samples):
        ids = torch.randint(0, ordinary, (length,), generator=torch.Generator().manual_seed(1000 + seed))
        ids = torch.where(torch.isin(ids, special), (ids + 1) % ordinary, ids)  # no special token inside the text
        requests.append(DecodeRequest(bos + ids.tolist(), question, max_new_tokens=max_new, stop_token_ids=set()))
    return requests


def replace_tokens(request: Any, max_new: int) -> Any:
    """``request`` with ``max_new`` new tokens."""
    from dataclasses import replace

    return replace(request, max_new_tokens=max_new)


class StepLogits:
    """The last position's logits ``[B, vocab]`` of every LM-head call, copied and kept on the device (a forward hook;
    no host synchronisation per forward).  Each copy is one row per sample, a few hundred KB for a real vocabulary."""

    def __init__(self, model: Any) -> None:
        self.calls: list[Any] = []
        self.handle = model.get_output_embeddings().register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        self.calls.append(output[:, -1].detach().clone())

    def take(self) -> list[Any]:
        """The calls recorded since the last :meth:`take`."""
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        self.handle.remove()


def generate_outputs(
    model: Any,
    tokenizer: Any,
    arch: str,
    method: str,
    budget: str,
    requests: list[Any],
    decode_batch: int,
    recorder: StepLogits,
) -> tuple[list[Any], list[Any] | None]:
    """The runner's generation of ``requests`` in order (:mod:`kvbench.run.generation`): at batch 1
    :func:`kvbench.inference.generate.generate` one sample at a time, above it
    :func:`kvbench.inference.batched_decode.generate_batched`; one method object per run, as the runner's.

    Also each sample's decoding logits ``[T - 1, vocab]`` (the logits that chose new tokens 2..T; the first comes from
    the sample's own prefill at every batch size), from ``recorder``: at batch 1 a sample's last ``T - 1`` LM-head
    calls; at batch N the calls with more than one row, sample ``w * N + b`` being row ``b`` of wave ``w`` (every
    sample decodes ``max_new_tokens``, so the batch is filled in request order and empties at once).  None where the
    calls do not have that shape (a sample stopped early, or the samples are not a multiple of N)."""
    import torch

    from kvbench.bench.random_models import load_method
    from kvbench.budget import parse_budget
    from kvbench.inference.batched_decode import generate_batched
    from kvbench.inference.generate import generate

    method_object, parsed = load_method(method, arch), parse_budget(budget)
    recorder.take()
    if decode_batch == 1:
        outputs, logits = [], []
        for r in requests:
            outputs.append(
                generate(
                    model,
                    tokenizer,
                    r.context_ids,
                    r.question_ids,
                    method=method_object,
                    budget=parsed,
                    question_mode="aware",
                    max_new_tokens=r.max_new_tokens,
                    stop_token_ids=r.stop_token_ids,
                )
            )
            steps = len(outputs[-1].token_ids) - 1
            calls = recorder.take()
            logits.append(torch.cat(calls[len(calls) - steps :]) if steps > 0 else None)
        return outputs, logits
    finished = dict(
        generate_batched(
            model,
            tokenizer,
            requests,
            method=method_object,
            budget=parsed,
            question_mode="aware",
            decode_batch=decode_batch,
        )
    )
    outputs = [finished[index] for index in range(len(requests))]
    steps = {len(o.token_ids) - 1 for o in outputs}
    batched = [call for call in recorder.take() if call.shape[0] > 1]
    if len(requests) % decode_batch or len(steps) != 1 or len(batched) * decode_batch != len(requests) * min(steps):
        return outputs, None
    per_wave = min(steps)
    logits = []
    for wave in range(len(requests) // decode_batch):
        stacked = torch.stack(batched[wave * per_wave : (wave + 1) * per_wave], dim=1)  # [N, steps, vocab]
        logits.extend(stacked.unbind(0))
    return outputs, logits


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The first step (0 = the first new token) where ``tokens`` differs from ``reference``; None if identical."""
    for step, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return step
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def batch_row(
    outputs: list[Any], logits: list[Any] | None, reference: tuple[list[Any], float, list[Any] | None] | None
) -> dict[str, Any]:
    """A ``batch.csv`` row's measurements: decode tokens (every new token after the first, which the prefill gives)
    over the decode seconds (:class:`~kvbench.inference.generate.GenerationOutput` ``decode_s``: at batch N each
    sample's share of the steps, so the sum is the run's decoding time); against ``reference`` (batch 1's outputs,
    tokens/s and decoding logits): per sample whether the token ids are identical and the first differing step, and
    the largest |logit| difference over the steps fed the same tokens at both batch sizes (up to the step that chose
    the first differing token), with batch 1's largest |logit| as its scale."""
    decode_tokens = sum(max(0, len(o.token_ids) - 1) for o in outputs)
    decode_s = sum(o.decode_s for o in outputs)
    tok_s = decode_tokens / decode_s if decode_s > 0 else math.nan
    ref_outputs, ref_tok_s, ref_logits = reference if reference is not None else (outputs, tok_s, logits)
    firsts = [first_difference(o.token_ids, r.token_ids) for o, r in zip(outputs, ref_outputs, strict=True)]
    same_text = [o.text == r.text for o, r in zip(outputs, ref_outputs, strict=True)]
    diff, scale = "", ""
    if logits is not None and ref_logits is not None:
        diffs, scales = [0.0], [0.0]
        for first, got, want in zip(firsts, logits, ref_logits, strict=True):
            if got is None or want is None:
                continue
            same_input = len(got) if first is None else min(first, len(got), len(want))  # call j is fed token j
            diffs.append(float((got[:same_input].float() - want[:same_input].float()).abs().max())
                         if same_input else 0.0)  # fmt: skip
            scales.append(float(want.float().abs().max()))
        diff, scale = max(diffs), max(scales)
    return {
        "max_abs_logit_diff": diff,
        "logit_scale": scale,
        "identical": [first is None for first in firsts],
        "first_diff_step": firsts,
        "identical_tokens_fraction": sum(first is None for first in firsts) / len(firsts),
        "identical_text_fraction": sum(same_text) / len(same_text),
        "decode_tokens": decode_tokens,
        "decode_s": round(decode_s, 4),
        "decode_tok_s": round(tok_s, 2),
        "speedup_vs_1": round(tok_s / ref_tok_s, 3) if ref_tok_s > 0 else math.nan,
        "prefill_s_mean": round(sum(o.prefill_s for o in outputs) / len(outputs), 4),
    }
