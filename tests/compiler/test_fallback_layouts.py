"""A result an op computes outside the compiler has the layout the graph was traced with.

Extern kernels and fallback ops in a compiled graph (``extern_kernels.convolution``,
an aten op Inductor does not lower, a custom op) run on spyre through the
device's eager kernels or its CPU fallback, which return whatever layout the
CPU kernel picks. The graph, though, was traced with the layout of the op's
meta (fake) result, and everything after the op relies on it: Inductor's
``assert_size_stride`` right after the call, and the spyre programs that read
the buffer with the traced strides. They disagree for a channels-last
convolution: the CPU keeps channels-last, the meta for a device it does not
know says contiguous, and ``torch.compile(conv)(x)`` failed with
"expected size 64==64, stride 1==900 at dim=1". With the size assertions off,
the next program's launch refuses the buffer ("expected strides [64, 1], got
[1, 16]"), and a CPU fallback kernel, which indexes with the traced strides,
would read the bytes wrongly without any error.

The wrapper now rebinds every such result in its traced layout where it is
produced (wrapper.codegen_traced_layout, host_runtime.with_traced_layout): the
tensor itself when the strides agree (a view stays a view), else a copy.

Values are compared with CPU eager on the same module, values and input
strides, at fp32 tolerances (rtol 1.3e-6, atol 1e-5: the convolution is the
CPU's own kernel on the same memory format, the bias or activation a spyre
program computing in fp32). The spyre parts must have compiled to programs.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from inductor_helpers import compile_on_spyre, refuse_every_kernel

TOL = dict(rtol=1.3e-6, atol=1e-5)
CL = torch.channels_last


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _module_case(module, x, grad):
    """Compile `module` (a spyre copy) on a spyre copy of `x`, against CPU eager; the outputs."""
    torch.manual_seed(0)
    ref = module(x)
    spyre_module = copy.deepcopy(module).to("spyre")  # keeps each parameter's strides
    with torch.set_grad_enabled(grad):
        out, args, records, _, code = compile_on_spyre(spyre_module, x)
    assert args[0].stride() == x.stride()
    torch.testing.assert_close(out[0].detach().cpu(), ref.detach(), **TOL)
    # the pointwise work around the fallback (the bias, the activation) ran as spyre programs
    assert any(r.artifact is not None for r in records), records
    return out[0], code


CONV_CASES = {
    "conv2d": lambda: torch.nn.Conv2d(3, 64, 3),
    "conv2d_relu_maxpool": lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                                       torch.nn.MaxPool2d(2)),
    "conv_transpose2d": lambda: torch.nn.ConvTranspose2d(3, 4, 3),
}


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("case", list(CONV_CASES), ids=list(CONV_CASES))
def test_a_channels_last_convolution_compiles_and_matches_eager(case, grad):
    """The reported failure (inference: the convolution consumes the channels-last input as it
    is) and its neighbours: a fused bias/ReLU/pool after it, a transposed convolution. In
    training Inductor makes the inputs contiguous first, which hid the mismatch."""
    torch.manual_seed(0)
    module = CONV_CASES[case]().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16, generator=_g(1)).to(memory_format=CL)
    out, code = _module_case(module, x, grad)
    # conv2d is a patch gather and a matmul in spyre programs (issue 31); a transposed convolution
    # still runs outside the compiler, as an extern kernel
    assert ("extern_kernels.convolution" in code) == (case == "conv_transpose2d")


def test_a_cpu_fallback_kernel_reads_a_channels_last_convolution_right(monkeypatch):
    """The silent form of the mismatch: a CPU fallback kernel (host_kernel.py) after the convolution
    indexes its input with the traced strides, so without the size assertions it read the
    channels-last bytes as contiguous and returned wrong values, no error. (Every kernel is
    refused here, so the bias add runs as such a kernel. A transposed convolution: conv2d is no
    extern kernel any more.)"""
    refuse_every_kernel(monkeypatch)
    torch.manual_seed(0)
    module = torch.nn.ConvTranspose2d(3, 8, 3).to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16, generator=_g(9)).to(memory_format=CL)
    ref = module(x)
    with torch.no_grad(), torch._inductor.config.patch(size_asserts=False):
        out, _, records, _, _ = compile_on_spyre(copy.deepcopy(module).to("spyre"), x)
    assert records and all(r.artifact is None for r in records)  # all of it ran on the CPU
    torch.testing.assert_close(out[0].cpu(), ref, **TOL)


# A custom op whose result never has the layout its fake promises: the general case, whatever op.
@torch.library.custom_op("spyre_layout_test::double_col_major", mutates_args=())
def _double_col_major(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).t().contiguous().t()  # column major


@_double_col_major.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("spyre_layout_test::halves_col_major", mutates_args=())
def _halves_col_major(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * 0.5).t().contiguous().t(), (x * -0.5).t().contiguous().t()


@_halves_col_major.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        x, memory_format=torch.contiguous_format)


@pytest.mark.parametrize("size_asserts", [True, False], ids=["size_asserts", "no_size_asserts"])
def test_a_fallback_result_in_another_layout_is_restrided_for_the_graph(size_asserts):
    """One output and several outputs (MultiOutput) of a fallback op whose result is column major
    where its fake is row major. Returned directly, the graph's output has the traced (row major)
    strides; read by a spyre program, the program sees the right values. Without the size
    assertions the mismatch used to surface one step later, as the program's launch refusing
    the column-major buffer."""
    x = torch.randn(16, 64, generator=_g(2))

    def fn(a):
        d = torch.ops.spyre_layout_test.double_col_major(a)
        h, m = torch.ops.spyre_layout_test.halves_col_major(a)
        return d, d + 1, h * m

    with torch._inductor.config.patch(size_asserts=size_asserts):
        out, _, records, _, code = compile_on_spyre(fn, x)
    assert "double_col_major" in code and "halves_col_major" in code
    assert any(r.artifact is not None for r in records), records
    d, d1, hm = (o.cpu() for o in out)
    assert out[0].stride() == (64, 1)
    torch.testing.assert_close(d, x * 2, rtol=0, atol=0)
    torch.testing.assert_close(d1, x * 2 + 1, **TOL)
    torch.testing.assert_close(hm, (x * 0.5) * (x * -0.5), **TOL)


def test_a_fallback_result_already_in_the_traced_layout_is_the_tensor_itself():
    """No copy when the strides agree (a view of an input stays that view); the stride of a dim
    of one element does not count, as in assert_size_stride."""
    from spyre_inductor.launcher.host import with_traced_layout

    t = torch.randn(4, 6, device="spyre")
    assert with_traced_layout(t, (4, 6), (6, 1)) is t
    col = t[:, :1]
    assert with_traced_layout(col, (4, 1), (6, 99)) is col
    moved = with_traced_layout(t.t(), (6, 4), (4, 1))
    assert moved.stride() == (4, 1) and torch.equal(moved.cpu(), t.cpu().t())
    assert with_traced_layout(t, (3, 8), (8, 1)) is t  # another shape: for the size assertion to report


@pytest.mark.parametrize("fn, x", [
    (lambda a: F.max_pool2d(a, 2, return_indices=True),
     torch.randn(2, 8, 16, 16, generator=_g(3)).to(memory_format=CL)),
    (lambda a: F.interpolate(a, scale_factor=2, mode="bilinear") + 1,
     torch.randn(2, 8, 8, 8, generator=_g(4)).to(memory_format=CL)),
    (lambda a: torch.sort(a.permute(1, 0, 2), dim=-1)[0] * 2, torch.randn(4, 8, 16, generator=_g(5))),
    (lambda a: torch.topk(a.permute(0, 2, 1), 3, dim=1)[0] + 1, torch.randn(4, 8, 16, generator=_g(6))),
    (lambda a: torch.as_strided(a * 2, (4, 4), (1, 4)) + 1, torch.randn(16, generator=_g(7))),
    (lambda a: F.adaptive_max_pool2d(a, 3) + 1, torch.randn(2, 8, 9, 9, generator=_g(8)).to(memory_format=CL)),
], ids=["max_pool2d_indices_channels_last", "bilinear_channels_last", "sort_of_permuted", "topk_of_permuted",
        "as_strided", "adaptive_max_pool2d_channels_last"])
def test_other_fallbacks_of_non_contiguous_layouts_match_eager(fn, x):
    """Other ops whose result can be permuted or channels-last (pools with indices, resampling,
    sorts of permuted inputs, as_strided): CPU eager's values, whichever of them fall back."""
    ref = fn(x)
    out, _, _, _, _ = compile_on_spyre(fn, x)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for got, want in zip(out, ref, strict=True):
        if want.is_floating_point():
            torch.testing.assert_close(got.cpu(), want, **TOL)
        else:
            assert torch.equal(got.cpu(), want)
