"""Compiled matmuls on spyre run on the PE arrays, in spyre programs, and match the CPU.

Every test compiles under SPYRE_STRICT=1, so any part of the graph that
would run through a CPU fallback (an extern ``mm``, an unsupported node)
fails the test; and each checks that a MatmulKernel artifact was produced.

Tolerances are derived, not blanket. The reference is computed in fp64 from
the (exactly widened) inputs. The PE accumulates products in fp32 (products
of fp16/bf16 values are exact in fp32; of fp32 values each rounds once) in
another order than any reference, so an fp32 result differs from the exact
sum by at most gamma_{K+1} * sum_k |a_mk| |b_kn| (gamma_n = n u / (1 - n u),
u = 2^-24): the standard bound for a recursively summed dot product, which
holds for any summation order. A 16-bit output then rounds once: plus half
an ulp of the output dtype at the result. An epilogue adds its own fp32
roundings (a few u relative to the value) and scales the matmul error by at
most its Lipschitz constant (1 for a bias add, 1.13 for GELU): ``EPILOGUE``.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler.ir.kernel_ir import MatmulKernel

from inductor_helpers import compile_on_spyre

U32 = 2.0 ** -24
UNIT = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}  # half an ulp, relative
EPILOGUE = (1.2, 8 * U32)  # (Lipschitz factor on the matmul error, fp32 roundings of the epilogue)


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def matmul_bound(a, b, ref, out_dtype, epilogue=False):
    """Per-element bound on |spyre - exact| for out = epilogue(a @ b) (see the module docstring)."""
    K = a.shape[-1]
    mag = a.double().abs() @ b.double().abs()
    err = gamma(K + 1) * mag
    if epilogue:
        lip, rounds = EPILOGUE
        err = lip * err + rounds * ref.abs()
    return err + UNIT[out_dtype] * ref.abs() * (1 + 2.0 ** -10) + 1e-30


def check(got, ref, bound, what):
    diff = (got.double() - ref).abs()
    worst = (diff - bound).max().item()
    assert worst <= 0, (f"{what}: |spyre - exact| exceeds the derived bound by {worst:.3g} "
                        f"(max diff {diff.max().item():.3g})")


def matmul_records(records):
    return [r for r in records if isinstance(r.kernel, MatmulKernel)]


def assert_on_card(records, code, matmul=True):
    assert "extern_kernels." not in code, "a matmul ran as an extern kernel"
    assert not matmul or matmul_records(records), "no MatmulKernel was compiled"
    for r in records:
        assert r.artifact is not None and r.fallback_reason is None, (r.nodes, r.fallback_reason)


CASES = [
    ((67, 256), (256, 128)),
    ((55, 2), (2, 99)),
    ((67, 255), (255, 128)),
    ((67, 67), (67, 67)),
    ((3, 1, 256), (3, 256, 128)),
    ((2, 256, 1), (2, 1, 128)),
    ((2, 3, 64, 128), (2, 3, 128, 64)),
    ((2, 64, 128), (128, 512)),
    ((1, 256), (256, 64)),       # decode: M = 1
    ((64, 256), (256, 1)),       # N = 1
]


@pytest.mark.parametrize("sa,sb", CASES, ids=[f"{a}@{b}" for a, b in CASES])
def test_matmul_matches_cpu_fp32(sa, sb):
    torch.manual_seed(0)
    a, b = torch.randn(sa), torch.randn(sb)
    (out,), _, records, _, code = compile_on_spyre(torch.matmul, a, b)
    # K = 1 is an outer product: PyTorch's decomposition makes it a broadcast multiply (pointwise)
    assert_on_card(records, code, matmul=sa[-1] > 1)
    ref = torch.matmul(a.double(), b.double())
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32), f"{sa}@{sb}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sa,sb", [((67, 256), (256, 128)), ((3, 1, 256), (3, 256, 128)), ((67, 255), (255, 128))])
def test_matmul_16bit_accumulates_in_fp32(sa, sb, dtype):
    torch.manual_seed(1)
    a, b = torch.randn(sa).to(dtype), torch.randn(sb).to(dtype)
    (out,), _, records, _, code = compile_on_spyre(torch.matmul, a, b)
    assert_on_card(records, code)
    assert out.dtype == dtype
    ref = torch.matmul(a.double(), b.double())
    check(out.cpu(), ref, matmul_bound(a, b, ref, dtype), f"{dtype} {sa}@{sb}")


def test_linear_with_bias_3d_input():
    torch.manual_seed(2)
    x, w, bias = torch.randn(1, 11, 1024), torch.randn(512, 1024), torch.randn(512)
    (out,), _, records, _, code = compile_on_spyre(F.linear, x, w, bias)
    assert_on_card(records, code)
    ref = x.double() @ w.double().t() + bias.double()
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, torch.float32, epilogue=True), "linear")


def test_linear_without_bias_reads_the_weight_transposed_on_chip():
    torch.manual_seed(3)
    x, w = torch.randn(16, 256), torch.randn(192, 256)
    (out,), _, records, _, code = compile_on_spyre(F.linear, x, w)
    assert_on_card(records, code)
    ref = x.double() @ w.double().t()
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, torch.float32), "linear no bias")


def test_addmm_with_bias_and_scales():
    torch.manual_seed(4)
    inp, a, b = torch.randn(1152), torch.randn(10, 1152), torch.randn(1152, 1152)
    (out,), _, records, _, code = compile_on_spyre(lambda i, x, y: torch.addmm(i, x, y), inp, a, b)
    assert_on_card(records, code)
    ref = inp.double() + a.double() @ b.double()
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32, epilogue=True), "addmm")
    (out,), _, records, _, code = compile_on_spyre(
        lambda i, x, y: torch.addmm(i, x, y, beta=0.5, alpha=2.0), inp, a, b)
    assert_on_card(records, code)
    ref = 0.5 * inp.double() + 2.0 * (a.double() @ b.double())
    check(out.cpu(), ref, 2 * matmul_bound(a, b, ref, torch.float32, epilogue=True), "addmm scaled")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_linear_with_bias_rounds_once(dtype):
    """The bias is added to the fp32 sum and the result rounded once (eager's contract): a
    rounding of the product before the add would miss half an ulp on many elements."""
    torch.manual_seed(10)
    x, w, bias = torch.randn(64, 256).to(dtype), torch.randn(128, 256).to(dtype), (torch.randn(128) * 30).to(dtype)
    (out,), _, records, _, code = compile_on_spyre(F.linear, x, w, bias)
    assert_on_card(records, code)
    ref = x.double() @ w.double().t() + bias.double()
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, dtype), f"{dtype} linear + bias")


def test_an_empty_k_is_a_zero_matmul():
    a, b = torch.randn(40, 0), torch.randn(0, 48)
    (out,), _, records, _, code = compile_on_spyre(torch.mm, a, b)
    assert_on_card(records, code, matmul=False)
    assert torch.equal(out.cpu(), torch.zeros(40, 48))
    inp = torch.randn(48)
    (out,), _, records, _, code = compile_on_spyre(lambda i, x, y: torch.addmm(i, x, y, beta=2.0), inp, a, b)
    assert torch.equal(out.cpu(), (2.0 * inp).expand(40, 48))


def test_baddbmm_and_einsum():
    torch.manual_seed(5)
    inp, a, b = torch.randn(4, 8, 16), torch.randn(4, 8, 32), torch.randn(4, 32, 16)
    (out,), _, records, _, code = compile_on_spyre(lambda i, x, y: torch.baddbmm(i, x, y), inp, a, b)
    assert_on_card(records, code)
    ref = inp.double() + a.double() @ b.double()
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32, epilogue=True), "baddbmm")
    (out,), _, records, _, code = compile_on_spyre(lambda x, y: torch.einsum("bik,bkj->bij", x, y), a, b)
    assert_on_card(records, code)
    ref = a.double() @ b.double()
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32), "einsum")


def test_linear_bias_gelu_is_one_program():
    torch.manual_seed(6)
    x, w, bias = torch.randn(67, 256), torch.randn(128, 256), torch.randn(128)
    (out,), _, records, _, code = compile_on_spyre(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, bias)
    assert_on_card(records, code)
    assert len(records) == 1, [r.nodes for r in records]
    ref = F.gelu(x.double() @ w.double().t() + bias.double())
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, torch.float32, epilogue=True), "linear+gelu")


def test_residual_epilogue_and_fp16_output_cast():
    torch.manual_seed(7)
    x, w, r = torch.randn(64, 128).half(), torch.randn(128, 128).half(), torch.randn(64, 128).half()
    fn = lambda x, w, r: torch.relu(x @ w) + r  # noqa: E731
    (out,), _, records, _, code = compile_on_spyre(fn, x, w, r)
    assert_on_card(records, code)
    assert len(records) == 1
    # the matmul result is rounded to fp16 (the mm's dtype) before relu and the add, as eager does
    mm = (x.double() @ w.double()).half().double()
    ref = torch.relu(mm) + r.double()
    bound = matmul_bound(x, w, ref, torch.float16, epilogue=True) + 2.0 ** -11 * mm.abs()
    check(out.cpu(), ref, bound, "relu(x @ w) + r")


@pytest.mark.slow
def test_large_matmul_2048x2048x4096():
    torch.manual_seed(8)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 4096)
    (out,), _, records, _, code = compile_on_spyre(torch.mm, a, b)
    assert_on_card(records, code)
    ref = a.double() @ b.double()
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32), "2048x2048x4096")


def test_a_matmul_the_pe_plans_decline_is_planned_as_a_reduction_on_the_card(monkeypatch):
    """What the PE family refuses is still a reduction (the dot a sum of products): strict mode
    passes, one program, the right values."""
    from spyre_inductor.compiler.families.matmul import family
    from spyre_inductor.compiler.ir.errors import Unsupported

    def refuse(kernel, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setattr(family, "plan_matmul", refuse)
    torch.manual_seed(9)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    (out,), _, records, _, code = compile_on_spyre(lambda x, y: torch.relu(x @ y), a, b)
    assert_on_card(records, code)
    ref = torch.relu(a.double() @ b.double())
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32, epilogue=True), "matmul as a reduction")


def test_a_matmul_no_family_takes_runs_on_the_cpu_inside_the_graph(monkeypatch):
    """Without strict mode a MatmulKernel the backend refuses is an in-graph CPU fallback, warned
    about by name, and right: the dot contracts its operands (no (m, n, k) product in memory)."""
    from spyre_inductor.compiler import backend
    from spyre_inductor.compiler.ir.errors import Unsupported

    monkeypatch.delenv("SPYRE_STRICT")

    def refuse(kernel, artifact_root, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setattr(backend, "compile_kernel", refuse)
    torch.manual_seed(9)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    (out,), _, records, warns, _ = compile_on_spyre(lambda x, y: torch.relu(x @ y), a, b)
    assert [r.fallback_reason for r in records] == ["backend: refused by the test"]
    assert any("aten.mm.default" in w for w in warns)
    ref = torch.relu(a.double() @ b.double())
    check(out.cpu(), ref, matmul_bound(a, b, ref, torch.float32, epilogue=True), "declined matmul")


def test_an_integer_matmul_is_a_named_cpu_fallback_refused_under_strict():
    a, b = torch.randint(-5, 5, (8, 16)), torch.randint(-5, 5, (16, 4))
    with pytest.raises(Exception, match="aten::mm.*SPYRE_STRICT=1"):
        compile_on_spyre(torch.mm, a, b)


@pytest.mark.parametrize("is_strict", [False, True])
@pytest.mark.parametrize("case", ["mm", "addmm", "linear", "linear bias"])
def test_a_matmul_of_two_dtypes_raises_the_cpus_error_as_it_compiles(monkeypatch, case, is_strict):
    # Fake tensors let f32 @ f16 through (the result in the first dtype); the lowering asks the
    # CPU kernel, as eager does (tests/eager/test_eager_checks.py).
    monkeypatch.setenv("SPYRE_STRICT", "1" if is_strict else "0")
    fn = {"mm": lambda a, w, b: a @ w.t(),
          "addmm": lambda a, w, b: torch.addmm(b, a, w.t()),
          "linear": lambda a, w, b: F.linear(a, w),
          "linear bias": lambda a, w, b: F.linear(a, w, b)}[case]
    a, w, b = torch.randn(8, 16), torch.randn(4, 16).half(), torch.randn(4)
    with pytest.raises(RuntimeError) as cpu:
        fn(a, w, b)
    with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
        compile_on_spyre(fn, a, w, b)
    # of one dtype, it compiles
    (out,), *_ = compile_on_spyre(fn, a, w.float(), b)
    torch.testing.assert_close(out.cpu(), fn(a, w.float(), b), rtol=1e-5, atol=1e-5)


def test_a_compiled_matmul_of_a_spyre_and_a_cpu_tensor_raises_as_cuda_does():
    # (Dynamo's fake tensors raise it while tracing, in eager's words: tests/eager/test_eager_checks.py)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: a @ b)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two "
                                           "devices, spyre:0 and cpu!"):
        f(torch.randn(4, 3).to("spyre"), torch.randn(3, 5))


def test_a_prefill_up_projection_with_its_silu_gate_epilogue_matches_the_cpu():
    """The Llama demo's up projection (128 rows, x @ W.t(), silu(gate) * up): a ring plan sharing x
    whose A tiles hold several k-steps (tiling.a_tk), and whose epilogue is run and stored in
    pieces of rows. The matmul rounds to fp16 before the epilogue, as eager; a rounding on the
    other side of a tie than the reference's is one ulp of it; a result among fp16's subnormals
    rounds to half their spacing (2^-25), not half an ulp relative."""
    torch.manual_seed(11)
    x, w, g = (torch.randn(128, 256) / 4).half(), (torch.randn(768, 256) / 4).half(), torch.randn(128, 768).half()
    (out,), _, records, _, code = compile_on_spyre(lambda x, w, g: F.silu(g) * F.linear(x, w), x, w, g)
    assert_on_card(records, code)
    [record] = matmul_records(records)
    tiling = json.loads((record.artifact / "plan.json").read_text())["tiling"]
    assert tiling["share"] == "a" and tiling["a_tk"] > tiling["tk"], tiling
    mm = (x.double() @ w.double().t()).half().double()
    gate = F.silu(g.double())
    ref = gate * mm
    mag = x.double().abs() @ w.double().abs().t()
    bound = ((gamma(257) * mag + 2.0 ** -10 * mm.abs()) * gate.abs() + (UNIT[torch.float16] * (1 + 2.0 ** -10)
             + 8 * U32) * ref.abs() + 2.0 ** -25)
    check(out.cpu(), ref, bound, "silu(gate) * (x @ W.t())")
