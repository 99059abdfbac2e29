"""The compile-backed eager path (spyre_inductor/eager): key, cache, compile, launch, fallbacks."""

import threading
import warnings

import pytest
import torch

from spyre_inductor.eager import compile as compiling
from spyre_inductor.eager.cache import CACHE
from spyre_inductor.eager.launch import CompiledEntry, CpuRoute


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _programs_launched(fn):
    """(result, how many spyre programs fn launched)."""
    torch.spyre.synchronize()
    before = len(torch.spyre.kernel_reports())
    torch.spyre.set_kernel_report_window(None)
    try:
        result = fn()
        torch.spyre.synchronize()
        return result, len(torch.spyre.kernel_reports()) - before
    finally:
        torch.spyre.set_kernel_report_window(1024)


def _entry(op):
    return [e for k, e in CACHE.entries() if k[0].op is op]


def test_an_eager_op_compiles_once_then_launches(spyre, strict, fresh_cache):
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    x, y = a.to(spyre), b.to(spyre)
    z, programs = _programs_launched(lambda: x + y)
    assert programs == 1 and torch.equal(z.cpu(), a + b)
    stats = torch.spyre.eager_cache_stats()
    assert (stats.misses, stats.compiles, stats.hits) == (1, 1, 0)
    for _ in range(3):
        assert torch.equal((x + y).cpu(), a + b)
    stats = torch.spyre.eager_cache_stats()
    assert (stats.misses, stats.compiles, stats.hits) == (1, 1, 3)
    (entry,) = _entry(torch.ops.aten.add.Tensor)
    assert isinstance(entry, CompiledEntry) and entry.programs == 1 and not entry.cpu_calls


def test_the_key_has_dtypes_shapes_strides_and_scalar_kinds(spyre, fresh_cache):
    x = torch.randn(8, 8, device=spyre)
    x + x
    x + x  # hit
    x.half() + x.half()  # dtype (and the cast itself is a compiled copy)
    x.t() + x  # strides
    x[:4] + x[:4]  # shape
    x + 1
    x + 2  # hit: a wrapped number is keyed on its kind, its value travels at launch
    x + 2.0  # a float is another kind
    x.half() + 1  # beside fp16 a scalar is keyed on its value (its constant lives in an fp32 tile)
    x.half() + 2
    adds = [k for k, _ in CACHE.entries() if k[0].op is torch.ops.aten.add.Tensor]
    assert len(adds) == 8
    assert torch.spyre.eager_cache_stats().hits >= 2


def test_a_bounded_cache_evicts_the_least_used_and_counts_it(spyre, fresh_cache):
    torch.spyre.set_eager_cache_capacity(2)
    x = torch.randn(4, 4, device=spyre)
    x + x
    x * x
    x + x  # refreshes add
    x - x  # evicts mul
    stats = torch.spyre.eager_cache_stats()
    assert stats.evictions == 1 and stats.entries == 2 and stats.capacity == 2
    assert {k[0].op for k, _ in CACHE.entries()} == {torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor}
    with pytest.raises(ValueError, match="positive integer"):
        torch.spyre.set_eager_cache_capacity(0)


def test_in_place_and_out_forms_write_their_tensors(spyre, strict, fresh_cache):
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    x = a.to(spyre)
    ptr = x.data_ptr()
    assert x.mul_(b.to(spyre)) is x and x.data_ptr() == ptr
    torch.testing.assert_close(x.cpu(), a * b)
    out = torch.empty(0, device=spyre)
    assert torch.add(a.to(spyre), b.to(spyre), alpha=2, out=out) is out
    torch.testing.assert_close(out.cpu(), a + 2 * b)
    wrong = torch.empty(3, device=spyre)
    with pytest.warns(UserWarning, match="was resized"):
        torch.sub(a.to(spyre), b.to(spyre), out=wrong)
    assert wrong.shape == (6, 5)
    torch.testing.assert_close(wrong.cpu(), a - b)
    base = torch.zeros(5, 6, device=spyre)
    torch.mul(a.to(spyre), 3, out=base.t())  # a non-contiguous out=
    torch.testing.assert_close(base.cpu(), (a * 3).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_linspace_is_a_program(spyre, strict, fresh_cache, dtype):
    # (a module's buffer made with linspace on spyre ran on the CPU, and raised under strict)
    for start, end, steps in ((-1.0, 1.0, 16), (0, 10, 7), (2.5, -3.0, 1), (0.0, 1.0, 0)):
        got, programs = _programs_launched(lambda: torch.linspace(start, end, steps, device=spyre, dtype=dtype))
        assert programs == (1 if steps else 0)
        # Inductor's decomposition, as a torch.compile'd linspace on the CPU computes it ...
        inductor = torch.compile(lambda: torch.linspace(start, end, steps, dtype=dtype), backend="inductor")()
        assert torch.equal(got.cpu(), inductor)
        # ... which rounds once more than the CPU's eager kernel: within one ulp of it
        want = torch.linspace(start, end, steps, dtype=dtype)
        ulp = 0 if dtype == torch.int64 else torch.finfo(dtype).eps * 2
        torch.testing.assert_close(got.cpu(), want, rtol=ulp, atol=ulp)


def test_fills_and_copies_across_dtypes_and_layouts_are_programs(spyre, strict, fresh_cache):
    (z, o, f), programs = _programs_launched(lambda: (torch.zeros(5, 7, device=spyre), torch.ones(3, device=spyre),
                                                      torch.full((4,), 2.5, device=spyre, dtype=torch.float16)))
    assert programs == 3
    assert torch.equal(z.cpu(), torch.zeros(5, 7)) and torch.equal(o.cpu(), torch.ones(3))
    assert torch.equal(f.cpu(), torch.full((4,), 2.5, dtype=torch.float16))
    a = torch.randn(16, 24)
    x = a.to(spyre)
    (h, t, i), programs = _programs_launched(lambda: (x.half(), x.t().contiguous(), x.to(torch.int32)))
    assert programs == 3
    assert torch.equal(h.cpu(), a.half()) and torch.equal(t.cpu(), a.t().contiguous())
    assert torch.equal(i.cpu(), a.to(torch.int32))
    dst = torch.empty(24, 16, dtype=torch.bfloat16, device=spyre)
    dst.copy_(x.t())
    assert torch.equal(dst.cpu(), a.t().to(torch.bfloat16))
    assert _entry(torch.ops.aten.copy_.default)


def test_an_op_outside_the_compiler_keeps_the_fallback_and_strict_mode_names_it(spyre, monkeypatch, fresh_cache):
    x = torch.rand(5, device=spyre) + 0.5
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(NotImplementedError, match="log10"):
        torch.log10(x)
    monkeypatch.setenv("SPYRE_STRICT", "0")
    torch.testing.assert_close(torch.log10(x).cpu(), torch.log10(x.cpu()))
    with pytest.raises(NotImplementedError, match=r"aten::lgamma.*SPYRE_STRICT=1"):
        monkeypatch.setenv("SPYRE_STRICT", "1")
        torch.lgamma(x)  # not routed at all: the plain fallback


def test_a_failed_compile_falls_back_and_leaves_the_device_usable(spyre, monkeypatch, fresh_cache):
    def broken(gm, fakes, op):
        raise RuntimeError("planner exploded")

    monkeypatch.setattr(compiling, "compile_graph", broken)
    a = torch.randn(4, 4)
    x = a.to(spyre)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from spyre_inductor.device import fallback

        fallback.reset_warnings()
        got = torch.sigmoid(x)
    torch.testing.assert_close(got.cpu(), torch.sigmoid(a))
    assert any("aten::sigmoid" in str(w.message) and "planner exploded" in str(w.message) for w in seen)
    (entry,) = _entry(torch.ops.aten.sigmoid.default)
    assert isinstance(entry, CpuRoute) and torch.spyre.eager_cache_stats().cpu_routes == 1
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(NotImplementedError, match=r"aten::sigmoid.*planner exploded"):
        torch.sigmoid(x)
    monkeypatch.undo()
    monkeypatch.setenv("SPYRE_STRICT", "1")
    torch.testing.assert_close((x * 2).cpu(), a * 2)  # the device, and other ops, still work
    torch.spyre.synchronize()


def test_bad_inputs_get_pytorchs_error(spyre, monkeypatch, fresh_cache):
    import logging

    logged = []
    handler = logging.Handler()
    handler.emit = logged.append
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_log.addHandler(handler)
    try:
        with pytest.raises(RuntimeError, match="size of tensor a"):
            torch.ones(2, device=spyre) + torch.ones(3, device=spyre)
    finally:
        fake_log.removeHandler(handler)
    assert logged == []  # the probes on fake tensors log no traceback of their own
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(RuntimeError, match=r"aten::add.Tensor rejects its inputs.*broadcast"):
        torch.ones(2, device=spyre) + torch.ones(3, device=spyre)
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, device=spyre) + torch.ones(2, device="spyre:1")
    assert torch.equal((torch.ones(2, device=spyre) * 3).cpu(), torch.full((2,), 3.0))


def test_torch_compile_captures_the_decomposition_not_the_eager_cache(spyre, fresh_cache):
    from torch._dynamo.utils import counters

    x = torch.randn(8, 8, device=spyre)
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lambda t: torch.softmax(t * 2, -1) + 1, dynamic=False)
    torch.testing.assert_close(fn(x).cpu(), torch.softmax(x.cpu() * 2, -1) + 1)
    stats = torch.spyre.eager_cache_stats()
    assert stats.misses == 0 and stats.compiles == 0  # the graph ran its own programs
    frames = counters["frames"]["total"]
    # eager ops compile through compile_fx_inner: no Dynamo frame, no graph break, no recompile
    for n in range(1, 6):
        torch.softmax(torch.randn(n, 8, device=spyre), -1)
    assert counters["frames"]["total"] == frames
    assert not counters["graph_break"]
    assert torch.spyre.eager_cache_stats().compiles >= 5


def test_eager_compiles_do_not_share_dynamos_recompile_limit(spyre, monkeypatch, fresh_cache):
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=2):
        torch._dynamo.reset()
        for n in range(1, 8):  # seven eager compiles of one op
            torch.relu(torch.randn(n, 3).to(spyre))
        from torch._dynamo.utils import counters

        fn = torch.compile(lambda t: torch.relu(t) * 3, dynamic=False)
        monkeypatch.setenv("SPYRE_STRICT", "1")
        graphs = counters["stats"]["unique_graphs"]
        for n in (4, 5):  # two compiles: within the limit of 2, so still compiled for spyre
            t = torch.randn(n, 3)
            torch.testing.assert_close(fn(t.to(spyre)).cpu(), torch.relu(t) * 3)
        # both frames compiled (an exceeded limit would run them eagerly, as eager spyre programs)
        assert counters["stats"]["unique_graphs"] - graphs == 2


def test_threads_compile_a_key_once(spyre, fresh_cache):
    a = torch.randn(32, 32)
    x = a.to(spyre)
    errors = []

    def work():
        try:
            for _ in range(5):
                torch.testing.assert_close(torch.tanh(x).cpu(), torch.tanh(a))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(_entry(torch.ops.aten.tanh.default)) == 1


def test_cpu_scalar_tensors_mix_in(spyre, fresh_cache):
    # PyTorch lets a CPU 0-d tensor meet a spyre tensor: it is copied to the card (a program
    # cannot read host memory) and the op runs as a program (test_eager_checks.py: under strict)
    assert torch.equal((torch.ones(2, device=spyre) * torch.tensor(3.0)).cpu(), torch.full((2,), 3.0))


def test_random_ops_are_routable_once_compiled():
    from spyre_inductor.eager import ops
    from spyre_inductor.eager.signature import Mode, signature_of

    sig = signature_of(torch.ops.aten.normal_.default)
    assert sig is not None and sig.mode is Mode.INPLACE and sig.has_generator
    assert "normal_" not in ops.ROUTED  # another branch's (RNG); the table entry is all it takes


def test_eager_ops_compile_and_run_under_a_users_dispatch_mode(spyre, strict, fresh_cache):
    # A TorchDispatchMode (a debug mode, FlopCounterMode) sees the op, then calls it: the spyre
    # kernel is then reached with every key from Python down excluded, and still compiles it.
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(8, 16)
    xs = x.to(spyre)
    with Seen() as seen:
        (total, programs) = _programs_launched(lambda: (xs + 1.5).softmax(-1).sum())
    assert torch.ops.aten.add.Tensor in seen.ops and programs == 3
    torch.testing.assert_close(total.cpu(), (x + 1.5).softmax(-1).sum())
    with FlopCounterMode(display=False) as flops:
        y = torch.mm(xs, xs.t())
    assert flops.get_total_flops() == 2 * 8 * 16 * 8
    torch.testing.assert_close(y.cpu(), x @ x.t())
    assert CACHE.stats().cpu_routes == 0


@pytest.mark.parametrize("is_strict", [False, True])
def test_an_in_place_result_that_cannot_be_cast_is_refused_as_on_the_cpu(spyre, monkeypatch, fresh_cache, is_strict):
    # Fake tensors and the decomposition would both cast the float result into the integers;
    # PyTorch refuses, and so does spyre, leaving the tensor as it was.
    monkeypatch.setenv("SPYRE_STRICT", "1" if is_strict else "0")
    x = torch.arange(6).to(spyre)
    for inplace in (lambda t: t.mul_(0.5), lambda t: t.add_(torch.full((6,), 0.5, device=t.device)),
                    lambda t: t.sqrt_()):
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            inplace(x)
    assert x.cpu().tolist() == list(range(6))
    x.masked_fill_(x > 2, 0.5)  # no type promotion: the value is cast, as on the CPU
    x.mul_(2)
    assert x.cpu().tolist() == [0, 2, 4, 0, 0, 0]


def test_what_the_key_must_tell_apart(spyre, strict, fresh_cache):
    # a negative view's bit (its stored values are not its values), -0.0 from 0.0 (a value-keyed
    # fp16 scalar), and a write into memory another argument shares (on every call, not only
    # the first: the key does not say which tensors alias)
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    n = torch._neg_view(a.to(spyre))
    assert torch.equal((n + 1).cpu(), -a + 1)
    h = torch.ones(4, dtype=torch.float16).to(spyre)
    h * 0.0
    assert torch.equal((1 / (h * -0.0)).cpu(), torch.full((4,), float("-inf"), dtype=torch.float16))
    b = torch.arange(8.0).to(spyre)
    torch.mul(b[::2], 2, out=torch.empty(4, device=spyre))  # compiled: the same key, no alias
    with pytest.raises(NotImplementedError, match="a tensor it writes shares memory with another"):
        torch.mul(b[::2], 2, out=b[1::2])


def test_writing_an_expanded_tensor_in_place_gets_pytorchs_error(spyre, strict, fresh_cache):
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
        torch.zeros(1, device=spyre).expand(4).mul_(2)
