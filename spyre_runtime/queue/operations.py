"""The typed operations the queue layer accepts, and the two interfaces it runs them through.

An operation names its operands explicitly and carries its device-memory
footprint: the (region, offset, length) ranges it reads and writes. The queue
layer orders operations by stream and by footprint; it never looks inside a
program and never asks what runs:

* a Compute carries an ``Executor``; the queue calls its ``prefetch``,
  ``run`` and ``cost_ns`` and nothing else;
* an Exchange (work on the card's link to other cards: a collective, a send
  or a receive) carries an ``Executor`` too, run on the link pipeline;
* each device queue is handed a ``DataMovement`` engine (the device's, e.g.
  spyre_runtime.device.SimulatedDataMovement), which performs and prices
  every Transfer.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .signals import SoftSignal


class Range(NamedTuple):
    """Bytes [offset, offset + length) of one region of device memory.

    (A named tuple, not a dataclass: every launch makes a few, and every enqueue compares them.)
    """

    region: int
    offset: int
    length: int

    def overlaps(self, other: Range) -> bool:
        return (
            self.region == other.region
            and self.offset < other.offset + other.length
            and other.offset < self.offset + self.length
        )


def _any_overlap(a: tuple[Range, ...], b: tuple[Range, ...]) -> bool:
    for x in a:
        for y in b:
            if x[0] == y[0] and x[1] < y[1] + y[2] and y[1] < x[1] + x[2]:
                return True
    return False


class Footprint(NamedTuple):
    """The device memory an operation reads and writes."""

    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()

    def conflicts(self, other: Footprint) -> bool:
        """True for read-after-write, write-after-read or write-after-write overlap."""
        w = self.writes
        return (
            (w and (_any_overlap(w, other.writes) or _any_overlap(w, other.reads)))
            or _any_overlap(self.reads, other.writes)
        )

    @property
    def empty(self) -> bool:
        return not self.reads and not self.writes


NO_FOOTPRINT = Footprint()


class TransferKind(enum.Enum):
    H2D = "h2d"
    D2H = "d2h"
    D2D = "d2d"


@dataclass(frozen=True)
class HostAddress:
    address: int


@dataclass(frozen=True)
class DeviceAddress:
    region: int
    offset: int


@dataclass(frozen=True)
class HostCallback:
    """Run `fn()` on the host, in stream order."""

    fn: Callable[[], Any]
    footprint: Footprint = NO_FOOTPRINT
    name: str = "host callback"
    # True: a failure is returned to the caller that waits for it (an eager
    # op's argument error) instead of stopping the stream.
    raise_to_caller: bool = False
    # Its length on the simulated timeline, when the work it stands for has a known price;
    # None: the host wall time fn() takes.
    cost_ns: float | None = None
    pipeline = "host"

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"HostCallback {self.name!r}: fn must be callable, got {type(self.fn).__name__}")


@dataclass(frozen=True)
class Transfer:
    """Copy `nbytes` between host and device memory, or within device memory."""

    kind: TransferKind
    source: HostAddress | DeviceAddress
    destination: HostAddress | DeviceAddress
    nbytes: int
    # Host objects that must stay alive until the transfer has run.
    keepalive: Any = field(default=None, compare=False)
    label: str = ""  # what it is for, in errors and timelines (a launch's patch names its kernel)
    pipeline: str = field(init=False, compare=False)
    footprint: Footprint = field(init=False, compare=False)

    def __post_init__(self):
        want = _TRANSFER_OPERANDS[self.kind]
        if type(self.source) is not want[0] or type(self.destination) is not want[1]:
            raise TypeError(
                f"{self.kind.value} transfer needs a {want[0].__name__} source and a "
                f"{want[1].__name__} destination, got {self.source!r} -> {self.destination!r}"
            )
        if self.nbytes < 0:
            raise ValueError(f"transfer size must be non-negative, got {self.nbytes}")
        # Computed once: the scheduler reads these on every conflict check.
        object.__setattr__(self, "pipeline", self.kind.value)
        what = f"{self.kind.value} {self.nbytes} B"
        object.__setattr__(self, "_name", f"{self.label}: {what}" if self.label else what)
        object.__setattr__(self, "footprint", Footprint(
            reads=self._range(self.source), writes=self._range(self.destination)))

    def _range(self, addr) -> tuple[Range, ...]:
        return (Range(addr.region, addr.offset, self.nbytes),) if type(addr) is DeviceAddress else ()

    @property
    def name(self) -> str:
        return self._name


_TRANSFER_OPERANDS = {
    TransferKind.H2D: (HostAddress, DeviceAddress),
    TransferKind.D2H: (DeviceAddress, HostAddress),
    TransferKind.D2D: (DeviceAddress, DeviceAddress),
}


class Executor(abc.ABC):
    """What a Compute runs. The queue layer calls these three methods, in this order, and
    nothing else; what the executor is (a program on the simulated device, a test's stub)
    is not its business.

    ``prefetch(bindings)``: the device may start reading what the run will need. Called when
    the Compute is enqueued, or, if the operation ahead of it on its stream is a Barrier
    that has not completed, when the Compute becomes ready (the barrier holds it back).
    Called once per Compute, before ``run``; by default it does nothing.

    ``run(bindings)``: execute, on the compute pipeline (its worker thread, or the caller's
    thread for an inline operation). An exception fails the operation (and its stream).

    ``cost_ns(bindings)``: the simulated duration of the run that just finished, in ns: its
    length on the compute pipeline's timeline. Called right after ``run``; by default 0.
    """

    __slots__ = ()

    def prefetch(self, bindings) -> None:
        return None

    @abc.abstractmethod
    def run(self, bindings) -> None:
        ...

    def cost_ns(self, bindings) -> float:
        return 0.0


class DataMovement(abc.ABC):
    """The device's data-movement engine: what the queue layer hands every Transfer to.

    ``run(transfer)`` moves the bytes (on the transfer's pipeline); ``cost_ns(transfer)``
    is its simulated duration, called right after ``run``.
    """

    __slots__ = ()

    @abc.abstractmethod
    def run(self, transfer: Transfer) -> None:
        ...

    @abc.abstractmethod
    def cost_ns(self, transfer: Transfer) -> float:
        ...


@dataclass(frozen=True)
class Compute:
    """Run an executor with its bindings on the device's compute pipeline.

    The executor is opaque here: the queue calls its Executor methods with
    ``bindings`` and knows nothing else about either.
    """

    executor: Executor
    bindings: Any
    footprint: Footprint = NO_FOOTPRINT
    name: str = "compute"
    # Program distribution holds its fetch until it is ready to run (its correction area is
    # patched by an operation it depends on), as a Barrier ahead of it on its stream would.
    hold_fetch: bool = False
    pipeline = "compute"

    def __post_init__(self):
        if not isinstance(self.executor, Executor):
            raise TypeError(f"Compute {self.name!r}: the executor must be an Executor (run, cost_ns, "
                            f"prefetch; spyre_runtime.queue.Executor), got {type(self.executor).__name__}")


@dataclass(frozen=True)
class Exchange:
    """Run an executor with its bindings on the device's link pipeline: work that moves bytes
    between this card and others (a collective, a send, a receive).

    Like a Compute, it is opaque here: the queue calls the executor's ``run`` and ``cost_ns``
    (never ``prefetch``: no program is fetched). It has a pipeline of its own, so it runs while
    the compute pipeline runs; its ``run`` may block until the other cards take part. So that
    one blocked exchange does not hold up another that the other cards take part in first,
    `pipeline` may name a lane of the link, "link:<lane>" (one worker each, made on first use;
    the timeline shows them all on the link's track).
    """

    executor: Executor
    bindings: Any
    footprint: Footprint = NO_FOOTPRINT
    name: str = "exchange"
    pipeline: str = "link"

    def __post_init__(self):
        if self.pipeline != "link" and not self.pipeline.startswith("link:"):
            raise ValueError(f"Exchange {self.name!r}: its pipeline is 'link' or 'link:<lane>', got {self.pipeline!r}")
        if not isinstance(self.executor, Executor):
            raise TypeError(f"Exchange {self.name!r}: the executor must be an Executor (run, cost_ns; "
                            f"spyre_runtime.queue.Executor), got {type(self.executor).__name__}")


class _Control:
    """Control operations order the stream; they touch no memory and take no pipeline time."""

    pipeline = "control"
    footprint = NO_FOOTPRINT


@dataclass(frozen=True)
class _OnSignal(_Control):
    signal: SoftSignal
    verb = ""

    @property
    def name(self) -> str:
        return f"{self.verb} {self.signal.ident}"


@dataclass(frozen=True)
class Signal(_OnSignal):
    """Fire a single-use software signal once everything before it on the stream is done."""

    verb = "signal"


@dataclass(frozen=True)
class Wait(_OnSignal):
    """Hold the stream until a signal fires (it may be enqueued later, on another stream)."""

    verb = "wait"


@dataclass(frozen=True)
class Barrier(_Control):
    """Hold the stream until earlier work is done.

    Without a footprint it is device-wide: every operation enqueued before it,
    on any stream. With one it holds only what it must: its own stream's
    earlier work and other streams' unfinished work that conflicts with the
    footprint (for a launch, writes to the program memory its fetch reads), so
    an unrelated stream's copies or a stuck stream do not stall it.
    """

    name: str = "barrier"
    footprint: Footprint = NO_FOOTPRINT
    # Operations enqueued before it in the same DeviceQueue.enqueue_runs call, on any stream,
    # that must have succeeded: it holds until they are done and fails (stopping its stream)
    # if one failed or was skipped. A launch's fetch requires its correction patch, which may
    # run on another stream whose errors would otherwise not reach the compute's stream.
    requires: tuple = field(default=(), compare=False)


Operation = HostCallback | Transfer | Compute | Exchange | Signal | Wait | Barrier
