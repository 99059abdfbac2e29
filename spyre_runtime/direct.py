"""Running a hand-written program once, blocking: no artifact directory, no plan.

``run_program(program, **tensors)`` runs a program (a reference or
calibration program of spyre_authoring, a test's) once on given tensors and
waits: the same allocation and address encoding as a prepared kernel
(prepare.allocate), its correction area written by the host directly
(write_correction_area) instead of patched in stream order.
"""

from __future__ import annotations

import struct

import torch

from . import _C
from .binding import slot_words
from .device.programs import ProgramExecutor
from .prepare import allocate
from .program.operands import DTYPES
from .program.program import Program
from .program.run import Artifact, ProgramExecutable
from .program.validate import validate_once
from .queue import Compute
from .queue.runtime import current
from .sizes import size_words
from .tensors import footprint

__all__ = ["prepare_artifact", "run_program", "write_correction_area"]


def prepare_artifact(program: Program, device: int) -> tuple[torch.Tensor, Artifact]:
    """The program's device allocation, filled before this returns (see prepare.allocate)."""
    alloc, artifact, _, _ = allocate(program, device)
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    return alloc, artifact


def write_correction_area(program: Program, alloc: torch.Tensor, bound: dict[str, torch.Tensor],
                          sizes: dict[str, int] | None = None) -> None:
    """Resolve the placeholders now: each bound tensor's (region, offset) into its slot, and the
    size words (blocking, after the stream's earlier work; compiled launches stage this in stream
    order instead)."""
    device = alloc.device.index
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    words = slot_words([bound[s.name] for s in program.placeholders])
    missing = [n for n in program.sizes if n not in (sizes or {})]
    if missing:
        raise TypeError(f"program {program.name!r}: no value for size(s) {', '.join(missing)}")
    if program.sizes:
        words += size_words(program, sizes)
    start = program.correction_offset
    area = _C.host_alias(alloc)[start:start + program.correction_bytes]
    area.zero_()
    struct.pack_into(f"<{len(words)}q", area.numpy(), 0, *words)


def run_program(program: Program, device: int = 0, sizes: dict[str, int] | None = None,
                **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run a program on the given tensors; returns every output by name. `sizes`: the values of
    the program's size symbols (issue 18); a symbolic dim's tensors have its size at them.

    Inputs may be CPU or spyre tensors (CPU ones are copied to the device);
    outputs not given are allocated with the symbol's shape and strides. The
    program runs as a Compute on the device's current stream; this waits.
    """
    validate_once(program)
    names = {s.name for s in program.placeholders}
    unknown = set(tensors) - names
    if unknown:
        raise TypeError(f"run_program({program.name!r}): unknown argument(s) {sorted(unknown)}; "
                        f"the program takes {sorted(names)}")
    spyre = torch.device("spyre", device)
    if program.sizes and not sizes:
        raise TypeError(f"run_program({program.name!r}): the program has sizes {list(program.sizes)}: give sizes=")

    def shape_of(sym):
        return sym.shape_at(sizes) if sym.sized else sym.shape

    bound = {}
    for sym in program.placeholders:
        t = tensors.get(sym.name)
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"run_program({program.name!r}): {sym.name!r} must be a tensor, got {type(t).__name__}")
        if t is None:
            if sym.role == "input":
                raise TypeError(f"run_program({program.name!r}): missing input {sym.name!r}")
            t = torch.empty_strided(shape_of(sym), sym.strides, dtype=DTYPES[sym.dtype], device=spyre)
        else:
            if tuple(t.shape) != tuple(shape_of(sym)) or t.dtype != DTYPES[sym.dtype]:
                raise TypeError(
                    f"run_program({program.name!r}): {sym.name!r} must be {sym.dtype}{list(shape_of(sym))}, "
                    f"got {t.dtype}{list(t.shape)}")
            t = t.to(spyre)
            if tuple(t.stride()) != tuple(sym.strides):
                raise TypeError(f"run_program({program.name!r}): {sym.name!r} must have strides "
                                f"{list(sym.strides)}, got {list(t.stride())}")
        bound[sym.name] = t
    alloc, artifact = prepare_artifact(program, device)
    write_correction_area(program, alloc, bound, sizes)
    queue, stream = current().queue(device), _C.current_stream_id(device)
    inputs = [bound[s.name] for s in program.placeholders if s.role == "input"]
    outputs = [bound[s.name] for s in program.placeholders if s.role == "output"]
    op = Compute(ProgramExecutor(ProgramExecutable(program)), artifact,
                 footprint(reads=inputs + [alloc], writes=outputs + [alloc]), name=program.name)
    # Blocking: run it on this thread once its turn comes (see DeviceQueue.run_inline).
    queue.run_inline(stream, op)
    return {s.name: bound[s.name] for s in program.placeholders if s.role == "output"}
