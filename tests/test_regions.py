"""Device memory in regions: sub-allocation, the handle budget (PF/VF), describe()."""

import gc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_in_threads, run_python

STICK = 128
GIB = 1 << 30
DEVICE = 2  # no other test uses device 2 (tests/conftest.py): it is empty between tests


def round_up(n, unit=STICK):
    return (n + unit - 1) // unit * unit


def test_describe_gives_region_offset_length(spyre):
    x = torch.empty(100, device=spyre)
    pieces = torch.spyre.describe(x)
    assert len(pieces) == 1
    region, offset, length = pieces[0]
    assert (pieces[0].region, pieces[0].offset, pieces[0].length) == (region, offset, length)
    assert length == round_up(400) and offset % STICK == 0
    assert torch.spyre.describe(x[10:]) == pieces  # a view describes its storage's allocation
    assert torch.spyre.describe(x.untyped_storage()) == pieces
    assert torch.spyre.describe(torch.empty(0, device=spyre)) == []


def test_describe_rejects_what_is_not_spyre():
    with pytest.raises(TypeError, match="spyre tensor or storage, got Tensor on cpu"):
        torch.spyre.describe(torch.ones(2))


def test_small_tensors_share_one_region():
    gc.collect()
    torch.spyre.empty_cache()
    ts = [torch.empty(16, device=f"spyre:{DEVICE}") for _ in range(500)]
    regions = {torch.spyre.describe(t)[0].region for t in ts}
    assert len(regions) == 1
    assert torch.spyre.memory_stats(DEVICE)["regions.current"] == 1
    del ts


def test_freed_blocks_coalesce_and_empty_cache_returns_regions():
    gc.collect()
    torch.spyre.empty_cache()
    d = f"spyre:{DEVICE}"
    a, b, c = (torch.empty(1 << 18, dtype=torch.uint8, device=d) for _ in range(3))
    first = torch.spyre.describe(a)[0]
    del a, b  # two neighbours: one free range of twice the size
    both = torch.empty(2 << 18, dtype=torch.uint8, device=d)
    assert torch.spyre.describe(both)[0].offset == first.offset
    del both, c
    stats = torch.spyre.memory_stats(DEVICE)
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["regions.current"] == 1  # cached until asked
    torch.spyre.empty_cache()
    stats = torch.spyre.memory_stats(DEVICE)
    assert stats["regions.current"] == 0 and stats["reserved_bytes.all.current"] == 0


def test_a_large_request_gets_a_region_of_its_own_size():
    torch.spyre.empty_cache()
    min_region = torch.spyre.memory_stats(DEVICE)["regions.min_bytes"]
    big = torch.empty(min_region + 5, dtype=torch.uint8, device=f"spyre:{DEVICE}")
    (region,) = torch.spyre.memory_regions(DEVICE)
    assert region.size == round_up(min_region + 5, 2 << 20) and region.live_blocks == 1
    del big
    torch.spyre.empty_cache()


def test_two_devices_keep_separate_regions_and_statistics():
    gc.collect()
    torch.spyre.empty_cache()
    before0 = torch.spyre.memory_stats(0)
    x = torch.empty(1000, device=f"spyre:{DEVICE}")
    after0 = torch.spyre.memory_stats(0)
    assert after0["regions.current"] == before0["regions.current"]
    assert after0["allocated_bytes.all.current"] == before0["allocated_bytes.all.current"]
    assert torch.spyre.memory_stats(DEVICE)["regions.current"] == 1
    del x


def test_statistics_report_fragmentation():
    gc.collect()
    torch.spyre.empty_cache()
    d = f"spyre:{DEVICE}"
    ts = [torch.empty(1 << 16, dtype=torch.uint8, device=d) for _ in range(8)]
    del ts[1::2]  # holes between live blocks
    stats = torch.spyre.memory_stats(DEVICE)
    assert 0.0 < stats["fragmentation"] < 1.0
    assert stats["regions.free_bytes"] == stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    del ts


# A step is ("alloc", nbytes) or ("free", index into the live list).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.one_of(st.integers(0, 300), st.integers(0, 4 << 20))),
        st.tuples(st.just("free"), st.integers(0, 1000)),
    ),
    max_size=60,
)


# 15 sequences in the default tier (each example empties the cache and collects garbage: about 4 s
# apiece late in a full session), 60 more in the slow one.
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_random_alloc_free_sequences_keep_every_invariant(sequence):
    _keeps_every_invariant(sequence)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_many_random_alloc_free_sequences_keep_every_invariant(sequence):
    _keeps_every_invariant(sequence)


def _keeps_every_invariant(sequence):
    gc.collect()
    torch.spyre.empty_cache()
    d = torch.device("spyre", DEVICE)
    base = torch.spyre.memory_stats(DEVICE)
    assert base["allocated_bytes.all.current"] == 0 and base["regions.current"] == 0
    min_region = base["regions.min_bytes"]
    live: list[torch.Tensor] = []
    for kind, value in sequence:
        if kind == "alloc":
            live.append(torch.empty(value, dtype=torch.uint8, device=d))
        elif live:
            live.pop(value % len(live))
        regions = {r.handle: r for r in torch.spyre.memory_regions(DEVICE)}
        pieces = [p for t in live if t.numel() > 0 for p in torch.spyre.describe(t)]
        assert all(t.numel() == 0 or t.data_ptr() % STICK == 0 for t in live)
        for p in pieces:
            assert p.offset % STICK == 0 and p.length % STICK == 0
            assert p.region in regions and p.offset + p.length <= regions[p.region].size
        by_region = sorted((p.region, p.offset, p.length) for p in pieces)
        for (r1, o1, l1), (r2, o2, _) in zip(by_region, by_region[1:]):
            assert r1 != r2 or o1 + l1 <= o2, "two live blocks overlap"
        stats = torch.spyre.memory_stats(DEVICE)
        expected = sum(round_up(t.numel()) for t in live if t.numel() > 0)
        assert stats["allocated_bytes.all.current"] == expected
        assert stats["allocation.all.current"] == sum(1 for t in live if t.numel() > 0)
        assert stats["reserved_bytes.all.current"] == sum(r.size for r in regions.values())
        # Live bytes never exceed 60 x 4 MiB, far below one region: freed
        # space is reused instead of growing the reservation.
        assert stats["reserved_bytes.all.peak"] <= 2 * min_region
    live.clear()
    stats = torch.spyre.memory_stats(DEVICE)
    assert stats["allocated_bytes.all.current"] == 0 and stats["allocation.all.current"] == 0
    torch.spyre.empty_cache()
    assert torch.spyre.memory_stats(DEVICE)["reserved_bytes.all.current"] == 0


VF = dict(SPYRE_MODE="vf", SPYRE_NUM_DEVICES=1)


def test_vf_mode_fits_2000_small_tensors_in_its_budget():
    result = run_python(
        "import torch\n"
        "ts = [torch.empty(64, device='spyre') for _ in range(2000)]\n"
        "s = torch.spyre.memory_stats()\n"
        "print(s['mode'], s['regions.budget'], s['regions.current'], len({torch.spyre.describe(t)[0].region for t in ts}))\n",
        **VF,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["vf", "16", "1", "1"]


def test_vf_budget_exhaustion_is_reported_and_recoverable():
    result = run_python(
        "import torch\n"
        f"GIB = {GIB}\n"
        "held = [torch.empty(5 * GIB, dtype=torch.uint8, device='spyre') for _ in range(16)]\n"
        "assert torch.spyre.memory_stats()['regions.current'] == 16\n"
        "try:\n"
        "    torch.empty(4 * GIB, dtype=torch.uint8, device='spyre')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print(e)\n"
        "allocated = torch.spyre.memory_allocated()\n"
        "assert allocated == 16 * 5 * GIB, allocated\n"
        "del held[0]\n"
        "x = torch.empty(4 * GIB, dtype=torch.uint8, device='spyre')\n"  # reuses the emptied region
        "del held[0], held[0]\n"
        "retries = torch.spyre.memory_stats()['num_alloc_retries']\n"
        "y = torch.empty(12 * GIB, dtype=torch.uint8, device='spyre')\n"  # needs a handle: unused regions go back
        "print('retries', torch.spyre.memory_stats()['num_alloc_retries'] - retries)\n"
        "print('regions', torch.spyre.memory_stats()['regions.current'])\n",
        **VF,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    oom = lines[0]
    assert "out of memory (vf mode)" in oom
    assert f"tried to allocate {4 * GIB} bytes" in oom
    assert "16 of 16 region handles in use" in oom
    assert "bytes free" in oom
    assert lines[1:] == ["retries 1", "regions 15"]


def test_bad_mode_names_the_variable():
    # A bad value warns and falls back to PF; `import torch` still works (tests/test_reliability_errors.py).
    result = run_python("import torch; print(torch.spyre.memory_stats()['mode'])", SPYRE_MODE="shared")
    assert result.returncode == 0, result.stderr
    assert "SPYRE_MODE='shared' is not 'pf' or 'vf'; using the default pf" in result.stderr
    assert result.stdout.split() == ["pf"]


def test_allocations_and_frees_from_many_threads_keep_statistics_exact():
    gc.collect()
    torch.spyre.empty_cache()
    d = f"spyre:{DEVICE}"

    def churn(seed):
        sizes = [(seed * 7919 + i * 104729) % 50000 + 1 for i in range(400)]
        held = []
        for i, n in enumerate(sizes):
            held.append(torch.empty(n, dtype=torch.uint8, device=d))
            if i % 3 == 2:
                held.pop(0)  # frees interleave with other threads' allocations

    run_in_threads(churn, 4)
    stats = torch.spyre.memory_stats(DEVICE)
    assert stats["allocated_bytes.all.current"] == 0 and stats["allocation.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"]
    torch.spyre.empty_cache()
    assert torch.spyre.memory_stats(DEVICE)["reserved_bytes.all.current"] == 0
