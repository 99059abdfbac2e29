"""What failed work left behind: bytes it was to write, signals it fired failed.

A failing operation stops its own stream (its error is sticky), but another
stream must not read what it never wrote either. What a failed or skipped
operation was to write is poisoned: an operation of any stream whose reads
overlap it fails instead of running, naming the original failure. A Signal
behind a failure fires failed, and a Wait on it fails the same way
(signals.py). Both last until clear_error() of the stream that failed; poison
also ends where a Transfer that completes writes over the bytes (it writes
every byte of its destination; a compute's or host callback's declared
writes are a span that may have holes, so they do not clear it), or where the
allocator hands the block out again (the device reports it through
`take_allocations`): a new tensor's bytes are uninitialized, not failed.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from . import signals
from .operations import Range, Wait
from .signals import SoftSignal
from .tickets import Ticket, stream_error


class PoisonedRange(NamedTuple):
    """Bytes a failed (or skipped) operation was to write: nothing may read them as if it had run."""

    range: Range
    writer: str   # the operation that was to write them, as errors name it
    stream: int
    root: BaseException  # the original failure


class Poison:
    """One device's poisoned bytes and failed signals (its queue's lock held throughout).

    `watch_allocations(on)` asks the device to note each block its allocator hands out while
    anything is poisoned, `take_allocations()` returns the (region, offset, length) of those
    handed out since the last call."""

    def __init__(self, watch_allocations: Callable[[bool], None] = lambda on: None,
                 take_allocations: Callable[[], list] = lambda: []):
        self._watch_allocations = watch_allocations
        self._take_allocations = take_allocations
        self.ranges: list[PoisonedRange] = []
        self.signals: list[tuple[int, SoftSignal]] = []  # fired behind a failure, with their stream

    def add(self, writes, t: Ticket, root: BaseException) -> None:
        """`t` failed or was skipped: what it was to write is poisoned, naming `root`."""
        # Blocks handed out before now are older than this poison: they clear only what was there.
        if self.ranges:
            fresh = self._take_allocations()
            if fresh:
                self.drop([Range(*block) for block in fresh])
        if not self.ranges:
            self._watch_allocations(True)  # before any block can be handed out over it unseen
            self._take_allocations()
        writer = f"operation #{t.seq} ({t.name}) on stream {t.stream.id}"
        self.ranges.extend(PoisonedRange(r, writer, t.stream.id, root) for r in writes)

    def drop(self, ranges) -> None:
        """The bytes of `ranges` are written anew (or handed out anew): no longer poisoned."""
        kept = []
        for p in self.ranges:
            pieces = [p.range]
            for cut in ranges:
                pieces = [rest for piece in pieces for rest in _minus(piece, cut)]
            kept.extend(p._replace(range=piece) for piece in pieces)
        self._set(kept)

    def _set(self, ranges: list[PoisonedRange]) -> None:
        had = bool(self.ranges)
        self.ranges = ranges
        if had and not ranges:
            self._watch_allocations(False)

    def signal_failed(self, stream_id: int, signal: SoftSignal) -> None:
        self.signals.append((stream_id, signal))

    def clear(self, stream_id: int | None = None) -> None:
        """Forget what the failures of one stream (or of all) left behind."""
        mine = lambda sid: stream_id is None or sid == stream_id  # noqa: E731
        with signals.lock:
            for sid, signal in self.signals:
                if mine(sid):
                    signal.failure = None
        self.signals = [(sid, sig) for sid, sig in self.signals if not mine(sid)]
        self._set([p for p in self.ranges if not mine(p.stream)])

    def refusal(self, t: Ticket) -> BaseException | None:
        """Why `t` must not run (a Wait on a signal that fired behind a failure, or an operation
        reading poisoned memory), or None."""
        op = t.op
        if type(op) is Wait:
            failure = op.signal.failure
            if failure is None:
                return None
            error = stream_error(f"{t.name} on stream {t.stream.id} waited for an event recorded behind a "
                                 f"failure, so what follows it would read what never ran: {failure}", failure)
            error.root = failure
            return error
        if t.pipeline == "control" or not op.footprint.reads:
            return None
        fresh = self._take_allocations()
        if fresh:
            self.drop([Range(*block) for block in fresh])
        for r in op.footprint.reads:
            for p in self.ranges:
                if r.overlaps(p.range):
                    error = stream_error(
                        f"{t.name} (#{t.seq} on stream {t.stream.id}) reads device memory (region {r.region}, "
                        f"bytes {max(r.offset, p.range.offset)}..) that {p.writer} was to write and never wrote: "
                        f"{p.root}", p.root)
                    error.root = p.root
                    return error
        return None


def _minus(a: Range, b: Range) -> list[Range]:
    """What of `a` lies outside `b`."""
    if not a.overlaps(b):
        return [a]
    rest = []
    if a.offset < b.offset:
        rest.append(Range(a.region, a.offset, b.offset - a.offset))
    end, cut_end = a.offset + a.length, b.offset + b.length
    if cut_end < end:
        rest.append(Range(a.region, cut_end, end - cut_end))
    return rest
