"""The readable listing of a program, rendered through program/templates/program_listing.j2."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2

from . import isa

TEMPLATES = Path(__file__).resolve().parent / "templates"
_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True)


def _indent(instrs) -> str:
    """A unit's instructions, one numbered line each, indented by loop depth (formatted here, not
    line by line in the template: a many-core program has tens of thousands of lines)."""
    lines, depth = [], 0
    for i, ins in enumerate(instrs):
        if isinstance(ins, isa.EndLoop):
            depth -= 1
        lines.append(f"\n    {i:4d}  " + "  " * depth + ins.listing())
        if isinstance(ins, isa.Loop):
            depth += 1
    return "".join(lines)


def render(program) -> str:
    from ..artifact import PROGRAM_FORMAT
    from .program import SLOT_BYTES

    checksum = program.checksum()
    return _env.get_template("program_listing.j2").render(
        p=program, version=PROGRAM_FORMAT, checksum=checksum, slot_bytes=SLOT_BYTES,
        high_water=program.scratchpad_high_water(), indent=_indent, list=list,
    )
