"""Device memory stays right and reachable over a long run.

Pins three faults:

* the runtime's cache of "which region holds this storage" must not outlive
  the region: after empty_cache() or the allocator's out-of-memory retry
  (both release cached regions), a new storage at the same address and size
  lives in a NEW region and must be described by its new handle;
* in VF mode (16 region handles) the last handle must take what is left of
  the device's address space, not a region just big enough for the request,
  or the rest of the card can never be reached;
* kernel reports are kept in a bounded window of the most recent launches,
  not one per launch for the life of the process.
"""

import gc

import pytest
import torch

from conftest import run_python

from spyre_runtime import tensors

GIB = 1 << 30
MIB = 1 << 20
DEVICE = 1  # the other tests leave device 1 empty between tests
VF = dict(SPYRE_MODE="vf", SPYRE_NUM_DEVICES=1)


def cached_pieces(t):
    """What every launch and eager op looks up for each argument: its storage's pieces."""
    return [(r.region, r.offset, r.length) for r in tensors.storage_ranges(t.untyped_storage())]


# ---- region descriptions after regions are released ---------------------------


def test_a_storage_in_a_region_recreated_by_empty_cache_is_described_by_its_new_handle():
    """empty_cache() returns an unused region to the device; the next region may be
    created at the same address. A storage there with the same size as one that
    lived in the old region must get the new region's handle: with the old one, a
    copy into it fails ("no region with handle N") and poisons the stream, and
    footprints name a dead region so hazards against the new one go unseen."""
    d = f"spyre:{DEVICE}"
    gc.collect()
    torch.spyre.empty_cache()
    min_region = torch.spyre.memory_stats(DEVICE)["regions.min_bytes"]
    nbytes = min_region  # needs a region of its own: nothing cached can hold it
    a = torch.empty(nbytes, dtype=torch.uint8, device=d)
    (old,) = torch.spyre.describe(a)
    assert cached_pieces(a) == [tuple(old)]
    address = a.data_ptr()
    del a
    torch.spyre.empty_cache()  # the region is released; its handle is dead
    assert old.region not in {r.handle for r in torch.spyre.memory_regions(DEVICE)}

    b = torch.empty(nbytes, dtype=torch.uint8, device=d)
    (new,) = torch.spyre.describe(b)
    assert b.data_ptr() == address and new.region != old.region  # the case under test
    assert cached_pieces(b) == [tuple(new)]
    assert tensors.address(b).region == new.region

    b[:4096].copy_(torch.full((4096,), 7, dtype=torch.uint8))
    torch.spyre.synchronize(DEVICE)  # the default stream is not left in error
    assert b[:4096].cpu().eq(7).all()
    del b
    torch.spyre.empty_cache()


def test_a_region_released_by_the_out_of_memory_retry_is_not_described_by_its_old_handle():
    """The other way a region is released: an allocation that finds no room (no
    handle left, no address space) makes the allocator release unused regions and
    retry. Here, in VF mode: 14 full regions, a small tensor in region 15, freed;
    a 16 GiB tensor cannot fit until region 15 goes back, so the retry releases it
    and creates region 16 at the same address. A small tensor of the first one's
    size then lands at that address in region 16, and must be described so."""
    result = run_python(
        "import torch\n"
        "from spyre_runtime import tensors\n"
        f"GIB, MIB = {GIB}, {MIB}\n"
        "held = [torch.empty(8 * GIB, dtype=torch.uint8, device='spyre') for _ in range(14)]\n"
        "x = torch.empty(MIB, dtype=torch.uint8, device='spyre')\n"
        "(old,) = tensors.storage_ranges(x.untyped_storage())\n"
        "address = x.data_ptr()\n"
        "del x\n"
        "retries = torch.spyre.memory_stats()['num_alloc_retries']\n"
        "big = torch.empty(16 * GIB, dtype=torch.uint8, device='spyre')\n"
        "assert torch.spyre.memory_stats()['num_alloc_retries'] == retries + 1\n"
        "del big\n"
        "y = torch.empty(MIB, dtype=torch.uint8, device='spyre')\n"
        "(new,) = torch.spyre.describe(y)\n"
        "assert y.data_ptr() == address and new.region != old.region, (old, new)\n"
        "assert tensors.storage_ranges(y.untyped_storage())[0].region == new.region, (old, new)\n"
        "y.copy_(torch.full((MIB,), 3, dtype=torch.uint8))\n"
        "torch.spyre.synchronize()\n"
        "assert y.cpu().eq(3).all()\n"
        "print('ok')\n",
        **VF,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok"]


# ---- the last region handle --------------------------------------------------------


def test_the_last_vf_handle_takes_the_rest_of_the_card():
    """VF mode: 16 handles over 128 GiB, 8 GiB regions by default. A 12 GiB tensor
    and fourteen 8 GiB ones use 124 GiB in 15 regions. The 16th (last) handle must
    cover the remaining 4 GiB even though its first request is 1 MiB; otherwise the
    rest of the card is unreachable for the life of the process."""
    result = run_python(
        "import torch\n"
        f"GIB, MIB = {GIB}, {MIB}\n"
        "held = [torch.empty(12 * GIB, dtype=torch.uint8, device='spyre')]\n"
        "held += [torch.empty(8 * GIB, dtype=torch.uint8, device='spyre') for _ in range(14)]\n"
        "held.append(torch.empty(MIB, dtype=torch.uint8, device='spyre'))\n"
        "s = torch.spyre.memory_stats()\n"
        "assert (s['regions.current'], s['regions.budget']) == (16, 16), s\n"
        "print('last region', torch.spyre.memory_regions()[-1].size)\n"
        "held.append(torch.empty(4 * GIB - MIB, dtype=torch.uint8, device='spyre'))\n"
        "print('free', torch.spyre.mem_get_info()[0], torch.spyre.memory_stats()['regions.free_bytes'])\n",
        **VF,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"last region {4 * GIB}", "free 0 0"]


def test_a_region_made_near_the_end_of_the_card_takes_what_is_left():
    """Near the end of the address space a region of the usual size no longer fits.
    The region made instead must take what is left (up to the usual size), not just
    the request: with two handles left and 4 GiB free, two 1 MiB regions would leave
    4 GiB - 2 MiB unreachable."""
    result = run_python(
        "import torch\n"
        f"GIB, MIB = {GIB}, {MIB}\n"
        "held = [torch.empty(20 * GIB, dtype=torch.uint8, device='spyre')]\n"
        "held += [torch.empty(8 * GIB, dtype=torch.uint8, device='spyre') for _ in range(13)]\n"
        "assert torch.spyre.memory_stats()['regions.current'] == 14\n"
        "held.append(torch.empty(MIB, dtype=torch.uint8, device='spyre'))\n"
        "held.append(torch.empty(MIB, dtype=torch.uint8, device='spyre'))\n"
        "held.append(torch.empty(4 * GIB - 2 * MIB, dtype=torch.uint8, device='spyre'))\n"
        "print(torch.spyre.memory_stats()['regions.current'], torch.spyre.memory_regions()[-1].size)\n",
        **VF,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["15", str(4 * GIB)]


# ---- kernel reports ------------------------------------------------------------------


@pytest.fixture
def report_window():
    from spyre_runtime.program import run

    before = run.kernel_report_window()
    yield run
    run.set_kernel_report_window(before)
    run.reset_kernel_reports()


def _fake_launches(run, names):
    # What ProgramExecutable.run does after each launch (from a worker thread).
    for name in names:
        run._reports.append(name)


def test_kernel_reports_keep_a_bounded_window_of_the_newest(report_window):
    """Every launch appends a report (about 11 KB each). Kept without bound they
    grow by ~11 MB per 1,000 launches; only the most recent window is kept."""
    run = report_window
    run.reset_kernel_reports()
    window = run.kernel_report_window()
    assert window == run.DEFAULT_KERNEL_REPORT_WINDOW == torch.spyre.kernel_report_window()
    _fake_launches(run, range(window + 500))
    reports = torch.spyre.kernel_reports()
    assert len(reports) == window
    assert reports == list(range(500, window + 500))  # oldest first, newest kept


def test_the_kernel_report_window_is_settable_and_keeps_the_newest(report_window):
    """torch.spyre.set_kernel_report_window(n) resizes the window in place: the newest
    reports already kept survive a shrink; None keeps every report (unbounded)."""
    run = report_window
    run.reset_kernel_reports()
    _fake_launches(run, range(10))
    torch.spyre.set_kernel_report_window(3)
    assert torch.spyre.kernel_report_window() == 3
    assert torch.spyre.kernel_reports() == [7, 8, 9]
    _fake_launches(run, [10])
    assert torch.spyre.kernel_reports() == [8, 9, 10]
    torch.spyre.set_kernel_report_window(None)
    _fake_launches(run, range(11, 5000))
    assert len(torch.spyre.kernel_reports()) == 4992
    for bad in (0, -1, 2.5, "10"):
        with pytest.raises((ValueError, TypeError), match="window"):
            torch.spyre.set_kernel_report_window(bad)


def test_real_launches_land_in_the_window(report_window):
    """The reports of actual program launches go through the same bounded window."""
    from spyre_runtime.direct import run_program
    from spyre_authoring.handwritten import vector_add

    run = report_window
    run.reset_kernel_reports()
    torch.spyre.set_kernel_report_window(2)
    for _ in range(4):
        run_program(vector_add(4096, "fp32"), x=torch.randn(4096), y=torch.randn(4096))
    torch.spyre.synchronize()
    reports = torch.spyre.kernel_reports()
    assert [r.name for r in reports] == ["vector_add_fp32_4096"] * 2
