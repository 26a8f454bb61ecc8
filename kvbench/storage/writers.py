"""Results layout and crash-safe writers.

Layout (one *run* = one model x task x method x budget)::

    results/runs/<model>/<task>/<method>/<budget>[~<tag>]/
        config.yaml               resolved config (the whole Hydra config, resolved)
        run_meta.json             provenance: git commit, versions, device, config_hash, start/end times
        summary.json              per-dataset scores with bootstrap 95 % intervals, paper averages, kept fraction,
                                  timings, provenance (written when the run completes; :mod:`kvbench.run.summary`)
        <dataset>/predictions.jsonl   one JSON object per sample, appended as soon as it exists
        <dataset>/metrics.json        written atomically once the dataset is complete
        <dataset>/timings.jsonl       per-sample prefill/decode seconds (kept apart so predictions are deterministic)

``predictions.jsonl`` rows (keys always present)::

    {"id": str, "prompt_sha256": str (hash of the sample's prompt parts; resume checks it),
     "prediction": str (post-processed, scored), "raw_prediction": str, "answers": [str],
     "all_classes": [str] | null, "length": int | null, "extra": {...},
     "prompt_end": str (the last 300 characters of the prompt before the chat template; absent in older runs),
     "input_tokens": int, "context_tokens": int, "question_tokens": int, "truncated": bool,
     "new_tokens": int, "cache": {"requested_per_layer": [int], "achieved_per_layer": [int],
                                  "requested_per_head": [[int]], "achieved_per_head": [[int]], "evicted": bool,
                                  "stored_bytes": int (kept tokens' K+V bytes after the prefill, the same on
                                  every backend), "allocated_bytes": int (what the backend held then, spare
                                  capacity / free pages included), "peak_stored_bytes": int,
                                  "peak_allocated_bytes": int (the sample's peaks), "peak_prefill_bytes": int
                                  (stored peak of the compressed prefill), "context_tokens": int,
                                  "final_per_layer": [int],
                                  "decode_cap_per_layer": [int], "allocator_state": {...} | null,
                                  "extra_forwards": int (forwards the method ran to score the prompt: KVzip's
                                  replays, RestoreKV's restore pass; their time is in the prefill seconds),
                                  "key_positions": "original" | "rerotated" (Finch: kept keys re-rotated to
                                  0..n-1), "next_position": int | null (where the tokens after the prompt went,
                                  when re-rotated or after RestoreKV's restore tokens),
                                  "prerope_states": "hidden_states" | "unrotated" | "mixed" | null (where a
                                  scorer's pre-RoPE keys/queries came from; null: it reads none),
                                  "learned_weights": {"source", "path", "sha256", "training"?} | null (the
                                  checkpoint a learned scorer read: KVzap, Fast KVzip; "training" marks kvbench's
                                  own CPU-trained ones)},
     "stop_reason": str, "question_lost": bool,
     "scoring_error": str (only on a row whose scorer raised: it scored 0; :mod:`kvbench.run.scoring`),
     "config_hash": str, "inputs": str (digest of the data, method files and method source the row was computed
     from), "code": str (digest of kvbench's source) (issue #55, :mod:`kvbench.run.fingerprints`; absent in older
     runs)}

``metrics.json``::

    {"schema_version": 2 (absent: version 1, :mod:`kvbench.storage.reader`), "model": str, "task": str,
     "dataset": str, "method": str, "budget": str, "tag": str | null,
     "metric": str, "score": float, "scores": {name: float}, "n_samples": int,
     "config_hash": str, "question_mode": "aware" | "agnostic", "dataset_settings": {...},
     "data_provenance": {input: {"source": "official" | "hub" | "stand-in" | "generated", "path"/"repo", "sha256",
                                 ...}},
     "scorer": {...backend settings...}, "cache": {"mean_requested_per_layer": [float],
     "mean_achieved_per_layer": [float], "mean_kept_fraction": float, "mean_stored_bytes": float,
     "peak_stored_bytes": int, "mean_allocated_bytes": float, "peak_allocated_bytes": int (means over samples after
     the prefill, peaks over samples of each sample's peak; docs/results.md), "mean_stored_vs_full": float | null,
     "budget_exact": bool (every layer kept its requested budget), "allocation_exact": bool (every head kept what
     the method allocated it; Ada-KV's reference rounds heads on their own, so its layers may drift by a few
     tokens), "samples_evicted": int, "learned_weights": [{...}] (only for learned scorers: each distinct
     checkpoint of the rows)},
     "settings": {...method/budget knobs that matter, incl. the preset's reference...},
     "timing": {"n": int, "prefill_s_mean": float, "decode_s_mean": float, "total_s": float},
     "attention": {"calls": {path: int}, "fallbacks": {reason: int}} (paged-cache attention paths that ran and
     any GPU path that was unavailable, :mod:`kvbench.kernels.paths`; run_meta.json has the machine's
     "attention_capability" and the run's "attention_fallbacks"),
     "scoring_errors": {"count": int, "by_sample": {id: str}} (predictions whose scorer raised, scored 0),
     "inputs": {"digest": str, "details": {"data", "method_files", "method_source"}}, "code": {"commit": str | null,
     "sources": [str] (kvbench source digests of the rows: more than one is a mixed-code dataset)}, "rows": {"n":
     int, "sha256": str, "checksum": str} (the scored rows and the score's checksum over them,
     :mod:`kvbench.storage.integrity`; these three absent in older runs)}

Generated RULER/NeedleBench samples live apart from the runs, in ``run.sample_cache`` (default
``results/samples/<benchmark>/<dataset>-<key>.jsonl``, see :mod:`kvbench.storage.sample_cache`).

Aggregation (scripts/aggregate.py) discovers runs by finding ``metrics.json`` files; nothing else is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvbench.storage.ownership import check_held
from kvbench.storage.reader import read_config_yaml, read_metrics, read_prediction_rows
from kvbench.storage.revisions import prediction_revisions

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"
RUN_META_FILE = "run_meta.json"
TIMINGS_FILE = "timings.jsonl"


def run_dir(
    output_root: str | Path,
    model: str,
    task: str,
    method: str,
    budget: str,
    tag: str | None,
    kv_quant: str | None = None,
) -> Path:
    """Deterministic results folder of one run, keyed by the group choices (and an optional user tag): the leaf is
    ``<budget>``, ``<budget>+<kv_quant>`` when the KV storage is quantized (``kv_quant`` not ``none``), then
    ``~<tag>``."""
    leaf = budget if kv_quant in (None, "", "none") else f"{budget}+{kv_quant}"
    leaf = leaf if not tag else f"{leaf}~{tag}"
    return Path(output_root) / model / task / method / leaf


def _file_mode() -> int:
    """Mode of a new file under the process umask (``0o666 & ~umask``), as ``open()`` creates them."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old file or the complete new one.

    The file gets the mode ``open()`` would give it (``0o666`` less the umask), like the append-only logs.
    """
    check_held(path)  # the run folder is still the one this process locked (checked again before the rename)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _file_mode())  # mkstemp creates 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        check_held(path)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, payload: Any) -> None:
    """Atomically write ``payload`` as pretty JSON."""
    atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class PredictionLog:
    """Append-only ``predictions.jsonl`` that survives being killed at any instant.

    Each row is written with a single ``write`` of one complete line, then flushed and fsynced.  A process
    killed mid-write can leave at most one partial last line; :meth:`load` drops it (and truncates the file
    back to the last complete line) so that a resumed run appends cleanly without duplicates.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[dict[str, Any]]:
        """Rows already written, in order, verified (:func:`kvbench.storage.reader.read_prediction_rows`): a torn
        last line left by a kill is cut off; any other damage raises :class:`~kvbench.storage.reader.DamagedFile`."""
        return read_prediction_rows(self.path)

    def append(self, row: dict[str, Any]) -> None:
        """Append one row durably."""
        line = json.dumps(row, ensure_ascii=False) + "\n"
        check_held(self.path)  # the run folder is still the one this process locked
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def holds_results(folder: Path) -> bool:
    """Whether a run folder holds anything worth keeping: a ``metrics.json`` or a non-empty ``predictions.jsonl``.

    A folder without either (a run that failed or was killed before its first prediction) may be replaced.
    """
    if not folder.is_dir():
        return False
    if any(folder.rglob(METRICS_FILE)):
        return True
    return any(path.stat().st_size > 0 for path in folder.rglob(PREDICTIONS_FILE))


def iter_metrics(root: str | Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yield ``(path, metrics)`` for every ``metrics.json`` under ``root`` (sorted, for stable output), each checked
    and upgraded to the current schema version (:func:`kvbench.storage.reader.read_metrics`)."""
    for path in sorted(Path(root).rglob(METRICS_FILE)):
        yield path, read_metrics(path)


class TimingLog:
    """Append-only ``timings.jsonl`` (best effort: a torn last line is ignored, timings are not results)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, row: dict[str, Any]) -> None:
        check_held(self.path)  # never into a run folder moved or replaced mid-run
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def summary(self) -> dict[str, Any]:
        """Mean prefill/decode seconds over the rows recorded (the last row per sample id)."""
        rows: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and all(
                    isinstance(row.get(k), (int, float)) for k in ("prefill_s", "decode_s")
                ):
                    rows[str(row.get("id"))] = row  # a damaged row is skipped: timings are not results
        if not rows:
            return {"n": 0}
        prefill = [r["prefill_s"] for r in rows.values()]
        decode = [r["decode_s"] for r in rows.values()]
        return {
            "n": len(rows),
            "prefill_s_mean": round(sum(prefill) / len(rows), 4),
            "decode_s_mean": round(sum(decode) / len(rows), 4),
            "total_s": round(sum(prefill) + sum(decode), 3),
        }


#: Config keys that do not change results (excluded from the config hash).  ``task.num_samples`` is the run's
#: extent, not its identity: sample i never depends on it, so a run asked for more samples continues the same folder
#: and one asked for fewer reports on the first N (:class:`kvbench.run.runner.Runner`) -- unless the method calibrates
#: on a share of the samples (:func:`count_is_identity`).
NON_SEMANTIC_KEYS = (
    "task.num_samples",
    "wandb",
    "run.progress",
    "run.print_table",
    "run.threads",
    "run.output_root",
    "run.experiment",
    "run.sample_cache",
    # Sharing a sweep's prefills changes no token (issue #56, tests/run/test_shared_sweep.py).
    "run.share_prefill",
    "run.prefill_group_size",
    "run.shared_tasks",
    "run.shared_task",
    "run.changed_inputs",
    # Placement does not change the tokens (tests/models/test_device_map.py); a run may resume on another map.
    "model.device_map",
    "model.offload_folder",
)


def count_is_identity(cfg: DictConfig) -> bool:
    """Whether the method's results depend on how many samples a dataset has: a method that calibrates on a share
    of the task's samples (``method.params.sampling``, XKV's sampled mode) keeps ``task.num_samples`` in the run's
    identity, since sample i of a 10-sample run and of a 50-sample run are compressed differently."""
    return bool(OmegaConf.select(cfg, "method.params.sampling", default=False))


def ignored_keys(cfg: DictConfig) -> tuple[str, ...]:
    """:data:`NON_SEMANTIC_KEYS`, less ``task.num_samples`` where :func:`count_is_identity`; plus ``run.decode_batch``
    at its default 1 (runs made before the setting existed keep their hash; a batched run is its own run, since GPU
    matrix products may round differently at batch N)."""
    keys = tuple(key for key in NON_SEMANTIC_KEYS if key != "task.num_samples" or not count_is_identity(cfg))
    if OmegaConf.select(cfg, "run.decode_batch", default=1) == 1:
        keys += ("run.decode_batch",)
    return keys


#: The session knobs (``method.<knob>`` until issue #57 moved them to ``method.params.<knob>``) with their defaults:
#: the values a run recorded then for a knob its config does not set.
SESSION_KNOBS_OFF: dict[str, Any] = {
    "window": 32,
    "window_in_budget": True,
    "gqa_granularity": "kv_head",
    "gqa_agg": "mean",
    "sink_tokens": 0,
    "decode_eviction": False,
}
#: Families with a knob of their own named as a session knob (NACL's ``sink_tokens``, its protected tier, was
#: ``method.params.sink_tokens`` beside the session's ``method.sink_tokens``): it stays in ``params``.
FAMILY_OWN_KNOBS: dict[str, tuple[str, ...]] = {"nacl": ("sink_tokens",)}
#: The scorer knobs that were ``MethodConfig`` fields (``method.<knob>``) until issue #41 moved them to the families
#: that read them (``method.params.<knob>``), with the schema's defaults of then.
LEGACY_METHOD_KNOBS: dict[str, Any] = {
    "kernel_size": 7,
    "pooling": "max",
    "pool_padding": "include",
    "gqa_reduce": None,
    "score_dtype": "model",
}
_VOTE_KNOBS = tuple(LEGACY_METHOD_KNOBS)
#: The families whose params declare those knobs since then (``method.params.<knob>`` was ``method.<knob>``).
LEGACY_KNOB_FAMILIES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("snapkv", "pyramidkv", "ada_snapkv", "ada_pyramidkv", "cake", "h2o"), _VOTE_KNOBS),
    "xkv": ("kernel_size", "pooling", "pool_padding"),
    "tova": ("score_dtype",),
    "ahakv": ("score_dtype",),
}
#: A knob the presets of a family set though the family never read it (TOVA's presets said ``kernel_size: 1``).
LEGACY_PRESET_VALUES: dict[str, dict[str, Any]] = {"tova": {"kernel_size": 1}}


#: Fields every one-class method gained after its hashes were recorded, with the value that turns them off: a config
#: with the field off hashes as one from before the field existed (kvpress's ``decode_ratio``, issue #43).
PARAMS_ADDED_OFF: dict[str, Any] = {"decode_ratio": 0.0}
#: The wrapper knobs over any scorer (:mod:`kvbench.eviction.wrappers`) with the values that turn them off, and the
#: paper families that gained them after their hashes were recorded (issue #41 item 3): such a family's config with
#: every one of these off hashes as one from before (``method.params.allocation=uniform`` on ``snapkv_kvpress``).
WRAPPER_KNOBS_OFF: dict[str, Any] = {
    "allocation": "uniform",
    "layers": "uniform",
    "selection": "topk",
    "selection_length": 0,
    "rescale": "none",
    "decode_interval": 0,
    "decode_target": 0,
    "decode_ratio": 0.0,
}
FAMILIES_GAINED_WRAPPERS = frozenset({"snapkv"})
#: Other knobs such a family gained with them, and their values of before (SnapKV's ``row_reduce``).
KNOBS_GAINED_WITH_WRAPPERS: dict[str, Any] = {"row_reduce": "sum"}


#: Task options added after their task's hashes were recorded, with the value that keeps the old behaviour: a config
#: with such an option at that value hashes as one from before the option existed (issue #54: SCBench's
#: ``fixed_scdq_kv`` changes scores only, never predictions).
TASK_OPTIONS_ADDED_OFF: dict[str, Any] = {"fixed_scdq_kv": False}


def _without_added_task_options(container: dict[str, Any]) -> dict[str, Any]:
    task = container.get("task")
    options = task.get("options") if isinstance(task, dict) else None
    if not isinstance(options, dict) or not any(key in options for key in TASK_OPTIONS_ADDED_OFF):
        return container
    kept = {k: v for k, v in options.items() if not (k in TASK_OPTIONS_ADDED_OFF and v == TASK_OPTIONS_ADDED_OFF[k])}
    return {**container, "task": {**task, "options": kept}}


def scale_free_row_reduce(method: dict[str, Any]) -> bool:
    """Whether SnapKV's ``row_reduce: mean`` ranks exactly as ``sum`` (so a run of either keeps the hash of before
    the knob, issue #54): a window of a power of two (the mean is the sum divided by 2^n, exact in binary floating
    point through the pooling, the GQA mean and any rounding to the model dtype; only scores below float32's normal
    range, 2^-126, could round otherwise), and no wrapper that reads the scores' scale (ChunkKV's ``max + 1`` window
    padding before its chunk means, CriticalKV's ``score + epsilon``); top-k, Ada-KV's shares, BlockPress, the layer
    schedules and the decoding presses rank only."""
    params = dict(method.get("params") or {})
    window = method.get("window")
    scale_read = params.get("selection") == "chunkkv" or params.get("rescale", "none") != "none"
    power_of_two = isinstance(window, int) and window > 0 and window & (window - 1) == 0
    return params.get("row_reduce") == "mean" and not scale_read and power_of_two


def canonical_config(container: dict[str, Any]) -> dict[str, Any]:
    """The resolved config ``container`` in the layout it had before issue #41 (hashes and comparisons are computed
    from it, so every existing run keeps its hash: docs/results.md): the session knobs (:data:`SESSION_KNOBS_OFF`,
    ``method.params.<knob>`` since issue #57) back at ``method.<knob>`` (their default where the config does not set
    them), then the scorer knobs of :data:`LEGACY_METHOD_KNOBS`
    back at ``method.<knob>``, taken from ``method.params`` for the families that declare them
    (:data:`LEGACY_KNOB_FAMILIES`), else at the value a run of the family recorded then (the schema's default, or
    :data:`LEGACY_PRESET_VALUES`), and without the fields of :data:`PARAMS_ADDED_OFF` that are off (and, for
    :data:`FAMILIES_GAINED_WRAPPERS`, the wrapper knobs of :data:`WRAPPER_KNOBS_OFF` that are off, and
    :func:`scale_free_row_reduce`), without a ``kv_quant`` node whose scheme is ``none`` (unquantized runs keep
    their hashes), plus the :mod:`kvbench.storage.revisions` lines that apply (``revisions``).  A config already in
    that layout is returned as it is.  Task options of :data:`TASK_OPTIONS_ADDED_OFF` at their old behaviour are
    dropped."""
    container = _without_added_task_options(container)
    kv_quant = container.get("kv_quant")
    if isinstance(kv_quant, dict) and kv_quant.get("scheme", "none") == "none":  # unquantized storage: as before
        container = {key: value for key, value in container.items() if key != "kv_quant"}
    method = container.get("method")
    if not isinstance(method, dict) or "params" not in method:
        return container
    if "window" not in method:  # issue #57's layout: every knob under params
        params = dict(method["params"] or {})
        own = FAMILY_OWN_KNOBS.get(method.get("family"), ())
        session = {
            knob: default if knob in own else params.pop(knob, default) for knob, default in SESSION_KNOBS_OFF.items()
        }
        method = {**method, **session, "params": params}
        container = {**container, "method": method}
    if all(knob in method for knob in _VOTE_KNOBS):
        return container
    family = method.get("family")
    gained = {**WRAPPER_KNOBS_OFF, **KNOBS_GAINED_WITH_WRAPPERS} if family in FAMILIES_GAINED_WRAPPERS else {}
    added_off = {**PARAMS_ADDED_OFF, **gained}
    params = {
        key: value
        for key, value in dict(method["params"] or {}).items()
        if not (key in added_off and value == added_off[key])
    }
    if family in FAMILIES_GAINED_WRAPPERS and scale_free_row_reduce(method):
        params.pop("row_reduce", None)
    legacy = {**LEGACY_METHOD_KNOBS, **LEGACY_PRESET_VALUES.get(family, {})}
    for knob in LEGACY_KNOB_FAMILIES.get(family, ()):
        if knob in params:
            legacy[knob] = params.pop(knob)
    revisions = prediction_revisions(container)
    return {
        **container,
        "method": {**legacy, **method, "params": params},
        **({"revisions": revisions} if revisions else {}),
    }


def config_hash(cfg: DictConfig) -> str:
    """SHA-256 (first 16 hex) of the resolved config in its canonical form (:func:`canonical_config`) without the
    non-semantic keys (:func:`ignored_keys`)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    container = canonical_config(container)  # type: ignore[arg-type]
    for dotted in ignored_keys(cfg):
        node: Any = container
        *parents, leaf = dotted.split(".")
        for parent in parents:
            node = node.get(parent, {})
        if isinstance(node, dict):
            node.pop(leaf, None)
    blob = json.dumps(container, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_differences(folder: Path, cfg: DictConfig) -> list[str]:
    """``key: old -> new`` for every setting that changes results (:data:`NON_SEMANTIC_KEYS` and ``wandb`` aside)
    between the run stored in ``folder`` (its ``config.yaml``) and ``cfg``; empty when they are the same run."""
    old_cfg = read_config_yaml(folder / CONFIG_FILE) or OmegaConf.create()
    old, new = (canonical_config(OmegaConf.to_container(c, resolve=True)) for c in (old_cfg, cfg))  # type: ignore[arg-type]
    differences = _differences(old, new, prefix="", ignored=ignored_keys(cfg))
    if not differences and new.get("revisions"):
        # The same settings, but a fix changed their predictions since (kvbench.storage.revisions): never the same run.
        differences = [f"revisions: fixed since that run: {'; '.join(new['revisions'])}"]
    return differences


def _differences(old: Any, new: Any, prefix: str, ignored: tuple[str, ...]) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        diffs = []
        for key in sorted(set(old) | set(new)):
            if f"{prefix}{key}" in ignored or (key == "wandb" and not prefix):
                continue
            diffs += _differences(old.get(key), new.get(key), f"{prefix}{key}.", ignored)
        return diffs
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def same_run(folder: Path, recorded_hash: str | None, cfg: DictConfig, cfg_hash: str) -> bool:
    """Whether the run recorded in ``folder`` (``run_meta.json``'s ``recorded_hash``) is the run ``cfg`` describes:
    the same hash, or -- for a folder written when the hash still covered ``task.num_samples`` -- a stored
    ``config.yaml`` that differs from ``cfg`` in nothing that changes results."""
    if recorded_hash == cfg_hash:
        return True
    return (
        recorded_hash is not None
        and read_config_yaml(folder / CONFIG_FILE) is not None
        and not config_differences(folder, cfg)
    )


def extent_covered(metrics: dict[str, Any], num_samples: int | None) -> bool:
    """Whether a dataset's ``metrics.json`` was computed over at least the first ``num_samples`` samples (``None``:
    all of them); files written before ``num_samples_requested`` was recorded count as covering any extent."""
    if "num_samples_requested" not in metrics:
        return True
    requested = metrics["num_samples_requested"]
    return requested is None or (num_samples is not None and num_samples <= int(requested))
