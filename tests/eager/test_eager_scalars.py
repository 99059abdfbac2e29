"""Python scalars that travel at launch (issue 19): one compile per scalar KIND, not per value.

`x + 2.0` and `x + 3.0` are one compiled entry: the scalar is a 0-d input of the program whose
value the launch carries in the kernel's correction area (spyre_inductor/eager/scalars.py,
spyre_runtime/values.py). Results are compared with CPU eager bit for bit.
"""

import threading

import pytest
import torch

from spyre_inductor.eager import scalars
from spyre_inductor.eager.cache import CACHE
from spyre_inductor.eager.launch import CompiledEntry, ValueKeyed


@pytest.fixture(params=["strict", "not strict"])
def strict_or_not(request, monkeypatch):
    if request.param == "strict":
        monkeypatch.setenv("SPYRE_STRICT", "1")
    else:
        monkeypatch.delenv("SPYRE_STRICT", raising=False)


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


@pytest.fixture
def fresh_cache():
    CACHE.clear()
    yield CACHE
    CACHE.clear()


def _entries(op):
    return [e for k, e in CACHE.entries() if k[0].op is op]


def _same(spyre_result, cpu_result):
    assert spyre_result.dtype == cpu_result.dtype
    assert torch.equal(spyre_result.cpu(), cpu_result), (spyre_result.cpu(), cpu_result)


def test_two_values_of_a_scalar_are_one_compile_and_the_second_is_a_hit(spyre, strict_or_not, fresh_cache):
    a = torch.randn(8, 64)
    x = a.to(spyre)
    _same(x + 2.0, a + 2.0)
    stats = CACHE.stats()
    assert (stats.misses, stats.compiles, stats.hits, stats.scalar_kinds) == (1, 1, 0, 1)
    _same(x + 3.0, a + 3.0)
    _same(x + 0.1, a + 0.1)  # (0.1 is rounded to float32 once, as the CPU's opmath does)
    stats = CACHE.stats()
    assert (stats.misses, stats.compiles, stats.hits) == (1, 1, 2)
    (entry,) = _entries(torch.ops.aten.add.Tensor)
    assert isinstance(entry, CompiledEntry) and entry.travel == (1,) and entry.programs == 1
    assert "given at launch (torch.float32)" in entry.describe()


def test_int_and_float_scalars_are_different_kinds(spyre, strict, fresh_cache):
    a = torch.randint(-100, 100, (4, 32), dtype=torch.int32)
    x = a.to(spyre)
    _same(x * 3, a * 3)        # int32 * int: int32
    _same(x * 5, a * 5)        # the same kind: a hit
    _same(x * 2.5, a * 2.5)    # int32 * float: float32, another kind
    _same(x * -1.5, a * -1.5)
    muls = [k for k, _ in CACHE.entries() if k[0].op is torch.ops.aten.mul.Tensor]
    assert len(muls) == 2 and CACHE.stats().hits == 2
    assert {e.hosts.dtypes for e in _entries(torch.ops.aten.mul.Tensor)} == {(torch.int32,), (torch.float32,)}


def test_an_in_place_op_with_a_scalar_writes_self_for_every_value(spyre, strict, fresh_cache):
    a = torch.randn(6, 40)
    x = a.to(spyre)
    ptr = x.data_ptr()
    expected = a.clone()
    for v in (2.0, -0.5, 3.25):
        assert x.mul_(v) is x and x.data_ptr() == ptr
        expected.mul_(v)
        x.add_(v)
        expected.add_(v)
    _same(x, expected)
    assert len(_entries(torch.ops.aten.mul_.Tensor)) == len(_entries(torch.ops.aten.add_.Tensor)) == 1
    assert CACHE.stats().compiles == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_scalar_ops_match_cpu_bit_for_bit_across_values(spyre, strict, fresh_cache, dtype):
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        a = torch.randn(8, 48, generator=g)
        first, more = (0.3, 7), (1.7, -3.0, 2)
    else:
        a = torch.randint(-50, 50, (8, 48), generator=g, dtype=dtype)
        first, more = (3, 2.5), (7, -5, -0.75)
    x = a.to(spyre)
    cases = {
        "add": lambda t, v: t + v, "sub": lambda t, v: t - v, "mul": lambda t, v: t * v,
        "div": lambda t, v: t / v, "rsub": lambda t, v: v - t, "gt": lambda t, v: t > v,
        "eq": lambda t, v: t == v, "masked_fill": lambda t, v: t.masked_fill(t > 0, v),
        "clamp": lambda t, v: t.clamp(-abs(v), abs(v)), "clamp_max": lambda t, v: torch.clamp_max(t, v),
        "where": lambda t, v: torch.where(t > 0, t, v), "fill_": lambda t, v: t.clone().fill_(v),
        "remainder": lambda t, v: t % v,
    }
    for values in (first, more):  # (each holds an int and a float: both kinds)
        for name, f in cases.items():
            for v in values:
                expected = f(a, v)
                got = f(x, v)
                assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected), (name, v)
        if values is first:
            compiled = CACHE.stats().compiles
    stats = CACHE.stats()
    assert stats.value_keyed == 0 and stats.scalar_kinds >= len(cases)
    assert stats.compiles == compiled  # new values of the kinds compiled nothing


def test_integer_scalars_on_integer_tensors_are_exact_int64_too(spyre, strict, fresh_cache):
    a = torch.tensor([[1, -2, 3, 2**40]], dtype=torch.int64)
    x = a.to(spyre)
    for v in (2**62 + 12345, -(2**63), 2**63 - 1, 7):
        _same(x + v, a + v)
        _same(x - v, a - v)
    assert len(_entries(torch.ops.aten.add.Tensor)) == 1


def test_a_value_the_dtype_cannot_hold_behaves_as_on_the_cpu(spyre, strict, fresh_cache):
    a = torch.arange(-4, 4, dtype=torch.int32).reshape(2, 4)
    x = a.to(spyre)
    # arithmetic wraps the scalar to the tensor's width, as the CPU does
    _same(x + 2**40, a + 2**40)
    _same(x + 2**31, a + 2**31)
    _same(x > 2**40, a > 2**40)
    # a float beyond float32 is inf, as the CPU's conversion makes it
    f = torch.randn(2, 4)
    _same(f.to(spyre) * 1e39, f * 1e39)
    # fill_, masked_fill, where and clamp convert with an overflow check on the CPU: so here, with
    # the CPU kernel's message, before anything is launched
    for call in (lambda t: t.clone().fill_(2**40), lambda t: t.masked_fill(t > 0, 2**31),
                 lambda t: t.clamp(max=2**40)):
        with pytest.raises(RuntimeError, match="value cannot be converted to type int without overflow"):
            call(a)
        with pytest.raises(RuntimeError, match="value cannot be converted to type int without overflow"):
            call(x)
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        f.to(spyre).masked_fill(f.to(spyre) > 0, 1e39)
    # and the same entries still serve values that fit
    _same(x.clone().fill_(-(2**31)), a.clone().fill_(-(2**31)))
    _same(x.clamp(max=1), a.clamp(max=1))


def test_fp16_and_bf16_scalars_stay_keyed_by_value(spyre, strict, fresh_cache):
    # A baked constant lives in an fp32 tile, and which rounding of the scalar CPU eager uses
    # depends on the op (mul keeps it in float32 opmath; add rounds it to the tensor's dtype
    # first): one 0-d input dtype cannot keep both, so these calls keep their compile per value
    # and exactly today's numerics.
    for dtype in (torch.float16, torch.bfloat16):
        a = torch.randn(4, 64).to(dtype)
        x = a.to(spyre)
        for v in (0.1, 0.3):
            _same(x * v, a * v)  # (bit for bit with the CPU)
            _same(x + v, (a.float() + v).to(dtype))  # today's: the scalar in float32, one rounding
    assert len(_entries(torch.ops.aten.add.Tensor)) == len(_entries(torch.ops.aten.mul.Tensor)) == 4
    assert CACHE.stats().scalar_kinds == 0


def test_scalar_arguments_with_a_tensor_twin_travel(spyre, strict, fresh_cache):
    a = torch.randn(4, 64)
    x = a.to(spyre)
    for v in (0.25, -1.0, 3.0):
        _same(x > v, a > v)                  # gt.Scalar, traced as gt.Tensor
        _same(x.clamp(min=v), a.clamp(min=v))  # clamp (Scalar? min), as clamp.Tensor
        _same(v - x, v - a)                  # rsub.Scalar
    for op in (torch.ops.aten.gt.Scalar, torch.ops.aten.clamp.default, torch.ops.aten.rsub.Scalar):
        (entry,) = _entries(op)
        assert entry.travel and entry.traced.op is not op  # (the twin)


def test_a_kind_whose_scalar_cannot_travel_keys_each_value(spyre, strict, fresh_cache, monkeypatch):
    monkeypatch.setattr(scalars, "launched_only", lambda source, names: False)
    a = torch.randn(4, 32)
    x = a.to(spyre)
    for v in (2.0, 3.0, 2.0):
        _same(x + v, a + v)
    kinds = [e for e in _entries(torch.ops.aten.add.Tensor) if isinstance(e, ValueKeyed)]
    stats = CACHE.stats()
    assert len(kinds) == 1 and stats.value_keyed == 1 and stats.scalar_kinds == 0
    assert stats.compiles == 2  # one per value, as before issue 19


def test_threads_launching_one_entry_with_different_values(spyre, fresh_cache):
    a = torch.randn(4, 64)
    x = a.to(spyre)
    x + 1.0  # compiled once, before the threads
    errors = []

    def work(v):
        try:
            for _ in range(20):
                y = x + v
                assert torch.equal(y.cpu(), a + v)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(float(v),)) for v in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert CACHE.stats().compiles == 1


def test_a_launch_takes_a_zero_dim_input_as_a_host_value_or_a_spyre_tensor(spyre, fresh_cache):
    """The launch layer's side (spyre_runtime/values.py), through a compiled entry's graph."""
    from spyre_runtime.binding import LaunchError

    a = torch.randn(4, 64)
    x = a.to(spyre)
    x + 1.0
    (entry,) = _entries(torch.ops.aten.add.Tensor)
    host = torch.tensor(2.5)
    (out,) = entry.fn([x, host])
    host.fill_(100.0)  # read when the launch was made: reusing it after the call is safe
    _same(out, a + 2.5)
    (out,) = entry.fn([x, torch.tensor(-4.0, device=spyre)])  # a spyre 0-d tensor, as torch.compile passes
    _same(out, a - 4.0)
    with pytest.raises(LaunchError, match="host value must be a 0-d CPU tensor of dtype torch.float32"):
        entry.fn([x, torch.tensor(1.0, dtype=torch.float64)])


def test_a_kind_that_does_not_compile_with_a_zero_dim_input_falls_back_to_value_keys(spyre, strict, fresh_cache,
                                                                                     monkeypatch):
    from spyre_inductor.eager import compile as compiling

    real = compiling.compile_graph

    def refuses_zero_dim_inputs(gm, fakes, op):
        if any(f.dim() == 0 for f in fakes):
            raise RuntimeError("no 0-d inputs today")
        return real(gm, fakes, op)

    monkeypatch.setattr(compiling, "compile_graph", refuses_zero_dim_inputs)
    a = torch.randn(4, 32)
    x = a.to(spyre)
    for v in (2.0, 3.0):
        _same(x * v, a * v)  # compiled per value, not sent to the CPU
    (kind,) = [e for e in _entries(torch.ops.aten.mul.Tensor) if isinstance(e, ValueKeyed)]
    assert "no 0-d inputs today" in kind.describe()
    assert CACHE.stats().compiles == 2 and CACHE.stats().cpu_routes == 0


def test_a_scalar_the_op_refuses_gets_pytorchs_error_and_caches_nothing(spyre, fresh_cache, monkeypatch):
    monkeypatch.delenv("SPYRE_STRICT", raising=False)
    a = torch.arange(6, dtype=torch.int32)
    with pytest.raises(RuntimeError) as cpu:
        a.clone().add_(2.5)
    with pytest.raises(RuntimeError) as ours:
        a.to(spyre).add_(2.5)
    assert str(ours.value) == str(cpu.value)  # (the CPU kernel checked the inputs)
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(RuntimeError, match=r"aten::add_.Tensor rejects its inputs"):
        a.to(spyre).add_(2.5)
    assert not _entries(torch.ops.aten.add_.Tensor)
