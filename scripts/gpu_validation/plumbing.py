"""The plumbing of ``scripts/gpu_validate.py``: a signal as :class:`Stop`, CSV rows written and fsynced one by one
(:class:`Rows`), the internal deadline and each phase's share (:class:`Clock`), and a finite-logits watch on the LM
head (:class:`FiniteLogits`)."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path
from typing import Any


class Stop(BaseException):
    """A signal asked the script to stop (the rows written so far stay); a BaseException, like KeyboardInterrupt,
    so no library's ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stop(signum: int, frame: Any) -> None:
    raise Stop(signum)


class Rows:
    """One CSV file, each row written, flushed and fsynced at once (a kill loses no finished row)."""

    def __init__(self, path: Path, fields: list[str]) -> None:
        self.handle = path.open("w", newline="", encoding="utf-8")
        self.writer = csv.DictWriter(self.handle, fieldnames=fields, extrasaction="ignore")
        self.writer.writeheader()
        self.count = 0

    def write(self, row: dict[str, Any]) -> None:
        self.writer.writerow({k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items()})
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.count += 1


class Clock:
    """The internal deadline and each phase's share of it (``weights``: phase -> its weight in the time split)."""

    def __init__(self, seconds: float, weights: dict[str, float]) -> None:
        self.weights = weights
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.phase_end = self.end
        self.longest_unit = 0.0

    def begin_phase(self, name: str, remaining_phases: list[str]) -> None:
        left = max(0.0, self.end - time.monotonic())
        weight = sum(self.weights[p] for p in remaining_phases)
        self.phase_end = time.monotonic() + left * self.weights[name] / weight
        self.longest_unit = 0.0

    def fits(self) -> bool:
        """Whether one more unit as long as the phase's longest so far ends within the phase's share."""
        return time.monotonic() + self.longest_unit <= self.phase_end

    def note_unit(self, seconds: float) -> None:
        self.longest_unit = max(self.longest_unit, seconds)


class FiniteLogits:
    """Whether every logit the model produced since :meth:`reset` was finite (a forward hook on the LM head; the
    flag stays on the device, so no host synchronisation per forward)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.flag = torch.ones((), dtype=torch.bool, device=model.get_output_embeddings().weight.device)
        self.handle = model.get_output_embeddings().register_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        self.flag &= torch.isfinite(output).all()

    def reset(self) -> None:
        self.flag.fill_(True)

    def value(self) -> bool:
        return bool(self.flag.item())

    def remove(self) -> None:
        self.handle.remove()
