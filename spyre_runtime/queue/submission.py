"""Submission: sequence numbers, and launches handed over without taking the queue.

Every operation owns a sequence number, taken in the order of every enqueue,
so each stream's numbers grow in its order (the allocator keeps a freed
block until its streams have completed the numbers it was used under).

Launches are handed over without taking the queue (submit), as a host rings
a device's doorbell: they own their sequence numbers from then on, and are
enqueued in order by the next thread that holds the queue for anything, or
else by the queue's submission worker, which the doorbell wakes.

enqueue_runs enqueues several streams' runs under one hold of the queue, and
with run_ready runs the host callbacks and transfers among them that are
ready at once on the calling thread (a launch's few-byte patch is cheaper to
run than to hand to a worker and back).
"""

from __future__ import annotations

import collections
import queue as queue_module
import threading
from typing import Callable

from . import stream_graph
from .stream_graph import StreamGraph
from .tickets import FAILED_SUBMISSION, Ticket
from .workers import Workers

# How often the submission worker looks for launches handed over while it is awake, and for
# how many empty looks it stays awake (see Submission._submit_forever).
SUBMIT_POLL_S = 0.001
SUBMIT_POLL_ROUNDS = 20
_CLAIMABLE = frozenset(("host", "h2d", "d2h", "d2d"))  # what enqueue_runs(run_ready=True) may run itself


class Submission:
    """One device's sequence numbers, its handed-over launches and its submission worker.

    `lock` is the queue's; sequence numbers and the handed-over launches are under
    `_submit_lock`, a leaf, so a launch is handed over without the queue's."""

    def __init__(self, device: int, lock: threading.Lock, graph: StreamGraph, workers: Workers,
                 on_enqueued: Callable[[int, int], None]):
        self.device = device
        self.lock = lock
        self.graph = graph
        self.workers = workers
        self._on_enqueued = on_enqueued
        self._submit_lock = threading.Lock()
        self._next_seq = 1
        self.submitted: collections.deque = collections.deque()
        self._doorbell: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._doorbell_idle = True  # the submission worker waits for the doorbell
        self.submitter: threading.Thread | None = None
        self._batch: dict[int, Ticket] | None = None  # the enqueue_runs call in progress (lock held)
        self._claim: list[Ticket] | None = None

    # ---- enqueueing (lock held) ------------------------------------------------------

    def enqueue_locked(self, stream_id: int, op, inline: bool, checked: bool = False,
                       seq: int | None = None, requires: tuple[Ticket, ...] = (),
                       floor: float | None = None) -> Ticket:
        if not checked:
            self.graph.check_operation(op)
        claim = self._claim
        return self.graph.add(stream_id, op, self.take_seq() if seq is None else seq, inline,
                              requires=requires, floor=floor, batch=self._batch,
                              claimant=claim if claim is not None and op.pipeline in _CLAIMABLE else None)

    def take_seq(self, n: int = 1) -> int:
        """The first of `n` consecutive sequence numbers, for operations enqueued now (lock
        held): submissions that own earlier numbers are enqueued first, so each stream's
        numbers grow in its order."""
        while True:
            with self._submit_lock:
                if not self.submitted:
                    seq = self._next_seq
                    self._next_seq = seq + n
                    return seq
            self.drain()

    def enqueue_runs(self, runs, run_ready: bool = False) -> list[Ticket]:
        """DeviceQueue.enqueue_runs (the queue's lock not held)."""
        runs = [(sid, list(ops)) for sid, ops in runs]
        for _, ops in runs:
            for op in ops:
                self.graph.check_operation(op)
        workers = self.workers
        tickets: list[Ticket] = []
        claimed: list[Ticket] | None = [] if run_ready else None
        defers = False
        try:
            try:
                with self.lock:
                    # All the numbers at once: a launch handed over meanwhile (submit takes no
                    # lock) is enqueued before the first, not between two of them.
                    seq = self.take_seq(sum(len(ops) for _, ops in runs))
                    self._batch = {}
                    self._claim = claimed
                    defers = claimed is not None and workers.wake_later is None
                    if defers:
                        workers.wake_later = set()
                    try:
                        for sid, ops in runs:
                            for op in ops:
                                ticket = self.enqueue_locked(sid, op, False, checked=True, seq=seq)
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
                        workers.push(t)
                    claimed.clear()
                for t in tickets:
                    t.claimant = None
                if defers:
                    wake, workers.wake_later = workers.wake_later, None
                    workers.wake(wake)
        return tickets

    def _run_claimed(self, claimed: list[Ticket], tickets: list[Ticket]) -> None:
        while True:
            with self.lock:
                if not claimed:
                    for t in tickets:  # the rest become ready later: the workers run them
                        t.claimant = None
                    return
                t = claimed.pop(0)
            pipe = self.workers.pipelines[t.pipeline]
            if not pipe.running.acquire(blocking=False):  # busy with other work: not ours to wait for
                with self.lock:
                    t.claimant = None
                    self.workers.push(t)
                continue
            try:
                self.workers.run_on_pipeline(t)
            finally:
                pipe.running.release()

    # ---- submissions: handed over without holding the queue ------------------------------

    def submit(self, record, streams: tuple[int, ...]) -> None:
        """DeviceQueue.submit."""
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
            # (and, while torch.profiler records, the CPU op handing it over: the thread that
            # enqueues it later may be another's, in another op)
            source = stream_graph.correlation_source
            self.submitted.append((record, streams, first, self.graph.sim_floor, source() if source else 0))
        if self._doorbell_idle:
            self._ring()

    def _ring(self) -> None:
        self._doorbell_idle = False
        if self.submitter is None:
            self._start_submitter()
        self._doorbell.put(True)

    def drain(self) -> None:
        """Enqueue the submissions handed over so far, in order (lock held)."""
        workers = self.workers
        wake = workers.wake_later is None
        if wake:
            workers.wake_later = set()
        try:
            while self.submitted:
                self._enqueue_submission()
        finally:
            if wake:
                pipes, workers.wake_later = workers.wake_later, None
                workers.wake(pipes)

    def _enqueue_submission(self) -> None:
        """Enqueue the oldest submission (lock held; only drains take them, so it is there)."""
        tickets: list[Ticket] = []
        claimed: list[Ticket] = []
        outer = self._batch, self._claim  # an enqueue_runs call that found it handed over meanwhile
        record, streams, first, floor, correlation = self.submitted[0]
        try:
            with self._submit_lock:  # taken here: an interrupt before this leaves it to the next drain
                self.submitted.popleft()
            runs = record.runs()
            requires = getattr(record, "requires", None) or {}
            self._batch, self._claim = {}, claimed
            for sid, ops in runs:
                for op in ops:
                    if len(tickets) == len(streams) or sid != streams[len(tickets)]:
                        raise RuntimeError(f"spyre:{self.device}: a submission enqueued {getattr(op, 'name', op)!r} "
                                           f"on stream {sid}, not on the streams it declared {streams}")
                    self.graph.check_operation(op)
                    k = len(tickets)
                    needs = tuple(tickets[j] for j in requires.get(k, ()))
                    ticket = self.enqueue_locked(sid, op, False, checked=True, seq=first + k, requires=needs,
                                                 floor=floor)
                    self._batch[id(op)] = ticket
                    if correlation:
                        ticket.correlation = correlation
                    tickets.append(ticket)
            if len(tickets) != len(streams):
                raise RuntimeError(f"spyre:{self.device}: a submission declared {len(streams)} operations "
                                   f"and enqueued {len(tickets)}")
        except BaseException as error:
            # The numbers it owns still complete (the allocator waits for them), failing: its
            # streams stop with the error, and what follows on them is skipped. An interrupt
            # (KeyboardInterrupt, SystemExit) also goes on to the thread it interrupted.
            for k in range(len(tickets), len(streams)):
                self.graph.add(streams[k], FAILED_SUBMISSION, first + k, pending_error=error)
            if not isinstance(error, Exception):
                raise
        finally:
            self._batch, self._claim = outer
            for t in claimed:  # their pipeline was busy: its worker runs them
                t.claimant = None
                self.workers.push(t)
            for t in tickets:
                t.claimant = None
        # Outside the guard: a failure here is a bug of the record's, raised to whoever drained
        # (a submission worker that dies of it is started again by the next submission).
        record.enqueued(tickets)

    def _start_submitter(self) -> None:
        with self._submit_lock:
            if self.submitter is None:
                thread = threading.Thread(target=self._submit_forever, name=f"spyre{self.device}-submit", daemon=True)
                thread.start()
                self.submitter = thread

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
                    if self.submitted:
                        with self.lock:
                            self.drain()
                        quiet = 0
                    else:
                        quiet += 1
                    try:
                        if not self._doorbell.get(timeout=SUBMIT_POLL_S):
                            return
                    except queue_module.Empty:
                        pass
                self._doorbell_idle = True
                if self.submitted and self._doorbell_idle:  # handed over meanwhile: no ring was left
                    self._doorbell_idle = False
                    self._doorbell.put(True)
        finally:
            with self._submit_lock:
                if self.submitter is threading.current_thread():
                    self.submitter = None
            self._doorbell_idle = True
            if self.submitted and not self.workers.closing:
                self._ring()

    def stop(self) -> None:
        """Let the submission worker exit."""
        self._doorbell.put(False)
