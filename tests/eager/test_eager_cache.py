"""The eager cache's bound (spyre_inductor/eager/cache.py): what an evicted entry gives back.

An evicted compiled entry releases its programs' device memory and its module
in Inductor's records, so a key compiled again and again does not pile up.
"""

import pytest
import torch

from spyre_inductor.eager.cache import CACHE


@pytest.fixture
def fresh_cache():
    capacity = CACHE.capacity
    CACHE.clear()
    yield CACHE
    CACHE.set_capacity(capacity)
    CACHE.clear()


def test_an_evicted_entry_gives_back_its_programs_and_its_module(spyre, fresh_cache):
    """Three shapes over a capacity of two: misses compile again; what each evicted entry held
    (its program's image and correction areas on the device, its module in Inductor's
    PyCodeCache) is let go, so neither device memory nor Inductor's modules grow."""
    from torch._inductor.codecache import PyCodeCache

    torch.spyre.set_eager_cache_capacity(2)
    xs = [torch.randn(8, n, device=spyre) for n in (16, 32, 48)]
    for x in xs:
        x * 2.0
    torch.spyre.synchronize()
    memory, modules, evictions = (torch.spyre.memory_allocated(), len(PyCodeCache.modules),
                                  torch.spyre.eager_cache_stats().evictions)
    for i in range(24):
        xs[i % 3] * 2.0
    torch.spyre.synchronize()
    assert torch.spyre.eager_cache_stats().evictions - evictions >= 12  # (recompiles: what this is about)
    assert torch.spyre.memory_allocated() == memory
    assert len(PyCodeCache.modules) == modules
    torch.spyre.eager_cache_clear()
    torch.spyre.synchronize()
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
