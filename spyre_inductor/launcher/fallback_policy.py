"""What happens when a compiled graph has to run part of itself on the CPU.

The same contract as the eager fallback (device/fallback.py), and with ``SPYRE_STRICT=1`` an
error naming the ops, raised at compile time so a strict user learns before anything runs.

Without strict mode, a CPU kernel of a compiled graph (compiler/inductor/host_kernel.py) warns when it first runs
in a process, naming itself, its ops and why: a graph compiled in this process, or loaded from
Inductor's FX graph cache by another one (where nothing is compiled, so a compile-time warning
would never be seen), and a new kernel of ops some other kernel already warned about. Its calls
and host seconds are counted in torch.spyre.fallback_reports(). What the compiled graph hands to
an eager op instead (attention's composite fallback: ``announce``) warns once per op, sharing
the eager fallback's record of the ops already warned about (fallback.first_warning).
"""

from __future__ import annotations

import logging
import warnings

# One reading of SPYRE_STRICT, one record of the ops and kernels warned about.
from spyre_inductor.device.fallback import (
    SpyreFallbackWarning,
    first_kernel_warning,
    first_warning,
    operator_name,
    strict,
)

from .nesting import eager_op

log = logging.getLogger(__name__)  # TORCH_LOGS="spyre"


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


def refuse_in_strict_mode(ops: str, reason: str) -> None:
    """In strict mode, raise: compiled code would run `ops` (an origin_ops() label) on the CPU."""
    log.info("CPU fallback in a compiled graph: %s (%s)%s", ops, reason, ": refused, SPYRE_STRICT=1" if strict() else "")
    if strict():
        raise SpyreStrictError(
            f"spyre: {ops} cannot be compiled for spyre ({reason}) and SPYRE_STRICT=1 forbids "
            f"the CPU fallback"
        )


def first_run(code, kernel: str, ops: str, reason: str) -> None:
    """Warn, the first time in this process a compiled graph's CPU kernel runs, naming it (its
    name in the graph, its ops, why it is not a program). `code`: the kernel body's code object,
    one per kernel of a loaded module. Its ops then count as warned about for the eager fallback."""
    if not first_kernel_warning(code):
        return
    first_warning(_operators(ops))
    warnings.warn(
        f"spyre: {ops} cannot be compiled for spyre yet ({reason}); the compiled graph runs it on "
        f"the CPU over the device bytes, as its kernel {kernel} (this warning is shown once per kernel "
        f"and process)",
        SpyreFallbackWarning,
        stacklevel=4,
    )


def announce(ops: str, reason: str) -> None:
    """Warn (or raise in strict mode) that compiled code hands `ops` (an origin_ops() label) to
    eager kernels: once, unless every op of it was already warned about by either fallback."""
    refuse_in_strict_mode(ops, reason)
    if not first_warning(_operators(ops)):
        return
    warnings.warn(
        f"spyre: {ops} cannot be compiled for spyre yet ({reason}); the compiled graph runs it on "
        f"the CPU over the device bytes (this warning is shown once per op)",
        SpyreFallbackWarning,
        stacklevel=2,
    )
