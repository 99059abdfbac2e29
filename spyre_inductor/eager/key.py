"""The eager cache key: what a compiled op depends on, computed on every call (keep it lean).

A Tensor argument may arrive as a Python scalar (the dispatcher hands a
wrapped number to a Python kernel as the number): it is keyed, and traced, as
the value it is. A tensor contributes its dtype, shape, strides, device index and its start's
phase within a stick (the compiled program takes any address, but a start
inside a stick is a different plan's report; cheap to keep apart). Values that
are not tensors (a Python scalar, dims, a dtype, a rounding mode) are baked into
the traced graph as constants, so they are keyed on their VALUE, with their type
(1, 1.0 and True are different constants). Scalars cannot yet travel at launch:
the launch layer binds tensor addresses and symbolic sizes only, so a scalar
would need the correction area to carry a value word and the compiler to read
it; until then each distinct scalar is its own compile (the cache is bounded).

``None`` as the key means "not for the compiled path": a CPU tensor among the
arguments (a CPU 0-d tensor with a spyre one, as PyTorch allows), a tensor on
another device type, or a conjugate/negative view bit.
"""

from __future__ import annotations

import math

from torch import Tensor

from .signature import Kind, Signature

def _value_key(v):
    if type(v) is float:
        return (float, "nan") if v != v else (float, v)
    if isinstance(v, (list, tuple)):
        return tuple(_value_key(x) for x in v)
    return (type(v), v)


def make_key(sig: Signature, values: tuple):
    """The cache key of one call (a flat tuple: the signature, then per tensor its dtype, shape,
    strides, device index and stick phase, per other value its (type, value)), or None if the call
    is not for the compiled path. Unambiguous read left to right: a tensor's entries start with a
    torch.dtype, a value's entry is a tuple."""
    parts = [sig]
    for i in sig.tensor_at:
        t = values[i]
        if not isinstance(t, Tensor):  # None, or a wrapped number handed over as a Python scalar
            parts.append(_value_key(t))
            continue
        index = t.get_device()
        if index < 0:  # a CPU tensor: the program cannot read host memory
            return None
        offset = t.storage_offset()
        parts += (t.dtype, t.shape, t.stride(), index, (offset * t.element_size()) & 127 if offset else 0)
    for i in sig.lists_at:
        for t in values[i]:
            if not isinstance(t, Tensor):
                parts.append(_value_key(t))
                continue
            index = t.get_device()
            if index < 0:
                return None
            offset = t.storage_offset()
            parts += (t.dtype, t.shape, t.stride(), index, (offset * t.element_size()) & 127 if offset else 0)
        parts.append(len(values[i]))
    for i in sig.others_at:
        parts.append(_value_key(values[i]))
    return tuple(parts)


def tensors_of(sig: Signature, values: tuple) -> list:
    """The call's tensors in the order the traced graph takes them (schema order, lists
    flattened, Nones and Python scalars skipped)."""
    if not sig.lists_at:
        return [values[i] for i in sig.tensor_at if isinstance(values[i], Tensor)]
    out = []
    for value, kind in zip(values, sig.kinds):
        if kind is Kind.TENSOR:
            if isinstance(value, Tensor):
                out.append(value)
        elif kind is Kind.TENSOR_LIST:
            out.extend(t for t in value if isinstance(t, Tensor))
    return out
