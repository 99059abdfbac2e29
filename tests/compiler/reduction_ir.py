"""Hand-built reduction kernels (the IR Inductor's capture would hand over), for the reduction tests."""

from __future__ import annotations

from spyre_inductor.compiler.ir.kernel_ir import Index, Kernel, Reduction, Store

from pointwise_ir import KernelBuilder, contiguous


class ReductionBuilder(KernelBuilder):
    """Outer ranges + reduction ranges; loads/stores take explicit strides over both (outer first)."""

    def __init__(self, name, ranges, reduction_ranges):
        super().__init__(name, ranges)
        self.rranges = tuple(reduction_ranges)

    def store(self, buffer, value, strides, offset=0):
        self.stores.append(Store(buffer, Index(tuple(strides), offset), value))

    def reduce(self, op, arg, dtype="fp32"):
        return self._add(Reduction(op, arg, dtype))

    def build(self) -> Kernel:
        k = Kernel.of(self.name, self.ranges, tuple(self.buffers), tuple(self.values), tuple(self.stores),
                            self.rranges)
        k.check()
        return k


def f32(b, v, dtype):
    return b.cast(v, "fp32") if dtype != "fp32" else v


def row_reduce(op, shape, dim, dtype="fp32", out_dtype=None):
    """x.<op>(dim) of a contiguous x: outer = the other dims, reduced = dim."""
    nd = len(shape)
    dim %= nd
    strides = contiguous(shape)
    outer = [d for d in range(nd) if d != dim]
    ranges = [shape[d] for d in outer]
    out_shape = tuple(ranges)
    b = ReductionBuilder(f"{op}_{dim}_{dtype}", ranges, (shape[dim],))
    b.buffer("x", dtype, shape)
    odt = out_dtype or ("int64" if op in ("argmax", "argmin") else "bool" if op in ("any", "all") else dtype)
    b.buffer("out", odt, out_shape)
    x = b.load("x", [strides[d] for d in outer] + [strides[dim]])
    rdt = "int64" if op in ("argmax", "argmin") else "bool" if op in ("any", "all") else "fp32"
    r = b.reduce(op, x if op in ("any", "all", "argmax", "argmin") else f32(b, x, dtype), rdt)
    if odt != rdt:
        r = b.cast(r, odt)
    b.store("out", r, list(contiguous(out_shape)) + [0])
    return b.build()


def softmax_kernel(shape, dtype="fp16", dim=-1, log=False):
    rows, cols = shape
    if dim in (-1, 1):
        ranges, red, xs = (rows,), (cols,), [cols, 1]
    else:
        ranges, red, xs = (cols,), (rows,), [1, cols]
    b = ReductionBuilder(("log_" if log else "") + f"softmax_{dim}_{dtype}", ranges, red)
    b.buffer("x", dtype, shape)
    b.buffer("out", dtype, shape)
    x = f32(b, b.load("x", xs), dtype)
    m = b.reduce("max", x)
    d = b.op("sub", x, m)
    e = b.op("exp", d)
    s = b.reduce("sum", e)
    if log:
        y = b.op("sub", d, b.op("log", s))
    else:
        y = b.op("truediv", e, s)
    b.store("out", b.cast(y, dtype) if dtype != "fp32" else y, xs)
    return b.build()


def layer_norm_kernel(shape, dtype="fp16", eps=1e-5, affine=True):
    rows, cols = shape
    b = ReductionBuilder(f"layer_norm_{dtype}", (rows,), (cols,))
    b.buffer("x", dtype, shape)
    if affine:
        b.buffer("w", dtype, (cols,))
        b.buffer("b", dtype, (cols,))
    b.buffer("out", dtype, shape)
    x = f32(b, b.load("x", [cols, 1]), dtype)
    mean = b.reduce("welford_mean", x)
    m2 = b.reduce("welford_m2", x)
    b.reduce("welford_weight", x)
    var = b.op("truediv", m2, b.const(float(cols)))
    rstd = b.op("rsqrt", b.op("add", var, b.const(eps)))
    y = b.op("mul", b.op("sub", x, mean), rstd)
    if affine:
        y = b.op("add", b.op("mul", y, f32(b, b.load("w", [0, 1]), dtype)), f32(b, b.load("b", [0, 1]), dtype))
    b.store("out", b.cast(y, dtype) if dtype != "fp32" else y, [cols, 1])
    return b.build()
