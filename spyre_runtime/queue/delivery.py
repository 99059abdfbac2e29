"""Handing a waiter back to its own device when another device's signal fires.

A Wait may name a signal of another device's queue (an event recorded on
spyre:0, waited for on spyre:1). The owner of the signal hands the waiter back
to the waiter's own queue when the signal fires (DeviceQueue.signal_fired), on
one delivery thread that holds no queue lock: the firing queue holds its own
lock when the signal fires, and two devices may wait on each other. So each
device's tickets are only ever completed, counted and woken by their own queue.
"""

from __future__ import annotations

import queue as queue_module
import threading
import traceback

_deliveries: queue_module.SimpleQueue = queue_module.SimpleQueue()
_delivery_thread: threading.Thread | None = None
_delivery_start = threading.Lock()


def deliver(q, waiter, source) -> None:
    """Tell `q` (outside the firing queue's lock) that the signal `waiter` waited for has
    fired, as its ticket `source`."""
    global _delivery_thread
    _deliveries.put((q, waiter, source))
    if _delivery_thread is None:
        with _delivery_start:
            if _delivery_thread is None:
                _delivery_thread = threading.Thread(target=_deliver_forever, name="spyre-signal-delivery",
                                                    daemon=True)
                _delivery_thread.start()


def _deliver_forever() -> None:
    while True:
        q, waiter, source = _deliveries.get()
        try:
            q.signal_fired(waiter, source)
        except BaseException:  # noqa: BLE001 - one failure must not stop every later cross-device wait
            traceback.print_exc()
