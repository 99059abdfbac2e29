"""Symbolic sizes at planning (issue 18): the kernel of a bucket, what makes clipping right, and the
sizes an artifact declares.

Symbolic sizes (issue 18): one artifact serves a bucket of sizes.

A kernel whose loop ranges or buffer shapes contain size symbols (``dynamic=True``, dims marked
dynamic, Dynamo's automatic dynamic shapes) is captured at its bucket's maximum and planned for
it: the scratchpad plan, the tiles, the loop structure and the core division are those of the
maximum. At launch the sizes travel through the correction area (program.py): every transfer
of a buffer with a symbolic dim is clipped to the bytes it has at those sizes (the validator
proved the maximum in bounds), so a kernel never runs past a buffer, and the rows past the
size compute nothing that lands anywhere.

Which kernels: the symbolic dim is one range of the kernel, the outermost dim of every buffer
it walks (so a buffer's bytes past the size are a suffix, which clipping removes). An OUTER
range: every output row depends only on the same row of its inputs (pointwise work, reductions
over static dims, a matmul's M or N). A REDUCED range (a softmax over a KV length, a matmul's
K): each reduction is masked past the size or is a dot of operands that are zero there
(reduce.py). ``check`` proves, per load and store, from the kernel IR alone, that at
every size of the bucket the iterations inside the size read only bytes the inputs have, the
iterations past it store only past the outputs' bytes (so clipping drops exactly them), and the
reductions ignore what lies past it. A gather (an embedding over a dynamic number of ids)
along an OUTER range reads a static table at indices that are clipped loads: past the size
they land as zeros, so those rows gather row 0, which exists, and their stores are clipped.
Anything else (a symbolic stride, a size inside an index or a value, welford over a symbolic
range, a scatter, whose rows past the size would scatter too) stays visibly on the CPU:
NotCapturable with the reason, an error under SPYRE_STRICT=1. (Fused attention is the exception to the
strides: its heads' stride is seq * dim, and each head becomes its own placeholder,
families/attention/sizes.py.)

How the symbolic parts are found: the group is captured twice, with each size symbol at the
bucket's maximum and at one less (odd: a power of two does not hide a divisibility that another
size lacks); the two kernels must agree on everything but ranges and buffer dims, which then
are ``coef * size + const``. Indices, strides and values that depend on a size differ and are
refused.

Bucket policy: the bucket of a size n is (hi / 2, hi] with hi the next power of two of n, at
least FLOOR; [1, FLOOR] below it. A size outside an artifact's bucket is served by the
artifact of its own bucket, compiled on first use from the kernel IR the artifact keeps
(BucketedPlan): Dynamo's guards (one graph for every size) and our bounds meet there.
"""

from __future__ import annotations

import dataclasses

from ..ir.errors import NotCapturable
from ..ir.kernel_ir import Buffer, Cast, Kernel, Load, SymbolicSizes
from . import reduce as symbolic_reduce

FLOOR = 16


def bucket_of(n: int, limits: tuple[int, int | None] = (0, None)) -> tuple[int, int]:
    """The sizes one artifact serves with `n` among them: (lo, hi), inside `limits` (what
    Dynamo's guards admit: a bucket is planned at most at their maximum)."""
    n = int(n)
    hi = FLOOR
    while hi < n:
        hi *= 2
    lo = 1 if hi == FLOOR else hi // 2 + 1
    least, most = limits
    lo = max(lo, least)
    if most is not None:
        hi = min(hi, most)
    if not lo <= n <= hi:
        raise ValueError(f"size {n} is outside the sizes Dynamo admits [{least}, {most}]")
    return lo, hi


def fit_affine(a: int, b: int, hi: int, what: str):
    """(coef, const) of a quantity that is `a` at size hi and `b` at hi - 1."""
    coef = a - b
    if coef < 0:
        raise NotCapturable(f"{what} shrinks as the size grows")
    return coef, a - coef * hi


# ---- what makes clipping right ------------------------------------------------------------


def _affine_at(coef: int, const: int, s: int) -> int:
    return coef * s + const


def shapes_at(kernel: Kernel, s: int) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]]]:
    """The kernel's (ranges + reduction_ranges, buffer shapes by name) at size s of its one symbol."""
    ranges = list(kernel.ranges + kernel.reduction_ranges)
    for d, _, c, k in kernel.symbolic.ranges:
        ranges[d] = _affine_at(c, k, s)
    return tuple(ranges), {b.name: b.shape for b in buffers_at(kernel, s)}


def buffers_at(kernel, s: int) -> tuple[Buffer, ...]:
    """The kernel's buffers with their shapes and strides at size s of its one symbol (any
    family: only an AttentionKernel has symbolic strides)."""
    sym = kernel.symbolic
    shapes = {b.name: list(b.shape) for b in kernel.buffers}
    strides = {b.name: list(b.strides) for b in kernel.buffers}
    for b, d, _, c, k in sym.buffers:
        shapes[b][d] = _affine_at(c, k, s)
    for b, d, _, c, k in sym.strides:
        strides[b][d] = _affine_at(c, k, s)
    return tuple(dataclasses.replace(b, shape=tuple(shapes[b.name]), strides=tuple(strides[b.name]))
                 for b in kernel.buffers)


def check(kernel: Kernel, error=NotCapturable) -> None:
    """Raise `error` unless clipping every transfer to the buffers' bytes at the launch's size
    computes the kernel exactly, at every size of its bucket (the module docstring; a symbolic
    reduced range: reduce.py)."""
    sym = kernel.symbolic
    (name, lo, hi), = sym.sizes
    if any(st.index.indirect for st in kernel.stores):
        # (the rows past the size would scatter too: their indices are the clipped loads' zeros)
        raise error(f"a scatter over symbolic size {name}")
    if len(sym.ranges) != 1:
        raise error(f"{len(sym.ranges)} loop ranges depend on size {name}; one may")
    d, _, rc, rk = sym.ranges[0]
    reduced = d >= len(kernel.ranges)
    gathers = [v for v in kernel.values if isinstance(v, Load) and v.index.indirect]
    if gathers and reduced:
        raise error(f"a gather inside a reduction over symbolic size {name}")
    sized = {}
    for b, dim, _, c, k in sym.buffers:
        buf = kernel.buffer(b)
        inner = 1 + sum((n - 1) * st for j, (n, st) in enumerate(zip(buf.shape, buf.strides)) if j != dim)
        if buf.strides[dim] < inner or b in sized:
            raise error(f"buffer {b}'s symbolic dim {dim} is not its outermost (its bytes past the size are "
                        f"not a suffix)")
        sized[b] = dim
    outer = kernel.outer()
    accesses = [(v.buffer, v.index, None) for v in kernel.values if isinstance(v, Load)] + \
        [(st.buffer, st.index, st.value) for st in kernel.stores]
    for s in sorted({lo, hi}):
        full, shapes = shapes_at(kernel, s)

        def span_of(bname):
            shape = shapes[bname]
            return 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, kernel.buffer(bname).strides))

        def past_of(bname, index):
            """The lowest element an iteration past the size (along d) reaches."""
            others = [(st, n) for j, (st, n) in enumerate(zip(index.strides, full)) if j != d]
            return index.offset + index.strides[d] * full[d] + sum(min(0, st * (n - 1)) for st, n in others)

        for bname, index, stored in accesses:
            span = span_of(bname)
            a = index.strides[d]
            if a < 0:
                raise error(f"{bname} is walked backwards along the symbolic dim")
            others = [(st, n) for j, (st, n) in enumerate(zip(index.strides, full)) if j != d]
            top = index.offset + a * (full[d] - 1) + sum(max(0, st * (n - 1)) for st, n in others)
            if full[d] > 0 and top >= span:
                what = "reads" if stored is None else "stores to"
                raise error(f"at size {name}={s} the kernel {what} element {top} of {bname}, which has {span}")
            if stored is None or (reduced and a == 0 and outer[stored]):
                continue  # (a reduction's result: one per row, whatever the size)
            if bname not in sized:
                raise error(f"{bname} has static size but is stored along symbolic size {name} (rows past "
                            f"the size would land in it)")
            if a == 0 or past_of(bname, index) < span:
                raise error(f"at size {name}={s} rows past the size would store into {bname}'s bytes")
        for v in gathers:
            why = _gather_problem(kernel, v, d, sized, span_of, past_of)
            if why is not None:
                raise error(f"at size {name}={s}: {why}")
        if reduced:
            why = symbolic_reduce.problem(kernel, d, name, rc, rk, span_of, past_of)
            if why is not None:
                raise error(f"at size {name}={s}: {why}")


def _gather_problem(kernel: Kernel, gather: Load, d: int, sized, span_of, past_of) -> str | None:
    """Why a gather along outer symbolic range `d` could read what it must not (None: it cannot).
    Its table is static, and each of its indices a load that is clipped past the size: the rows
    past it land as zeros, so they gather the table's row 0, which exists, and store nowhere."""
    if gather.buffer in sized:
        return f"the gather from {gather.buffer} has a symbolic dim (rows past the size would be read)"
    for p, _ in gather.index.indirect:
        pos = kernel.values[p].arg
        while isinstance(kernel.values[pos], Cast):
            pos = kernel.values[pos].arg
        index = kernel.values[pos]
        if not (isinstance(index, Load) and index.buffer in sized
                and symbolic_reduce.zero_past(kernel, pos, d, span_of, past_of)):
            return (f"an index of the gather from {gather.buffer} is not a load of a buffer that ends where the "
                    f"size does (rows past the size would gather at indices that may not exist)")
    return None


def rebucket(kernel: Kernel, n: int) -> Kernel:
    """The kernel for the bucket of size n (from an artifact's kernel IR)."""
    from ..ir.errors import Unsupported

    sizes = rebucketed_sizes(kernel, n)
    (_, _, hi), = sizes.sizes
    full, _ = shapes_at(kernel, hi)
    outer = len(kernel.ranges)
    out = dataclasses.replace(kernel, ranges=full[:outer], reduction_ranges=full[outer:],
                              buffers=buffers_at(kernel, hi), symbolic=sizes)
    check(out, Unsupported)
    return out


def rebucketed_sizes(kernel, n: int) -> SymbolicSizes:
    """The kernel's SymbolicSizes for the bucket of size n, inside the limits it was captured
    with (any family); Unsupported outside them."""
    from ..ir.errors import Unsupported

    sym = kernel.symbolic
    (name, _, _), = sym.sizes
    limits = {x: (a, b) for x, a, b in sym.limits}.get(name, (0, None))
    try:
        lo, hi = bucket_of(n, limits)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    return dataclasses.replace(sym, sizes=((name, lo, hi),))


# ---- the artifact ------------------------------------------------------------------------


def program_with_sizes(program, kernel: Kernel):
    """The planned program with the kernel's size symbol declared and its buffers' symbolic dims."""
    from spyre_runtime.program.operands import SizeExpr

    sym = kernel.symbolic
    dims: dict[str, list] = {}
    for b, d, s, c, k in sym.buffers:
        buf = kernel.buffer(b)
        dims.setdefault(b, [None] * len(buf.shape))[d] = SizeExpr(s, hi=buf.shape[d], coef=c, const=k)
    symbols = tuple(dataclasses.replace(x, dims=tuple(dims[x.name])) if x.name in dims and x.role != "temp" else x
                    for x in program.symbols)
    return dataclasses.replace(program, symbols=symbols, sizes=tuple(n for n, _, _ in sym.sizes))


def launch_shape(kernel: Kernel, name: str, shape) -> list:
    """A buffer's launch-spec shape: a symbolic dim as its size's name (or coef/const)."""
    out = list(shape)
    symbolic = getattr(kernel, "symbolic", None)
    for b, d, s, c, k in symbolic.buffers if symbolic else ():
        if b == name:
            out[d] = s if (c, k) == (1, 0) else {"size": s, "coef": c, "const": k}
    return out


def launch_sizes(kernel: Kernel) -> list[dict]:
    symbolic = getattr(kernel, "symbolic", None)
    return [{"name": n, "min": lo, "max": hi} for n, lo, hi in symbolic.sizes] if symbolic else []
