"""One device's queues: streams, dependencies, pipelines and their workers.

Rules, in the order they are applied to an enqueued operation:

1. Stream order: it runs after the previous operation of its stream is done.
2. Derived edges: it runs after every unfinished operation of another stream
   whose footprint conflicts with its own (RAW, WAR, WAW on overlapping
   ranges). Explicit Signal/Wait pairs cover what footprints cannot express.
3. Pipelines: a ready operation runs on its pipeline. There is ONE compute
   pipeline (ready computes go by stream priority, then enqueue order) and
   separate h2d, d2h, d2d and host pipelines, each with its own worker, so a
   transfer runs while a compute runs. Control operations (Signal, Wait,
   Barrier) complete as soon as they are ready.

What runs is not this module's business: a Compute runs its Executor (its
`prefetch` when enqueued, or when ready if it holds its fetch (Compute.hold_fetch,
as a launch's compute does for the patch it requires) or waits behind a Barrier;
then `run` and `cost_ns`), and a Transfer runs on the DataMovement engine the
device handed this queue (operations.py). The simulated device's engine and its program
distribution live in spyre_runtime.device.

Inline operations are run by the thread that enqueued them, once ready (eager
ops that need their result now: the CPU fallback, blocking copies, item()).

Every operation also gets a simulated start and end on its pipeline's
timeline: the later of its dependencies' simulated ends and its pipeline's
previous end, plus its cost (the executor's or the data-movement engine's
cost_ns; a host callback's declared cost_ns, or else its host wall time).

Launches are handed over without taking the queue (submit), as a host rings
a device's doorbell: they own their sequence numbers from then on, and are
enqueued in order by the next thread that holds the queue for anything, or
else by the queue's submission worker, which the doorbell wakes.

Who runs an operation: its pipeline's worker; the thread that enqueued it,
for inline operations and for the host callbacks and transfers of an
enqueue_runs(run_ready=True) or a submission that are ready at once (a
launch's patch); or a thread that waits (wait, synchronize) and finds ready
computes and transfers it is waiting for. The worker of a pipeline is woken
only when the pipeline has work, the worker is idle, and the work is not
what the waking thread waits for and will run itself.

Across devices: a Wait may name a signal of another device's queue (an
event recorded on spyre:0, waited for on spyre:1). The owner of the signal
hands the waiter back to the waiter's own queue when the signal fires
(signal_fired, on a delivery thread, holding no queue lock), so each device's
tickets are only ever completed, counted and woken by their own queue.

A failing operation makes its stream's error sticky: later operations of that
stream are skipped and the next query/synchronize raises, naming it, until
clear_error(). Other streams keep working. An index out of range (a gather
or scatter's IndexError, issue 16) is a StreamIndexError: an IndexError too,
naming op, value and bound, and sticky like any other stream error: the
operations enqueued behind it are skipped, so their outputs are never read
as if they had run (a read raises), until clear_error().

Nor by another stream. What a failed or skipped operation was to write is
poisoned: an operation of any stream whose reads overlap it fails instead of
running, naming the original failure (and, like any failure, stops its stream
and poisons what it was to write in turn). An inline operation (a host read:
item(), a blocking copy, the CPU fallback) raises to its caller instead: the
caller is told at once and nothing was written. A Signal behind a failure
fires failed, and a Wait on it fails the same way (signals.py). Poison lasts
until clear_error(), a Transfer that completes over the bytes (it writes
every byte of its destination; a compute's or host callback's declared
writes are a span that may have holes, so they do not clear it), or the
allocator hands the block out again (the device reports it through
`take_allocations`): a new tensor's bytes are uninitialized, not failed.
"""

from __future__ import annotations

import collections
import heapq
import queue as queue_module
import threading
import time
import traceback
from typing import Callable, NamedTuple

from . import signals
from .operations import NO_FOOTPRINT, Barrier, Compute, DataMovement, HostCallback, Range, Signal, Transfer, Wait
from .signals import SoftSignal

PIPELINES = ("compute", "h2d", "d2h", "d2d", "host")
# Finished operations per stream that later ones still order against in
# simulated time (see DeviceQueue._follow_finished).
RECENT = 16
_KNOWN_PIPELINES = frozenset(PIPELINES) | {"control"}
# How often the submission worker looks for launches handed over while it is awake, and for
# how many empty looks it stays awake (see DeviceQueue._submit_forever).
SUBMIT_POLL_S = 0.001
SUBMIT_POLL_ROUNDS = 20
_CLAIMABLE = frozenset(("host", "h2d", "d2h", "d2d"))  # what enqueue_runs(run_ready=True) may run itself

_local = threading.local()


class _helping:
    """While a thread waits for a device (holding its queue's lock when entered and left): the
    tickets of that queue it waits for, which it runs itself when their pipeline is free
    (DeviceQueue._help_or_wait), so their workers are not woken. Whatever it leaves ready
    when it stops waiting (it stopped early, or readied what it did not wait for) goes to the
    workers then."""

    __slots__ = ("queue", "wants", "outer")

    def __init__(self, queue: DeviceQueue, wants):
        self.queue, self.wants = queue, wants

    def __enter__(self):
        self.outer = getattr(_local, "helping", None)
        _local.helping = (self.queue, self.wants)

    def __exit__(self, *exc):
        _local.helping = self.outer
        self.queue._wake(self.queue.pipelines.values())
        return False


def in_host_operation() -> bool:
    """True while this thread runs an inline operation: nested device work runs directly."""
    return getattr(_local, "depth", 0) > 0


class StreamError(RuntimeError):
    """An operation failed on a stream; raised by the stream's query/synchronize until cleared."""


class StreamIndexError(StreamError, IndexError):
    """A program stopped at an index out of range; `op`, `value`, `bound` say which."""

    def __init__(self, message: str, op: str, value: int, bound: int):
        super().__init__(message)
        self.op, self.value, self.bound = op, value, bound


def _index_error(error: BaseException):
    """The out-of-range IndexError behind `error` (itself or a cause), or None."""
    while error is not None:
        if isinstance(error, IndexError) and hasattr(error, "bound"):
            return error
        error = error.__cause__
    return None


def _stream_error(message: str, cause: BaseException) -> StreamError:
    """A StreamError caused by `cause`: a StreamIndexError if an index out of range is behind it."""
    bad = _index_error(cause)
    error = StreamIndexError(message, bad.op, bad.value, bad.bound) if bad is not None else StreamError(message)
    error.__cause__ = cause
    root = getattr(cause, "root", None)
    if root is not None:  # it failed because of an earlier failure: that one is what to name
        error.root = root
    return error


def _root(error: BaseException) -> BaseException:
    """The original failure behind `error` (a failure that only follows from another has `root`)."""
    return getattr(error, "root", None) or error


class _Poison(NamedTuple):
    """Bytes a failed (or skipped) operation was to write: nothing may read them as if it had run."""

    range: Range
    writer: str   # the operation that was to write them, as errors name it
    stream: int
    root: BaseException  # the original failure


class WaitTimeout(TimeoutError):
    """A Wait whose signal was never enqueued."""


class Ticket:
    """The queue's record of one enqueued operation.

    What most tickets keep at its default is a class attribute (set on the ticket only when it
    changes): a launch makes a ticket per operation, and setting two dozen fields each time was
    a measurable share of a small launch's host time."""

    ready = done = skipped = False
    error: BaseException | None = None
    result = None
    pending_error: BaseException | None = None
    deadline: float | None = None
    ready_sim = sim_start = sim_end = 0.0
    host_start = host_end = 0
    prefetch_on_ready = False
    requires: tuple[Ticket, ...] = ()
    claimant: list | None = None  # enqueue_runs(run_ready=True): the caller runs it once ready
    # Its failure goes to the thread that waits for it only (an inline operation refused for reading
    # poisoned memory): it does not stop its stream, and it wrote nothing.
    to_caller = False

    def __init__(self, op, stream, seq: int, inline: bool, device: int = -1):
        self.op = op
        self.device = device
        self.stream = stream
        self.seq = seq
        self.pipeline = op.pipeline
        self.inline = inline
        self.priority = stream.priority
        self.deps_left = 0
        self.dependents: list[Ticket] = []
        self.edges: list[tuple[Ticket, str]] = []  # what it waited for, and why

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def succeeded(self) -> bool:
        """Done, neither failed nor skipped; safe to read without the lock (_complete sets the
        error, and _make_ready marks a skip, before done)."""
        return self.done and self.error is None and not self.skipped

    def __repr__(self) -> str:
        state = "done" if self.done else ("ready" if self.ready else "waiting")
        return f"Ticket(#{self.seq} {self.name!r} on stream {self.stream.id}, {state})"


def _drop(queue: collections.deque, t: Ticket) -> None:
    # Tickets finish in stream order, so this is almost always the oldest.
    if queue[0] is t:
        queue.popleft()
    else:
        queue.remove(t)


class _FailedSubmission:
    """Stands for the operations of a submission that could not be enqueued (see submit)."""

    pipeline = "control"
    footprint = NO_FOOTPRINT
    name = "a submitted launch that could not be enqueued"


_FAILED_SUBMISSION = _FailedSubmission()


class _Finished:
    """What remains of a finished operation: its name and footprint."""

    __slots__ = ("name", "footprint")

    def __init__(self, name: str, footprint):
        self.name = name
        self.footprint = footprint


class _Stream:
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


class _Pipeline:
    def __init__(self, name: str, lock: threading.Lock):
        self.name = name
        self.heap: list[tuple[int, int, Ticket]] = []
        self.cond = threading.Condition(lock)
        # Held while an operation executes on it. Re-entrant: a host callback
        # on the host worker may itself run inline work on the host pipeline.
        self.running = threading.RLock()
        self.thread: threading.Thread | None = None
        self.idle = False  # its worker waits for work (lock held to read or set)
        self.sim_free = 0.0
        self.sim_busy = 0.0


class DeviceQueue:
    def __init__(
        self,
        device: int,
        data_movement: DataMovement,
        stream_priority: Callable[[int], int] = lambda sid: 0,
        on_enqueued: Callable[[int, int], None] = lambda sid, seq: None,
        on_completed: Callable[[int, int], None] = lambda sid, seq: None,
        wait_timeout: float = 60.0,
        watch_allocations: Callable[[bool], None] = lambda on: None,
        take_allocations: Callable[[], list] = lambda: [],
    ):
        """`data_movement`: the device's engine that performs and prices this device's
        Transfers (operations.DataMovement). `watch_allocations(on)` asks the device to note
        each block its allocator hands out, `take_allocations()` returns the (region, offset,
        length) of those handed out since the last call: fresh blocks are not poisoned."""
        if not isinstance(data_movement, DataMovement):
            raise TypeError(f"spyre:{device}: data_movement must be a DataMovement engine, "
                            f"got {type(data_movement).__name__}")
        self.device = device
        self.data_movement = data_movement
        self.wait_timeout = wait_timeout
        self._stream_priority = stream_priority
        self._on_enqueued = on_enqueued
        self._on_completed = on_completed
        self._watch_allocations = watch_allocations
        self._take_allocations = take_allocations
        # Memory failed operations were to write, and signals fired behind a failure (with their
        # stream), until clear_error() (lock held).
        self._poison: list[_Poison] = []
        self._failed_signals: list[tuple[int, SoftSignal]] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pipelines = {name: _Pipeline(name, self.lock) for name in PIPELINES}
        self.streams: dict[int, _Stream] = {}
        # Streams with unfinished work, and streams whose finished work may still
        # order new work in simulated time: enqueueing looks at these only, so
        # its cost does not grow with every stream ever created.
        self._busy: dict[_Stream, None] = {}
        self._recent: dict[_Stream, None] = {}
        self.inflight: dict[int, Ticket] = {}
        self.unsignaled: set[Ticket] = set()
        self.recorders: list[list[Ticket]] = []
        # Sequence numbers, and the submissions (launches handed over without holding the
        # queue, see submit) that already own some of them; both under _submit_lock, a leaf.
        self._submit_lock = threading.Lock()
        self._next_seq = 1
        self._submitted: collections.deque = collections.deque()
        self._doorbell: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._doorbell_idle = True  # the submission worker waits for the doorbell
        self._submitter: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._closing = False  # set by shutdown(): workers finish their heaps and exit
        # Simulated time the host has observed (by synchronizing or waiting):
        # whatever it enqueues afterwards cannot start earlier.
        self.sim_floor = 0.0
        self._batch: dict[int, Ticket] | None = None  # the enqueue_runs call in progress (lock held)
        self._claim: list[Ticket] | None = None
        self._waiting = 0  # threads in _wait_for_change
        # Pipelines whose workers are woken once the enqueue_runs(run_ready=True) call in progress
        # is done: a worker woken at once would contend for the queue (and the GIL) with the
        # caller still running the launch's patch.
        self._wake_later: set | None = None

    # ---- enqueueing -------------------------------------------------------

    def enqueue(self, stream_id: int, op, inline: bool = False) -> Ticket:
        with self.lock:
            self._drain()
            ticket = self._enqueue_locked(stream_id, op, inline)
        self._on_enqueued(stream_id, ticket.seq)
        return ticket

    def enqueue_many(self, stream_id: int, ops) -> list[Ticket]:
        """Enqueue `ops` back to back on one stream, with nothing from another thread between
        them: a launch's steps (patch the correction area, hold the fetch, compute) are only
        correct as one unbroken run, since the next launch patches the same area."""
        return self.enqueue_runs(((stream_id, ops),))

    def enqueue_runs(self, runs, run_ready: bool = False) -> list[Ticket]:
        """Enqueue each (stream id, ops) run in turn, all under one hold of the queue: nothing
        another thread enqueues lands between them. A launch on two streams (preparation:
        patch the correction area; compute: hold the fetch, run) is correct only if no other
        launch of the same plan is enqueued between its patch and its fetch.

        With `run_ready`, the host callbacks and transfers among them that are ready now, or
        become ready as the earlier ones finish, run on this thread before it returns, holding
        the queue when their pipeline is idle: a launch's few-byte patch is cheaper to run than
        to hand to a worker thread and back. Those not ready by then go to the workers as usual.
        Such a callback must be short and must not call into the queue."""
        runs = [(sid, list(ops)) for sid, ops in runs]
        for _, ops in runs:
            for op in ops:
                self._check_operation(op)
        tickets: list[Ticket] = []
        claimed: list[Ticket] | None = [] if run_ready else None
        defers = False
        try:
            try:
                with self.lock:
                    # All the numbers at once: a launch handed over meanwhile (submit takes no
                    # lock) is enqueued before the first, not between two of them.
                    seq = self._take_seq(sum(len(ops) for _, ops in runs))
                    self._batch = {}
                    self._claim = claimed
                    defers = claimed is not None and self._wake_later is None
                    if defers:
                        self._wake_later = set()
                    try:
                        for sid, ops in runs:
                            for op in ops:
                                ticket = self._enqueue_locked(sid, op, False, checked=True, seq=seq)
                                seq += 1
                                self._batch[id(op)] = ticket
                                tickets.append(ticket)
                    finally:
                        self._batch = self._claim = None
            finally:  # what was enqueued is accounted for, even if a later one failed
                newest: dict[int, int] = {}
                for t in tickets:  # (the allocator keeps the newest per stream)
                    newest[t.stream.id] = t.seq
                for sid, seq in newest.items():
                    self._on_enqueued(sid, seq)
            if claimed is not None:
                self._run_claimed(claimed, tickets)
        finally:
            with self.lock:
                if claimed:  # not run (an error on the way): the workers run them
                    for t in claimed:
                        t.claimant = None
                        self._push(t)
                    claimed.clear()
                for t in tickets:
                    t.claimant = None
                if defers:
                    wake, self._wake_later = self._wake_later, None
                    self._wake(wake)
        return tickets

    def _run_claimed(self, claimed: list[Ticket], tickets: list[Ticket]) -> None:
        while True:
            with self.lock:
                if not claimed:
                    for t in tickets:  # the rest become ready later: the workers run them
                        t.claimant = None
                    return
                t = claimed.pop(0)
            pipe = self.pipelines[t.pipeline]
            if not pipe.running.acquire(blocking=False):  # busy with other work: not ours to wait for
                with self.lock:
                    t.claimant = None
                    self._push(t)
                continue
            try:
                self._run_on_pipeline(t)
            finally:
                pipe.running.release()

    # ---- submissions: handed over without holding the queue ------------------------------

    def submit(self, record, streams: tuple[int, ...]) -> None:
        """Hand over a launch without taking the queue, as a host rings a device's doorbell.

        `streams`: the stream of each operation the record will enqueue, in order. Their
        sequence numbers are taken now, in the order of every other enqueue, and the
        allocator is told now (a tensor freed after this returns stays allocated until the
        launch is done). The record is enqueued by the next thread that holds the queue (an
        enqueue, a wait, a synchronize) or else by this device's submission worker, which
        the doorbell wakes: `record.runs()` returns its ((stream id, ops), ...) as
        enqueue_runs(run_ready=True) takes them, and `record.enqueued(tickets)` hears which
        tickets they got. Both run holding the queue, so they must not call into it.
        `record.requires`, if it has one, maps an operation's index to the indices of earlier
        ones it holds for and fails with (as Barrier.requires). If runs() raises, the
        record's streams stop with that error."""
        newest: dict[int, int] = {}
        with self._submit_lock:
            first = self._next_seq
            self._next_seq = first + len(streams)
            for k, sid in enumerate(streams):
                newest[sid] = first + k
            for sid, seq in newest.items():
                self._on_enqueued(sid, seq)
            # What the host had observed when it handed the launch over: its operations start no
            # earlier, and no later for being enqueued after a later observation.
            self._submitted.append((record, streams, first, self.sim_floor))
        if self._doorbell_idle:
            self._ring()

    def _ring(self) -> None:
        self._doorbell_idle = False
        if self._submitter is None:
            self._start_submitter()
        self._doorbell.put(True)

    def _take_seq(self, n: int = 1) -> int:
        """The first of `n` consecutive sequence numbers, for operations enqueued now (lock
        held): submissions that own earlier numbers are enqueued first, so each stream's
        numbers grow in its order."""
        while True:
            with self._submit_lock:
                if not self._submitted:
                    seq = self._next_seq
                    self._next_seq = seq + n
                    return seq
            self._drain()

    def _drain(self) -> None:
        """Enqueue the submissions handed over so far, in order (lock held)."""
        wake = self._wake_later is None
        if wake:
            self._wake_later = set()
        try:
            while self._submitted:
                self._enqueue_submission()
        finally:
            if wake:
                pipes, self._wake_later = self._wake_later, None
                self._wake(pipes)

    def _enqueue_submission(self) -> None:
        """Enqueue the oldest submission (lock held; only drains take them, so it is there)."""
        tickets: list[Ticket] = []
        claimed: list[Ticket] = []
        outer = self._batch, self._claim  # an enqueue_runs call that found it handed over meanwhile
        record, streams, first, floor = self._submitted[0]
        try:
            with self._submit_lock:  # taken here: an interrupt before this leaves it to the next drain
                self._submitted.popleft()
            runs = record.runs()
            requires = getattr(record, "requires", None) or {}
            self._batch, self._claim = {}, claimed
            for sid, ops in runs:
                for op in ops:
                    if len(tickets) == len(streams) or sid != streams[len(tickets)]:
                        raise RuntimeError(f"spyre:{self.device}: a submission enqueued {getattr(op, 'name', op)!r} "
                                           f"on stream {sid}, not on the streams it declared {streams}")
                    self._check_operation(op)
                    k = len(tickets)
                    needs = tuple(tickets[j] for j in requires.get(k, ()))
                    ticket = self._enqueue_locked(sid, op, False, checked=True, seq=first + k, requires=needs,
                                                  floor=floor)
                    self._batch[id(op)] = ticket
                    tickets.append(ticket)
            if len(tickets) != len(streams):
                raise RuntimeError(f"spyre:{self.device}: a submission declared {len(streams)} operations "
                                   f"and enqueued {len(tickets)}")
        except BaseException as error:
            # The numbers it owns still complete (the allocator waits for them), failing: its
            # streams stop with the error, and what follows on them is skipped. An interrupt
            # (KeyboardInterrupt, SystemExit) also goes on to the thread it interrupted.
            for k in range(len(tickets), len(streams)):
                failed = Ticket(_FAILED_SUBMISSION, self._stream(streams[k]), first + k, False, self.device)
                failed.pending_error = error
                self._add_dependencies(failed, failed.stream)
                self._add_ticket(failed)
            if not isinstance(error, Exception):
                raise
        finally:
            self._batch, self._claim = outer
            for t in claimed:  # their pipeline was busy: its worker runs them
                t.claimant = None
                self._push(t)
            for t in tickets:
                t.claimant = None
        # Outside the guard: a failure here is a bug of the record's, raised to whoever drained
        # (a submission worker that dies of it is started again by the next submission).
        record.enqueued(tickets)

    def _start_submitter(self) -> None:
        with self._submit_lock:
            if self._submitter is None:
                thread = threading.Thread(target=self._submit_forever, name=f"spyre{self.device}-submit", daemon=True)
                thread.start()
                self._submitter = thread

    def _submit_forever(self) -> None:
        """Enqueue what is handed over. Once rung, the worker keeps looking every SUBMIT_POLL_S
        for launches handed over without a ring, until SUBMIT_POLL_ROUNDS looks found none:
        a launch then costs the host no thread wake-up (which costs a context switch, tens of
        microseconds on a loaded machine), and a launch no thread waits for is enqueued
        within SUBMIT_POLL_S all the same. If it fails, the next submission starts another."""
        try:
            while self._doorbell.get():
                quiet = 0
                while quiet < SUBMIT_POLL_ROUNDS:
                    if self._submitted:
                        with self.lock:
                            self._drain()
                        quiet = 0
                    else:
                        quiet += 1
                    try:
                        if not self._doorbell.get(timeout=SUBMIT_POLL_S):
                            return
                    except queue_module.Empty:
                        pass
                self._doorbell_idle = True
                if self._submitted and self._doorbell_idle:  # handed over meanwhile: no ring was left
                    self._doorbell_idle = False
                    self._doorbell.put(True)
        finally:
            with self._submit_lock:
                if self._submitter is threading.current_thread():
                    self._submitter = None
            self._doorbell_idle = True
            if self._submitted and not self._closing:
                self._ring()

    def _required(self, ticket: Ticket, deps: list) -> None:
        """A Barrier's `requires`: tickets of this enqueue_runs call it holds for and fails with."""
        found = []
        for op in ticket.op.requires:
            dep = self._batch.get(id(op)) if self._batch is not None else None
            if dep is None:
                raise ValueError(f"spyre:{self.device}: {ticket.name} requires {getattr(op, 'name', op)!r}, "
                                 f"which was not enqueued before it in the same enqueue_runs call")
            found.append(dep)
        self._require(ticket, found, deps)

    @staticmethod
    def _require(ticket: Ticket, found, deps: list) -> None:
        """`ticket` holds for the tickets `found` and fails (its stream stops) if one failed."""
        for dep in found:
            if dep.done:
                ticket.ready_sim = max(ticket.ready_sim, dep.sim_end)
            else:
                deps.append((dep, "requires"))
        ticket.requires = tuple(found)

    @staticmethod
    def _requirement_failed(t: Ticket) -> BaseException | None:
        for dep in t.requires:
            if dep.error is not None or dep.skipped:
                cause = dep.error if dep.error is not None else dep.pending_error
                error = StreamError(f"{t.name}: {dep.name} (#{dep.seq} on stream {dep.stream.id}) did not "
                                    f"complete ({type(cause).__name__}: {cause}); what depends on it is skipped")
                error.__cause__ = cause
                return error
        return None

    def _check_operation(self, op) -> None:
        if getattr(op, "pipeline", None) not in _KNOWN_PIPELINES:
            raise TypeError(f"spyre:{self.device}: cannot enqueue {type(op).__name__}; operations are "
                            f"HostCallback, Transfer, Compute, Signal, Wait or Barrier")

    def _enqueue_locked(self, stream_id: int, op, inline: bool, checked: bool = False,
                        seq: int | None = None, requires: tuple[Ticket, ...] = (),
                        floor: float | None = None) -> Ticket:
        if not checked:
            self._check_operation(op)
        stream = self._stream(stream_id)
        ticket = Ticket(op, stream, self._take_seq() if seq is None else seq, inline, self.device)
        if self._claim is not None and ticket.pipeline in _CLAIMABLE:
            ticket.claimant = self._claim
        previous = stream.last
        self._add_dependencies(ticket, stream, requires, floor)
        if type(op) is Compute:
            # The executor may read ahead of execution (prefetch), unless a
            # Barrier ahead of it on the stream holds it back until it is done.
            if op.hold_fetch or (previous is not None and not previous.done and type(previous.op) is Barrier):
                ticket.prefetch_on_ready = True
            else:
                self._prefetch(ticket)
        self._add_ticket(ticket)
        return ticket

    def _add_ticket(self, ticket: Ticket) -> None:
        stream = ticket.stream
        stream.last = ticket
        if not stream.pending:
            self._busy[stream] = None
        stream.pending.append(ticket)
        if ticket.op.footprint.writes:
            stream.writers.append(ticket)
        self.inflight[ticket.seq] = ticket
        if ticket.deps_left == 0:
            if ticket.inline and stream.error is None and ticket.pipeline != "control" and \
                    ticket.pending_error is None and not self._poison:
                ticket.ready = True  # nobody waits for it yet: no need to notify
            else:
                self._make_ready([ticket])

    def _add_dependencies(self, ticket: Ticket, stream: _Stream, requires: tuple[Ticket, ...] = (),
                          floor: float | None = None) -> None:
        op = ticket.op
        deps: list[tuple[Ticket, str]] = []
        if stream.last is not None:
            if stream.last.done:
                ticket.ready_sim = stream.last.sim_end
            else:
                deps.append((stream.last, "stream"))
        ticket.ready_sim = max(ticket.ready_sim, self.sim_floor if floor is None else floor)
        footprint = op.footprint
        others = [s for s in self._busy if s is not stream] if self._busy else ()
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
            self._require(ticket, requires, deps)
        elif type(op) is Barrier and op.requires:
            self._required(ticket, deps)
        if isinstance(op, Barrier) and footprint.empty:
            # A device-wide barrier: everything enqueued before it, on any stream.
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

    def _follow_finished(self, ticket: Ticket, stream: _Stream, footprint) -> None:
        """Simulated time also follows conflicting work that already finished.

        In host time it is done, but on the simulated timeline the new
        operation must not start before it ends. Looks back RECENT finished
        operations per stream (newest first: a stream's ends only grow).
        A stream whose newest finished operation ends before what the host has
        observed (sim_floor) can order nothing new, and is dropped from the
        streams looked at until it finishes more work.
        """
        stale = []
        for other in self._recent:
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
            del self._recent[other]

    def _add_wait(self, ticket: Ticket, signal: SoftSignal, deps: list) -> None:
        with signals.lock:
            if signal.fired:
                ticket.ready_sim = max(ticket.ready_sim, signal.fired_ns)
                ticket.edges.append((signal.ticket, "event"))
                return
            if signal.owner is self:
                deps.append((signal.ticket, "event"))
                return
            # Not enqueued yet (it may still come, from any stream of any device), or
            # enqueued on another device: count it as a dependency now; its owner hands
            # this ticket back to us when it fires (signal_fired).
            ticket.deps_left += 1
            signal.waiters.append((self, ticket))
            if signal.ticket is not None:
                return
        ticket.deadline = time.monotonic() + self.wait_timeout
        self.unsignaled.add(ticket)
        self._start_watchdog()

    def _attach_signal(self, ticket: Ticket, signal: SoftSignal) -> None:
        with signals.lock:
            if signal.ticket is not None:
                raise ValueError(f"{signal!r} is single-use and was already enqueued")
            signal.ticket = ticket
            signal.owner = self
            mine = [w for q, w in signal.waiters if q is self]
            signal.waiters = [(q, w) for q, w in signal.waiters if q is not self]
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
        failure = _root(t.pending_error) if t.skipped else None
        if failure is not None:
            self._failed_signals.append((t.stream.id, signal))
        with signals.lock:
            signal.failure = failure
            signal.fired_ns = t.sim_end
            remote, signal.waiters = signal.waiters, []
        for q, waiter in remote:
            _deliver(q, waiter, t)

    def signal_fired(self, waiter: Ticket, source: Ticket) -> None:
        """Another device's signal that `waiter` (a Wait of this queue) waited for has fired."""
        with self.lock:
            self.unsignaled.discard(waiter)
            waiter.deadline = None
            waiter.ready_sim = max(waiter.ready_sim, source.sim_end)
            waiter.edges.append((source, "event"))
            waiter.deps_left -= 1
            if waiter.deps_left == 0:
                self._make_ready([waiter])

    def _stream(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = self.streams[stream_id] = _Stream(stream_id, self._stream_priority(stream_id))
        return stream

    # ---- readiness and completion (lock held) -----------------------------

    def _make_ready(self, tickets: list[Ticket]) -> None:
        work = list(tickets)
        while work:
            t = work.pop()
            stream = t.stream
            if t.pending_error is None and stream.error is not None and t.seq > stream.error_seq:
                t.skipped = True
                t.pending_error = stream.error  # why it was skipped, even after clear_error()
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self._complete(t, None))
            elif t.requires and t.pending_error is None and (failed := self._requirement_failed(t)) is not None:
                t.pending_error = failed
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self._complete(t, failed))
            elif (self._poison or type(t.op) is Wait) and t.pending_error is None and \
                    (failed := self._reads_failed_work(t)) is not None:
                t.pending_error = failed
                t.to_caller = t.inline and t.pipeline != "control"
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self._complete(t, failed))
            elif t.pipeline == "control" or t.pending_error is not None or \
                    (t.prefetch_on_ready and not self._prefetch(t)):
                t.sim_start = t.sim_end = t.ready_sim
                work.extend(self._complete(t, t.pending_error))
            elif t.inline:
                t.ready = True
                self._notify_waiters()
            elif t.claimant is not None:
                t.ready = True
                pipe = self.pipelines[t.pipeline]
                if pipe.running.acquire(blocking=False):
                    # Run it here, holding the queue: what run_ready hands over is a few bytes'
                    # work (a launch's patch) that calls nothing of the queue, and its completion
                    # readies the next one in this same loop, with no lock let go and taken again.
                    try:
                        cost, error = self._execute(t)
                    finally:
                        pipe.running.release()
                    t.sim_start = max(t.ready_sim, pipe.sim_free)
                    t.sim_end = t.sim_start + cost
                    pipe.sim_free = max(pipe.sim_free, t.sim_end)
                    pipe.sim_busy += cost
                    work.extend(self._complete(t, error))
                else:  # its pipeline is busy with other work: run by the caller once the queue is let go
                    t.claimant.append(t)
            else:
                t.ready = True
                self._push(t)

    def _notify_waiters(self) -> None:
        if self._waiting:
            self.changed.notify_all()

    def _push(self, t: Ticket) -> None:
        """Hand a ready ticket to its pipeline's worker (or to the thread waiting for it)."""
        pipe = self.pipelines[t.pipeline]
        key = t.priority if t.pipeline == "compute" else 0
        heapq.heappush(pipe.heap, (key, t.seq, t))
        if self._wake_later is not None:
            self._wake_later.add(pipe)
        elif pipe.thread is None:
            if not self._helper_runs(pipe, (t,)):
                self._start_worker(pipe)
        elif pipe.idle and not self._helper_runs(pipe, (t,)):
            pipe.cond.notify()

    def _wake(self, pipes) -> None:
        """Wake the workers of `pipes` that have work (lock held)."""
        for pipe in pipes:
            if pipe.heap and not self._helper_runs(pipe, [t for _, _, t in pipe.heap]):
                if pipe.thread is None:
                    self._start_worker(pipe)
                elif pipe.idle:
                    pipe.cond.notify()

    def _helper_runs(self, pipe: _Pipeline, tickets) -> bool:
        """True if this thread waits for every one of `tickets` and will run them itself
        (_help_or_wait): waking the worker would only make it contend for the GIL and the queue."""
        helping = getattr(_local, "helping", None)
        return (helping is not None and helping[0] is self and pipe.name in self._STEALABLE
                and all(helping[1](t) for t in tickets))

    @staticmethod
    def _prefetch(t: Ticket) -> bool:
        """The Compute's prefetch; if it raises, the operation fails with that error (on its
        stream, like a failing run) instead of the enqueuer or a worker. True if it did not."""
        t.prefetch_on_ready = False
        try:
            t.op.executor.prefetch(t.op.bindings)
        except BaseException as e:  # noqa: BLE001 - reported through the stream
            t.pending_error = e
            return False
        return True

    def _complete(self, t: Ticket, error: BaseException | None) -> list[Ticket]:
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
            del self._busy[stream]
        kind = type(op)
        if kind is Signal:
            self._fire(t)
        footprint = op.footprint
        if stream.writers and footprint.writes:
            _drop(stream.writers, t)
        raises_to_caller = kind is HostCallback and op.raise_to_caller
        if error is not None and stream.error is None and not (raises_to_caller or t.to_caller):
            stream.error = _stream_error(f"spyre:{self.device} stream {stream.id}: operation #{t.seq} ({t.name}) "
                                         f"failed: {type(error).__name__}: {error}", error)
            stream.error_seq = t.seq
        if footprint.writes:
            # What an inline operation was to write keeps what it held: its caller is told at once.
            if (error is not None or t.skipped) and not (raises_to_caller or t.inline):
                # Never written: nothing may read it as if it had been.
                if error is None:  # skipped: why, the failure that stopped its stream
                    root = _root(t.pending_error)
                else:  # its own failure, as its stream's error names it, unless it only followed from another
                    root = getattr(error, "root", None) or (stream.error if stream.error_seq == t.seq else error)
                self._add_poison(footprint.writes, t, root)
            elif self._poison and kind is Transfer and error is None and not t.skipped:
                self._drop_poison(footprint.writes)  # a transfer that ran wrote every byte of its destination
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
        t.op = _Finished(op.name, footprint)
        if t.requires:
            t.requires = ()
        if not footprint.empty and not t.skipped:
            stream.recent.append(t)
            self._recent[stream] = None
        if self.recorders:
            for rec in self.recorders:
                rec.append(t)
        elif t.edges:
            t.edges = []
        if self._waiting:
            self.changed.notify_all()
        self._on_completed(stream.id, t.seq)
        return ready

    def _finish(self, t: Ticket, cost_ns: float, error: BaseException | None) -> None:
        with self.lock:
            pipe = self.pipelines[t.pipeline]
            # Its start could have been set before it ran: its dependencies were done and its
            # pipeline (held by the caller) ran nothing else meanwhile.
            t.sim_start = max(t.ready_sim, pipe.sim_free)
            t.sim_end = t.sim_start + cost_ns
            pipe.sim_free = max(pipe.sim_free, t.sim_end)
            pipe.sim_busy += cost_ns
            self._make_ready(self._complete(t, error))

    # ---- execution ----------------------------------------------------------

    def _start_worker(self, pipe: _Pipeline) -> None:
        if pipe.thread is None:
            pipe.thread = threading.Thread(
                target=self._work, args=(pipe,), name=f"spyre{self.device}-{pipe.name}", daemon=True
            )
            pipe.thread.start()

    def _work(self, pipe: _Pipeline) -> None:
        while True:
            with self.lock:
                while not pipe.heap and not self._closing:
                    pipe.idle = True
                    pipe.cond.wait()
                    pipe.idle = False
                if self._closing and not pipe.heap:
                    return
                _, _, t = heapq.heappop(pipe.heap)
            self._run_on_pipeline(t)

    def shutdown(self, timeout: float) -> bool:
        """Finish the enqueued work (up to `timeout` s) and stop the workers: at interpreter
        exit, a worker still running a torch op while Python and torch tear down aborts the
        process. Errors are not raised (nobody is left to see them). True if all finished."""
        deadline = time.monotonic() + timeout
        with self.lock:
            self._drain()
            for t in list(self.inflight.values()):
                while not t.done and time.monotonic() < deadline:
                    self._wait_for_change(max(0.0, deadline - time.monotonic()))
            finished = all(t.done for t in self.inflight.values())
            if not finished:
                return False  # something waits on a signal that never comes: leave the daemons be
            self._closing = True
            for pipe in self.pipelines.values():
                pipe.cond.notify_all()
            self._doorbell.put(False)
        threads = [pipe.thread for pipe in self.pipelines.values()] + [self._submitter]
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return True

    def _run_on_pipeline(self, t: Ticket) -> None:
        """Execute `t` holding its pipeline, so a pipeline runs one operation at a
        time whether its worker or an inline caller executes it."""
        with self.pipelines[t.pipeline].running:
            cost, error = self._execute(t)
            self._finish(t, cost, error)

    def _execute(self, t: Ticket) -> tuple[float, BaseException | None]:
        op = t.op
        t.host_start = time.perf_counter_ns()
        try:
            if isinstance(op, Transfer):
                self.data_movement.run(op)
                cost = float(self.data_movement.cost_ns(op))
            elif isinstance(op, Compute):
                op.executor.run(op.bindings)
                cost = float(op.executor.cost_ns(op.bindings))
            else:  # HostCallback: it holds the stream for as long as it takes, unless priced
                t.result = op.fn()
                cost = op.cost_ns
            error = None
        except BaseException as e:  # noqa: BLE001 - reported through the stream
            cost, error = None, e
        t.host_end = time.perf_counter_ns()
        if cost is None:
            cost = float(t.host_end - t.host_start)
        return cost, error

    def run_inline(self, stream_id: int, op):
        """Enqueue `op`, run it on this thread once ready, return its result or raise."""
        if in_host_operation():
            # Already inside an inline operation of this thread: stream order
            # is already established; run directly.
            return op.fn() if isinstance(op, HostCallback) else self._execute_direct(op)
        with self.lock:
            self._drain()
            t = self._enqueue_locked(stream_id, op, True)
        self._on_enqueued(stream_id, t.seq)
        with self.lock:
            while not (t.ready or t.done):
                self._wait_for_change()
        if not t.done:  # control operations complete as soon as they are ready
            _local.depth = getattr(_local, "depth", 0) + 1
            try:
                self._run_on_pipeline(t)
            finally:
                _local.depth -= 1
        self._observe(t.sim_end)
        return self._outcome(t, keep=False)

    def _observe(self, sim_time: float) -> None:
        with self.lock:
            self.sim_floor = max(self.sim_floor, sim_time)

    def _execute_direct(self, op):
        if type(op) is Compute:
            op.executor.prefetch(op.bindings)  # nothing can come between: it runs now
        probe = Ticket(op, _Stream(-1, 0), 0, True, self.device)
        _, error = self._execute(probe)
        if error is not None:
            raise error
        return probe.result

    def _outcome(self, t: Ticket, keep: bool = True):
        if t.error is not None:
            raise t.error
        if t.skipped:
            raise t.pending_error
        result = t.result
        if not keep:
            t.result = None
        return result

    def wait(self, t: Ticket, outcome: bool = True):
        """Block until `t` is done; return its result or raise its error (with `outcome` False:
        only block; an event asks its signal how the work it covers went instead)."""
        if in_host_operation() and not t.done:
            raise RuntimeError(f"spyre: waiting for {t!r} from inside a host operation would deadlock")
        with self.lock, _helping(self, lambda ready: ready is t):
            self._drain()
            while not t.done:
                self._help_or_wait(_local.helping[1])
            self.sim_floor = max(self.sim_floor, t.sim_end)
        return self._outcome(t) if outcome else None

    # A thread that waits for the device runs ready device work itself instead of sleeping
    # until a worker has run it: a launch followed by a synchronize then runs on the caller's
    # thread, with no handoff to a worker and back. Only computes and transfers are taken
    # (a host callback may wait for something this thread is yet to do), only from an idle
    # pipeline, and the simulated timeline is the same whoever runs them.
    _STEALABLE = ("compute", "h2d", "d2h", "d2d")

    def _help_or_wait(self, wanted) -> None:
        """With the lock held: run one ready operation `wanted(ticket)` accepts, or wait for a change."""
        for name in self._STEALABLE:
            pipe = self.pipelines[name]
            if pipe.heap and wanted(pipe.heap[0][2]) and pipe.running.acquire(blocking=False):
                _, _, t = heapq.heappop(pipe.heap)
                self.lock.release()
                try:
                    self._run_on_pipeline(t)
                finally:
                    pipe.running.release()
                    self.lock.acquire()
                return
        self._wait_for_change()

    def _wait_for_change(self, timeout: float | None = None) -> None:
        """changed.wait(), counted: a completion notifies only when someone waits (lock held)."""
        self._waiting += 1
        try:
            self.changed.wait(timeout)
        finally:
            self._waiting -= 1

    # ---- streams ---------------------------------------------------------------

    def query_stream(self, stream_id: int) -> bool:
        with self.lock:
            self._drain()
            stream = self._stream(stream_id)
            if stream.error is not None:
                raise stream.error
            return stream.last is None or stream.last.done

    def synchronize_stream(self, stream_id: int) -> None:
        if in_host_operation():
            return
        stream = None
        with self.lock, _helping(self, lambda ready: ready.stream is stream):
            stream = self._stream(stream_id)
            self._drain()
            target = stream.last
            while target is not None and not target.done:
                self._help_or_wait(_local.helping[1])
            if target is not None:
                self.sim_floor = max(self.sim_floor, target.sim_end)
            if stream.error is not None:
                raise stream.error

    def synchronize(self) -> None:
        if in_host_operation():
            return
        last = None  # everything enqueued so far, once the handed-over launches are enqueued too
        with self.lock, _helping(self, lambda ready: last is None or ready.seq <= last):
            self._drain()
            targets = list(self.inflight.values())
            last = max((t.seq for t in targets), default=0)
            for t in targets:
                while not t.done:
                    self._help_or_wait(_local.helping[1])
            self.sim_floor = max([self.sim_floor] + [p.sim_free for p in self.pipelines.values()])
            for stream in self.streams.values():
                if stream.error is not None:
                    raise stream.error

    def clear_error(self, stream_id: int | None = None) -> None:
        """Forget the failures of one stream (or of all): its sticky error, the failed mark of
        the signals it fired behind the failure (an event then reports done and synchronizes
        without raising), and the poison on what its failed operations were to write (those
        bytes then hold whatever they held; write them before reading them)."""
        with self.lock:
            self._drain()
            for stream in self.streams.values():
                if stream_id is None or stream.id == stream_id:
                    stream.error = None
            mine = lambda sid: stream_id is None or sid == stream_id  # noqa: E731
            with signals.lock:
                for sid, signal in self._failed_signals:
                    if mine(sid):
                        signal.failure = None
            self._failed_signals = [(sid, sig) for sid, sig in self._failed_signals if not mine(sid)]
            self._set_poison([p for p in self._poison if not mine(p.stream)])

    # ---- poison: what failed operations were to write (lock held) ---------------------------

    def _add_poison(self, writes, t: Ticket, root: BaseException) -> None:
        # Blocks handed out before now are older than this poison: they clear only what was there.
        if self._poison:
            fresh = self._take_allocations()
            if fresh:
                self._drop_poison([Range(*block) for block in fresh])
        if not self._poison:
            self._watch_allocations(True)  # before any block can be handed out over it unseen
            self._take_allocations()
        writer = f"operation #{t.seq} ({t.name}) on stream {t.stream.id}"
        self._poison.extend(_Poison(r, writer, t.stream.id, root) for r in writes)

    def _drop_poison(self, ranges) -> None:
        """The bytes of `ranges` are written anew (or handed out anew): no longer poisoned."""
        kept = []
        for p in self._poison:
            pieces = [p.range]
            for cut in ranges:
                pieces = [rest for piece in pieces for rest in _minus(piece, cut)]
            kept.extend(p._replace(range=piece) for piece in pieces)
        self._set_poison(kept)

    def _set_poison(self, poison: list[_Poison]) -> None:
        had = bool(self._poison)
        self._poison = poison
        if had and not poison:
            self._watch_allocations(False)

    def _reads_failed_work(self, t: Ticket) -> BaseException | None:
        """Why `t` must not run (a Wait on a signal that fired behind a failure, or an operation
        reading poisoned memory), or None."""
        op = t.op
        if type(op) is Wait:
            failure = op.signal.failure
            if failure is None:
                return None
            error = _stream_error(f"{t.name} on stream {t.stream.id} waited for an event recorded behind a "
                                  f"failure, so what follows it would read what never ran: {failure}", failure)
            error.root = failure
            return error
        if t.pipeline == "control" or not op.footprint.reads:
            return None
        fresh = self._take_allocations()
        if fresh:
            self._drop_poison([Range(*block) for block in fresh])
        for r in op.footprint.reads:
            for p in self._poison:
                if r.overlaps(p.range):
                    error = _stream_error(
                        f"{t.name} (#{t.seq} on stream {t.stream.id}) reads device memory (region {r.region}, "
                        f"bytes {max(r.offset, p.range.offset)}..) that {p.writer} was to write and never wrote: "
                        f"{p.root}", p.root)
                    error.root = p.root
                    return error
        return None

    # ---- waits whose signal never comes -------------------------------------

    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"spyre{self.device}-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                expired = [t for t in self.unsignaled if t.deadline is not None and t.deadline <= now]
                ready = []
                for t in expired:
                    self.unsignaled.discard(t)
                    signal = t.op.signal
                    with signals.lock:
                        enqueued = signal.ticket is not None
                        if not enqueued:
                            signal.waiters.remove((self, t))
                    if enqueued:  # on another device, meanwhile: its firing releases t
                        t.deadline = None
                        continue
                    t.pending_error = WaitTimeout(
                        f"spyre:{self.device} stream {t.stream.id}: {t.name} waited "
                        f"{self.wait_timeout:g} s for a signal that was never enqueued"
                    )
                    t.deps_left -= 1
                    if t.deps_left == 0:
                        ready.append(t)
                self._make_ready(ready)
                deadlines = [t.deadline for t in self.unsignaled if t.deadline is not None]
                self._wait_for_change(max(0.01, min(deadlines) - now) if deadlines else 1.0)

    # ---- introspection -----------------------------------------------------------

    def sim_busy_ns(self) -> dict[str, float]:
        with self.lock:
            self._drain()
            return {name: p.sim_busy for name, p in self.pipelines.items()}


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


# ---- handing waiters back to their own device ---------------------------------------------

_deliveries: queue_module.SimpleQueue = queue_module.SimpleQueue()
_delivery_thread: threading.Thread | None = None
_delivery_start = threading.Lock()


def _deliver(q: DeviceQueue, waiter: Ticket, source: Ticket) -> None:
    """Tell `q` (outside the firing queue's lock: two devices may wait on each other) that
    the signal `waiter` waited for has fired."""
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
