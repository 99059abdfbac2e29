"""conv2d on spyre runs on the PE arrays, eager and compiled, and matches the CPU: as the conv
family's implicit GEMM where it takes the conv (families/convolution), else as a patch gather and
a matmul (compiler/inductor/convolution.py).

Every test but the refusals' runs under SPYRE_STRICT=1, so a convolution that ran through the
CPU fallback (an extern convolution, the eager CPU route) fails it; each also checks that a
ConvKernel or MatmulKernel program was built and that no kernel of the graph fell back.

Tolerances are derived as test_compiled_matmul.py's: a convolution is a matmul over
K = C*KH*KW, so |spyre - exact| <= gamma_{K+1} * conv(|x|, |w|) (+ |bias|), times 1.2 plus a few
fp32 roundings for the bias epilogue, plus half an ulp of a 16-bit output; the exact result is
computed in fp64 from the (exactly widened) inputs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.compiler.ir.kernel_ir import ConvKernel, MatmulKernel
from spyre_inductor.device import fallback
from spyre_inductor.eager.cache import CACHE
from spyre_inductor.eager.launch import CompiledEntry

from inductor_helpers import compile_on_spyre

U32 = 2.0 ** -24
HALF_ULP = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}

# (name, input shape, weight shape, stride, padding, dilation, bias, channels-last[, groups])
CASES = [
    ("vit_patch_embed", (2, 3, 32, 32), (64, 3, 8, 8), 8, 0, 1, True, False),
    ("vit_patch_remainder", (1, 3, 19, 21), (16, 3, 8, 8), 8, 0, 1, True, False),
    ("3x3_pad1", (2, 4, 10, 10), (8, 4, 3, 3), 1, 1, 1, True, False),
    ("3x3_stride2", (1, 5, 11, 12), (6, 5, 3, 3), 2, 1, 1, False, False),
    ("dilated_no_bias", (1, 3, 12, 13), (4, 3, 3, 2), (2, 1), (2, 1), (2, 1), False, False),
    ("3x3_channels_last", (2, 8, 9, 9), (16, 8, 3, 3), 1, 1, 1, True, True),
    # channels filling a stick: the NCHW image is made channels-last before the patch copy
    ("3x3_wide_nchw", (1, 32, 8, 8), (16, 32, 3, 3), 2, 1, 1, True, False),
    ("vit_channels_last", (1, 3, 16, 16), (32, 3, 4, 4), 4, 0, 1, True, True),
    # one matmul per group, a bmm over the groups
    ("grouped", (2, 4, 7, 9), (6, 2, 3, 3), 1, 1, 1, True, False, 2),
    ("depthwise_channels_last", (1, 6, 11, 11), (6, 1, 3, 3), 2, 1, 1, False, True, 6),
]
IDS = [c[0] for c in CASES]


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _inputs(case, dtype=torch.float32):
    _, xs, ws, stride, padding, dilation, bias, channels_last, *groups = case
    torch.manual_seed(0)
    x, w = torch.randn(xs).to(dtype), torch.randn(ws).to(dtype) / ws[1]
    b = torch.randn(ws[0]).to(dtype) if bias else None
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, w, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups[0] if groups else 1)


def _bound(x, w, b, conv, ref, dtype):
    """Per-element bound on |spyre - exact| (see the module docstring)."""
    k = w.shape[1] * w.shape[2] * w.shape[3]
    mag = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), **conv)
    gamma = (k + 1) * U32 / (1 - (k + 1) * U32)
    return 1.2 * gamma * mag + 8 * U32 * ref.abs() + HALF_ULP[dtype] * ref.abs() * (1 + 2.0 ** -10) + 1e-30


def _check(got, x, w, b, conv, dtype):
    exact = F.conv2d(x.double(), w.double(), None if b is None else b.double(), **conv)
    diff = (got.double() - exact).abs()
    worst = (diff - _bound(x, w, b, conv, exact, dtype)).max().item()
    assert worst <= 0, f"|spyre - exact| exceeds the derived bound by {worst:.3g} (max diff {diff.max():.3g})"


def _meta_stride(x, w, b, conv):
    """The output strides PyTorch's meta kernel gives a convolution off the CPU and CUDA (what a
    traced graph, compiled or eager, promises): contiguous, whatever the input's memory format."""
    meta = [t.to("meta") if t is not None else None for t in (x, w, b)]
    return F.conv2d(*meta, **conv).stride()


def _assert_on_card(records):
    """The PE ran it: the conv family's program (an implicit GEMM) or the patch copy's matmul."""
    assert any(isinstance(r.kernel, (ConvKernel, MatmulKernel)) for r in records), "no PE program was built"
    for r in records:
        assert r.artifact is not None and r.fallback_reason is None, (r.nodes, r.fallback_reason)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_conv2d_is_a_matmul_program_and_matches_the_cpu(case, strict):
    x, w, b, conv = _inputs(case)
    (out,), _, records, _, code = compile_on_spyre(lambda x, w, b: F.conv2d(x, w, b, **conv), x, w, b)
    assert "extern_kernels.convolution" not in code
    _assert_on_card(records)
    ref = F.conv2d(x, w, b, **conv)
    assert out.shape == ref.shape and out.stride() == _meta_stride(x, w, b, conv)
    _check(out.cpu(), x, w, b, conv, torch.float32)


def _eager(fn, *args):
    """fn on spyre copies of args with a fresh eager cache: (outputs on the CPU, kernel records,
    the compiled entries)."""
    CACHE.clear()
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        out = fn(*[a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args])
    entries = [e for _, e in CACHE.entries()]
    return out, records, entries


def _conv_entries(entries):
    return [e for e in entries if isinstance(e, CompiledEntry)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eager_conv2d_runs_a_compiled_matmul_program_and_matches_the_cpu(case, strict):
    x, w, b, conv = _inputs(case)
    out, records, entries = _eager(lambda x, w, b: F.conv2d(x, w, b, **conv), x, w, b)
    _assert_on_card(records)
    assert entries and all(isinstance(e, CompiledEntry) and not e.cpu_calls for e in entries), \
        [e.describe() for e in entries]
    ref = F.conv2d(x, w, b, **conv)
    assert out.shape == ref.shape and out.stride() == _meta_stride(x, w, b, conv)
    _check(out.cpu(), x, w, b, conv, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[IDS[0], IDS[2]])
def test_16bit_conv2d_accumulates_in_fp32_and_rounds_once(case, dtype, strict):
    x, w, b, conv = _inputs(case, dtype)
    (out,), _, records, _, _ = compile_on_spyre(lambda x, w, b: F.conv2d(x, w, b, **conv), x, w, b)
    _assert_on_card(records)
    assert out.dtype == dtype
    _check(out.cpu(), x, w, b, conv, dtype)
    eager, _, _ = _eager(lambda x, w, b: F.conv2d(x, w, b, **conv), x, w, b)
    _check(eager.cpu(), x, w, b, conv, dtype)


BACKWARD = [c for c in CASES if c[0] in ("vit_patch_embed", "vit_patch_remainder", "3x3_stride2", "dilated_no_bias",
                                         "3x3_channels_last", "grouped", "depthwise_channels_last")]


@pytest.mark.parametrize("case", BACKWARD, ids=[c[0] for c in BACKWARD])
def test_eager_backward_gives_the_cpus_grad_input_weight_and_bias(case, strict):
    x, w, b, conv = _inputs(case)
    torch.manual_seed(1)
    g = torch.randn(F.conv2d(x, w, b, **conv).shape)

    def grads(x, w, b, g):
        leaves = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
        xb, wb, bb = leaves[0], leaves[1], leaves[2] if b is not None else None
        (F.conv2d(xb, wb, bb, **conv) * g).sum().backward()
        return [t.grad for t in leaves]

    ref = grads(x, w, b, g)
    got, records, entries = _eager(grads, x, w, b, g)
    assert any(isinstance(r.kernel, MatmulKernel) for r in records)
    assert all(isinstance(e, CompiledEntry) and not e.cpu_calls for e in entries), [e.describe() for e in entries]
    for name, r, o in zip(("input", "weight", "bias"), ref, got):
        assert o.shape == r.shape, name
        torch.testing.assert_close(o.cpu(), r, rtol=0, atol=2e-5 * r.abs().max().item(), msg=f"grad {name}")


def test_eager_backward_skips_the_input_gradient_nobody_asked_for(strict):
    """The first layer's input needs no gradient (output_mask[0] False): the backward's graph
    computes only grad_weight and grad_bias."""
    x, w, b, conv = _inputs(CASES[2])

    def grads(x, w, b):
        wb, bb = w.requires_grad_(), b.requires_grad_()
        F.conv2d(x, wb, bb, **conv).sum().backward()
        return wb.grad, bb.grad

    ref = grads(x, w.clone(), b.clone())
    got, _, _ = _eager(grads, x, w, b)
    for r, o in zip(ref, got):
        torch.testing.assert_close(o.cpu(), r, rtol=0, atol=2e-5 * r.abs().max().item())


REFUSED = [
    ("transposed", lambda x, w: F.conv_transpose2d(x, w), (1, 4, 5, 5), (4, 3, 3, 3)),
    ("3-d", lambda x, w: F.conv3d(x, w), (1, 2, 4, 5, 5), (3, 2, 2, 2, 2)),
]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("what,fn,xs,ws", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_form_not_decomposed_is_refused_by_name_under_strict_and_right_without(monkeypatch, mode, what, fn, xs, ws):
    torch.manual_seed(0)
    x, w = torch.randn(xs), torch.randn(ws)
    run = torch.compile(fn) if mode == "compiled" else fn
    torch._dynamo.reset()
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(NotImplementedError, match=f"convolution_overrideable.*{what}.*SPYRE_STRICT=1"):
        run(x.to("spyre"), w.to("spyre"))
    monkeypatch.setenv("SPYRE_STRICT", "0")
    torch._dynamo.reset()
    fallback.reset_warnings()  # (warned once per op)
    with pytest.warns(UserWarning, match=what):
        out = run(x.to("spyre"), w.to("spyre"))
    torch.testing.assert_close(out.cpu(), fn(x, w))


# (the CPU-only arithmetic test's too: a 1x1 conv is a disjoint tiling; stride > kernel leaves gaps)
ARITHMETIC = CASES + [
    ("1x1", (2, 5, 7, 9), (4, 5, 1, 1), 1, 0, 1, True, False),
    ("gaps", (1, 3, 11, 11), (4, 3, 2, 3), (3, 4), (1, 2), 1, True, True),
]


@pytest.mark.parametrize("case", ARITHMETIC, ids=[c[0] for c in ARITHMETIC])
def test_the_patch_arithmetic_is_exact_on_the_cpu_in_fp64(case):
    """convolution.py's index arithmetic over ATen ops (convolution.ATEN) on the CPU in fp64,
    forward and all three gradients: any error is an indexing error, not rounding."""
    from spyre_inductor.compiler.inductor import convolution

    x, w, b, conv = _inputs(case, torch.float64)
    b = b if b is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    ref = F.conv2d(*leaves, **conv)
    g = torch.randn(ref.shape, dtype=torch.float64)
    want = torch.autograd.grad(ref, leaves, g)
    pairs = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    args = [pairs(conv[k]) for k in ("stride", "padding", "dilation")]
    channels_last = case[7]
    out = convolution.conv2d(convolution.ATEN, x, w, b, *args, channels_last, conv["groups"])
    got = convolution.conv2d_backward(convolution.ATEN, g, x, w, *args, [True, True, True], conv["groups"],
                                      channels_last)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    for o, r in zip(got, want):
        torch.testing.assert_close(o, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[IDS[0], IDS[2]])
def test_compiled_training_step_runs_the_backward_as_programs(case, strict):
    """torch.compile of forward and backward: convolution_backward lowers the same way."""
    x, w, b, conv = _inputs(case)

    wr, br = w.detach().requires_grad_(), b.detach().requires_grad_()
    F.conv2d(x, wr, br, **conv).square().sum().backward()
    xs, ws, bs = (t.to("spyre") for t in (x, w, b))
    fn = torch.compile(lambda x, w, b: F.conv2d(x, w, b, **conv).square().sum())
    torch._dynamo.reset()
    ws.requires_grad_(), bs.requires_grad_()
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        fn(xs, ws, bs).backward()
    _assert_on_card(records)
    for got, want in ((ws.grad, wr.grad), (bs.grad, br.grad)):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=2e-5 * want.abs().max().item())


@pytest.mark.parametrize("case,convs", [(CASES[5], 2), (CASES[3], 1)], ids=["stride1_channels_last", "stride2"])
def test_a_stride_1_grad_input_is_the_conv_familys_forward_conv(case, convs, strict):
    """grad_input of a stride-1 conv is the full correlation of grad_output with the flipped
    weight: the conv family's program, as the forward is (a strided one keeps col2im)."""
    x, w, b, conv = _inputs(case)
    torch.manual_seed(1)
    g = torch.randn(F.conv2d(x, w, b, **conv).shape)

    def grads(x, w, g):
        xb, wb = x.detach().requires_grad_(), w.detach().requires_grad_()
        (F.conv2d(xb, wb, None, **conv) * g).sum().backward()
        return xb.grad, wb.grad

    ref = grads(x, w, g)
    got, records, _ = _eager(grads, x, w, g)
    assert sum(isinstance(r.kernel, ConvKernel) for r in records) == convs
    for r, o in zip(ref, got):
        torch.testing.assert_close(o.cpu(), r, rtol=0, atol=2e-5 * r.abs().max().item())
