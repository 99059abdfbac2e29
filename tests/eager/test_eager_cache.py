"""The eager cache's bound (spyre_inductor/eager/cache.py): which entries stay, and what an evicted one gives back.

The policy is W-TinyLFU: a new entry joins the cache's main part only by
displacing a resident asked for less often, so a scan of keys used once, or a
cycle of keys wider than the cache, cannot flush the keys in use (under plain
LRU both leave nothing: 0 hits). An evicted compiled entry releases its
programs' device memory and its module in Inductor's records, so a key
compiled again and again does not pile up either.
"""

import gc

import pytest
import torch

from spyre_inductor.eager.cache import CACHE, EagerCache


def _use(cache: EagerCache, key) -> bool:
    """Look `key` up as the eager kernel does, caching a new entry on a miss; True on a hit."""
    if cache.get(key) is not None:
        return True
    cache.put(key, object(), kind="cpu")
    return False


def test_a_hot_key_survives_a_scan_of_keys_used_once():
    cache = EagerCache(8)
    for _ in range(4):
        _use(cache, "hot")
    for k in range(7):
        _use(cache, ("warm", k))  # the cache is full
    for k in range(40):
        assert not _use(cache, ("scan", k))
    assert _use(cache, "hot")
    stats = cache.stats()
    assert stats.entries == 8 and stats.evictions == 40  # each scanned key was evicted in its turn


def test_a_cycle_of_twenty_keys_over_eight_entries_keeps_seven_hitting():
    cache = EagerCache(8)
    hits = [sum(_use(cache, k) for k in range(20)) for _ in range(6)]
    # LRU: [0, 0, 0, 0, 0, 0]. The first cycle fills the cache; from the second on the main part
    # (7 entries) stays, and the window (1) takes the keys that miss.
    assert hits == [0, 7, 7, 7, 7, 7]
    stats = cache.stats()
    assert stats.evictions == stats.misses - 8 and stats.entries == 8


def test_keys_that_stop_being_used_give_way_to_new_ones():
    """Counts are halved every 10 lookups per entry: a former working set is not kept for ever."""
    cache = EagerCache(4)
    for _ in range(60):
        for k in range(4):
            _use(cache, ("old", k))
    for _ in range(30):  # (fewer uses than the old keys had: without aging they would never get in)
        for k in range(4):
            _use(cache, ("new", k))
    assert all(_use(cache, ("new", k)) for k in range(4))


def test_an_evicted_entry_gives_back_its_programs_and_its_module(spyre, fresh_cache):
    """Three shapes over a capacity of two: misses compile again; what each evicted entry held
    (its program's image and correction areas on the device, its module in Inductor's
    PyCodeCache) is let go, so neither device memory nor Inductor's modules grow."""
    from torch._inductor.codecache import PyCodeCache

    def settled():
        # (what earlier tests left unreachable is released by the collector, whenever it runs:
        # collected here, so that only this test's evictions move the numbers)
        gc.collect()
        torch.spyre.synchronize()

    torch.spyre.set_eager_cache_capacity(2)
    xs = [torch.randn(8, n, device=spyre) for n in (16, 32, 48)]
    for x in xs:
        x * 2.0
    settled()
    memory, modules, evictions = (torch.spyre.memory_allocated(), len(PyCodeCache.modules),
                                  torch.spyre.eager_cache_stats().evictions)
    for i in range(24):
        xs[i % 3] * 2.0
    settled()
    assert torch.spyre.eager_cache_stats().evictions - evictions >= 12  # (recompiles: what this is about)
    assert torch.spyre.memory_allocated() == memory
    assert len(PyCodeCache.modules) == modules
    torch.spyre.eager_cache_clear()
    settled()
    assert len(PyCodeCache.modules) == modules - 2
    assert torch.spyre.memory_allocated() < memory


def test_an_evicted_entry_still_running_on_another_thread_finishes_on_its_programs(spyre, fresh_cache):
    """Eviction lets go of an entry only once no call runs it: here the call holds it while the
    cache drops it, and its launch still finds its plan."""
    from torch._inductor.codecache import PyCodeCache

    from spyre_inductor.eager.launch import CompiledEntry

    x = torch.randn(8, 16, device=spyre)
    x * 2.0
    ((key, entry),) = [(k, e) for k, e in CACHE.entries() if isinstance(e, CompiledEntry)]
    CACHE.clear()  # as an eviction by another thread would, between this call's lookup and its launch
    modules = len(PyCodeCache.modules)
    sig = key[0]
    out = entry.run(sig, sig.bind((x, 3.0), {}), (x, 3.0), {})  # (the kernel's call, after its lookup)
    torch.testing.assert_close(out.cpu(), x.cpu() * 3.0)
    del entry
    assert len(PyCodeCache.modules) == modules - 1  # let go once the call is done
