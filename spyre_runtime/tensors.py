"""Spyre tensors as the runtime sees them: device ranges, addresses, footprints.

A tensor's storage is one allocation of (region, offset, length) pieces; a
tensor touches the span from its first to its last element.
"""

from __future__ import annotations

import torch

from . import _C
from .queue.operations import DeviceAddress, Footprint, Range


# (storage address, bytes) -> its allocation's pieces, valid for one region
# epoch. While no region is released, an address and a size determine the
# region, offset and length of the live allocation there (a region's address
# range never moves and holds only whole blocks). Releasing a region
# (empty_cache(), or the allocator's out-of-memory retry) breaks that: a new
# region may be created at the same address under a NEW handle, and a storage
# of the same size there would be described by the dead handle ("no region
# with handle N" on the first copy, footprints that miss hazards). The C++
# allocator bumps _C.region_epoch() on every release; the cache is dropped
# when it changed. (A storage being looked up is alive, so its region is too:
# the release that could make an entry for its address stale happened before
# it was allocated, and so before the epoch is read here.)
#
# The other cache of region information needs no epoch because region
# handles are never reused (each new region gets the next number, per device;
# allocator.cpp): the handle -> base address map of memory.region_address
# (device_view, and the simulated device's data-movement engine) can only
# hold the true base of a live handle. It keeps the entries of released
# handles (a few bytes each, never looked up with a live description).
_pieces_cache: dict[tuple[int, int], tuple[Range, ...]] = {}
_pieces_epoch = _C.region_epoch()


def storage_ranges(storage: torch.UntypedStorage) -> tuple[Range, ...]:
    return pieces_of(storage.data_ptr(), storage.nbytes())


def pieces_of(base: int, nbytes: int) -> tuple[Range, ...]:
    """storage_ranges of the storage at host address `base` holding `nbytes` (a launch has both)."""
    global _pieces_epoch
    epoch = _C.region_epoch()
    if epoch != _pieces_epoch:
        _pieces_cache.clear()
        _pieces_epoch = epoch
    key = (base, nbytes)
    found = _pieces_cache.get(key)
    if found is None:
        if key[1] == 0:
            return ()
        if len(_pieces_cache) > 4096:
            _pieces_cache.clear()
        found = _pieces_cache[key] = tuple(Range(*p) for p in _C.describe(key[0]))
    return found


def element_span(t: torch.Tensor) -> tuple[int, int]:
    """The lowest and highest element a non-empty tensor touches, counted from its storage's start."""
    lo = hi = t.storage_offset()
    for n, st in zip(t.shape, t.stride()):
        if st > 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi


def reach_bytes(t: torch.Tensor) -> int:
    """How many bytes of its storage a tensor needs: up to the end of its last element (0 if empty)."""
    return (element_span(t)[1] + 1) * t.element_size() if t.numel() else 0


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
        lo, hi = element_span(t)
        if lo < t.storage_offset():
            return pieces  # negative strides: be conservative
        extent = hi - lo + 1
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
    storage = t.untyped_storage()
    pieces = storage_ranges(storage)
    reach = reach_bytes(t)
    if not pieces or reach > storage.nbytes():
        # A storage resized under the tensor: a transfer would run past its block.
        raise RuntimeError(f"spyre: a tensor of shape {list(t.shape)} reaches byte {reach} of its storage, "
                           f"which holds {storage.nbytes()} bytes (was the storage resized under it?)")
    first = pieces[0]
    return DeviceAddress(first.region, first.offset + t.storage_offset() * t.element_size())


