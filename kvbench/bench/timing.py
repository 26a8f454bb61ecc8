"""Timing helpers of the bench: device synchronisation, the device's name and its peak memory bandwidth."""

from __future__ import annotations

import math
import platform
import time

import torch

#: Peak memory bandwidth (GB/s) by device-name substring, for the decode bandwidth fraction.
PEAK_BANDWIDTH_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0, "A100": 1935.0, "L40S": 864.0}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """Human-readable device name (GPU model, or the CPU's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def measure_copy_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Measured device-memory copy bandwidth in GB/s (read + write bytes / time, best of ``repeats``)."""
    src = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def peak_bandwidth(device: torch.device, override: float | None = None) -> tuple[float, str]:
    """(GB/s, source): ``override``, the datasheet value of a known GPU, else the measured copy bandwidth."""
    if override:
        return override, "given"
    name = device_name(device)
    for key, value in PEAK_BANDWIDTH_GBPS.items():
        if key in name:
            return value, f"datasheet {key}"
    return measure_copy_bandwidth(device), "measured copy"


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)
