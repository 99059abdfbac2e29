"""The queue layer of all devices, and the stream/event calls PyTorch makes.

The C++ device guard forwards torch.Stream / torch.Event operations here
(runtime_bridge.cpp). User events map to single-use signals: each record
enqueues a fresh Signal; waiting enqueues a Wait on the latest one.

There is ONE runtime per process: whoever brings the device up creates it
and makes it current (set_current, once); everything else -- the PyTorch
device, the launch layer -- reaches it through current(). It also owns the
process's one pool of pinned staging buffers (staging.py), which eager copies
and launches share.
"""

from __future__ import annotations

import threading
from typing import Callable

from .device_queue import DeviceQueue
from .operations import DataMovement, Signal, Wait
from .signals import SoftSignal
from .staging import StagingPool


_current: Runtime | None = None


def set_current(runtime: Runtime) -> None:
    """Make `runtime` the process's runtime (once, when the device registers)."""
    global _current
    if _current is not None and _current is not runtime:
        raise RuntimeError("spyre: a runtime is already running; there is one per process")
    _current = runtime


def installed() -> Runtime | None:
    """The process's runtime, or None before the device has registered."""
    return _current


def current() -> Runtime:
    if _current is None:
        raise RuntimeError("spyre: no runtime is running (import torch or spyre_inductor first)")
    return _current


class Runtime:
    def __init__(self, num_devices: int, data_movement: Callable[[int], DataMovement], native=None,
                 wait_timeout: float = 60.0, staging: StagingPool | None = None):
        """`data_movement(device)`: that device's engine for transfers (the simulated device's,
        spyre_runtime.device). `native`: the C++ module (stream priorities, progress).
        `staging`: the pool of pinned host staging buffers every user of this runtime shares."""
        self._lock = threading.Lock()
        self._events: dict[int, tuple[int, SoftSignal]] = {}
        self.staging = staging if staging is not None else StagingPool(_no_host_memory)
        self.devices = [self._make_queue(d, data_movement(d), native, wait_timeout) for d in range(num_devices)]

    @staticmethod
    def _make_queue(device: int, data_movement: DataMovement, native, wait_timeout: float) -> DeviceQueue:
        if native is None:
            return DeviceQueue(device, data_movement, wait_timeout=wait_timeout)
        return DeviceQueue(
            device,
            data_movement,
            stream_priority=lambda sid: native.stream_priority(device, sid),
            on_enqueued=lambda sid, seq: native.note_enqueued(device, sid, seq),
            on_completed=lambda sid, seq: native.note_completed(device, sid, seq),
            wait_timeout=wait_timeout,
            watch_allocations=lambda on: native.watch_allocations(device, on),
            take_allocations=lambda: native.take_allocations(device),
        )

    def queue(self, device: int) -> DeviceQueue:
        return self.devices[device]

    # ---- events (called by the C++ guard) ----------------------------------

    def event_record(self, event: int, device: int, stream: int) -> None:
        signal = SoftSignal()
        self.devices[device].enqueue(stream, Signal(signal))
        with self._lock:
            self._events[event] = (device, signal)

    def event_block(self, event: int, device: int, stream: int) -> None:
        with self._lock:
            entry = self._events.get(event)
        if entry is not None:  # never recorded: nothing to wait for, as on CUDA
            self.devices[device].enqueue(stream, Wait(entry[1]))

    # An event recorded behind a failure fires failed (signals.py): query and synchronize both
    # raise the failure, until clear_errors() forgets it; then both report the event done.

    def event_query(self, event: int) -> bool:
        with self._lock:
            entry = self._events.get(event)
        if entry is None:
            return True
        signal = entry[1]
        if not signal.fired:
            return False
        failure = signal.failure
        if failure is not None:
            raise failure
        return True

    def event_synchronize(self, event: int) -> None:
        with self._lock:
            entry = self._events.get(event)
        if entry is not None:
            device, signal = entry
            self.devices[device].wait(signal.ticket, outcome=False)
            failure = signal.failure
            if failure is not None:
                raise failure

    def event_elapsed_ms(self, start: int, end: int) -> float:
        with self._lock:
            a, b = self._events.get(start), self._events.get(end)
        if a is None or b is None:
            raise ValueError("spyre: both events must be recorded before elapsed_time")
        if not (a[1].fired and b[1].fired):
            raise ValueError("spyre: both events must have completed before elapsed_time (synchronize first)")
        if a[0] != b[0]:
            raise ValueError(f"spyre: elapsed_time needs events of one device, got spyre:{a[0]} and spyre:{b[0]}")
        return (b[1].sim_time_ns - a[1].sim_time_ns) / 1e6

    def event_destroy(self, event: int) -> None:
        with self._lock:
            self._events.pop(event, None)

    # ---- streams -------------------------------------------------------------

    def stream_query(self, device: int, stream: int) -> bool:
        return self.devices[device].query_stream(stream)

    def stream_synchronize(self, device: int, stream: int) -> None:
        self.devices[device].synchronize_stream(stream)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Finish every device's enqueued work and stop its workers (registered at exit)."""
        for q in self.devices:
            q.shutdown(timeout)

    def device_synchronize(self, device: int) -> None:
        self.devices[device].synchronize()


def _no_host_memory(nbytes: int):
    raise RuntimeError("this runtime was created without a staging pool (no pinned host memory)")
