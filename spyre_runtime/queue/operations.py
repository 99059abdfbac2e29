"""The typed operations the queue layer accepts.

An operation names its operands explicitly and carries its device-memory
footprint: the (region, offset, length) ranges it reads and writes. The queue
layer orders operations by stream and by footprint; it never looks inside a
program (a Compute's executable is opaque to it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from .signals import SoftSignal


@dataclass(frozen=True)
class Range:
    """Bytes [offset, offset + length) of one region of device memory."""

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
    return any(x.overlaps(y) for x in a for y in b)


@dataclass(frozen=True)
class Footprint:
    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()

    def conflicts(self, other: Footprint) -> bool:
        """True for read-after-write, write-after-read or write-after-write overlap."""
        return (
            _any_overlap(self.writes, other.writes)
            or _any_overlap(self.writes, other.reads)
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
        object.__setattr__(self, "footprint", Footprint(
            reads=self._range(self.source), writes=self._range(self.destination)))

    def _range(self, addr) -> tuple[Range, ...]:
        return (Range(addr.region, addr.offset, self.nbytes),) if type(addr) is DeviceAddress else ()

    @property
    def name(self) -> str:
        return f"{self.kind.value} {self.nbytes} B"


_TRANSFER_OPERANDS = {
    TransferKind.H2D: (HostAddress, DeviceAddress),
    TransferKind.D2H: (DeviceAddress, HostAddress),
    TransferKind.D2D: (DeviceAddress, DeviceAddress),
}


@dataclass(frozen=True)
class Compute:
    """Run an executable with its bindings on the device's compute pipeline.

    The executable is opaque here: it needs ``run(bindings)`` and may offer
    ``simulated_ns(bindings)`` (its cost on the card; until the timing model
    lands, an executable without it costs 0 simulated ns).
    """

    executable: Any
    bindings: Any
    footprint: Footprint = NO_FOOTPRINT
    name: str = "compute"
    pipeline = "compute"

    def __post_init__(self):
        if not callable(getattr(self.executable, "run", None)):
            raise TypeError(f"Compute {self.name!r}: the executable must have run(bindings), "
                            f"got {type(self.executable).__name__}")


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


Operation = HostCallback | Transfer | Compute | Signal | Wait | Barrier
