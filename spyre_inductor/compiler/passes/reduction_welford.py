"""Welford's (mean, m2, weight): the exact two-pass form over resident rows, Chan's combine over chunks.

Resident rows (``exact``): the kernel is rewritten before lowering into
mean = sum(x) / K, m2 = sum((x - mean)^2), weight = K, all fp32: the rows
are on chip, so the second pass over them costs no device traffic and the
result is the exact two-pass one.

Chunked and ring plans (``accumulate``): each chunk's (mean, m2, n) is
computed from the chunk alone and merged into the group's accumulators
(M, M2, W) with Chan's formula; the ring merges two cores' accumulators
with the same formula (it is symmetric).
"""

from __future__ import annotations

from dataclasses import replace

from ..kernel_ir import Constant, Op, Reduction, ReductionKernel, renumbered
from .reduction_ops import WELFORD
from .reduction_space import FULL, PER_ROW
from .tiles import ChunkValue, Role, Step


def exact(kernel: ReductionKernel) -> ReductionKernel:
    """Welford as the exact two-pass form over resident rows: mean = sum/K, m2 = sum((x - mean)^2)."""
    K = 1
    for r in kernel.reduction_ranges:
        K *= r
    values, remap, groups = [], {}, {}

    def add(v):
        values.append(v)
        return len(values) - 1

    for i, v in enumerate(kernel.values):
        if isinstance(v, Reduction) and v.op in WELFORD:
            arg = remap[v.arg]
            if arg not in groups:
                s = add(Reduction("sum", arg, "fp32"))
                mean = add(Op("mul", (s, add(Constant(1.0 / K if K else float("nan"), "fp32"))), "fp32"))
                groups[arg] = mean
            mean = groups[arg]
            if v.op == "welford_mean":
                remap[i] = mean
            elif v.op == "welford_weight":
                remap[i] = add(Constant(float(K), "fp32"))
            else:
                d = add(Op("sub", (arg, mean), "fp32"))
                remap[i] = add(Reduction("sum", add(Op("mul", (d, d), "fp32")), "fp32"))
            continue
        remap[i] = add(renumbered(v, remap.__getitem__))
    stores = tuple(renumbered(s, remap.__getitem__) for s in kernel.stores)
    return replace(kernel, values=tuple(values), stores=stores)


def accumulate(b, i, v: Reduction, arg: str, level: int) -> None:
    """Value i, one of the welford triple of `arg`, as Chan-combined accumulators (one triple per
    argument, shared by its mean, m2 and weight)."""
    key = ("welford", arg)
    if key not in b.shared:
        M, M2, W = (b.new("fp32", PER_ROW, Role.ACCUMULATOR) for _ in range(3))
        b.shared[key] = (M, M2, W)
        s, mc, m2c = (b.new("fp32", PER_ROW, Role.TEMPORARY) for _ in range(3))
        d = b.new("fp32", FULL, Role.TEMPORARY)
        b.red.append((level, i))
        b.red_init[i] = [Step("fill", "fill", t, value=0.0) for t in (M, M2, W)]
        chunk = [Step("reduce", "sum", s, b.reduce_args("sum", "fp32", arg)),
                 Step("binary", "mul", mc, (s, b.chunk_constant(ChunkValue.INVERSE_EXTENT))),
                 Step("binary", "sub", d, (arg, mc)), Step("binary", "mul", d, (d, d)),
                 Step("reduce", "sum", m2c, b.reduce_args("sum", "fp32", d))]
        n_tile = b.new("fp32", PER_ROW, Role.TEMPORARY)
        chunk += [Step("fill", "fill", n_tile, value=ChunkValue.EXTENT)]
        chunk += chan(b, M, M2, W, mc, m2c, n_tile)
        b.red_chunk[i] = chunk
        b.accs += [M, M2, W]
        if b.mode == "ring":
            b.red_combine += chan(b, M, M2, W, b.landing(M), b.landing(M2), b.landing(W))
    M, M2, W = b.shared[key]
    b.vtile[i] = {"welford_mean": M, "welford_m2": M2, "welford_weight": W}[v.op]


def chan(b, M, M2, W, mb, m2b, wb) -> list[Step]:
    """(M, M2, W) <- combine((M, M2, W), (mb, m2b, wb)): n = W + wb, delta = mb - M,
    M += delta * wb / n, M2 += m2b + delta^2 * W * wb / n (Chan et al.); symmetric, so the
    ring may combine incoming and own either way."""
    n, delta, f, g = (b.new("fp32", PER_ROW, Role.TEMPORARY) for _ in range(4))
    return [Step("binary", "add", n, (W, wb)),
            Step("binary", "sub", delta, (mb, M)),
            Step("binary", "div", f, (wb, n)),          # wb / n
            Step("binary", "mul", g, (delta, f)),        # delta * wb / n
            Step("binary", "add", M, (M, g)),
            Step("binary", "mul", g, (g, delta)),        # delta^2 * wb / n
            Step("binary", "mul", g, (g, W)),            # * W
            Step("binary", "add", M2, (M2, m2b)),
            Step("binary", "add", M2, (M2, g)),
            Step("unary", "copy", W, (n,))]


__all__ = ["accumulate", "chan", "exact"]
