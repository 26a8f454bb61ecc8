"""RULER's datasets (one task at one length), the ``ruler`` task builder and data preparer."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.checks import check_choice
from kvbench.metrics.synthetic import ruler_postprocess, string_match_all, string_match_part
from kvbench.storage.sample_cache import cached_samples, source_fingerprint, tokenizer_fingerprint
from kvbench.tasks.base import Sample, TaskDataset, register_data_preparer, register_task, select_datasets
from kvbench.tasks.ruler.aggregation import CommonWordsGenerator, FrequentWordsGenerator
from kvbench.tasks.ruler.inputs import RulerInputs
from kvbench.tasks.ruler.niah import NiahGenerator
from kvbench.tasks.ruler.qa import QAGenerator
from kvbench.tasks.ruler.spec import GENERATOR_VERSION, MAX_NEW_TOKENS, OPTION_DEFAULTS, TASKS, RulerTask
from kvbench.tasks.ruler.templates import CHAT_TEMPLATE_MODES, RULER_TEMPLATES, ruler_template
from kvbench.tasks.ruler.variable_tracking import VariableTrackingGenerator
from kvbench.tasks.text_inputs import TextTokenizer, download, hub_download, option_values, resolve_input_dir

log = logging.getLogger(__name__)


class RulerGenerator(
    NiahGenerator, VariableTrackingGenerator, CommonWordsGenerator, FrequentWordsGenerator, QAGenerator
):
    """Generates the samples of one RULER task at one length: ``generate`` dispatches to the family's
    ``_generate_<generator>`` (see :class:`~kvbench.tasks.ruler.sizing.SizedGenerator` for the settings)."""


ANSWER_PREFIX_MODES = ("assistant", "user")
#: Source files whose code generates the samples (their hash is part of the sample-cache key).
_HERE = Path(__file__).resolve().parent
GENERATOR_SOURCES = (
    *sorted(_HERE.glob("*.py")),
    _HERE.parent / "text_inputs.py",
    _HERE.parent / "base.py",
    _HERE.parent.parent / "prompting.py",
)


class RulerDataset(TaskDataset):
    """One RULER task at one target length; samples are generated on first use (or read from the sample cache)."""

    def __init__(
        self,
        task: RulerTask,
        length: int,
        tokenizer: Any,
        inputs: RulerInputs,
        *,
        num_samples: int,
        seed: int,
        max_new_tokens: int | None = None,
        answer_prefix: str = "assistant",
        name: str | None = None,
        use_chat_template: bool = False,
        template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        length_tokenizer: tuple[str, Any] | None = None,
    ) -> None:
        """``template``: a RULER template name (:data:`RULER_TEMPLATES`; ``task.options.chat_template=ruler``): its
        text is part of every sample and the model's chat template is not applied (``self.chat_template`` False);
        ``None``: the model's chat template when ``use_chat_template`` (``chat_template=model``).
        ``chat_template_kwargs``: extra variables of the model's chat template (``task.options.chat_template_kwargs``).
        ``length_tokenizer``: ``(family name, tokenizer)`` that generates and counts lengths on the RULER-template text
        alone (``task.options.generator_tokenizer``); ``None``: ``tokenizer``, the model's chat template counted."""
        check_choice("task.options.answer_prefix", answer_prefix, ANSWER_PREFIX_MODES)
        if template is not None:
            check_choice("task.options.ruler_template", template, list(RULER_TEMPLATES))
        self.task = task
        self.ruler_template = template
        self.chat_template = template is None
        self.use_chat_template = use_chat_template and template is None
        self.chat_template_kwargs = MappingProxyType(dict(chat_template_kwargs or {}))
        self.length_tokenizer = None if length_tokenizer is None else length_tokenizer[0]
        #: Whether lengths count the model's chat template (not with another tokenizer: RULER's prepare.py counts
        #: the RULER-template text with the tokenizer it is given).
        self.length_counts_chat_template = self.use_chat_template and length_tokenizer is None
        self.length = length
        self.tok = TextTokenizer(tokenizer if length_tokenizer is None else length_tokenizer[1])
        self.inputs = inputs
        self.num_samples = num_samples
        self.seed = seed
        self.name = name or task.name
        self.max_new_tokens = max_new_tokens or MAX_NEW_TOKENS[task.generator]
        self.answer_prefix_mode = answer_prefix
        self.metric_name = "string_match_part" if task.generator == "qa" else "string_match_all"
        self._samples: list[Sample] | None = None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(
            task=self.task.name,
            length=self.length,
            seed=self.seed,
            answer_prefix=self.answer_prefix_mode,
            length_counts_chat_template=self.length_counts_chat_template,
            prompt_template="model" if self.ruler_template is None else "ruler",
            ruler_template=self.ruler_template,
        )
        if self.length_tokenizer is not None:
            info["length_tokenizer"] = self.length_tokenizer
        return info

    def provenance(self) -> dict[str, dict[str, Any]]:
        return self.inputs.used_by(self.task)

    def cache_key(self) -> dict[str, Any]:
        """Everything the samples depend on (see :mod:`kvbench.storage.sample_cache`)."""
        return {
            "task": self.task.name,
            "generator": self.task.generator,
            "args": self.task.args,
            "length": self.length,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "answer_prefix": self.answer_prefix_mode,
            "chat_template": self.length_counts_chat_template,
            "ruler_template": self.ruler_template,
            **({"chat_template_kwargs": dict(self.chat_template_kwargs)} if self.chat_template_kwargs else {}),
            **({"length_tokenizer": self.length_tokenizer} if self.length_tokenizer else {}),
            "generator_version": GENERATOR_VERSION,
            "tokenizer": tokenizer_fingerprint(self.tok.tokenizer),
            "inputs": {name: record.get("sha256", record.get("by")) for name, record in self.provenance().items()},
            "code": source_fingerprint(GENERATOR_SOURCES),
        }

    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = cached_samples(
                self.sample_cache, "ruler", self.name, self.cache_key, self.num_samples, self.generate_samples
            )
        return self._samples

    def generate_samples(self, count: int) -> list[Sample]:
        """Generate ``count`` samples (no cache)."""
        generator = RulerGenerator(
            self.task,
            self.length,
            self.tok,
            self.seed,
            self.max_new_tokens,
            self.inputs,
            use_chat_template=self.length_counts_chat_template,
            answer_prefix_mode=self.answer_prefix_mode,
            ruler_template=RULER_TEMPLATES[self.ruler_template or "base"],
            template_kwargs=self.chat_template_kwargs,
        )
        out = []
        for i, gen in enumerate(generator.generate(count)):
            prompt_tokens = generator.count(gen)
            extra = dict(gen.extra)
            extra.update(
                task=self.task.name,
                target_length=self.length,
                prompt_tokens=prompt_tokens,
                length_with_generation=prompt_tokens + self.max_new_tokens,
            )
            parts = gen.as_sample_parts(self.answer_prefix_mode)
            out.append(Sample(id=f"{self.task.name}_{self.length}_{i}", answers=gen.answers, extra=extra, **parts))
        return out

    def postprocess(self, prediction: str) -> str:
        return ruler_postprocess(prediction)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        """``score`` (0-100, string_match_all or _part per RULER) and ``nulls`` (empty predictions)."""
        refs = [s.answers for s in samples]
        fn = string_match_part if self.metric_name == "string_match_part" else string_match_all
        return {"score": fn(predictions, refs), "nulls": float(sum(not p.strip() for p in predictions))}


def _dataset_names(task: Any) -> list[str]:
    """The RULER tasks a config can select (:data:`~kvbench.tasks.base.DatasetNames`): all 13, whatever the length."""
    return list(TASKS)


@register_task("ruler", dataset_names=_dataset_names)
def build_ruler(task_cfg: Any, tokenizer: Any, chat_template: bool = False) -> list[TaskDataset]:
    """Builder: one dataset per selected task (``task.datasets``) and length (``task.lengths`` or ``task.length``).

    ``task.options.chat_template``: ``ruler`` (default) wraps the task text in RULER's template for the model
    (``task.options.ruler_template``, ``auto``: :func:`~kvbench.tasks.ruler.templates.auto_ruler_template`);
    ``model`` renders the model's chat template when ``chat_template`` (``model.chat_template``) is true, with
    ``task.options.chat_template_kwargs`` as its extra variables.  ``task.options.generator_tokenizer``: generate
    and count lengths with another tokenizer (:func:`length_tokenizer`).

    With several lengths the dataset names get a ``_{length}`` suffix (``niah_single_1_4096``).
    """
    opts = option_values(task_cfg, OPTION_DEFAULTS, "ruler")
    names = select_datasets(list(TASKS), getattr(task_cfg, "datasets", None), "ruler")
    lengths = list(getattr(task_cfg, "lengths", None) or [getattr(task_cfg, "length", None) or 4096])
    if any(int(x) < 256 for x in lengths):
        raise ValueError(f"RULER lengths must be at least 256 tokens, got {lengths}")
    num_samples = getattr(task_cfg, "num_samples", None) or int(opts["samples_per_task"])
    mode = check_choice("task.options.chat_template", opts["chat_template"], CHAT_TEMPLATE_MODES)
    template = ruler_template(opts["ruler_template"], tokenizer, chat_template) if mode == "ruler" else None
    if template == "base" and chat_template and opts["ruler_template"] in (None, "auto"):
        log.warning(
            "RULER has no template for this chat model (%s): its prompts are the task text alone, as RULER runs "
            "such models; task.options.chat_template=model renders the model's chat template instead",
            getattr(tokenizer, "name_or_path", "") or "unnamed tokenizer",
        )
    template_kwargs = chat_template_kwargs(opts["chat_template_kwargs"])
    counter = length_tokenizer(opts["generator_tokenizer"])
    inputs = RulerInputs(resolve_input_dir(task_cfg, "ruler", opts["source"]))
    datasets: list[TaskDataset] = []
    for length in lengths:
        for name in names:
            datasets.append(
                RulerDataset(
                    TASKS[name],
                    int(length),
                    tokenizer,
                    inputs,
                    num_samples=num_samples,
                    seed=int(getattr(task_cfg, "seed", 42)),
                    max_new_tokens=opts["max_new_tokens"],
                    answer_prefix=opts["answer_prefix"],
                    name=name if len(lengths) == 1 else f"{name}_{length}",
                    use_chat_template=chat_template,
                    template=template,
                    chat_template_kwargs=template_kwargs,
                    length_tokenizer=counter,
                )
            )
    return datasets


def chat_template_kwargs(value: Any) -> dict[str, Any]:
    """``task.options.chat_template_kwargs`` as a plain dict (``null``: empty); anything but a mapping is an error
    naming the value."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) and not hasattr(value, "items"):
        raise ValueError(
            f"task.options.chat_template_kwargs={value!r} is not a mapping; give the chat template's variables, "
            "e.g. +task.options.chat_template_kwargs={enable_thinking:false}"
        )
    return {str(key): item for key, item in value.items()}


def length_tokenizer(family: str | None) -> tuple[str, Any] | None:
    """``task.options.generator_tokenizer``: ``None`` (the model's tokenizer), or ``(family, tokenizer)`` built
    offline by :func:`kvbench.models.tokenizers.build_tokenizer` (a bad name lists the families)."""
    if family is None:
        return None
    from kvbench.models.tokenizers import FAMILIES

    check_choice("task.options.generator_tokenizer", str(family), list(FAMILIES))
    return str(family), _counting_tokenizer(str(family))


@functools.cache
def _counting_tokenizer(family: str) -> Any:
    """The tokenizer family ``family``, built once per process: it only encodes and decodes (never configured
    after it is built), so every job of a sweep run in one process (a shared-prefill group) counts with the same
    one instead of building its own (about 0.6 s each on 2 CPU cores)."""
    from kvbench.models.tokenizers import build_tokenizer

    return build_tokenizer(family)


_SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"
_HOTPOT_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"


@register_data_preparer("ruler")
def prepare_ruler(target_dir: Path, **options: Any) -> None:
    """Fetch RULER's external inputs into ``target_dir``: SQuAD v2.0 dev, HotpotQA dev-distractor (the URLs of
    RULER's ``download_qa_dataset.sh``) and Paul Graham essays (``PaulGrahamEssays.jsonl`` of the HF dataset
    ``opencompass/NeedleBench``).  Options: ``squad_url``, ``hotpotqa_url``, ``essays_repo``."""
    target = Path(target_dir)
    download(options.get("squad_url", _SQUAD_URL), target / "dev-v2.0.json")
    download(options.get("hotpotqa_url", _HOTPOT_URL), target / "hotpot_dev_distractor_v1.json")
    hub_download(options.get("essays_repo", "opencompass/NeedleBench"), "PaulGrahamEssays.jsonl", target)
