"""The simulated device's data-movement engine: what performs and prices every Transfer.

The queue layer hands each Transfer to the engine its device gave it
(queue.operations.DataMovement) and asks nothing else. In the simulator,
device memory is host-addressable (the C++ allocator reserves it in this
process), so a transfer of any kind is one memmove between two host
addresses: a HostAddress as it is, a DeviceAddress as its region's base plus
its offset. Its cost on the card is its bytes over the bandwidth of the link
it crosses: the host link for H2D and D2H, device memory for D2D
(TransferCosts, built from the hardware config).

No torch here: the queue layer's own tests run this engine over ctypes buffers.
"""

from __future__ import annotations

import ctypes
from typing import Callable

from ..queue.operations import DataMovement, DeviceAddress, Transfer, TransferKind


SMALL_TRANSFER = 64 * 1024  # bytes copied without releasing the GIL (see SimulatedDataMovement.run)
# libc's memmove called as a Python-API function: ctypes then keeps the GIL across the call.
_memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes._memmove_addr)


class TransferCosts:
    """Simulated cost of a transfer, in ns (bandwidths in GB/s = bytes/ns)."""

    __slots__ = ("host_link_gbps", "device_memory_gbps")

    def __init__(self, host_link_gbps: float, device_memory_gbps: float):
        self.host_link_gbps = host_link_gbps
        self.device_memory_gbps = device_memory_gbps

    def transfer_ns(self, transfer: Transfer) -> float:
        bw = self.device_memory_gbps if transfer.kind is TransferKind.D2D else self.host_link_gbps
        return transfer.nbytes / bw


class SimulatedDataMovement(DataMovement):
    """One device's DMA engine: memmove over host-addressable device memory, priced by TransferCosts.

    `region_base(region)` is the host address of a region of this device's memory
    (spyre_runtime.memory.region_address keeps the one cache of them).
    """

    __slots__ = ("costs", "_region_base")

    def __init__(self, costs: TransferCosts, region_base: Callable[[int], int]):
        self.costs = costs
        self._region_base = region_base

    def run(self, transfer: Transfer) -> None:
        n = transfer.nbytes
        dst, src = self._address(transfer.destination), self._address(transfer.source)
        if n <= SMALL_TRANSFER:
            # ctypes.memmove lets go of the GIL, and getting it back from a queue worker costs
            # far more than a few kilobytes take to copy.
            _memmove_holding_gil(dst, src, n)
        else:
            ctypes.memmove(dst, src, n)

    def cost_ns(self, transfer: Transfer) -> float:
        return self.costs.transfer_ns(transfer)

    def _address(self, where) -> int:
        if type(where) is DeviceAddress:
            return self._region_base(where.region) + where.offset
        return where.address
