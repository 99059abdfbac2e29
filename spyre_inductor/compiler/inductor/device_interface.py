"""Dynamo's view of the spyre device (``torch._dynamo.device_interface``).

Dynamo asks a device interface for streams, events, synchronization and
device properties when it traces code that uses them (``torch.spyre.Stream``,
``synchronize``, ...) and when Inductor benchmarks. Everything forwards to
``torch.spyre``, which already mirrors ``torch.cuda``; nothing here holds state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._dynamo.device_interface import DeviceInterface


@dataclass(frozen=True)
class InductorDeviceProperties:
    """torch.spyre's device properties under the names Inductor's heuristics read
    (``multi_processor_count``: how many ways work can split, here the cores)."""

    name: str
    total_memory: int
    multi_processor_count: int
    scratchpad_bytes: int
    stick_bytes: int


def _properties(device=None) -> InductorDeviceProperties:
    p = torch.spyre.get_device_properties(device)
    return InductorDeviceProperties(p.name, p.total_memory, p.cores, p.scratchpad_bytes, p.stick_bytes)


class SpyreInterface(DeviceInterface):
    class device:  # noqa: N801 - DeviceInterface's spelling
        def __new__(cls, device):
            return torch.spyre.device(device)

    class Event:
        def __new__(cls, *args, **kwargs):
            return torch.spyre.Event(*args, **kwargs)

    class Stream:
        def __new__(cls, *args, **kwargs):
            return torch.spyre.Stream(*args, **kwargs)

    class Worker:
        # Inductor's compile workers ask these without touching the device.
        @staticmethod
        def set_device(device: int) -> None:
            torch.spyre.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.spyre.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return _properties(device)

    @staticmethod
    def current_device() -> int:
        return torch.spyre.current_device()

    @staticmethod
    def set_device(device) -> None:
        torch.spyre.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = torch.spyre.current_device()
        if device != previous:
            torch.spyre.set_device(device)
        return previous

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.spyre.current_device()
        torch.spyre.set_device(device)
        return previous

    @staticmethod
    def device_count() -> int:
        return torch.spyre.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.spyre.is_available()

    @staticmethod
    def stream(stream):
        return torch.spyre.stream(stream)

    @staticmethod
    def current_stream():
        return torch.spyre.current_stream()

    @staticmethod
    def set_stream(stream) -> None:
        torch.spyre.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.spyre.set_stream(torch.spyre.Stream(stream_id=stream_id, device_index=device_index,
                                                  device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Our kernels launch on the current stream through the runtime; the
        # raw handle Inductor threads through GPU launches is the stream id.
        return torch.spyre.current_stream(device_idx).stream_id

    @staticmethod
    def synchronize(device=None) -> None:
        torch.spyre.synchronize(device)

    @classmethod
    def get_device_properties(cls, device=None):
        return _properties(device)

    @staticmethod
    def get_compute_capability(device=None):
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device=None) -> int:
        return torch.spyre.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False
