"""The program a family keeps: validated and verified once before it is emitted, every family the same way.

A candidate is only timed; the one kept goes through the program validator
(spyre_runtime/program/validate.py: device accesses inside their buffers,
scratchpad inside the usable bytes, queues matched, operands well formed).
A program that does not validate is a kernel we decline (Unsupported: the
caller runs it on the CPU), never one we emit; unless what is wrong is where
it puts its tiles or tokens (validate.PlacementError): that is a planner
bug, and PlanError raises. So does a program that fails the independent
verifier (verify.verify_program: replayed, two tiles share scratchpad bytes
while both are live). ``kept`` also records the kernel's minimum traffic on
it first (minimum.py), so its reports rate it against what the kernel needs.
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.program.program import Program
from spyre_runtime.program.validate import PlacementError, ProgramError, validate_once

from .family import family_of
from ..ir.errors import PlanError, Unsupported
from .minimum import Traffic, recorded
from .verify import verify_program


def kept(kernel, program: Program, traffic: Traffic | None = None) -> Program:
    """`program` with the kernel's minimum traffic (or `traffic`, when the family knows it better:
    a cut kernel's pieces together), validated; Unsupported naming the kernel if it does not."""
    if traffic is None:
        program = recorded(kernel, program)
    else:
        program = dataclasses.replace(program, minimum_bytes=traffic.total, minimum_read_bytes=traffic.read_bytes)
    return validated(kernel, program)


def validated(kernel, program: Program) -> Program:
    """`program`, validated once (Unsupported naming the kernel if it does not validate, PlanError
    if its scratchpad or queues are wrong), then verified (PlanError naming the kernel if two of
    its tiles share live bytes). A kernel over
    symbolic sizes (issue 18) declares them on its program first (its size fills and symbolic
    dims are then checked against them, whatever the family)."""
    if getattr(kernel, "symbolic", None) is not None:
        program = family_of(kernel).program_with_sizes(program, kernel)
    try:
        validate_once(program)
    except PlacementError as e:  # scratchpad or queues: the planner's doing, never the kernel's
        raise PlanError(f"kernel {kernel.name!r}: the planned program is wrong: {e}") from e
    except ProgramError as e:
        raise Unsupported(f"kernel {kernel.name!r}: the planned program does not validate: {e}") from e
    verify_program(kernel, program)
    return program


__all__ = ["kept", "validated"]
