"""The bounded cache of eager entries, and its statistics (exposed as torch.spyre.eager_cache_*).

At most ``capacity`` entries are held, chosen by how often and how recently
their keys are asked for (EagerCache: W-TinyLFU). Every entry counts: a
compiled one and a CPU route (an op x inputs the compiler declined, cached so
the decline is not recompiled per call). An evicted compiled entry gives back
what it holds once no call still runs it: its compiled graph's module leaves
Inductor's records and its programs' device memory (image, correction areas)
is released once their launches are done (launch.CompiledEntry,
launcher/loaded.py); compiling its key again prepares them again.

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
    """Entries by key, at most `capacity` of them, kept by how often and how recently they are used.

    The policy is W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
    Admission Policy", 2017; Caffeine's), with exact counts: a small LRU window (1% of the capacity,
    at least one entry) takes every new entry; the entry that leaves the window may join the main
    part (LRU, the rest) only by displacing the main part's least recently used entry, and only if
    its key was asked for more often (ties keep the resident). Every lookup counts for its key,
    resident or not (the counts of keys not held are kept too), and all counts are halved every
    ten lookups per entry of capacity, so a key that stops being used loses its place in time.
    Plain LRU keeps nothing under a cyclic scan wider than the cache (each key is evicted just
    before it comes back: 0 hits for 20 shapes over 8 entries): here a set of keys stays and hits
    on every cycle, and a hot key survives any scan of keys used once. A rejected candidate is
    an eviction like any other: its compiled graph is let go (launch.CompiledEntry).
    """

    def __init__(self, capacity: int):
        self._window: collections.OrderedDict = collections.OrderedDict()  # key -> [entry, count]
        self._main: collections.OrderedDict = collections.OrderedDict()    # key -> [entry, count]
        self._counts: dict = {}  # key -> count, for keys not held
        self._lock = threading.Lock()  # a leaf: nothing else is taken while it is held
        self._size(capacity)
        self.hits = self.misses = self.compiles = self.cpu_routes = self.evictions = 0
        self.scalar_kinds = self.value_keyed = 0
        self.compile_seconds = 0.0
        self._lookups = 0  # since the counts were last halved

    def _size(self, capacity: int) -> None:
        self.capacity = capacity
        self._window_size = max(1, capacity // 100)
        self._main_size = capacity - self._window_size  # (0 for a capacity of 1: the window alone)
        self._sample = 10 * capacity  # lookups between two halvings of the counts

    def get(self, key):
        """The entry for `key` (counted as a hit or a miss), or None."""
        with self._lock:
            slot = self._main.get(key)
            if slot is not None:
                self._main.move_to_end(key)
            else:
                slot = self._window.get(key)
                if slot is not None:
                    self._window.move_to_end(key)
            self._lookups += 1
            if self._lookups >= self._sample:
                self._age()
            if slot is None:
                self.misses += 1
                self._counts[key] = self._counts.get(key, 0) + 1
                return None
            slot[1] += 1
            self.hits += 1
            return slot[0]

    def peek(self, key):
        """The entry for `key`, counting nothing (a re-check under the compile lock)."""
        with self._lock:
            slot = self._main.get(key) or self._window.get(key)
            return None if slot is None else slot[0]

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
            old = self._main.pop(key, None) or self._window.pop(key, None)
            count = old[1] if old is not None else max(1, self._counts.pop(key, 0))
            self._window[key] = [entry, count]
            dropped = self._evict()
        del dropped  # (outside the lock: an entry let go gives back its compiled graph)

    def _evict(self) -> list:
        """Bring both parts within their sizes; the entries evicted (to drop outside the lock)."""
        dropped = []
        while len(self._main) > self._main_size:
            dropped.append(self._drop(*self._main.popitem(last=False)))
        while len(self._window) > self._window_size:
            key, slot = self._window.popitem(last=False)
            if len(self._main) < self._main_size:
                self._main[key] = slot
                continue
            if self._main:
                victim = next(iter(self._main))
                if slot[1] > self._main[victim][1]:
                    dropped.append(self._drop(victim, self._main.pop(victim)))
                    self._main[key] = slot
                    continue
            dropped.append(self._drop(key, slot))
        return dropped

    def _drop(self, key, slot):
        self._counts[key] = slot[1]  # (remembered: a key asked for again comes back with its count)
        self.evictions += 1
        return slot[0]

    def _age(self) -> None:
        """Halve every count (keys not held whose count reaches 0 are forgotten)."""
        self._lookups = 0
        for part in (self._window, self._main):
            for slot in part.values():
                slot[1] //= 2
        self._counts = {k: c // 2 for k, c in self._counts.items() if c > 1}

    def set_capacity(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"the eager cache capacity must be a positive integer, got {capacity!r}")
        with self._lock:
            self._size(capacity)
            dropped = self._evict()
        del dropped

    def clear(self) -> None:
        """Drop every entry and zero the statistics."""
        with self._lock:
            dropped = (self._window, self._main)
            self._window, self._main = collections.OrderedDict(), collections.OrderedDict()
            self._counts = {}
            self._lookups = 0
            self.hits = self.misses = self.compiles = self.cpu_routes = self.evictions = 0
            self.scalar_kinds = self.value_keyed = 0
            self.compile_seconds = 0.0
        del dropped

    def entries(self) -> list:
        """(key, entry) of every entry held: the main part's, then the window's, least recent first."""
        with self._lock:
            return [(k, slot[0]) for part in (self._main, self._window) for k, slot in part.items()]

    def stats(self) -> EagerCacheStats:
        with self._lock:
            return EagerCacheStats(self.hits, self.misses, self.compiles, self.cpu_routes, self.evictions,
                                   len(self._main) + len(self._window), self.capacity, self.compile_seconds,
                                   self.scalar_kinds, self.value_keyed)


CACHE = EagerCache(_capacity_from_env())
