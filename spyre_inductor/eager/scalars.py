"""Python scalars that travel at launch (issue 19): one compile serves every value of the scalar.

``x + 2.0`` reaches the spyre kernel as aten::add.Tensor with the Python number 2.0 in place of
its Tensor argument (a wrapped number). Such a scalar is keyed on its KIND (key.py says when),
traced as a 0-d graph input of its *travel dtype*, and given at each launch as a host value: a
CPU 0-d tensor the launch layer carries in the kernel's correction area (spyre_runtime/values.py)
-- no recompile per value, no device allocation per call. The 0-d input is what Dynamo makes of
an unspecialized scalar too (a 0-d CPU tensor graph input), and Inductor loads it like any input.

The travel dtype D is what a baked-in constant of today's compile is converted to: Inductor
promotes a Python constant to the op's computation dtype (an ir.Constant of it) and our backend
converts it as PyTorch converts a scalar to a tensor's type (compiler/scalars.scalar_as). So D
is float32 when the scalar, a tensor or the result is floating (int32 / 2**40 divides by 2**40
in float; key.py keeps the scalars of fp16/bf16 calls keyed by value), else the promoted dtype
of the integer tensors (int64 beside bools only). The value is converted to D as scalar_as converts (floats round to
nearest, beyond the range +-inf; integers wrap to D's width, as CPU eager does for
``int32 + 2**40``), and where the CPU kernel converts with an overflow check (fill_,
masked_fill, where, clamp: Signature.checked) a value that overflows the result's dtype raises
the CPU kernel's RuntimeError before anything is launched.

What changes against a baked constant: Inductor turns a division by a constant into a
multiplication by its reciprocal (lowering.div_prim), so ``x / 3.0`` compiled per value is not
bit-exact with CPU eager (float32, int32 and int64 alike); divided by a traveling scalar it
divides, and is. Every other op checked in tests/eager/test_eager_scalars.py was bit-exact with
the CPU with its constant baked and stays so traveling (float32, int32, int64).

A 0-d input does not promote like a wrapped number in every op, so before compiling the call is
run on fake tensors both ways: if the outputs' dtypes or shapes differ, or the compiled graph
would use the value other than as a launch argument (a CPU part), the kind's entry becomes a
ValueKeyed one and each value compiles under its own key, as before issue 19.
"""

from __future__ import annotations

import functools
import math
import re
import threading

import torch

from spyre_inductor.compiler.ir.scalars import scalar_as

from .signature import Kind, Signature

TRAVELS = "travels"  # key.py's marker of a scalar keyed on its kind: (TRAVELS, python type)
TRAVELING_TYPES = (int, float)  # bool (a logical, rare in arithmetic) and complex stay keyed by value
_F32_MAX = float(torch.finfo(torch.float32).max)


def positions(sig: Signature, values: tuple, key) -> tuple[int, ...]:
    """The schema positions whose scalars travel in this call (key.py decided: all or none)."""
    if key is None or not any(type(p) is tuple and len(p) == 2 and p[0] == TRAVELS for p in key):
        return ()
    from .key import twin_travels

    at = [i for i in sig.tensor_at if type(values[i]) in TRAVELING_TYPES]
    if sig.scalar_at and twin_travels(sig, values):
        at += (i for i in sig.scalar_at if values[i] is not None)
    return tuple(sorted(at))


def traced_signature(sig: Signature, travel: tuple[int, ...]) -> Signature:
    """The signature the call is traced with: the op's tensor twin when a Scalar argument travels."""
    if sig.twin is not None and any(i in sig.scalar_at for i in travel):
        from .signature import signature_of

        return signature_of(sig.twin)
    return sig


def travel_dtype(value, tensors, out_dtypes: tuple) -> torch.dtype:
    """D: the dtype a baked constant `value` would be converted to in this call (module
    docstring): float32 when the scalar, a tensor or the result is floating (int32 / 2**40 divides
    by 2**40 in float, as the CPU does), else the integer tensors' promoted dtype (int32 + 2**40
    wraps the scalar to int32, as the CPU does)."""
    if type(value) is float or any(t.dtype.is_floating_point for t in tensors) or \
            any(d.is_floating_point for d in out_dtypes):
        return torch.float32
    ints = [t.dtype for t in tensors if t.dtype != torch.bool]
    return functools.reduce(torch.promote_types, ints) if ints else torch.int64


def with_inputs(sig: Signature, values: tuple, travel: tuple[int, ...], tensors,
                out_dtypes: tuple) -> tuple[tuple, tuple]:
    """(values with each traveling scalar replaced by a spyre 0-d tensor of its D, the Ds): what
    the call is traced and compiled on (the 0-d tensors' contents do not matter: traced as fakes)."""
    device = tensors[0].device if tensors else torch.device("spyre", torch.spyre.current_device())
    out, dtypes = list(values), []
    for i in travel:
        d = travel_dtype(values[i], tensors, out_dtypes)
        dtypes.append(d)
        out[i] = torch.empty((), dtype=d, device=device)
    return tuple(out), tuple(dtypes)


def outputs(sig: Signature, values: tuple):
    """The op's outputs' (dtype, shape) on fake tensors, or ("raises", the error's type)."""
    from .compile import on_fakes
    from .key import tensors_of

    _, out, error = on_fakes(sig.op, sig, values, tensors_of(sig, values))
    if error is not None:
        return ("raises", type(error))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return tuple((o.dtype, o.shape) for o in outs if isinstance(o, torch.Tensor))


def dtypes_of(found) -> tuple:
    return () if found and found[0] == "raises" else tuple(d for d, _ in found)


_C_TYPE = {torch.float32: "float", torch.int64: "long int", torch.int32: "int", torch.int8: "signed char",
           torch.bool: "bool"}


def checks(sig: Signature, travel: tuple[int, ...], out_dtypes: tuple) -> tuple:
    """(position, dtype) of the traveling scalars PyTorch converts to the result's dtype with an
    overflow check (Signature.checked): each launch checks its value the same way (fits)."""
    if not sig.checked or not out_dtypes:
        return ()
    return tuple((i, out_dtypes[0]) for i in travel)


def fits(v, dtype: torch.dtype) -> None:
    """RuntimeError, as the CPU kernel's checked conversion raises it, if `v` overflows `dtype`."""
    if dtype.is_floating_point:  # (float32: key.py keeps fp16/bf16 calls keyed by value)
        try:
            f = float(v)
        except OverflowError:  # an int beyond every float
            f = None
        ok = f is not None and (f != f or f in (math.inf, -math.inf) or abs(f) <= _F32_MAX)
    elif dtype is torch.bool:
        ok = True
    else:
        info = torch.iinfo(dtype)
        ok = v == v and info.min <= v <= info.max  # (a nan fails both)
    if not ok:
        raise RuntimeError(f"value cannot be converted to type {_C_TYPE.get(dtype, str(dtype))} without overflow")


def input_names(sig: Signature, tvalues: tuple, travel: tuple[int, ...]) -> tuple[str, ...]:
    """The traced graph's names of the traveling 0-d inputs (make_fx names its inputs argK_1, in
    tensors_of order)."""
    names, n = [], 0
    for i, (value, kind) in enumerate(zip(tvalues, sig.kinds)):
        if kind is Kind.TENSOR:
            if isinstance(value, torch.Tensor):
                if i in travel:
                    names.append(f"arg{n}_1")
                n += 1
        elif kind is Kind.TENSOR_LIST:
            n += sum(isinstance(t, torch.Tensor) for t in value)
    return tuple(names)


def launched_only(source: str, names: tuple[str, ...]) -> bool:
    """Whether the compiled wrapper's ``call`` hands each of the graph inputs `names` straight to
    launch_jobplan (and otherwise only unpacks, checks and deletes it): only then may it be a
    host tensor. Reads the generated code; never edits it."""
    body = source.partition("def call(")[2].partition("\ndef ")[0]
    for name in names:
        word = re.compile(rf"\b{re.escape(name)}\b")
        launched = False
        for line in body.splitlines():
            if not word.search(line):
                continue
            text = line.strip()
            if text.startswith("launch_jobplan(") and re.search(rf"[\[,]\s*{re.escape(name)}\s*[,\]]", text):
                launched = True
            elif not (text.startswith(("assert_size_stride(", "del ")) or " = args" in text):
                return False
        if not launched:
            return False
    return True


class HostValues:
    """The host tensors of one compiled entry's traveling scalars: one 0-d CPU tensor per scalar
    and thread, rewritten per call (the launch reads their bytes when it is made, so reuse after
    the call is safe), written through a NumPy view (a torch call per value costs microseconds)."""

    __slots__ = ("dtypes", "_local")

    def __init__(self, dtypes: tuple[torch.dtype, ...]):
        self.dtypes = dtypes
        self._local = threading.local()

    def fill(self, scalars) -> list:
        local = self._local
        try:
            tensors, views = local.tensors, local.views
        except AttributeError:  # this thread's first call
            tensors = local.tensors = [torch.zeros((), dtype=d) for d in self.dtypes]
            views = local.views = [t.numpy() for t in tensors]
        for view, d, v in zip(views, self.dtypes, scalars):
            view[()] = _converted(v, d)
        return tensors


def _converted(v, dtype: torch.dtype):
    """`v` as `dtype` holds it, as scalar_as converts (fast paths for the common cases)."""
    if dtype is torch.float32:
        if type(v) is float and (-_F32_MAX <= v <= _F32_MAX or v != v):
            return v  # (NumPy rounds to nearest, as the conversion from float64 does)
        if type(v) is int and -(1 << 53) <= v <= 1 << 53:
            return float(v)  # exact in float64; NumPy rounds it to float32 as scalar_as would
        return scalar_as(v, dtype)  # beyond the range (+-inf), or a large int (through float64)
    bits = dtype.itemsize * 8
    w = v & ((1 << bits) - 1)
    return w - (1 << bits) if dtype.is_signed and w >> (bits - 1) else w  # (uint8: 0..255)


