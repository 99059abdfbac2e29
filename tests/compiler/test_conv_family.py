"""The conv family (issue 31): conv2d as an implicit GEMM whose A tiles are gathered from the
image, without Inductor (a ConvKernel built by hand, compiled, launched on spyre, compared with
F.conv2d on the CPU in fp32), and what its plans decide: no patch matrix in device memory, each
A tile's loads runs of the image, the runs' padding never multiplied, refusals by name."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler.backend import compile_kernel, plan_kernel
from spyre_inductor.compiler.ir.errors import Unsupported
from spyre_inductor.compiler.ir.kernel_ir import DTYPE_NAMES, Buffer, ConvKernel, kernel_from_json
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.program.isa import Load, MatMul


def conv_kernel(x, w, b, stride, dilation=(1, 1), out_dtype=None) -> tuple[ConvKernel, tuple]:
    N, C, H, W = x.shape
    OC, _, KH, KW = w.shape
    OH, OW = (H - dilation[0] * (KH - 1) - 1) // stride[0] + 1, (W - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    shape = (N, OC, OH, OW)
    cl = (OH * OW * OC, 1, OW * OC, OC)
    dtype = DTYPE_NAMES[out_dtype or x.dtype]
    buffers = [Buffer("image", DTYPE_NAMES[x.dtype], tuple(x.shape), tuple(x.stride())),
               Buffer("weight", DTYPE_NAMES[w.dtype], tuple(w.shape), tuple(w.stride()))]
    if b is not None:
        buffers.append(Buffer("bias", DTYPE_NAMES[b.dtype], tuple(b.shape), tuple(b.stride())))
    buffers.append(Buffer("out", dtype, shape, cl))
    return ConvKernel("conv_test", tuple(buffers), tuple(stride), tuple(dilation), b is not None), (shape, cl)


def run(tmp_path, x, w, b, stride, dilation=(1, 1)):
    kernel, (shape, strides) = conv_kernel(x, w, b, stride, dilation)
    artifact = compile_kernel(kernel, tmp_path)
    plan = prepare_kernel(artifact)
    out = torch.empty_strided(shape, strides, dtype=x.dtype, device="spyre")
    args = [x.to("spyre"), w.to("spyre")] + ([b.to("spyre")] if b is not None else [])
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        args[0] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="spyre").copy_(x)
    if w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous():
        args[1] = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device="spyre").copy_(w)
    torch.spyre.reset_kernel_reports()
    launch_jobplan(plan, args + [out])
    torch.spyre.synchronize()
    want = F.conv2d(x.float(), w.float(), None if b is None else b.float(), stride=stride, dilation=dilation)
    return out.cpu(), want.to(x.dtype), artifact


def tensors(shape, wshape, dtype=torch.float16, channels_last=False, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype)
    w = (torch.randn(*wshape, generator=g) / (wshape[1] * wshape[2] * wshape[3]) ** 0.5).to(dtype)
    b = torch.randn(wshape[0], generator=g).to(dtype) if bias else None
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    return x, w, b


CASES = [
    # name, image, weight, stride, dilation, channels-last (a stride-1 channels-last conv: a shifted
    # window; the others: gathered runs)
    ("vit-like patch embed NCHW k16 s16", (1, 3, 64, 64), (96, 3, 16, 16), (16, 16), (1, 1), False),
    ("patch embed channels-last k16 s16", (2, 3, 64, 48), (64, 3, 16, 16), (16, 16), (1, 1), True),
    ("3x3 s1 64->64 channels-last", (1, 64, 12, 10), (64, 64, 3, 3), (1, 1), (1, 1), True),
    ("3x3 s2 64->128 channels-last", (2, 64, 11, 9), (128, 64, 3, 3), (2, 2), (1, 1), True),
    ("3x3 dilated 2 32ch fp32 channels-last", (1, 32, 12, 12), (40, 32, 3, 3), (1, 1), (2, 2), True),
    ("pixtral-like k14 s14 NCHW", (1, 3, 28, 42), (64, 3, 14, 14), (14, 14), (1, 1), False),
    ("1x1 s1 128->64 channels-last", (1, 128, 7, 9), (64, 128, 1, 1), (1, 1), (1, 1), True),
    ("3x3 s1 two images 96->72 channels-last", (2, 96, 9, 13), (72, 96, 3, 3), (1, 1), (1, 1), True),
    ("5x3 s1 dilated (1, 2) 32->16 fp32 channels-last", (1, 32, 11, 12), (16, 32, 5, 3), (1, 1), (1, 2), True),
]


@pytest.mark.parametrize("name,shape,wshape,stride,dilation,cl", CASES, ids=[c[0] for c in CASES])
def test_the_conv_kernel_matches_the_cpu(tmp_path, name, shape, wshape, stride, dilation, cl):
    dtype = torch.float32 if "fp32" in name else torch.float16
    x, w, b = tensors(shape, wshape, dtype, cl)
    out, want, artifact = run(tmp_path, x, w, b, stride, dilation)
    assert json.loads((artifact / "plan.json").read_text())["family"] == "conv"
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out.float(), want.float(), **tol)


def test_no_bias_and_kernel_json_round_trips(tmp_path):
    x, w, _ = tensors((1, 64, 6, 6), (64, 64, 3, 3), channels_last=True, bias=False)
    kernel, _ = conv_kernel(x, w, None, (1, 1))
    assert kernel_from_json(kernel.to_json()) == kernel
    out, want, artifact = run(tmp_path, x, w, None, (1, 1))
    assert kernel_from_json((artifact / "kernel.json").read_text()).has_bias is False
    torch.testing.assert_close(out.float(), want.float(), atol=2e-3, rtol=2e-3)


def _program(x, w, b, stride):
    kernel, _ = conv_kernel(x, w, b, stride)
    return kernel, plan_kernel(kernel)


def _image_loads(compiled):
    return [i for c in compiled.program.cores for _, instrs in c.units for i in instrs
            if isinstance(i, Load) and i.src.symbol == "image"]


def test_strided_a_tiles_are_runs_of_the_image_and_nothing_is_written_but_the_output():
    x, w, b = tensors((1, 64, 11, 11), (64, 64, 3, 3), channels_last=True)
    kernel, compiled = _program(x, w, b, (2, 2))
    assert compiled.plans.family == "conv"
    image = _image_loads(compiled)
    assert image and all(i.row_bytes == 3 * 64 * 2 for i in image)  # a run: an image row's 3 taps x 64 channels
    assert all(i.src_stride in (0, 2 * 64 * 2) for i in image)  # output columns 2 pixels apart
    assert {s.name for s in compiled.program.symbols} == {"image", "weight", "bias", "out"}  # no patch matrix


def test_a_stride_1_conv_reads_each_image_band_once_for_every_tap():
    x, w, b = tensors((2, 64, 10, 10), (64, 64, 3, 3), channels_last=True)
    kernel, compiled = _program(x, w, b, (1, 1))
    assert compiled.plans.stage("window").halo == 2 * 10 + 2
    image = _image_loads(compiled)
    assert image and all(i.row_bytes == 128 and i.src_stride in (0, 128) for i in image)  # whole pixels, in order
    blocks = compiled.plans.division.cores
    # each core's band: its rows and one halo, read once (not once per tap: 9x the image)
    assert sum(i.rows for i in image) <= 2 * 10 * 10 + blocks * 22
    assert {s.name for s in compiled.program.symbols} == {"image", "weight", "bias", "out"}


def test_a_runs_padding_is_moved_but_never_multiplied():
    x, w, b = tensors((1, 3, 32, 32), (64, 3, 16, 16))  # NCHW: runs of 16 taps, a stick holds 64
    _, compiled = _program(x, w, b, (16, 16))
    mms = [i for c in compiled.program.cores for _, instrs in c.units for i in instrs if isinstance(i, MatMul)]
    assert mms and all(i.a.cols == 16 and i.b.rows == 16 for i in mms)
    assert sum(i.a.rows * i.b.cols * i.a.cols for i in mms) == 4 * 64 * 3 * 16 * 16


def test_runs_under_a_fifth_of_a_stick_are_refused_by_name():
    x, w, b = tensors((1, 3, 16, 16), (8, 3, 3, 3))  # NCHW 3x3: runs of 3 taps
    with pytest.raises(Unsupported, match="runs of 3 elements"):
        _program(x, w, b, (1, 1))


def test_a_layout_without_common_runs_is_refused_by_name():
    x, w, b = tensors((1, 64, 8, 8), (64, 64, 3, 3), channels_last=True)
    with pytest.raises(Unsupported, match="no run of taps is contiguous"):
        _program(x, w.contiguous(), b, (1, 1))  # channels-last image, PyTorch's weight


def k_rows(w):
    """The weight laid out [KH, KW, C, OC] (what the lowering makes of a channels-last conv's),
    seen as [OC, C, KH, KW]: read as [K, OC] rows, shareable over the ring."""
    return w.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)], ids=["window", "runs"])
def test_a_weight_laid_out_k_by_oc_is_moved_as_it_lies_and_matches(tmp_path, stride):
    x, w, b = tensors((1, 64, 12, 10), (128, 64, 3, 3), channels_last=True)
    wk = k_rows(w)
    kernel, _ = conv_kernel(x, wk, b, stride)
    compiled = plan_kernel(kernel)
    shape = compiled.plans.stage("shape")
    assert not shape.b_transposed and shape.b.k_stride == 128
    artifact = compile_kernel(kernel, tmp_path)
    plan = prepare_kernel(artifact)
    N, OC, OH, OW = kernel.out.shape
    out = torch.empty_strided((N, OC, OH, OW), kernel.out.strides, dtype=x.dtype, device="spyre")
    args = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="spyre").copy_(t) for t in (x, wk)]
    launch_jobplan(plan, args + [b.to("spyre"), out])
    torch.spyre.synchronize()
    want = F.conv2d(x.float(), w.float(), b.float(), stride=stride).to(x.dtype)
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-3, rtol=2e-3)
