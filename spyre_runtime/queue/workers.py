"""Pipelines and the threads that run ready operations on them.

A ready operation runs on its pipeline. There is ONE compute pipeline (ready
computes go by stream priority, then enqueue order) and separate h2d, d2h,
d2d, host and link pipelines, each with its own worker, so a transfer runs while a
compute runs. (An Exchange on the link pipeline may block until other cards take
part: no waiting thread runs one itself, so only its worker is held.) Control operations (Signal, Wait, Barrier) complete as soon as
they are ready (stream_graph.py).

What runs is not this module's business: a Compute runs its Executor (its
`prefetch` when enqueued, or when ready if it holds its fetch or waits behind
a Barrier; then `run` and `cost_ns`), and a Transfer runs on the DataMovement
engine the device handed the queue (operations.py). The simulated device's
engine and its program distribution live in spyre_runtime.device.

Who runs an operation: its pipeline's worker; the thread that enqueued it,
for inline operations (eager ops that need their result now: the CPU
fallback, blocking copies, item()) and for the host callbacks and transfers
of an enqueue_runs(run_ready=True) or a submission that are ready at once (a
launch's patch); or a thread that waits (wait, synchronize) and finds ready
computes and transfers it is waiting for. The worker of a pipeline is woken
only when the pipeline has work, the worker is idle, and the work is not
what the waking thread waits for and will run itself.

Every operation gets a simulated start and end on its pipeline's timeline:
the later of its simulated ready time and its pipeline's previous end, plus
its cost (the executor's or the data-movement engine's cost_ns; a host
callback's declared cost_ns, or else its host wall time).
"""

from __future__ import annotations

import heapq
import threading
import time

from .operations import Compute, Exchange, Transfer
from .stream_graph import Stream, StreamGraph
from .tickets import Ticket

PIPELINES = ("compute", "h2d", "d2h", "d2d", "host", "link")
# A thread that waits for the device runs ready device work itself instead of sleeping
# until a worker has run it: a launch followed by a synchronize then runs on the caller's
# thread, with no handoff to a worker and back. Only computes and transfers are taken
# (a host callback may wait for something this thread is yet to do), only from an idle
# pipeline, and the simulated timeline is the same whoever runs them.
_STEALABLE = ("compute", "h2d", "d2h", "d2d")
_NOTHING = ()

_local = threading.local()


def in_host_operation() -> bool:
    """True while this thread runs an inline operation: nested device work runs directly."""
    return getattr(_local, "depth", 0) > 0


class Pipeline:
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


class _Helping:
    """While a thread waits for a device (holding its queue's lock when entered and left): the
    tickets of that queue it waits for, which it runs itself when their pipeline is free
    (Workers.help_or_wait), so their workers are not woken. Whatever it leaves ready
    when it stops waiting (it stopped early, or readied what it did not wait for) goes to the
    workers then."""

    __slots__ = ("workers", "wants", "outer")

    def __init__(self, workers: Workers, wants):
        self.workers, self.wants = workers, wants

    def __enter__(self):
        self.outer = getattr(_local, "helping", None)
        _local.helping = (self.workers, self.wants)

    def __exit__(self, *exc):
        _local.helping = self.outer
        self.workers.wake(self.workers.pipelines.values())
        return False


class Workers:
    """One device's pipelines, their worker threads, and the threads that wait for the device.

    Everything that reads or changes the graph or a pipeline's heap holds `lock` (the queue's)."""

    def __init__(self, device: int, lock: threading.Lock, graph: StreamGraph, data_movement):
        self.device = device
        self.lock = lock
        self.graph = graph
        self.data_movement = data_movement
        self.changed = threading.Condition(lock)
        self.pipelines = {name: Pipeline(name, lock) for name in PIPELINES}
        self.waiting = 0  # threads in wait_for_change
        self.closing = False  # set by stop(): workers finish their heaps and exit
        # Pipelines whose workers are woken once the enqueue_runs(run_ready=True) call in progress
        # is done: a worker woken at once would contend for the queue (and the GIL) with the
        # caller still running the launch's patch.
        self.wake_later: set | None = None
        self._watchdog: threading.Thread | None = None

    # ---- handing ready tickets over (lock held) ------------------------------------

    def dispatch(self, t: Ticket):
        """A ready ticket that must run (the graph's dispatch): to the thread that waits for it,
        to the caller that claimed it, or to its pipeline's worker. Returns the tickets its
        run readied, if it ran here."""
        if t.inline:
            t.ready = True
            self.notify_waiters()
        elif t.claimant is not None:
            t.ready = True
            pipe = self.pipelines[t.pipeline]
            if pipe.running.acquire(blocking=False):
                # Run it here, holding the queue: what run_ready hands over is a few bytes'
                # work (a launch's patch) that calls nothing of the queue, and its completion
                # readies the next one in the graph's same loop, with no lock let go and taken again.
                try:
                    cost, error = self.execute(t)
                finally:
                    pipe.running.release()
                t.sim_start = max(t.ready_sim, pipe.sim_free)
                t.sim_end = t.sim_start + cost
                pipe.sim_free = max(pipe.sim_free, t.sim_end)
                pipe.sim_busy += cost
                return self.graph.complete(t, error)
            # its pipeline is busy with other work: run by the caller once the queue is let go
            t.claimant.append(t)
        else:
            t.ready = True
            self.push(t)
        return _NOTHING

    def notify_waiters(self) -> None:
        if self.waiting:
            self.changed.notify_all()

    def push(self, t: Ticket) -> None:
        """Hand a ready ticket to its pipeline's worker (or to the thread waiting for it)."""
        pipe = self.pipelines.get(t.pipeline)
        if pipe is None:  # a lane of the link ("link:<lane>", operations.Exchange), on first use
            pipe = self.pipelines[t.pipeline] = Pipeline(t.pipeline, self.lock)
        key = t.priority if t.pipeline == "compute" else 0
        heapq.heappush(pipe.heap, (key, t.seq, t))
        if self.wake_later is not None:
            self.wake_later.add(pipe)
        elif pipe.thread is None:
            if not self._helper_runs(pipe, (t,)):
                self._start_worker(pipe)
        elif pipe.idle and not self._helper_runs(pipe, (t,)):
            pipe.cond.notify()

    def wake(self, pipes) -> None:
        """Wake the workers of `pipes` that have work (lock held)."""
        for pipe in pipes:
            if pipe.heap and not self._helper_runs(pipe, [t for _, _, t in pipe.heap]):
                if pipe.thread is None:
                    self._start_worker(pipe)
                elif pipe.idle:
                    pipe.cond.notify()

    def _helper_runs(self, pipe: Pipeline, tickets) -> bool:
        """True if this thread waits for every one of `tickets` and will run them itself
        (help_or_wait): waking the worker would only make it contend for the GIL and the queue."""
        helping = getattr(_local, "helping", None)
        return (helping is not None and helping[0] is self and pipe.name in _STEALABLE
                and all(helping[1](t) for t in tickets))

    # ---- execution ----------------------------------------------------------

    def _start_worker(self, pipe: Pipeline) -> None:
        if pipe.thread is None:
            pipe.thread = threading.Thread(
                target=self._work, args=(pipe,), name=f"spyre{self.device}-{pipe.name}", daemon=True
            )
            pipe.thread.start()

    def _work(self, pipe: Pipeline) -> None:
        while True:
            with self.lock:
                while not pipe.heap and not self.closing:
                    pipe.idle = True
                    pipe.cond.wait()
                    pipe.idle = False
                if self.closing and not pipe.heap:
                    return
                _, _, t = heapq.heappop(pipe.heap)
            self.run_on_pipeline(t)

    def run_on_pipeline(self, t: Ticket) -> None:
        """Execute `t` holding its pipeline, so a pipeline runs one operation at a
        time whether its worker or an inline caller executes it."""
        with self.pipelines[t.pipeline].running:
            cost, error = self.execute(t)
            self._finish(t, cost, error)

    def run_inline(self, t: Ticket) -> None:
        """Run the ready inline ticket `t` on this thread: device work it calls runs directly."""
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            self.run_on_pipeline(t)
        finally:
            _local.depth -= 1

    def execute(self, t: Ticket) -> tuple[float, BaseException | None]:
        op = t.op
        t.host_start = time.perf_counter_ns()
        try:
            if isinstance(op, Transfer):
                self.data_movement.run(op)
                cost = float(self.data_movement.cost_ns(op))
            elif isinstance(op, (Compute, Exchange)):
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
            t.wall_clock = True  # (its length on the timeline is the host's, not the card's)
        return cost, error

    def execute_direct(self, op):
        """Run `op` now, outside any stream (inside an inline operation); its result or raise."""
        if type(op) is Compute:
            op.executor.prefetch(op.bindings)  # nothing can come between: it runs now
        probe = Ticket(op, Stream(-1, 0), 0, True, self.device)
        _, error = self.execute(probe)
        if error is not None:
            raise error
        return probe.result

    def _finish(self, t: Ticket, cost_ns: float, error: BaseException | None) -> None:
        with self.lock:
            pipe = self.pipelines[t.pipeline]
            # Its start could have been set before it ran: its dependencies were done and its
            # pipeline (held by the caller) ran nothing else meanwhile.
            t.sim_start = max(t.ready_sim, pipe.sim_free)
            t.sim_end = t.sim_start + cost_ns
            pipe.sim_free = max(pipe.sim_free, t.sim_end)
            pipe.sim_busy += cost_ns
            self.graph.make_ready(self.graph.complete(t, error))

    # ---- threads that wait for the device (lock held) ---------------------------------

    def helping(self, wants) -> _Helping:
        """While this thread waits for the tickets `wants(ticket)` accepts (see help_or_wait)."""
        return _Helping(self, wants)

    def help_or_wait(self, wanted) -> None:
        """Run one ready operation `wanted(ticket)` accepts, or wait for a change."""
        for name in _STEALABLE:
            pipe = self.pipelines[name]
            if pipe.heap and wanted(pipe.heap[0][2]) and pipe.running.acquire(blocking=False):
                _, _, t = heapq.heappop(pipe.heap)
                self.lock.release()
                try:
                    self.run_on_pipeline(t)
                finally:
                    pipe.running.release()
                    self.lock.acquire()
                return
        self.wait_for_change()

    def wait_for_change(self, timeout: float | None = None) -> None:
        """changed.wait(), counted: a completion notifies only when someone waits."""
        self.waiting += 1
        try:
            self.changed.wait(timeout)
        finally:
            self.waiting -= 1

    # ---- waits whose signal never comes -------------------------------------

    def start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"spyre{self.device}-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                deadline = self.graph.expire_waits(now)
                self.wait_for_change(max(0.01, deadline - now) if deadline is not None else 1.0)

    # ---- stopping ----------------------------------------------------------------

    def stop(self) -> None:
        """Let the workers finish their heaps and exit (lock held)."""
        self.closing = True
        for pipe in self.pipelines.values():
            pipe.cond.notify_all()
