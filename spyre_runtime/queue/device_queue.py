"""One device's queue: the facade over its stream graph, its submission and its workers.

An operation enqueued on a stream is numbered (submission.py), linked to what
it must wait for (stream_graph.py: stream order, footprint conflicts across
streams, signals and waits, barriers, failed work), and run once ready on its
pipeline (workers.py). A Wait may name a signal of another device's queue: the
signal's owner hands the waiter back here when it fires (delivery.py).

A failing operation makes its stream's error sticky: later operations of that
stream are skipped and the next query/synchronize raises, naming it, until
clear_error(). Other streams keep working, but nothing of any stream reads
what failed work was to write (poison.py). An inline operation (a host read:
item(), a blocking copy, the CPU fallback) refused for that raises to its
caller instead: the caller is told at once and nothing was written.

Every method takes the queue's `lock` (the graph, the pipelines' heaps and the
handed-over launches' enqueueing are all under it) and enqueues the launches
handed over so far first, so each stream's operations go in in their order.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .delivery import deliver
from .operations import DataMovement, HostCallback
from .poison import Poison
from .stream_graph import StreamGraph
from .submission import Submission
from .tickets import Ticket
from .workers import Workers, in_host_operation


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
        self._on_enqueued = on_enqueued
        self.lock = threading.Lock()
        self.graph = StreamGraph(device, owner=self, wait_timeout=wait_timeout, stream_priority=stream_priority,
                                 poison=Poison(watch_allocations, take_allocations), on_completed=on_completed,
                                 deliver=deliver)
        self.workers = Workers(device, self.lock, self.graph, data_movement)
        self.submission = Submission(device, self.lock, self.graph, self.workers, on_enqueued)
        self.graph.dispatch = self.workers.dispatch
        self.graph.notify = self.workers.notify_waiters
        self.graph.on_unsignaled = self.workers.start_watchdog
        self._drain = self.submission.drain
        self.changed = self.workers.changed
        self.pipelines = self.workers.pipelines
        self.streams = self.graph.streams
        self.inflight = self.graph.inflight
        self.unsignaled = self.graph.unsignaled
        self.recorders = self.graph.recorders

    # ---- enqueueing -------------------------------------------------------

    def enqueue(self, stream_id: int, op, inline: bool = False) -> Ticket:
        with self.lock:
            self._drain()
            ticket = self.submission.enqueue_locked(stream_id, op, inline)
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
        return self.submission.enqueue_runs(runs, run_ready)

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
        self.submission.submit(record, streams)

    def signal_fired(self, waiter: Ticket, source: Ticket) -> None:
        """Another device's signal that `waiter` (a Wait of this queue) waited for has fired."""
        with self.lock:
            self.graph.signal_fired(waiter, source)

    # ---- running and waiting -------------------------------------------------

    def run_inline(self, stream_id: int, op):
        """Enqueue `op`, run it on this thread once ready, return its result or raise."""
        if in_host_operation():
            # Already inside an inline operation of this thread: stream order
            # is already established; run directly.
            return op.fn() if isinstance(op, HostCallback) else self.workers.execute_direct(op)
        with self.lock:
            self._drain()
            t = self.submission.enqueue_locked(stream_id, op, True)
        self._on_enqueued(stream_id, t.seq)
        with self.lock:
            while not (t.ready or t.done):
                self.workers.wait_for_change()
        if not t.done:  # control operations complete as soon as they are ready
            self.workers.run_inline(t)
        self._observe(t.sim_end)
        return _outcome(t, keep=False)

    def _observe(self, sim_time: float) -> None:
        with self.lock:
            self.graph.sim_floor = max(self.graph.sim_floor, sim_time)

    def wait(self, t: Ticket, outcome: bool = True):
        """Block until `t` is done; return its result or raise its error (with `outcome` False:
        only block; an event asks its signal how the work it covers went instead)."""
        if in_host_operation() and not t.done:
            raise RuntimeError(f"spyre: waiting for {t!r} from inside a host operation would deadlock")
        wants = lambda ready: ready is t  # noqa: E731
        with self.lock, self.workers.helping(wants):
            self._drain()
            while not t.done:
                self.workers.help_or_wait(wants)
            self.graph.sim_floor = max(self.graph.sim_floor, t.sim_end)
        return _outcome(t) if outcome else None

    # ---- streams ---------------------------------------------------------------

    def query_stream(self, stream_id: int) -> bool:
        with self.lock:
            self._drain()
            stream = self.graph.stream(stream_id)
            if stream.error is not None:
                raise stream.error
            return stream.last is None or stream.last.done

    def synchronize_stream(self, stream_id: int) -> None:
        if in_host_operation():
            return
        stream = None
        wants = lambda ready: ready.stream is stream  # noqa: E731
        with self.lock, self.workers.helping(wants):
            stream = self.graph.stream(stream_id)
            self._drain()
            target = stream.last
            while target is not None and not target.done:
                self.workers.help_or_wait(wants)
            if target is not None:
                self.graph.sim_floor = max(self.graph.sim_floor, target.sim_end)
            if stream.error is not None:
                raise stream.error

    def synchronize(self) -> None:
        if in_host_operation():
            return
        last = None  # everything enqueued so far, once the handed-over launches are enqueued too
        wants = lambda ready: last is None or ready.seq <= last  # noqa: E731
        with self.lock, self.workers.helping(wants):
            self._drain()
            targets = list(self.inflight.values())
            last = max((t.seq for t in targets), default=0)
            for t in targets:
                while not t.done:
                    self.workers.help_or_wait(wants)
            self.graph.sim_floor = max([self.graph.sim_floor] + [p.sim_free for p in self.pipelines.values()])
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
            self.graph.clear_error(stream_id)

    def shutdown(self, timeout: float) -> bool:
        """Finish the enqueued work (up to `timeout` s) and stop the workers: at interpreter
        exit, a worker still running a torch op while Python and torch tear down aborts the
        process. Errors are not raised (nobody is left to see them). True if all finished."""
        deadline = time.monotonic() + timeout
        with self.lock:
            self._drain()
            for t in list(self.inflight.values()):
                while not t.done and time.monotonic() < deadline:
                    self.workers.wait_for_change(max(0.0, deadline - time.monotonic()))
            finished = all(t.done for t in self.inflight.values())
            if not finished:
                return False  # something waits on a signal that never comes: leave the daemons be
            self.workers.stop()
            self.submission.stop()
        threads = [pipe.thread for pipe in self.pipelines.values()] + [self.submission.submitter]
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return True

    # ---- introspection -----------------------------------------------------------

    @property
    def sim_floor(self) -> float:
        """Simulated time the host has observed: whatever it enqueues now starts no earlier."""
        return self.graph.sim_floor

    def sim_busy_ns(self) -> dict[str, float]:
        with self.lock:
            self._drain()
            return {name: p.sim_busy for name, p in self.pipelines.items()}


def _outcome(t: Ticket, keep: bool = True):
    if t.error is not None:
        raise t.error
    if t.skipped:
        raise t.pending_error
    result = t.result
    if not keep:
        t.result = None
    return result
