"""The stream graph: which earlier operations each new one waits for, and what a failure stops.

Rules, in the order they are applied to an added operation:

1. Stream order: it runs after the previous operation of its stream is done.
2. Derived edges: it runs after every unfinished operation of another stream
   whose footprint conflicts with its own (RAW, WAR, WAW on overlapping
   ranges). Explicit Signal/Wait pairs cover what footprints cannot express.
3. Barriers: a Barrier with no footprint waits for everything added before it,
   on any stream; a Barrier's `requires` (or a submission's) holds for named
   earlier operations and fails with them. A Compute behind an unfinished
   Barrier of its stream (or one that holds its fetch, Compute.hold_fetch)
   prefetches only once ready.
4. Signals and waits: a Wait runs after its signal's Signal; a signal not yet
   added (or added on another device) counts as a dependency until it fires
   (signal_fired), or until its wait times out (expire_waits).

A failing operation makes its stream's error sticky: later operations of that
stream are skipped (they complete, failed, without running) until
clear_error(). Other streams keep working, but nothing reads what failed
work was to write (poison.py). Readiness is decided here; running a ready
operation is the caller's (`dispatch`, handed a ticket that must run): the
graph starts no thread and takes no queue lock, so it is usable, and
testable, alone. A DeviceQueue holds its lock around every call.

Every operation also gets a simulated ready time: the later of its
dependencies' simulated ends and what the host has observed (sim_floor);
finished operations of other streams that conflict with it order it in
simulated time too (follow_finished).
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from . import signals
from .operations import Barrier, Compute, Exchange, HostCallback, Signal, Transfer, Wait
from .poison import Poison
from .signals import SoftSignal
from .tickets import Finished, StreamError, Ticket, WaitTimeout, root_of, stream_error

# Finished operations per stream that later ones still order against in
# simulated time (see StreamGraph._follow_finished).
RECENT = 16
_KNOWN_PIPELINES = frozenset(("compute", "h2d", "d2h", "d2d", "host", "link", "control"))


# While torch.profiler records spyre activity: () -> the correlation id of the CPU op the calling
# thread is in, kept on each ticket enqueued (device/profiler.py); None otherwise (no cost).
correlation_source = None


class Stream:
    __slots__ = ("id", "priority", "last", "pending", "writers", "recent", "error", "error_seq")

    def __init__(self, ident: int, priority: int):
        self.id = ident
        self.priority = priority
        self.last: Ticket | None = None
        self.pending: collections.deque[Ticket] = collections.deque()  # unfinished, in order
        self.writers: collections.deque[Ticket] = collections.deque()  # those that write memory
        self.recent: collections.deque[Ticket] = collections.deque(maxlen=RECENT)  # finished, with footprints
        self.error: StreamError | None = None
        self.error_seq = 0


def _deliver_now(q, waiter: Ticket, source: Ticket) -> None:
    q.signal_fired(waiter, source)


def _ready_at_once(t: Ticket) -> list:
    t.ready = True
    return []


class StreamGraph:
    def __init__(
        self,
        device: int = -1,
        owner=None,
        wait_timeout: float = 60.0,
        stream_priority: Callable[[int], int] = lambda sid: 0,
        poison: Poison | None = None,
        dispatch: Callable[[Ticket], list] = _ready_at_once,
        on_completed: Callable[[int, int], None] = lambda sid, seq: None,
        deliver: Callable[[object, Ticket, Ticket], None] = _deliver_now,
    ):
        """`owner`: what a signal added here names as its owner, and what another device's
        waiter is handed back to (`owner.signal_fired`): the DeviceQueue, or the graph itself.
        `dispatch(ticket)`: a ready ticket that must run; it returns tickets that became ready
        if it ran it at once (the default marks it ready and leaves it to the caller, who
        completes it). `deliver(owner, waiter, source)`: tell another device's owner that a
        signal its `waiter` waited for fired."""
        self.device = device
        self.owner = self if owner is None else owner
        self.wait_timeout = wait_timeout
        self._stream_priority = stream_priority
        self.poison = poison if poison is not None else Poison()
        self.dispatch = dispatch
        self.on_completed = on_completed
        self.deliver = deliver
        self.notify: Callable[[], None] = lambda: None  # a ticket completed
        self.on_unsignaled: Callable[[], None] = lambda: None  # a wait's signal is not added yet
        self.streams: dict[int, Stream] = {}
        # Streams with unfinished work, and streams whose finished work may still
        # order new work in simulated time: adding looks at these only, so
        # its cost does not grow with every stream ever created.
        self.busy: dict[Stream, None] = {}
        self.recent: dict[Stream, None] = {}
        self.inflight: dict[int, Ticket] = {}
        self.unsignaled: set[Ticket] = set()
        self.recorders: list[list[Ticket]] = []
        # Simulated time the host has observed (by synchronizing or waiting):
        # whatever it adds afterwards cannot start earlier.
        self.sim_floor = 0.0

    def stream(self, stream_id: int) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = self.streams[stream_id] = Stream(stream_id, self._stream_priority(stream_id))
        return stream

    def check_operation(self, op) -> None:
        pipeline = getattr(op, "pipeline", None)
        if pipeline not in _KNOWN_PIPELINES and not (type(op) is Exchange and pipeline.startswith("link:")):
            raise TypeError(f"spyre:{self.device}: cannot enqueue {type(op).__name__}; operations are "
                            f"HostCallback, Transfer, Compute, Exchange, Signal, Wait or Barrier")

    # ---- adding -------------------------------------------------------------

    def add(self, stream_id: int, op, seq: int, inline: bool = False, *, requires: tuple[Ticket, ...] = (),
            floor: float | None = None, batch: dict | None = None, claimant: list | None = None,
            pending_error: BaseException | None = None) -> Ticket:
        """A ticket for `op`, linked to what it waits for; ready (dispatched) at once if nothing.

        `requires`: earlier tickets it holds for and fails with (a submission's); `batch` maps
        id(op) to the tickets of the same enqueue_runs call, for a Barrier's `requires`. `floor`:
        the simulated time the host had observed when it handed the operation over (else
        sim_floor). `pending_error`: it completes, failed with that, once ready."""
        stream = self.stream(stream_id)
        ticket = Ticket(op, stream, seq, inline, self.device)
        source = correlation_source  # (read once: a profile may stop on another thread meanwhile)
        if source is not None:  # torch.profiler records: the CPU op enqueuing it
            ticket.correlation = source()
        if claimant is not None:
            ticket.claimant = claimant
        if pending_error is not None:
            ticket.pending_error = pending_error
        previous = stream.last
        self._add_dependencies(ticket, stream, requires, floor, batch)
        if type(op) is Compute:
            # The executor may read ahead of execution (prefetch), unless a
            # Barrier ahead of it on the stream holds it back until it is done.
            if op.hold_fetch or (previous is not None and not previous.done and type(previous.op) is Barrier):
                ticket.prefetch_on_ready = True
            else:
                prefetch(ticket)
        self._add_ticket(ticket)
        return ticket

    def _add_ticket(self, ticket: Ticket) -> None:
        stream = ticket.stream
        stream.last = ticket
        if not stream.pending:
            self.busy[stream] = None
        stream.pending.append(ticket)
        if ticket.op.footprint.writes:
            stream.writers.append(ticket)
        self.inflight[ticket.seq] = ticket
        if ticket.deps_left == 0:
            if ticket.inline and stream.error is None and ticket.pipeline != "control" and \
                    ticket.pending_error is None and not self.poison.ranges:
                ticket.ready = True  # nobody waits for it yet: no need to notify
            else:
                self.make_ready([ticket])

    def _add_dependencies(self, ticket: Ticket, stream: Stream, requires: tuple[Ticket, ...] = (),
                          floor: float | None = None, batch: dict | None = None) -> None:
        op = ticket.op
        deps: list[tuple[Ticket, str]] = []
        if stream.last is not None:
            if stream.last.done:
                ticket.ready_sim = stream.last.sim_end
            else:
                deps.append((stream.last, "stream"))
        ticket.ready_sim = max(ticket.ready_sim, self.sim_floor if floor is None else floor)
        footprint = op.footprint
        others = [s for s in self.busy if s is not stream] if self.busy else ()
        if others and not footprint.empty:
            for other in others:
                # A stream finishes in order: depending on its newest
                # conflicting operation covers the older ones. A read-only
                # operation can only conflict with writers.
                for pending in reversed(other.pending if footprint.writes else other.writers):
                    if footprint.conflicts(pending.op.footprint):
                        deps.append((pending, "derived"))
                        break
        if requires:
            _require(ticket, requires, deps)
        elif type(op) is Barrier and op.requires:
            self._required(ticket, deps, batch)
        if isinstance(op, Barrier) and footprint.empty:
            # A device-wide barrier: everything added before it, on any stream.
            deps.extend((other.pending[-1], "barrier") for other in others)
            for other in self.streams.values():
                if other is not stream and other.last is not None and other.last.done:
                    ticket.ready_sim = max(ticket.ready_sim, other.last.sim_end)
        if not footprint.empty:
            self._follow_finished(ticket, stream, footprint)
        elif isinstance(op, Signal):
            self._attach_signal(ticket, op.signal)
        elif isinstance(op, Wait):
            self._add_wait(ticket, op.signal, deps)
        if len(deps) == 1:
            dep = deps[0][0]
            dep.dependents.append(ticket)
            ticket.deps_left += 1
            ticket.edges.append(deps[0])
        elif deps:
            seen = set()
            for dep, why in deps:
                if dep.seq in seen:
                    continue
                seen.add(dep.seq)
                dep.dependents.append(ticket)
                ticket.deps_left += 1
                ticket.edges.append((dep, why))

    def _required(self, ticket: Ticket, deps: list, batch: dict | None) -> None:
        """A Barrier's `requires`: tickets of this enqueue_runs call it holds for and fails with."""
        found = []
        for op in ticket.op.requires:
            dep = batch.get(id(op)) if batch is not None else None
            if dep is None:
                raise ValueError(f"spyre:{self.device}: {ticket.name} requires {getattr(op, 'name', op)!r}, "
                                 f"which was not enqueued before it in the same enqueue_runs call")
            found.append(dep)
        _require(ticket, found, deps)

    def _follow_finished(self, ticket: Ticket, stream: Stream, footprint) -> None:
        """Simulated time also follows conflicting work that already finished.

        In host time it is done, but on the simulated timeline the new
        operation must not start before it ends. Looks back RECENT finished
        operations per stream (newest first: a stream's ends only grow).
        A stream whose newest finished operation ends before what the host has
        observed (sim_floor) can order nothing new, and is dropped from the
        streams looked at until it finishes more work.
        """
        stale = []
        for other in self.recent:
            if other.recent[-1].sim_end <= self.sim_floor:
                stale.append(other)
                continue
            if other is stream:
                continue
            for done in reversed(other.recent):
                if done.sim_end <= ticket.ready_sim:
                    break
                if footprint.conflicts(done.op.footprint):
                    ticket.ready_sim = done.sim_end
                    break
            else:
                if len(other.recent) == RECENT:
                    # Older operations are forgotten; each ended before the
                    # oldest remembered one started, so that start bounds them.
                    ticket.ready_sim = max(ticket.ready_sim, other.recent[0].sim_start)
        for other in stale:
            del self.recent[other]

    # ---- signals and waits ----------------------------------------------------

    def _add_wait(self, ticket: Ticket, signal: SoftSignal, deps: list) -> None:
        with signals.lock:
            if signal.fired:
                ticket.ready_sim = max(ticket.ready_sim, signal.fired_ns)
                ticket.edges.append((signal.ticket, "event"))
                return
            if signal.owner is self.owner:
                deps.append((signal.ticket, "event"))
                return
            # Not added yet (it may still come, from any stream of any device), or
            # added on another device: count it as a dependency now; its owner hands
            # this ticket back to us when it fires (signal_fired).
            ticket.deps_left += 1
            signal.waiters.append((self.owner, ticket))
            if signal.ticket is not None:
                return
        ticket.deadline = time.monotonic() + self.wait_timeout
        self.unsignaled.add(ticket)
        self.on_unsignaled()

    def _attach_signal(self, ticket: Ticket, signal: SoftSignal) -> None:
        with signals.lock:
            if signal.ticket is not None:
                raise ValueError(f"{signal!r} is single-use and was already enqueued")
            signal.ticket = ticket
            signal.owner = self.owner
            mine = [w for q, w in signal.waiters if q is self.owner]
            signal.waiters = [(q, w) for q, w in signal.waiters if q is not self.owner]
        for waiter in mine:
            # The waiter's placeholder dependency now stands for this ticket.
            waiter.deadline = None
            self.unsignaled.discard(waiter)
            waiter.edges.append((ticket, "event"))
            ticket.dependents.append(waiter)

    def _fire(self, t: Ticket) -> None:
        """A Signal completed: waiters on other devices go back to their own queues. Skipped
        (its stream had failed), it fires failed: the work it covers did not all run."""
        signal = t.op.signal
        failure = root_of(t.pending_error) if t.skipped else None
        if failure is not None:
            self.poison.signal_failed(t.stream.id, signal)
        with signals.lock:
            signal.failure = failure
            signal.fired_ns = t.sim_end
            remote, signal.waiters = signal.waiters, []
        for q, waiter in remote:
            self.deliver(q, waiter, t)

    def signal_fired(self, waiter: Ticket, source: Ticket) -> None:
        """Another device's signal that `waiter` (a Wait added here) waited for has fired."""
        self.unsignaled.discard(waiter)
        waiter.deadline = None
        waiter.ready_sim = max(waiter.ready_sim, source.sim_end)
        waiter.edges.append((source, "event"))
        waiter.deps_left -= 1
        if waiter.deps_left == 0:
            self.make_ready([waiter])

    def expire_waits(self, now: float) -> float | None:
        """Fail the waits whose signal was not added by their deadline (WaitTimeout); the
        next deadline, or None."""
        expired = [t for t in self.unsignaled if t.deadline is not None and t.deadline <= now]
        ready = []
        for t in expired:
            self.unsignaled.discard(t)
            signal = t.op.signal
            with signals.lock:
                added = signal.ticket is not None
                if not added:
                    signal.waiters.remove((self.owner, t))
            if added:  # on another device, meanwhile: its firing releases t
                t.deadline = None
                continue
            t.pending_error = WaitTimeout(
                f"spyre:{self.device} stream {t.stream.id}: {t.name} waited "
                f"{self.wait_timeout:g} s for a signal that was never enqueued"
            )
            t.deps_left -= 1
            if t.deps_left == 0:
                ready.append(t)
        self.make_ready(ready)
        deadlines = [t.deadline for t in self.unsignaled if t.deadline is not None]
        return min(deadlines) if deadlines else None

    # ---- readiness and completion ------------------------------------------------

    def make_ready(self, tickets: list[Ticket]) -> None:
        """Tickets whose dependencies are done: each is skipped (its stream failed), fails
        (a requirement failed, or it reads what failed work was to write), completes (a
        control operation), or is dispatched to run; and so on for what that readies."""
        work = list(tickets)
        while work:
            t = work.pop()
            stream = t.stream
            if t.pending_error is None and stream.error is not None and t.seq > stream.error_seq:
                t.skipped = True
                t.pending_error = stream.error  # why it was skipped, even after clear_error()
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self.complete(t, None))
            elif t.requires and t.pending_error is None and (failed := _requirement_failed(t)) is not None:
                t.pending_error = failed
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self.complete(t, failed))
            elif (self.poison.ranges or type(t.op) is Wait) and t.pending_error is None and \
                    (failed := self.poison.refusal(t)) is not None:
                t.pending_error = failed
                t.to_caller = t.inline and t.pipeline != "control"
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self.complete(t, failed))
            elif t.pipeline == "control" or t.pending_error is not None or \
                    (t.prefetch_on_ready and not prefetch(t)):
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self.complete(t, t.pending_error))
            else:
                work.extend(self.dispatch(t))

    def complete(self, t: Ticket, error: BaseException | None) -> list[Ticket]:
        """Mark done; returns dependents that became ready (the caller readies them)."""
        t.error = error  # before done: a reader without the lock that sees done sees its error
        t.done = True
        self.inflight.pop(t.seq, None)
        stream = t.stream
        op = t.op
        pending = stream.pending
        if pending[0] is t:  # tickets finish in stream order: almost always the oldest
            pending.popleft()
        else:
            pending.remove(t)
        if not pending:
            del self.busy[stream]
        kind = type(op)
        if kind is Signal:
            self._fire(t)
        footprint = op.footprint
        if stream.writers and footprint.writes:
            _drop(stream.writers, t)
        raises_to_caller = kind is HostCallback and op.raise_to_caller
        if error is not None and stream.error is None and not (raises_to_caller or t.to_caller):
            stream.error = stream_error(f"spyre:{self.device} stream {stream.id}: operation #{t.seq} ({t.name}) "
                                        f"failed: {type(error).__name__}: {error}", error)
            stream.error_seq = t.seq
        if footprint.writes:
            # What an inline operation was to write keeps what it held: its caller is told at once.
            if (error is not None or t.skipped) and not (raises_to_caller or t.inline):
                # Never written: nothing may read it as if it had been.
                if error is None:  # skipped: why, the failure that stopped its stream
                    root = root_of(t.pending_error)
                else:  # its own failure, as its stream's error names it, unless it only followed from another
                    root = getattr(error, "root", None) or (stream.error if stream.error_seq == t.seq else error)
                self.poison.add(footprint.writes, t, root)
            elif self.poison.ranges and kind is Transfer and error is None and not t.skipped:
                self.poison.drop(footprint.writes)  # a transfer that ran wrote every byte of its destination
        ready = []
        if t.dependents:
            end = t.sim_end
            for d in t.dependents:
                if d.ready_sim < end:
                    d.ready_sim = end
                d.deps_left -= 1
                if d.deps_left == 0:
                    ready.append(d)
            t.dependents = []
        # A finished ticket stays reachable (its stream's `last`, an event's
        # signal): drop its operands so tensors and buffers can be freed, and
        # its edges unless a timeline wants them.
        t.op = Finished(op.name, footprint)
        if t.requires:
            t.requires = ()
        if not footprint.empty and not t.skipped:
            stream.recent.append(t)
            self.recent[stream] = None
        if self.recorders:
            for rec in self.recorders:
                rec.append(t)
        elif t.edges:
            t.edges = []
        self.notify()
        self.on_completed(stream.id, t.seq)
        return ready

    def clear_error(self, stream_id: int | None = None) -> None:
        """Forget the failures of one stream (or of all): its sticky error, the failed mark of
        the signals it fired behind the failure, and the poison on what its failed operations
        were to write."""
        for stream in self.streams.values():
            if stream_id is None or stream.id == stream_id:
                stream.error = None
        self.poison.clear(stream_id)


def prefetch(t: Ticket) -> bool:
    """The Compute's prefetch; if it raises, the operation fails with that error (on its
    stream, like a failing run) instead of the enqueuer or a worker. True if it did not."""
    t.prefetch_on_ready = False
    try:
        t.op.executor.prefetch(t.op.bindings)
    except BaseException as e:  # noqa: BLE001 - reported through the stream
        t.pending_error = e
        return False
    return True


def _require(ticket: Ticket, found, deps: list) -> None:
    """`ticket` holds for the tickets `found` and fails (its stream stops) if one failed."""
    for dep in found:
        if dep.done:
            ticket.ready_sim = max(ticket.ready_sim, dep.sim_end)
        else:
            deps.append((dep, "requires"))
    ticket.requires = tuple(found)


def _requirement_failed(t: Ticket) -> BaseException | None:
    for dep in t.requires:
        if dep.error is not None or dep.skipped:
            cause = dep.error if dep.error is not None else dep.pending_error
            error = StreamError(f"{t.name}: {dep.name} (#{dep.seq} on stream {dep.stream.id}) did not "
                                f"complete ({type(cause).__name__}: {cause}); what depends on it is skipped")
            error.__cause__ = cause
            return error
    return None


def _drop(queue: collections.deque, t: Ticket) -> None:
    # Tickets finish in stream order, so this is almost always the oldest.
    if queue[0] is t:
        queue.popleft()
    else:
        queue.remove(t)
