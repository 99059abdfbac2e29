"""torch.spyre memory statistics.

The numbers live in the C++ allocator; these functions read them through
torch.accelerator, so torch.spyre.memory_* and torch.accelerator.memory_*
can never disagree.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from ._index import device_index


def memory_stats(device=None) -> OrderedDict[str, Any]:
    return torch.accelerator.memory_stats(device_index(device))


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
