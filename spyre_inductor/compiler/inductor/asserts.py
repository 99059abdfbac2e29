"""``aten._assert_async`` in a compiled spyre graph: the condition a program, the check in order.

Inductor lowers an assert to a pointwise ``device_assert_async`` over the condition, which the
spyre kernel IR has no instruction for (a program cannot stop the card). On spyre the condition
(``torch.all(ids >= 0)``, one_hot's range checks) is realized, a reduction program of its own,
and the assert stays the aten op: the generated code calls it on the spyre tensor, and the
device's kernel (device/asserts.py) queues the check on the current stream without waiting, as
CUDA's device-side asserts are asynchronous. Not a CPU fallback: no tensor's bytes are computed
on the host, one element is read.
"""

from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L

aten = torch.ops.aten
OPS = (aten._assert_async.msg, aten._functional_assert_async.msg)


def _on_spyre(x) -> bool:
    device = x.get_device() if isinstance(x, ir.IRNode) else None
    return device is not None and device.type == "spyre"


def _spyre_assert(op, inductor_lowering):
    def lowering(cond, msg, *token):
        if not _on_spyre(cond):
            return inductor_lowering(cond, msg, *token)
        cond.realize()
        # the side-effecting form even for the functional one, whose FallbackKernel Inductor would
        # drop as unused (it is not impure); its token passes through
        L.fallback_handler(aten._assert_async.msg, add_to_fallback_set=False)(cond, msg)
        return token[0] if token else None

    return lowering


def install() -> None:
    """Register the spyre-conditional assert lowerings (once, by lowerings.install)."""
    for op in OPS:
        L.register_lowering(op, type_promotion_kind=None)(_spyre_assert(op, L.lowerings[op]))
