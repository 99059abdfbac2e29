"""Fused attention over a sequence length known only at launch (issue 18).

SDPA over a dynamic sequence length reaches the attention family as an AttentionKernel whose
q, k, v and out are (batch, heads, seq, dim) with seq symbolic. Two things make that unlike the
other families' symbolic kernels (symbolic/planning.py), and this module answers both:

* The heads' stride is seq * dim: the symbolic dim is not the outermost, and a buffer's bytes
  past the size are not a suffix (the rows past S of one head are the next head's bytes).
  So the program never addresses such a buffer as one (``split``): each (batch, head) of it is its own
  placeholder (``q[0,1]``: a 2-D [seq, dim] view whose row stride is static and whose symbolic
  dim is now its outermost), bound at launch to that head's view of the tensor. Clipping each
  transfer to the bytes of its head (symbolic/planning.py's rule, per placeholder) is the per-head row
  limit: no transfer reads or writes the next head's rows. ``head_args`` makes the views at
  launch, after checking the tensor's strides against the kernel's symbolic strides (a
  LaunchError naming the argument otherwise). A buffer whose rows are its outermost dim with
  static strides (q, k, v as views of a projection [1, S, H * D], the output written back in
  that layout) stays one placeholder, its rows its symbolic dim, as in symbolic/planning.py.
* Positions past the size: K and V rows there load as zeros (clipped), which would still score
  0, not -inf. Under a causal diagonal d <= 0 with L and S the same size, no row inside the size
  sees a position past it; otherwise the program compares each chunk's positions with the size
  (a size word, isa.Fill of a SizeExpr) and drops those past it (AttentionShape.kv_size). Query
  rows past L read zeros and are never stored (clipped).

The kernel is captured like every symbolic kernel (inductor/attention_capture.py): its buffers
evaluated at the bucket's maximum and at one less, the difference giving `coef * size + const`
dims, ranges and strides (SymbolicSizes, with ``strides``). Buckets and limits are compiler/symbolic's; the launcher's BucketedPlan launches it.
"""

from __future__ import annotations

import dataclasses

from ...ir.errors import NotCapturable
from ...ir.kernel_ir import AttentionKernel, Buffer

DIMS = ("B", "H", "KVH", "L", "S", "D", "Dv")  # what SymbolicSizes.ranges index for an AttentionKernel
SIZE = "z0"  # the size's name in the artifact (positional, as symbolic kernels' sizes are)


def check(kernel: AttentionKernel, error=NotCapturable) -> None:
    """Raise `error` unless the head split and the clipping compute `kernel` at every size."""
    from ...symbolic.planning import buffers_at

    sym = kernel.symbolic
    (name, lo, hi), = sym.sizes
    where = f"attention over symbolic size {name}"
    if not sym.ranges:
        raise error(f"{where}: no dim of the attention depends on it")
    if any(DIMS[d] not in ("L", "S") for d, *_ in sym.ranges):
        raise error(f"{where}: dims {[DIMS[d] for d, *_ in sym.ranges]} depend on it; the query rows (L) and the "
                    f"kv positions (S) may")
    if kernel.bias is not None or kernel.keep is not None or kernel.positions is not None:
        raise error(f"{where}: a mask read from data (bias, keep, positions) is not compiled yet")
    for b, d, *_ in sym.buffers:
        if d != 2:
            raise error(f"{where}: dim {d} of {b} depends on it (the rows, dim 2, may)")
    for b, d, *_ in sym.strides:
        if d >= 2:
            raise error(f"{where}: the {'row' if d == 2 else 'feature'} stride of {b} depends on it (per head, "
                        f"the rows must be a static stride apart)")
    rows = set(split(kernel))
    for b in kernel.buffers:
        if b.name in rows and b.shape[3] > 1 and b.strides[2] < b.strides[3] * b.shape[3]:
            raise error(f"{where}: {b.name}'s rows interleave (stride {b.strides[2]} for {b.shape[3]} features), so "
                        f"a head's rows past the size are not a suffix of its bytes")
    for s in sorted({lo, hi}):
        for b in buffers_at(kernel, s):
            if b.name in rows and b.name in kernel.outputs and not _heads_apart(b):
                raise error(f"{where}: at {name}={s} the heads of {b.name} overlap or interleave in memory (each "
                            f"head is written as its own argument)")


def _heads_apart(buf: Buffer) -> bool:
    """Whether the (batch, head) views of `buf` occupy disjoint byte ranges."""
    shape, strides = buf.shape, buf.strides
    span = 1 + (shape[2] - 1) * strides[2] + (shape[3] - 1) * strides[3]
    bases = sorted(i * strides[0] + h * strides[1] for i in range(shape[0]) for h in range(shape[1]))
    return all(y - x >= span for x, y in zip(bases, bases[1:]))


def kv_size(kernel: AttentionKernel):
    """(coef, const) of the kv length when the program must mask the positions past it, else None
    (a causal diagonal d <= 0 over query rows of the same length: no row inside the size sees a
    position past it, and the rows past it are never stored)."""
    sym = kernel.symbolic
    ranges = {DIMS[d]: (c, k) for d, _, c, k in sym.ranges} if sym is not None else {}
    if "S" not in ranges:
        return None
    if kernel.causal is not None and kernel.causal <= 0 and ranges.get("L") == ranges["S"]:
        return None
    return ranges["S"]


# ---- the head split: placeholders and arguments ----------------------------------------


def sized(kernel: AttentionKernel) -> dict[str, tuple[int, str, int, int]]:
    """The buffers with a symbolic dim, by name: (that dim, size, coef, const)."""
    sym = kernel.symbolic
    return {b: (d, s, c, k) for b, d, s, c, k in sym.buffers} if sym is not None else {}


def split(kernel: AttentionKernel) -> dict[str, tuple[int, str, int, int]]:
    """The sized buffers placed per (batch, head): those whose rows are not their outermost dim
    with static strides (whose bytes past the size are then not a suffix)."""
    strided = {b for b, *_ in kernel.symbolic.strides} if kernel.symbolic is not None else set()
    out = {}
    for name, (d, s, c, k) in sized(kernel).items():
        b = kernel.buffer(name)
        inner = 1 + sum((n - 1) * st for j, (n, st) in enumerate(zip(b.shape, b.strides)) if j != d)
        if name in strided or b.strides[d] < inner:
            out[name] = (d, s, c, k)
    return out


def head_name(buffer: str, b: int, h: int) -> str:
    """A head's placeholder and argument (what `buffer[b, h]` of the tensor is)."""
    return f"{buffer}[{b},{h}]"


def layouts(kernel: AttentionKernel):
    """The launch arguments (layout.buffers_of's, with each split buffer's heads in its place)."""
    from ...core.layout import BufferLayout, buffers_of

    heads = split(kernel)
    out = []
    for b in buffers_of(kernel):
        if b.name not in heads:
            out.append(b)
            continue
        B, H = b.shape[:2]
        out += [BufferLayout(head_name(b.name, i, h), b.role, b.dtype, tuple(b.shape[2:]), tuple(b.strides[2:]), 0)
                for i in range(B) for h in range(H)]
    return tuple(out)


def symbols(kernel: AttentionKernel):
    """The program's placeholders, in `layouts` order: a head's rows are its symbolic dim."""
    from spyre_runtime.program.operands import SizeExpr
    from spyre_runtime.program.program import Symbol

    heads, rows = split(kernel), sized(kernel)
    out = []
    for b in layouts(kernel):
        base = b.name.split("[")[0]
        dims = ()
        if base in heads and b.name != base:
            _, s, c, k = heads[base]
            dims = (SizeExpr(s, hi=b.shape[0], coef=c, const=k), None)
        elif b.name in rows:  # (one placeholder: its rows are its outermost dim)
            d, s, c, k = rows[b.name]
            dims = tuple(SizeExpr(s, hi=n, coef=c, const=k) if j == d else None for j, n in enumerate(b.shape))
        out.append(Symbol(b.name, b.role, b.dtype, b.shape, b.strides, dims=dims))
    return tuple(out)


def launch_shape(kernel: AttentionKernel, name: str, shape) -> list:
    out = list(shape)
    base = name.split("[")[0]
    heads, rows = split(kernel), sized(kernel)
    if base in heads and name != base:
        _, s, c, k = heads[base]
        out[0] = s if (c, k) == (1, 0) else {"size": s, "coef": c, "const": k}
    elif name in rows:
        d, s, c, k = rows[name]
        out[d] = s if (c, k) == (1, 0) else {"size": s, "coef": c, "const": k}
    return out


def head_args(kernel: AttentionKernel, args, n: int) -> list:
    """The launch arguments of `args` (q, k, v, out: the kernel's buffers) at size n: each split
    buffer's tensor checked against its shape and strides at n (a LaunchError naming the
    argument), then replaced by its heads' views."""
    import torch

    from spyre_runtime.binding import LaunchError

    from ...symbolic.planning import buffers_at

    heads = split(kernel)
    if len(args) != len(kernel.buffers):
        raise LaunchError(f"kernel {kernel.name!r} takes {len(kernel.buffers)} argument(s) "
                          f"({', '.join(b.name for b in kernel.buffers)}), got {len(args)}")
    strides = {}
    for b, d, _, c, k in kernel.symbolic.strides:
        strides[b, d] = (c, k)
    out = []
    for i, (buf, now, t) in enumerate(zip(kernel.buffers, buffers_at(kernel, n), args)):
        if buf.name not in heads:
            out.append(t)
            continue
        where = f"kernel {kernel.name!r} argument {i} ({buf.name!r})"
        _, s, _, _ = heads[buf.name]
        shape = list(now.shape)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise LaunchError(f"{where}: expected shape {shape} at size {s}={n}, got {got}")
        for dim in range(4):
            want = now.strides[dim]
            expr = str(want)
            if (buf.name, dim) in strides:
                sc, sk = strides[buf.name, dim]
                expr = f"{sc}*{s}{sk:+d}" if sk else f"{sc}*{s}"
            if shape[dim] > 1 and t.stride(dim) != want:
                raise LaunchError(f"{where}: stride {dim} is {t.stride(dim)}, expected {expr} = {want} at size "
                                  f"{s}={n} (strides {list(t.stride())})")
        out += [t[b, h] for b in range(shape[0]) for h in range(shape[1])]
    return out


# ---- buckets ---------------------------------------------------------------------------


def rebucket(kernel: AttentionKernel, n: int) -> AttentionKernel:
    """The kernel for the bucket of size n (from an artifact's kernel IR)."""
    from ...ir.errors import Unsupported
    from ...symbolic.planning import buffers_at, rebucketed_sizes

    sizes = rebucketed_sizes(kernel, n)
    (_, _, hi), = sizes.sizes
    out = dataclasses.replace(kernel, buffers=buffers_at(kernel, hi), symbolic=sizes)
    try:
        out.check()
    except ValueError as e:
        raise Unsupported(str(e)) from None
    check(out, Unsupported)
    return out


__all__ = ["check", "head_args", "head_name", "kv_size", "launch_shape", "layouts", "rebucket", "sized", "split",
           "symbols"]
