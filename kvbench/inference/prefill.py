"""The compressed prefill of one prompt, written once: split by question mode -> build the cache and the eviction
session -> resolve the prefill chunk -> ``begin_prefill`` -> the chunk loop -> append the question.

Every caller that prefills with eviction goes through :func:`prefill` and every model forward of kvbench goes through
:func:`forward_logits`: the runner (:func:`kvbench.inference.generate.generate`), ``kvbench.press``
(:mod:`kvbench.inference.press`, which keeps the prompt's last segment for the model's own forward: ``hold_last``), the
lm-eval bridge (:func:`kvbench.lmeval.loglikelihood.compress_context`) and the bench
(:func:`kvbench.bench.timed_cells.run_cell`, which brings its own cache backend).  What happens after the prefill
(``begin_decode``, greedy decoding, scoring continuations) stays with the caller; a batched decoder builds on the
returned :class:`PrefillState`.

Explicit ``position_ids`` everywhere: after eviction the cache holds fewer tokens than were seen, so positions come
from the count of tokens fed, never from the cache length.

Scorers of pre-RoPE states (Expected Attention, leverage, Compactor) get the layers' input hidden states through
forward pre-hooks registered for the compressing prefill only (:mod:`kvbench.inference.hidden_states`).

The compressed prompt is fed in one forward or in chunks (``prefill_chunk``, ``run.prefill_chunk``): each chunk
attends to everything stored before it (kvbench's bottom-right causal attention), the eviction session keeps what
the method reads from the prompt rows, and each layer is compressed once its last chunk is stored -- the method
sees what a one-shot prefill gives it, while the activations (MLP, attention) are bounded by the chunk.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.cache.quantized import QuantizedKVBenchCache, hold_quantization, kv_quant_model_problem
from kvbench.cache.sliding import layer_windows
from kvbench.checks import check_choice
from kvbench.config import QUESTION_MODES, KVQuantConfig, check_kv_quant, kv_quant_refusal
from kvbench.errors import KVBenchError
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import EvictionSession
from kvbench.inference.hidden_states import capture_decode_queries, capture_hidden_states
from kvbench.inference.replay import replay_context
from kvbench.models.loading import input_device

#: ``prefill_chunk=None`` (automatic): on CPU, prompts longer than this are fed in chunks of at most this many
#: tokens; on CUDA the prompt goes in one forward.
CPU_PREFILL_CHUNK = 4096
#: ... and at most this many (query x key) pairs per chunk: CPU attention over a chunk holds a buffer of about 10
#: bytes per pair (its causal mask), so long prompts get smaller chunks (128K tokens: 1024).
CPU_CHUNK_PAIRS = 1 << 27


def resolve_prefill_chunk(prefill_chunk: int | None, device: torch.device, prompt_tokens: int) -> int:
    """Tokens per prefill forward (0 = one forward) for ``run.prefill_chunk`` (``None`` = automatic: see
    :data:`CPU_PREFILL_CHUNK` and :data:`CPU_CHUNK_PAIRS`)."""
    if prefill_chunk is None:
        if device.type != "cpu" or prompt_tokens <= CPU_PREFILL_CHUNK:
            return 0
        return max(256, min(CPU_PREFILL_CHUNK, CPU_CHUNK_PAIRS // prompt_tokens))
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 0:
        raise ValueError(
            f"run.prefill_chunk={prefill_chunk!r}; valid: a positive number of tokens per chunk, 0 (one forward) "
            "or null (automatic: chunks on CPU for long prompts)"
        )
    return prefill_chunk if 0 < prefill_chunk < prompt_tokens else 0


def build_cache(model: PreTrainedModel, method: EvictionMethod, kv_quant: Any = None) -> KVBenchCache:
    """An empty cache with the method's GQA granularity; the model's sliding-window layers (as transformers reads
    its config, :func:`kvbench.cache.sliding.layer_windows`) are held in sliding layers, or kept evictable when the
    method says ``compress_sliding`` (:class:`~kvbench.eviction.base.EvictionMethod`, off by default).  ``kv_quant``
    (a ``kv_quant`` config node or :class:`~kvbench.config.KVQuantConfig`; ``None`` or scheme ``none``: unquantized)
    makes the evictable layers store quantized KV (:mod:`kvbench.cache.quantized`).  A scorer that back-propagates
    through the cache (``needs_gradient``: KVgrad) gets the torch storage on every device."""
    spec = quantized_storage(kv_quant, method)
    config = model.config.get_text_config(decoder=True)
    expand = 1
    if method.gqa_granularity == "query_head":
        heads = int(config.num_attention_heads)
        expand = heads // int(getattr(config, "num_key_value_heads", None) or heads)
    windows = layer_windows(config)
    if spec is not None:
        return QuantizedKVBenchCache(
            len(windows), spec, expand_factor=expand, sliding_windows=windows, compress_sliding=method.compress_sliding
        )
    # A backward pass through the cache (KVgrad) needs the torch storage: the paged one's CUDA kernels have none.
    backend = "torch" if getattr(method.scorer, "needs_gradient", False) else None
    return KVBenchCache(
        len(windows), expand_factor=expand, sliding_windows=windows, compress_sliding=method.compress_sliding,
        backend=backend,
    )  # fmt: skip


def quantized_storage(kv_quant: Any, method: EvictionMethod) -> KVQuantConfig | None:
    """The checked ``kv_quant`` setting, ``None`` when the storage is not quantized; a method that prunes key
    channels (ThinK) or re-rotates kept keys (Finch) is refused (quantized layers do not support either)."""
    if kv_quant is None:
        return None
    spec = check_kv_quant(kv_quant)
    if spec.scheme == "none":
        return None
    refusal = kv_quant_refusal(spec, method)
    if refusal is not None:
        raise ValueError(refusal)
    return spec


def check_kv_quant_model(cfg: Any, model: PreTrainedModel) -> None:
    """Raise :class:`~kvbench.errors.KVBenchError` when the run's ``kv_quant`` cannot quantize ``model``'s cache
    (:func:`~kvbench.cache.quantized.kv_quant_model_problem`); nothing when the storage is not quantized."""
    node = cfg.get("kv_quant") if hasattr(cfg, "get") else None
    spec = None if node is None else check_kv_quant(node)
    if spec is None or spec.scheme == "none":
        return
    config = model.config.get_text_config(decoder=True)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    problem = kv_quant_model_problem(spec, head_dim, heads)
    if problem is not None:
        raise KVBenchError(f"model={cfg.model.name}: {problem}.")


def forward_logits(
    model: PreTrainedModel,
    ids: Sequence[int] | torch.Tensor,
    start: int,
    cache: KVBenchCache,
    session: EvictionSession | None,
    device: torch.device,
    keep: int = 1,
) -> torch.Tensor:
    """Feed ``ids`` (``n`` token ids, a ``[1, n]`` tensor, or ``[1, n, hidden]`` input embeddings: RestoreKV's
    restore tokens, KVgrad's differentiable replay) at positions ``start..start+n-1`` on top of ``cache``
    (``session`` ``None``: no eviction hook); returns the logits of the last ``keep`` positions ``[keep, vocab]``.
    kvbench's one model-forward wrapper."""
    if isinstance(ids, torch.Tensor) and ids.is_floating_point():
        inputs = {"inputs_embeds": ids}
    else:
        input_ids = ids if isinstance(ids, torch.Tensor) else torch.tensor([list(ids)], dtype=torch.long, device=device)
        inputs = {"input_ids": input_ids if input_ids.dim() > 1 else input_ids[None]}
    fed = next(iter(inputs.values()))
    length = int(fed.shape[1])
    position_ids = torch.arange(start, start + length, dtype=torch.long, device=fed.device)[None]
    output = model(
        **inputs,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep,
        kvbench_session=session,
        kvbench_cache=cache,  # the attention reads sliding windows from it, also without a session
    )
    return output.logits[0, -keep:]


def split_question(
    context_ids: Sequence[int], question_ids: Sequence[int], question_mode: str
) -> tuple[list[int], list[int]]:
    """``(compressed, appended)`` token ids: ``aware`` (or no question) compresses context + question;
    ``agnostic`` compresses the context and appends the question on top of the compressed cache."""
    check_choice("task.question_mode", question_mode, QUESTION_MODES)
    if question_mode == "aware" or not question_ids:
        return list(context_ids) + list(question_ids), []
    return list(context_ids), list(question_ids)


def aware_question_tokens(context_ids: Sequence[int], question_ids: Sequence[int], question_mode: str) -> bool:
    """Whether the compressed prompt ends with the question (question-aware mode with a question)."""
    return question_mode == "aware" and len(question_ids) > 0 and len(context_ids) > 0


@dataclass
class PromptSegment:
    """One forward of the prompt: ``ids`` fed at positions ``start..``; ``appended``: the question, fed on top of
    the compressed cache (session phase ``append``) instead of a chunk of the compressed prompt."""

    start: int
    ids: list[int]
    appended: bool = False


@dataclass
class PrefillState:
    """A prompt after :func:`prefill`.

    Attributes
    ----------
    cache, session:
        The prompt's cache and eviction session (phase ``compress`` or ``append``; the caller begins decoding).
    position:
        Tokens fed so far (the position of the next token), the held segment excluded.
    logits:
        ``[vocab]`` logits of the last fed position (``None`` when nothing was fed: one held segment).
    held:
        With ``hold_last``: the prompt's last segment, not fed (its session phase already entered), else ``None``.
    started:
        ``time.perf_counter()`` just before ``begin_prefill`` (the caller's prefill timer).
    """

    cache: KVBenchCache
    session: EvictionSession
    compressed: list[int]
    appended: list[int]
    position: int
    logits: torch.Tensor | None
    held: PromptSegment | None
    started: float


def prompt_segments(compressed: list[int], appended: list[int], chunk: int) -> list[PromptSegment]:
    """The forwards of a prompt: the compressed prompt in chunks of ``chunk`` tokens, then the appended question."""
    segments = [PromptSegment(first, compressed[first : first + chunk]) for first in range(0, len(compressed), chunk)]
    if appended:
        segments.append(PromptSegment(len(compressed), list(appended), appended=True))
    return segments


def rotary_tables(
    model: PreTrainedModel,
) -> Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None:
    """The model's rotary embedding module as ``(positions [N], dtype) -> (cos, sin) [N, D]`` (what
    :attr:`kvbench.eviction.base.WindowObservation.rotary` holds), or ``None`` when the decoder has no single
    ``rotary_emb`` (no RoPE).

    A rotary module with one table per layer type (Gemma-3: ``forward(x, position_ids, layer_type)``) gives the
    full-attention layers' tables, the layers eviction acts on.  Half-width tables (gpt-oss rotates the two halves
    of a head with ``cos``, ``sin`` of ``D / 2``) are widened to Llama's ``[c, c]`` form, the same rotation."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    rotary = getattr(decoder, "rotary_emb", None)
    if not isinstance(rotary, torch.nn.Module):
        return None
    per_layer_type = "layer_type" in inspect.signature(rotary.forward).parameters
    layer_type = {"layer_type": "full_attention"} if per_layer_type else {}
    # One frequency per rotated pair: Llama-style tables repeat them ([f, f]); half-width ones (gpt-oss) do not.
    inv_freq = getattr(rotary, "full_attention_inv_freq" if per_layer_type else "inv_freq", None)
    pairs = inv_freq.shape[-1] if isinstance(inv_freq, torch.Tensor) else None

    def tables(positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(iter(rotary.buffers()), positions).device
        cos, sin = rotary(torch.empty(0, dtype=dtype, device=device), positions.to(device)[None], **layer_type)
        cos, sin = cos[0], sin[0]
        if cos.shape[-1] == pairs:
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        return cos, sin

    return tables


def prefill(
    model: PreTrainedModel,
    context_ids: Sequence[int],
    question_ids: Sequence[int] = (),
    *,
    method: EvictionMethod,
    budget: Budget,
    question_mode: str = "aware",
    prefill_chunk: int | None = None,
    cache: KVBenchCache | None = None,
    scoring_impl: str = "auto",
    hold_last: bool = False,
    dataset_state: Any = None,
    tokenizer: Any = None,
    kv_quant: Any = None,
) -> PrefillState:
    """Prefill one prompt with ``method`` applied at ``budget``: the single prefill sequence of kvbench.

    ``question_mode`` splits ``context_ids`` + ``question_ids`` (:func:`split_question`); ``prefill_chunk``: tokens
    per forward of the compressed prompt (:func:`resolve_prefill_chunk`); ``cache``: an empty cache to fill (default
    :func:`build_cache`, e.g. the bench's paged backend); ``scoring_impl``: the session's attention-statistics kernels.
    ``hold_last``: the last segment is not fed but returned in :attr:`PrefillState.held` (its phase entered), for a
    caller that runs it through the model's own forward (``kvbench.press``).  ``dataset_state``: what the method's
    layer allocator keeps across a dataset's samples (:class:`~kvbench.inference.eviction.EvictionSession`).
    ``tokenizer``: for a method that scores the prompt by forwards of its own (KVzip's repeat prompt,
    :mod:`kvbench.inference.replay`), run after the compressed prompt is stored and before the question is appended.
    A method that re-rotates the kept keys (Finch) moves the tokens after the compressed prompt to the positions
    right after the kept ones (:attr:`~kvbench.inference.eviction.EvictionSession.position_shift`).  ``kv_quant``:
    quantized KV storage for the default cache (:func:`build_cache`).
    """
    compressed, appended = split_question(list(context_ids), list(question_ids), question_mode)
    cache, session, chunk = open_session(
        model, context_ids, question_ids, question_mode, method, budget, prefill_chunk, cache, scoring_impl,
        dataset_state, kv_quant,
    )  # fmt: skip
    device = input_device(model)  # with a device map each cache layer is created on its own layer's device
    segments = prompt_segments(compressed, appended, chunk)
    held = segments.pop() if hold_last else None
    if held is not None and (session.replays or getattr(method.scorer, "rerotates_keys", False)):
        raise ValueError(
            f"method {method.family!r} runs forwards of its own or moves positions after the prefill: it does not "
            "run with a held last segment (kvbench.press); use kvbench's runner"
        )

    started = time.perf_counter()
    session.begin_prefill(len(compressed), prompt_ids=compressed)
    capture_hidden_states(model, session)  # for scorers of pre-RoPE states; removed when the prefill ends
    capture_decode_queries(model, session)  # for kvpress's decoding presses; removed by session.finish()
    position, logits = 0, None
    last_chunk = max((i for i, s in enumerate(segments) if not s.appended), default=-1)
    try:
        for index, segment in enumerate(segments):
            hold_quantization(cache, index < last_chunk)  # kv_quant: one quantization after the whole prompt
            if segment.appended:
                position, logits = feed_question(model, session, compressed, segment.ids, tokenizer)
                continue
            start = segment.start - session.position_shift
            logits = forward_logits(model, segment.ids, start, cache, session, device)[-1]
            position = start + len(segment.ids)
    except BaseException:
        session.release_hooks()
        for handle in session.decode_hooks:
            handle.remove()
        raise
    if held is None or held.appended:  # a held compressed segment still needs them (kvbench.press)
        session.release_hooks()
    replay_context(model, session, compressed, tokenizer, device, forward_logits)
    position -= 0 if appended else session.position_shift
    if held is not None and held.appended:
        session.begin_append()
    return PrefillState(cache, session, compressed, appended, position, logits, held, started)


def open_session(
    model: PreTrainedModel,
    context_ids: Sequence[int],
    question_ids: Sequence[int],
    question_mode: str,
    method: EvictionMethod,
    budget: Budget,
    prefill_chunk: int | None,
    cache: KVBenchCache | None = None,
    scoring_impl: str = "auto",
    dataset_state: Any = None,
    kv_quant: Any = None,
) -> tuple[KVBenchCache, EvictionSession, int]:
    """A prompt's cache (``cache``, default :func:`build_cache` with ``kv_quant``), its eviction session (its prefill
    chunk and question tokens recorded) and the tokens per forward of its compressed prompt
    (:func:`resolve_prefill_chunk`)."""
    compressed, _ = split_question(list(context_ids), list(question_ids), question_mode)
    if not compressed:
        raise ValueError("empty prompt")
    device = input_device(model)
    if cache is None:
        cache = build_cache(model, method, kv_quant)
    session = EvictionSession(
        method, budget, cache, scoring_impl=scoring_impl, rotary=rotary_tables(model), dataset_state=dataset_state
    )
    chunk = resolve_prefill_chunk(prefill_chunk, device, len(compressed)) or len(compressed)
    session.record.prefill_chunk = chunk if chunk < len(compressed) else 0
    if aware_question_tokens(context_ids, question_ids, question_mode):
        session.question_tokens = len(question_ids)
    return cache, session, chunk


def feed_question(
    model: PreTrainedModel, session: EvictionSession, compressed: list[int], question: list[int], tokenizer: Any
) -> tuple[int, torch.Tensor]:
    """Append the question (question-agnostic mode) on top of the compressed prompt: a replaying scorer's forwards
    first (:mod:`kvbench.inference.replay`), then the question at the positions after the kept prompt; returns the
    position after it and its last ``[vocab]`` logits."""
    device = input_device(model)
    replay_context(model, session, compressed, tokenizer, device, forward_logits)
    session.begin_append()
    start = len(compressed) - session.position_shift
    logits = forward_logits(model, question, start, session.cache, session, device)[-1]
    return start + len(question), logits
