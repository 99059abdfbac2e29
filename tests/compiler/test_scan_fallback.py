"""Scans the spyre compiler cannot (yet) turn into a program run as in-graph CPU kernels.

With ``BackendFeature.SCAN`` declared, Inductor lowers cumsum, cumprod and
logcumsumexp to ``ir.Scan`` nodes: ``ops.scan(dtypes, combine_fn, values)``
along the scan dim, where ``combine_fn(a_tuple, b_tuple)`` is a closure over
``ops.*``. When such a node falls back, the CPU kernel writer
(host_kernel.py) writes the combine_fn out as a nested ``def combine_...``
and ``spyre_host.scan`` applies it column by column along the scan dim
(the last dim of the kernel's iteration shape).

Numerics are CPU eager's: eager's cum kernels hold the running value in
``at::acc_type<T, false>`` (fp64 for fp32, fp32 for fp16/bf16, int64 for
integers) and round each output once. The fallback does the same, so fp32
results match eager to the bit; an fp32 running sum would not (see
test_fp32_scans_accumulate_in_double_like_eager).

Which scans compile is test_compiled_scans.py's business: cumsum/cumprod of
floats, integers and bools become spyre programs, so here the integer scans
are run with the backend refusing every kernel (``cpu_only``), and float
scans are checked for their answers only; logcumsumexp always falls back.
Never under SPYRE_STRICT, which turns a fallback into a compile error.
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.codegen.common import BackendFeature
from torch._inductor import virtualized
from torch.utils._ordered_set import OrderedSet

from spyre_inductor.launcher import host as host_runtime
from spyre_inductor.compiler.inductor.host_kernel import HostHandler, HostUnsupported, _Writer
from spyre_inductor.compiler.inductor.scheduling import SpyreScheduling

from inductor_helpers import compile_on_spyre, refuse_every_kernel


def _randn(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _randint(shape, dtype, low=-5, high=6, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _compile_and_compare(fn, *args, **tol):
    """Compile `fn` on spyre copies of `args`; outputs must match eager CPU (dtype included)."""
    out, _, records, warned, code = compile_on_spyre(fn, *args)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    assert len(out) == len(want)
    for got, ref in zip(out, want, strict=True):
        assert got.device.type == "spyre"
        torch.testing.assert_close(got.cpu(), ref, **tol)
    return records, warned, code


@pytest.fixture
def cpu_only(monkeypatch):
    """The backend refuses every kernel: each node runs as a CPU fallback."""
    refuse_every_kernel(monkeypatch)


def _assert_scan_fell_back(records, warned, code, op: str):
    """The scan ran as a CPU fallback kernel: recorded with a reason, warned about, written out."""
    fallbacks = [r for r in records if r.fallback_reason is not None and op in r.ops]
    assert fallbacks, records
    assert all(r.artifact is None for r in fallbacks)
    assert any(op in w for w in warned), warned
    assert "spyre_host.scan(" in code and "def combine_" in code, code


# ---- logcumsumexp: a combine_fn of a dozen ops --------------------------------------------


def test_logcumsumexp_fp32_falls_back_and_matches_eager():
    x = _randn((6, 37))
    x[0, 0] = float("-inf")  # a leading -inf: the combine's "both infinite" branch
    x[1] = float("-inf")  # a whole row of -inf stays -inf
    x[2, 5] = float("inf")
    records, warned, code = _compile_and_compare(lambda a: torch.logcumsumexp(a, -1), x)
    _assert_scan_fell_back(records, warned, code, "aten.logcumsumexp")


def test_logcumsumexp_fp16_runs_in_fp32_and_rounds_once():
    x = _randn((5, 3, 41), torch.float16, seed=1)
    records, warned, code = _compile_and_compare(lambda a: torch.logcumsumexp(a, 1), x)
    _assert_scan_fell_back(records, warned, code, "aten.logcumsumexp")


# ---- integer scans: the result is int64 (Inductor's lowering sets it) ----------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_and_bool_cumsum_gives_int64(dtype, cpu_only):
    x = _randint((7, 53), dtype, low=0 if dtype == torch.bool else -50, high=2 if dtype == torch.bool else 50)
    records, warned, code = _compile_and_compare(lambda a: torch.cumsum(a, 1), x)
    _assert_scan_fell_back(records, warned, code, "aten.cumsum")


def test_int32_cumprod_gives_int64(cpu_only):
    x = _randint((4, 19), torch.int32, low=-3, high=4, seed=2)  # |3^19| fits in int64, not in int32
    records, warned, code = _compile_and_compare(lambda a: torch.cumprod(a, -1), x)
    _assert_scan_fell_back(records, warned, code, "aten.cumprod")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_int_cumsum_along_each_dim_of_a_3d_tensor(dim, cpu_only):
    x = _randint((5, 6, 7), torch.int32, seed=3)
    records, warned, code = _compile_and_compare(lambda a: torch.cumsum(a, dim), x)
    _assert_scan_fell_back(records, warned, code, "aten.cumsum")


def test_int_cumsum_of_a_transposed_view_and_fused_pointwise(cpu_only):
    # The scan's values are the node's own loop body: a transposed load and the pointwise work
    # before the scan run with it; the kernel iterates with the scan dim last whatever the layout.
    x = _randint((6, 9, 4), torch.int32, seed=4)
    records, warned, code = _compile_and_compare(lambda a: torch.cumsum(a.transpose(0, 2) * 3 + 1, 1), x)
    _assert_scan_fell_back(records, warned, code, "aten.cumsum")


def test_dynamic_shapes_take_the_sizes_at_run_time():
    # Issue 18: the rows stay symbolic (the kernel serves its bucket of sizes), the scanned dim
    # is specialized through a guard.
    fn = lambda a: torch.cumsum(a, 1)  # noqa: E731
    for shape in [(5, 7), (3, 12)]:
        x = _randint(shape, torch.int32, seed=5)
        out, _, records, warned, code = compile_on_spyre(fn, x, dynamic=True)
        torch.testing.assert_close(out[0].cpu(), fn(x))
        (record,) = records
        assert record.fallback_reason is None and record.kernel.symbolic is not None and not warned


# ---- float cumsum/cumprod: compiled or fallen back, the answer is eager's ------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_float_cumsum_along_each_dim_of_a_3d_tensor(dim):
    x = _randn((5, 6, 70), seed=6)
    _compile_and_compare(lambda a: torch.cumsum(a, dim), x)


def test_float_cumprod():
    x = _randn((4, 3, 60), seed=7) * 0.1 + 1  # factors near 1: the products stay in range
    _compile_and_compare(lambda a: torch.cumprod(a, -1), x)
    _compile_and_compare(lambda a: torch.cumprod(a, 1), x)


def test_float_cumsum_and_cumprod_refused_by_the_backend_match_eager_in_the_fallback(cpu_only):
    """Whatever the compiler makes of float scans, their CPU fallback holds eager's numerics.

    The backend is made to refuse every kernel, so these long fp32 rows run
    on the CPU: an fp32 running sum would miss eager by ~1e-4 here.
    """
    x = _randn((8, 3000), seed=11)
    records, warned, code = _compile_and_compare(lambda a: torch.cumsum(a, -1), x)
    _assert_scan_fell_back(records, warned, code, "aten.cumsum")
    records, warned, code = _compile_and_compare(lambda a: torch.cumprod(a, 1), x[:, :200] * 0.05 + 1)
    _assert_scan_fell_back(records, warned, code, "aten.cumprod")


def test_fp16_cumsum():
    x = _randn((4, 200), torch.float16, seed=8)
    _compile_and_compare(lambda a: torch.cumsum(a, -1), x)


# ---- multi-value scans -------------------------------------------------------------------


def test_multi_value_scans_cummax_cummin(monkeypatch):
    """cummax/cummin are two-value scans (value, index) with an argmax-style combine_fn.

    The backend does not declare TUPLE_REDUCTION, so Inductor normally sends
    them to aten; the test declares it to drive the fallback's multi-value path
    end to end (NaN propagation and tie-breaking included).
    """
    declared = SpyreScheduling.get_backend_features
    monkeypatch.setattr(SpyreScheduling, "get_backend_features",
                        lambda self, device: OrderedSet([*declared(self, device), BackendFeature.TUPLE_REDUCTION]))
    x = _randint((4, 3, 30), torch.float32, low=0, high=4, seed=9)  # many ties
    x[0, 0, 3] = float("nan")

    def fn(a):
        values, indices = torch.cummax(a, 2)
        ivalues, iindices = torch.cummin(a.to(torch.int32), 1)
        return values, indices, ivalues, iindices

    records, warned, code = _compile_and_compare(fn, x, equal_nan=True)
    _assert_scan_fell_back(records, warned, code, "aten.cummax")
    _assert_scan_fell_back(records, warned, code, "aten.cummin")


# ---- the writer and the runtime helper on their own ------------------------------------------


def test_combine_fn_op_the_writer_cannot_translate_is_a_compile_error():
    handler = HostHandler(_Writer(), "(2, 5, )", 1)

    def combine(a, b):
        return (virtualized.ops.randn(a[0], b[0]),)  # no CPU translation for randn

    with virtualized.V.set_ops_handler(handler), pytest.raises(HostUnsupported, match="randn"):
        virtualized.ops.scan((torch.float32,), combine, ("v",))


def test_fp32_scans_accumulate_in_double_like_eager():
    # A long fp32 row: eager's cumsum keeps a double running sum and rounds each output once.
    x = _randn((3, 4000), seed=10)
    (got,) = host_runtime.scan((x,), lambda a, b: (a + b,), x.shape, (torch.float32,))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.cumsum(x, -1))  # to the bit
    # A running sum held in fp32 drifts away from eager by far more than fp32 tolerance.
    naive = x.clone()
    for k in range(1, x.shape[-1]):
        naive[:, k] = naive[:, k - 1] + x[:, k]
    assert not torch.allclose(naive, torch.cumsum(x, -1), rtol=1.3e-6, atol=1e-5)
    assert host_runtime.scan_dtype(torch.float16) == torch.float32
    assert host_runtime.scan_dtype(torch.int32) == torch.int64


def test_runtime_scan_broadcasts_values_and_keeps_the_running_type():
    # A value broadcast along the scan dim (a loop-invariant load), and a combine whose Python
    # constant would otherwise promote an int64 running value to float.
    ones = torch.ones(3, 1, dtype=torch.int64)
    (got,) = host_runtime.scan((ones,), lambda a, b: (a + b * 1.0,), (3, 5), (torch.int64,))
    assert got.dtype == torch.int64
    assert torch.equal(got, torch.arange(1, 6).expand(3, 5))
