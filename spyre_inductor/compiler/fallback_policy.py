"""What happens when a compiled graph has to run part of itself on the CPU.

The same contract as the eager fallback (device/fallback.py): a warning once
per op, naming it, and with ``SPYRE_STRICT=1`` an error naming the op instead,
raised at compile time so a strict user learns before anything runs. Once per
op means once for both: the two share the eager fallback's record of the ops
already warned about (fallback.first_warning), so an op the eager fallback
has warned about is not warned about again when a compiled graph falls back
on it, nor the other way round.
"""

from __future__ import annotations

import warnings

from .nesting import eager_op

# One reading of SPYRE_STRICT, one record of the ops warned about.
from spyre_inductor.device.fallback import SpyreFallbackWarning, first_warning, operator_name, strict


class SpyreStrictError(NotImplementedError):
    """SPYRE_STRICT=1 and a graph needs the CPU fallback."""


def origin_ops(nodes) -> str:
    """The aten ops a group of scheduler nodes came from, e.g. 'aten.sum.dim_IntList'; in an
    eager op's graph, that op (nesting.eager_op): what the user called."""
    called = eager_op()
    if called is not None:
        return str(called)
    names = set()
    for node in nodes:
        ir_node = getattr(node, "node", None)
        for origin in getattr(ir_node, "origins", ()) or ():
            if origin.op == "call_function":
                names.add(str(origin.target))
    return ", ".join(sorted(names)) or ", ".join(n.get_name() for n in nodes)


def _operators(ops: str) -> list[str]:
    """The operators of an origin_ops() label: its comma-separated op names, each without
    its overload (fallback.operator_name)."""
    return [operator_name(op.strip()) for op in ops.split(",") if op.strip()]


def announce(ops: str, reason: str) -> None:
    """Warn (or raise in strict mode) that compiled code runs `ops` (an origin_ops() label) on
    the CPU: once, unless every op of it was already warned about by either fallback."""
    if strict():
        raise SpyreStrictError(
            f"spyre: {ops} cannot be compiled for spyre ({reason}) and SPYRE_STRICT=1 forbids "
            f"the CPU fallback"
        )
    if not first_warning(_operators(ops)):
        return
    warnings.warn(
        f"spyre: {ops} cannot be compiled for spyre yet ({reason}); the compiled graph runs it on "
        f"the CPU over the device bytes (this warning is shown once per op)",
        SpyreFallbackWarning,
        stacklevel=2,
    )
