"""Spyre tensors as the runtime sees them: device ranges, addresses, footprints.

A tensor's storage is one allocation of (region, offset, length) pieces; a
tensor touches the span from its first to its last element.
"""

from __future__ import annotations

import torch

from . import _C
from .queue.operations import DeviceAddress, Footprint, Range


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


