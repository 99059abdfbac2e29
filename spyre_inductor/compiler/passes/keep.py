"""The program a family keeps: validated once before it is emitted, every family the same way.

A candidate is only timed; the one kept goes through the program validator
(spyre_runtime/program/validate.py: device accesses inside their buffers,
scratchpad inside the usable bytes, queues matched, operands well formed).
A program that does not validate is a kernel we decline (Unsupported: the
caller runs it on the CPU), never one we emit. ``kept`` also records the
kernel's minimum traffic on it first (minimum.py), so its reports rate it
against what the kernel needs.
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.program.program import Program
from spyre_runtime.program.validate import ProgramError, validate_once

from ..errors import Unsupported
from .minimum import Traffic, recorded


def kept(kernel, program: Program, traffic: Traffic | None = None) -> Program:
    """`program` with the kernel's minimum traffic (or `traffic`, when the family knows it better:
    a cut kernel's pieces together), validated; Unsupported naming the kernel if it does not."""
    if traffic is None:
        program = recorded(kernel, program)
    else:
        program = dataclasses.replace(program, minimum_bytes=traffic.total, minimum_read_bytes=traffic.read_bytes)
    return validated(kernel, program)


def validated(kernel, program: Program) -> Program:
    """`program`, validated once (Unsupported naming the kernel if it does not validate). A kernel
    over symbolic sizes (issue 18) declares them on its program first (its size fills and
    symbolic dims are then checked against them, whatever the family)."""
    if getattr(kernel, "symbolic", None) is not None:
        from ..symbolic import program_with_sizes

        program = program_with_sizes(program, kernel)
    try:
        validate_once(program)
    except ProgramError as e:
        raise Unsupported(f"kernel {kernel.name!r}: the planned program does not validate: {e}") from e
    return program


__all__ = ["kept", "validated"]
