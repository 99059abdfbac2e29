"""The device layer's view of the queue layer: tensors in, typed operations out.

Turns tensors into footprints and device addresses, and runs eager work on
the current stream. The queue layer itself (spyre_runtime.queue) knows
nothing about tensors.
"""

from __future__ import annotations

import atexit

import torch

from spyre_runtime import _C
from spyre_runtime.hardware import HARDWARE, wait_timeout_from_env
from spyre_runtime.queue import Costs, HostCallback, Runtime, StagingPool, Timeline, in_host_operation
from spyre_runtime.queue import runtime as runtime_module
from spyre_runtime.tensors import address, footprint, ranges, storage_ranges  # noqa: F401

_runtime: Runtime | None = None
staging = StagingPool(lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True))


def install() -> Runtime:
    """Create the queue layer and hand it to the C++ guard (no threads start yet)."""
    global _runtime
    if _runtime is None:
        costs = Costs(HARDWARE.host_link_gbps, HARDWARE.device_memory_gbps_mixed)
        _runtime = Runtime(_C.device_count(), costs, native=_C, wait_timeout=wait_timeout_from_env())
        _C.set_runtime(_runtime)
        runtime_module.set_current(_runtime)
        # Work still queued at exit would run on worker threads while Python and torch tear
        # down (the process aborts): finish it and stop the workers first, as CUDA drains at exit.
        atexit.register(_runtime.shutdown)
    return _runtime


def runtime() -> Runtime:
    return _runtime if _runtime is not None else install()


def queue(device: int):
    return runtime().queue(device)


def current_stream(device: int) -> int:
    return _C.current_stream_id(device)


def run_on_host(device: int, fn, reads=(), writes=(), name: str = "host op"):
    """Run `fn` on this thread in the current stream's order; return its result.

    Waits for everything it must follow (earlier work on the stream, and work
    on other streams touching the same memory). An exception goes back to
    the caller without stopping the stream, like an argument error.
    """
    if in_host_operation():
        return fn()
    op = HostCallback(fn, footprint(reads, writes), name=name, raise_to_caller=True)
    return queue(device).run_inline(current_stream(device), op)


def timeline(path=None) -> Timeline:
    """``with torch.spyre.timeline("run.json"):`` writes the simulated timeline on exit."""
    return Timeline(runtime().devices, path)
