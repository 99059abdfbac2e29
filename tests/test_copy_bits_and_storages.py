"""Copies that must not lose what a tensor means: conjugate/negative bits, and the storage
a tensor had when a copy was enqueued.

Conjugate and negative views are bits on a tensor. Before, copying one (`x.conj().cpu()`)
recursed between PyTorch's conjugate fallback and our `_copy_from` until the process
crashed. A deferred copy captured tensor objects, so `param.data = other` (Module.to)
between enqueue and run made it copy from the wrong storage.
"""

from __future__ import annotations

import pytest
import torch


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
    dst = torch.zeros(4, 3, dtype=torch.complex64, device="spyre")
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
    with pytest.warns(UserWarning):  # the op itself runs on the CPU fallback
        assert torch.allclose((d.conj() * 2).cpu(), z.conj() * 2)


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


def test_a_deferred_copy_to_the_host_writes_the_storage_it_was_given():
    src = torch.arange(12.0).reshape(3, 4).to("spyre").t()  # strided: a deferred host callback
    dst = torch.zeros(4, 3).pin_memory()
    original = dst.detach()  # the memory the copy was given
    dst.copy_(src, non_blocking=True)
    dst.data = torch.full((4, 3), -1.0)  # the tensor object moves to other memory at once
    torch.spyre.synchronize()
    assert torch.equal(original, torch.arange(12.0).reshape(3, 4).t())
    assert torch.equal(dst, torch.full((4, 3), -1.0))


@pytest.mark.parametrize("op", ["cpu", "copy from host", "copy on device", "fallback op", "strided view"])
@pytest.mark.parametrize("left", [0, 16])
def test_a_storage_resized_under_a_tensor_is_refused_naming_the_bytes(op, left):
    """Before, a copy of such a tensor failed with an IndexError, or ran a transfer past its
    block (the storage's bytes are fewer than the tensor names), and a CPU-fallback op on it
    crashed the process (as the CPU's own kernels do). Now each is a clear error, and the
    device stays usable."""
    t = torch.ones(16, device="spyre")
    t.untyped_storage().resize_(left)
    run = {
        "cpu": lambda: t.cpu(),
        "copy from host": lambda: t.copy_(torch.zeros(16)),
        "copy on device": lambda: t.copy_(torch.zeros(16, device="spyre")),
        "fallback op": lambda: t + 1,
        "strided view": lambda: t[::2].cpu(),
    }[op]
    with pytest.raises(RuntimeError, match=r"(was the storage resized under it\?|out of bounds)"):
        run()
    assert torch.equal((torch.ones(4, device="spyre") + 1).cpu(), torch.full((4,), 2.0))
    torch.spyre.synchronize()
