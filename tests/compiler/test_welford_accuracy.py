"""var, std, layer_norm and batch norm statistics on data far from zero relative to its spread
(issue 29, item 6), in every reduction mode, eager and compiled, under SPYRE_STRICT=1.

Rows of 123456.789 gave a variance of 6e-5 (the CPU: exactly 0) and a layer norm of +-0.93
(the CPU: 0); 1e5 + 0.01 * randn gave a variance 67% off resident, 3e-4 off chunked. The mean
was rounded a few ulps off the data's (sum * (1/K), sums in fp32) and m2 = sum((x - mean)^2)
then counted K * that error squared; Chan's combine then weighed differences of chunk means
rounded to fp32. Now every mode computes the corrected two-pass form and keeps the running mean
as fp32 plus its rounding error (families/reduction/welford.py).

What "CPU-grade" means here, against float64 on the same fp32 inputs:
* constant rows: variance exactly 0 and layer norm / batch norm exactly 0, as on the CPU;
* offset rows (1e5 + 0.01 * randn, std about 1.3 ulps of the offset): the variance within
  rtol 2e-6 (about 30 fp32 ulps: the corrected form over K elements; the CPU, which
  accumulates in double, is at ~6e-8, and the old programs were at 1e-5 to 0.7);
* normalised outputs within the error of the mean's own rounding to fp32 (half an ulp of
  the offset, times rstd), plus 1e-4: x - mean is exact, so nothing else may add error.
  (The CPU's layer norm computes x * rstd - mean * rstd and is off by up to 0.42 here.)
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler import config
from spyre_inductor.compiler.inductor.scheduling import record_kernels

CONSTANT = 123456.789  # fp32 123456.7890625


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def offset_data(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (1e5 + 0.01 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def run(path, fn, x, max_cores=config.MAX_CORES):
    """fn(x on spyre) compiled or eager (a fresh compile: no eager entry, no FX cache), with the
    plans of the reduction programs that ran: (mode, column tiles, looped dims)."""
    torch._dynamo.reset()
    torch.spyre.eager_cache_clear()
    with config.patch(max_cores=max_cores), record_kernels() as records, \
            torch._inductor.config.patch(force_disable_caches=True):
        out = (torch.compile(fn) if path == "compiled" else fn)(x.to("spyre"))
    assert records and all(r.artifact is not None for r in records if r.kernel is not None), records
    plans = []
    for r in records:
        low = json.loads((r.artifact / "plan.json").read_text()).get("lowering") if r.artifact else None
        if low and low.get("mode"):
            plans.append((low["mode"], bool(low["columns"]), bool(low["looped"])))
    return out.cpu(), plans


def constant_slice(x, dims):
    """The first slice along the first kept dim: made constant, it is one constant row."""
    dims = [d % x.dim() for d in ((dims,) if isinstance(dims, int) else dims)]
    kept = next(d for d in range(x.dim()) if d not in dims)
    return (slice(None),) * kept + (0,)


# name: (shape, reduced dims, max_cores, the plan it gets: mode, column tiles, looped dims)
MODES = {
    "resident": ((8, 1000), -1, config.MAX_CORES, ("resident", False, False)),
    "resident columns": ((1000, 64), 0, config.MAX_CORES, ("resident", True, False)),
    "chunked": ((2, 150_000), -1, 1, ("chunked", False, False)),
    "chunked columns": ((20_000, 32), 0, 1, ("chunked", True, False)),
    "ring": ((2, 50_000), -1, config.MAX_CORES, ("ring", False, False)),
    "looped": ((4, 12, 3000), (0, 2), config.MAX_CORES, ("chunked", False, True)),
}


def assert_variance(got, x, dims):
    """The constant slice is the result's first row (constant_slice)."""
    truth = x.double().var(dims)
    assert torch.equal(got[0], torch.zeros_like(got[0])), got[0]
    torch.testing.assert_close(got.double(), truth, rtol=2e-6, atol=0)


@pytest.mark.parametrize("path", ["eager", "compiled"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_variance_of_offset_data_is_cpu_grade_in_every_mode(mode, path):
    shape, dims, cores, plan = MODES[mode]
    x = offset_data(shape)
    const = constant_slice(x, dims)
    x[const] = CONSTANT
    got, plans = run(path, lambda t: torch.var(t, dims), x, cores)
    assert plans == [plan]
    assert_variance(got, x, dims)


def assert_normalised(got, x, dims, const, eps=1e-5):
    """got = (x - mean) * rstd over `dims`, within the mean's fp32 rounding (module docstring)."""
    xd = x.double()
    mean, var = xd.mean(dims, keepdim=True), xd.var(dims, keepdim=True, correction=0)
    rstd = (var + eps).rsqrt()
    want = (xd - mean) * rstd
    assert torch.equal(got[const], torch.zeros_like(got[const])), got[const].abs().max()
    m32 = mean.float()
    half_ulp = (torch.nextafter(m32.abs(), torch.tensor(float("inf"))) - m32.abs()).double() / 2
    err = (got.double() - want).abs()
    assert (err <= half_ulp * rstd + 1e-4).all(), (err.max(), (half_ulp * rstd).max())


@pytest.mark.parametrize("path", ["eager", "compiled"])
@pytest.mark.parametrize("mode", ["resident", "chunked"])
def test_layer_norm_of_offset_data_is_cpu_grade(mode, path):
    """Chunked: the statistics in one pass (Chan), the normalisation in a second."""
    shape, _, cores, plan = MODES[mode]
    x = offset_data(shape, 1)
    x[0] = CONSTANT
    got, plans = run(path, lambda t: F.layer_norm(t, t.shape[-1:]), x, cores)
    assert plans == [plan]
    assert_normalised(got, x, -1, (0,))


def test_training_batch_norm_of_offset_data_is_cpu_grade():
    """The statistics over (N, H, W): looped reduced dims around the chunks of W. (Compiled only:
    eager native_batch_norm has no spyre kernel yet.)"""
    x = offset_data((4, 6, 9, 300), 2)
    x[:, 0] = CONSTANT
    got, plans = run("compiled", lambda t: F.batch_norm(t, None, None, training=True), x)
    assert plans and all(p == ("chunked", False, True) for p in plans), plans
    assert_normalised(got, x, (0, 2, 3), (slice(None), 0))


# Low-precision inputs are widened to fp32 and accumulate there: offset rows whose spread is near
# the type's own spacing, and a constant row of the offset (near the top of its binade, where
# the old sum * (1/K) rounded the mean an fp32 ulp up); results round once, to the input's type.
LOW = {torch.float16: (1000.0, 0.7), torch.bfloat16: (30000.0, 200.0)}


@pytest.mark.parametrize("path", ["eager", "compiled"])
@pytest.mark.parametrize("dtype", sorted(LOW, key=str), ids=str)
def test_low_precision_inputs_accumulate_in_fp32(dtype, path):
    base, spread = LOW[dtype]
    g = torch.Generator().manual_seed(3)
    x = (base + spread * torch.randn((8, 1000), generator=g)).to(dtype)
    x[0] = base
    (var, norm), _ = zip(*(run(path, f, x) for f in (lambda t: torch.var(t, -1),
                                                     lambda t: F.layer_norm(t, t.shape[-1:]))))
    xd = x.double()
    truth = xd.var(-1)
    assert var.dtype == dtype and var[0] == 0
    torch.testing.assert_close(var.double(), truth.to(dtype).double(), rtol=torch.finfo(dtype).eps, atol=0)
    want = ((xd - xd.mean(-1, keepdim=True)) * (xd.var(-1, keepdim=True, correction=0) + 1e-5).rsqrt()).to(dtype)
    assert norm.dtype == dtype and torch.equal(norm[0], torch.zeros_like(norm[0]))
    torch.testing.assert_close(norm.double(), want.double(), rtol=torch.finfo(dtype).eps, atol=1e-3)


def test_without_strict_the_same_programs_run(monkeypatch):
    monkeypatch.delenv("SPYRE_STRICT")
    for mode in ("resident", "chunked", "ring"):
        shape, dims, cores, plan = MODES[mode]
        x = offset_data(shape, 4)
        const = constant_slice(x, dims)
        x[const] = CONSTANT
        got, plans = run("compiled", lambda t: torch.var(t, dims), x, cores)
        assert plans == [plan]
        assert_variance(got, x, dims)


def test_the_cpu_fallback_kernel_is_cpu_grade_too(monkeypatch):
    """A welford kernel the planner refuses (a symbolic reduced size, say) runs as an in-graph CPU
    kernel: it computes in float64, as PyTorch's CPU var accumulates (it took an fp32 mean and
    got the same errors as the programs)."""
    from inductor_helpers import compile_on_spyre, refuse_every_kernel

    monkeypatch.delenv("SPYRE_STRICT")
    refuse_every_kernel(monkeypatch)
    x = offset_data((8, 1000), 5)
    x[0] = CONSTANT
    (var, norm), _, records, warned, _ = compile_on_spyre(lambda t: (torch.var(t, -1), F.layer_norm(t, (1000,))), x)
    assert warned and all(r.artifact is None for r in records)  # the path under test really was the CPU's
    assert_variance(var.cpu(), x, -1)
    assert_normalised(norm.cpu(), x, -1, (0,))


@pytest.mark.parametrize("mode", ["resident", "chunked", "ring", "looped"])
def test_inf_and_nan_give_eagers_mean_and_variance(mode):
    """As eager's Welford: an inf (or a nan) in a row of K > 1 makes its mean and variance nan
    (the resident sum / K kept an inf mean), the other rows untouched."""
    shape, dims, cores, _ = MODES[mode]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    flat = x.view(-1)
    flat[5], flat[flat.numel() // 2 + 7], flat[-3] = float("inf"), float("nan"), float("-inf")
    fn = lambda t: torch.var_mean(t, dims)  # noqa: E731
    got, _ = zip(*(run("compiled", lambda t, k=k: fn(t)[k], x, cores) for k in (0, 1)))
    for g, want in zip(got, fn(x), strict=True):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5, equal_nan=True)
