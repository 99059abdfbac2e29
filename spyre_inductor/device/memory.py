"""torch.spyre memory statistics and the placement of allocations.

The numbers live in the C++ allocator; these functions read them through
torch.accelerator, so torch.spyre.memory_* and torch.accelerator.memory_*
can never disagree. memory_stats() adds what only spyre has: its regions.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import torch

from spyre_runtime import _C

from . import queues
from ._index import device_index


class Piece(NamedTuple):
    """A contiguous piece of an allocation: a region handle and a byte range in it."""

    region: int
    offset: int
    length: int


def describe(obj) -> list[Piece]:
    """Where a spyre tensor's (or storage's) allocation lives: its pieces.

    Today every allocation is one piece (a PyTorch storage must be contiguous
    in the device's address space), but callers must not assume it.
    """
    storage = obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj
    if not isinstance(storage, torch.UntypedStorage):
        storage = getattr(storage, "untyped_storage", lambda: storage)()
    if not isinstance(storage, torch.UntypedStorage) or storage.device.type != "spyre":
        raise TypeError(f"torch.spyre.describe expects a spyre tensor or storage, got {_what(obj)}")
    return [Piece(*p) for p in _C.describe(storage.data_ptr())]


class Region(NamedTuple):
    """A region of device memory: its handle, size and how many blocks live in it."""

    handle: int
    size: int
    live_blocks: int


def memory_regions(device=None) -> list[Region]:
    """The regions a device's allocator holds, in address order."""
    return [Region(*r) for r in _C.regions(device_index(device))]


def _what(obj) -> str:
    device = getattr(obj, "device", None)
    return f"{type(obj).__name__} on {device}" if device is not None else type(obj).__name__


def memory_stats(device=None) -> OrderedDict[str, Any]:
    """torch.accelerator.memory_stats() plus spyre's region keys.

    ``regions.current`` / ``regions.budget``: region handles in use and allowed;
    ``regions.min_bytes``: the smallest region the policy creates;
    ``regions.free_bytes`` / ``regions.largest_free_block``: unused bytes
    inside regions; ``fragmentation``: 1 - largest free block / free bytes
    in regions; ``mode``: "pf" or "vf"; ``host_staging.buffers`` /
    ``host_staging.bytes``: the pinned host staging buffers of the process's
    one pool (eager copies and launches share it; the same for every device).
    """
    index = device_index(device)
    stats = torch.accelerator.memory_stats(index)
    info = _C.region_info(index)
    stats["regions.current"] = info["regions"]
    stats["regions.budget"] = info["region_budget"]
    stats["regions.min_bytes"] = info["min_region_bytes"]
    stats["regions.free_bytes"] = info["free_in_regions"]
    stats["regions.largest_free_block"] = info["largest_free_block"]
    stats["fragmentation"] = info["fragmentation"]
    stats["mode"] = info["mode"]
    staging = queues.staging()
    stats["host_staging.buffers"] = staging.created
    stats["host_staging.bytes"] = staging.created_bytes
    return stats


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(device_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(device_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(device_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(device_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(device_index(device))


def empty_cache() -> None:
    torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free bytes, total bytes) of a device's memory."""
    return torch.accelerator.get_memory_info(device_index(device))


_SUMMARY_ROWS = (  # (label, memory_stats key prefix, bytes?) in torch.cuda.memory_summary's order
    ("Allocated memory", "allocated_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("Reserved memory", "reserved_bytes", True),
    ("Non-releasable memory", "inactive_split_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocs", "active", False),
    ("Reserved segments", "segment", False),
    ("Non-releasable allocs", "inactive_split", False),
)


def _size(n: float) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B  " else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of memory_stats(), as torch.cuda.memory_summary() prints for CUDA (its rows
    and columns: current, peak, total allocated, total freed; per pool unless `abbreviated`),
    then what only spyre has: its regions and the host staging pool."""
    index = device_index(device)
    stats = memory_stats(index)
    columns = ("Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")
    line = "|" + "=" * 87 + "|"
    out = [line, f"|{'spyre memory summary, device ' + str(index):^87}|", line,
           f"|        Metric          | {columns[0]:>13} | {columns[1]:>13} | {columns[2]:>13} | {columns[3]:>13} |",
           "|" + "-" * 87 + "|"]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    for label, key, is_bytes in _SUMMARY_ROWS:
        for pool in pools:
            values = [stats.get(f"{key}.{pool}.{field}") for field in ("current", "peak", "allocated", "freed")]
            if values[0] is None:
                continue
            name = label if pool == "all" else f"  from {pool.split('_')[0]} pool"
            cells = [(_size(v) if is_bytes else str(v)) for v in values]
            out.append(f"| {name:<22} | {cells[0]:>13} | {cells[1]:>13} | {cells[2]:>13} | {cells[3]:>13} |")
        out.append("|" + "-" * 87 + "|")
    spyre = [
        f"Regions: {stats['regions.current']} of {stats['regions.budget']} (each at least "
        f"{_size(stats['regions.min_bytes'])}), mode {stats['mode']}",
        f"Free in regions: {_size(stats['regions.free_bytes'])}, largest free block "
        f"{_size(stats['regions.largest_free_block'])}, fragmentation {stats['fragmentation']:.3f}",
        f"Host staging: {stats['host_staging.buffers']} pinned buffer(s), {_size(stats['host_staging.bytes'])}",
        f"Device allocs/frees: {stats.get('num_device_alloc', 0)}/{stats.get('num_device_free', 0)}, "
        f"OOMs {stats.get('num_ooms', 0)}, alloc retries {stats.get('num_alloc_retries', 0)}",
    ]
    out += [f"| {s:<85} |" for s in spyre] + [line]
    return "\n".join(out) + "\n"
