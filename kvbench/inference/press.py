"""Apply an eviction method to a user's own ``model.generate`` calls: the machinery behind :func:`kvbench.press`.

``with Press(model, method, budget): model.generate(**inputs)`` works like kvpress's presses, through public hooks
only (nothing in transformers is patched):

* on entry the model's attention implementation is switched to kvbench's registered function
  (``model.set_attn_implementation("kvbench")``, :mod:`kvbench.attention.function`), and a forward pre-hook and a
  forward hook (both with keyword arguments) are registered on the model; on exit both hooks are removed and the
  previous attention implementation is set again, so the model is as it was;
* each forward call that does not continue the press's current cache starts a new *prompt* (``generate`` begins
  with an empty cache of its own): the pre-hook builds a :class:`~kvbench.cache.kv_cache.KVBenchCache` and an
  :class:`~kvbench.inference.eviction.EvictionSession`, feeds the prompt through
  :func:`kvbench.inference.prefill.prefill` (the compressed part in one forward or in chunks, then, question-agnostic,
  the question on top of the compressed cache) and hands the model the last segment with the cache as
  ``past_key_values`` and the session as ``kvbench_session``; the forward hook then switches the session to decoding.
  Later forwards of the same ``generate`` call (decoding steps) continue that cache.

Question modes: ``aware`` compresses the whole prompt.  ``agnostic`` compresses only the context and feeds the
question after it; the press must be told where the context ends, by ``context_length`` (the prompt's first
``context_length`` tokens are the context) or ``question_length`` (its last ``question_length`` tokens are the
question, e.g. the question plus the chat template's closing tokens).

Direct forwards work the same way (``model(input_ids=...)`` inside the block starts a prompt); the logits they
return are those of the segment the model's own forward ran: the whole prompt in question-aware mode unless it is
fed in chunks (``prefill_chunk=0`` feeds it in one forward), the question in agnostic mode.

Batch size 1 only (kvbench's cache holds one sequence): ``num_beams``, ``num_return_sequences`` and batched prompts
are refused with a clear error, as are ``inputs_embeds``, ``use_cache=False`` and a non-empty ``past_key_values``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from kvbench.attention.function import ATTENTION_NAME
from kvbench.budget import Budget
from kvbench.cache.kv_cache import KVBenchCache
from kvbench.config import QUESTION_MODES
from kvbench.errors import KVBenchError
from kvbench.eviction.base import EvictionMethod
from kvbench.inference.eviction import CacheRecord, EvictionSession
from kvbench.inference.prefill import prefill


@contextmanager
def kvbench_attention(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """``model`` in eval mode with kvbench's attention function for the block; its previous attention implementation
    and training flag are restored after."""
    previous, training = model.config._attn_implementation, model.training
    model.set_attn_implementation(ATTENTION_NAME)
    model.eval()
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
        model.train(training)


class PressUsageError(KVBenchError, ValueError):
    """A ``kvbench.press`` call kvbench cannot serve (a bad argument, or a ``generate`` call it does not support)."""


#: The models a press is active on (one at a time per model: a nested press is refused when entered).
_PRESSED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def batch_message(input_ids: torch.Tensor) -> str:
    """Why ``input_ids`` of more than one row is refused: several prompts, or -- rows that are copies of one prompt
    -- the expansion ``model.generate`` makes for ``num_beams`` / ``num_return_sequences`` > 1."""
    shape = tuple(input_ids.shape)
    rows = shape[0] if input_ids.dim() == 2 else None
    if rows is not None and rows > 1 and bool((input_ids == input_ids[:1]).all()):
        why = (
            f"{rows} copies of one prompt, which is how model.generate runs num_beams={rows} (beam search) or "
            f"num_return_sequences={rows}: kvbench's cache holds one sequence, so use num_beams=1 and "
            "num_return_sequences=1 (greedy or sampled decoding)"
        )
    else:
        why = "pass one prompt per generate call (no padding batch); num_beams and num_return_sequences must be 1"
    return f"kvbench.press runs one sequence at a time (batch size 1), got input_ids of shape {shape}: {why}."


@dataclass
class PressRecord:
    """What a press did: one :class:`~kvbench.inference.eviction.CacheRecord` per prompt run inside the block.

    The properties read the last prompt's record (``requested_per_layer``: tokens per stored head each layer was
    asked to keep; ``achieved_per_layer``: what it kept after the prefill; ``*_per_head``: ``[L][H]``).
    """

    method: str
    budget: str
    question_mode: str
    prompts: list[CacheRecord] = field(default_factory=list)

    @property
    def last(self) -> CacheRecord:
        """The record of the latest prompt (raises ``LookupError`` when no prompt has run yet)."""
        if not self.prompts:
            raise LookupError("no prompt has run inside this press yet")
        return self.prompts[-1]

    @property
    def requested_per_layer(self) -> list[int]:
        return self.last.requested_per_layer

    @property
    def achieved_per_layer(self) -> list[int]:
        return self.last.achieved_per_layer

    @property
    def requested_per_head(self) -> list[list[int]]:
        return self.last.requested_per_head

    @property
    def achieved_per_head(self) -> list[list[int]]:
        return self.last.achieved_per_head

    @property
    def kept_fraction(self) -> float:
        """Mean over layers of the tokens kept per head divided by the compressed prompt's length."""
        record = self.last
        if not record.achieved_per_layer or record.context_tokens == 0:
            return 1.0
        return sum(record.achieved_per_layer) / len(record.achieved_per_layer) / record.context_tokens


class Press:
    """Context manager applying ``method`` at ``budget`` to the forwards of ``model`` (see module docstring).

    Parameters
    ----------
    model:
        A decoder-only transformers model whose attention layers take ``attn_implementation`` (Llama, Mistral,
        Qwen2, Gemma, ...), on one device or spread by a device map.
    method, budget:
        A built method (:func:`kvbench.eviction.base.build_method`) and a parsed budget
        (:func:`kvbench.budget.parse_budget`); :func:`kvbench.press` builds them from names.
    question_mode:
        ``aware`` (default) or ``agnostic``.
    context_length, question_length:
        Agnostic mode only, exactly one of them: where the context ends (module docstring).
    prefill_chunk:
        Tokens per forward of the compressed prefill (``run.prefill_chunk``: ``None`` automatic, 0 one forward).
    method_name, budget_name:
        Labels kept in the record.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        method: EvictionMethod,
        budget: Budget,
        question_mode: str = "aware",
        context_length: int | None = None,
        question_length: int | None = None,
        prefill_chunk: int | None = None,
        method_name: str = "",
        budget_name: str = "",
    ) -> None:
        if question_mode not in QUESTION_MODES:
            raise PressUsageError(f"question_mode={question_mode!r}; valid: {', '.join(QUESTION_MODES)}")
        given = {"context_length": context_length, "question_length": question_length}
        given = {key: value for key, value in given.items() if value is not None}
        if question_mode == "aware" and given:
            raise PressUsageError(
                f"{', '.join(given)} only applies to question_mode='agnostic' (question-aware compresses the whole "
                "prompt)"
            )
        if question_mode == "agnostic" and len(given) != 1:
            raise PressUsageError(
                "question_mode='agnostic' needs where the context ends: pass exactly one of context_length= (the "
                "prompt's first N tokens are the context) or question_length= (its last N tokens are the question)"
            )
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PressUsageError(f"{key}={value!r}; valid: a positive number of tokens")
        self.model = model
        self.method = method
        self.budget = budget
        self.question_mode = question_mode
        self.context_length = context_length
        self.question_length = question_length
        self.prefill_chunk = prefill_chunk
        self.record = PressRecord(method_name or type(method).__name__, budget_name or budget.spec, question_mode)
        self._handles: list[Any] = []
        self._attention: Any = None
        self._cache: KVBenchCache | None = None
        self._session: EvictionSession | None = None
        self._nested = False
        self._dataset_state: Any = None

    # ------------------------------------------------------------------ entering and leaving
    def __enter__(self) -> PressRecord:
        if self._handles:
            raise RuntimeError("this press is already active; a press cannot be nested in itself")
        if self.model in _PRESSED:
            raise PressUsageError(
                "a kvbench.press is already active on this model: presses cannot be nested. Leave the first "
                "`with kvbench.press(...)` block before entering another (one method and budget per model at a time)"
            )
        self._attention = kvbench_attention(self.model)
        self._attention.__enter__()
        _PRESSED.add(self.model)
        # The prompts run in this press share what spans them (XKV's sampled mode: one calibration per press).
        self._dataset_state = self.method.layer_allocator.new_dataset_state("press", 1)
        try:
            self._handles = [
                self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                self.model.register_forward_hook(self._after_forward, with_kwargs=True),
            ]
        except BaseException:
            self._restore()
            raise
        return self.record

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        _PRESSED.discard(self.model)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._attention is not None:
            self._attention.__exit__(None, None, None)
            self._attention = None
        if self._session is not None:
            self._session.release_hooks()  # a prompt whose held forward failed keeps none on the model
            for handle in self._session.decode_hooks:
                handle.remove()
        self._cache = self._session = None

    # ------------------------------------------------------------------ hooks
    def _before_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Start a prompt (new cache) or continue the current one; always pass the session."""
        if self._nested:
            return None
        if args:
            raise PressUsageError("inside kvbench.press call the model with keyword arguments (input_ids=...)")
        if kwargs.get("use_cache") is False:
            raise PressUsageError("kvbench.press compresses the KV cache: use_cache=False leaves nothing to compress")
        past = kwargs.get("past_key_values")
        if past is None or past is not self._cache:
            kwargs = self._start_prompt(kwargs)
        kwargs["past_key_values"] = self._cache
        kwargs["kvbench_session"] = self._session
        return args, kwargs

    def _after_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The prompt's last segment ran: later forwards are decoding steps; refresh the record."""
        if self._nested or self._session is None:
            return
        if self._session.phase in ("compress", "append"):
            self._session.begin_decode()
        self._session.finish()

    # ------------------------------------------------------------------ a new prompt
    def _start_prompt(self, kwargs: dict) -> dict:
        """Build the prompt's cache and session, run all of its segments but the last, and return the keyword
        arguments of the model's own forward for that last segment."""
        input_ids = kwargs.get("input_ids")
        if input_ids is None:
            raise PressUsageError("kvbench.press needs input_ids (inputs_embeds are not supported)")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise PressUsageError(batch_message(input_ids))
        past = kwargs.get("past_key_values")
        if past is not None and past.get_seq_length() > 0:
            raise PressUsageError(
                f"kvbench.press starts every prompt from an empty cache, got past_key_values holding "
                f"{past.get_seq_length()} tokens; do not pass past_key_values inside a press"
            )
        prompt = input_ids[0].tolist()
        context, question = self._split(prompt)
        self._nested = True  # the segments fed here run outside the hooks
        try:
            state = prefill(
                self.model,
                context,
                question,
                method=self.method,
                budget=self.budget,
                question_mode=self.question_mode,
                prefill_chunk=self.prefill_chunk,
                hold_last=True,
                dataset_state=self._dataset_state,
            )
        finally:
            self._nested = False
        self._cache, self._session = state.cache, state.session
        self.record.prompts.append(state.session.record)
        last = state.held
        assert last is not None
        kwargs = dict(kwargs)
        positions = torch.arange(last.start, len(prompt), dtype=torch.long, device=input_ids.device)
        kwargs["input_ids"] = torch.tensor([last.ids], dtype=torch.long, device=input_ids.device)
        kwargs["position_ids"] = positions[None]
        if kwargs.get("cache_position") is not None:
            kwargs["cache_position"] = positions
        return kwargs

    def _split(self, prompt: list[int]) -> tuple[list[int], list[int]]:
        """(context, question) token ids of a prompt (``aware``: the whole prompt is the context)."""
        if self.question_mode == "aware":
            return prompt, []
        context = self.context_length if self.context_length is not None else len(prompt) - int(self.question_length)
        if not 0 < context < len(prompt):
            given = (
                f"context_length={self.context_length}"
                if self.context_length is not None
                else f"question_length={self.question_length}"
            )
            raise PressUsageError(
                f"{given} does not split this {len(prompt)}-token prompt into a context and a question: the "
                f"context must hold 1 to {len(prompt) - 1} tokens"
            )
        return prompt[:context], prompt[context:]
