"""Pinned host staging buffers for transfers.

A buffer is handed out only when no transfer may still read it: the
operation that last used it is done. So the taker may fill it at once, on the
host, before it enqueues the transfer that reads it.

A process has one pool (the runtime's, Runtime.staging): eager copies and
launches draw from it alike. Its lock is a leaf: nothing else is taken while
it is held.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable


class StagingBuffer:
    __slots__ = ("memory", "nbytes", "last_use", "address", "_host")

    def __init__(self, memory: Any, nbytes: int):
        self.memory = memory      # an object with .data_ptr() (a pinned CPU tensor)
        self.nbytes = nbytes
        self.last_use = None      # the Ticket of the last operation reading it
        self.address = memory.data_ptr()
        self._host = None

    def host_buffer(self):
        """The buffer's bytes as a writable Python buffer (for struct.pack_into)."""
        if self._host is None:
            self._host = self.memory.numpy()
        return self._host


class StagingPool:
    """Completion-gated pool of pinned host buffers."""

    def __init__(self, allocate: Callable[[int], Any], min_bytes: int = 4096):
        self._allocate = allocate
        self._min_bytes = min_bytes
        self._lock = threading.Lock()
        # per size (a power of two), the released buffers, oldest release first: transfers
        # finish roughly in the order they were enqueued, so the oldest is the one to look at
        self._free: dict[int, collections.deque[StagingBuffer]] = {}
        self.created = 0        # buffers allocated so far (never freed: they are reused)
        self.created_bytes = 0  # their total size

    def acquire(self, nbytes: int) -> StagingBuffer:
        """A buffer of at least `nbytes` that is safe to fill now: the smallest free one that
        fits, else a new one. A launch-bound loop keeps hundreds of them released and not yet
        read, so only a few of each size are looked at per call, oldest first, the busy ones
        moved to the back."""
        size = max(self._min_bytes, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            for have in sorted(k for k in self._free if k >= size):
                free = self._free[have]
                for _ in range(min(len(free), _LOOK)):
                    buf = free[0]
                    if buf.last_use is None or buf.last_use.done:
                        return free.popleft()
                    # busy (its stream may be held behind slow work): to the back, so the next
                    # acquires look at the others, and a done one behind it is not left unseen
                    free.rotate(-1)
            self.created += 1
            self.created_bytes += size
        return StagingBuffer(self._allocate(size), size)

    def release(self, buf: StagingBuffer, last_use) -> None:
        """Return `buf`; it is busy until `last_use` (a Ticket, or None: free now) is done."""
        buf.last_use = last_use
        with self._lock:
            free = self._free.get(buf.nbytes)
            if free is None:
                free = self._free[buf.nbytes] = collections.deque()
            free.append(buf)


_LOOK = 4  # released buffers of one size looked at per acquire (the oldest ones)
