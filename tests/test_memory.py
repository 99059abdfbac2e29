"""Device memory accounting: exact statistics, reuse, and errors that lose nothing."""

import gc

import pytest
import torch

STICK = 128


def fresh_counts(device=0):
    gc.collect()
    torch.spyre.reset_peak_memory_stats(device)
    return torch.spyre.memory_allocated(device)


def test_allocation_is_counted_in_whole_sticks():
    base = fresh_counts()
    x = torch.empty(10, dtype=torch.uint8, device="spyre")  # 10 bytes -> one stick
    assert torch.spyre.memory_allocated() == base + STICK
    stats = torch.spyre.memory_stats()
    assert stats["requested_bytes.all.current"] >= 10
    del x
    assert torch.spyre.memory_allocated() == base


def test_every_allocation_starts_on_a_stick_boundary():
    tensors = [torch.empty(n, dtype=torch.uint8, device="spyre") for n in (1, 3, 129, 1000, 4096)]
    assert all(t.data_ptr() % STICK == 0 for t in tensors)


def test_torch_spyre_and_torch_accelerator_report_the_same_numbers():
    keep = torch.empty(1000, device="spyre")
    assert torch.spyre.memory_allocated() == torch.accelerator.memory_allocated(0)
    assert torch.spyre.memory_reserved() == torch.accelerator.memory_reserved(0)
    assert torch.spyre.max_memory_allocated() == torch.accelerator.max_memory_allocated(0)
    assert torch.spyre.mem_get_info() == torch.accelerator.get_memory_info(0)
    # torch.spyre adds its region keys; every key both have agrees.
    ours, theirs = torch.spyre.memory_stats(), torch.accelerator.memory_stats(0)
    assert {k: ours[k] for k in theirs} == dict(theirs)
    assert ours["regions.current"] == ours["segment.all.current"]
    del keep


def test_peaks_and_counts():
    base = fresh_counts()
    before = torch.spyre.memory_stats()
    a = torch.empty(1024, device="spyre")
    b = torch.empty(1024, device="spyre")
    del a, b
    after = torch.spyre.memory_stats()
    assert torch.spyre.max_memory_allocated() == base + 8192
    assert torch.spyre.memory_allocated() == base
    assert after["allocation.all.allocated"] - before["allocation.all.allocated"] == 2
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == 2
    torch.spyre.reset_peak_memory_stats()
    assert torch.spyre.max_memory_allocated() == base


def test_the_last_view_dying_returns_the_bytes():
    base = fresh_counts()
    x = torch.empty(256, device="spyre")
    view = x[10:20]
    del x
    assert torch.spyre.memory_allocated() == base + 1024
    del view
    assert torch.spyre.memory_allocated() == base


def test_freed_space_is_reused():
    fresh_counts()
    x = torch.empty(1 << 20, device="spyre")
    ptr = x.data_ptr()
    del x
    y = torch.empty(1 << 20, device="spyre")
    assert y.data_ptr() == ptr


def test_mem_get_info_counts_reserved_regions_as_used():
    # As on CUDA: bytes cached by the allocator are not free for the device.
    torch.spyre.synchronize()
    torch.spyre.empty_cache()
    free0, total = torch.spyre.mem_get_info()
    assert total == torch.spyre.get_device_properties().total_memory
    big = torch.spyre.memory_stats()["regions.min_bytes"] + 1  # needs a region of its own
    x = torch.empty(big, dtype=torch.uint8, device="spyre")
    assert torch.spyre.mem_get_info()[0] <= free0 - big
    del x
    assert torch.spyre.mem_get_info()[0] <= free0 - big  # cached, not yet returned
    torch.spyre.empty_cache()
    assert torch.spyre.mem_get_info()[0] == free0


def test_zero_byte_allocations():
    base = fresh_counts()
    ts = [torch.empty(0, device="spyre") for _ in range(10)]
    assert torch.spyre.memory_allocated() == base
    assert all(t.numel() == 0 for t in ts)


def test_many_tiny_allocations():
    base = fresh_counts()
    ts = [torch.empty(1, dtype=torch.uint8, device="spyre") for _ in range(5000)]
    assert torch.spyre.memory_allocated() == base + 5000 * STICK
    assert len({t.data_ptr() for t in ts}) == 5000
    del ts
    assert torch.spyre.memory_allocated() == base


def test_too_large_raises_out_of_memory_and_loses_nothing():
    keep = torch.arange(100.0, device="spyre")
    base = fresh_counts()
    ooms = torch.spyre.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(2**60, dtype=torch.uint8, device="spyre")
    message = str(info.value)
    assert "spyre:0 out of memory" in message
    assert str(2**60) in message and "bytes free" in message
    assert torch.spyre.memory_allocated() == base
    assert torch.spyre.memory_stats()["num_ooms"] == ooms + 1
    assert torch.equal(keep.cpu(), torch.arange(100.0))
    assert torch.ones(3, device="spyre").sum().item() == 3.0


def test_exhausting_the_device_then_recovering():
    gc.collect()
    torch.spyre.empty_cache()
    total = torch.spyre.mem_get_info()[1]
    in_use = torch.spyre.memory_allocated()
    # Untouched device memory costs nothing on the host (MAP_NORESERVE).
    big = torch.empty(total - in_use - (1 << 30), dtype=torch.uint8, device="spyre")
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate 2147483648 bytes"):
        torch.empty(2 << 30, dtype=torch.uint8, device="spyre")
    small = torch.ones(16, device="spyre")  # what is left still serves
    assert small.sum().item() == 16.0
    del big
    again = torch.empty(2 << 30, dtype=torch.uint8, device="spyre")
    assert again.numel() == 2 << 30
    del again
    torch.spyre.empty_cache()


def test_empty_cache_keeps_live_tensors():
    x = torch.arange(8.0, device="spyre")
    torch.spyre.empty_cache()
    assert torch.equal(x.cpu(), torch.arange(8.0))


def test_memory_summary_is_cudas_table_of_memory_stats_with_spyres_regions():
    x = torch.empty(1 << 20, dtype=torch.uint8, device="spyre")
    from spyre_inductor.device.memory import _size

    text = torch.spyre.memory_summary()
    stats = torch.spyre.memory_stats()
    row = next(line for line in text.splitlines() if line.startswith("| Allocated memory"))
    assert row.split("|")[2].strip() == _size(stats["allocated_bytes.all.current"]).strip()
    assert stats["allocated_bytes.all.current"] >= x.nbytes
    assert "from small pool" in text and f"Regions: {stats['regions.current']} of {stats['regions.budget']}" in text
    short = torch.spyre.memory_summary(abbreviated=True)
    assert "from small pool" not in short and "| Allocations " in short
    del x
