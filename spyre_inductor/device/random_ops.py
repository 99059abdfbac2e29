"""The spyre kernels of the random fills: PrivateUse1 registrations that run them in spyre programs.

``normal_``, ``uniform_``, ``bernoulli_`` (float and tensor p), ``bernoulli``, ``random_`` (all
three overloads; ``randint`` reaches it through its composite), ``native_dropout`` and its
backward are compiled kernels drawing from the device generator's Philox state
(spyre_inductor/compiler/random.py). Factories (``torch.randn(4, device="spyre")``, ``rand``,
``randint``, ``*_like``) are composites over these, so they run in programs too, under
SPYRE_STRICT=1 as well. ``randperm`` is not here: it needs a sort the compiler lacks, and stays
on the CPU fallback (visible, refused under strict mode).

Registered at device registration (cheap: nothing imports Inductor until the first fill).
"""

from __future__ import annotations

import torch

_lib: torch.library.Library | None = None


def _kernels():
    from spyre_inductor.compiler import random

    return random


def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    return _kernels().normal_(self, mean, std, generator)


def _uniform_(self, low=0.0, high=1.0, *, generator=None):
    return _kernels().uniform_(self, low, high, generator)


def _bernoulli_(self, p=0.5, *, generator=None):
    return _kernels().bernoulli_(self, p, generator)


def _bernoulli(self, *, generator=None):
    return _kernels().bernoulli(self, generator)


def _random_(self, *, generator=None):
    return _kernels().random_(self, None, None, generator)


def _random_to(self, to, *, generator=None):
    return _kernels().random_(self, 0, to, generator)


def _random_from(self, low, to=None, *, generator=None):
    return _kernels().random_(self, low, to, generator)


def _native_dropout(input, p, train):
    return _kernels().native_dropout(input, p, train)


def _native_dropout_backward(grad_output, mask, scale):
    return _kernels().native_dropout_backward(grad_output, mask, scale)


KERNELS = {
    "normal_": _normal_,
    "uniform_": _uniform_,
    "bernoulli_.float": _bernoulli_,
    "bernoulli_.Tensor": _bernoulli_,
    "bernoulli": _bernoulli,
    "random_": _random_,
    "random_.to": _random_to,
    "random_.from": _random_from,
    "native_dropout": _native_dropout,
    "native_dropout_backward": _native_dropout_backward,
}


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for name, kernel in KERNELS.items():
        _lib.impl(name, kernel, "PrivateUse1")
