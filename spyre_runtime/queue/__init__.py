"""The queue layer: typed operations on ordered streams over the device's pipelines.

It knows operations, streams, signals and footprints, never what a program is.
"""

from .device_queue import Costs, DeviceQueue, StreamError, Ticket, WaitTimeout, in_host_operation
from .operations import (
    Barrier,
    Compute,
    DeviceAddress,
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
from .timeline import Timeline

__all__ = [
    "Barrier", "Compute", "Costs", "DeviceAddress", "DeviceQueue", "Footprint", "HostAddress",
    "HostCallback", "NO_FOOTPRINT", "Range", "Runtime", "Signal", "SoftSignal", "StagingBuffer",
    "StagingPool", "StreamError", "Ticket", "Timeline", "Transfer", "TransferKind", "Wait", "WaitTimeout",
    "in_host_operation",
]
