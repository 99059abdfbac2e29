"""Running programs: on given tensors (run_program), or as a Compute operation.

ProgramExecutable is the device's side: what the queue layer runs for a
Compute. run_program sits above the queue (it prepares an artifact and
enqueues a Compute, as the launch layer's prepare_kernel/launch_jobplan will
for compiled kernels); the queue itself never learns what a program is.

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

from dataclasses import dataclass

import torch

from .. import _C
from ..hardware import HARDWARE
from ..memory import device_view
from ..tensors import footprint, storage_ranges
from .execute import Machine
from .timing import Report, Timing
from .program import SLOT_BYTES, Program
from .validate import ProgramError, validate

def _validate_once(program: Program) -> None:
    # Remembered on the (immutable) program itself, never by id(): ids are reused.
    if not program.__dict__.get("_validated"):
        validate(program)
        program.__dict__["_validated"] = True


@dataclass(frozen=True)
class Artifact:
    """Where a launched program lives: its device allocation (region, offset)."""

    device: int
    region: int
    offset: int


class ProgramExecutable:
    """The executor the queue layer runs for a Compute operation."""

    def __init__(self, program: Program, hardware=HARDWARE):
        _validate_once(program)
        self.program = program
        self.hardware = hardware
        self._fetched: dict[Artifact, list[tuple[int, int]]] = {}
        self.last_report: Report | None = None

    def fetch(self, artifact: Artifact) -> None:
        """Read the correction area now (the program-distribution unit's fetch)."""
        self._fetched[artifact] = self._read_slots(artifact)

    def _read_slots(self, artifact: Artifact) -> list[tuple[int, int]]:
        n = len(self.program.placeholders)
        raw = device_view(artifact.device, artifact.region,
                          artifact.offset + self.program.correction_offset, n * SLOT_BYTES)
        words = raw.view(torch.int64).tolist()
        return [(words[2 * i], words[2 * i + 1]) for i in range(n)]

    def run(self, artifact: Artifact) -> None:
        slots = self._fetched.pop(artifact, None)
        if slots is None:
            slots = self._read_slots(artifact)
        buffers = {}
        for sym, (region, offset) in zip(self.program.placeholders, slots):
            if region <= 0:
                raise ProgramError(
                    f"program {self.program.name!r}: placeholder {sym.name!r} is unresolved "
                    f"(its correction slot was never written)")
            buffers[sym.name] = device_view(artifact.device, region, offset, sym.nbytes)
        for sym in self.program.symbols:
            if sym.role == "temp":
                buffers[sym.name] = device_view(artifact.device, artifact.region,
                                                 artifact.offset + sym.offset, sym.nbytes)
        timing = Timing(self.program, self.hardware)
        Machine(self.program, buffers, self.hardware.scratchpad_bytes, timing).run()
        self.last_report = timing.finish()
        _reports.append(self.last_report)

    def simulated_ns(self, artifact: Artifact) -> float:
        """The last run's simulated time: the Compute's duration on the timeline."""
        return self.last_report.simulated_ns if self.last_report is not None else 0.0


_reports: list[Report] = []


def kernel_reports() -> list[Report]:
    """Reports of the programs run since the last reset_kernel_reports()."""
    return list(_reports)


def reset_kernel_reports() -> None:
    _reports.clear()


def write_correction_area(program: Program, artifact_tensor: torch.Tensor, bound: dict[str, torch.Tensor]) -> None:
    """Resolve the placeholders: (region, offset) of each bound tensor into its slot."""
    slots = _C.host_alias(artifact_tensor)[: program.correction_bytes].view(torch.int64)
    for i, sym in enumerate(program.placeholders):
        t = bound[sym.name]
        piece = storage_ranges(t.untyped_storage())
        if not piece:  # an empty tensor: any address will do, nothing is touched
            slots[2 * i], slots[2 * i + 1] = 1 << 62, 0
            continue
        slots[2 * i] = piece[0].region
        slots[2 * i + 1] = piece[0].offset + t.storage_offset() * t.element_size()


def prepare_artifact(program: Program, device: int) -> tuple[torch.Tensor, Artifact]:
    """Allocate the program's device memory and place its image after the temporaries."""
    image = program.image()
    alloc = torch.empty(program.allocation_bytes + len(image), dtype=torch.uint8, device=f"spyre:{device}")
    # Filled through the host alias: a device-side zero_ would go through the CPU fallback
    # (and fail under SPYRE_STRICT).
    host = _C.host_alias(alloc)
    host[: program.allocation_bytes].zero_()
    host[program.allocation_bytes:].copy_(torch.frombuffer(bytearray(image), dtype=torch.uint8))
    piece = storage_ranges(alloc.untyped_storage())[0]
    return alloc, Artifact(device, piece.region, piece.offset)


def run_program(program: Program, device: int = 0, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run a program on the given tensors; returns every output by name.

    Inputs may be CPU or spyre tensors (CPU ones are copied to the device);
    outputs not given are allocated with the symbol's shape and strides. The
    program runs as a Compute on the device's current stream; this waits.
    """
    from ..queue import Compute
    from ..queue.runtime import current

    _validate_once(program)
    names = {s.name for s in program.placeholders}
    unknown = set(tensors) - names
    if unknown:
        raise TypeError(f"run_program({program.name!r}): unknown argument(s) {sorted(unknown)}; "
                        f"the program takes {sorted(names)}")
    spyre = torch.device("spyre", device)
    bound = {}
    for sym in program.placeholders:
        t = tensors.get(sym.name)
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"run_program({program.name!r}): {sym.name!r} must be a tensor, got {type(t).__name__}")
        if t is None:
            if sym.role == "input":
                raise TypeError(f"run_program({program.name!r}): missing input {sym.name!r}")
            t = torch.empty_strided(sym.shape, sym.strides, dtype=_torch_dtype(sym.dtype), device=spyre)
        else:
            if tuple(t.shape) != tuple(sym.shape) or t.dtype != _torch_dtype(sym.dtype):
                raise TypeError(
                    f"run_program({program.name!r}): {sym.name!r} must be {sym.dtype}{list(sym.shape)}, "
                    f"got {t.dtype}{list(t.shape)}")
            t = t.to(spyre)
            if tuple(t.stride()) != tuple(sym.strides):
                raise TypeError(f"run_program({program.name!r}): {sym.name!r} must have strides "
                                f"{list(sym.strides)}, got {list(t.stride())}")
        bound[sym.name] = t
    alloc, artifact = prepare_artifact(program, device)
    write_correction_area(program, alloc, bound)
    inputs = [bound[s.name] for s in program.placeholders if s.role == "input"]
    outputs = [bound[s.name] for s in program.placeholders if s.role == "output"]
    op = Compute(ProgramExecutable(program), artifact,
                 footprint(reads=inputs + [alloc], writes=outputs + [alloc]), name=program.name)
    # Blocking: run it on this thread once its turn comes (see DeviceQueue.run_inline).
    current().queue(device).run_inline(_C.current_stream_id(device), op)
    return {s.name: bound[s.name] for s in program.placeholders if s.role == "output"}


def _torch_dtype(name: str) -> torch.dtype:
    from .operands import DTYPES

    return DTYPES[name]
