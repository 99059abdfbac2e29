"""Device-side asserts on spyre: ``aten._assert_async`` (with or without a message, and its
functional form) as a check in stream order.

A dataflow program cannot stop the card to report a failed check. The asserted scalar is
computed on the card (``torch.all(ids >= 0)``: a reduction program), and a host callback
queued on the current stream after the work that computes it reads that one element. The host
does not wait for it: like CUDA's device-side asserts, the assert is asynchronous, and a false
condition fails its callback, so the stream stops with a RuntimeError carrying the assert's
message, raised by the next synchronize (or the next read of a result), and what follows on that
stream is skipped. Compiled graphs call the same op (inductor/lowerings.py): one_hot's range
checks, ``torch._assert_async`` in user code.
"""

from __future__ import annotations

import torch

from spyre_runtime import _C
from spyre_runtime.queue import HostCallback

from . import queues

_lib: torch.library.Library | None = None
DEFAULT_MESSAGE = "Expected Tensor with single nonzero value, but got zero"  # the CPU's words


def assert_async(cond: torch.Tensor, message: str = DEFAULT_MESSAGE) -> None:
    """Queue the check of `cond` (one element) on the current stream; returns at once."""
    if cond.numel() != 1:  # the CPU's words, at the call: the size is known without the data
        count = "no values" if cond.numel() == 0 else "more than one value"
        raise RuntimeError(f"Boolean value of Tensor with {count} is ambiguous")
    if queues.in_host_operation():  # inside a host operation (its stream's turn): check now, and a
        # false one raises to that operation's caller, as any error inside it does
        _check(cond, message)
        return
    device = cond.device.index
    check = HostCallback(lambda: _check(cond, message), queues.footprint((cond,), ()),
                         name=f"assert: {message}")
    queues.queue(device).enqueue(queues.current_stream(device), check)


def _check(cond: torch.Tensor, message: str) -> None:
    if not bool(_C.host_alias(cond).item()):
        raise RuntimeError(message or "Assertion is failed")  # (the CPU's words for an empty one)


def functional_assert_async(cond: torch.Tensor, message: str, dep_token: torch.Tensor) -> torch.Tensor:
    assert_async(cond, message)
    return dep_token.clone()  # (a new token, as the CPU's: the op's schema does not alias it)


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_assert_async", assert_async, "PrivateUse1")
    _lib.impl("_assert_async.msg", assert_async, "PrivateUse1")
    _lib.impl("_functional_assert_async.msg", functional_assert_async, "PrivateUse1")
