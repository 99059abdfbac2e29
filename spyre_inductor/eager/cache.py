"""The bounded cache of eager entries, and its statistics (exposed as torch.spyre.eager_cache_*).

Least recently used entries are evicted once more than ``capacity`` are held.
Every entry counts: a compiled one and a CPU route (an op x inputs the compiler
declined, cached so the decline is not recompiled per call). An evicted
compiled entry gives back what it holds once no call still runs it: its
compiled graph's module leaves Inductor's records and its programs' device
memory (image, correction areas) is released once their launches are done
(launch.CompiledEntry, compiler/loaded.py); compiling its key again prepares
them again.

Statistics: hits and misses of lookups, compiles (entries compiled into
programs), cpu_routes (entries that run through the CPU fallback: declined or
not for the compiled path), evictions, compile_seconds; of the compiles,
scalar_kinds: those whose Python scalars travel at launch (issue 19: one entry
serves every value of them), and value_keyed: kinds whose scalars could not
travel after all, so each value is compiled under its own key. No Inductor
import here: torch.spyre reads this module at any time.
"""

from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass

DEFAULT_CAPACITY = 1024


@dataclass(frozen=True)
class EagerCacheStats:
    hits: int
    misses: int
    compiles: int
    cpu_routes: int
    evictions: int
    entries: int
    capacity: int
    compile_seconds: float
    scalar_kinds: int = 0
    value_keyed: int = 0


def _capacity_from_env() -> int:
    raw = os.environ.get("SPYRE_EAGER_CACHE_SIZE", "")
    if not raw:
        return DEFAULT_CAPACITY
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
        return value
    except ValueError:
        import warnings

        warnings.warn(f"spyre: SPYRE_EAGER_CACHE_SIZE={raw!r} is not a positive integer; using "
                      f"{DEFAULT_CAPACITY}", RuntimeWarning, stacklevel=2)
        return DEFAULT_CAPACITY


class EagerCache:
    def __init__(self, capacity: int):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()  # a leaf: nothing else is taken while it is held
        self.capacity = capacity
        self.hits = self.misses = self.compiles = self.cpu_routes = self.evictions = 0
        self.scalar_kinds = self.value_keyed = 0
        self.compile_seconds = 0.0

    def get(self, key):
        """The entry for `key` (counted as a hit or a miss), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def peek(self, key):
        """The entry for `key`, counting nothing (a re-check under the compile lock)."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key, entry, *, kind: str, seconds: float = 0.0) -> None:
        """Cache `entry`; `kind` is "compiled", "cpu" (a CPU route) or "other" (a resize)."""
        with self._lock:
            if kind == "compiled":
                self.compiles += 1
                self.compile_seconds += seconds
                if getattr(entry, "travel", ()):
                    self.scalar_kinds += 1
            elif kind == "cpu":
                self.cpu_routes += 1
            elif type(entry).__name__ == "ValueKeyed":  # (launch.py's; not imported here)
                self.value_keyed += 1
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._evict()

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evictions += 1

    def set_capacity(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"the eager cache capacity must be a positive integer, got {capacity!r}")
        with self._lock:
            self.capacity = capacity
            self._evict()

    def clear(self) -> None:
        """Drop every entry and zero the statistics."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = self.compiles = self.cpu_routes = self.evictions = 0
            self.scalar_kinds = self.value_keyed = 0
            self.compile_seconds = 0.0

    def entries(self) -> list:
        with self._lock:
            return list(self._entries.items())

    def stats(self) -> EagerCacheStats:
        with self._lock:
            return EagerCacheStats(self.hits, self.misses, self.compiles, self.cpu_routes, self.evictions,
                                   len(self._entries), self.capacity, self.compile_seconds, self.scalar_kinds,
                                   self.value_keyed)


CACHE = EagerCache(_capacity_from_env())
