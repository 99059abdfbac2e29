"""The operand dtype check of the matmul family, which fake tensors do not make.

``mm``, ``addmm`` and ``mv`` take operands of different dtypes on fake (meta) tensors and
return the first one's dtype, so a torch.compile'd ``f32 @ f16`` and an eager spyre one
traced on fakes would compute in the first dtype and succeed, where the CPU and CUDA kernels
refuse ("expected m1 and m2 to have the same dtype, but got: float != c10::Half"). Before a
matmul of spyre operands compiles (the eager kernel: eager/compile.py; a compiled graph's
lowering: lowerings.py), its operands' dtypes are checked here, and the error is the CPU
kernel's own: when the dtypes differ, the op is called on one-element CPU stand-ins of the
operands (same dtypes and ranks; all-ones shapes fit every matmul), which raises what the CPU
raises, in its words, and computes nothing worth the name.
"""

from __future__ import annotations

import torch

# The ops (schema names) whose operands must share one dtype on the CPU and CUDA.
MATMULS = frozenset({
    "aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_", "aten::baddbmm", "aten::baddbmm_", "aten::dot",
    "aten::vdot", "aten::mv", "aten::addmv", "aten::addmv_",
})


def _operand(value) -> tuple[torch.dtype, int] | None:
    """(dtype, rank) of a tensor or an Inductor IR node, else None."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.dim()
    get_dtype, get_size = getattr(value, "get_dtype", None), getattr(value, "get_size", None)
    if get_dtype is not None and get_size is not None:
        return get_dtype(), len(get_size())
    return None


def _stand_in(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_stand_in(v) for v in value)
    operand = _operand(value)
    if operand is None:
        return value
    dtype, rank = operand
    return torch.zeros([1] * rank, dtype=dtype)


def mixed_dtypes_error(op: torch._ops.OpOverload, args, kwargs=None) -> RuntimeError | None:
    """The CPU kernel's error for a matmul-family call whose operands (tensors or IR nodes) have
    different dtypes, or None (one dtype, an op outside the family, or the CPU takes them)."""
    if op._schema.name not in MATMULS:
        return None
    kwargs = kwargs or {}
    dtypes = {operand[0] for v in (*args, *kwargs.values()) if (operand := _operand(v)) is not None}
    if len(dtypes) <= 1:
        return None
    from torch.utils._python_dispatch import _disable_current_modes

    try:  # (real CPU tensors, whatever mode the caller runs under: Inductor lowers under fake mode)
        with _disable_current_modes(), torch.no_grad():
            op(*_stand_in(tuple(args)), **{k: _stand_in(v) for k, v in kwargs.items()})
    except RuntimeError as e:
        return RuntimeError(str(e))
    return None
