"""Copies that must not lose what a tensor means: conjugate/negative bits, and the storage
a tensor had when a copy was enqueued.

Conjugate and negative views are bits on a tensor. Before, copying one (`x.conj().cpu()`)
recursed between PyTorch's conjugate fallback and our `_copy_from` until the process
crashed. A deferred copy captured tensor objects, so `param.data = other` (Module.to)
between enqueue and run made it copy from the wrong storage.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from spyre_inductor.device import queues
from spyre_runtime.queue import HostCallback


@pytest.fixture
def z():
    return torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))


def test_a_conjugate_view_copies_to_the_host_as_its_values(z):
    assert torch.equal(z.to("spyre").conj().cpu(), z.conj().resolve_conj())


def test_a_negative_view_copies_to_the_host_as_its_values(z):
    assert torch.equal(torch._neg_view(z.to("spyre")).cpu(), -z)


@pytest.mark.parametrize("src_conj,dst_conj", [(True, False), (False, True), (True, True)])
def test_copies_into_spyre_honour_both_tensors_bits(z, src_conj, dst_conj):
    src = z.conj() if src_conj else z
    dst = torch.zeros(4, 3, dtype=torch.complex64).to("spyre")
    if dst_conj:
        dst = dst.conj()
    dst.copy_(src)
    assert torch.equal(dst.resolve_conj().cpu(), src.resolve_conj())


def test_conjugate_views_through_views_clones_and_ops(z):
    d = z.to("spyre")
    assert torch.equal(d.conj().t().cpu(), z.conj().t().resolve_conj())
    assert torch.equal(d.conj().clone().cpu(), z.conj().resolve_conj())
    assert torch.equal(d.conj().conj().cpu(), z)
    assert torch.equal(d.conj().to("spyre:1").cpu(), z.conj().resolve_conj())
    assert torch.allclose((d.conj() * 2).cpu(), z.conj() * 2)  # the op runs on the CPU fallback


def test_a_deferred_copy_reads_the_storage_its_source_had_when_enqueued():
    """Module.to(memory_format=...) makes each weight a strided device copy (run later, on a
    worker) and then swaps the parameter's storage with `param.data = copy`. Before, about
    two of three conversions copied the new storage onto itself: silently wrong weights."""
    for seed in range(6):
        torch.manual_seed(seed)
        m = torch.nn.Conv2d(3, 64, 3, bias=False)
        want = m.weight.detach().clone()
        m.to("spyre").to(memory_format=torch.channels_last)
        assert m.weight.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(m.weight.detach().cpu(), want), f"seed {seed}"


def hold_stream(seconds: float = 0.3) -> None:
    """Hold the current stream for `seconds` (a host callback), so what is enqueued next is
    still pending when the test changes what its tensors refer to."""
    queues.queue(0).enqueue(torch.spyre.current_stream(0).stream_id,
                            HostCallback(lambda: time.sleep(seconds), name="hold"))


def test_a_deferred_copy_to_the_host_writes_the_storage_it_was_given():
    src = torch.arange(12.0).reshape(3, 4).to("spyre").t()  # strided: a deferred host callback
    dst = torch.zeros(4, 3).pin_memory()
    original = dst.detach()  # the memory the copy was given
    hold_stream()
    dst.copy_(src, non_blocking=True)
    dst.data = torch.full((4, 3), -1.0)  # the tensor object moves to other memory at once
    torch.spyre.synchronize()
    assert torch.equal(original, torch.arange(12.0).reshape(3, 4).t())
    assert torch.equal(dst, torch.full((4, 3), -1.0))


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_a_pending_pinned_transfer_keeps_its_host_memory_alive(direction):
    """A non-blocking transfer to or from pinned memory keeps that memory, not the tensor
    object, alive: after `t.data = other` the old pinned block lost its last reference while
    the transfer was pending, and the transfer then wrote into (or read) freed memory."""
    dev = torch.arange(1024.0).to("spyre")
    host = torch.arange(1024.0).flip(0).pin_memory()
    address = host.data_ptr()
    gate = threading.Event()
    queues.queue(0).enqueue(torch.spyre.current_stream(0).stream_id,
                            HostCallback(lambda: gate.wait(60), name="gate"))
    if direction == "d2h":
        host.copy_(dev, non_blocking=True)
    else:
        dev.copy_(host, non_blocking=True)
    host.data = torch.full((1024,), -1.0)
    gc.collect()
    reused = [v for v in (torch.full((1024,), 5.0).pin_memory() for _ in range(8)) if v.data_ptr() == address]
    gate.set()
    torch.spyre.synchronize()
    assert not reused, "the pending transfer's pinned block was handed to another tensor"
    if direction == "h2d":
        assert torch.equal(dev.cpu(), torch.arange(1024.0).flip(0))


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_a_non_blocking_copy_of_a_view_with_bits_into_pinned_memory(z, view):
    """The destination's values are fixed up on this thread, so such a copy is made blocking:
    before, the fix ran first and the pending transfer then wrote the unconjugated values."""
    d = z.to("spyre")
    src, want = (d.conj(), z.conj().resolve_conj()) if view == "conj" else (torch._neg_view(d), -z)
    dst = torch.empty(4, 3, dtype=torch.complex64).pin_memory()
    hold_stream()
    dst.copy_(src, non_blocking=True)
    torch.spyre.synchronize()
    assert torch.equal(dst, want)


@pytest.mark.parametrize("op", ["cpu", "copy from host", "copy on device", "fallback op", "strided view"])
@pytest.mark.parametrize("left", [0, 16])
def test_a_storage_resized_under_a_tensor_is_refused_naming_the_bytes(op, left):
    """Before, a copy of such a tensor failed with an IndexError, or ran a transfer past its
    block (the storage's bytes are fewer than the tensor names), and a CPU-fallback op on it
    crashed the process (as the CPU's own kernels do). Now each is a clear error, and the
    device stays usable."""
    t = torch.ones(16).to("spyre")
    t.untyped_storage().resize_(left)
    run = {
        "cpu": lambda: t.cpu(),
        "copy from host": lambda: t.copy_(torch.zeros(16)),
        "copy on device": lambda: t.copy_(torch.zeros(16).to("spyre")),
        "fallback op": lambda: t + 1,
        "strided view": lambda: t[::2].cpu(),
    }[op]
    with pytest.raises(RuntimeError, match=r"(was the storage resized under it\?|out of bounds)"):
        run()
    assert torch.equal((torch.ones(4).to("spyre") + 1).cpu(), torch.full((4,), 2.0))
    torch.spyre.synchronize()
