"""A failed operation's outputs are never read as if it had run, by any stream (issue 29).

An out-of-range gather (embedding, index_select) fails on a side stream. Its output was never
written. Whatever reads it fails, naming the original failure (an IndexError with op, value and
bound): the default stream after ``wait_stream(side)`` or ``wait_event`` (the wait fails, and so
does everything behind it on that stream), the default stream with no wait at all (the read
itself fails: its footprint reads memory the failed gather was to write), another thread, another
device waiting on the side stream's event, and host reads (``.item()``, ``.cpu()``, the CPU
fallback), which raise to their caller. ``torch.spyre.clear_errors()`` forgets the failure: the
streams run again, and an event recorded behind it then reports done and synchronizes alike.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from conftest import run_in_threads
from spyre_runtime.queue import StreamError

ROWS, BAD = 10, 50


def _embedding(idx, w):
    return F.embedding(idx, w)


def _index_select(idx, w):
    return torch.index_select(w, 0, idx)


GATHERS = [pytest.param(_embedding, id="embedding"), pytest.param(_index_select, id="index_select")]


@pytest.fixture(params=[False, True], ids=["default", "strict"])
def strict(request, monkeypatch):
    if request.param:
        monkeypatch.setenv("SPYRE_STRICT", "1")
    return request.param


@pytest.fixture(autouse=True)
def _clean():
    torch.spyre.synchronize()
    yield
    torch.spyre.clear_errors()
    for d in (0, 1):
        try:
            torch.spyre.synchronize(d)
        finally:
            torch.spyre.clear_errors(d)


def _failed_gather_on(side: torch.Stream, gather=_embedding, device: int = 0, width: int = 4) -> torch.Tensor:
    """The output of a gather with an index out of range, run on `side`: never written."""
    w = torch.randn(ROWS, width, device=f"spyre:{device}")
    idx = torch.tensor([1, BAD], device=f"spyre:{device}")
    torch.spyre.synchronize(device)  # the inputs are ready: only the gather can fail
    with torch.spyre.stream(side):
        return gather(idx, w)


def _names_the_gather(error: BaseException) -> None:
    assert isinstance(error, StreamError) and isinstance(error, IndexError), repr(error)
    assert (error.value, error.bound) == (BAD, ROWS), str(error)
    assert f"index {BAD} is out of bounds for size {ROWS}" in str(error)


def _works_again() -> None:
    torch.spyre.clear_errors()
    x = torch.arange(6.0, device="spyre")
    assert (x * 2).sum().item() == 30.0
    torch.spyre.synchronize()


@pytest.mark.parametrize("gather", GATHERS)
@pytest.mark.parametrize("wait", ["wait_stream", "wait_event", "no wait"])
def test_the_default_stream_never_reads_a_failed_gather_of_a_side_stream(strict, gather, wait):
    side = torch.spyre.Stream()
    out = _failed_gather_on(side, gather)
    current = torch.spyre.current_stream()
    if wait == "wait_stream":
        current.wait_stream(side)
    elif wait == "wait_event":
        current.wait_event(side.record_event())
    with pytest.raises(IndexError) as info:
        out.sum().item()
    _names_the_gather(info.value)
    with pytest.raises(IndexError) as info:
        current.synchronize()  # the read failed on the default stream: its error is sticky there
    _names_the_gather(info.value)
    with pytest.raises(IndexError):
        torch.spyre.synchronize()
    _works_again()


def test_an_event_behind_a_failure_raises_from_query_and_synchronize_alike_until_cleared():
    """query() does not say done while synchronize() raises; after clear_errors() both say done.
    An event recorded before the failure covers none of it: waiting on it is fine."""
    side = torch.spyre.Stream()
    before = side.record_event()
    _failed_gather_on(side)
    event = side.record_event()
    torch.spyre.current_stream().wait_event(before)
    assert (torch.ones(3, device="spyre") * 2).sum().item() == 6.0
    with pytest.raises(IndexError) as info:
        event.synchronize()
    _names_the_gather(info.value)
    with pytest.raises(IndexError):
        event.query()
    torch.spyre.clear_errors()
    assert event.query() is True
    event.synchronize()
    # and a stream that waits on it now goes on
    torch.spyre.current_stream().wait_event(event)
    assert (torch.ones(3, device="spyre") * 2).sum().item() == 6.0


def test_host_reads_of_a_failed_output_raise_to_their_caller_and_the_stream_goes_on():
    """item(), a blocking copy to the CPU (dense and strided) and the CPU fallback read the
    device bytes on the calling thread: each raises, naming the gather, without reading them;
    the caller is told at once, so the default stream is not stopped."""
    side = torch.spyre.Stream()
    out = _failed_gather_on(side)
    reads = [lambda: out[0, 0].item(), lambda: out.cpu(), lambda: out.t().cpu()]
    for read in reads:
        with pytest.raises(IndexError) as info:
            read()
        _names_the_gather(info.value)
    with pytest.warns(UserWarning, match="lgamma"), pytest.raises(IndexError) as info:
        torch.lgamma(out)  # an op without a spyre kernel: the CPU fallback over the device bytes
    _names_the_gather(info.value)
    assert torch.spyre.current_stream().query()  # not stopped
    assert (torch.ones(3, device="spyre") * 2).sum().item() == 6.0


def test_a_device_copy_of_a_failed_output_is_never_written_either(strict):
    """A copy on the default stream reads what the failed gather was to write: it fails, so its
    destination is never written, and reading the destination fails, naming the gather."""
    side = torch.spyre.Stream()
    out = _failed_gather_on(side)
    copy = torch.empty_like(out)
    copy.copy_(out)
    with pytest.raises(IndexError) as info:
        copy.cpu()
    _names_the_gather(info.value)


def test_a_copy_skipped_on_the_failed_stream_is_never_read_either():
    """A non-blocking copy to the device behind the failure on the side stream is skipped: its
    destination was never written, and reading it on the default stream fails, naming the gather."""
    side = torch.spyre.Stream()
    target = torch.zeros(8, device="spyre")
    _failed_gather_on(side)
    with torch.spyre.stream(side):
        target.copy_(torch.arange(8.0).pin_memory(), non_blocking=True)
    with pytest.raises(IndexError) as info:
        target.cpu()
    _names_the_gather(info.value)


def test_a_blocking_copy_refused_on_the_failed_stream_does_not_clear_its_destination():
    """A blocking copy into the failed output, on the failed stream, raises and writes nothing: the
    output is still never written, and a read on the default stream still fails."""
    side = torch.spyre.Stream()
    out = _failed_gather_on(side)
    with torch.spyre.stream(side), pytest.raises(IndexError):
        out.copy_(torch.ones(2, 4))
    with pytest.raises(IndexError) as info:
        out.cpu()
    _names_the_gather(info.value)


def test_another_thread_never_reads_a_failed_output(strict):
    side = torch.spyre.Stream()
    out = _failed_gather_on(side)
    seen = []

    def read(_):
        try:
            seen.append(out.sum(0).cpu())
        except IndexError as e:
            seen.append(e)

    run_in_threads(read, 2)
    assert len(seen) == 2
    for e in seen:
        _names_the_gather(e)


def test_a_wait_on_another_device_for_a_failed_stream_fails_there_too():
    """spyre:1 waits on an event recorded behind the failure on spyre:0: the wait fails on
    spyre:1, naming the gather, and nothing behind it runs as if the gather had run."""
    side = torch.spyre.Stream(device=0)
    _failed_gather_on(side)
    event = side.record_event()
    later = torch.zeros(4, device="spyre:1")
    on_1 = torch.spyre.current_stream(1)
    on_1.wait_event(event)
    later.fill_(7.0)
    with pytest.raises(IndexError) as info:
        on_1.synchronize()
    _names_the_gather(info.value)
    torch.spyre.clear_errors(1)
    assert torch.equal(later.cpu(), torch.zeros(4))  # the fill behind the failed wait never ran


def test_other_streams_keep_working_after_a_failure():
    """The failure stops the side stream only: the default stream makes and computes new tensors
    without clear_errors() (torch.arange grows a fresh out= tensor, and growing one waited for
    the whole device, raising the side stream's error)."""
    side = torch.spyre.Stream()
    _failed_gather_on(side)
    with pytest.raises(IndexError):
        side.synchronize()
    x = torch.arange(6.0, device="spyre")
    assert (x * 2).sum().item() == 30.0
    assert torch.spyre.current_stream().query()


def test_a_failed_output_freed_and_its_block_handed_out_again_reads_fine():
    """Its memory is poisoned only while it is the failed output's: a tensor handed the same block
    after it is freed holds new bytes, and a compute writing it makes them readable, with no
    clear_errors() in between (the side stream's own error stays until then)."""
    side = torch.spyre.Stream()
    width = 1000  # an unusual size, so that the freed block is the one a tensor of that size gets
    src = torch.arange(2.0 * width, device="spyre").reshape(2, width)
    out = _failed_gather_on(side, width=width)
    probe = torch.spyre.Stream()
    with torch.spyre.stream(probe):
        out * 1  # (a host read would keep `out` alive: its error's traceback holds the copy's frame)
    with pytest.raises(IndexError):
        probe.synchronize()  # it is poisoned
    ptr = out.data_ptr()
    out.record_stream(side)  # used on side as well: freed once side's work is done (skipped)
    del out
    gc.collect()
    with pytest.raises(IndexError):
        side.synchronize()
    nbytes = 2 * width * 4

    def on_the_freed_bytes(t):
        return t.data_ptr() < ptr + nbytes and ptr < t.data_ptr() + nbytes

    # (the freed block may have merged with a free neighbour: what matters is a tensor handed
    # any of its bytes; earlier tests leave other holes the allocator may fill first)
    taken = []
    while len(taken) < 4096 and (not taken or not on_the_freed_bytes(taken[-1])):
        taken.append(torch.empty(2, width, device="spyre"))
    fresh = taken[-1]
    assert on_the_freed_bytes(fresh)  # (else this test shows nothing)
    torch.mul(src, 2, out=fresh)  # (a compute's writes alone do not clear poison: see the queue layer)
    assert torch.equal(fresh.cpu(), torch.arange(2.0 * width).reshape(2, width) * 2)


def test_an_in_place_update_of_a_failed_output_does_not_launder_it(strict):
    """A compiled kernel that updates a failed output in place and computes another value from it
    reads it (an inout argument): it fails, and the other value is not garbage read back."""
    side = torch.spyre.Stream()
    out = _failed_gather_on(side)

    @torch.compile
    def bump_and_double(x):
        x.add_(1.0)
        return x * 2

    doubled = bump_and_double(out)
    with pytest.raises(IndexError) as info:
        doubled.cpu()
    _names_the_gather(info.value)
    torch.spyre.clear_errors()
