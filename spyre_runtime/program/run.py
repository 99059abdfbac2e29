"""The device's side of running a program: what the queue layer runs for a Compute.

Preparing an artifact and enqueueing the Compute is the launch layer's job
(spyre_runtime: direct.run_program, prepare.prepare_kernel, launch.launch_jobplan); the
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
import ctypes
import struct
import threading
from dataclasses import dataclass

import torch

from ..hardware import HARDWARE
from ..memory import device_view, region_address
from . import isa, timing as _timing
from .execute import Machine, _banks, bank_cores
from .operands import STICK
from .schedule import MAX_BOUND_STEPS, BoundRun, Schedule, step_bytes
from .timing import Report, Timing
from .program import SIZE_BYTES, SLOT_BYTES, Program
from .validate import ProgramError, validate_once

_SLOT = struct.Struct("<2q")  # one address slot: (region, offset)
# Bindings remembered per program: the caching allocator hands back the same blocks, so a loop
# cycles through a few (a launch-bound loop rotating 3 outputs, run by two threads' banks: 6).
BOUND_RUNS_KEPT = 8

@dataclass(frozen=True)
class Artifact:
    """Where a launched program lives: its device allocation (region, offset), and the
    correction area its fetch reads: the program's own (None) or one the launch layer keeps
    beside it (`correction`: offset in the region), so the next launch can patch one area
    while this one's compute still reads the other."""

    device: int
    region: int
    offset: int
    correction: int | None = None

    # Hashed once: a launch looks its artifact up several times (fetch, report, binding).
    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.device, self.region, self.offset, self.correction)))

    def __hash__(self) -> int:
        return self._hash


class ProgramExecutable:
    """The executor the queue layer runs for a Compute operation.

    What a run costs on the host, kept small: the timing report depends on the program and on
    where in a stick each buffer starts (not on the data: a gather's or scatter's charge is the
    worst its index bounds allow), so it is computed once per such key and each launch gets a
    copy of it; the data instructions run in the program's static order over views bound once
    per (bound addresses, scratchpad bank) (schedule.py).
    """

    def __init__(self, program: Program, hardware=HARDWARE):
        validate_once(program)
        self.program = program
        self.hardware = hardware
        self._fetched: dict[Artifact, tuple[list[tuple[int, int]], dict[str, int] | None]] = {}
        self.last_report: Report | None = None
        self._state = _ProgramState.of(program, hardware)
        self._lock = self._state.lock
        self._placeholders = program.placeholders
        self._temps = tuple(sym for sym in program.symbols if sym.role == "temp")
        self._bank_cores = bank_cores(program)
        self._last_report_key: dict[tuple, Report] = {}  # (artifact, slots, recording) -> its report
        self._areas: dict[Artifact, ctypes.Array] = {}  # each artifact's address slots, in place

    def fetch(self, artifact: Artifact) -> None:
        """Read the correction area now (the program-distribution unit's fetch)."""
        self._fetched[artifact] = (self._read_slots(artifact), self._read_sizes(artifact))

    def _read_slots(self, artifact: Artifact) -> tuple[tuple[int, int], ...]:
        # Struct over the host-addressable bytes, not a torch view: a torch call lets go of the
        # GIL, and the fetch runs inside the launch that made the compute ready.
        area = self._areas.get(artifact)
        if area is None:
            area = self._area(artifact)
        return tuple(_SLOT.iter_unpack(area))

    def _area(self, artifact: Artifact):
        """The correction area's address slots as bytes in place (the allocation outlives this)."""
        start = artifact.correction
        if start is None:
            start = artifact.offset + self.program.correction_offset
        n = len(self._placeholders)
        area = (ctypes.c_char * (n * SLOT_BYTES)).from_address(region_address(artifact.device, artifact.region) + start)
        if len(self._areas) >= 16:
            self._areas.clear()
        self._areas[artifact] = area
        return area

    def _buffers(self, artifact: Artifact, slots, sizes: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
        buffers = {}
        for sym, (region, offset) in zip(self._placeholders, slots):
            # (a buffer with a symbolic dim is bound at the bytes it has at the launch's sizes)
            nbytes = sym.nbytes_at(sizes) if sizes is not None and sym.sized else sym.nbytes
            buffers[sym.name] = device_view(artifact.device, region, offset, nbytes)
        for sym in self._temps:
            buffers[sym.name] = device_view(artifact.device, artifact.region,
                                             artifact.offset + sym.offset, sym.nbytes)
        return buffers

    def _read_sizes(self, artifact: Artifact) -> dict[str, int] | None:
        """The size words after the address slots (issue 18), read by the same fetch."""
        if not self.program.sizes:
            return None
        n = len(self.program.placeholders)
        start = artifact.correction
        if start is None:
            start = artifact.offset + self.program.correction_offset
        k = len(self.program.sizes)
        raw = ctypes.string_at(region_address(artifact.device, artifact.region) + start + n * SLOT_BYTES,
                               k * SIZE_BYTES)
        return dict(zip(self.program.sizes, struct.unpack(f"<{k}q", raw)))

    def run(self, artifact: Artifact) -> None:
        fetched = self._fetched.pop(artifact, None)
        slots, sizes = fetched if fetched is not None else (self._read_slots(artifact), self._read_sizes(artifact))
        for sym, (region, _) in zip(self._placeholders, slots):
            if region <= 0:
                raise ProgramError(
                    f"program {self.program.name!r}: placeholder {sym.name!r} is unresolved "
                    f"(its correction slot was never written)")
        counted = None
        if self._state.reads_counts and sizes is None:
            counted = self._get_schedule()
            if counted is not None and (not counted.counted or len(counted.steps) > MAX_BOUND_STEPS):
                counted = None
        if sizes is not None or (self._state.reads_counts and counted is None):
            # Size symbols (issue 18): loop counts and the bytes each transfer moves follow the
            # launch's sizes, on which neither the static schedule nor the report cache is keyed:
            # the general interpreter, timed as it goes. Likewise loops counted on chip (issue
            # 31), which follow the data, when the schedule cannot skip their steps itself.
            timing = Timing(self.program, self.hardware, phases=self.phases(artifact, slots))
            Machine(self.program, self._buffers(artifact, slots, sizes), self.hardware.scratchpad_bytes, timing,
                    sizes=sizes).run()
            report = timing.finish()
            self.last_report = report
            with _reports_lock:
                _reports.append(report)
            return
        schedule = self._get_schedule()
        if schedule is None:  # the general interpreter, timing as it goes (it raises what the walk met)
            timing = Timing(self.program, self.hardware, phases=self.phases(artifact, slots))
            Machine(self.program, self._buffers(artifact, slots), self.hardware.scratchpad_bytes, timing).run()
            report = timing.finish()
        elif len(schedule.steps) > MAX_BOUND_STEPS:  # too long to keep bound: the interpreter, untimed
            report = self.report(artifact, slots)
            Machine(self.program, self._buffers(artifact, slots), self.hardware.scratchpad_bytes).run()
        else:
            report = self.report(artifact, slots) if counted is None else None
            bank = _banks.take(self.hardware.scratchpad_bytes, self._bank_cores)
            try:
                # (not the artifact's correction area: the buffers are the same whichever of
                # its two areas a launch patched)
                key = (artifact.device, artifact.region, artifact.offset, slots, bank.serial)
                bound_runs = self._state.bound
                bound = bound_runs.get(key)
                if bound is None:
                    bound = BoundRun(schedule, self.program, self._buffers(artifact, slots), bank)
                    with self._lock:
                        bound_runs[key] = bound
                        while len(bound_runs) > BOUND_RUNS_KEPT:
                            bound_runs.popitem(last=False)
                bound.run()
                if counted is not None:  # (the counts the loops read, for the time they make)
                    values = tuple(int(bound.machine.read(core, _word(addr, dtype), ()).reshape(-1)[0])
                                   for core, addr, dtype in counted.count_words)
            finally:
                _banks.give(bank)
            if counted is not None:
                report = self.counted_report(artifact, slots, dict(zip(counted.count_words, values)))
        self.last_report = report
        with _reports_lock:  # a resize swaps the deque: append to the current one
            _reports.append(report)

    def mean_step_bytes(self) -> float:
        """What one data instruction's operands span on average: the size of the torch ops a run
        is made of. From the schedule (weighted by how often each step runs) when the program
        has one; otherwise over its instructions once each."""
        state = self._state
        if state.mean_step_bytes is None:
            schedule = self._get_schedule() if not self.program.sizes else None
            if schedule is not None:
                state.mean_step_bytes = schedule.mean_step_bytes
            else:
                spans = [step_bytes(ins) for core in self.program.cores for _, unit in core.units for ins in unit]
                state.mean_step_bytes = sum(spans) / max(len(spans), 1)
        return state.mean_step_bytes

    def _get_schedule(self) -> Schedule | None:
        state = self._state
        if state.schedule is None:
            with self._lock:
                if state.schedule is None:
                    try:
                        schedule = Schedule(self.program, self.hardware.scratchpad_bytes)
                    except ProgramError:
                        schedule = False  # e.g. a deadlock: the interpreter raises it, after what it ran
                    state.schedule = schedule
        return state.schedule or None

    def phases(self, artifact: Artifact, slots) -> dict[str, int]:
        """Where in a stick each device buffer starts: what the timing depends on besides the program."""
        phases = {sym.name: offset % STICK for sym, (_, offset) in zip(self._placeholders, slots)}
        for sym in self._temps:
            phases[sym.name] = (artifact.offset + sym.offset) % STICK
        return phases

    def report(self, artifact: Artifact, slots) -> Report:
        """This launch's timing report: a copy of the one computed for its key (the phases, and
        whether activity is being recorded). The timing never reads the data."""
        recording = _timing._recording
        report = self._last_report_key.get((artifact, slots, recording))  # this binding's, last time
        if report is not None:
            return report.copy()
        phases = self.phases(artifact, slots)
        key = (tuple(phases.values()), recording)
        reports = self._state.reports
        report = reports.get(key)
        if report is None:
            timing = Timing(self.program, self.hardware, phases=phases)
            Machine(self.program, {}, self.hardware.scratchpad_bytes, timing, functional=False).run()
            report = timing.finish()
            with self._lock:
                if len(reports) >= 64:
                    reports.clear()
                reports[key] = report
        if len(self._last_report_key) >= 16:
            self._last_report_key.clear()
        self._last_report_key[(artifact, slots, recording)] = report
        return report.copy()

    def counted_report(self, artifact: Artifact, slots, counts: dict) -> Report:
        """The report of a run whose loops counted on chip read `counts` ({(core, byte address,
        dtype): value}): a walk without data at those counts, once per (stick phases, recording,
        counts)."""
        recording = _timing._recording
        phases = self.phases(artifact, slots)
        key = (tuple(phases.values()), recording, tuple(counts.values()))
        reports = self._state.reports
        report = reports.get(key)
        if report is None:
            timing = Timing(self.program, self.hardware, phases=phases)
            walk = Machine(self.program, {}, self.hardware.scratchpad_bytes, timing, functional=False)
            walk.count_reader = lambda core, tile, idx: counts[core, tile.addr.at(idx), tile.dtype]
            walk.run()
            report = timing.finish()
            with self._lock:
                if len(reports) >= 64:
                    reports.clear()
                reports[key] = report
        return report.copy()

    def simulated_ns(self, artifact: Artifact) -> float:
        """The last run's simulated time: the Compute's duration on the timeline."""
        return self.last_report.simulated_ns if self.last_report is not None else 0.0


def _word(addr: int, dtype: str):
    """A count word as a one-element tile."""
    from .operands import Addr, Tile

    return Tile(Addr(addr), dtype, 1, 1, STICK)


class _ProgramState:
    """What runs of one program on one hardware config share: every executable of the program
    uses it (run_program makes one per call). Kept on the (immutable) program itself, as
    validate_once keeps its mark; a copy or a pickle of the program starts a fresh one."""

    def __init__(self, hardware):
        self.hardware = hardware  # held: the key is its id, never reused while this lives
        self.lock = threading.Lock()
        self.schedule: Schedule | None | bool = None  # False: the walk failed; the interpreter runs it
        self.reports: dict[tuple, Report] = {}  # timing key -> its report (never handed out itself)
        self.bound: collections.OrderedDict = collections.OrderedDict()  # binding -> BoundRun
        self.mean_step_bytes: float | None = None
        self.reads_counts: bool = False  # some loop's count is read from the scratchpad (issue 31)


    @staticmethod
    def of(program: Program, hardware) -> "_ProgramState":
        states = program.__dict__.get("_run_states")
        if states is None:
            with _states_lock:
                states = program.__dict__.setdefault("_run_states", _RunStates())
        state = states.get(id(hardware))
        if state is None:
            with _states_lock:
                fresh = _ProgramState(hardware)
                fresh.reads_counts = isa.reads_counts(program)
                state = states.setdefault(id(hardware), fresh)
        return state


class _RunStates(dict):
    """hardware id -> _ProgramState. A copy or a pickle is empty: views into device memory and
    locks are no part of a program."""

    def __reduce__(self):
        return (_RunStates, ())


_states_lock = threading.Lock()


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
