"""Hand-built kernel IR for the planner and launch tests (no Inductor involved)."""

from __future__ import annotations

from spyre_inductor.compiler.ir.kernel_ir import (
    DTYPE_NAMES, Buffer, Cast, Constant, Index, Load, Op, PointwiseKernel, Store,
)


def contiguous(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def broadcast_strides(shape, out_shape):
    """Strides of a contiguous `shape` tensor broadcast (right-aligned) to `out_shape`; 0 where broadcast."""
    own = contiguous(shape)
    lead = len(out_shape) - len(shape)
    out = []
    for d in range(len(out_shape)):
        k = d - lead
        out.append(0 if k < 0 or shape[k] == 1 else own[k])
    return tuple(out)


class KernelBuilder:
    """Build a PointwiseKernel op by op: values are positions; dtypes are IR names (fp32, fp16, ...)."""

    def __init__(self, name, ranges):
        self.name, self.ranges = name, tuple(ranges)
        self.buffers, self.values, self.stores = [], [], []

    def buffer(self, name, dtype, shape, strides=None, offset=0):
        self.buffers.append(Buffer(name, dtype, tuple(shape), tuple(strides or contiguous(shape)), offset))
        return name

    def _add(self, v):
        self.values.append(v)
        return len(self.values) - 1

    def load(self, buffer, strides=None, offset=0):
        b = next(b for b in self.buffers if b.name == buffer)
        strides = strides if strides is not None else broadcast_strides(b.shape, self.ranges) \
            if b.strides == contiguous(b.shape) else b.strides
        return self._add(Load(buffer, Index(tuple(strides), offset), b.dtype))

    def const(self, value, dtype="fp32"):
        return self._add(Constant(value, dtype))

    def op(self, name, *args, dtype="fp32"):
        return self._add(Op(name, tuple(args), dtype))

    def cast(self, arg, dtype):
        return self._add(Cast(arg, dtype))

    def store(self, buffer, value, strides=None, offset=0):
        b = next(b for b in self.buffers if b.name == buffer)
        self.stores.append(Store(buffer, Index(tuple(strides or b.strides), offset), value))

    def build(self) -> PointwiseKernel:
        k = PointwiseKernel(self.name, self.ranges, tuple(self.buffers), tuple(self.values), tuple(self.stores))
        k.check()
        return k


def binary_kernel(op, shape, dtype="fp32", y_shape=None, name=None):
    """out = op(x, y), computed in fp32 (fp16 inputs widened, the result rounded on store)."""
    k = KernelBuilder(name or f"{op}_{dtype}", shape)
    k.buffer("x", dtype, shape)
    k.buffer("y", dtype, shape if y_shape is None else y_shape)
    k.buffer("out", dtype, shape)
    a, b = k.cast(k.load("x"), "fp32"), k.cast(k.load("y"), "fp32")
    k.store("out", k.cast(k.op(op, a, b), dtype))
    return k.build()


def unary_kernel(op, shape, dtype="fp32"):
    k = KernelBuilder(f"{op}_{dtype}", shape)
    k.buffer("x", dtype, shape)
    k.buffer("out", dtype, shape)
    k.store("out", k.cast(k.op(op, k.cast(k.load("x"), "fp32")), dtype))
    return k.build()


__all__ = ["DTYPE_NAMES", "KernelBuilder", "binary_kernel", "broadcast_strides", "contiguous", "unary_kernel"]
