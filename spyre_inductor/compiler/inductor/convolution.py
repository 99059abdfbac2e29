"""conv2d on spyre as a patch gather and a matmul on the PE arrays (issue 31): the arithmetic.

A convolution is a matmul once its input is laid out as patches: row (n, oh, ow) of the patch
matrix holds the input elements the kernel sees at that output position, column (c, kh, kw)
(or (kh, kw, c) for a channels-last input, so a patch row reads whole channel sticks) the tap;
``patches @ weight.reshape(OC, -1).t()`` is the output in (n, oh, ow, oc) order, a channels-last
tensor. Nothing here is a kernel of its own: the patch matrix is a copy whose loads are affine in
the loop indices (``x[n, c, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw]`` through a pad and two
``unfold`` views), which the pointwise family plans, and the product is an ``mm``/``addmm``,
which the matmul family plans (bias as its epilogue, accumulated in fp32). For ViT's and CLIP's
patch embedding (stride == kernel, no padding, no dilation) the patches do not overlap and the
patch matrix is a reshape and permute of the image. A grouped convolution (depthwise too) is
one such matmul per group, a ``bmm``/``baddbmm`` over the groups.

The backward is the same pieces: grad_weight = grad_out^T @ patches, grad_bias a sum,
grad_input the columns grad_out @ weight put back where they came from (col2im). Where patches
do not overlap that is the inverse permute; otherwise each tap (kh, kw) is a pad of its column
(zeros between rows and columns for a stride, then shifted into place) and the taps are summed:
pads and a sum, pointwise, no scatter.

Written once over `ops` (the handful of view, pad and matmul ops it needs): Inductor's lowerings
on spyre (convolution_lowering.py, what compiled graphs and the compile-backed eager kernels
run), or ATen's (`ATEN`: the same index arithmetic checked on the CPU in fp64 by the tests).
Plain torch: the eager kernel asks `refusal` without importing Inductor.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def refusal(input, weight, transposed, groups) -> str | None:
    """Why the convolution is not planned as spyre programs, or None when it is (tensors, fakes)."""
    if input.dim() != 4 or weight.dim() != 4:
        return f"a {input.dim() - 2}-d convolution (only conv2d is planned as spyre programs)"
    if transposed:
        return "a transposed convolution (conv_transpose2d is not planned as spyre programs yet)"
    if not input.dtype.is_floating_point:
        return f"a convolution of {input.dtype} (the PE arrays accumulate floats)"
    return None


class Aten:
    """The ops over ATen tensors."""

    shape = staticmethod(lambda x: tuple(x.shape))
    itemsize = staticmethod(lambda x: x.element_size())
    pad = staticmethod(lambda x, pads: aten.constant_pad_nd(x, pads))
    slice = staticmethod(lambda x, dim, start, end, step=1: aten.slice(x, dim, start, end, step))
    select = staticmethod(lambda x, dim, i: aten.select(x, dim, i))
    unfold = staticmethod(lambda x, dim, size, step: aten.unfold(x, dim, size, step))
    permute = staticmethod(lambda x, dims: aten.permute(x, dims))
    unsqueeze = staticmethod(lambda x, dim: aten.unsqueeze(x, dim))
    reshape = staticmethod(lambda x, shape: aten.reshape(x, shape))  # (copies what is not viewable)
    contiguous = staticmethod(lambda x: x.contiguous())
    mm = staticmethod(lambda a, b: aten.mm(a, b))
    bmm = staticmethod(lambda a, b: aten.bmm(a, b))
    baddbmm = staticmethod(lambda bias, a, b: aten.baddbmm(bias, a, b))
    addmm = staticmethod(lambda bias, a, b: aten.addmm(bias, a, b))
    add = staticmethod(lambda a, b: aten.add(a, b))
    sum = staticmethod(lambda x, dims: aten.sum(x, dims))


ATEN = Aten()


def _pairs(stride, padding, dilation):
    return tuple(int(s) for s in stride), tuple(int(p) for p in padding), tuple(int(d) for d in dilation)


def _output_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _disjoint(kernel, stride, padding, dilation) -> bool:
    """Whether the patches tile the image without overlap or gaps (ViT's patch embedding)."""
    return tuple(stride) == tuple(kernel) and not any(padding) and all(d == 1 for d in dilation)


def patches(ops, x, kernel, stride, padding, dilation, taps_last):
    """(the patch matrix [N*OH*OW, C*KH*KW], OH, OW): columns (c, kh, kw), or (kh, kw, c) if
    `taps_last` is False (a channels-last input: a row reads whole channel runs)."""
    n, c, h, w = ops.shape(x)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    oh, ow = _output_size(h, kh, sh, ph, dh), _output_size(w, kw, sw, pw, dw)
    if _disjoint(kernel, stride, padding, dilation):
        if oh * kh != h or ow * kw != w:  # (rows and columns past the last whole patch are never read)
            x = ops.slice(ops.slice(x, 2, 0, oh * kh), 3, 0, ow * kw)
        grid = ops.reshape(x, [n, c, oh, kh, ow, kw])
        order = (0, 2, 4, 1, 3, 5) if taps_last else (0, 2, 4, 3, 5, 1)
    else:
        if ph or pw:
            x = ops.pad(x, [pw, pw, ph, ph])
        # [N, C, OH, OW, span_h, span_w], every dh-th / dw-th element of a span a tap
        grid = ops.unfold(ops.unfold(x, 2, dh * (kh - 1) + 1, sh), 3, dw * (kw - 1) + 1, sw)
        if dh > 1:
            grid = ops.slice(grid, 4, 0, dh * (kh - 1) + 1, dh)
        if dw > 1:
            grid = ops.slice(grid, 5, 0, dw * (kw - 1) + 1, dw)
        order = (0, 2, 3, 1, 4, 5) if taps_last else (0, 2, 3, 4, 5, 1)
    return ops.reshape(ops.permute(grid, order), [n * oh * ow, c * kh * kw]), oh, ow


STICK_BYTES = 128


def conv2d(ops, input, weight, bias, stride, padding, dilation, channels_last, groups=1):
    """conv2d as patches @ weight^T (+ bias), one matmul per group (a bmm over the groups):
    NCHW, or channels-last if `channels_last`."""
    stride, padding, dilation = _pairs(stride, padding, dilation)
    n = ops.shape(input)[0]
    oc, cg, kh, kw = ops.shape(weight)
    kernel, k = (kh, kw), cg * kh * kw
    # An NCHW input whose channels fill a stick is made channels-last first (one copy of the
    # image): the patch copy then moves whole channel runs, where (c, kh, kw) columns gather
    # single elements a stick apart (64 -> 64 channels 3x3 on 56x56: 1.27 ms of patch copy).
    # Grouped: (c, kh, kw) columns, so each group's are adjacent.
    taps_last = groups > 1 or (not channels_last and not (
        cg * ops.itemsize(input) >= STICK_BYTES and not _disjoint(kernel, stride, padding, dilation)))
    if not channels_last and not taps_last:
        input = ops.permute(ops.contiguous(ops.permute(input, (0, 2, 3, 1))), (0, 3, 1, 2))
    cols, oh, ow = patches(ops, input, kernel, stride, padding, dilation, taps_last)
    m = n * oh * ow
    if groups == 1:
        # the weight as [OC, K], its columns in the patch matrix's order
        w = ops.reshape(weight if taps_last else ops.permute(weight, (0, 2, 3, 1)), [oc, k])
        w = ops.permute(w, (1, 0))
        out = ops.mm(cols, w) if bias is None else ops.addmm(bias, cols, w)
    else:
        g, ocg = groups, oc // groups
        cols = ops.permute(ops.reshape(cols, [m, g, k]), (1, 0, 2))       # [G, M, K]
        w = ops.permute(ops.reshape(weight, [g, ocg, k]), (0, 2, 1))      # [G, K, OC/G]
        out = ops.bmm(cols, w) if bias is None else ops.baddbmm(ops.reshape(bias, [g, 1, ocg]), cols, w)
        out = ops.reshape(ops.permute(out, (1, 0, 2)), [m, oc])
    out = ops.permute(ops.reshape(out, [n, oh, ow, oc]), (0, 3, 1, 2))  # (channels-last strides)
    return out if channels_last else ops.contiguous(out)


def _col2im(ops, columns, shape, kernel, stride, padding, dilation, oh, ow):
    """grad_input [N, C, H, W] from the patch matrix's gradient [N*OH*OW, C*KH*KW] (columns
    (c, kh, kw)): each element summed back into every input position its patches read."""
    n, c, h, w = shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    cols = ops.reshape(columns, [n, oh, ow, c, kh, kw])
    if _disjoint(kernel, stride, padding, dilation):
        image = ops.reshape(ops.permute(cols, (0, 3, 1, 4, 2, 5)), [n, c, oh * kh, ow * kw])
        if oh * kh == h and ow * kw == w:
            return image
        return ops.pad(image, [0, w - ow * kw, 0, h - oh * kh])
    total = None
    for i in range(kh):
        for j in range(kw):
            tap = ops.permute(ops.select(ops.select(cols, 5, j), 4, i), (0, 3, 1, 2))  # [N, C, OH, OW]
            # output (oh, ow) of tap (i, j) read input row oh*sh + i*dh - ph, column ow*sw + j*dw - pw:
            # spread the tap over every sh-th row and sw-th column, then shift it into place
            if sh > 1:
                tap = ops.reshape(ops.pad(ops.unsqueeze(tap, 3), [0, 0, 0, sh - 1]), [n, c, oh * sh, ow])
            if sw > 1:
                tap = ops.reshape(ops.pad(ops.unsqueeze(tap, 4), [0, sw - 1]), [n, c, oh * sh, ow * sw])
            top, left = i * dh - ph, j * dw - pw
            placed = ops.pad(tap, [left, w - left - ow * sw, top, h - top - oh * sh])
            total = placed if total is None else ops.add(total, placed)
    return total


def conv2d_backward(ops, grad_output, input, weight, stride, padding, dilation, output_mask, groups=1,
                    channels_last=False):
    """[grad_input, grad_weight, grad_bias] of conv2d, NCHW, each None where output_mask says it
    is not wanted. `channels_last`: the input is stored so (its patches then read whole channel
    runs, as the forward's do)."""
    stride, padding, dilation = _pairs(stride, padding, dilation)
    oc, cg, kh, kw = ops.shape(weight)
    n, _, oh, ow = ops.shape(grad_output)
    m, k, g = n * oh * ow, cg * kh * kw, groups
    grad = ops.reshape(ops.permute(grad_output, (0, 2, 3, 1)), [m, oc])  # rows (n, oh, ow)
    if g > 1:
        grad = ops.permute(ops.reshape(grad, [m, g, oc // g]), (1, 0, 2))  # [G, M, OC/G]
    grads = [None, None, None]
    if output_mask[0]:
        if g == 1:
            columns = ops.mm(grad, ops.reshape(weight, [oc, k]))  # (c, kh, kw) columns
        else:
            columns = ops.bmm(grad, ops.reshape(weight, [g, oc // g, k]))  # [G, M, K]
            columns = ops.reshape(ops.permute(columns, (1, 0, 2)), [m, g * k])
        grads[0] = _col2im(ops, columns, ops.shape(input), (kh, kw), stride, padding, dilation, oh, ow)
    if output_mask[1]:
        # (kh, kw, c) columns where the forward's patch copy takes them (a channels-last input, or
        # channels filling a stick: made channels-last first): (c, kh, kw) columns of a
        # channels-last image gather single elements a stick apart (64 -> 64 3x3 on 56x56: 597 us)
        taps_last = g > 1 or (not channels_last and not (
            cg * ops.itemsize(input) >= STICK_BYTES and not _disjoint((kh, kw), stride, padding, dilation)))
        if not channels_last and not taps_last:
            input = ops.permute(ops.contiguous(ops.permute(input, (0, 2, 3, 1))), (0, 3, 1, 2))
        cols, _, _ = patches(ops, input, (kh, kw), stride, padding, dilation, taps_last)
        if g == 1 and not taps_last:
            grads[1] = ops.permute(ops.reshape(ops.mm(ops.permute(grad, (1, 0)), cols), [oc, kh, kw, cg]),
                                   (0, 3, 1, 2))
        elif g == 1:
            grads[1] = ops.reshape(ops.mm(ops.permute(grad, (1, 0)), cols), [oc, cg, kh, kw])
        else:
            cols = ops.permute(ops.reshape(cols, [m, g, k]), (1, 0, 2))  # [G, M, K]
            grads[1] = ops.reshape(ops.bmm(ops.permute(grad, (0, 2, 1)), cols), [oc, cg, kh, kw])
    if output_mask[2]:
        grads[2] = ops.sum(grad_output, [0, 2, 3])
    return grads
