"""Spyre-only lowerings: pointwise ops Inductor would otherwise hand to an extern ATen kernel.

Inductor lowers ``integer ** integer tensor`` (``aten.pow.Tensor_Tensor`` and
``aten.pow.Scalar`` on integers) to a FallbackKernel calling ATen, because
its C++ and Triton backends have no integer ``ops.pow``. On spyre that
would run the op outside any program (the eager device's CPU fallback). The
ISA's pow computes integer powers with ATen's own semantics (wrapping on
overflow; a negative exponent gives 0, or +-1 for a base of +-1), so on
spyre the op stays an ordinary pointwise ``ops.pow`` that captures and fuses.

Each lowering here is device-conditional (TORCH_NOTES: "a device-conditional
lowering"): on any other device it calls Inductor's own lowering, so CPU
and GPU graphs are lowered exactly as before. They are installed once, by
registration.register(), before the first spyre graph is lowered.
"""

from __future__ import annotations

import threading

import torch
from torch._inductor import ir
from torch._inductor import lowering as L

aten = torch.ops.aten
_lock = threading.Lock()
_installed = False


def _on_spyre(*args) -> bool:
    for a in args:
        if isinstance(a, ir.IRNode):
            device = a.get_device()
            return device is not None and device.type == "spyre"
    return False


def _integer(*args) -> bool:
    return any(isinstance(a, ir.IRNode) and not a.get_dtype().is_floating_point for a in args)


def _spyre_pow(inductor_pow):
    def lowering(a, b):
        # Only a tensor exponent reaches ATen for integers: constant exponents are unrolled
        # into multiplications by Inductor itself (and negative ones are an error in ATen).
        if isinstance(b, ir.IRNode) and _integer(a, b) and _on_spyre(a, b):
            a, b = L.promote_constants([a, b])
            return L.pow_native(a, b)
        return inductor_pow(a, b)

    return lowering


def install() -> None:
    """Register the spyre-conditional lowerings (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        for overload in (aten.pow.Tensor_Tensor, aten.pow.Scalar):
            inductor_pow = L.lowerings[overload]
            L.register_lowering(overload, broadcast=True)(_spyre_pow(inductor_pow))
        _installed = True
