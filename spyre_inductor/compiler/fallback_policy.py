"""What happens when a compiled graph has to run part of itself on the CPU.

The same contract as the eager fallback (device/fallback.py): a warning once
per op, naming it, and with ``SPYRE_STRICT=1`` an error naming the op instead,
raised at compile time so a strict user learns before anything runs.
"""

from __future__ import annotations

import threading
import warnings

from spyre_inductor.device.fallback import SpyreFallbackWarning, strict  # one reading of SPYRE_STRICT

_warned: set[str] = set()
_lock = threading.Lock()


class SpyreStrictError(NotImplementedError):
    """SPYRE_STRICT=1 and a graph needs the CPU fallback."""


def origin_ops(nodes) -> str:
    """The aten ops a group of scheduler nodes came from, e.g. 'aten.sum.dim_IntList'."""
    names = set()
    for node in nodes:
        ir_node = getattr(node, "node", None)
        for origin in getattr(ir_node, "origins", ()) or ():
            if origin.op == "call_function":
                names.add(str(origin.target))
    return ", ".join(sorted(names)) or ", ".join(n.get_name() for n in nodes)


def announce(ops: str, reason: str) -> None:
    """Warn once per `ops` (or raise in strict mode) that compiled code runs `ops` on the CPU."""
    if strict():
        raise SpyreStrictError(
            f"spyre: {ops} cannot be compiled for spyre ({reason}) and SPYRE_STRICT=1 forbids "
            f"the CPU fallback"
        )
    with _lock:
        if ops in _warned:
            return
        _warned.add(ops)
    warnings.warn(
        f"spyre: {ops} cannot be compiled for spyre yet ({reason}); the compiled graph runs it on "
        f"the CPU over the device bytes (this warning is shown once per op)",
        SpyreFallbackWarning,
        stacklevel=2,
    )
