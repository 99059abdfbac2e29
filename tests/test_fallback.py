"""Ops without a spyre kernel run on the CPU over the device bytes, visibly.

Ops the compile-backed eager path routes (spyre_inductor/eager/ops.py) run as
spyre programs instead (tests/eager/); these tests use ops outside that table
(lgamma, digamma, unfold) for the fallback itself, and check that routed ops
still behave like the CPU."""

import warnings

import pytest
import torch

from conftest import run_python


def test_fallback_warns_once_per_op_naming_it():
    result = run_python(
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    x = torch.ones(3, device='spyre')\n"
        "    for _ in range(3):\n"
        "        torch.lgamma(x); torch.lgamma(x); torch.digamma(x)\n"
        "names = [str(w.message).split()[1] for w in seen if 'runs on the CPU' in str(w.message)]\n"
        "print(' '.join(sorted(names)))\n"
    )
    assert result.returncode == 0, result.stderr
    names = result.stdout.split()
    # Structured ops reach the device as their out= overload; that is the name given.
    assert names.count("aten::lgamma.out") == 1 and names.count("aten::digamma.out") == 1
    assert "aten::fill_.Scalar" not in names  # torch.ones: a compiled fill (spyre_inductor/eager)


def test_printing_a_tensor_does_not_warn(spyre):
    x = torch.randn(3, device=spyre)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        repr(x)
    assert not [w for w in seen if "no spyre kernel" in str(w.message)]


def test_strict_mode_names_the_op():
    result = run_python(
        "import torch\n"
        "x = torch.empty(3, device='spyre')\n"  # empty has a spyre kernel
        "try:\n"
        "    torch.lgamma(x)\n"
        "except NotImplementedError as e:\n"
        "    print(e)\n",
        SPYRE_STRICT=1,
    )
    assert result.returncode == 0, result.stderr
    assert "aten::lgamma" in result.stdout and "SPYRE_STRICT=1" in result.stdout


def test_in_place_ops_write_device_memory(spyre):
    x = torch.arange(6.0, device=spyre)
    ptr = x.data_ptr()
    x.mul_(2).add_(1)
    assert x.data_ptr() == ptr
    assert torch.equal(x.cpu(), torch.arange(6.0) * 2 + 1)
    view = x[::2]
    view.zero_()
    assert torch.equal(x.cpu(), torch.tensor([0.0, 3.0, 0.0, 7.0, 0.0, 11.0]))


def test_out_argument_empty_is_resized_on_device(spyre):
    out = torch.empty(0, device=spyre)
    result = torch.add(torch.ones(2, 3, device=spyre), 1, out=out)
    assert result is out
    assert out.shape == (2, 3) and out.device == spyre
    assert torch.equal(out.cpu(), torch.full((2, 3), 2.0))


def test_out_argument_presized_and_non_contiguous(spyre):
    base = torch.zeros(3, 4, device=spyre)
    out = base.t()
    torch.mul(torch.ones(4, 3, device=spyre), 5, out=out)
    assert torch.equal(base.cpu(), torch.full((3, 4), 5.0))


def test_views_returned_by_the_fallback_stay_views(spyre):
    x = torch.arange(5.0, device=spyre)
    windows = x.unfold(0, 2, 1)  # a CPU-kernel view op
    assert windows.device == spyre and windows._base is x
    windows[0, 1] = 100.0
    assert x[1].item() == 100.0


def test_multiple_outputs(spyre):
    x = torch.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    values, indices = x.to(spyre).max(dim=1)
    assert values.device == indices.device == spyre
    assert torch.equal(values.cpu(), torch.tensor([5.0, 7.0]))
    assert torch.equal(indices.cpu(), torch.tensor([1, 0]))
    parts = torch.arange(6.0, device=spyre).split(2)
    assert [p.device for p in parts] == [spyre] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64])
def test_results_match_cpu(spyre, dtype):
    torch.manual_seed(0)
    a = (torch.randn(6, 5) * 10).to(dtype)
    b = (torch.randn(5) * 10).to(dtype)
    for fn in (lambda p, q: p + q, lambda p, q: p * q, lambda p, q: torch.maximum(p, q),
               lambda p, q: (p - q).abs().sum(0), lambda p, q: p.t().contiguous()):
        expected = fn(a, b)
        got = fn(a.to(spyre), b.to(spyre))
        assert got.device == spyre and got.dtype == expected.dtype
        # The fallback runs the CPU kernel on the same bytes: results are identical.
        assert torch.equal(got.cpu(), expected)


def test_cpu_scalar_tensors_mix_with_spyre(spyre):
    assert torch.equal((torch.ones(2, device=spyre) * torch.tensor(3.0)).cpu(), torch.full((2,), 3.0))


def test_errors_from_cpu_kernels_reach_the_caller(spyre):
    with pytest.raises(RuntimeError, match="size of tensor a"):
        torch.ones(2, device=spyre) + torch.ones(3, device=spyre)
    assert torch.equal(torch.ones(2, device=spyre).cpu(), torch.ones(2))
