"""Pinned host staging buffers for transfers.

A buffer is handed out only when no transfer may still read it: either the
operation that last used it is done, or the new user fills it in the same
stream's order (a host callback enqueued on that stream), which then cannot
run before the previous transfer on that stream has finished.

A process has one pool (the runtime's, Runtime.staging): eager copies and
launches draw from it alike. Its lock is a leaf: nothing else is taken while
it is held.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class StagingBuffer:
    __slots__ = ("memory", "nbytes", "last_use", "stream", "address", "_host")

    def __init__(self, memory: Any, nbytes: int):
        self.memory = memory      # an object with .data_ptr() (a pinned CPU tensor)
        self.nbytes = nbytes
        self.last_use = None      # the Ticket of the last operation reading it
        self.stream = None        # (device, stream id) of that operation
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
        self._free: list[StagingBuffer] = []
        self.created = 0        # buffers allocated so far (never freed: they are reused)
        self.created_bytes = 0  # their total size

    def acquire(self, nbytes: int, stream=None, filled_in_stream_order: bool = False) -> StagingBuffer:
        """A buffer of at least `nbytes` that is safe to fill now.

        With ``filled_in_stream_order`` the caller fills it from an operation on
        `stream`; a buffer last read on that same stream is then safe even if
        that read has not run yet.
        """
        with self._lock:
            best = None
            for buf in self._free:
                if buf.nbytes < nbytes or not self._safe(buf, stream, filled_in_stream_order):
                    continue
                if best is None or buf.nbytes < best.nbytes:
                    best = buf
            if best is not None:
                self._free.remove(best)
                return best
            size = max(self._min_bytes, 1 << max(0, nbytes - 1).bit_length())
            self.created += 1
            self.created_bytes += size
        return StagingBuffer(self._allocate(size), size)

    @staticmethod
    def _safe(buf: StagingBuffer, stream, in_order: bool) -> bool:
        if buf.last_use is None or buf.last_use.done:
            return True
        return in_order and stream is not None and buf.stream == stream

    def release(self, buf: StagingBuffer, last_use, stream) -> None:
        """Return `buf`; it is busy until `last_use` (a Ticket) is done."""
        buf.last_use = last_use
        buf.stream = stream
        with self._lock:
            self._free.append(buf)
