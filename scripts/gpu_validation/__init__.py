"""The parts of ``scripts/gpu_validate.py`` with a job of their own: the batch phase's helpers (:mod:`.batch`) and
the kernel checks (:mod:`.kernels`) and the plumbing (:mod:`.plumbing`: signals, rows, deadline)."""
