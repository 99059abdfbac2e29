"""Conv lowering: a ConvKernel -> the matmul it is, its patch runs and its tile kernel.

conv2d is ``out[m, oc] = sum_k A[m, k] * B[k, oc]`` with m = (n, oh, ow) and k the taps (c, kh,
kw) in some order: A is the patch matrix, B the weight. The patch matrix is never written: each
A tile is gathered straight from the image into the scratchpad, in **runs**, the pieces of a
patch row that are contiguous in the image and, in the same k order, in the weight:

* a channels-last image (and a channels-last weight [OC, KH, KW, C]): a run is an image row's
  KW taps of all channels, KW*C elements (for a stride-equals-kernel patch embedding, ViT's and
  CLIP's, each patch row is KH such runs); with a dilation along w, each tap's C channels;
* an NCHW image (and PyTorch's weight [OC, C, KH, KW]): a run is one channel's KW taps of one
  image row, KW elements (ViT's 3 x 16 x 16 patches: 48 runs of 16).

Each run starts a stick of the A tile's row (the scratchpad moves whole sticks), so a run of R
elements occupies Rp (R rounded up to a stick, the rest zeros that the Load masks); the PE
multiplies each run's R columns with R rows of B (the weight read as a plain ``x @ W.t()``
operand, k contiguous, transposed on chip), so the padding is never multiplied. Everything
after the product (the fp32 accumulator, the bias as epilogue, the one rounding to the output
dtype, the stores of a channels-last output) is the matmul family's.

Declined (Unsupported: the lowering's patch-copy form plans it): padding (the lowering pads
first), other layouts, runs under a fifth of a stick (an NCHW 3-channel 3x3: the Load would move
21 times the image), a weight whose k order is not contiguous, an output that is not
channels-last.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.program.operands import ITEMSIZE, STICK

from ...core._dump import Describable
from ...core.layout import FLOATS
from ...core.tiles import Phase, PhaseKind, Relayout, Role, Step, Tile, TileKernel, space
from ...ir.errors import Unsupported
from ...ir.kernel_ir import ConvKernel
from ..matmul.lowering import AXES, MAccess, MatmulShape

# A run under 1/MIN_RUN_SHARE of a stick wastes more of the move than the patch copy would
# (Pixtral's 14 taps of fp16, 28 B, are taken; a 3x3's 3 taps, 6 B, are not).
MIN_RUN_SHARE = 5


@dataclass(frozen=True)
class PatchRuns(Describable):
    """How an A tile is gathered: row m = (n, oh, ow) starts at image element
    ``offset + n * n_stride + oh * oh_stride + ow * ow_stride``; its k = run * R + j (j < R) is
    image element ``row start + runs[run] + j``, stored at column run * Rp + j of the tile."""

    image: str
    dtype: str
    offset: int
    n_stride: int
    oh_stride: int
    ow_stride: int
    OH: int
    OW: int
    runs: tuple[int, ...]   # each run's image offset from the row's start
    R: int                  # elements per run
    Rp: int                 # columns per run in the A tile (R rounded up to whole sticks)
    form: str               # for a person: which run form

    def columns(self, k: int) -> int:
        """A tile columns that hold `k` elements of whole runs."""
        return k // self.R * self.Rp

    def rows(self, m0: int, count: int):
        """The output rows [m0, m0 + count) as pieces inside one output row: (first row, rows,
        image element of the first row's start)."""
        m, end = m0, m0 + count
        while m < end:
            img, rest = divmod(m, self.OH * self.OW)
            oh, ow = divmod(rest, self.OW)
            n = min(end - m, self.OW - ow)
            yield m - m0, n, self.offset + img * self.n_stride + oh * self.oh_stride + ow * self.ow_stride
            m += n


@dataclass(frozen=True)
class ShiftedWindow(Describable):
    """A stride-1 conv over a channels-last image whose pixels are rows of C channels, back to
    back: output row m' = oh * W + ow of an image (W the image's width: the last KW - 1 columns of
    each row are computed and never stored) reads, for tap t, image pixel m' + shifts[t]. So one
    band of the image, rows [m0, m0 + tm + halo), holds every tap's A tile of output rows
    [m0, m0 + tm): each an offset into it. The image is read once per row tile (plus its halo),
    where gathered patches read it once per tap."""

    image: str
    dtype: str
    offset: int
    n_stride: int
    pixel_stride: int      # elements between pixels (C)
    C: int
    W: int                 # pixels per image row (the output rows' pitch)
    OW: int
    shifts: tuple[int, ...]  # per tap (kh, kw): pixels from the output row's pixel
    out: str
    out_dtype: str
    out_offset: int
    out_n_stride: int
    out_oh_stride: int
    out_ow_stride: int

    @property
    def halo(self) -> int:
        return max(self.shifts)

    def stored(self, m0: int, count: int):
        """The rows [m0, m0 + count) that are outputs, as pieces inside one output row: (first row,
        rows, output element of the first, without the batch's)."""
        m, end = m0, m0 + count
        while m < end:
            oh, ow = divmod(m, self.W)
            if ow >= self.OW:  # (the row's last KW - 1 pixels: no output)
                m += self.W - ow
                continue
            n = min(end - m, self.OW - ow)
            yield m - m0, n, self.out_offset + oh * self.out_oh_stride + ow * self.out_ow_stride
            m += n


def _at(stride, extent, want) -> bool:
    """A dim's stride is `want` (a dim of one element is never stepped along: any stride is)."""
    return extent == 1 or stride == want


def k_stride(kernel: ConvKernel, channels_inner: bool) -> int | None:
    """The weight's stride along k, when k = (kh, kw, c) (`channels_inner`) or (c, kh, kw) is one
    stride in it (1: PyTorch's or a channels-last weight, read as [OC, K] rows and transposed on
    chip; OC: the weight laid out [KH, KW, C, OC], read as [K, OC] rows as they are), else None."""
    _, C, KH, KW = kernel.weight.shape
    _, wc, wkh, wkw = kernel.weight.strides
    if channels_inner:
        dims = ((wc, C, 1), (wkw, KW, C), (wkh, KH, KW * C))
    else:
        dims = ((wkw, KW, 1), (wkh, KH, KW), (wc, C, KH * KW))
    for stride, extent, inner in dims:
        if extent > 1:
            ks = stride // inner
            return ks if ks > 0 and all(_at(s, e, i * ks) for s, e, i in dims) else None
    return 1


def _window(kernel: ConvKernel) -> ShiftedWindow | None:
    """The shifted-window form of a stride-1 conv over a channels-last image and weight, else None."""
    N, C, H, W = kernel.image.shape
    OC, _, KH, KW = kernel.weight.shape
    _, _, OH, OW = kernel.out.shape
    sn, sc, sh, sw = kernel.image.strides
    (dh, dw) = kernel.dilation
    if kernel.stride != (1, 1) or KH * KW == 1 or C == 1:
        return None
    if not (sc == 1 and sw == C and (H == 1 or sh == W * C) and k_stride(kernel, True) is not None):
        return None
    shifts = tuple(kh * dh * W + kw * dw for kh in range(KH) for kw in range(KW))
    out = kernel.out
    return ShiftedWindow(kernel.image.name, kernel.image.dtype, kernel.image.offset, sn, C, C, W, OW, shifts,
                         out.name, out.dtype, out.offset, out.strides[0], out.strides[2], out.strides[3])


def _runs(kernel: ConvKernel, where: str):
    """(runs, R, form) of the image and weight layouts, or Unsupported."""
    N, C, H, W = kernel.image.shape
    OC, _, KH, KW = kernel.weight.shape
    sn, sc, sh, sw = kernel.image.strides
    dh, dw = kernel.dilation
    if _at(sc, C, 1) and k_stride(kernel, True) is not None:
        if dw == 1 and _at(sw, W, C):
            return tuple(kh * dh * sh for kh in range(KH)), KW * C, "channels-last: a run is an image row's KW taps x C"
        return tuple(kh * dh * sh + kw * dw * sw for kh in range(KH) for kw in range(KW)), C, \
            "channels-last: a run is one tap's C channels"
    if _at(sw, W, 1) and dw == 1 and k_stride(kernel, False) is not None:
        return tuple(c * sc + kh * dh * sh for c in range(C) for kh in range(KH)), KW, \
            "NCHW: a run is one channel's KW taps of an image row"
    raise Unsupported(f"{where}: image strides {kernel.image.strides} and weight strides {kernel.weight.strides}: "
                      f"no run of taps is contiguous in both (channels-last image and weight, or NCHW and "
                      f"PyTorch's weight, are planned)")


def analyse(kernel: ConvKernel) -> tuple[PatchRuns | ShiftedWindow, MatmulShape, TileKernel]:
    where = f"kernel {kernel.name!r}"
    kernel.check()
    image, weight, bias, out = kernel.image, kernel.weight, kernel.bias, kernel.out
    for role, b in (("image", image), ("weight", weight)):
        if b.dtype not in FLOATS:
            raise Unsupported(f"{where}: a convolution of a {b.dtype} {role} (the PE arrays multiply floats)")
    N, C, H, W = image.shape
    OC, _, KH, KW = weight.shape
    _, _, OH, OW = out.shape
    window = _window(kernel)
    if window is None:
        runs, R, form = _runs(kernel, where)
        isz = ITEMSIZE[image.dtype]
        Rp = -(-R * isz // STICK) * STICK // isz
        if R * isz * MIN_RUN_SHARE < STICK:
            raise Unsupported(f"{where}: runs of {R} elements ({R * isz} B) fill under 1/{MIN_RUN_SHARE} of a "
                              f"stick: gathered, they would move {STICK // (R * isz)}x the image")
    m_stride = OC
    wanted = (OH * OW * OC, 1, OW * OC, OC)  # channels-last: (n, oh, ow) rows of OC channels
    if any(n > 1 and s != w for n, s, w in zip(out.shape, out.strides, wanted)):
        raise Unsupported(f"{where}: output strides {out.strides} are not channels-last {wanted} (its rows are "
                          f"the PE's rows)")
    channels_inner = window is not None or (_at(image.strides[1], C, 1) and k_stride(kernel, True) is not None)
    ks = k_stride(kernel, channels_inner)
    wo = weight.strides[0]
    if ks is None or (ks != 1 and wo != 1 and OC > 1):
        raise Unsupported(f"{where}: weight strides {weight.strides}: neither its output channels nor its taps are "
                          f"contiguous")
    sn, _, sh, sw = image.strides
    (st_h, st_w) = kernel.stride
    b_tr = OC > 1 and ks == 1 and wo != 1  # (else read as [k, n] rows: a weight laid out [KH, KW, C, OC])
    if window is not None:
        # per image (a batch): rows m' = oh * W + ow up to the last output, k chunks whole taps;
        # A is the image's pixel rows, every tap of a row tile the same band (k stride 0: one slot)
        gather, batch, M, K = window, (N,), (OH - 1) * W + OW, KH * KW * C
        a = MAccess(image.name, image.dtype, (sn,), window.pixel_stride, 0, 0, image.offset)
        b = MAccess(weight.name, weight.dtype, (0,), 0, wo, ks, weight.offset)
        o = MAccess(out.name, out.dtype, (out.strides[0],), m_stride, 1, 0, out.offset)
        form = (f"shifted window: {KH * KW} taps of {C} channels, each an offset into one band of image "
                f"rows (halo {window.halo} pixels)")
    else:
        gather = PatchRuns(image.name, image.dtype, image.offset, sn, st_h * sh, st_w * sw, OH, OW, runs, R, Rp, form)
        batch, M, K = (), N * OH * OW, len(runs) * R
        # A: the virtual patch matrix [M, K] (what the slot pools key tiles by; never in device memory)
        a = MAccess(image.name, image.dtype, (), K, 0, 1, 0)
        b = MAccess(weight.name, weight.dtype, (), 0, wo, ks, weight.offset)
        o = MAccess(out.name, out.dtype, (), m_stride, 1, 0, out.offset)
        form = f"{form}: {len(runs)} runs of {R} elements, {Rp} columns each in the A tile"
    tiles = [Tile("a", image.dtype, space("m", "k"), Role.INPUT), Tile("b", weight.dtype, space("k", "n"), Role.INPUT)]
    if b_tr:
        tiles.append(Tile("b_rows", weight.dtype, space("k", "n"), Role.STAGING, of="b", relayout=Relayout.TRANSPOSED))
    tiles.append(Tile("acc", "fp32", space("m", "n"), Role.ACCUMULATOR))
    epi_steps, epi_loads = [], []
    if bias is not None:
        if OC > 1 and bias.strides[0] != 1:
            raise Unsupported(f"{where}: a bias with stride {bias.strides[0]}")
        tiles.append(Tile("bias", bias.dtype, space("n"), Role.INPUT))
        epi_loads.append(("bias", MAccess(bias.name, bias.dtype, tuple(0 for _ in batch), 0, 1, 0, bias.offset)))
        epi_steps.append(Step("binary", "add", "acc", ("acc", "bias")))  # in fp32, before the one rounding
    tiles.append(Tile("o", out.dtype, space("m", "n"), Role.OUTPUT))
    epi_steps.append(Step("unary", "copy", "o", ("acc",)))
    shape = MatmulShape(batch, M, OC, K, a, b, False, b_tr, tuple(epi_loads), (("o", o),), out.dtype)
    notes = (f"conv2d as C[{M}, {OC}] = patches[{M}, {K}] @ W^T[{K}, {OC}]" + (f" x {N} images" if batch else "")
             + ", the patches read from the image, never written", form,
             "B moved as [n, k] rows (the weight) and transposed on chip" if b_tr else "B moved as [k, n] rows")
    tk = TileKernel(
        "conv", AXES, tuple(tiles), (),
        (Phase(PhaseKind.CHUNK, (Step("matmul", "matmul", "acc", ("a", "b"), accumulate=True),), (("a", a), ("b", b)),
               (), "one k chunk of whole runs: the A tile gathered from the image, B from the weight, into the PE"),
         Phase(PhaseKind.EPILOGUE, tuple(epi_steps), tuple(epi_loads), (("o", o),),
               "once per output tile: the bias on the fp32 accumulator, then the store (channels-last rows)")),
        None, notes)
    tk.check()
    return gather, shape, tk


__all__ = ["MIN_RUN_SHARE", "PatchRuns", "ShiftedWindow", "analyse"]
