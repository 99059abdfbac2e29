"""Spyre kernels for ops whose generic kernel refuses devices it does not know.

Convolution dispatches on the device inside its composite kernel and sends
anything that is not CPU/CUDA/MKLDNN to ``convolution_overrideable``, whose
default raises. These kernels send it to the CPU convolution on host aliases,
like any other fallback op (warned once, forbidden under SPYRE_STRICT=1).
"""

from __future__ import annotations

import torch

from .fallback import run_on_host

aten = torch.ops.aten
_lib: torch.library.Library | None = None


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return run_on_host(
        aten.convolution_overrideable.default, aten.convolution.default,
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
    )


def _convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    # The overrideable form does not carry the bias shape; the bias gradient
    # has one entry per output channel.
    bias_sizes = [grad_output.size(1)]
    return run_on_host(
        aten.convolution_backward_overrideable.default, aten.convolution_backward.default,
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask,
    )


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("convolution_overrideable", _convolution, "PrivateUse1")
    _lib.impl("convolution_backward_overrideable", _convolution_backward, "PrivateUse1")
