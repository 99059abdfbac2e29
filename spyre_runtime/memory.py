"""Host views of simulated device memory (it lives in this process's address space)."""

from __future__ import annotations

import ctypes

import torch

from . import _C

_region_base: dict[tuple[int, int], int] = {}


def region_address(device: int, region: int) -> int:
    key = (device, region)
    base = _region_base.get(key)
    if base is None:
        base = _region_base[key] = _C.region_address(device, region)
    return base


def device_view(device: int, region: int, offset: int, nbytes: int) -> torch.Tensor:
    """A CPU uint8 tensor over `nbytes` of a region, starting at `offset` (no copy)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device="cpu")
    raw = (ctypes.c_char * nbytes).from_address(region_address(device, region) + offset)
    return torch.frombuffer(raw, dtype=torch.uint8)
