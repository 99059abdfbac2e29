"""Tickets: the queue's record of each enqueued operation, and the errors a stream reports.

A ticket is what the rest of the queue layer passes around: the stream graph
links tickets, the workers run them, an event's signal and a staging buffer
keep one to know when the work is done. A stream's errors are typed so a
caller can tell an index out of range (a gather or scatter's IndexError,
issue 16: StreamIndexError, an IndexError too) and a wait whose signal never
comes (WaitTimeout) from any other failure.
"""

from __future__ import annotations

from .operations import NO_FOOTPRINT


class StreamError(RuntimeError):
    """An operation failed on a stream; raised by the stream's query/synchronize until cleared."""


class StreamIndexError(StreamError, IndexError):
    """A program stopped at an index out of range; `op`, `value`, `bound` say which."""

    def __init__(self, message: str, op: str, value: int, bound: int):
        super().__init__(message)
        self.op, self.value, self.bound = op, value, bound


class WaitTimeout(TimeoutError):
    """A Wait whose signal was never enqueued."""


def _index_error(error: BaseException):
    """The out-of-range IndexError behind `error` (itself or a cause), or None."""
    while error is not None:
        if isinstance(error, IndexError) and hasattr(error, "bound"):
            return error
        error = error.__cause__
    return None


def stream_error(message: str, cause: BaseException) -> StreamError:
    """A StreamError caused by `cause`: a StreamIndexError if an index out of range is behind it."""
    bad = _index_error(cause)
    error = StreamIndexError(message, bad.op, bad.value, bad.bound) if bad is not None else StreamError(message)
    error.__cause__ = cause
    root = getattr(cause, "root", None)
    if root is not None:  # it failed because of an earlier failure: that one is what to name
        error.root = root
    return error


def root_of(error: BaseException) -> BaseException:
    """The original failure behind `error` (a failure that only follows from another has `root`)."""
    return getattr(error, "root", None) or error


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
    correlation = 0  # the CPU op that enqueued it, while torch.profiler records (stream_graph)
    wall_clock = False  # it lasts its host wall time on the timeline (an unpriced host callback)
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
        """Done, neither failed nor skipped; safe to read without the lock (the graph sets the
        error, and marks a skip, before done)."""
        return self.done and self.error is None and not self.skipped

    def __repr__(self) -> str:
        state = "done" if self.done else ("ready" if self.ready else "waiting")
        return f"Ticket(#{self.seq} {self.name!r} on stream {self.stream.id}, {state})"


class _FailedSubmission:
    """Stands for the operations of a submission that could not be enqueued (see submit)."""

    pipeline = "control"
    footprint = NO_FOOTPRINT
    name = "a submitted launch that could not be enqueued"


FAILED_SUBMISSION = _FailedSubmission()


class Finished:
    """What remains of a finished operation: its name and footprint."""

    __slots__ = ("name", "footprint")

    def __init__(self, name: str, footprint):
        self.name = name
        self.footprint = footprint
