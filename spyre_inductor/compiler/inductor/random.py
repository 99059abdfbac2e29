"""Random numbers in spyre programs (issue 19): the ``spyre::philox`` op, its lowering, and the
compiled kernels behind the eager random fills.

Two routes reach the ISA's ``philox`` instruction (spyre_runtime/program/philox.py):

* Compiled graphs: Inductor replaces ``rand``/``randn``/``randint`` (and so ``rand_like``,
  dropout's mask, ``bernoulli``) by ``inductor_random(size, lookup_seed(seeds, k), mode)``
  (fx_passes/replace_random.py; ``config.fallback_random`` stays False). The seeds come from
  one extern ``aten.randint.low_out`` over the whole int64 range on the device, which is
  ``random_`` on spyre: the eager kernel below, so they come from the device generator's Philox
  state; ``ops.rand(seed, index)`` inside the pointwise kernel is captured as an IR op and
  becomes a ``philox`` instruction (capture.py, fusion.isa_op). Nothing here is needed for that
  beyond the eager ``random_``.
* Eager fills (``normal_``, ``uniform_``, ``bernoulli_``, ``random_``, ``native_dropout``, and
  ``exponential_``, ``log_normal_``, ``cauchy_``, ``geometric_`` from the same draws):
  ``spyre::philox(state, size, mode)`` draws element i at (key, offset + i) where
  ``state = [key, offset, low, high]`` is a small int64 tensor on the device; it lowers
  (``lower_philox``) to a pointwise node over ``ops.rand``/``ops.randn``/``ops.randint64`` of
  loaded state values, so the key, offset and range travel at launch and a compiled kernel
  serves every call of its shape. Each fill is a tiny graph (the draw, its scaling, the cast,
  the store into the tensor in place) compiled once per (kernel, shape, strides, dtype, device)
  through ``torch._inductor.compile`` (no Dynamo: no recompile limit, no graph breaks) and
  launched per call. ``spyre_inductor.device.random_ops`` registers them as the PrivateUse1
  kernels; a compile-backed eager dispatcher can call the same functions.

The kernel functions are for real tensors, outside a trace (they draw from the generator and
launch): inside torch.compile, Inductor's own random lowering above is what applies.

``randperm``: randperm.py sorts philox keys with the sort family's network (a stable argsort,
up to its MAX_N); above that limit it keeps the CPU fallback (the C++ generator's
Mersenne Twister there, still seeded by torch.spyre.manual_seed), refused by name under
SPYRE_STRICT=1.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import sympy
import torch

from spyre_runtime.program.philox import philox as philox_values

from ...device import fallback
from ...device import random as device_random

MODES = ("uniform", "normal", "randint", "span63", "bits64")
_TWO32 = 1 << 32


# ---- the op ---------------------------------------------------------------------------------


def philox_reference(state: torch.Tensor, size, mode: str) -> torch.Tensor:
    """What ``spyre::philox`` computes, on the host (the op's default implementation and the
    tests' reference): element i (row-major) drawn at counter offset + i (span63 and bits64: two
    draws at offset + 2i and offset + 2i + 1)."""
    key, offset, low, high = (int(v) for v in state.cpu().tolist())
    n = 1
    for s in size:
        n *= int(s)
    key_t = torch.tensor(key, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    if mode in ("uniform", "normal"):
        out = philox_values(key_t, offset + pos, mode)
    elif mode == "randint":
        out = low + philox_values(key_t, offset + pos, "bits63") % (high - low)
    elif mode in ("span63", "bits64"):
        lo = philox_values(key_t, offset + 2 * pos, "bits63") % _TWO32
        if mode == "span63":
            out = low + (philox_values(key_t, offset + 2 * pos + 1, "bits63") % (1 << 31)) * _TWO32 + lo
        else:
            out = (philox_values(key_t, offset + 2 * pos + 1, "bits63") % _TWO32 - (1 << 31)) * _TWO32 + lo
    else:
        raise ValueError(f"spyre::philox mode {mode!r} is not one of {MODES}")
    return out.reshape([int(s) for s in size])


def _result_dtype(mode: str) -> torch.dtype:
    return torch.float32 if mode in ("uniform", "normal") else torch.int64


@torch.library.custom_op("spyre::philox", mutates_args=())
def philox(state: torch.Tensor, size: list[int], mode: str) -> torch.Tensor:
    """Philox draws of `size` from ``state = [key, offset, low, high]`` (int64): fp32 for
    uniform/normal, int64 for randint ([low, high)), span63 ([low, low + 2**63)) and bits64 (the
    whole int64 range). On
    spyre it is lowered into the surrounding program (lower_philox); this host implementation
    is the reference (and what runs if it is ever called eagerly: on the host, so refused on
    spyre under SPYRE_STRICT=1 like any CPU fallback)."""
    if state.device.type == "spyre" and fallback.strict():
        raise NotImplementedError("spyre: spyre::philox called eagerly runs on the CPU (it is meant to be lowered "
                                  "into a compiled program) and SPYRE_STRICT=1 forbids the CPU fallback")
    return philox_reference(state, size, mode).to(state.device)


@philox.register_fake
def _(state, size, mode):
    return state.new_empty(size, dtype=_result_dtype(mode))


OP = torch.ops.spyre.philox.default


def lower_philox(state, size, mode: str):
    """The Inductor lowering of spyre::philox: a pointwise node whose element i is
    ops.rand/randn/randint64(key, offset + i) with key, offset, low and high loaded from `state`."""
    from torch._inductor import ir
    from torch._inductor.lowering import Pointwise
    from torch._inductor.virtualized import ops

    if mode not in MODES:
        raise ValueError(f"spyre::philox mode {mode!r} is not one of {MODES}")
    size = [int(s) for s in size]
    device, dtype = state.get_device(), _result_dtype(mode)
    load = state.make_loader()
    position = ir.FixedLayout(device, dtype, size, ir.FlexibleLayout.contiguous_strides(size)).make_indexer()

    def word(k):
        return load([sympy.Integer(k)])

    def const(v):
        return ops.constant(v, torch.int64)

    def inner_fn(index):
        key, offset = word(0), word(1)
        pos = ops.index_expr(position(index), torch.int64)
        if mode == "uniform":
            return ops.rand(key, ops.add(offset, pos))
        if mode == "normal":
            return ops.randn(key, ops.add(offset, pos))
        if mode == "randint":
            return ops.randint64(key, ops.add(offset, pos), word(2), word(3))
        # Ranges of 2**63 or more values, from two draws of 32 and 31 (span63: [low, low + 2**63))
        # or 32 bits (bits64: the whole int64 range), at counters offset + 2i and offset + 2i + 1.
        two = ops.mul(pos, const(2))
        lo = ops.randint64(key, ops.add(offset, two), const(0), const(_TWO32))
        hi_counter = ops.add(offset, ops.add(two, const(1)))
        if mode == "span63":
            hi = ops.randint64(key, hi_counter, const(0), const(1 << 31))
            return ops.add(word(2), ops.add(ops.mul(hi, const(_TWO32)), lo))
        hi = ops.randint64(key, hi_counter, const(0), const(_TWO32))
        return ops.add(ops.mul(ops.sub(hi, const(1 << 31)), const(_TWO32)), lo)

    node = Pointwise.create(device=device, dtype=dtype, inner_fn=inner_fn, ranges=size)
    node.realize()  # computed once, like Inductor's own inductor_random
    return node


# ---- compiled kernels -------------------------------------------------------------------------

# Compiled kernels by specialisation, least recently used first; bounded so a program that fills
# tensors of ever new shapes does not keep every kernel (an evicted one is compiled again, from
# Inductor's FX graph cache when it is on).
CACHE_SIZE = 256
_cache: "OrderedDict[tuple, object]" = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0, "evictions": 0}


def cache_stats() -> dict[str, int]:
    """Hits, misses (each a compile) and evictions of the compiled random kernels, and the size."""
    with _cache_lock:
        return dict(_stats, size=len(_cache))


def _spec(t: torch.Tensor) -> tuple:
    # What a compiled kernel is specialised on: Inductor's wrapper checks sizes and strides, and
    # a buffer's place within a stick changes the program's transfers.
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device.index, t.data_ptr() % 128)


def launch_graph(kind: str, build, tensors: tuple[torch.Tensor, ...], extra=()):
    """Run the graph `build()` returns on `tensors`, compiling it once per specialisation."""
    from ...launcher.nesting import nested

    key = (kind, tuple(extra)) + tuple(_spec(t) for t in tensors)
    # nested(): what Inductor runs on spyre tensors while it compiles this (its pattern set-up,
    # constant folding) must not itself be compiled by the eager path, inside this compile
    with _cache_lock, nested():  # (the lock is held while compiling: a kernel is compiled once)
        fn = _cache.get(key)
        if fn is not None:
            _stats["hits"] += 1
            _cache.move_to_end(key)
        else:
            from torch._inductor import compile as inductor_compile

            _stats["misses"] += 1
            fn = _cache[key] = inductor_compile(torch.fx.symbolic_trace(build()), list(tensors))
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
                _stats["evictions"] += 1
    return fn(*tensors)


def philox_state(generator, device: torch.device, counters: int, low: int = 0, high: int = 0) -> torch.Tensor:
    key, offset = device_random.reserve(generator, device, counters)
    return torch.tensor([key, offset, low, high], dtype=torch.int64).to(device)


def _params(device: torch.device, *values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(device)


def _check_floating(self: torch.Tensor, op: str) -> None:
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"{op} expects floating-point outputs but got {self.dtype}")


# Each float fill: the philox mode it draws and its value from the draw `u` and its parameters
# `p` (an fp32 tensor on the device, so values travel at launch), as the CPU computes it.
_FILLS = {
    "normal": ("normal", lambda u, p: u * p[1] + p[0]),                      # p: mean, std
    "uniform": ("uniform", lambda u, p: u * p[1] + p[0]),                    # p: from, to - from
    "exponential": ("uniform", lambda u, p: p[0] * torch.log1p(-u)),         # p: -1 / lambd
    "log_normal": ("normal", lambda u, p: torch.exp(u * p[1] + p[0])),       # p: mean, std
    # tan as sin / cos: the sfp has no tan
    "cauchy": ("uniform", lambda u, p: p[0] + p[1] * (torch.sin((u - 0.5) * math.pi) / torch.cos((u - 0.5) * math.pi))),
    "geometric": ("uniform", lambda u, p: torch.ceil(torch.log(u) / p[0])),  # p: log1p(-p)
}


def _float_fill(kind: str, self: torch.Tensor, generator, *params: float) -> torch.Tensor:
    _check_floating(self, f"{kind}_")
    if self.numel() == 0:
        return self
    mode, value = _FILLS[kind]
    shape, dtype = list(self.shape), self.dtype

    def build():
        def fill(out, state, p):
            out.copy_(value(philox(state, shape, mode), p).to(dtype))
        return fill

    launch_graph(kind, build, (self, philox_state(generator, self.device, self.numel()), _params(self.device, *params)))
    return self


def normal_(self: torch.Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> torch.Tensor:
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return _float_fill("normal", self, generator, mean, std)


def uniform_(self: torch.Tensor, low: float = 0.0, high: float = 1.0, generator=None) -> torch.Tensor:
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    return _float_fill("uniform", self, generator, low, high - low)


def exponential_(self: torch.Tensor, lambd: float = 1.0, generator=None) -> torch.Tensor:
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _float_fill("exponential", self, generator, -1.0 / lambd)


def log_normal_(self: torch.Tensor, mean: float = 1.0, std: float = 2.0, generator=None) -> torch.Tensor:
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    return _float_fill("log_normal", self, generator, mean, std)


def cauchy_(self: torch.Tensor, median: float = 0.0, sigma: float = 1.0, generator=None) -> torch.Tensor:
    if not sigma > 0.0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")  # (the CPU's check)
    return _float_fill("cauchy", self, generator, median, sigma)


def geometric_(self: torch.Tensor, p: float, generator=None) -> torch.Tensor:
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    return _float_fill("geometric", self, generator, math.log1p(-p))


def bernoulli_(self: torch.Tensor, p=0.5, generator=None) -> torch.Tensor:
    """Fills self with 1 where a uniform draw is below p (a float, or a tensor broadcast to self)."""
    if self.numel() == 0:
        return self
    shape, dtype = list(self.shape), self.dtype
    state = philox_state(generator, self.device, self.numel())
    if isinstance(p, torch.Tensor):
        if p.device != self.device or p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            p = p.to(self.device, torch.float32)  # (a program reads fp32, fp16 or bf16 probabilities)

        def build():
            def fill(out, state, prob):
                out.copy_((philox(state, shape, "uniform") < prob.to(torch.float32)).to(dtype))
            return fill

        launch_graph("bernoulli_tensor", build, (self, state, p))
        return self
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")

    def build():
        def fill(out, state, params):
            out.copy_((philox(state, shape, "uniform") < params[0]).to(dtype))
        return fill

    launch_graph("bernoulli", build, (self, state, _params(self.device, p)))
    return self


def bernoulli(self: torch.Tensor, generator=None) -> torch.Tensor:
    """A fresh tensor of 0/1 draws with probabilities `self`."""
    out = torch.empty_like(self, memory_format=torch.contiguous_format)
    return bernoulli_(out, self, generator)


# Significand digits (std::numeric_limits<T>::digits): random_() on a float draws [0, 2**digits],
# where every integer is exact, as the CPU does.
_DIGITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8, torch.float64: 53}


def _upper(dtype: torch.dtype) -> int:
    """The largest value random_ draws without a `to` (inclusive)."""
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return 2 ** _DIGITS[dtype]
    return torch.iinfo(dtype).max


def random_(self: torch.Tensor, low: int | None = None, high: int | None = None, generator=None) -> torch.Tensor:
    """random_(), random_(to) and random_(from, to): integers in [low, high) (high None: up to the
    dtype's largest, inclusive), as the CPU draws them."""
    low = 0 if low is None else int(low)
    high = _upper(self.dtype) + 1 if high is None else int(high)
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if self.numel() == 0:
        return self
    span = high - low
    if span < 1 << 63:
        mode, counters = "randint", self.numel()
    elif span == 1 << 63:  # random_() on int64: [0, 2**63 - 1]; 63 random bits, two draws each
        mode, counters, high = "span63", 2 * self.numel(), 0
    elif low == -(1 << 63) and high >= (1 << 63) - 1:
        # The whole int64 range (Inductor's seeds: [min, max)): 64 random bits, two draws each.
        # (For [min, max) the top value max itself comes out with probability 2**-64.)
        mode, counters, low, high = "bits64", 2 * self.numel(), 0, 0
    else:
        raise NotImplementedError(f"spyre: random_ over a range of {span} values (wider than 2**63 but not the whole "
                                  f"int64 range) is not compiled")
    shape, dtype = list(self.shape), self.dtype

    def build():
        def fill(out, state):
            out.copy_(philox(state, shape, mode).to(dtype))
        return fill

    launch_graph("random", build, (self, philox_state(generator, self.device, counters, low, high)), extra=(mode,))
    return self


def randint(low: int, high: int, size, *, generator=None, dtype: torch.dtype = torch.int64,
            device: torch.device | str = "spyre") -> torch.Tensor:
    """torch.randint on spyre: what its composite does (an empty tensor, then random_)."""
    out = torch.empty(size, dtype=dtype, device=device)
    return random_(out, low, high, generator)


def native_dropout(input: torch.Tensor, p: float, train: bool | None = True):
    """(output, mask): mask keeps an element where a uniform draw is below 1 - p, output is
    input * mask / (1 - p) (0 for p = 1), as the CPU's dropout computes it."""
    if train is not None and not train:
        def build_eval():
            def copy(x):
                return x.clone(), torch.ones_like(x, dtype=torch.bool)
            return copy
        return launch_graph("dropout_eval", build_eval, (input,))
    if input.numel() == 0:
        return input.clone(), torch.empty_like(input, dtype=torch.bool)
    shape = list(input.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)

    def build():
        def dropout(x, state, params):
            keep = philox(state, shape, "uniform") < params[0]
            return (x * keep.to(x.dtype) * params[1]).to(x.dtype), keep
        return dropout

    state = philox_state(None, input.device, input.numel())
    return launch_graph("dropout", build, (input, state, _params(input.device, 1.0 - p, scale)))


def native_dropout_backward(grad_output: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    def build():
        def backward(grad, keep, params):
            return (grad * keep.to(grad.dtype) * params[0]).to(grad.dtype)
        return backward

    return launch_graph("dropout_backward", build, (grad_output, mask, _params(grad_output.device, scale)))


__all__ = ["OP", "bernoulli", "bernoulli_", "cache_stats", "cauchy_", "exponential_", "geometric_", "log_normal_",
           "lower_philox", "native_dropout", "native_dropout_backward", "normal_", "philox", "philox_reference",
           "randint", "random_", "uniform_"]
