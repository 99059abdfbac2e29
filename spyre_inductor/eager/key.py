"""The eager cache key: what a compiled op depends on, computed on every call (keep it lean).

A tensor contributes its dtype, shape, strides, device index and its start's phase within a
stick (the compiled program takes any address, but a start inside a stick is a different plan's
report; cheap to keep apart).

Python scalars (issue 19). The rule: a scalar is keyed on its KIND, and its value travels at
launch, when the program only uses it as a value; a scalar that shapes the program is keyed on
its VALUE, with its type (1, 1.0 and True are different constants).

* Travel: an int or float handed over in place of a Tensor argument (a wrapped number: the
  dispatcher hands ``x + 2.0``'s 2.0 to a Python kernel as the number; add, sub, mul, div,
  where, floor_divide... with a scalar operand). Its kind is (TRAVELS, its Python type): int and
  float are different kinds (they promote differently: int32 + 2 is int32, int32 + 2.0 float32);
  what else the promotion depends on, the tensors' dtypes, is in the key already. It is traced
  as a 0-d graph input and given at launch as a host value carried in the correction area
  (scalars.py; spyre_runtime/values.py).
* Keyed on the value: everything else. Non-tensor arguments (dims, sizes, dtypes, rounding
  modes, and the schema's Scalar arguments: alpha, clamp bounds, fill values, pow's exponent,
  whose values Inductor's decompositions bake or specialize on: pow 2 is x*x, 0.5 is sqrt) are
  baked into the traced graph as constants; so is a wrapped number that is a bool or complex,
  and every wrapped number of a call with an fp16/bf16 or a 0-d tensor: a baked float constant
  lives in an fp32 tile (eager's opmath keeps the scalar in float), which a 0-d fp16 input would
  round first, and beside another 0-d tensor a 0-d input promotes unlike a wrapped number
  (0-d fp16 + 2.5 is fp16; with a 0-d fp32 input it would be fp32). Scalars in Tensor[] lists
  stay keyed by value too. A distinct value is its own compile (the cache is bounded).

``None`` as the key means "not for the compiled path": a CPU tensor among the
arguments (a CPU 0-d tensor with a spyre one, as PyTorch allows), a tensor on
another device type, or a conjugate/negative view bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .scalars import TRAVELING_TYPES, TRAVELS
from .signature import Kind, Signature

_HALVES = (torch.float16, torch.bfloat16)

# Off: every scalar is keyed on its value, as before issue 19 (tests and benchmarks compare).
TRAVEL = [True]

def _value_key(v):
    if type(v) is float:
        return (float, "nan") if v != v else (float, v)
    if isinstance(v, (list, tuple)):
        return tuple(_value_key(x) for x in v)
    return (type(v), v)


def make_key(sig: Signature, values: tuple, travel: bool = True):
    """The cache key of one call (a flat tuple: the signature, then per tensor its dtype, shape,
    strides, device index and stick phase, per other value its (type, value), per traveling
    scalar its kind (TRAVELS, type)), or None if the call is not for the compiled path.
    Unambiguous read left to right: a tensor's entries start with a torch.dtype, a value's entry
    is a tuple. `travel` False: every scalar keyed on its value (scalars.py's fallback)."""
    parts = [sig]
    scalars = None
    for i in sig.tensor_at:
        t = values[i]
        if not isinstance(t, Tensor):  # None, or a wrapped number handed over as a Python scalar
            if type(t) in TRAVELING_TYPES:
                if scalars is None:
                    scalars = []
                scalars.append((len(parts), t))
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
    if scalars is not None and travel and TRAVEL[0] and _may_travel(sig, values):
        for at, t in scalars:
            parts[at] = (TRAVELS, type(t))
    return tuple(parts)


def _may_travel(sig: Signature, values: tuple) -> bool:
    """No fp16/bf16 and no 0-d tensor among the call's tensors (see the module docstring)."""
    for t in tensors_of(sig, values):
        if t.dtype in _HALVES or t.dim() == 0:
            return False
    return True


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
