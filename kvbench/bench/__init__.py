"""The performance bench: prefill time, decode ms/token, peak memory and cache bytes against context length, per
method versus the full cache, on random-weight models of real architectures (no download); plus storage
micro-benchmarks (append cost vs cache size, stored bytes vs kept tokens) and the papers' efficiency tables rebuilt
from the measurements (CAKE Table 13 + Fig. 7, Ada-KV max context under a memory limit, XKV Table IV).

Modules by job: :mod:`~kvbench.bench.random_models` (random-weight architectures, method presets through Hydra),
:mod:`~kvbench.bench.timing` (device sync, bandwidth), :mod:`~kvbench.bench.timed_cells` (one timed prefill + decode),
:mod:`~kvbench.bench.micro` (storage micro-benchmarks), :mod:`~kvbench.bench.efficiency_tables` (the papers' tables),
:mod:`~kvbench.bench.speed_plots`, :mod:`~kvbench.bench.plan` (presets and the driver writing every output).

``scripts/bench.py`` is the command line; ``make bench`` runs the CPU preset.  Everything here measures wall-clock
time, so it is not part of the unit tests (``tests/bench/test_bench.py`` only checks the plumbing on a tiny model).
"""

from kvbench.bench.efficiency_tables import rebuild_tables, write_csv
from kvbench.bench.micro import append_scaling, stored_bytes, targets
from kvbench.bench.plan import BenchPlan, preset, rebuild_from_csv, run_plan
from kvbench.bench.random_models import ARCH_MODELS, ARCHITECTURES, build_random_model, load_method
from kvbench.bench.speed_plots import plot_all
from kvbench.bench.timed_cells import RunSpec, run_cell
from kvbench.bench.timing import PEAK_BANDWIDTH_GBPS, device_name, peak_bandwidth, resolve_device
