"""What generated CPU fallback kernels call at run time (imported as ``spyre_host``).

A fallback kernel (compiler/inductor/host_kernel.py) is the node's own loop body, evaluated
with whole-tensor torch CPU ops instead of a loop: each loop variable is an
``arange`` broadcast along its dim, an index expression evaluates to a
tensor of element positions, a load gathers, a store scatters. The buffers
are CPU tensors aliasing the device bytes (the simulated device memory is
host-addressable, as in device/fallback.py), flattened to 1-D from the
tensor's first element, because Inductor's indices count elements from
there. The kernel runs as a host operation on the current stream, in order
with queued device work that touches the same memory.

Floating values are computed in fp32 when they are stored as fp16/bf16
(Inductor's compute-type contract) and rounded on store. A scan (cumsum,
cumprod, logcumsumexp, ...) runs its combine function step by step along the
scan dim in the accumulator type CPU eager uses (at::acc_type<T, false>:
fp32 for fp16/bf16, fp64 for fp32, int64 for integers), so its running
value is rounded once, at the store, exactly as eager rounds it.
"""

from __future__ import annotations

import functools
import math
import time

import torch

from spyre_runtime import _C

from ..compiler.ir.scalars import scalar_as

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def scan_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a scan's running value is held in: CPU eager's at::acc_type<dtype, false>."""
    if dtype in _LOW_PRECISION:
        return torch.float32
    if dtype == torch.float32:
        return torch.float64
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return dtype
    return torch.int64  # every integer type accumulates in int64 (same bits once cast back)


# ---- buffers -----------------------------------------------------------------------


def flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D CPU view of every element `t` can address, starting at its first element."""
    host = _C.host_alias(t) if t.device.type == "spyre" else t
    if t.numel() == 0:
        return host.new_empty(0)
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return host.as_strided((span,), (1,))


def iota(shape) -> list[torch.Tensor]:
    """One int64 tensor per dim of `shape`: its index along that dim, broadcastable to `shape`."""
    rank = len(shape)
    out = []
    for d, size in enumerate(shape):
        view = [1] * rank
        view[d] = int(size)
        out.append(torch.arange(int(size), dtype=torch.int64).view(view))
    return out


def _index(index, mask):
    index = torch.as_tensor(index, dtype=torch.int64)
    if mask is not None:
        # Masked-off lanes may hold out-of-range positions (padding, cat):
        # read a harmless element there; the caller discards it.
        index = torch.where(mask, index, 0)
    return index


def load(buffer: torch.Tensor, index, mask=None) -> torch.Tensor:
    values = buffer[_index(index, mask)]
    return values.to(compute_dtype(values.dtype))


def store(buffer: torch.Tensor, index, value, mode=None) -> None:
    index = torch.as_tensor(index, dtype=torch.int64)
    value = torch.as_tensor(value)
    index, value = torch.broadcast_tensors(index, value)
    if mode == "atomic_add":
        if buffer.dtype in (torch.float16, torch.bfloat16):
            # duplicates add in fp32 and round once, as eager's scatter_add / index_add (and
            # Inductor's CPU backend) do; rounding each contribution drifts (2000 x 0.1: 230, not 200)
            total = buffer.float()
            total.index_put_((index.reshape(-1),), value.reshape(-1).float(), accumulate=True)
            buffer.copy_(total)
        else:
            buffer.index_put_((index.reshape(-1),), value.reshape(-1).to(buffer.dtype), accumulate=True)
    elif mode is None:
        buffer[index.reshape(-1)] = value.reshape(-1).to(buffer.dtype)
    else:
        raise NotImplementedError(f"spyre CPU fallback: store mode {mode!r}")


def with_traced_layout(t, size, stride):
    """An extern kernel's or fallback op's result `t` in the layout the graph was traced with.

    The op ran through the device's eager kernels or its CPU fallback, which return the layout
    the CPU kernel chose (a convolution of a channels-last input is channels-last), while the
    graph was traced with the op's meta layout (contiguous, for a device the meta does not know)
    and its later kernels read the buffer with those strides. `t` itself when the strides
    agree (the stride of a dim of one element does not matter, as in assert_size_stride), so a
    view stays a view; otherwise a copy with the traced strides. A result of another shape is
    returned as it is, for the graph's size assertion to report.
    """
    if not isinstance(t, torch.Tensor):
        return t
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if tuple(t.shape) != size or t.numel() == 0:
        return t
    if all(n == 1 or a == b for n, a, b in zip(size, t.stride(), stride)):
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


# ---- values ------------------------------------------------------------------------


def constant(value, dtype: torch.dtype) -> torch.Tensor:
    # Converted as the compiled path converts it (scalars.scalar_as: 1e39 in fp32 is inf, integers wrap).
    if dtype.is_complex:
        return torch.tensor(value, dtype=torch.complex128).to(compute_dtype(dtype))
    return torch.tensor(scalar_as(value, compute_dtype(dtype)), dtype=compute_dtype(dtype))


def index_value(value, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(value).to(dtype)


def to_dtype(x, dtype: torch.dtype) -> torch.Tensor:
    # Rounds to `dtype`, then back to the compute type, as Inductor's to_dtype does.
    return torch.as_tensor(x).to(dtype).to(compute_dtype(dtype))


def bitcast(x, dtype: torch.dtype, src_dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(x).to(src_dtype).view(dtype).to(compute_dtype(dtype))


def where(cond, a, b) -> torch.Tensor:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.dtype != b.dtype:
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
    return torch.where(torch.as_tensor(cond, dtype=torch.bool), a, b)


def minimum(*xs):
    return functools.reduce(lambda a, b: torch.minimum(torch.as_tensor(a), torch.as_tensor(b)), xs)


def maximum(*xs):
    return functools.reduce(lambda a, b: torch.maximum(torch.as_tensor(a), torch.as_tensor(b)), xs)


def indirect(x, size, wrap_neg: bool = True) -> torch.Tensor:
    x = torch.as_tensor(x).to(torch.int64)
    if wrap_neg:
        x = torch.where(x < 0, x + size, x)
    return x


def check_bounds(index, size, lower: bool, upper: bool, mask=None) -> None:
    index = torch.as_tensor(index)
    bad = torch.zeros_like(index, dtype=torch.bool)
    if lower:
        bad |= index < 0
    if upper:
        bad |= index >= size
    if mask is not None:
        bad &= mask
    if bool(bad.any()):
        raise IndexError(f"index out of bounds: an index is outside [0, {size})")


def truncdiv(a, b):
    return torch.div(a, b, rounding_mode="trunc")


def fma(a, b, c):
    return a * b + c


# ---- reductions --------------------------------------------------------------------


# What reduce() and store() implement: the generator (compiler/inductor/host_kernel.py) refuses anything else at
# compile time, so an unknown kind can never reach a queued host operation.
REDUCTIONS = frozenset({"sum", "prod", "max", "min", "any", "argmax", "argmin", "xor_sum", "welford_reduce",
                        "welford_combine", "dot"})


class Product:
    """ops.dot(a, b) of a matmul: the two operands, contracted by reduce(..., "dot")."""

    def __init__(self, a, b):
        self.a, self.b = a, b
STORE_MODES = frozenset({None, "atomic_add"})


def reduce(value, kind: str, shape, reduced: int, dtype: torch.dtype):
    """Reduce `value` (broadcastable to `shape`) over its last `reduced` dims, keeping them as 1s."""
    shape = tuple(int(s) for s in shape)
    kept, rnumel = shape[: len(shape) - reduced], math.prod(shape[len(shape) - reduced:])
    keep_shape = kept + (1,) * reduced
    if kind == "dot":
        if reduced != 1:
            raise ValueError(f"a dot reduces one dim, not {reduced}")
        acc = compute_dtype(dtype)
        a, b = (torch.as_tensor(v).to(acc) for v in (value.a, value.b))
        out = torch.einsum("...k,...k->...", a, b)
        return out.expand(kept).to(dtype).reshape(keep_shape)
    # Welford in float64, as PyTorch's CPU var accumulates: in fp32, data far from zero relative to
    # its spread (rows of 123456.789) lose the whole variance to the rounding of the mean.
    if kind == "welford_combine":
        parts = [torch.as_tensor(v) for v in value]
        mean, m2, weight = (v.to(torch.float64).expand(shape).reshape(kept + (rnumel,)) for v in parts)
        total = weight.sum(-1)
        safe = torch.where(total == 0, torch.ones_like(total), total)
        new_mean = (mean * weight).sum(-1) / safe
        new_m2 = (m2 + weight * (mean - new_mean.unsqueeze(-1)) ** 2).sum(-1)
        return tuple(t.to(p.dtype).reshape(keep_shape) for t, p in zip((new_mean, new_m2, total), parts))
    flat_values = torch.as_tensor(value).expand(shape).reshape(kept + (rnumel,))
    acc = compute_dtype(dtype)
    if kind == "sum":
        out = flat_values.sum(-1, dtype=acc if acc.is_floating_point else None)
    elif kind == "prod":
        out = flat_values.prod(-1)
    elif kind == "max":
        out = flat_values.amax(-1) if rnumel else flat_values.sum(-1)
    elif kind == "min":
        out = flat_values.amin(-1) if rnumel else flat_values.sum(-1)
    elif kind == "any":
        out = flat_values.to(torch.bool).any(-1)
    elif kind == "argmax":  # torch.argmax takes no bools; as 0/1 the first True wins, as in torch.max
        out = (flat_values.to(torch.uint8) if flat_values.dtype == torch.bool else flat_values).argmax(-1)
    elif kind == "argmin":
        out = (flat_values.to(torch.uint8) if flat_values.dtype == torch.bool else flat_values).argmin(-1)
    elif kind == "xor_sum":
        out = functools.reduce(torch.bitwise_xor, flat_values.unbind(-1), torch.zeros_like(flat_values[..., 0]))
    elif kind == "welford_reduce":
        out = acc if flat_values.dtype.is_floating_point else torch.float32
        x = flat_values.to(torch.float64)
        mean = x.mean(-1)
        m2 = ((x - mean.unsqueeze(-1)) ** 2).sum(-1)
        weight = torch.full_like(mean, float(rnumel))
        return tuple(t.to(out).reshape(keep_shape) for t in (mean, m2, weight))
    else:
        raise NotImplementedError(f"spyre CPU fallback: reduction {kind!r}")
    return out.to(acc).reshape(keep_shape)


# ---- scans -------------------------------------------------------------------------


def scan(values, combine, shape, dtypes) -> tuple[torch.Tensor, ...]:
    """Inclusive scan of `values` (one per dtype, each broadcastable to `shape`) along the last dim.

    `combine(*a, *b)` merges the running values `a` with the next column `b`
    (Inductor's combine_fn, written out as torch code) and returns a tuple:
    acc = v[..., 0]; out[..., k] = acc = combine(acc, v[..., k]). Runs in
    scan_dtype and returns each output in the compute dtype of its dtype.
    """
    shape = tuple(int(s) for s in shape)
    accs = tuple(scan_dtype(d) for d in dtypes)
    columns = [torch.as_tensor(v).to(a).expand(shape).unbind(-1) for v, a in zip(values, accs)]
    n = shape[-1]
    if n == 0:
        return tuple(torch.empty(shape, dtype=compute_dtype(d)) for d in dtypes)
    running = tuple(c[0] for c in columns)
    steps = [running]
    for k in range(1, n):
        merged = combine(*running, *(c[k] for c in columns))
        # Type promotion in the combine body (a Python constant, a comparison) must not change the
        # running type; a constant result must still have one value per lane.
        running = tuple(torch.as_tensor(m).to(a).expand(shape[:-1]) for m, a in zip(merged, accs, strict=True))
        steps.append(running)
    return tuple(torch.stack([step[i] for step in steps], -1).to(compute_dtype(d)) for i, d in enumerate(dtypes))


# ---- running -----------------------------------------------------------------------


def run(body, args, written: tuple[int, ...], name: str, kernel: str = "", reason: str = "") -> None:
    """Run `body` over flat CPU views of `args` as a host operation on the current stream.
    `name`: the ops it computes; `kernel`: its name in the graph; `reason`: why it is not a
    program. Its first run in a process warns, naming it; every run is counted in
    torch.spyre.fallback_reports() (the graph: the generated module's file)."""
    from spyre_inductor.device.fallback import record_fallback

    from .fallback_policy import first_run

    code = body.__code__
    first_run(code, kernel or "(unnamed)", name, reason or "not a spyre program")
    spyre = [a for a in args if isinstance(a, torch.Tensor) and a.device.type == "spyre"]

    def execute():
        start = time.perf_counter()
        try:
            body(*[flat(a) if isinstance(a, torch.Tensor) else a for a in args])
        finally:
            record_fallback("kernel", kernel or "(unnamed)", name, code.co_filename, time.perf_counter() - start)

    if not spyre:
        execute()
        return
    from spyre_inductor.device import queues

    devices = sorted({a.device.index for a in spyre})
    if len(devices) > 1:  # one host operation is ordered on one device's stream only
        raise RuntimeError(f"spyre CPU fallback ({name}): its buffers are on spyre devices {devices}; "
                           f"a compiled graph's buffers must share one device")
    writes = [args[i] for i in written if isinstance(args[i], torch.Tensor) and args[i].device.type == "spyre"]
    queues.run_on_host(spyre[0].device.index, execute, reads=spyre, writes=writes,
                       name=f"cpu fallback ({name})")
