"""Welford's (mean, m2, weight): the corrected two-pass form over resident rows, Chan's combine over chunks.

fp32 data far from zero relative to their spread (rows of 123456.789, or
1e5 + 0.01 * randn) is where a plain two-pass loses everything: the sum's
rounding puts the mean m^ a few ulps of the data off the true mean mu, and
sum((x - m^)^2) = sum((x - mu)^2) + K (mu - m^)^2 is then dominated by the
second term (constant rows got a variance of 6e-5 and a layer norm of
+-0.93 instead of 0). So every mode computes the corrected two-pass form
(Chan, Golub and LeVeque): with m^ = sum(x) / K and d = x - m^ (exact, or
correctly rounded, since x and m^ are close), c = sum(d),

    mean = m^ + c / K,   m2 = sum(d^2) - c^2 / K   (clamped at 0 against rounding)

which removes the mean's error to first order: constant rows give d all
equal, c / K exactly that, and m2 exactly 0, as on the CPU.

Resident rows (``exact``): the kernel is rewritten before lowering into that
form, all fp32: the rows are on chip, so the passes over them cost no
device traffic (one more sum over the row than the uncorrected form).

Chunked, looped and ring plans (``accumulate``): each chunk's statistics
are the same corrected form, and the group's accumulators keep the mean as
an unevaluated sum M + L (L the part fp32 M cannot hold): Chan's combine
weighs the difference of two means, which for offset data is far below an
ulp of M, so a mean rounded to fp32 per chunk made that difference mostly
rounding noise (var 3e-4 off on offset data). The ring merges two cores'
(M, L, M2, W) with the same combine (it is symmetric); the mean the kernel
reads is M + L, rounded once after the last chunk (and the ring).
"""

from __future__ import annotations

from dataclasses import replace

from ...ir.kernel_ir import Constant, Op, Reduction, ReductionKernel, renumbered
from ...core.reduction_ops import WELFORD
from .space import FULL, PER_ROW
from ...core.tiles import ChunkValue, Role, Step


def exact(kernel: ReductionKernel) -> ReductionKernel:
    """Welford as the corrected two-pass form over resident rows (module docstring)."""
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
                groups[arg] = _corrected(add, arg, K)
            mean, m2 = groups[arg]
            remap[i] = mean if v.op == "welford_mean" else m2 if v.op == "welford_m2" else \
                add(Constant(float(K), "fp32"))
            continue
        remap[i] = add(renumbered(v, remap.__getitem__))
    stores = tuple(renumbered(s, remap.__getitem__) for s in kernel.stores)
    return replace(kernel, values=tuple(values), stores=stores)


def _corrected(add, arg: int, K: int) -> tuple[int, int]:
    """(mean, m2) of value `arg` over K elements, appended as IR values."""
    s = add(Reduction("sum", arg, "fp32"))
    k = add(Constant(float(K) if K else float("nan"), "fp32"))
    rough = add(Op("truediv", (s, k), "fp32")) if K != 1 else s
    d = add(Op("sub", (arg, rough), "fp32"))
    q = add(Reduction("sum", add(Op("mul", (d, d), "fp32")), "fp32"))
    if K == 1:  # one element: it is its mean (an inf too, as eager's Welford), and m2 is 0 (nan for inf/nan)
        return rough, q
    c = add(Reduction("sum", d, "fp32"))
    lo = add(Op("truediv", (c, k), "fp32"))
    mean = add(Op("add", (rough, lo), "fp32"))
    m2 = add(Op("sub", (q, add(Op("mul", (c, lo), "fp32"))), "fp32"))
    return mean, add(Op("maximum", (m2, add(Constant(0.0, "fp32"))), "fp32"))


def accumulate(b, i, v: Reduction, arg: str, level: int) -> None:
    """Value i, one of the welford triple of `arg`, as Chan-combined accumulators (one set per
    argument, shared by its mean, m2 and weight; module docstring)."""
    key = ("welford", arg)
    if key not in b.shared:
        M, L, M2, W = (b.new("fp32", PER_ROW, Role.ACCUMULATOR) for _ in range(4))
        mean = b.new("fp32", PER_ROW, Role.TEMPORARY)
        b.shared[key] = (mean, M2, W)
        s, mc, c, lc, q, m2c = (b.new("fp32", PER_ROW, Role.TEMPORARY) for _ in range(6))
        d, d2 = b.new("fp32", FULL, Role.TEMPORARY), b.new("fp32", FULL, Role.TEMPORARY)
        n = b.chunk_constant(ChunkValue.EXTENT)
        b.red.append((level, i))
        b.red_init[i] = [Step("fill", "fill", t, value=0.0) for t in (M, L, M2, W)]
        b.red_chunk[i] = [Step("reduce", "sum", s, b.reduce_args("sum", "fp32", arg)),
                          Step("binary", "div", mc, (s, n)),
                          Step("binary", "sub", d, (arg, mc)),
                          Step("reduce", "sum", c, b.reduce_args("sum", "fp32", d)),
                          Step("binary", "mul", d2, (d, d)),
                          Step("reduce", "sum", q, b.reduce_args("sum", "fp32", d2)),
                          Step("binary", "div", lc, (c, n)),           # the chunk's mean is mc + lc
                          Step("binary", "mul", c, (c, lc)),
                          Step("binary", "sub", m2c, (q, c)),
                          Step("binary", "max", m2c, (m2c, b.const(0.0, "fp32")))]
        b.red_chunk[i] += chan(b, (M, L, M2, W), (mc, lc, m2c, n))
        b.accs += [M, L, M2, W]
        if b.mode == "ring":
            b.red_combine += chan(b, (M, L, M2, W), tuple(b.landing(t) for t in (M, L, M2, W)))
        # once the group's chunks (and the ring) are done: the mean, rounded once
        b.o_steps.append((level, Step("binary", "add", mean, (M, L))))
    mean, M2, W = b.shared[key]
    b.vtile[i] = {"welford_mean": mean, "welford_m2": M2, "welford_weight": W}[v.op]


def chan(b, acc, other) -> list[Step]:
    """acc = (M, L, M2, W) <- its combine with other = (mb, lb, m2b, wb), means M + L and mb + lb
    (Chan et al.): n = W + wb, f = wb / n, delta = (mb - M) + (lb - L), mean += f * delta,
    M2 += m2b + delta^2 * W * f. The mean's update keeps M + f * (mb - M) as M plus its exact
    rounding error (TwoSum) added to L, with f * (lb - L): for close means, mb - M is exact
    and M loses nothing. Symmetric, so the ring may combine incoming and own either way."""
    M, L, M2, W = acc
    mb, lb, m2b, wb = other
    n, f, dh, dl, g, s, z, e, t = (b.new("fp32", PER_ROW, Role.TEMPORARY) for _ in range(9))
    return [Step("binary", "add", n, (W, wb)),
            Step("binary", "div", f, (wb, n)),
            Step("binary", "sub", dh, (mb, M)),
            Step("binary", "sub", dl, (lb, L)),
            Step("binary", "mul", g, (f, dh)),
            Step("binary", "add", s, (M, g)),           # TwoSum(M, g) = s + e
            Step("binary", "sub", z, (s, M)),
            Step("binary", "sub", e, (s, z)),
            Step("binary", "sub", e, (M, e)),
            Step("binary", "sub", t, (g, z)),
            Step("binary", "add", e, (e, t)),
            Step("binary", "mul", t, (f, dl)),
            Step("binary", "add", e, (e, t)),
            Step("binary", "add", L, (L, e)),
            Step("unary", "copy", M, (s,)),
            Step("binary", "add", dh, (dh, dl)),         # delta
            Step("binary", "mul", g, (dh, dh)),
            Step("binary", "mul", g, (g, W)),
            Step("binary", "mul", g, (g, f)),            # delta^2 * W * wb / n
            Step("binary", "add", M2, (M2, m2b)),
            Step("binary", "add", M2, (M2, g)),
            Step("unary", "copy", W, (n,))]


__all__ = ["accumulate", "chan", "exact"]
