"""Typed (structured) Hydra configs.

One dataclass per config group, registered in Hydra's ConfigStore under ``schema/<group>``; every option file in
``conf/<group>/`` extends its schema in its defaults list, so a misspelt key or a wrongly typed value is rejected
by Hydra before any work starts.  Keys added with ``+`` bypass that check; :mod:`kvbench.app.validation` rejects them,
and validates the values that need more than a type check (a budget string, a knob's range) with messages that list
the valid choices.  This module imports neither torch nor transformers, so those checks run before either loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from kvbench.budget import Budget, BudgetError, budget_label, parse_budget
from kvbench.checks import check_choice
from kvbench.resources import conf_dir

#: Valid values of the schema's string knobs: the one definition, checked before torch loads (kvbench/app/validation.py)
#: and imported by the modules that use them (methods/base.py, methods/token_scores.py, inference/generate.py).
DTYPE_NAMES = ("bfloat16", "float16", "float32")
QUESTION_MODES = ("aware", "agnostic")
#: Named placements of ``model.device_map`` (accelerate's strategies); an explicit {module: device} map is also valid.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
POOLING_TYPES = ("max", "avg")
POOL_PADDINGS = ("include", "exclude")
SCORE_DTYPES = ("model", "float32")
GQA_GRANULARITIES = ("kv_head", "query_head")
GQA_AGGREGATIONS = ("mean", "max", "sum")
GQA_REDUCE_ORDERS = ("before_pool", "after_pool")
WANDB_MODES = ("online", "offline", "disabled")


#: The session knobs (:class:`kvbench.eviction.knobs.SessionKnobs`: window, budget accounting, GQA storage, sinks, the
#: decode switch), each set as ``method.params.<knob>`` like a family's own knobs since issue #57; ``method.<knob>``
#: is their spelling of before, still accepted with a note (:func:`move_session_knobs`).
SESSION_KNOBS = ("window", "window_in_budget", "gqa_granularity", "gqa_agg", "sink_tokens", "decode_eviction")


def session_knob_note(knob: str) -> str:
    """The one-line note for ``method.<knob>`` spelt as before issue #57."""
    return f"note: method.{knob} is spelt method.params.{knob} now (the old spelling still works)"


def move_session_knobs(method: dict[str, Any]) -> list[str]:
    """Move the session knobs a method mapping spells as before issue #57 (``window: 16`` beside ``params``) into its
    ``params`` (``params.window: 16``), in place; returns the notes (:func:`session_knob_note`) of the keys moved."""
    old = [key for key in SESSION_KNOBS if key in method]
    if old:
        params = dict(method.get("params") or {})
        for key in old:
            params.setdefault(key, method.pop(key))
        method["params"] = params
    return [session_knob_note(key) for key in old]


@dataclass
class ModelConfig:
    """A model: where its weights come from and how prompts are built for it."""

    #: Short name, used in results paths (``results/runs/<name>/...``).
    name: str = MISSING
    #: Hub id (``meta-llama/Llama-3.1-8B-Instruct``), a local folder, or ``builtin:<name>`` for models built in code.
    path: str = MISSING
    #: torch dtype name: bfloat16 | float16 | float32.
    dtype: str = "bfloat16"
    #: Maximum prompt length in tokens; longer prompts are truncated in the middle (LongBench rule).
    max_input_length: int = 4096
    #: Whether the chat template is applied (datasets may still opt out, e.g. LongBench trec).
    chat_template: bool = True
    #: Extra stop tokens (besides the tokenizer's eos), as strings, e.g. ["<|eot_id|>"].
    stop_tokens: List[str] = field(default_factory=list)
    #: Hub revision (commit or tag) to pin weights; null = default branch.
    revision: Optional[str] = None
    #: Device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...  Ignored when ``device_map`` is set.
    device: str = "auto"
    #: Placement across devices through accelerate: null (the whole model on ``device``), "auto", "balanced",
    #: "balanced_low_0", "sequential", or an explicit map {module name: device} (a device is a GPU index, "cuda:N",
    #: "cpu" or "disk"); each cache layer then lives on its layer's device (docs/devices.md).
    device_map: Optional[Any] = None
    #: Folder for the weights a device map places on "disk" (null: a temporary folder, removed at exit).
    offload_folder: Optional[str] = None
    #: Paper(s) that use this model, for the README and tables.
    papers: List[str] = field(default_factory=list)


@dataclass
class MethodConfig:
    """An eviction method: the registry name of its family and every knob under ``params``: the fields of the family's
    class, the session knobs included (``window``, ``window_in_budget``, ``gqa_granularity``, ``gqa_agg``,
    ``sink_tokens``, ``decode_eviction``: :data:`SESSION_KNOBS`) beside its own (e.g. the attention-vote scorers'
    ``kernel_size``, ``pooling``, ``pool_padding``, ``gqa_reduce``, ``score_dtype``; see kvbench/methods/).  A knob
    the family does not declare is an error listing the family's knobs; ``kvbench list methods`` lists each one with
    its default and meaning."""

    #: Preset name, used in results paths.
    name: str = MISSING
    #: Registry key of the method family, e.g. "full", "streamingllm", "snapkv".
    family: str = MISSING
    #: Every knob of the method, its class's fields (validated by the class, which lists the valid keys).
    params: Dict[str, Any] = field(default_factory=dict)
    #: Paper a preset reproduces, for the README and tables.
    paper: Optional[str] = None
    #: The original code whose selections the preset reproduces (repo, file, commit, settings), recorded with runs.
    reference: Dict[str, Any] = field(default_factory=dict)


@dataclass
class BudgetConfig:
    """A KV budget.  ``spec`` forms: ``full``; ``<n>L`` (total n x num_layers, split by the method's layer
    allocator); ``<n>/layer`` (every layer keeps exactly n); ``<r>x`` with 0<r<=1 (keep ratio r of the context,
    total r x context x num_layers, split by the allocator)."""

    name: str = MISSING
    spec: str = MISSING


@dataclass
class TaskConfig:
    """A benchmark task; ``kind`` selects the builder in kvbench/tasks/ (see kvbench.tasks.base)."""

    #: Task name, used in results paths.
    name: str = MISSING
    #: Registered builder (``@register_task(kind)``).
    kind: str = MISSING
    #: Subset of dataset names (null = all of the task's datasets, in the task's order).
    datasets: Optional[List[str]] = None
    #: Local folder with the benchmark's data files (offline clusters); null = task default / hub.
    data_dir: Optional[str] = None
    #: "aware": the question is inside the compressed prompt; "agnostic": context compressed, question fed after.
    question_mode: str = "aware"
    #: Cap on samples per dataset (first N, null = all).
    num_samples: Optional[int] = None
    #: Seed for synthetic generators.
    seed: int = 42
    #: Target context length in tokens for synthetic tasks (RULER, needle tests); null = task default.
    length: Optional[int] = None
    #: Several target lengths, for tasks that sweep lengths inside one run.
    lengths: Optional[List[int]] = None
    #: Needle depths in percent, for needle tasks.
    depths: Optional[List[float]] = None
    #: Language variant ("en", "zh"), for tasks that have several.
    language: Optional[str] = None
    #: lm-evaluation-harness task names, for ``kind: lmeval`` (kvbench/lmeval/runner.py).
    lm_eval_tasks: Optional[List[str]] = None
    #: Builder-specific extras (validated by the builder).
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class WandbConfig:
    """Weights & Biases logging; off unless ``mode`` is online/offline (default from $WANDB_MODE, else disabled)."""

    mode: str = "disabled"
    project: str = "kvbench"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class RunConfig:
    """Runner settings that do not change results (except ``tag``, which names a variant)."""

    #: Root of all run folders.
    output_root: str = "results/runs"
    #: Optional name of a variant; results go to ``<budget>~<tag>`` so variants never overwrite each other.
    tag: Optional[str] = None
    #: Experiment name (W&B group, sweeps).
    experiment: str = "default"
    #: Show per-dataset progress bars.
    progress: bool = True
    #: Print the score table at the end.
    print_table: bool = True
    #: Torch intra-op threads (null = torch default).
    threads: Optional[int] = None
    #: Tokens per forward of the compressed prefill: 0 = one forward; null = automatic (one forward on GPU; on CPU
    #: chunks of at most 4096 for longer prompts).  Methods see what a one-shot prefill gives them (README,
    #: Performance).
    prefill_chunk: Optional[int] = None
    #: Samples decoded per model forward (issue #33): 1 = one sample at a time (the default, unchanged); N = each
    #: sample is prefilled alone, then decoded in a batch of N (same tokens on CPU float32; README, Batched
    #: decoding); "auto" = as many as fit the free GPU memory (1 on CPU).
    decode_batch: Any = 1
    #: Where generated RULER/NeedleBench samples are stored and reused across method x budget runs: "auto"
    #: (``<output_root>/../samples``, i.e. results/samples), a folder, or null (regenerate in every run).
    sample_cache: Optional[str] = "auto"
    #: Jobs of a sweep that differ only in method and budget share each sample's prefill forward (issue #56;
    #: docs/performance.md): the same predictions, one prefill per sample.  false: every job prefills alone.
    share_prefill: bool = True
    #: Most jobs per shared-prefill group (null: every shareable job of the sweep); bounds the caches held at once.
    prefill_group_size: Optional[int] = None
    #: Set by a cluster-launcher sweep (kvbench/app/shared_tasks.py): the manifest of its shared-prefill tasks and
    #: the line this job runs; not set by hand.
    shared_tasks: Optional[str] = None
    shared_task: Optional[int] = None
    #: A resume whose data, method files or method source changed since the folder's rows were computed (issue #55):
    #: "refuse" (the default: nothing changed, the message names what changed), "recompute" (those datasets' files
    #: are set aside as <file>.stale-<time> and computed again) or "keep" (the rows stay, recorded in run_meta.json
    #: ``stale_rows`` and flagged by every view).  Not part of the config hash.
    changed_inputs: str = "refuse"


#: The ``kv_quant.scheme`` values: ``none`` (every kept token at the model dtype), KIVI's scheme, and transformers'
#: ``QuantizedCache`` with its quanto or HQQ backend (kvbench/cache/quantized.py, docs/kv_quant.md).
KV_QUANT_SCHEMES = ("none", "kivi", "quanto", "hqq")
#: Bit widths per scheme (quanto: qint2 / qint4 only, as transformers allows).
KV_QUANT_BITS = {"kivi": (2, 4, 8), "quanto": (2, 4), "hqq": (2, 4, 8)}
#: Valid quantization axes per transformers backend (KIVI's are fixed: keys per channel, values per token).
KV_QUANT_AXES = {"quanto": (0, -1), "hqq": (0, 1)}
#: When transformers' ``QuantizedLayer`` flushes its residual: ``5.23`` (kvbench's transformers: an update of ``q``
#: tokens onto ``r`` residual ones flushes when ``r + q >= residual_length``) or ``5.2`` (the transformers kvpress 0.5
#: pins: ``r + 1 >= residual_length``, checked only once a token was appended since the last flush).
KV_QUANT_FLUSH_RULES = ("5.23", "5.2")


@dataclass
class KVQuantConfig:
    """Quantized KV storage composed with the method (docs/kv_quant.md): the kept tokens are stored as ``nbits``-bit
    codes with a scale and a zero point per group, the most recent ones in full precision."""

    #: Preset name, used in results paths (``<budget>+<name>``; ``none`` adds nothing).
    name: str = "none"
    #: none | kivi (jy-yuan/KIVI) | quanto | hqq (transformers' QuantizedCache with that backend).
    scheme: str = "none"
    #: Bits per key code (and per value code unless ``value_nbits`` is set).
    nbits: int = 16
    #: Bits per value code (null: ``nbits``; KIVI's K2V4-style settings).
    value_nbits: Optional[int] = None
    #: Elements per group (one scale and one zero point each): KIVI's ``group_size``, transformers' ``q_group_size``.
    group_size: int = 64
    #: Full-precision window: KIVI's ``residual_length``, transformers' ``residual_length``.
    residual_length: int = 128
    #: transformers' ``axis_key`` / ``axis_value`` (quanto: 0 or -1; HQQ: 0 or 1); null for KIVI.
    axis_key: Optional[int] = None
    axis_value: Optional[int] = None
    #: transformers' residual flush rule, ``5.23`` or ``5.2`` (:data:`KV_QUANT_FLUSH_RULES`; ignored by KIVI).
    flush_rule: str = "5.23"
    #: The reference a preset reproduces (repo, file, commit, settings), recorded with runs.
    reference: Dict[str, Any] = field(default_factory=dict)

    @property
    def key_bits(self) -> int:
        return int(self.nbits)

    @property
    def value_bits(self) -> int:
        return int(self.nbits if self.value_nbits is None else self.value_nbits)

    @property
    def transformers_axes(self) -> tuple[int, int]:
        """``(axis_key, axis_value)``, transformers' default 0 for a missing one."""
        return int(self.axis_key or 0), int(self.axis_value or 0)


def check_kv_quant(node: Any, error: type[Exception] = ValueError) -> KVQuantConfig:
    """The ``kv_quant`` node as a checked :class:`KVQuantConfig` (``node``: a DictConfig, a dict or one already)."""
    if isinstance(node, KVQuantConfig):
        spec = node
    else:
        values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})
        known = {key: value for key, value in values.items() if key in KVQuantConfig.__dataclass_fields__}
        spec = KVQuantConfig(**known)  # type: ignore[arg-type]
    check_choice("kv_quant.scheme", spec.scheme, KV_QUANT_SCHEMES, error=error)
    if spec.scheme == "none":
        return spec
    bits = KV_QUANT_BITS[spec.scheme]
    check_choice("kv_quant.nbits", spec.nbits, bits, error=error)
    if spec.value_nbits is not None:
        check_choice("kv_quant.value_nbits", spec.value_nbits, bits, also="or null (= nbits)", error=error)
    for key in ("group_size", "residual_length"):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise error(f"kv_quant.{key}={value!r} is not valid: it must be an integer >= 1.")
    if spec.scheme == "kivi":
        if spec.residual_length % spec.group_size:
            raise error(
                f"kv_quant.residual_length={spec.residual_length} is not valid for KIVI: it must be a multiple of "
                f"kv_quant.group_size={spec.group_size} (keys are quantized per channel in groups of that many "
                "tokens)."
            )
        for key in ("axis_key", "axis_value"):
            if getattr(spec, key) is not None:
                raise error(
                    f"kv_quant.{key}={getattr(spec, key)!r}: KIVI's axes are fixed (keys per channel, values per "
                    "token); use null."
                )
    else:
        for key in ("axis_key", "axis_value"):
            axis = getattr(spec, key)
            check_choice(f"kv_quant.{key}", 0 if axis is None else axis, KV_QUANT_AXES[spec.scheme], error=error)
        check_choice("kv_quant.flush_rule", str(spec.flush_rule), KV_QUANT_FLUSH_RULES, error=error)
    return spec


def kv_quant_refusal(spec: KVQuantConfig, method: Any) -> str | None:
    """Why ``spec`` cannot store ``method``'s cache (an ``EvictionMethod``), or ``None``: quantized layers neither prune
    key channels (ThinK) nor re-rotate kept keys (Finch), and a method that scores the prompt by forwards of its own
    over the cache (KVzip's replay) has no reference with quantized storage."""
    if spec.scheme == "none":
        return None
    scorer = getattr(method, "scorer", None)
    if (
        getattr(method, "key_channel_pruner", None) is not None
        or getattr(scorer, "rerotates_keys", False)
        or getattr(scorer, "replays_context", False)
    ):
        return (
            f"kv_quant={spec.name} does not compose with method family {method.family!r} (it prunes key channels, "
            "re-rotates kept keys or replays the context through the cache); use kv_quant=none"
        )
    return None


@dataclass
class KVBenchConfig:
    """The root config composed by run.py."""

    model: ModelConfig = MISSING
    method: MethodConfig = MISSING
    budget: BudgetConfig = MISSING
    task: TaskConfig = MISSING
    kv_quant: KVQuantConfig = field(default_factory=KVQuantConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    run: RunConfig = field(default_factory=RunConfig)
    seed: int = 0


#: The resolver naming a one-class method's results folder after its wrappers (``${kvbench_method_label:...}``).
METHOD_LABEL_RESOLVER = "kvbench_method_label"
#: A wrapper knob at one of these values is off (left out of the label).
WRAPPERS_OFF = frozenset({"uniform", "topk", "none", "decode0", "target0", "ratio0.0"})


def method_label(family: str, *wrappers: str) -> str:
    """``family`` followed by every wrapper that is on (``knorm``, ``knorm+ada``, ``knorm+ada+pyramid``,
    ``knorm+chunkkv``, ``knorm+decode4+target8``, ``knorm+decode4+ratio0.5``); a wrapper at ``uniform``
    (allocation, layers), ``topk`` (selection), ``none`` (rescale), ``decode0`` (decode_interval), ``target0``
    (decode_target) or ``ratio0.0`` (decode_ratio) is off."""
    return "+".join([family, *(str(wrapper) for wrapper in wrappers if str(wrapper) not in WRAPPERS_OFF)])


#: The wrapper knobs a method label names (``method.params.<knob>``: :mod:`kvbench.eviction.wrappers`), in the label's
#: order, each with the prefix of its part (``decode4``, ``target8``, ``ratio0.5``).
WRAPPER_LABEL_PARTS: dict[str, str] = {
    "allocation": "",
    "layers": "",
    "selection": "",
    "rescale": "",
    "decode_interval": "decode",
    "decode_target": "target",
    "decode_ratio": "ratio",
}


def method_label_interpolation(base: str, knobs: Any = WRAPPER_LABEL_PARTS) -> str:
    """The ``method.name`` interpolation naming ``base`` and the wrappers among ``knobs`` that are on
    (:func:`method_label`), read from the method node's ``params`` (every knob of ``knobs`` must be there)."""
    parts = ",".join(f"{prefix}${{.params.{knob}}}" for knob, prefix in WRAPPER_LABEL_PARTS.items() if knob in knobs)
    return f"${{{METHOD_LABEL_RESOLVER}:{base},{parts}}}"


def budget_leaf(budget: Any, kv_quant: Any = None) -> str:
    """The budget part of a run's folders (Hydra's log folder: ``${kvbench_budget_leaf:...}``): ``<budget>``, or
    ``<budget>+<kv_quant>`` with quantized KV storage, as in the results folder
    (:func:`kvbench.storage.writers.run_dir`)."""
    return str(budget) if kv_quant in (None, "", "none") else f"{budget}+{kv_quant}"


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore, :data:`METHOD_LABEL_RESOLVER`, and the ``kvbench_logs`` resolver
    that places Hydra's own logs beside the results root (:func:`kvbench.storage.paths.hydra_log_dir`; idempotent)."""
    from kvbench.storage.paths import hydra_log_dir

    if not OmegaConf.has_resolver("kvbench_logs"):
        OmegaConf.register_new_resolver("kvbench_logs", hydra_log_dir)
    if not OmegaConf.has_resolver(METHOD_LABEL_RESOLVER):
        OmegaConf.register_new_resolver(METHOD_LABEL_RESOLVER, method_label)
    if not OmegaConf.has_resolver("kvbench_budget_leaf"):
        OmegaConf.register_new_resolver("kvbench_budget_leaf", budget_leaf)
    store = ConfigStore.instance()
    store.store(name="kvbench_schema", node=KVBenchConfig)
    store.store(group="schema/model", name="model", node=ModelConfig, package="model")
    store.store(group="schema/method", name="method", node=MethodConfig, package="method")
    store.store(group="schema/budget", name="budget", node=BudgetConfig, package="budget")
    store.store(group="schema/task", name="task", node=TaskConfig, package="task")
    store.store(group="schema/wandb", name="wandb", node=WandbConfig, package="wandb")
    store.store(group="schema/kv_quant", name="kv_quant", node=KVQuantConfig, package="kv_quant")


# ---------------------------------------------------------------------------------------------------- group choices
#: The defaults list of a budget node, as in ``conf/budget/<name>.yaml``.
_BUDGET_DEFAULTS = ["/schema/budget/budget@_here_", "_self_"]


@lru_cache(maxsize=1)
def budget_presets() -> dict[str, dict[str, str]]:
    """``conf/budget/<name>.yaml`` presets: name -> ``{"name": ..., "spec": ...}``."""
    presets = {}
    for path in sorted((conf_dir() / "budget").glob("*.yaml")):
        node = OmegaConf.load(path)
        presets[path.stem] = {"name": str(node.name), "spec": str(node.spec)}
    return presets


def budget_choice(value: str) -> str | None:
    """The ``budget=`` choice a command-line value stands for: the value itself when it is a preset
    (``conf/budget/<value>.yaml``); for a budget spec (``80L``, ``0.3x``, ``128/layer``, a bare integer ``512`` =
    ``512L``), the preset that means the same budget (``0.5x`` -> ``ratio0.5``, so both share one folder and one
    hash), else a name in the presets' style (``80L``, ``ratio0.3``, ``128perlayer``) whose node
    :func:`kvbench.app.overrides.prepare_overrides` registers; ``None`` when ``value`` is neither."""
    text = str(value).strip()
    if text in budget_presets():
        return text
    try:
        budget = parse_budget(f"{text}L" if text.isdigit() else _budget_spec(text))
    except BudgetError:
        return None
    for name, node in budget_presets().items():
        preset = parse_budget(node["spec"])
        if (preset.kind, preset.value) == (budget.kind, budget.value):
            return name
    return _budget_name(budget)


#: ``run.changed_inputs``'s choices (:func:`kvbench.run.resume.check_inputs_unchanged`).
CHANGED_INPUTS = ("refuse", "recompute", "keep")


def _budget_name(budget: Budget) -> str:
    """The presets' naming of a budget: ``full``, ``<n>L``, ``<n>perlayer``, ``ratio<r>`` (the inverse of
    :func:`_budget_spec`)."""
    if budget.kind == "ratio":
        return f"ratio{budget.value:.10f}".rstrip("0").rstrip(".")
    if budget.kind == "compression":
        return f"cr{budget.value:.10f}".rstrip("0").rstrip(".")
    if budget.kind == "threshold":
        return budget_label(budget.spec)
    return {"full": "full", "total_per_layer": f"{int(budget.value)}L"}.get(budget.kind, f"{int(budget.value)}perlayer")


def _budget_spec(name: str) -> str:
    """The spec of a budget named in the presets' style (``ratio0.3`` -> ``0.3x``, ``96perlayer`` -> ``96/layer``);
    a spec is returned as it is."""
    if name.startswith("ratio"):
        return f"{name[len('ratio') :]}x"
    if name.startswith("cr"):
        return f"{name[len('cr') :]}cr"
    if name.startswith("thr"):
        return f"{name[len('thr') :]}thr"
    return name.replace("perlayer", "/layer")


def register_budget_choice(name: str) -> None:
    """Register ``budget/<name>`` in Hydra's ConfigStore for a :func:`budget_choice` name with no YAML preset."""
    if name not in budget_presets():
        node = {"defaults": _BUDGET_DEFAULTS, "name": name, "spec": _budget_spec(name)}
        ConfigStore.instance().store(group="budget", name=name, node=node)
