"""What the eager path needs to know about one op overload, read once from its schema.

The PrivateUse1 kernel receives arguments the way the dispatcher hands them to
Python: positional arguments positionally, keyword-only ones as keywords, and
trailing arguments equal to their defaults left out. ``bind`` turns that into
one tuple in schema order (defaults filled in), which is what the cache key,
the traced graph and the launch all index.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Kind(enum.Enum):
    TENSOR = "tensor"            # Tensor, Tensor? (None allowed)
    TENSOR_LIST = "tensor_list"  # Tensor[], Tensor?[]
    OTHER = "other"              # a scalar, int[], dtype, str...: baked into the graph (keyed on value)


class Mode(enum.Enum):
    FUNCTIONAL = "functional"    # returns new tensors
    INPLACE = "inplace"          # writes (and returns) self
    OUT = "out"                  # writes (and returns) its out= tensors


_MISSING = object()


@dataclass(frozen=True, eq=False)  # identity hash: it leads every cache key (kept cheap)
class Signature:
    op: torch._ops.OpOverload
    name: str                       # "aten::add.Tensor": what errors and warnings name
    names: tuple[str, ...]
    positional: int                 # how many of them are not keyword-only
    defaults: tuple                 # per argument: its schema default, or _MISSING
    kinds: tuple[Kind, ...]
    mode: Mode
    written: tuple[int, ...]        # positions of the arguments the op writes
    returns: int                    # how many tensors it returns
    has_generator: bool
    # PyTorch's own kernel for every backend (CompositeExplicitAutograd: clone = empty_like + copy_,
    # add.Scalar = add.Tensor...); our kernel replaces it on spyre, so a call we do not compile
    # runs it (its pieces dispatch to spyre kernels again), not the CPU fallback: the CPU kernel
    # over host aliases would not keep what the composite does (a conjugate view's bit...).
    composite: bool
    tensor_at: tuple[int, ...] = ()  # positions of Tensor arguments, of Tensor[] ones, of the rest
    lists_at: tuple[int, ...] = ()
    others_at: tuple[int, ...] = ()
    # (issue 19) The overload that computes the same with the Scalar arguments at `scalar_at` as
    # Tensor ones (gt.Scalar: gt.Tensor), so their values may travel at launch (key.py, scalars.py);
    # `scalar_slots`: their indices within others_at.
    twin: torch._ops.OpOverload | None = None
    scalar_at: tuple[int, ...] = ()
    scalar_slots: tuple[int, ...] = ()
    # whether PyTorch converts its scalars (those Scalars, or wrapped numbers) to the result's
    # dtype with an overflow check (fill_, masked_fill, where, clamp: "value cannot be converted
    # to type int without overflow"), where the arithmetic ones and the comparisons wrap
    checked: bool = False
    # The op's CPU route when the CPU has no kernel for the op itself (convolution_overrideable:
    # the CPU convolution; device/routes.py), called as host(*args, reason=why, **kwargs).
    host: object = None

    def bind(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments in schema order, defaults filled in."""
        n = len(args)
        if n == len(self.names) and not kwargs:
            return args
        values = list(args)
        for i in range(n, len(self.names)):
            value = kwargs.get(self.names[i], _MISSING)
            if value is _MISSING:
                value = self.defaults[i]
                if value is _MISSING:
                    raise TypeError(f"spyre: {self.name} is missing its argument {self.names[i]!r}")
            values.append(value)
        return tuple(values)


def _kind(arg) -> Kind | None:
    """The argument's kind, or None if the eager path does not take ops with such an argument."""
    text = str(arg.type)
    if text in ("Tensor", "Optional[Tensor]"):
        return Kind.TENSOR
    if text in ("List[Tensor]", "List[Optional[Tensor]]"):
        return Kind.TENSOR_LIST
    if "Tensor" in text or "Dimname" in text or "Storage" in text or "Layout" in text or "Device" in text:
        return None
    return Kind.OTHER


# Scalar overloads -> the overload (same packet) taking those Scalars as Tensors, computing the
# same with them as 0-d inputs. Listed, not discovered: a twin whose decomposition treats a
# tensor unlike the scalar would change results (pow.Tensor_Scalar specializes on its exponent;
# lerp.Scalar and leaky_relu, threshold, hardtanh have no such twin). Checked against the CPU
# per value in tests/eager/test_eager_scalars.py.
_TWINS = {
    **{(name, "Scalar"): "Tensor" for name in (
        "rsub", "add", "sub", "mul", "div", "remainder", "eq", "ne", "lt", "le", "gt", "ge",
        "masked_fill", "masked_fill_", "fill", "fill_")},
    **{(name, "default"): "Tensor" for name in ("clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max",
                                                 "clamp_max_")},
    ("where", "ScalarOther"): "self", ("where", "ScalarSelf"): "self", ("where", "Scalar"): "self",
}

# Ops whose CPU kernel converts a scalar with c10's checked conversion.
_CHECKED = {"masked_fill", "masked_fill_", "fill", "fill_", "where", "clamp", "clamp_", "clamp_min", "clamp_min_",
            "clamp_max", "clamp_max_"}

_SCALAR_TYPES = {"number": "Tensor", "Optional[number]": "Optional[Tensor]"}


def _twin(op: torch._ops.OpOverload):
    """(twin overload, positions of the Scalars it takes as Tensors), or (None, ())."""
    overload = _TWINS.get((op._schema.name.partition("::")[2], op._overloadname))
    if overload is None:
        return None, ()
    twin = getattr(op.overloadpacket, overload, None)
    if twin is None:
        return None, ()
    mine, theirs = op._schema.arguments, twin._schema.arguments
    at = []
    if len(mine) != len(theirs):
        raise AssertionError(f"spyre: {op} and its tensor twin {twin} take different arguments")
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a.name != b.name:
            raise AssertionError(f"spyre: {op} and its tensor twin {twin} name argument {i} differently")
        if str(a.type) != str(b.type):
            if _SCALAR_TYPES.get(str(a.type)) != str(b.type):
                raise AssertionError(f"spyre: {op}'s tensor twin {twin} differs in {a.name}'s type")
            at.append(i)
    return twin, tuple(at)


def _default(arg):
    if not arg.has_default_value():
        return _MISSING
    return arg.default_value


def signature_of(op: torch._ops.OpOverload) -> Signature | None:
    """The op's signature, or None when its schema is outside what the eager path compiles
    (Dimname or Device arguments, non-tensor returns, writes to more than the out= tensors or self)."""
    schema = op._schema
    kinds, written, has_generator, outs = [], [], False, []
    for i, arg in enumerate(schema.arguments):
        if "Generator" in str(arg.type):
            # A random op's explicit generator: its state would have to travel into the program.
            has_generator = True
            kinds.append(Kind.OTHER)
        else:
            kind = _kind(arg)
            if kind is None:
                return None
            kinds.append(kind)
        info = arg.alias_info
        if info is not None and info.is_write:
            written.append(i)
            if arg.is_out:
                outs.append(i)
    for ret in schema.returns:
        if str(ret.type) != "Tensor":
            return None
    if outs:
        mode = Mode.OUT
        if len(outs) != len(written) or len(schema.returns) not in (0, len(outs)):
            return None
    elif written:
        if written != [0] or len(schema.returns) != 1:
            return None
        mode = Mode.INPLACE
    else:
        mode = Mode.FUNCTIONAL
        if not schema.returns:
            return None
    overload = op._overloadname
    name = schema.name if overload == "default" else f"{schema.name}.{overload}"
    positional = sum(not a.kwarg_only for a in schema.arguments)
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")
    others = tuple(i for i, k in enumerate(kinds) if k is Kind.OTHER)
    twin, scalar_at = _twin(op)
    return Signature(op, name, tuple(a.name for a in schema.arguments), positional, tuple(_default(a) for a in schema.arguments),
                     tuple(kinds), mode, tuple(written), len(schema.returns), has_generator, composite,
                     tuple(i for i, k in enumerate(kinds) if k is Kind.TENSOR),
                     tuple(i for i, k in enumerate(kinds) if k is Kind.TENSOR_LIST),
                     others, twin, scalar_at, tuple(others.index(i) for i in scalar_at),
                     schema.name.partition("::")[2] in _CHECKED)
