"""The Work a spyre collective returns: its operation on the stream, waited for as on a GPU.

``wait()`` orders the CALLER'S current stream after the collective (nothing to do when the
collective went on that stream) and returns without blocking the host, as NCCL's work
does; ``wait(timeout)`` with a timeout blocks the host until it is done and raises if it
failed or took longer. ``is_completed()``, ``exception()`` and ``get_future()`` (a
torch.futures.Future completed with the output tensors) report the operation itself.
"""

from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist

from spyre_runtime.queue import Wait

from ..device import queues


class SpyreWork(dist.Work):
    def __init__(self, device: int, stream: int, ticket, signal, outputs, landing=None):
        super().__init__()
        self.device, self.stream, self.ticket, self.signal = device, stream, ticket, signal
        self.outputs = list(outputs)
        # an irecv: enqueues its landing on the stream when waited for (see process_group.receive)
        self._landing = landing
        self._future = None
        self._lock = threading.Lock()

    def _land(self) -> None:
        with self._lock:
            landing, self._landing = self._landing, None
        if landing is not None:
            self.stream = queues.current_stream(self.device)
            self.ticket, self.signal = landing()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._land()
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        if seconds > 0:
            return self._wait_host(seconds)
        if self.ticket.done and (self.ticket.error is not None or self.ticket.skipped):
            raise self.exception()
        current = queues.current_stream(self.device)
        if current != self.stream:  # (a signal that fired still orders the stream's simulated time)
            queues.queue(self.device).enqueue(current, Wait(self.signal))
        return True

    def synchronize(self) -> None:
        self.wait()

    def _wait_host(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.ticket.done:
            if time.monotonic() > deadline:
                raise dist.DistBackendError(f"spyre: {self.ticket.name} did not complete within {seconds:g} s")
            time.sleep(0.0005)
        if self.ticket.error is not None or self.ticket.skipped:
            raise self.exception()
        return True

    def is_completed(self) -> bool:
        self._land()
        return self.ticket.done

    def is_success(self) -> bool:
        return self.is_completed() and self.ticket.error is None and not self.ticket.skipped

    def exception(self):
        if self.ticket is None:  # an irecv not waited for yet
            return None
        t = self.ticket
        if t.error is not None:
            return t.error
        if t.skipped:
            return dist.DistBackendError(f"spyre: {t.name} did not run: an earlier operation of its stream failed "
                                         f"({t.pending_error})")
        return None

    def result(self):
        return self.outputs

    def source_rank(self) -> int:
        return getattr(self, "_source", -1)

    def get_future(self) -> torch.futures.Future:
        self._land()
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                threading.Thread(target=self._complete_future, name="spyre-work-future", daemon=True).start()
            return self._future

    def _complete_future(self) -> None:
        try:
            queues.queue(self.device).wait(self.ticket)
        except BaseException as e:  # noqa: BLE001 - handed to the future's waiter
            self._future.set_exception(e)
            return
        self._future.set_result(self.outputs)


class DoneWork(dist.Work):
    """Work that is complete when returned (a collective over no spyre bytes)."""

    def __init__(self, outputs=()):
        super().__init__()
        self.outputs = list(outputs)

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self.outputs

    def get_future(self):
        f = torch.futures.Future()
        f.set_result(self.outputs)
        return f
