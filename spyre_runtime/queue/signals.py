"""Single-use software signals: how streams wait for each other.

A signal is fired by exactly one Signal operation. A user-facing event maps
to a fresh signal each time it is recorded.
"""

from __future__ import annotations

import itertools

_ids = itertools.count(1)


class SoftSignal:
    __slots__ = ("ident", "ticket", "waiters")

    def __init__(self):
        self.ident = next(_ids)
        self.ticket = None  # the Signal operation's ticket, once enqueued
        self.waiters = []   # Wait tickets enqueued before the Signal was

    @property
    def fired(self) -> bool:
        return self.ticket is not None and self.ticket.done

    @property
    def sim_time_ns(self) -> float | None:
        return self.ticket.sim_end if self.fired else None

    def __repr__(self) -> str:
        state = "fired" if self.fired else ("enqueued" if self.ticket else "pending")
        return f"SoftSignal({self.ident}, {state})"
