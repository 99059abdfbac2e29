"""The device's side of running a program: what the queue layer runs for a Compute.

Preparing an artifact and enqueueing the Compute is the launch layer's job
(spyre_runtime/launch.py: run_program, prepare_kernel, launch_jobplan); the
queue itself never learns what a program is, and this module never enqueues.

A launched program owns one device allocation, laid out as in program.py:
its correction area, its temporaries, its program image. Placeholder
addresses reach the program only through the correction area.

Program distribution: the device fetches a program (instruction buffers and
its correction area) ahead of execution. `ProgramExecutable.fetch` is that
fetch; the queue layer calls it when the Compute is enqueued, unless a
Barrier ahead of it on its stream holds the fetch until the Barrier is done.
A correction area patched after the fetch began is not seen: the program runs
with the stale addresses.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import torch

from ..hardware import HARDWARE
from ..memory import device_view
from .execute import Machine
from .timing import Report, Timing
from .program import SIZE_BYTES, SLOT_BYTES, Program
from .validate import ProgramError, validate_once

@dataclass(frozen=True)
class Artifact:
    """Where a launched program lives: its device allocation (region, offset)."""

    device: int
    region: int
    offset: int


class ProgramExecutable:
    """The executor the queue layer runs for a Compute operation."""

    def __init__(self, program: Program, hardware=HARDWARE):
        validate_once(program)
        self.program = program
        self.hardware = hardware
        self._fetched: dict[Artifact, tuple[list[tuple[int, int]], dict[str, int] | None]] = {}
        self.last_report: Report | None = None

    def fetch(self, artifact: Artifact) -> None:
        """Read the correction area now (the program-distribution unit's fetch)."""
        self._fetched[artifact] = (self._read_slots(artifact), self._read_sizes(artifact))

    def _read_slots(self, artifact: Artifact) -> list[tuple[int, int]]:
        n = len(self.program.placeholders)
        raw = device_view(artifact.device, artifact.region,
                          artifact.offset + self.program.correction_offset, n * SLOT_BYTES)
        words = raw.view(torch.int64).tolist()
        return [(words[2 * i], words[2 * i + 1]) for i in range(n)]

    def _read_sizes(self, artifact: Artifact) -> dict[str, int] | None:
        """The size words after the address slots (issue 18), read by the same fetch."""
        if not self.program.sizes:
            return None
        n = len(self.program.placeholders)
        raw = device_view(artifact.device, artifact.region,
                          artifact.offset + self.program.correction_offset + n * SLOT_BYTES,
                          len(self.program.sizes) * SIZE_BYTES)
        return dict(zip(self.program.sizes, raw.view(torch.int64).tolist()))

    def run(self, artifact: Artifact) -> None:
        fetched = self._fetched.pop(artifact, None)
        slots, sizes = fetched if fetched is not None else (self._read_slots(artifact), self._read_sizes(artifact))
        buffers = {}
        for sym, (region, offset) in zip(self.program.placeholders, slots):
            if region <= 0:
                raise ProgramError(
                    f"program {self.program.name!r}: placeholder {sym.name!r} is unresolved "
                    f"(its correction slot was never written)")
            # (a buffer with a symbolic dim is bound at the bytes it has at these sizes)
            buffers[sym.name] = device_view(artifact.device, region, offset,
                                            sym.nbytes_at(sizes) if sym.sized else sym.nbytes)
        for sym in self.program.symbols:
            if sym.role == "temp":
                buffers[sym.name] = device_view(artifact.device, artifact.region,
                                                 artifact.offset + sym.offset, sym.nbytes)
        timing = Timing(self.program, self.hardware)
        Machine(self.program, buffers, self.hardware.scratchpad_bytes, timing, sizes=sizes).run()
        self.last_report = timing.finish()
        with _reports_lock:  # a resize swaps the deque: append to the current one
            _reports.append(self.last_report)

    def simulated_ns(self, artifact: Artifact) -> float:
        """The last run's simulated time: the Compute's duration on the timeline."""
        return self.last_report.simulated_ns if self.last_report is not None else 0.0


# The most recent launches' reports, oldest first. Bounded: a report is about
# 11 KB, and a process launches without end. Appending to a deque is atomic, so
# worker threads running programs need no lock.
DEFAULT_KERNEL_REPORT_WINDOW = 1024
_reports: collections.deque[Report] = collections.deque(maxlen=DEFAULT_KERNEL_REPORT_WINDOW)
_reports_lock = threading.Lock()


def kernel_reports() -> list[Report]:
    """Reports of the most recent programs run since the last reset_kernel_reports(),
    oldest first: at most kernel_report_window() of them (older ones are dropped)."""
    return list(_reports.copy())


def reset_kernel_reports() -> None:
    _reports.clear()


def kernel_report_window() -> int | None:
    """How many of the most recent reports are kept (None: all of them)."""
    return _reports.maxlen


def set_kernel_report_window(n: int | None) -> None:
    """Keep the `n` most recent reports (None keeps every one, without bound).

    The newest reports already kept stay.
    """
    global _reports
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"the kernel report window must be a positive integer or None, got {n!r}")
    with _reports_lock:
        _reports = collections.deque(_reports, maxlen=n)
