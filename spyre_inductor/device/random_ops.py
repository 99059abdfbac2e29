"""The spyre kernels of the random fills: PrivateUse1 registrations that run them in spyre programs.

``normal_``, ``uniform_``, ``bernoulli_`` (float and tensor p), ``bernoulli``, ``random_`` (all
three overloads; ``randint`` reaches it through its composite), ``exponential_``,
``log_normal_``, ``cauchy_``, ``geometric_``, ``native_dropout`` and its backward are compiled kernels drawing from the device generator's Philox state
(spyre_inductor/compiler/inductor/random.py). Factories (``torch.randn(4, device="spyre")``, ``rand``,
``randint``, ``*_like``) are composites over these, so they run in programs too, under
SPYRE_STRICT=1 as well.

Dtypes the programs do not have (fp64, complex) keep the CPU fallback, visibly (warned once,
refused under SPYRE_STRICT=1), drawing from the C++ generator's Mersenne Twister as before.
``randperm`` (every overload reaches ``randperm.generator_out``) runs in programs too
(compiler/inductor/randperm.py: random keys, then their stable argsort by the sort family's
network), up to ``randperm.MAX_N`` elements (what the network sorts in the scratchpad); above it,
and for float64, it keeps the CPU fallback, visibly (SPYRE_STRICT=1 refuses it naming randperm
and the limit).

Registered at device registration (cheap: nothing imports Inductor until the first fill).
"""

from __future__ import annotations

import torch

from . import fallback
from .fallback import run_on_host

aten = torch.ops.aten
_lib: torch.library.Library | None = None
FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
INTEGERS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


def _kernels():
    from spyre_inductor.compiler.inductor import random

    return random


def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    if self.dtype not in FLOATS:
        return run_on_host(aten.normal_.default, aten.normal_.default, self, mean, std, generator=generator)
    return _kernels().normal_(self, mean, std, generator)


def _uniform_(self, low=0.0, high=1.0, *, generator=None):
    if self.dtype not in FLOATS:
        return run_on_host(aten.uniform_.default, aten.uniform_.default, self, low, high, generator=generator)
    return _kernels().uniform_(self, low, high, generator)


def _distribution(name: str, op):
    # exponential_, log_normal_, cauchy_, geometric_: float fills of one uniform or normal draw
    def kernel(self, *params, generator=None):
        if self.dtype not in FLOATS:
            return run_on_host(op, op, self, *params, generator=generator)
        return getattr(_kernels(), name)(self, *params, generator=generator)
    return kernel


def _bernoulli_float(self, p=0.5, *, generator=None):
    if self.dtype not in FLOATS | INTEGERS:
        return run_on_host(aten.bernoulli_.float, aten.bernoulli_.float, self, p, generator=generator)
    return _kernels().bernoulli_(self, p, generator)


def _bernoulli_tensor(self, p, *, generator=None):
    if self.dtype not in FLOATS | INTEGERS or not p.is_floating_point():
        return run_on_host(aten.bernoulli_.Tensor, aten.bernoulli_.Tensor, self, p, generator=generator)
    return _kernels().bernoulli_(self, p, generator)


def _bernoulli(self, *, generator=None):
    if self.dtype not in FLOATS:
        return run_on_host(aten.bernoulli.default, aten.bernoulli.default, self, generator=generator)
    return _kernels().bernoulli(self, generator)


def _random_(self, *, generator=None):
    if self.dtype not in FLOATS | INTEGERS:
        return run_on_host(aten.random_.default, aten.random_.default, self, generator=generator)
    return _kernels().random_(self, None, None, generator)


def _random_to(self, to, *, generator=None):
    if self.dtype not in FLOATS | INTEGERS:
        return run_on_host(aten.random_.to, aten.random_.to, self, to, generator=generator)
    return _kernels().random_(self, 0, to, generator)


def _random_from(self, low, to=None, *, generator=None):
    if self.dtype not in FLOATS | INTEGERS:
        return run_on_host(aten.random_.from_, aten.random_.from_, self, low, to, generator=generator)
    return _kernels().random_(self, low, to, generator)


def _native_dropout(input, p, train):
    if input.dtype not in FLOATS:
        return run_on_host(aten.native_dropout.default, aten.native_dropout.default, input, p, train)
    return _kernels().native_dropout(input, p, train)


def _native_dropout_backward(grad_output, mask, scale):
    if grad_output.dtype not in FLOATS:
        return run_on_host(aten.native_dropout_backward.default, aten.native_dropout_backward.default,
                           grad_output, mask, scale)
    return _kernels().native_dropout_backward(grad_output, mask, scale)


def _randperm_out(n, *, generator=None, out):
    from spyre_inductor.compiler.inductor import randperm

    n = int(n)
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    randperm.check_dtype(n, out.dtype)
    op = aten.randperm.generator_out
    if out.dtype not in randperm.DTYPES:
        return fallback.run(op, (n,), {"generator": generator, "out": out},
                            f"randperm into {out.dtype}: no program stores that dtype")
    if n > randperm.MAX_N:
        return fallback.run(op, (n,), {"generator": generator, "out": out},
                            f"randperm of n = {n} is above its in-program limit of {randperm.MAX_N} "
                            f"(the longest row of keys the sorting network holds in the scratchpad)")
    return randperm.randperm_(out, n, generator)


KERNELS = {
    "normal_": _normal_,
    "uniform_": _uniform_,
    "bernoulli_.float": _bernoulli_float,
    "bernoulli_.Tensor": _bernoulli_tensor,
    "bernoulli": _bernoulli,
    "random_": _random_,
    "random_.to": _random_to,
    "random_.from": _random_from,
    "exponential_": _distribution("exponential_", aten.exponential_.default),
    "log_normal_": _distribution("log_normal_", aten.log_normal_.default),
    "cauchy_": _distribution("cauchy_", aten.cauchy_.default),
    "geometric_": _distribution("geometric_", aten.geometric_.default),
    "native_dropout": _native_dropout,
    "native_dropout_backward": _native_dropout_backward,
    "randperm.generator_out": _randperm_out,
}


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for name, kernel in KERNELS.items():
        _lib.impl(name, kernel, "PrivateUse1")
