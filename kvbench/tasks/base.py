"""The task interface: what a benchmark hands to the runner.

A *task* (``task=longbench``, ``task=tiny_niah``, ...) is a list of *datasets*; a dataset is a list of
:class:`Sample` plus the rules to prompt, post-process and score them.  Everything here is plain Python:
the runner owns tokenisation, truncation, chat templates, prefill/eviction and generation.

Prompt split
------------
Every sample is given as two strings, ``context`` then ``question``; the full prompt is their concatenation.
In question-aware mode (``task.question_mode=aware``) the whole prompt is prefilled and compressed; in
question-agnostic mode (``task.question_mode=agnostic``) only ``context`` is prefilled and compressed, then
``question`` is fed on top of the compressed cache.  A dataset with no separable question puts everything in
``context`` and leaves ``question`` empty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.errors import KVBenchError
from kvbench.registry import Registry, submodule_importer
from kvbench.sample import Sample


class TaskDataset(ABC):
    """One dataset of a task: samples, generation limits, post-processing and scoring.

    Subclasses set the class attributes or override them per instance.
    """

    #: Dataset name, used as the results sub-folder (``results/runs/.../<name>/``).
    name: str
    #: Greedy generation stops after this many new tokens.
    max_new_tokens: int
    #: Whether the model's chat template may wrap this dataset's prompt (LongBench skips it for some datasets).
    chat_template: bool = True
    #: Extra stop strings: generation stops as soon as the decoded output contains one.
    stop_strings: tuple[str, ...] = ()
    #: Texts whose token id ends generation like an end-of-sequence token: the id of the *last* token of
    #: ``tokenizer.encode(text, add_special_tokens=False)`` (LongBench pred.py's newline stop for samsum).
    stop_token_texts: tuple[str, ...] = ()
    #: BOS of a chat-templated prompt: "single" (the template's own BOS only) or "reference_double" (the templated
    #: text tokenised with special tokens, so a template that starts with the BOS text gets a second one, as the
    #: Ada-KV and CAKE LongBench pipelines do).  See :data:`kvbench.prompting.BOS_MODES`.
    bos: str = "single"
    #: Extra variables of the model's chat template, rendered with every prompt (``{"enable_thinking": False}``, as
    #: kvpress's pipeline renders Qwen3's template; RULER's ``task.options.chat_template_kwargs``); empty: the template
    #: as published.
    chat_template_kwargs: Mapping[str, Any] = MappingProxyType({})
    #: Stop tokens/strings are ignored for this many first tokens (LongBench's ``min_length`` for samsum).
    min_new_tokens: int = 0
    #: What happens to a prompt longer than the model's ``max_input_length``: "middle" (LongBench's middle
    #: truncation) or "none" (an error naming the sample and the lengths; RULER/NeedleBench build prompts that fit
    #: and their official harnesses never truncate).
    truncation: str = "none"
    #: Where generated samples are stored and reused (set by the runner; ``None`` = regenerate every run).
    sample_cache: Any = None
    #: Name of the headline metric, recorded in metrics.json (e.g. "qa_f1_score", "string_match_all").
    metric_name: str = "score"
    #: Whether the dataset runs its own evaluation loop (:meth:`evaluate`, e.g. lm-eval tasks) instead of the
    #: runner's generate-and-score loop; such a dataset writes its own ``metrics.json``, with no per-sample kvbench
    #: predictions to resample.
    evaluates_itself: bool = False
    #: Seeded sampling instead of greedy decoding (a :class:`kvbench.sampling.Sampling`; ``None`` = greedy, the
    #: default): each sample draws from its own seed (:meth:`~kvbench.sampling.Sampling.for_sample`).
    sampling: Any = None
    #: Whether a sample takes several generation passes, each prompt built from the text so far
    #: (:meth:`follow_up`; LongBench v2's chain of thought).  Such a dataset decodes one sample at a time.
    multi_pass: bool = False
    #: Compress once, ask many (:mod:`kvbench.run.groups`): ``None`` (every sample on its own, the default),
    #: ``"multi_turn"`` or ``"multi_request"``: consecutive samples with the same ``extra["group"]`` share one context,
    #: prefilled and compressed once, and are its turns (``extra["turn"]`` 0, 1, ...) answered from that cache.
    context_groups: str | None = None

    @abstractmethod
    def samples(self) -> Sequence[Sample]:
        """All samples of this dataset, in a fixed order (deterministic for a given config/seed)."""

    def postprocess(self, prediction: str) -> str:
        """Turn the raw decoded generation into the string that is scored (default: unchanged)."""
        return prediction

    @abstractmethod
    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """Score post-processed predictions against their samples.

        Returns a dict with at least ``"score"`` (the headline number, on the benchmark's own scale, e.g. 0-100
        for LongBench) and optionally more named numbers (LongBench-E buckets, per-depth scores, ...).
        """

    def follow_up(self, sample: Sample, text: str, passes_done: int) -> tuple[Sample, int] | None:
        """For a :attr:`multi_pass` dataset: the next pass's prompt and ``max_new_tokens``, given ``text``, the output
        of pass ``passes_done`` (1 = the first); ``None`` when ``text`` is the final answer (default: always)."""
        return None

    def write_report(  # noqa: B027  (optional hook, deliberately a no-op by default)
        self, predictions: Sequence[str], samples: Sequence[Sample], folder: Path, title: str
    ) -> None:
        """Write extra per-run artefacts (plots, ...) into the dataset's results ``folder``; default: nothing.

        Called by the runner after scoring, with the post-processed predictions in sample order.
        """

    def evaluate(self, job: Any, loaded: Any, samples: Sequence[Sample]) -> Any:
        """The dataset's own evaluation loop, for a dataset that sets :attr:`evaluates_itself`: run ``samples``
        with the run's method and budget (``job``: a :class:`kvbench.run.job.DatasetJob`, the run's settings handed
        down by the runner) on the ``loaded`` model, write the dataset's files
        (:func:`kvbench.run.records.write_metrics`, in ``job.run_folder / self.name``) and return its
        :class:`~kvbench.run.records.DatasetResult`."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate itself (evaluates_itself is False)")

    def provenance(self) -> dict[str, dict[str, Any]]:
        """Where each input came from, recorded in metrics.json (see :mod:`kvbench.tasks.provenance`): per input
        name, ``{"source": "official" | "hub" | "stand-in" | "generated", ...}``.  Called after :meth:`samples`."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Settings recorded into metrics.json next to the score."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "chat_template": self.chat_template,
            "stop_strings": list(self.stop_strings),
            "stop_token_texts": list(self.stop_token_texts),
            "min_new_tokens": self.min_new_tokens,
            "truncation": self.truncation,
            "bos": self.bos,
            "metric": self.metric_name,
            "decoding": self.sampling.to_json() if self.sampling is not None else "greedy",
            **({"context_groups": self.context_groups} if self.context_groups else {}),
            **({"chat_template_kwargs": dict(self.chat_template_kwargs)} if self.chat_template_kwargs else {}),
        }


#: Builds the datasets of a task from its (resolved) task config, the model's tokenizer and whether the model's chat
#: template wraps the prompts (some synthetic generators size samples with the model's own tokenizer and template,
#: as RULER does): ``builder(task_cfg, tokenizer, chat_template=False)``.
TaskBuilder = Callable[..., list[TaskDataset]]
#: The dataset names a task config would run, before anything is built (all of them when ``task.datasets`` is
#: null): ``dataset_names(task)`` with ``task`` a mapping of the task config's keys (``kind``, ``language``,
#: ``length``, ``lengths``, ...; a :class:`~omegaconf.DictConfig` or a plain dict).  Raises ``ValueError`` or
#: ``KeyError`` for a setting the builder reports with its own message.
DatasetNames = Callable[[Any], list[str]]


@dataclass(frozen=True)
class PackageNeed:
    """An optional Python package a run needs, checked before any work
    (:func:`kvbench.app.validation.check_environment`).

    Attributes
    ----------
    module:
        The importable module; ``"a|b"`` means either will do (the first is named in the message).
    why:
        What needs it, as the user set it (``"task.options.code_sim_backend=levenshtein"``).
    fix:
        The pip command or the setting that avoids it, in a sentence.
    """

    module: str
    why: str
    fix: str


#: The optional packages a task config needs: ``required_packages(task) -> [PackageNeed, ...]`` (``task`` the task
#: config node); imports nothing heavy.
RequiredPackages = Callable[[Any], list[PackageNeed]]


@dataclass(frozen=True)
class TaskKind:
    """A task kind as it describes itself to validation and ``kvbench list tasks``, without building anything.

    Attributes
    ----------
    name:
        The ``task.kind`` value.
    builder:
        Builds the datasets (:data:`TaskBuilder`).
    dataset_names:
        The datasets a config runs (:data:`DatasetNames`), or ``None`` when only building tells (lm-eval groups).
    required_packages:
        The optional packages a config needs (:data:`RequiredPackages`), or ``None`` for none.
    data_dir_values:
        ``task.data_dir`` values that name shipped data rather than a folder, and what they are
        (LongBench: ``{"fixtures": "the shipped LongBench fixtures"}``).
    preparer:
        The ``scripts/prepare_data.py`` benchmark that writes this kind's ``task.data_dir`` (``None``: the kind's
        name).
    """

    name: str
    builder: TaskBuilder
    dataset_names: DatasetNames | None = None
    required_packages: RequiredPackages | None = None
    data_dir_values: dict[str, str] = field(default_factory=dict)
    preparer: str | None = None

    @property
    def preparer_name(self) -> str:
        """The ``scripts/prepare_data.py`` argument for this kind's data."""
        return self.preparer or self.name


#: Task kinds by ``task.kind``.
#: Task kinds registered outside this package, found by name: lm-eval's (its datasets are built by the lm-eval
#: bridge, a consumer of runs that imports this package; the plug-in module is light, importing the bridge only
#: when it builds datasets).
PLUGIN_TASK_MODULES = ("kvbench.lmeval_task",)
TASK_KINDS: Registry[TaskKind] = Registry(
    "task kind", discover=submodule_importer("kvbench.tasks", plugins=PLUGIN_TASK_MODULES)
)


def register_task(
    kind: str,
    *,
    dataset_names: DatasetNames | None = None,
    required_packages: RequiredPackages | None = None,
    data_dir_values: dict[str, str] | None = None,
    preparer: str | None = None,
) -> Callable[[TaskBuilder], TaskBuilder]:
    """Register a task builder under ``kind`` (the ``task.kind`` value in ``conf/task/*.yaml``), with what the kind
    tells about itself before building (:class:`TaskKind`); returns the builder unchanged."""

    def decorator(builder: TaskBuilder) -> TaskBuilder:
        described = TaskKind(kind, builder, dataset_names, required_packages, dict(data_dir_values or {}), preparer)
        TASK_KINDS.register(kind)(described)
        return builder

    return decorator


def task_kinds() -> list[str]:
    """Names of all registered task kinds (imports the built-in task modules first)."""
    return TASK_KINDS.names()


def task_kind(kind: str) -> TaskKind:
    """The registered :class:`TaskKind` named ``kind``; ``ValueError`` naming the valid kinds otherwise."""
    return TASK_KINDS.get(kind)


def build_task(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Build the datasets of ``task_cfg`` (its ``kind`` selects the builder), filtered by ``task_cfg.datasets``.

    ``chat_template``: whether the model's chat template will wrap the prompts (``model.chat_template``)."""
    return task_kind(task_cfg.kind).builder(task_cfg, tokenizer, chat_template=chat_template)


def select_datasets(available: Sequence[str], requested: Sequence[str] | None, task_name: str) -> list[str]:
    """Validate a ``task.datasets`` override against the task's dataset names (``None`` = all, in order)."""
    if requested is None:
        return list(available)
    unknown = [name for name in requested if name not in available]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown} for task {task_name!r}; valid datasets: {', '.join(available)}")
    return list(requested)


#: Downloads a benchmark's inputs into a local folder for offline compute nodes:
#: ``preparer(target_dir: Path, **options) -> None``.  Used by scripts/prepare_data.py.
DataPreparer = Callable[..., None]

#: Data preparers by benchmark name.
DATA_PREPARERS: Registry[DataPreparer] = Registry("data preparer", discover=submodule_importer("kvbench.tasks"))


def register_data_preparer(name: str) -> Callable[[DataPreparer], DataPreparer]:
    """Register a function that fetches benchmark ``name``'s data for offline use (scripts/prepare_data.py)."""
    return DATA_PREPARERS.register(name)


def data_preparers() -> dict[str, DataPreparer]:
    """All registered data preparers by benchmark name (imports the built-in task modules first)."""
    return DATA_PREPARERS.as_dict()


def check_samples(dataset: str, samples: Sequence[Any], source: str) -> None:
    """A dataset's samples are usable: at least one, unique ids, a non-empty context string."""
    if not samples:
        raise KVBenchError(
            f"dataset {dataset!r} has no samples (source: {source}). Check the data file, or leave the dataset out "
            "with task.datasets=[...]."
        )
    seen: set[str] = set()
    for index, sample in enumerate(samples):
        if sample.id in seen:
            raise KVBenchError(
                f"dataset {dataset!r} has two samples with id {sample.id!r} (source: {source}); ids must be unique "
                "for results to resume. Fix the data file."
            )
        seen.add(sample.id)
        if not isinstance(sample.context, str) or not sample.context.strip():
            raise KVBenchError(
                f"dataset {dataset!r}, sample {sample.id!r} (#{index}): the context string is empty (source: "
                f"{source}); every prompt needs a context to compress. Fix or remove that line."
            )
