"""Nodes the backend cannot compile run on the CPU inside the compiled graph: right answers,
one warning per op naming it, an error naming it under SPYRE_STRICT=1."""

import pytest
import torch


from conftest import run_python
from inductor_helpers import assert_close_to_cpu, compile_on_spyre, refuse_every_kernel


def many_unsupported(x, idx, w):
    s = x.sum(1, keepdim=True)  # a reduction (compiled or not, the answer is right)
    v = (x.t() + 1).reshape(-1) * 2  # reshape of a transposed tensor: compiled (the loops split)
    m = (idx.view(2, 2) @ idx.view(2, 2)) * 2  # an integer matmul: the eager device's, then compiled
    c = torch.logcumsumexp(x, 1)  # a scan whose combine is not one add or multiply
    return s, v, m, c, (x - s).exp()


def test_unsupported_nodes_run_on_the_cpu_with_one_warning_each():
    x, idx, w = torch.randn(8, 16), torch.tensor([1, 3, 5, 3]), torch.randn(16, 4)
    out, _, records, warned, code = compile_on_spyre(many_unsupported, x, idx, w)
    assert_close_to_cpu(out, many_unsupported(x, idx, w))
    fallbacks = [r for r in records if r.fallback_reason is not None]
    compiled = [r for r in records if r.artifact is not None]
    assert fallbacks and compiled  # the graph mixes both
    reasons = " | ".join(r.fallback_reason for r in fallbacks)
    for expected in ("logcumsumexp",):
        assert expected in reasons, reasons
    # One warning per distinct op label, each naming the aten ops it covers.
    assert len(warned) == len({r.ops for r in fallbacks}) == len(set(warned))
    assert any("aten.logcumsumexp" in m for m in warned)
    assert "spyre_host.run(" in code and "launch_jobplan(" in code


def test_a_refused_kernel_with_masked_loads_runs_them_on_the_cpu(monkeypatch):
    # The host runs a refused kernel's body as Inductor wrote it: the pad's border loads stay
    # masked (never read outside x).
    refuse_every_kernel(monkeypatch)
    x = torch.randn(8, 16)
    fn = lambda a: torch.nn.functional.pad(a, (1, 2)) + 1  # noqa: E731
    out, _, _, _, code = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x))
    assert "spyre_host.where(" in code


def test_each_cpu_kernel_warns_when_it_first_runs_naming_itself():
    x = torch.randn(64, 32)
    fn = lambda a: torch.logcumsumexp(a, 1) * 2  # noqa: E731 - a scan whose combine is not an add: not compiled
    _, args, _, warned, _ = compile_on_spyre(fn, x)
    assert len(warned) == 1 and "aten.logcumsumexp" in warned[0] and "as its kernel spyre_cpu_kernel_" in warned[0]
    # compile_on_spyre resets the record of what warned; keep it now. The same graph run again
    # says nothing more; a new graph's CPU kernel of the same op is new CPU work: it warns too.
    import warnings

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as again, torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("always")
        torch.compile(fn)(args[0])
        other = torch.compile(lambda a: torch.logcumsumexp(a, 0) + 1)
        other(args[0])
        other(args[0])
    about = [str(w.message) for w in again if "aten.logcumsumexp" in str(w.message)]
    assert len(about) == 1 and "as its kernel spyre_cpu_kernel_" in about[0], about


def test_fallback_reports_count_cpu_kernels_and_eager_ops():
    x = torch.randn(16, 32).to("spyre")
    torch._dynamo.reset()
    f = torch.compile(lambda a: torch.logcumsumexp(a, 1) * 2)
    f(x)  # (compiled: the first call)
    torch.spyre.reset_fallback_reports()
    f(x), f(x), f(x)
    torch.lgamma(x)  # an eager op without a spyre kernel
    torch.spyre.synchronize()
    kernel, op = torch.spyre.fallback_reports()
    assert kernel.name.startswith("spyre_cpu_kernel_") and kernel.ops == "aten.logcumsumexp.default"
    assert kernel.graph.endswith(".py") and kernel.calls == 3 and kernel.host_seconds > 0
    assert op.name.startswith("aten::lgamma") and op.calls == 1 and op.host_seconds > 0
    torch.spyre.reset_fallback_reports()
    assert torch.spyre.fallback_reports() == []


def test_strict_mode_raises_naming_the_op(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")
    x = torch.randn(4, 32)
    with pytest.raises(Exception, match=r"aten\.logcumsumexp.*SPYRE_STRICT=1"):
        compile_on_spyre(lambda a: torch.logcumsumexp(a, 1) + 1, x)


def test_strict_mode_still_compiles_supported_graphs(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")
    x = torch.randn(4, 32)
    out, _, records, warned, _ = compile_on_spyre(lambda a: (a * 2).sigmoid(), x)
    assert_close_to_cpu(out, (x * 2).sigmoid())
    assert not warned and all(r.artifact is not None for r in records)


def test_backend_refusal_falls_back_to_the_cpu(monkeypatch):
    refuse_every_kernel(monkeypatch)
    x, y = torch.randn(8, 8), torch.randn(8)
    fn = lambda a, b: (a + b).tanh()  # noqa: E731
    out, _, records, warned, code = compile_on_spyre(fn, x, y)
    assert_close_to_cpu(out, fn(x, y))
    (record,) = records
    assert record.kernel is not None and "refused by the test" in record.fallback_reason
    assert len(warned) == 1 and "refused by the test" in warned[0]
    assert "launch_jobplan(" not in code


def test_dynamic_shapes_compile_for_their_bucket_and_stay_correct():
    # (issue 18: they fell back before; tests/compiler/test_symbolic_sizes.py has the rest)
    fn = lambda a: a * 2 + 1  # noqa: E731
    for n in (5, 9):
        x = torch.randn(n, 3)
        out, _, records, warned, _ = compile_on_spyre(fn, x, dynamic=True)
        assert_close_to_cpu(out, fn(x))
        assert records and all(r.fallback_reason is None and r.kernel.symbolic is not None for r in records)
        assert not warned


def test_compiled_graph_on_the_second_device():
    # In a child process: a prepared program stays allocated while its compiled
    # module lives (Inductor keeps those for the process), and the other tests
    # expect spyre:1 to be empty.
    result = run_python(
        "import torch, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from torch._inductor.utils import run_and_get_code\n"
        "from spyre_inductor.compiler.inductor.scheduling import record_kernels\n"
        "x, y = torch.randn(8, 64), torch.randn(8, 64)\n"
        "fn = lambda a, b: ((a - b).abs(), torch.logcumsumexp(a, 1))  # compiled, CPU fallback\n"
        "with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):\n"
        "    out, (code,) = run_and_get_code(torch.compile(fn), x.to('spyre:1'), y.to('spyre:1'))\n"
        "assert all(o.device == torch.device('spyre', 1) for o in out), out\n"
        "for o, r in zip(out, fn(x, y)): torch.testing.assert_close(o.cpu(), r)\n"
        "assert 'device=1)' in code and \"device='spyre:1'\" in code\n"
        "assert any(r.artifact is not None for r in records) and any(r.fallback_reason for r in records)\n"
        "print('ok')\n",
        SPYRE_NUM_DEVICES=2,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_in_place_update_inside_a_fallback_node():
    x = torch.randn(6, 6)

    def fn(a):
        a.copy_(a.t() * 2)  # transposed read of the buffer being written: cannot be one pointwise kernel pass
        return a + 1

    out, (xs,), _, _, _ = compile_on_spyre(fn, x)
    torch.testing.assert_close(xs.cpu(), x.t() * 2)
    torch.testing.assert_close(out[0].cpu(), x.t() * 2 + 1)
