"""kvbench as an lm-evaluation-harness model: ``lm_eval --model kvbench`` (needs ``pip install 'kvbench[lmeval]'``).

Importing this module registers :class:`KVBenchLM` under the name ``kvbench`` in lm-eval's model registry; it
imports lm-eval at module level, so import it through :mod:`kvbench.lmeval` (which does so only when lm-eval is
installed).

Semantics follow lm-eval's own ``hf`` model (``lm_eval/models/huggingface.py``, 0.4.13), with a kvbench eviction
method applied:

* tokenisation: :class:`lm_eval.api.model.TemplateLM` splits each request into context and continuation tokens
  (trailing context spaces moved to the continuation, ``context + continuation`` encoded whole and split at the
  context's length, an empty context replaced by the prefix token); :meth:`KVBenchLM.tok_encode` adds special
  tokens as ``hf`` does (``add_bos_token``; none when the text already starts with the BOS string);
* ``loglikelihood``: requests are grouped by context tokens; each distinct context is prefilled and compressed
  once (:func:`kvbench.lmeval.loglikelihood.compress_context`) and every continuation of the group is scored on a copy
  of that compressed cache (:func:`~kvbench.lmeval.loglikelihood.score_continuation`); longer inputs than
  ``max_length + 1`` lose tokens from the left as in ``hf``;
* ``generate_until``: kvbench's greedy loop (:func:`kvbench.inference.generate.generate`) with the method applied;
  lm-eval's ``until`` strings (plus the EOS) and ``max_gen_toks`` (default 256, as ``hf``) are honoured, the context is
  left-truncated to ``max_length - max_gen_toks``, and the text is cut at the first stop string;
* ``loglikelihood_rolling`` is refused (see :meth:`KVBenchLM.loglikelihood_rolling`).

Every compressed context leaves a record in :attr:`KVBenchLM.records` (context tokens, the eviction record with
requested and achieved sizes, the compressed cache's fingerprint before and after its continuations were scored).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    DEFAULT_MAX_LENGTH,
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
    resolve_max_length,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kvbench.budget import Budget, parse_budget
from kvbench.checks import check_choice, check_decode_batch
from kvbench.config import QUESTION_MODES
from kvbench.errors import KVBenchError
from kvbench.eviction.base import EvictionMethod, build_method
from kvbench.inference.batched_decode import DecodeRequest, ReorderBuffer, generate_batched, resolve_decode_batch
from kvbench.inference.generate import GenerationOutput, generate
from kvbench.lmeval.args import check_model_args, set_method_key
from kvbench.lmeval.loglikelihood import cache_fingerprint, compress_context, score_continuation
from kvbench.lmeval.presets import budget_config, method_config, model_config
from kvbench.models.loading import input_device, load_model, stop_token_ids

LOG = logging.getLogger(__name__)
#: ``max_gen_toks`` when a task does not set it (lm-eval's ``hf`` default).
DEFAULT_MAX_GEN_TOKS = 256

Request = tuple[tuple[str, str], list[int], list[int]]


@register_model("kvbench")
class KVBenchLM(TemplateLM):
    """An lm-eval model that runs a kvbench eviction method (see the module docstring).

    Parameters (``--model_args key=value,...``)
    -------------------------------------------
    pretrained:
        A kvbench model preset (``conf/model/<name>.yaml``: ``tiny``, ``qwen2-1.5b``, ...) or a ``model.path``
        (local Hugging Face folder, hub id, ``builtin:<name>``).
    method:
        A kvbench method preset (``full``, ``snapkv``, ``h2o``, ``ahakv``, ...); ``method.<knob>=value`` and
        ``method.params.<key>=value`` arguments override its keys.
    budget:
        A budget preset or string: ``full``, ``0.2x`` (keep 20 % of the compressed prompt), ``128L``, ``64/layer``.
    question_mode:
        ``agnostic`` (default: the context without its last token is compressed) or ``aware`` (the whole context);
        :mod:`kvbench.lmeval.loglikelihood` explains both.
    dtype, device, revision:
        Override the model preset's (a path alone: float32, device auto).
    max_length:
        Input window in tokens (default: lm-eval's rule for ``hf``: the model config, the tokenizer, else 2048).
    max_gen_toks:
        Generation limit when a task sets none (256).
    add_bos_token, prefix_token_id:
        As lm-eval's ``hf`` model.
    prefill_chunk:
        Tokens per forward of the compressed prefill (``run.prefill_chunk``; default automatic).
    decode_batch:
        ``generate_until`` requests decoded together (``run.decode_batch``: 1 = one at a time, an integer, or
        ``auto``); each context is still prefilled and compressed alone.
    seed:
        Seed for builtin random-weight models.
    batch_size, max_batch_size:
        Accepted for lm-eval's CLI and ignored: kvbench runs one sequence at a time.
    """

    def __init__(
        self,
        pretrained: str = "tiny",
        method: str = "full",
        budget: str = "full",
        question_mode: str = "agnostic",
        dtype: str | None = None,
        device: str | None = None,
        revision: str | None = None,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        prefill_chunk: int | None = None,
        decode_batch: int | str = 1,
        seed: int = 0,
        batch_size: Any = None,
        max_batch_size: Any = None,
        **method_overrides: Any,
    ) -> None:
        given = {"pretrained": pretrained, "method": method, "budget": budget, "question_mode": question_mode}
        options = {"dtype": dtype, "max_length": max_length, "max_gen_toks": max_gen_toks}
        options |= {"prefill_chunk": prefill_chunk, "decode_batch": decode_batch, "seed": seed}
        check_model_args({**given, **{k: v for k, v in options.items() if v is not None}, **method_overrides})
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's CLI passes --device (default cuda:0); like its hf model, fall back when there is no GPU.
            LOG.warning("device=%s requested but CUDA is not available: running on the CPU", device)
            device = "cpu"
        model_cfg = model_config(str(pretrained), dtype=dtype, device=device, revision=revision)
        method_cfg = method_config(str(method))
        for key, value in method_overrides.items():
            set_method_key(method_cfg, key.removeprefix("method."), value)
        try:
            built = build_method(method_cfg)
        except ValueError as err:
            raise KVBenchError(f"method={method}: {err}") from err
        loaded = load_model(model_cfg, seed=int(seed))
        self._init(
            loaded.model,
            loaded.tokenizer,
            built,
            parse_budget(str(budget_config(str(budget)).spec)),
            question_mode=question_mode,
            max_length=max_length,
            max_gen_toks=max_gen_toks,
            add_bos_token=add_bos_token,
            prefix_token_id=prefix_token_id,
            prefill_chunk=prefill_chunk,
            decode_batch=decode_batch,
        )
        self.model_name = str(model_cfg.name)

    @classmethod
    def from_loaded(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        method: EvictionMethod,
        budget: Budget,
        **options: Any,
    ) -> KVBenchLM:
        """The bridge around a model already loaded with kvbench attention (``kvbench.models.loading.load_model``), a
        built method and a parsed budget; ``options`` are the keyword options of the constructor after
        ``question_mode``."""
        lm = cls.__new__(cls)
        lm._init(model, tokenizer, method, budget, **options)
        lm.model_name = str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        return lm

    def _init(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        method: EvictionMethod,
        budget: Budget,
        question_mode: str = "agnostic",
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        prefill_chunk: int | None = None,
        decode_batch: int | str = 1,
    ) -> None:
        super().__init__()
        check_choice("question_mode", question_mode, QUESTION_MODES, error=KVBenchError)
        self.model = model
        self.tokenizer = tokenizer
        self.method = method
        self.budget = budget
        self.question_mode = question_mode
        self._device = input_device(model)
        self._max_length = int(max_length) if max_length else None
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self.prefill_chunk = prefill_chunk
        #: ``run.decode_batch``: generations decoded together (1 = one at a time; ``auto``: from free GPU memory).
        self.decode_batch = check_decode_batch(decode_batch, "decode_batch", error=KVBenchError)
        #: The method's state across one task's compressed contexts (XKV's sampled mode:
        #: ``LayerBudgetAllocator.new_dataset_state``), set per task by kvbench's lm-eval runner; ``None``: each
        #: context stands alone.
        self.dataset_state: Any = None
        #: One entry per compressed context (loglikelihood groups and generations), in the order they ran.
        self.records: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lm-eval's TemplateLM contract
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return int(self.custom_prefix_token_id)
        if self.tokenizer.bos_token_id is not None:
            return int(self.tokenizer.bos_token_id)
        return self.eot_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return self._max_length
        return resolve_max_length(self.model.config, self.tokenizer, default=DEFAULT_MAX_LENGTH)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or "kvbench").replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string`` with special tokens added as lm-eval's ``hf`` model adds them."""
        if add_special_tokens is not None:
            options = {"add_special_tokens": add_special_tokens}
        elif self.add_bos_token is not None:
            options = {"add_special_tokens": self.add_bos_token}
        else:
            options = {}
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            options["add_special_tokens"] = False
        return list(self.tokenizer.encode(string, **options))

    def _loglikelihood_tokens(self, requests: Sequence[Request], disable_tqdm: bool = False, **kwargs: Any):
        """Score ``(strings, context ids, continuation ids)`` requests: one compressed prefill per distinct context
        (after ``hf``'s left truncation), each continuation on a copy of it."""
        groups: dict[tuple[int, ...], list[int]] = {}
        prepared: list[tuple[list[int], list[int]]] = []
        for index, (_, context_ids, continuation_ids) in enumerate(requests):
            context_ids, continuation_ids = self._fit(list(context_ids), list(continuation_ids))
            prepared.append((context_ids, continuation_ids))
            groups.setdefault(tuple(context_ids), []).append(index)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for context_key, indices in _progress(groups.items(), disable_tqdm, "kvbench loglikelihood (contexts)"):
            compressed = compress_context(
                self.model,
                list(context_key),
                method=self.method,
                budget=self.budget,
                question_mode=self.question_mode,
                prefill_chunk=self.prefill_chunk,
                dataset_state=self.dataset_state,
                tokenizer=self.tokenizer,
            )
            for index in indices:
                answer = score_continuation(self.model, compressed, prepared[index][1])
                results[index] = answer
                strings = requests[index][0]
                if strings is not None:
                    self.cache_hook.add_partial("loglikelihood", strings, answer)
            self.records.append(
                {
                    "kind": "loglikelihood",
                    "context_tokens": len(context_key),
                    "compressed_tokens": compressed.position,
                    "continuations": len(indices),
                    "fingerprint": compressed.fingerprint,
                    "fingerprint_after": cache_fingerprint(compressed.cache),
                    "prefill_s": compressed.prefill_s,
                    "cache": compressed.record.to_json(),
                }
            )
        return results

    def _fit(self, context_ids: list[int], continuation_ids: list[int]) -> tuple[list[int], list[int]]:
        """``hf``'s window: ``(context + continuation)[-(max_length + 1):]``, i.e. drop context tokens from the
        left; the continuation must fit."""
        if not context_ids or not continuation_ids:
            raise KVBenchError("lm-eval passed an empty context or continuation (token ids)")
        if len(continuation_ids) > self.max_length:
            raise KVBenchError(
                f"continuation of {len(continuation_ids)} tokens exceeds max_length={self.max_length}; "
                "pass --model_args max_length=<larger>"
            )
        room = self.max_length + 1 - len(continuation_ids)
        return context_ids[-room:], continuation_ids

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy generation with the method applied, for each ``(context, gen_kwargs)`` request; with
        ``decode_batch`` > 1 the requests are prefilled one at a time and decoded together
        (:func:`kvbench.inference.batched_decode.generate_batched`), answers in request order."""
        eos_text = self.tokenizer.decode(self.eot_token_id, skip_special_tokens=False)
        stops = stop_token_ids(self.tokenizer, self.model, [])
        prepared: list[tuple[DecodeRequest, tuple[str, ...]]] = []
        for request in requests:  # every request checked before any is generated
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise KVBenchError(
                    f"task asks for sampling (gen_kwargs {gen_kwargs}); kvbench decodes greedily: set do_sample=false "
                    "(lm_eval --gen_kwargs do_sample=false) or use another model backend"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            room = self.max_length - max_gen_toks
            if room <= 0:
                raise KVBenchError(f"max_gen_toks={max_gen_toks} leaves no room under max_length={self.max_length}")
            context_ids = self.tok_encode(context)[-room:]
            stop_strings = tuple(s for s in until if s and s != eos_text)
            prepared.append((DecodeRequest(context_ids, [], max_gen_toks, stops, stop_strings), tuple(until)))
        longest_answer = max((item.max_new_tokens for item, _ in prepared), default=1)
        batch = resolve_decode_batch(
            self.decode_batch, self.model, self.method, self.budget,
            lambda: [len(item.context_ids) for item, _ in prepared], longest_answer,
        )  # fmt: skip
        outputs: list[str] = []
        for index, output in self._generations([item for item, _ in prepared], batch, disable_tqdm):
            item, until = prepared[index]
            text = postprocess_generated_text(output.text, list(until), None)
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", requests[index].args, text)
            self.records.append(
                {
                    "kind": "generate_until",
                    "context_tokens": len(item.context_ids),
                    "compressed_tokens": len(item.context_ids),
                    "new_tokens": len(output.token_ids),
                    "stop_reason": output.stop_reason,
                    "prefill_s": output.prefill_s,
                    "decode_s": output.decode_s,
                    "cache": output.record.to_json(),
                    "decode_batch": batch,
                }
            )
        return outputs

    def _generations(
        self, prepared: list[DecodeRequest], batch: int, disable_tqdm: bool
    ) -> Iterator[tuple[int, GenerationOutput]]:
        """``(index, output)`` of each prepared request, in request order."""
        if batch == 1:
            for index, item in enumerate(_progress(prepared, disable_tqdm, "kvbench generate_until")):
                yield (
                    index,
                    generate(
                        self.model,
                        self.tokenizer,
                        item.context_ids,
                        [],
                        method=self.method,
                        budget=self.budget,
                        question_mode="aware",
                        max_new_tokens=item.max_new_tokens,
                        stop_token_ids=item.stop_token_ids,
                        stop_strings=item.stop_strings,
                        prefill_chunk=self.prefill_chunk,
                        dataset_state=self.dataset_state,
                    ),
                )
            return
        buffer = ReorderBuffer()
        for index, output in generate_batched(
            self.model, self.tokenizer, prepared, method=self.method, budget=self.budget, question_mode="aware",
            decode_batch=batch, prefill_chunk=self.prefill_chunk, dataset_state=self.dataset_state,
        ):  # fmt: skip
            yield from buffer.add(index, (index, output))

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Refused: a rolling log-likelihood (perplexity) scores every token of a document from its own prefix.
        Under prefill eviction every scored position is a prefill position, which attends to the full cache before
        its layer is compressed, so the score would equal the full cache's at any budget; a meaningful version
        streams the document token by token under decode-time eviction, a different protocol kvbench does not
        implement."""
        raise NotImplementedError(
            "kvbench's lm-eval bridge does not support loglikelihood_rolling (perplexity tasks such as wikitext): "
            "under prefill eviction every scored token would see the full cache, so the score would not depend on "
            "the method. Use multiple-choice (loglikelihood) or generate_until tasks."
        )

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records about the model (its results' ``model_info``)."""
        return {
            "model": self.model_name,
            "method": self.method.name,
            "method_family": self.method.family,
            "budget": self.budget.spec,
            "question_mode": self.question_mode,
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
        }

    @property
    def device(self) -> torch.device:
        return self._device


def _progress(items: Any, disable: bool, desc: str) -> Any:
    from tqdm import tqdm

    items = list(items)
    return tqdm(items, desc=desc, disable=disable or len(items) < 2, leave=False)
