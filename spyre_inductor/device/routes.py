"""The CPU route of ops whose generic kernel refuses devices it does not know.

Convolution dispatches on the device inside its composite kernel and sends
anything that is not CPU/CUDA/MKLDNN to ``convolution_overrideable`` (and its
backward to ``convolution_backward_overrideable``), whose default raises; the
CPU has no kernel for either. Their spyre kernels are compile-backed
(spyre_inductor/eager/ops.py: conv2d as a patch gather and a matmul); a call
they do not compile (a transposed or 3-d convolution, compiled eager ops
off, a convolution reached inside a compiled graph) comes here: the CPU
convolution on host aliases, like any other fallback op (warned once,
forbidden under SPYRE_STRICT=1, naming why).
"""

from __future__ import annotations

import torch

from .fallback import run_on_host

aten = torch.ops.aten


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *,
                 reason=None):
    return run_on_host(
        aten.convolution_overrideable.default, aten.convolution.default,
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, reason=reason,
    )


def _convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask, *, reason=None):
    # The overrideable form does not carry the bias shape; the bias gradient
    # has one entry per output channel.
    bias_sizes = [grad_output.size(1)]
    return run_on_host(
        aten.convolution_backward_overrideable.default, aten.convolution_backward.default,
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask, reason=reason,
    )


# The overrideable op -> its CPU route, called as route(*args, reason=why, **kwargs).
HOST_ROUTES = {
    aten.convolution_overrideable.default: _convolution,
    aten.convolution_backward_overrideable.default: _convolution_backward,
}


# Their shapes on meta (and so fake) tensors: the CPU route's ops' own meta kernels. Without
# them a fake-tensor probe of the op (a trace, eager/compile.py's checks) would run the op for
# real on copies of the fakes, and so call its spyre kernel from inside its own compile.
def _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                    groups)


def _convolution_backward_meta(grad_output, input, weight, stride, padding, dilation, transposed,
                               output_padding, groups, output_mask):
    return aten.convolution_backward.default(grad_output, input, weight, [grad_output.size(1)], stride, padding,
                                             dilation, transposed, output_padding, groups, output_mask)


_meta: torch.library.Library | None = None


def install() -> None:
    """The meta kernels (once)."""
    global _meta
    if _meta is not None:
        return
    _meta = torch.library.Library("aten", "IMPL")
    _meta.impl("convolution_overrideable", _convolution_meta, "Meta")
    _meta.impl("convolution_backward_overrideable", _convolution_backward_meta, "Meta")
