"""The device layer's view of the queue layer: tensors in, typed operations out.

Turns tensors into footprints and device addresses, and runs eager work on
the current stream. The queue layer itself (spyre_runtime.queue) knows
nothing about tensors.
"""

from __future__ import annotations

import torch

from spyre_runtime import _C
from spyre_runtime.hardware import HARDWARE, wait_timeout_from_env
from spyre_runtime.queue import (
    Costs,
    DeviceAddress,
    Footprint,
    HostCallback,
    Range,
    Runtime,
    StagingPool,
    Timeline,
    in_host_operation,
)

_runtime: Runtime | None = None
staging = StagingPool(lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True))


def install() -> Runtime:
    """Create the queue layer and hand it to the C++ guard (no threads start yet)."""
    global _runtime
    if _runtime is None:
        costs = Costs(HARDWARE.host_link_gbps, HARDWARE.device_memory_gbps_mixed)
        _runtime = Runtime(_C.device_count(), costs, native=_C, wait_timeout=wait_timeout_from_env())
        _C.set_runtime(_runtime)
    return _runtime


def runtime() -> Runtime:
    return _runtime if _runtime is not None else install()


def queue(device: int):
    return runtime().queue(device)


def current_stream(device: int) -> int:
    return _C.current_stream_id(device)


# (storage address, bytes) -> its allocation's pieces. A live allocation's
# address and size determine its region, offset and length, so an entry can
# never be stale.
_pieces_cache: dict[tuple[int, int], tuple[Range, ...]] = {}


def storage_ranges(storage: torch.UntypedStorage) -> tuple[Range, ...]:
    key = (storage.data_ptr(), storage.nbytes())
    found = _pieces_cache.get(key)
    if found is None:
        if key[1] == 0:
            return ()
        if len(_pieces_cache) > 4096:
            _pieces_cache.clear()
        found = _pieces_cache[key] = tuple(Range(*p) for p in _C.describe(key[0]))
    return found


def ranges(t: torch.Tensor) -> tuple[Range, ...]:
    """The device memory a tensor touches: the span from its first to its last element.

    Views of one storage that do not overlap get disjoint ranges, so work on
    them can overlap across streams.
    """
    if t.numel() == 0:
        return ()
    pieces = storage_ranges(t.untyped_storage())
    if len(pieces) != 1:
        return pieces
    if t.is_contiguous():
        extent = t.numel()
    else:
        strides = t.stride()
        if min(strides) < 0:
            return pieces  # negative strides: be conservative
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, strides))
    size = t.element_size()
    whole = pieces[0]
    return (Range(whole.region, whole.offset + t.storage_offset() * size, extent * size),)


def footprint(reads=(), writes=()) -> Footprint:
    return Footprint(
        reads=tuple(r for t in reads for r in ranges(t)),
        writes=tuple(r for t in writes for r in ranges(t)),
    )


def address(t: torch.Tensor) -> DeviceAddress:
    """Where a tensor's first element lives: (region, offset in the region)."""
    first = storage_ranges(t.untyped_storage())[0]
    return DeviceAddress(first.region, first.offset + t.storage_offset() * t.element_size())


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
