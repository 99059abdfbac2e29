"""The compile-backed spyre kernels of convolution_overrideable and its backward (issue 31).

PyTorch sends a convolution of PrivateUse1 tensors (conv2d, its autograd backward) to
``convolution_overrideable`` / ``convolution_backward_overrideable``. Their kernels here are the
eager path's own (kernel.make_kernel: traced, lowered by compiler/inductor/convolution_lowering.py
into a patch gather and a matmul, compiled, cached, launched), with two differences: a form the
lowering does not take (transposed, not 2-d) goes straight to the CPU route, its reason named
(strict mode's error says "a transposed convolution" rather than that a trace failed); and every
CPU route is the CPU convolution on host aliases (device/routes.py), since the CPU has no kernel
for the overrideable ops themselves.
"""

from __future__ import annotations

import dataclasses

from spyre_inductor.device.routes import HOST_ROUTES

from .kernel import make_kernel
from .signature import Signature


def with_host_route(sig: Signature) -> Signature:
    return dataclasses.replace(sig, host=HOST_ROUTES[sig.op])


def make_convolution_kernel(sig: Signature):
    """The spyre kernel of convolution(_backward)_overrideable; `sig` carries its CPU route."""
    compiled = make_kernel(sig)
    at = {name: sig.names.index(name) for name in ("input", "weight", "transposed", "groups")}
    host = sig.host

    def kernel(*args, **kwargs):
        from spyre_inductor.compiler.inductor.convolution import refusal  # (plain torch: no Inductor import)

        values = sig.bind(args, kwargs)
        why = refusal(values[at["input"]], values[at["weight"]], values[at["transposed"]], values[at["groups"]])
        if why is not None:
            return host(*args, reason=why, **kwargs)
        return compiled(*args, **kwargs)

    kernel.__name__ = compiled.__name__
    return kernel
