"""Single-use software signals: how streams wait for each other.

A signal is fired by exactly one Signal operation. A user-facing event maps
to a fresh signal each time it is recorded.

A signal is also where two devices' queues meet: a Wait may be enqueued on
one device for a signal enqueued (or still to be enqueued) on another. Each
queue keeps its own lock and its own bookkeeping; what they share is this
record, guarded by one lock that is never held while taking a queue's lock.
A queue that fires a signal hands each waiter of another queue back to that
queue (DeviceQueue.signal_fired), so a wait and everything behind it always
completes on its own device. A Signal skipped because its stream failed
still fires, on one device or across two alike, but fires failed: `failure`
holds the error that stopped its stream, and a Wait on it fails with that
error (the waiting stream stops too: nothing behind the wait may run as if the
failed work had run), until the owner's clear_error() forgets it.

Lock order: a queue's lock, then this module's `lock`; never the other way
round. Every other lock of the runtime is a leaf, held without taking any
other: the staging pool's (staging.py), the runtime's event table
(Runtime._lock), the device's install lock (spyre_runtime.device, held only
while the one runtime is created) and the fallbacks' once-per-op warning
record (spyre_inductor.device.fallback).
"""

from __future__ import annotations

import itertools
import threading

_ids = itertools.count(1)

# Guards every signal's ticket, owner, fired_ns and waiters. Taken while a
# queue's lock is held (queue lock, then this), never the other way round.
lock = threading.Lock()


class SoftSignal:
    __slots__ = ("ident", "ticket", "owner", "fired_ns", "waiters", "failure")

    def __init__(self):
        self.ident = next(_ids)
        self.ticket = None    # the Signal operation's ticket, once enqueued
        self.owner = None     # the queue it was enqueued on
        self.fired_ns = None  # its simulated end, once it fired
        self.waiters = []     # (queue, Wait ticket) to release when it fires
        self.failure = None   # the error of the work it covers, if it fired behind a failure

    @property
    def fired(self) -> bool:
        return self.fired_ns is not None

    @property
    def sim_time_ns(self) -> float | None:
        return self.fired_ns

    def __repr__(self) -> str:
        state = ("failed" if self.failure is not None else "fired") if self.fired else \
            ("enqueued" if self.ticket else "pending")
        return f"SoftSignal({self.ident}, {state})"
