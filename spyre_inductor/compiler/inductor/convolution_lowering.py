"""Spyre lowerings of convolution: a forward conv2d the conv family takes as its implicit GEMM
(families/convolution, through convolution_node.py: the image laid out for runs here), else
conv2d as a patch gather and a matmul (convolution.py's arithmetic over Inductor's own
lowerings), instead of an extern ATen convolution. The backward's grad_input of a stride-1 conv
is the family's forward conv too (the full correlation with the flipped weight); its
grad_weight and grad_bias, and every other grad_input, are the patch copy's.

``aten.convolution`` and ``aten.convolution_backward`` are what a torch.compile'd graph holds;
``convolution_overrideable`` and ``convolution_backward_overrideable`` are what the compile-backed
eager kernels trace (PyTorch's dispatch of a PrivateUse1 convolution and of its autograd
backward): the four lower the same way. A lowering, not a decomposition: Inductor reads its
decomposition table before the first spyre graph registers the backend, and lowerings are
looked up after. The pieces come out as Inductor would have them from a decomposition: the
pad and the patch copy realized nodes the pointwise family plans, the products ``mm``/``addmm``
through lowerings.py's spyre matmul (realized operands, the MatmulKernel of the matmul family),
a reshape of what is not contiguous a contiguous copy first (as ATen's reshape copies), never
index arithmetic with divisions for capture to refuse.

Not taken (Inductor's own lowering: the extern convolution, whose eager kernel runs it on the
CPU, named under SPYRE_STRICT=1): another device, convolution.refusal's forms (transposed,
not 2-d, integers), symbolic sizes.
"""

from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L

from . import convolution
from .lowerings import _on_spyre

aten = torch.ops.aten


class Lowered:
    """convolution.py's ops over Inductor IR (TensorBoxes), through Inductor's lowerings."""

    @staticmethod
    def shape(x):
        return tuple(int(s) for s in x.get_size())  # (a symbolic size raises TypeError: not taken)

    @staticmethod
    def itemsize(x):
        return x.get_dtype().itemsize

    @staticmethod
    def pad(x, pads):
        return L.lowerings[aten.constant_pad_nd.default](x, pads, 0.0)

    @staticmethod
    def slice(x, dim, start, end, step=1):
        return L.lowerings[aten.slice.Tensor](x, dim, start, end, step)

    @staticmethod
    def select(x, dim, i):
        return L.lowerings[aten.select.int](x, dim, i)

    @staticmethod
    def unfold(x, dim, size, step):
        return L.lowerings[aten.unfold.default](x, dim, size, step)

    @staticmethod
    def permute(x, dims):
        return L.lowerings[aten.permute.default](x, list(dims))

    @staticmethod
    def unsqueeze(x, dim):
        return L.lowerings[aten.unsqueeze.default](x, dim)

    @staticmethod
    def reshape(x, shape):
        # what is not contiguous is copied first, as ATen's reshape does: a view of it would load
        # through divisions and remainders of the flat index
        return L.lowerings[aten.reshape.default](Lowered.contiguous(x), list(shape))

    @staticmethod
    def contiguous(x):
        return ir.ExternKernel.require_contiguous(x)

    @staticmethod
    def mm(a, b):
        return L.lowerings[aten.mm.default](a, b)

    @staticmethod
    def addmm(bias, a, b):
        return L.lowerings[aten.addmm.default](bias, a, b)

    @staticmethod
    def bmm(a, b):
        return L.lowerings[aten.bmm.default](a, b)

    @staticmethod
    def baddbmm(bias, a, b):
        return L.lowerings[aten.baddbmm.default](bias, a, b)

    @staticmethod
    def add(a, b):
        return L.lowerings[aten.add.Tensor](a, b)

    @staticmethod
    def sum(x, dims):
        return L.lowerings[aten.sum.dim_IntList](x, list(dims))


LOWERED = Lowered()


def _channels_last(x) -> bool:
    """Whether `x` is stored channels-last (a graph input's fixed layout says so)."""
    try:
        n, c, h, w = (int(s) for s in x.get_size())
        stride = tuple(int(s) for s in x.get_stride())
    except (AttributeError, NotImplementedError, TypeError):
        return False
    return c > 1 and stride[1] == 1 and stride[3] == c and stride[2] == w * c


def _taken(tensors, input, weight, transposed, groups) -> bool:
    if not _on_spyre(*tensors) or convolution.refusal(_Fake(input), _Fake(weight), transposed, groups) is not None:
        return False
    try:
        for t in tensors:
            Lowered.shape(t)
    except TypeError:
        return False
    return True


class _Fake:
    """What convolution.refusal asks of a tensor, of an IR node."""

    def __init__(self, node):
        self.node = node
        self.dtype = node.get_dtype()

    def dim(self):
        return len(self.node.get_size())


def _channels_last_copy(x, pads=None):
    """`x` [N, C, H, W] realized channels-last (padded along H and W by `pads` (ph, pw) with zeros),
    seen as [N, C, H, W] again: a view with channels-last strides."""
    nhwc = LOWERED.permute(x, (0, 2, 3, 1))
    if pads is not None and any(pads):
        nhwc = LOWERED.pad(nhwc, [0, 0, pads[1], pads[1], pads[0], pads[0]])
    return LOWERED.permute(LOWERED.contiguous(nhwc), (0, 3, 1, 2))


def _k_rows_copy(w):
    """The weight [OC, C, KH, KW] realized as [KH, KW, C, OC] (the conv family reads it as [K, OC]
    rows as they lie, and shares it over the ring), seen as [OC, C, KH, KW] again."""
    return LOWERED.permute(LOWERED.contiguous(LOWERED.permute(w, (2, 3, 1, 0))), (3, 2, 0, 1))


def _implicit_gemm(input, weight, bias, stride, padding, dilation, groups, weight_laid_out=False):
    """The conv family's program for this forward conv2d (families/convolution), or None where the
    family does not take it (grouped; runs of taps too short in either layout; a plan it declines).

    The family reads runs of taps contiguous in both image and weight and no padding, so the
    image is laid out here: channels-last (as given, else one copy, padded in the same copy)
    when its channels fill a stick or the input is channels-last (runs of KW x C, or a shifted
    window at stride 1; the weight laid out [KH, KW, C, OC] in one small copy, unless it is
    channels-last already), else NCHW as given (runs of KW taps per channel, the
    weight as PyTorch keeps it: ViT's patch embedding reads the image once and nothing else is
    copied); padding is one pad copy before it."""
    from .convolution_node import lower_conv
    from ..families.convolution.lowering import MIN_RUN_SHARE

    if groups != 1:
        return None
    stride, padding, dilation = convolution._pairs(stride, padding, dilation)
    _, c, _, _ = LOWERED.shape(input)
    _, _, _, kw = LOWERED.shape(weight)
    isz = LOWERED.itemsize(input)
    nchw_runs = dilation[1] == 1 and kw * isz * MIN_RUN_SHARE >= convolution.STICK_BYTES
    if _channels_last(input) or c * isz >= convolution.STICK_BYTES or not nchw_runs:
        cl_run = (kw * c if dilation[1] == 1 else c) * isz
        if cl_run * MIN_RUN_SHARE < convolution.STICK_BYTES:
            return None
        if not (_channels_last(input) and not any(padding)):
            input = _channels_last_copy(input, padding)
        if not (_channels_last(weight) or weight_laid_out):
            weight = _k_rows_copy(weight)
    else:
        if any(padding):
            input = LOWERED.contiguous(LOWERED.pad(input, [padding[1], padding[1], padding[0], padding[0]]))
        weight = LOWERED.contiguous(weight)
    return lower_conv(input, weight, bias, stride, dilation)


def _forward(inductor_lowering):
    def lowering(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        if not _taken((input, weight), input, weight, transposed, groups):
            return inductor_lowering(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                     groups)
        channels_last = _channels_last(input)
        out = _implicit_gemm(input, weight, bias, stride, padding, dilation, int(groups))
        if out is not None:
            # channels-last, as the PE wrote it: a graph output is copied to the strides the graph
            # promises by Inductor itself, and inside a graph a patch embedding's
            # flatten(2).transpose(1, 2) reads it as it lies (ViT's embedding: no 7 us copy)
            return out
        return convolution.conv2d(LOWERED, input, weight, bias, stride, padding, dilation, channels_last,
                                  int(groups))

    return lowering


def _grad_input(grad_output, input, weight, stride, padding, dilation, groups):
    """grad_input of a stride-1 conv2d as the conv family's forward conv, or None: the full
    correlation of grad_output (padded by KH - 1 - ph, KW - 1 - pw) with the weight flipped and
    its channels swapped, laid out [KH, KW, OC, C] in one copy (what _k_rows_copy makes of a
    forward weight). Strided and dilated ones keep the patch copy's col2im."""
    stride, padding, dilation = convolution._pairs(stride, padding, dilation)
    _, _, kh, kw = LOWERED.shape(weight)
    if groups != 1 or stride != (1, 1) or dilation != (1, 1) or padding[0] >= kh or padding[1] >= kw:
        return None
    # [KH, KW, OC, C] (the taps' k rows of the transposed conv), the taps then reversed: a flip
    # of the weight's own last dims loads single elements backwards (9 MB moved for a 72 KB
    # weight: 64 us); reversing whole [OC, C] blocks after the transposing copy does not
    rows = LOWERED.contiguous(LOWERED.permute(weight, (2, 3, 0, 1)))
    load = rows.make_loader()

    def flipped(index):  # tap (i, j) of the transposed conv is the weight's (kh-1-i, kw-1-j)
        i, j, oc, c = index
        return load([kh - 1 - i, kw - 1 - j, oc, c])

    flip = LOWERED.contiguous(ir.Pointwise.create(device=weight.get_device(), dtype=weight.get_dtype(),
                                                  inner_fn=flipped, ranges=list(LOWERED.shape(rows))))
    swapped = LOWERED.permute(flip, (3, 2, 0, 1))  # seen as the transposed conv's weight [C, OC, KH, KW]
    out = _implicit_gemm(grad_output, swapped, None, (1, 1), (kh - 1 - padding[0], kw - 1 - padding[1]), (1, 1), 1,
                         weight_laid_out=True)
    if out is None:
        return None
    return out if _channels_last(input) else LOWERED.contiguous(out)


def _backward(inductor_lowering, with_bias_sizes: bool):
    def lowering(grad_output, input, weight, *rest):
        args = rest[1:] if with_bias_sizes else rest
        stride, padding, dilation, transposed, output_padding, groups, output_mask = args
        if not _taken((grad_output, input, weight), input, weight, transposed, groups):
            return inductor_lowering(grad_output, input, weight, *rest)
        grad_input = None
        if output_mask[0]:
            grad_input = _grad_input(grad_output, input, weight, stride, padding, dilation, int(groups))
        mask = [output_mask[0] and grad_input is None, output_mask[1], output_mask[2]]
        grads = convolution.conv2d_backward(LOWERED, grad_output, input, weight, stride, padding, dilation, mask,
                                            int(groups), _channels_last(input))
        return [grad_input if grad_input is not None else grads[0], grads[1], grads[2]]

    return lowering


def install() -> None:
    """Register the four lowerings (registration.register() calls it once)."""
    L.register_lowering(aten.convolution.default, type_promotion_kind=None)(
        _forward(L.lowerings[aten.convolution.default]))
    L.register_lowering(aten.convolution_overrideable.default, type_promotion_kind=None)(
        _forward(L.fallback_handler(aten.convolution_overrideable.default, add_to_fallback_set=False)))
    L.register_lowering(aten.convolution_backward.default, type_promotion_kind=None)(
        _backward(L.lowerings[aten.convolution_backward.default], True))
    L.register_lowering(aten.convolution_backward_overrideable.default, type_promotion_kind=None)(
        _backward(L.fallback_handler(aten.convolution_backward_overrideable.default, add_to_fallback_set=False),
                  False))
