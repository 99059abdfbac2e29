"""Turning the many ways users name a spyre device into an index."""

from __future__ import annotations

import torch

from spyre_runtime import _C


def device_index(device=None, *, optional: bool = True) -> int:
    """Index of ``device`` (None, int, "spyre", "spyre:1" or torch.device)."""
    if device is None:
        if not optional:
            raise ValueError("spyre: expected a device, got None")
        return _C.current_device()
    if isinstance(device, int):
        index = device
    else:
        if isinstance(device, str):
            device = torch.device(device)
        if not isinstance(device, torch.device):
            raise TypeError(f"spyre: expected a device index, string or torch.device, got {type(device).__name__}")
        if device.type != "spyre":
            raise ValueError(f"spyre: expected a spyre device, got {device}")
        index = _C.current_device() if device.index is None else device.index
    count = _C.device_count()
    if not 0 <= index < count:
        raise IndexError(
            f"spyre: device index {index} is out of range; there are {count} spyre "
            f"devices (set SPYRE_NUM_DEVICES for more)"
        )
    return index
