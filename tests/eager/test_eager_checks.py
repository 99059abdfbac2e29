"""Eager spyre ops refuse what the CPU (and CUDA) refuse, in PyTorch's words, naming the op called.

The compile-backed eager kernels trace an op's Inductor decomposition on fake tensors; fakes and
decompositions check less than the CPU kernels do (a negative index that aten.index would wrap,
an output whose shape depends on the data, operands of two dtypes, a tensor on another device),
and a program's own errors would name the decomposition's ops. Each case here is run against
the CPU, under SPYRE_STRICT=1 and without.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from spyre_inductor.device.fallback import SpyreFallbackWarning


@pytest.fixture(params=[False, True], ids=["lenient", "strict"])
def is_strict(request, monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1" if request.param else "0")
    return request.param


def _cpu_error(fn, *tensors):
    with pytest.raises(Exception) as e:  # noqa: PT011 - the CPU's own type and words, compared below
        fn(*tensors)
    return e.value


# ---- indices: the CPU refuses -1 where aten.index would wrap it -----------------------------------

_INDEX_OPS = {
    "aten.index_select.default": lambda x, i, s: torch.index_select(x, 0, i),
    "aten.index_copy_.default": lambda x, i, s: x.index_copy_(0, i, s),
    "aten.index_add_.default": lambda x, i, s: x.index_add_(0, i, s),
    "aten.index_copy.default": lambda x, i, s: torch.index_copy(x, 0, i, s),
    "aten.index_add.default": lambda x, i, s: torch.index_add(x, 0, i, s, alpha=2),
}


@pytest.mark.parametrize("name", list(_INDEX_OPS))
def test_index_ops_refuse_a_negative_index_naming_the_op_called(spyre, is_strict, name):
    op = _INDEX_OPS[name]
    x, source = torch.arange(12.0).reshape(4, 3), torch.ones(2, 3)
    for bad in (-1, 4):
        index = torch.tensor([0, bad])
        _cpu_error(op, x.clone(), index, source)  # the CPU refuses it
        on_device = x.to(spyre)
        with pytest.raises(IndexError, match=rf"{name}: index {bad} is out of bounds for size 4"):
            op(on_device, index.to(spyre), source.to(spyre)).cpu()
        torch.spyre.clear_errors()
        assert torch.equal(on_device.cpu(), x)  # nothing written
    # in range (the last row by its positive index), the CPU's result
    index = torch.tensor([3, 1])
    want = op(x.clone(), index, source)
    got = op(x.to(spyre), index.to(spyre), source.to(spyre))
    torch.testing.assert_close(got.cpu(), want)


def test_indexing_with_a_negative_index_still_wraps_as_on_the_cpu(spyre, is_strict):
    x = torch.arange(12.0).reshape(4, 3)
    index = torch.tensor([0, -1])
    torch.testing.assert_close(x.to(spyre)[index.to(spyre)].cpu(), x[index])
    y = x.clone()
    y[index] = 7.0
    z = x.to(spyre)
    z[index.to(spyre)] = 7.0
    torch.testing.assert_close(z.cpu(), y)


# ---- an output whose shape depends on the data ----------------------------------------------------


def test_a_boolean_mask_index_is_the_usual_fallback_and_strict_error_naming_the_op(spyre, is_strict):
    x = torch.arange(12.0).reshape(4, 3)
    mask = x > 5
    if is_strict:
        with pytest.raises(NotImplementedError, match=r"aten::index.Tensor has no spyre program for these inputs "
                                                      r"\(its output's shape depends on its data.*SPYRE_STRICT=1"):
            x.to(spyre)[mask.to(spyre)]
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = x.to(spyre)[mask.to(spyre)]
    torch.testing.assert_close(got.cpu(), x[mask])
    assert all("rejects" not in str(w.message) for w in seen)


# ---- copies onto overlapping memory ---------------------------------------------------------------


def test_a_copy_onto_a_partly_overlapping_view_raises_the_cpus_error(spyre, is_strict):
    x = torch.arange(6.0)
    cpu = _cpu_error(lambda t: t[1:].copy_(t[:-1]), x.clone())
    on_device = x.to(spyre)
    with pytest.raises(RuntimeError) as ours:
        on_device[1:].copy_(on_device[:-1])
    assert str(ours.value) == str(cpu) and "some elements of the input tensor" in str(cpu)
    assert torch.equal(on_device.cpu(), x)
    expanded = _cpu_error(lambda t: t.expand(2, 6).copy_(torch.ones(2, 6)), x.clone())
    with pytest.raises(RuntimeError) as ours:
        on_device.expand(2, 6).copy_(torch.ones(2, 6, device=spyre))
    assert str(ours.value) == str(expanded)
    # a copy onto itself, or onto the other half, is allowed as on the CPU
    on_device.copy_(on_device)
    on_device[:3].copy_(on_device[3:])
    assert on_device.cpu().tolist() == [3.0, 4.0, 5.0, 3.0, 4.0, 5.0]


# ---- operands of two dtypes -----------------------------------------------------------------------

_MIXED = {
    "mm": lambda a, b, c, v: a @ b.half(),
    "addmm": lambda a, b, c, v: torch.addmm(c, a, b.half()),
    "addmm bias": lambda a, b, c, v: torch.addmm(c.half(), a, b),
    "linear": lambda a, b, c, v: torch.nn.functional.linear(a, b.t().half()),
    "linear bias": lambda a, b, c, v: torch.nn.functional.linear(a, b.t(), c[0].half()),
    "bmm": lambda a, b, c, v: a[None] @ b[None].half(),
    "mv": lambda a, b, c, v: a @ v.half(),
    "dot": lambda a, b, c, v: v @ v.half(),
    "bf16 mm": lambda a, b, c, v: a.bfloat16() @ b.half(),
}


@pytest.mark.parametrize("case", list(_MIXED))
def test_a_matmul_of_two_dtypes_raises_the_cpus_error(spyre, is_strict, case):
    fn = _MIXED[case]
    a, b, c, v = torch.randn(4, 3), torch.randn(3, 5), torch.randn(4, 5), torch.randn(3)
    cpu = _cpu_error(fn, a, b, c, v)
    assert isinstance(cpu, RuntimeError) and ("dtype" in str(cpu) or "scalar type" in str(cpu))
    with pytest.raises(RuntimeError, match=_escaped(cpu)):
        fn(*(t.to(spyre) for t in (a, b, c, v)))
    assert torch.equal((a.to(spyre) * 2).cpu(), a * 2)  # the device stays usable


def _escaped(error: BaseException) -> str:
    import re

    return re.escape(str(error))


# ---- tensors on two devices -----------------------------------------------------------------------

_SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


def test_an_op_on_a_spyre_and_a_cpu_tensor_raises_as_cuda_does(spyre, is_strict):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(RuntimeError, match=f"{_SAME_DEVICE}, spyre:0 and cpu!"):
        a.to(spyre) + b
    with pytest.raises(RuntimeError, match=f"{_SAME_DEVICE}, spyre:0 and cpu!"):
        a.to(spyre) @ b.t()
    with pytest.raises(RuntimeError, match=f"{_SAME_DEVICE}, spyre:0 and cpu!"):
        torch.cat([a.to(spyre), b])
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        torch.nn.Linear(3, 2).to(spyre)(a)  # a spyre module fed a CPU input
    with pytest.raises(RuntimeError, match=f"{_SAME_DEVICE}, spyre:0 and cpu!"):
        torch.atan2(a.to(spyre), b)  # an op without a spyre kernel: the plain CPU fallback


def test_cpu_scalars_and_cpu_indices_still_mix_in(spyre, monkeypatch):
    # Indexing takes CPU indices (fake tensors, and CUDA, do): it runs, through the CPU fallback, warned.
    monkeypatch.setenv("SPYRE_STRICT", "0")
    a = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpyreFallbackWarning)
        index = torch.tensor([2, 0])
        torch.testing.assert_close(a.to(spyre)[index].cpu(), a[index])


def test_a_shape_error_does_not_let_the_same_devices_through_later(spyre, monkeypatch):
    # the first call fails on its shapes, which says nothing of its devices: the next call with
    # the same devices and fitting shapes still gets the device error
    from spyre_inductor.device import fallback

    monkeypatch.setattr(fallback, "_device_verdicts", {})  # (no verdict from an earlier test)
    monkeypatch.setenv("SPYRE_STRICT", "0")  # (strict mode refuses the first call before the CPU sees its shapes)
    a = torch.randn(2, 3).to(spyre)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ torch.randn(4, 5)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a @ torch.randn(3, 4)


@pytest.mark.parametrize("scalar", [torch.tensor(2.0), torch.tensor(3), torch.tensor(True)], ids=str)
def test_a_cpu_scalar_tensor_mixes_in_and_runs_in_a_program(spyre, monkeypatch, scalar):
    # A CPU 0-d tensor is a scalar (CUDA and torch.compile take it): it is copied to the card and
    # the op runs as a program (strict mode), promoting as the 0-d tensor it is (fp16 stays fp16)
    monkeypatch.setenv("SPYRE_STRICT", "1")
    a = torch.randn(4, 3)
    for x in (a, a.half()):
        for f in (lambda t: t + scalar, lambda t: torch.where(t > 0, t, scalar), lambda t: t.clamp(max=scalar)):
            got, want = f(x.to(spyre)), f(x)
            assert got.dtype == want.dtype and got.device.type == "spyre"
            torch.testing.assert_close(got.cpu(), want)
