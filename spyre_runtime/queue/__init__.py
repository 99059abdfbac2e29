"""The queue layer: typed operations on ordered streams over the device's pipelines.

It knows operations, streams, signals and footprints, never what a program is:
a Compute runs the Executor it carries, a Transfer the DataMovement engine the
device handed the queue (spyre_runtime.device provides the simulated one).
"""

from .device_queue import DeviceQueue
from .operations import (
    Barrier,
    Compute,
    DataMovement,
    DeviceAddress,
    Exchange,
    Executor,
    Footprint,
    HostAddress,
    HostCallback,
    NO_FOOTPRINT,
    Range,
    Signal,
    Transfer,
    TransferKind,
    Wait,
)
from .runtime import Runtime
from .signals import SoftSignal
from .staging import StagingBuffer, StagingPool
from .tickets import StreamError, Ticket, WaitTimeout
from .timeline import Timeline
from .workers import in_host_operation

__all__ = [
    "Barrier", "Compute", "DataMovement", "DeviceAddress", "DeviceQueue", "Exchange", "Executor", "Footprint", "HostAddress",
    "HostCallback", "NO_FOOTPRINT", "Range", "Runtime", "Signal", "SoftSignal", "StagingBuffer",
    "StagingPool", "StreamError", "Ticket", "Timeline", "Transfer", "TransferKind", "Wait", "WaitTimeout",
    "in_host_operation",
]
