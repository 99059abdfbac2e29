"""The simulated Spyre device below the queue layer.

What the queue layer is handed and runs without knowing what it is:

* data_movement.SimulatedDataMovement: each device's engine for transfers
  (memmove over host-addressable device memory, priced by the hardware
  config's bandwidths);
* programs.ProgramExecutor: a program as a Compute's Executor, with the
  program-distribution fetch as its prefetch.

``install(native)`` brings up the process's one runtime: every device's queue
wired to its engine, the one pool of pinned staging buffers, handed to the
C++ device guard, made current (spyre_runtime.queue.runtime.current) and
drained at exit. The PyTorch-facing device calls it when it registers.
"""

from __future__ import annotations

import atexit
import functools
import threading

from ..queue.runtime import Runtime, installed, set_current
from ..queue.staging import StagingPool
from .data_movement import SimulatedDataMovement, TransferCosts
from .programs import ProgramExecutor

__all__ = ["ProgramExecutor", "SimulatedDataMovement", "TransferCosts", "create_runtime", "install"]

# Staging buffers are small (a launch's correction slots, a pageable copy's bytes):
# the smallest one handed out.
STAGING_MIN_BYTES = 256

# Held only to create the runtime, and never while taking any other lock but the C++
# guard's own (set_runtime).
_install_lock = threading.Lock()


def create_runtime(native, hardware=None, wait_timeout: float = 60.0) -> Runtime:
    """A runtime for every device `native` (the C++ module) knows: each device's queue gets
    a SimulatedDataMovement over its regions, all share one pinned staging pool."""
    from .. import memory  # torch: imported here, so the engines above stay importable without it
    from ..hardware import HARDWARE

    hardware = HARDWARE if hardware is None else hardware
    costs = TransferCosts(hardware.host_link_gbps, hardware.device_memory_gbps_mixed)
    staging = StagingPool(_pinned_bytes, min_bytes=STAGING_MIN_BYTES)

    def engine(device: int) -> SimulatedDataMovement:
        return SimulatedDataMovement(costs, functools.partial(memory.region_address, device))

    return Runtime(native.device_count(), engine, native=native, wait_timeout=wait_timeout, staging=staging)


def _pinned_bytes(nbytes: int):
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)


def install(native, hardware=None, wait_timeout: float | None = None) -> Runtime:
    """The process's runtime, created on the first call (no threads start yet)."""
    runtime = installed()
    if runtime is not None:
        return runtime
    with _install_lock:
        runtime = installed()
        if runtime is None:
            if wait_timeout is None:
                from ..hardware import wait_timeout_from_env

                wait_timeout = wait_timeout_from_env()
            runtime = create_runtime(native, hardware, wait_timeout)
            native.set_runtime(runtime)
            set_current(runtime)
            # Work still queued at exit would run on worker threads while Python and torch
            # tear down (the process aborts): finish it and stop the workers first, as CUDA
            # drains at exit.
            atexit.register(runtime.shutdown)
    return runtime
