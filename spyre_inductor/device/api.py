"""The ``torch.spyre`` module: torch.cuda's names, for the spyre device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spyre_runtime import _C
from spyre_runtime.hardware import HARDWARE

from ._index import device_index as _device_index
from .memory import (  # noqa: F401
    Piece,
    Region,
    describe,
    memory_regions,
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from .random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (  # noqa: F401
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def init() -> None:
    """Devices are ready as soon as the package is loaded; kept for torch.cuda parity."""


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device) -> None:
    _C.set_device(_device_index(device))


class device:
    """``with torch.spyre.device(1):`` makes spyre:1 current, then restores."""

    def __init__(self, device):
        self.index = _device_index(device)
        self._previous: int | None = None

    def __enter__(self):
        self._previous = _C.current_device()
        _C.set_device(self.index)
        return self

    def __exit__(self, *exc):
        _C.set_device(self._previous)
        return False


@dataclass(frozen=True)
class DeviceProperties:
    """What torch.spyre.get_device_properties reports (figures from the hardware config)."""

    name: str
    total_memory: int
    cores: int
    scratchpad_bytes: int
    stick_bytes: int
    clock_ghz: float


def get_device_name(device=None) -> str:
    _device_index(device)
    return HARDWARE.name


def get_device_properties(device=None) -> DeviceProperties:
    index = _device_index(device)
    return DeviceProperties(
        name=HARDWARE.name,
        total_memory=torch.accelerator.get_memory_info(index)[1],
        cores=HARDWARE.cores,
        scratchpad_bytes=HARDWARE.scratchpad_bytes,
        stick_bytes=HARDWARE.stick_bytes,
        clock_ghz=HARDWARE.clock_ghz,
    )


def get_device_capability(device=None) -> dict:
    return torch.accelerator.get_device_capability(torch.device("spyre", _device_index(device)))


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# Read by Inductor's init_backend_registration on the first compile. Resolved
# lazily so that `import torch` does not import Inductor (seconds); the first
# read registers the whole spyre backend (spyre_inductor.compiler.inductor.registration).
_INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def __getattr__(name: str):
    if name == "default_generators":
        from .random import default_generator

        return tuple(default_generator(i) for i in range(_C.device_count()))
    if name in _INDUCTOR_NAMES:
        from spyre_inductor.compiler.inductor.registration import inductor_attribute

        return inductor_attribute(name)
    raise AttributeError(f"module 'torch.spyre' has no attribute {name!r}")


def timeline(path=None):
    """``with torch.spyre.timeline("run.json"):`` records every device operation
    and writes the simulated timeline (Chrome trace / Perfetto JSON) on exit."""
    from . import queues

    return queues.timeline(path)


def kernel_reports():
    """Reports of the most recent programs launched since reset_kernel_reports(), oldest
    first: simulated_us, roofline_us, efficiency, bytes_moved, minimum_bytes (what the
    kernel needs at least, when its program records it; the roofline and efficiency are
    against it then), refetch, flops, cores_used, bottleneck, per-unit busy time, and
    describe() for one printable line (docs/timing_model.md).

    Only a window of the most recent launches is kept (1024 by default; older reports
    are dropped so a long run does not grow without bound): see
    set_kernel_report_window().

    A report exists once its program has run: this waits for every device's work enqueued so
    far (as synchronize() does), so what was launched before the call is in the list."""
    from spyre_runtime.program.run import kernel_reports as reports

    for device in range(device_count()):
        try:
            synchronize(device)
        except Exception:  # noqa: BLE001 - a failed stream keeps its error for the caller's own
            pass           # synchronize; the reports of what did run are still wanted
    return reports()


def reset_kernel_reports() -> None:
    from spyre_runtime.program.run import reset_kernel_reports as reset

    reset()


def kernel_report_window() -> int | None:
    """How many of the most recent kernel reports kernel_reports() keeps (None: all)."""
    from spyre_runtime.program.run import kernel_report_window as window

    return window()


def set_kernel_report_window(n: int | None) -> None:
    """Keep the ``n`` most recent kernel reports (default 1024); ``None`` keeps every
    report, without bound (each is about 11 KB). The newest reports already kept stay."""
    from spyre_runtime.program.run import set_kernel_report_window as set_window

    set_window(n)


def fallback_reports():
    """Per eager op and per compiled graph's CPU kernel that ran on the CPU since
    reset_fallback_reports(): its calls and the host seconds its CPU work took
    (spyre_inductor.device.fallback.FallbackReport)."""
    from .fallback import fallback_reports as reports

    return reports()


def reset_fallback_reports() -> None:
    from .fallback import reset_fallback_reports as reset

    reset()


def eager_cache_stats():
    """Statistics of the compile-backed eager ops' cache (spyre_inductor/eager): hits, misses,
    compiles (entries compiled into spyre programs), cpu_routes (entries that run through the
    CPU fallback), evictions, entries, capacity, compile_seconds."""
    from spyre_inductor.eager.cache import CACHE

    return CACHE.stats()


def eager_cache_clear() -> None:
    """Drop every cached eager entry and zero the statistics; each compiled entry's programs give
    back their device memory once their launches are done."""
    from spyre_inductor.eager.cache import CACHE

    CACHE.clear()


def set_eager_cache_capacity(n: int) -> None:
    """Keep at most ``n`` eager entries (those asked for most often and most recently: W-TinyLFU,
    spyre_inductor/eager/cache.py; default 1024, or ``SPYRE_EAGER_CACHE_SIZE``)."""
    from spyre_inductor.eager.cache import CACHE

    CACHE.set_capacity(n)


def clear_errors(device=None) -> None:
    """Forget a device's failures: its streams' sticky errors, the failed mark of events recorded
    behind them, and the poison on memory failed operations were to write (README: streams)."""
    from . import queues

    queues.queue(_device_index(device)).clear_error()


def _is_in_bad_fork() -> bool:
    # torch.manual_seed asks; the simulated device survives fork.
    return False
