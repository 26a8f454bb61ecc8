#!/usr/bin/env python
"""Validate kvbench's CUDA path in ONE call on a lent GPU machine (issue #26): phases in order of value under an
internal deadline, every row written and flushed as soon as it exists, at most 8 files under ``--out``.

Phases (each gets a share of the time left when it starts; a unit that would overrun its phase's share is written
as ``skipped``, so later phases still run):

1. ``env``      -> ``env.json``: versions, GPU, ``varlen_attn`` paged-KV capability and the attention plans it
   gives, measured copy bandwidth and the peak used for bandwidth fractions.
2. ``tests``    -> ``pytest.log``: the GPU-relevant tests in a background subprocess (compiled Triton on CUDA),
   started at once and collected at the end.
3. ``kernels``  -> ``kernels.csv``: every Triton kernel against its torch implementation at real sizes (32K / 128K
   tokens, head dim 128, ragged per-head lengths, keys in the model's transposed ``[S, H, D] -> [H, S, D]`` layout).
4. ``parity``   -> ``parity.csv``: paged vs torch backend logits on the Mistral-7B architecture (random bf16
   weights), teacher-forced on the same tokens: SnapKV prefill eviction, a question chunk, decoding.
5. ``e2e``      -> ``e2e.csv``: every method family end to end through :func:`kvbench.evaluate` (RULER at 32K and
   1024L; a LongBench fixture at a budget that evicts).
6. ``decode``   -> ``bench.csv`` (``scripts/bench.py --from-csv`` reads it): decode ms/token, bandwidth fraction,
   prefill with eviction / full prefill and peak memory at 32K and 128K for full, SnapKV, Ada-SnapKV, CAKE.
7. ``batch``    -> ``batch.csv``: batched decoding (``run.decode_batch``, issue #33) on the Llama-3.1-8B architecture
   with the real Llama-3 tokenizer: per (method, batch size), whether each sample's greedy tokens and text equal batch
   1's (the first differing step), decode tokens/s, the speed-up over batch 1 and peak memory, all through the
   runner's own functions (batch 1: :func:`kvbench.inference.generate.generate`; above:
   :func:`kvbench.inference.batched_decode.generate_batched`, which decodes in one shared page pool per layer where
   the model and method allow, issue #46: ``decode_path`` says ``pooled`` or ``rows``).
8. ``llama``    -> rows in ``parity.csv`` / ``e2e.csv``: the Llama-3.1-8B architecture, last.

``phases.csv`` logs each phase (status, seconds, why skipped or stopped).  Every row records whether all logits were
finite and the paged attention's calls per path and fallbacks (:mod:`kvbench.kernels.paths`).  SIGINT, SIGTERM and
the script's own SIGALRM (``--deadline`` + 20 s) stop it cleanly: the files keep every row written so far.

On the GPU machine (docs/performance.md, "GPU validation")::

    bash scripts/gpu_session.sh            # installs the carried .whl/ folder, then runs this script

CPU dry run (2-layer slices, Triton interpreter; ``make gpu-dry-run``), and the seconds-long one of the tests::

    python scripts/gpu_validate.py --small --device cpu --out results/bench/gpu-dry-run
    python scripts/gpu_validate.py --small --device cpu --small-arch tiny --methods snapkv cake --out /tmp/dry
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_validation package beside this script
from gpu_validation.batch import StepLogits, batch_requests, batch_row, generate_outputs, replace_tokens
from gpu_validation.kernels import KERNEL_CHECKS, WARM_TIMING
from gpu_validation.plumbing import Clock, FiniteLogits, Rows, Stop, raise_stop

#: Phases in order of value, with their weight in the time split.
PHASES = {"env": 0.02, "kernels": 0.1, "parity": 0.1, "e2e": 0.24, "decode": 0.22, "batch": 0.2, "llama": 0.12}
#: One conf/method preset per family.
FAMILIES = ["streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "ada_snapkv", "cake", "ahakv", "xkv", "nacl"]
DECODE_METHODS = ["full", "snapkv", "ada_snapkv", "cake"]
#: Context lengths of the kernel and decode phases (``--contexts`` replaces both).
REAL_CONTEXTS, SMALL_CONTEXTS = [32768, 131072], [256, 512]
GPU_TESTS = ["tests/kernels/test_kernels.py", "tests/cache/test_paged.py", "tests/methods/test_fused_scoring.py",
             "tests/attention/test_cache_attention.py", "tests/kernels/test_paths.py"]  # fmt: skip
#: Architecture -> (tokenizer family, chat template, conf/model preset) for kvbench.evaluate.
ARCH_PROMPTS: dict[str, tuple[str, str | None, str | None]] = {
    "mistral-7b": ("mistral-v3", "mistral-v0.3", "mistral-7b-instruct-v0.3"),
    "mistral-7b-2l": ("mistral-v3", "mistral-v0.3", "mistral-7b-instruct-v0.3"),
    "llama3.1-8b": ("llama3", "llama3.1", "llama3.1-8b-instruct"),
    "llama3.1-8b-2l": ("mistral-v1", None, None),  # the slice's 32K vocabulary is too small for Llama-3's
    "tiny": ("byte", None, None),
}
ROW_FIELDS = ["status", "seconds", "finite", "attention_calls", "fallbacks", "error"]
FILES = {
    "kernels": ["kernel", "tokens", "shape", "dtype", "max_rel_err", "tolerance", "ok", "triton_ms", "torch_ms"],
    "parity": ["arch", "backend", "page_size", "context", "steps", "max_abs_diff", "logit_scale", "argmax_agree", "ok"],
    "e2e": ["arch", "method", "task", "budget", "samples", "context_tokens", "allocation_exact", "kept_fraction",
            "evicted"],
    "batch": ["arch", "method", "budget", "decode_batch", "decode_path", "samples", "prompt_tokens", "max_new_tokens",
              "device", "dtype", "identical_tokens_fraction", "identical_text_fraction", "identical", "first_diff_step",
              "max_abs_logit_diff", "logit_scale",
              "decode_tokens", "decode_s", "decode_tok_s", "speedup_vs_1", "prefill_s_mean", "peak_mem_bytes"],
    "phases": ["phase", "status", "seconds", "detail"],
}  # fmt: skip
#: The batch phase: methods (in order of value), decode batch sizes after batch 1, and the sizes of the real run and of
#: ``--small`` (samples, prompt tokens, new tokens, budget).
BATCH_METHODS = ["snapkv", "full", "h2o"]
BATCH_SIZES, SMALL_BATCH_SIZES = [16, 8], [4, 2]
BATCH_WORK, SMALL_BATCH_WORK = (16, 3072, 32, "1024L"), (4, 160, 6, "64L")


class Validation:
    """The phases; see the module docstring."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.out: Path = args.out
        self.device = torch.device(args.device)
        # The tiny model runs in float32 on CPU (seconds); the 2-layer slices in bfloat16, like the real run.
        self.dtype = torch.float32 if args.small and args.small_arch == "tiny" else torch.bfloat16
        self.clock = Clock(args.deadline, PHASES)
        self.rows = {
            name: Rows(self.out / f"{name}.csv", fields if name == "phases" else [*fields, *ROW_FIELDS])
            for name, fields in FILES.items()
        }
        self.bench_rows: Rows | None = None
        self.tests: subprocess.Popen | None = None
        self.peak_gbps = 0.0
        self.mistral = "mistral-7b" if not args.small else args.small_arch
        self.llama = "llama3.1-8b" if not args.small else ("tiny" if args.small_arch == "tiny" else "llama3.1-8b-2l")
        self.contexts = SMALL_CONTEXTS if args.small else REAL_CONTEXTS
        self.models: dict[str, Any] = {}

    # ------------------------------------------------------------------ helpers
    @contextmanager
    def unit(self, rows: Rows, row: dict[str, Any], watch: FiniteLogits | None = None) -> Iterator[dict[str, Any]]:
        """Run one unit: skipped if it would overrun the phase's share; its row is written whatever happens (an
        error is a result: the next unit still runs; a Stop is re-raised after the row is written)."""
        from kvbench.kernels.paths import ATTENTION_RECORD

        if not self.clock.fits():
            rows.write({**row, "status": "skipped", "error": "would overrun the phase's share of the deadline"})
            yield {"skip": True}
            return
        ATTENTION_RECORD.reset()
        if watch is not None:
            watch.reset()
        start = time.monotonic()
        result: dict[str, Any] = {"skip": False}
        status, error = "ok", ""
        try:
            yield result
        except Stop:
            status, error = "stopped", "stopped by a signal"
            raise
        except Exception as err:  # a failing unit is a result; the next units still run
            status, error = "error", f"{type(err).__name__}: {err}"[:400]
            traceback.print_exc()
        finally:
            seconds = time.monotonic() - start
            self.clock.note_unit(seconds)
            record = ATTENTION_RECORD.summary()
            finite = result.get("finite", watch.value() if watch is not None and status == "ok" else "")
            final = {**row, **{k: v for k, v in result.items() if k not in ("skip", "finite")}}
            final.update(status=status, seconds=round(seconds, 3), finite=finite, error=error)
            final.update(attention_calls=record["calls"], fallbacks=record["fallbacks"])
            rows.write(final)
            print(json.dumps({k: final.get(k) for k in [*list(row)[:4], "status", "seconds", "error"]}), flush=True)

    def model(self, arch: str) -> Any:
        """The random-weight model of ``arch`` (one at a time on the device)."""
        import torch

        from kvbench.bench.random_models import build_random_model

        if arch not in self.models:
            self.models.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.models[arch] = build_random_model(arch, self.device, self.dtype)
        return self.models[arch]

    def tokenizer(self, arch: str) -> Any:
        """The tokenizer ``arch`` is run with (:data:`ARCH_PROMPTS`): the real family's, or the byte-level one."""
        from kvbench.models.loading import builtin_tokenizer
        from kvbench.models.tokenizers import build_tokenizer

        family, template, _ = ARCH_PROMPTS[arch]
        return builtin_tokenizer("tiny-random-llama") if family == "byte" else build_tokenizer(family, template)

    # ------------------------------------------------------------------ phases
    def phase_env(self) -> str:
        import torch
        import transformers

        from kvbench.bench.timing import device_name, measure_copy_bandwidth, peak_bandwidth
        from kvbench.kernels.paths import capability_summary, plan_attention

        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        cuda = self.device.type == "cuda"
        copy = measure_copy_bandwidth(self.device, megabytes=1024 if cuda else 64)
        self.peak_gbps, source = peak_bandwidth(self.device, self.args.peak_gbps)
        plans = {
            f"page{page}_{str(dtype)[6:]}": vars(plan_attention(self.device, dtype, page, 128))
            for page in (16, 256)
            for dtype in (torch.bfloat16, torch.float32)
        }
        env = {
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "triton": triton_version,
            "triton_interpret": os.environ.get("TRITON_INTERPRET"),
            "device": device_name(self.device),
            "gpu_memory_gib": round(torch.cuda.get_device_properties(self.device).total_memory / 2**30, 1)
            if cuda
            else None,
            "compute_capability": list(torch.cuda.get_device_capability(self.device)) if cuda else None,
            "attention_capability": capability_summary(),
            "attention_plans_head_dim_128": plans,
            "copy_bandwidth_gbps": round(copy, 1),
            "peak_bandwidth_gbps": round(self.peak_gbps, 1),
            "peak_bandwidth_source": source,
        }
        (self.out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
        return (
            f"{env['device']}, torch {torch.__version__}, varlen paged {env['attention_capability']['varlen_paged_kv']}"
        )

    def start_tests(self) -> None:
        """The GPU tests in the background (``tests`` phase), their output to ``pytest.log``."""
        targets = self.args.pytest or (GPU_TESTS if not self.args.small else ["tests/attention/test_paths.py"])
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu or not slow", *targets]
        log = (self.out / "pytest.log").open("w")
        log.write(" ".join(command) + "\n")
        log.flush()
        self.tests = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._tests_started = time.monotonic()

    def finish_tests(self, wait: float) -> str:
        """Wait up to ``wait`` s for the tests, then stop them; the phase's status from pytest's exit."""
        if self.tests is None:
            return "not started"
        try:
            code = self.tests.wait(timeout=max(0.0, wait))
        except subprocess.TimeoutExpired:
            return "stopped at the deadline (see pytest.log)"
        finally:
            if self.tests.poll() is None:  # never leave the tests running behind the script (a signal included)
                os.killpg(self.tests.pid, signal.SIGTERM)
                self.tests.wait()
        return f"exit {code} after {time.monotonic() - self._tests_started:.0f} s"

    def phase_kernels(self) -> str:
        from kvbench import kernels

        if not kernels.triton_available():
            return "skipped: triton is not installed"
        small = self.args.small
        heads_q, heads, dim, window = (4, 2, 16, 8) if small else (32, 8, 128, 32)
        for tokens in self.contexts:
            for name, check in KERNEL_CHECKS.items():
                row = {"kernel": name, "tokens": tokens, "dtype": str(self.dtype)[6:]}
                with self.unit(self.rows["kernels"], row) as result:
                    if not result["skip"]:
                        result.update(check(tokens, heads_q, heads, dim, window, self.dtype, self.device))
        return f"{self.rows['kernels'].count} rows"

    def parity(self, arch: str, page_sizes: list[int]) -> None:
        """Teacher-forced logits of the paged backend (each page size) against the torch backend's."""
        import torch

        from kvbench.bench.random_models import load_method
        from kvbench.budget import parse_budget
        from kvbench.cache.kv_cache import KVBenchCache
        from kvbench.inference.prefill import forward_logits, prefill

        context, question, steps = (300, 16, 8) if self.args.small else (8192, 32, 32)
        budget = "64L" if self.args.small else "1024L"
        model = self.model(arch)
        config = model.config
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(10, int(config.vocab_size), (context + question + steps,), generator=gen).tolist()
        reference: torch.Tensor | None = None
        for backend, page in [("torch", None), *[("paged", p) for p in page_sizes]]:
            row = {"arch": arch, "backend": backend, "page_size": page or "", "context": context, "steps": steps}
            with self.unit(self.rows["parity"], row) as result, torch.inference_mode():
                if result["skip"]:
                    continue
                # The context in one forward, compressed, then the question on top (question-agnostic).
                state = prefill(
                    model, ids[:context], ids[context : context + question], method=load_method("snapkv", arch),
                    budget=parse_budget(budget), question_mode="agnostic", prefill_chunk=0,
                    cache=KVBenchCache(int(config.num_hidden_layers), backend=backend, page_size=page),
                )  # fmt: skip
                assert state.logits is not None
                logits = [state.logits]
                state.session.begin_decode()
                for step in range(context + question, context + question + steps):
                    logits.append(
                        forward_logits(model, ids[step : step + 1], step, state.cache, state.session, self.device)[-1]
                    )
                stacked = torch.stack(logits).float().cpu()
                result["finite"] = bool(torch.isfinite(stacked).all())
                if reference is None:
                    reference = stacked
                    result["logit_scale"] = float(stacked.abs().max())
                    continue
                diff = float((stacked - reference).abs().max())
                scale = float(reference.abs().max())
                agree = float((stacked.argmax(-1) == reference.argmax(-1)).float().mean())
                result.update(max_abs_diff=diff, logit_scale=scale, argmax_agree=agree)
                result["ok"] = result["finite"] and diff <= 0.1 * scale + 1e-3

    def phase_parity(self) -> str:
        self.parity(self.mistral, [16, 256])
        return f"{self.rows['parity'].count} rows"

    def e2e(self, arch: str, methods: list[str]) -> None:
        """Each family through kvbench.evaluate on a RULER sample and a LongBench fixture sample."""
        import kvbench

        preset = ARCH_PROMPTS[arch][2]
        tokenizer = self.tokenizer(arch)
        model = self.model(arch)
        watch = FiniteLogits(model)
        small = self.args.small
        tasks = {
            "ruler": ("ruler", "128L" if small else "1024L",
                      [f"task.length={1024 if small else 32768}", "task.datasets=[niah_single_1]"]),
            "longbench": ("longbench", "64L" if small else "128L",
                          ["task.data_dir=fixtures", "task.datasets=[qasper]"]),
        }  # fmt: skip
        try:
            for method in methods:
                for name, (task, budget, overrides) in tasks.items():
                    row = {"arch": arch, "method": method, "task": name, "budget": budget}
                    with self.unit(self.rows["e2e"], row, watch) as result:
                        if result["skip"]:
                            continue
                        evaluation = kvbench.evaluate(
                            model, tokenizer, method=method, budget=budget, task=task, limit=1, model_config=preset,
                            overrides=overrides, progress=False,
                        )  # fmt: skip
                        cached = [r["cache"] for rows in evaluation.predictions.values() for r in rows]
                        kept = [r.mean_kept_fraction for r in evaluation.results]
                        result.update(
                            samples=len(cached),
                            context_tokens=max((c.get("context_tokens", 0) for c in cached), default=0),
                            allocation_exact=bool(cached)
                            and all(c["requested_per_head"] == c["achieved_per_head"] for c in cached),
                            kept_fraction=round(sum(kept) / max(1, len(kept)), 4),
                            evicted=any(c.get("evicted") for c in cached),
                        )
        finally:
            watch.remove()

    def phase_e2e(self) -> str:
        self.e2e(self.mistral, self.args.methods or FAMILIES)
        return f"{self.rows['e2e'].count} rows"

    def phase_decode(self) -> str:
        import torch

        from kvbench.bench.random_models import load_method
        from kvbench.bench.timed_cells import RunSpec, run_cell
        from kvbench.budget import parse_budget

        small = self.args.small
        arch, tokens, budget = self.mistral, (4 if small else 32), ("32L" if small else "1024L")
        model = self.model(arch)
        watch = FiniteLogits(model)
        fields = ["arch", "device", "dtype", "backend", "method", "budget", "context", "prefill_chunk",
                  "scoring_impl", "decode_tokens", "prefill_s", "decode_s", "decode_ms_per_token",
                  "cache_bytes_after_prefill", "kept_tokens_after_prefill", "cache_bytes_final", "kept_tokens_final",
                  "stored_bytes_ratio", "peak_prefill_cache_bytes", "peak_mem_bytes", "weight_bytes_read",
                  "cache_bytes_read_per_token", "decode_bandwidth_gbps", "decode_bandwidth_fraction",
                  "prefill_vs_full"]  # fmt: skip
        self.bench_rows = Rows(self.out / "bench.csv", [*fields, *ROW_FIELDS])
        from kvbench.bench.timing import device_name

        with torch.inference_mode():  # warm-up: compile the kernels before anything is timed
            warm = RunSpec(arch, "snapkv", 256, "32L", 2, backend="paged")
            run_cell(model, load_method("snapkv", arch), parse_budget("32L"), warm, self.device)
        full_prefill: dict[int, float] = {}
        try:
            for context in self.contexts:
                for method in DECODE_METHODS:
                    spec = RunSpec(arch, method, context, budget, tokens, backend="paged")
                    row = {"arch": arch, "method": method, "context": context, "device": device_name(self.device),
                           "dtype": str(self.dtype)[6:], "budget": "full" if method == "full" else budget}  # fmt: skip
                    with self.unit(self.bench_rows, row, watch) as result, torch.inference_mode():
                        if result["skip"]:
                            continue
                        cell = run_cell(model, load_method(method, arch), parse_budget(row["budget"]), spec,
                                        self.device)  # fmt: skip
                        bytes_read = cell["weight_bytes_read"] + cell["cache_bytes_read_per_token"]
                        per_token_s = cell["decode_ms_per_token"] / 1000
                        gbps = bytes_read / per_token_s / 1e9 if per_token_s > 0 else 0.0
                        if method == "full":
                            full_prefill[context] = cell["prefill_s"]
                        result.update({k: v for k, v in cell.items() if k != "backend_used"})
                        result.update(
                            backend=cell["backend_used"], decode_tokens=tokens, prefill_chunk=0, scoring_impl="auto",
                            decode_bandwidth_gbps=gbps, decode_bandwidth_fraction=gbps / self.peak_gbps,
                            prefill_vs_full=cell["prefill_s"] / full_prefill.get(context, math.nan),
                        )  # fmt: skip
        finally:
            watch.remove()
        return f"{self.bench_rows.count} rows"

    def phase_batch(self) -> str:
        """Batch 1 against batch N (``batch.csv``): identical outputs and decode speed, per method; see the module
        docstring.  The batch-1 unit of a method comes first; a batch-N unit without it is an error row."""
        import torch

        from kvbench.bench.timing import device_name
        from kvbench.inference.decode_pool import PooledBatch

        arch, small = self.llama, self.args.small
        samples, length, max_new, budget = SMALL_BATCH_WORK if small else BATCH_WORK
        sizes = SMALL_BATCH_SIZES if small else BATCH_SIZES
        methods = self.args.batch_methods
        if self.args.batch_prompt_tokens:
            length = self.args.batch_prompt_tokens
        tokenizer = self.tokenizer(arch)
        model = self.model(arch)
        watch = FiniteLogits(model)
        requests = batch_requests(tokenizer, int(model.config.vocab_size), samples, length, max_new)
        cuda = self.device.type == "cuda"
        base = {"arch": arch, "budget": budget, "samples": samples, "max_new_tokens": max_new,
                "prompt_tokens": len(requests[0].context_ids) + len(requests[0].question_ids),
                "device": device_name(self.device), "dtype": str(self.dtype)[6:]}  # fmt: skip
        references: dict[str, tuple[list[Any], float, list[Any] | None]] = {}
        recorder = StepLogits(model)
        try:
            # Warm-up (kernels compiled for batch 1 and a batch of 2 before anything is timed), a row of its own.
            warm = {**base, "method": methods[0], "decode_batch": "warm-up"}
            warm["budget"] = "full" if methods[0] == "full" else budget
            with self.unit(self.rows["batch"], warm) as result:
                if not result["skip"]:
                    short = [replace_tokens(r, 3) for r in requests[:2]]
                    generate_outputs(model, tokenizer, arch, methods[0], warm["budget"], short, 1, recorder)
                    generate_outputs(model, tokenizer, arch, methods[0], warm["budget"], short, 2, recorder)
            # Batch 1 and the largest batch of every method first, then the other sizes.
            order = [(m, size) for m in methods for size in (1, sizes[0])] + [
                (m, n) for n in sizes[1:] for m in methods
            ]
            for method, decode_batch in order:
                row = {**base, "method": method, "budget": "full" if method == "full" else budget,
                       "decode_batch": decode_batch}  # fmt: skip
                with self.unit(self.rows["batch"], row, watch) as result:
                    if result["skip"]:
                        continue
                    if decode_batch > 1 and method not in references:
                        raise RuntimeError(f"no batch-1 outputs of {method} to compare with (see its row)")
                    if cuda:
                        torch.cuda.reset_peak_memory_stats(self.device)
                    pooled_before = PooledBatch.steps_run
                    outputs, logits = generate_outputs(model, tokenizer, arch, method, row["budget"], requests,
                                                       decode_batch, recorder)  # fmt: skip
                    result.update(batch_row(outputs, logits, references.get(method)))
                    # issue #46: the shared page pool (one attention call per layer), or per-sample rows
                    pooled = PooledBatch.steps_run > pooled_before
                    result["decode_path"] = "batch1" if decode_batch == 1 else "pooled" if pooled else "rows"
                    if decode_batch == 1:
                        references[method] = (outputs, result["decode_tok_s"], logits)
                    if cuda:
                        result["peak_mem_bytes"] = torch.cuda.max_memory_allocated(self.device)
        finally:
            watch.remove()
            recorder.remove()
        return f"{self.rows['batch'].count} rows"

    def phase_llama(self) -> str:
        self.parity(self.llama, [16])
        self.e2e(self.llama, ["snapkv", "cake", "xkv"] if not self.args.methods else self.args.methods[:2])
        return "parity + e2e rows"

    # ------------------------------------------------------------------ driver
    def run(self) -> int:
        phases = [p for p in PHASES if p not in self.args.skip]
        code = 0
        if "tests" not in self.args.skip:
            self.start_tests()
        try:
            for index, name in enumerate(phases):
                self.clock.begin_phase(name, phases[index:])
                start = time.monotonic()
                if time.monotonic() >= self.clock.end:
                    self.rows["phases"].write({"phase": name, "status": "skipped", "detail": "deadline reached"})
                    continue
                try:
                    detail = getattr(self, f"phase_{name}")()
                    status = "ok"
                except Stop:
                    raise
                except Exception as err:  # a failing phase is a result; the next phases still run
                    traceback.print_exc()
                    status, detail = "error", f"{type(err).__name__}: {err}"[:400]
                seconds = round(time.monotonic() - start, 1)
                self.rows["phases"].write({"phase": name, "status": status, "seconds": seconds, "detail": detail})
                print(f"== {name}: {status} in {seconds} s: {detail}", flush=True)
        except Stop as stop:
            self.rows["phases"].write({"phase": "all", "status": "stopped", "detail": f"{stop} received"})
            code = 128 + stop.signum
        finally:
            self.models.clear()
            left = self.clock.end - time.monotonic() if code == 0 else 0.0
            detail = self.finish_tests(left)
            self.rows["phases"].write({"phase": "tests", "status": "done", "detail": detail})
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the (at most 8) files")
    parser.add_argument("--device", default="cuda", help="cuda (the real run) or cpu (the dry run)")
    parser.add_argument("--deadline", type=float, default=420.0, help="internal deadline in seconds (default 420)")
    parser.add_argument("--small", action="store_true", help="small sizes: 2-layer slices, short contexts")
    parser.add_argument("--small-arch", default="mistral-7b-2l", choices=["mistral-7b-2l", "tiny"],
                        help="--small's model (tiny: the 4-layer test model, seconds on CPU)")  # fmt: skip
    parser.add_argument("--methods", nargs="+", choices=FAMILIES, help="only these families in e2e (default: all)")
    parser.add_argument("--skip", nargs="+", default=[], choices=[*PHASES, "tests"], help="phases to leave out")
    parser.add_argument("--contexts", nargs="+", type=int, help="context lengths of the kernels and decode phases")
    parser.add_argument("--batch-methods", nargs="+", default=BATCH_METHODS, choices=["full", *FAMILIES],
                        help=f"methods of the batch phase (default: {' '.join(BATCH_METHODS)})")  # fmt: skip
    parser.add_argument("--batch-prompt-tokens", type=int, help="the batch phase's context tokens per sample "
                        f"(default {BATCH_WORK[1]}, --small {SMALL_BATCH_WORK[1]})")  # fmt: skip
    parser.add_argument("--pytest", nargs="+", help="test files of the background tests phase")
    parser.add_argument("--peak-gbps", type=float, help="peak memory bandwidth (default: datasheet or measured)")
    args = parser.parse_args(argv)
    if args.device.startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported (below)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.small and args.device.startswith("cpu"):
        os.environ.setdefault("KVBENCH_CACHE_BACKEND", "paged")  # the dry run goes through the paged cache too
        WARM_TIMING["enabled"] = False
    if args.batch_prompt_tokens is not None and args.batch_prompt_tokens < 1:
        parser.error(f"--batch-prompt-tokens {args.batch_prompt_tokens}: must be a positive number of tokens")
    if args.contexts:
        SMALL_CONTEXTS[:] = REAL_CONTEXTS[:] = args.contexts
    args.out.mkdir(parents=True, exist_ok=True)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
        signal.signal(signum, raise_stop)
    signal.alarm(int(args.deadline) + 20)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here (use --small --device cpu for a dry run)")
    try:
        return Validation(args).run()
    except Stop as stop:  # a second signal while the first was being handled
        return 128 + stop.signum
    finally:
        signal.alarm(0)


if __name__ == "__main__":
    raise SystemExit(main())
