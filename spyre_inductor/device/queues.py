"""The device layer's view of the queue layer: tensors in, typed operations out.

Turns tensors into footprints and device addresses, and runs eager work on
the current stream. The queue layer itself (spyre_runtime.queue) knows
nothing about tensors.
"""

from __future__ import annotations

from spyre_runtime import _C
from spyre_runtime import device as simulated_device
from spyre_runtime.queue import HostCallback, Runtime, StagingPool, Timeline, in_host_operation
from spyre_runtime.queue.runtime import installed
from spyre_runtime.tensors import address, footprint, ranges, storage_ranges  # noqa: F401


def install() -> Runtime:
    """Bring up the process's one runtime (spyre_runtime.device.install; no threads start yet)."""
    return simulated_device.install(_C)


def runtime() -> Runtime:
    """The process's one runtime (the launch layer reaches the same one through
    spyre_runtime.queue.runtime.current())."""
    rt = installed()
    return rt if rt is not None else install()


def staging() -> StagingPool:
    """The process's one pool of pinned staging buffers (shared with the launch layer)."""
    return runtime().staging


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
