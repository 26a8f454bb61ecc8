"""Where a test's tensors live for a kernel implementation: compiled Triton reads GPU memory only, so a test that
forces ``impl="triton"`` puts its tensors on CUDA when the machine has it; without CUDA they stay on the CPU and the
kernels run in the Triton interpreter (``TRITON_INTERPRET=1``, set by conftest.py).  Either way pytest is green."""

from __future__ import annotations

import torch


def kernel_device(impl: str) -> torch.device:
    """``cuda`` for ``impl="triton"`` on a CUDA machine, else ``cpu`` (torch implementations, the interpreter)."""
    return torch.device("cuda" if impl == "triton" and torch.cuda.is_available() else "cpu")
