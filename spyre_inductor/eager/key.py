"""The eager cache key: what a compiled op depends on, computed on every call (keep it lean).

A tensor contributes its dtype, shape, strides, device index and its start's phase within a
stick (the compiled program takes any address, but a start inside a stick is a different plan's
report; cheap to keep apart).

Python scalars (issue 19). The rule: a scalar is keyed on its KIND, and its value travels at
launch, when the program only uses it as a value; a scalar that shapes the program is keyed on
its VALUE, with its type (1, 1.0 and True are different constants).

* Travel: an int or float handed over in place of a Tensor argument (a wrapped number: the
  dispatcher hands ``x + 2.0``'s 2.0 to a Python kernel as the number; add, sub, mul, div,
  where, floor_divide... with a scalar operand); and an int or float Scalar argument of an op
  with a tensor twin (signature._TWINS: ``x > 0.5`` is gt.Scalar, traced as gt.Tensor; rsub,
  comparisons, masked_fill, fill, where, clamp/clamp_min/clamp_max, remainder and the .Scalar
  forms of add/sub/mul/div), when each such Scalar of the call is an int, a float or None. Its
  kind is (TRAVELS, its Python type): int and float are different kinds (they promote
  differently: int32 + 2 is int32, int32 + 2.0 float32); what else the promotion depends on,
  the tensors' dtypes, is in the key already. It is traced as a 0-d graph input and given at
  launch as a host value carried in the correction area (scalars.py; spyre_runtime/values.py).
* Keyed on the value: everything else. Non-tensor arguments (dims, sizes, dtypes, rounding
  modes, and the schema's other Scalar arguments: alpha, pow's exponent, lerp's weight,
  leaky_relu's slope, threshold's values, full's fill value, whose values Inductor's
  decompositions bake or may specialize on: pow 2 is x*x, 0.5 is sqrt) are baked into the
  traced graph as constants; so is a wrapped number that is a bool or complex, and every scalar
  of a call with an fp16/bf16 tensor: a baked float constant lives in an fp32 tile, and CPU
  eager keeps the scalar in float32 for some ops (mul, div) but rounds it to the tensor's dtype
  first for others (add, sub): no one dtype of a 0-d input keeps today's numerics for both.
  Scalars in Tensor[] lists stay keyed by value too. A distinct value is its own compile (the
  cache is bounded). Where a 0-d input would promote unlike the scalar after all, or the call
  does not compile with it, the compile finds it out (scalars.py) and the kind's entry sends
  each value to its own value key.

``None`` as the key means "not for the compiled path": a CPU tensor among the
arguments (a CPU 0-d tensor the op writes: one it only reads is on the card by now, kernel.py), a tensor on
another device type, or a conjugate/negative view bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .scalars import TRAVELING_TYPES, TRAVELS
from .signature import Kind, Signature

_HALVES = (torch.float16, torch.bfloat16)

# Off: every scalar is keyed on its value, as before issue 19 (tests and benchmarks compare).
TRAVEL = [True]

def _value_key(v):
    if type(v) is float:  # by its bits: -0.0 == 0.0 (1 / (x * -0.0) is -inf), and nan != nan
        return (float, v.hex())
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
        if index < 0 or t.is_neg() or t.is_conj():  # a CPU tensor (the program cannot read host
            return None                              # memory), or a view bit the program would not see
        offset = t.storage_offset()
        parts += (t.dtype, t.shape, t.stride(), index, (offset * t.element_size()) & 127 if offset else 0)
    for i in sig.lists_at:
        for t in values[i]:
            if not isinstance(t, Tensor):
                parts.append(_value_key(t))
                continue
            index = t.get_device()
            if index < 0 or t.is_neg() or t.is_conj():
                return None
            offset = t.storage_offset()
            parts += (t.dtype, t.shape, t.stride(), index, (offset * t.element_size()) & 127 if offset else 0)
        parts.append(len(values[i]))
    start = len(parts)
    for i in sig.others_at:
        parts.append(_value_key(values[i]))
    if sig.scalar_at and twin_travels(sig, values):
        for k in sig.scalar_slots:
            t = values[sig.others_at[k]]
            if t is not None:
                if scalars is None:
                    scalars = []
                scalars.append((start + k, t))
    if scalars is not None and travel and TRAVEL[0] and _may_travel(sig, values):
        for at, t in scalars:
            parts[at] = (TRAVELS, type(t))
    return tuple(parts)


def twin_travels(sig: Signature, values: tuple) -> bool:
    """Whether the call's Scalar arguments that the op's tensor twin takes as Tensors may travel:
    each an int or a float, or None (absent: clamp's min)."""
    return all(values[i] is None or type(values[i]) in TRAVELING_TYPES for i in sig.scalar_at) and \
        any(values[i] is not None for i in sig.scalar_at)


def _may_travel(sig: Signature, values: tuple) -> bool:
    """No fp16/bf16 tensor among the call's tensors (see the module docstring)."""
    for t in tensors_of(sig, values):
        if t.dtype in _HALVES:
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
