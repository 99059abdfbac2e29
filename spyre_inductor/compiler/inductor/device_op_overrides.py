"""The snippets Inductor's wrapper codegen asks each device for.

``init_wrapper_code`` looks the device up unconditionally (KeyError without
an entry). spyre is not a GPU for Inductor (``is_gpu`` is False), so the
Python wrapper emits no device guards or raw streams for it; these strings
are still valid Python in case a code path asks. The C++-wrapper snippets
stay unimplemented: spyre has no C++ wrapper (see wrapper.py).
"""

from __future__ import annotations

from torch._inductor.codegen.common import DeviceOpOverrides


class SpyreDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from spyre_inductor.compiler.inductor.device_interface import SpyreInterface as _SpyreInterface\n" \
               f"{name} = _SpyreInterface.get_raw_stream"

    def set_device(self, device_idx: int) -> str:
        return f"torch.spyre.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.spyre.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.spyre.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.spyre.current_stream()"
