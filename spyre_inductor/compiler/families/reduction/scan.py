"""Scans (cumsum, cumprod): full-space values computed with the sfp's ``scan`` along tile rows.

In the resident mode a scan runs over the whole row. When chunked, the
chunks of a group go through in order and an fp32 [G, 1] CARRY tile
(filled with the identity at the start of every pass that computes the
scan) continues each row's prefix from one chunk to the next.

In the "ring" mode (a kernel of scans and pointwise work, no reductions,
too few rows for the cores) each core holds its slice of the scanned dim
resident and reduces it to its total (the chunk phase); the totals travel
0 -> 1 -> ... as running prefixes (the combine: carry = landed + carry),
and core c scans its slice starting from the prefix it received, the
carry's RING_LANDING tile (the epilogue: the scans and every step that
needs them), then stores. Rows are read once and written once.
"""

from __future__ import annotations

from dataclasses import replace

from ...ir.errors import Unsupported
from ...ir.kernel_ir import Scan
from ...core.layout import FLOATS
from ...core.reduction_ops import COMBINE, accumulator_dtype, identity
from .space import FULL, PER_ROW
from .steps import fold_copies
from ...core.tiles import Combine, Phase, PhaseKind, Role, Step


def scan(b, i, v: Scan) -> None:
    arg = b.vtile[v.arg]
    if b.vspace[v.arg] != FULL:
        raise Unsupported(f"{b.where}: value {i} scans a value that does not vary over both the "
                          f"outer and the scanned dims")
    dtype = accumulator_dtype(b.where, i, v.dtype, b.tiles[arg].dtype, f"cum{v.op} of")
    b.vspace[i], b.depth[i], b.deps[i] = FULL, b.depth[v.arg], (v.arg,)
    b.vtile[i] = b.new(dtype, FULL, Role.TEMPORARY)
    if b.mode == "resident":
        b.emit(i, Step("scan", v.op, b.vtile[i], (arg,)), FULL)
        return
    carry = b.new(dtype, PER_ROW, Role.CARRY)
    b.scan_init[i] = Step("fill", "fill", carry, value=identity(v.op, dtype))
    b.emit(i, Step("scan", v.op, b.vtile[i], (arg, carry)), FULL)
    if b.mode == "ring":
        b.accs.append(carry)
        b.red_combine.append(Step("binary", COMBINE[v.op], carry, (b.landing(carry), carry)))


def split_at_scans(steps) -> tuple[list, list]:
    """(steps that need no scan, the scans and every step that needs a scan's result): the
    second list waits for the previous cores' prefix."""
    tainted, before, after = set(), [], []
    for st in steps:
        if st.kind == "scan" or any(a in tainted for a in st.args):
            tainted.add(st.dst)
            after.append(st)
        else:
            before.append(st)
    return before, after


def ring_phases(b) -> tuple[tuple[Phase, ...], Combine]:
    """The ring mode's phases for scans (module docstring): one resident slice per core, split at the scans."""
    if b.red or b.group_loads or b.outer_stores or b.o_steps:
        raise Unsupported(f"{b.where}: scans next to reductions or per-row values: no ring plan")
    before, after = split_at_scans(b.resident_steps)
    totals = []
    for st in after:
        if st.kind == "scan":
            arg, carry = st.args
            if any(arg == s.dst for s in after if s is not st):
                raise Unsupported(f"{b.where}: a scan of a scan's result: no ring plan")
            if st.op == "prod" and b.tiles[carry].dtype in FLOATS:
                # a slice's float product reduced in one go drifts (~1e-5 per 6K factors) from
                # the prefix eager accumulates in double; sums (pairwise) and integers do not
                raise Unsupported(f"{b.where}: a float cumprod: no ring plan")
            totals.append(Step("reduce", st.op, carry, (arg,)))  # this slice's total
    after = [replace(st, args=(st.args[0], b.landing(st.args[1]))) if st.kind == "scan" else st for st in after]
    before = fold_copies(before, b.tiles, later=totals + after)  # the totals and scans read them
    chunk = Phase(PhaseKind.CHUNK, tuple(before) + tuple(totals), loads=tuple(b.f_loads.values()),
                  reason="the core's slice resident: reduced to its total, scanned from the earlier cores' prefix")
    epilogue = Phase(PhaseKind.EPILOGUE, tuple(fold_copies(after, b.tiles)),
                     stores=tuple((t, a) for t, a, _ in b.f_stores),
                     reason="once the earlier cores' prefix has landed: the scans, then the stores")
    return (chunk, epilogue), Combine("ring", tuple(b.accs), tuple(b.red_combine))


__all__ = ["ring_phases", "scan", "split_at_scans"]
