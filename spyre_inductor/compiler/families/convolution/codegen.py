"""Conv code generation: the matmul family's program (matmul/codegen.py: slots, queues, the
epilogue, the stores) with its A tiles read from the image, never from a patch matrix.

Gathered runs (lowering.PatchRuns): a k chunk holds whole runs. The load/store unit moves each
A tile (or, when the cores share A over the ring, its own slice of the tile's rows) as one Load
per run and per piece of the rows inside one output row (consecutive output columns read the
image ``stride * w-stride`` apart, one run each), into the run's stick-aligned columns. The PE
multiplies each run's R columns of A with the R rows of B that hold the same taps, so a run's
padding up to its stick is moved (whole sticks) but never multiplied.

A shifted window (lowering.ShiftedWindow, stride 1): a k chunk is whole taps. A row tile's A slot
holds a band of image pixels, its rows and the halo the taps reach, loaded once (every tap's
step keys the same tile, so the slot pool keeps it); each tap's product reads the band from
its shift on. The stores skip the rows past each output row's last column.
"""

from __future__ import annotations

from spyre_runtime.program.isa import Load, MatMul, Pop, Push, Store
from spyre_runtime.program.operands import ITEMSIZE

from ...ir.errors import PlanError
from ...core.transfers import PIECE_BYTES, rows_in_pieces
from ..matmul.codegen import MatmulCore, epilogue_pieces
from .lowering import PatchRuns, ShiftedWindow


class PatchCore(MatmulCore):
    """One core's block of the conv's output, its A tiles read from the image."""

    def __init__(self, gather: PatchRuns | ShiftedWindow, *args):
        super().__init__(*args)
        self.gather = gather

    def move_rows(self, ls, which, dst, r0, count, bidx, mt, nt, kt, piece_bytes=PIECE_BYTES, pieces=1):
        """Rows [r0, r0 + count) of an A tile (a slot's whole tile, or this core's slice of one all
        the cores share over the ring) read from the image."""
        if which != "a":
            return super().move_rows(ls, which, dst, r0, count, bidx, mt, nt, kt, piece_bytes, pieces)
        g = self.gather
        isz = ITEMSIZE[g.dtype]
        if isinstance(g, ShiftedWindow):
            if r0 or count != mt[1]:
                raise PlanError("conv shifted-window plan: an A band split over the ring (its halo is not sent)")
            origin = g.offset + bidx[0] * g.n_stride + mt[0] * g.pixel_stride
            rows_in_pieces(ls, dst.offset, g.image, origin * isz, count + g.halo, g.C * isz, g.pixel_stride * isz,
                           dst.row_stride, piece_bytes, pieces)
            return None
        first, runs = kt[0] // g.R, kt[1] // g.R
        for row, rows, start in g.rows(mt[0] + r0, count):
            at = dst.offset + (r0 + row) * dst.row_stride
            for j in range(runs):
                ls.emit(Load(ls.sp(at + j * g.Rp * isz), ls.dev(g.image, (start + g.runs[first + j]) * isz), rows,
                             g.R * isz, g.ow_stride * isz if rows > 1 else 0, dst.row_stride))
        return None

    def matmul(self, pe, acc, a, b, mt, nt, kt, accumulate: bool, ka=None) -> None:
        g = self.gather
        dtype_a, dtype_b = self.tk.tile(self.ta).dtype, self.tk.tile(self.tb).dtype
        out = pe.tile(acc.offset, "fp32", mt[1], nt[1], acc.row_stride)
        if isinstance(g, ShiftedWindow):
            first, extra = divmod(kt[0], g.C)
            if extra or kt[1] % g.C:
                raise PlanError(f"conv shifted-window plan: k chunk {kt} is not whole taps of {g.C} channels")
            for j in range(kt[1] // g.C):  # each tap's rows of the band, from its shift, by its C rows of B
                pe.emit(MatMul(out, pe.tile(a.offset + g.shifts[first + j] * a.row_stride, dtype_a, mt[1], g.C,
                                            a.row_stride),
                               pe.tile(b.offset + j * g.C * b.row_stride, dtype_b, g.C, nt[1], b.row_stride),
                               accumulate=accumulate or j > 0))
            return
        if g.Rp == g.R:  # the runs fill whole sticks: the A tile's columns are k, one product
            return super().matmul(pe, acc, a, b, mt, nt, kt, accumulate, ka)
        first = 0 if ka is None else (kt[0] - ka[0]) // g.R  # the A tile's run that k-step kt starts at
        for j in range(kt[1] // g.R):
            pe.emit(MatMul(out, pe.tile(a.offset + (first + j) * g.Rp * ITEMSIZE[dtype_a], dtype_a, mt[1], g.R,
                                        a.row_stride),
                           pe.tile(b.offset + j * g.R * b.row_stride, dtype_b, g.R, nt[1], b.row_stride),
                           accumulate=accumulate or j > 0))

    def store(self, ls, queues, c, bidx, mt, nt):
        g = self.gather
        if not isinstance(g, ShiftedWindow):
            return super().store(ls, queues, c, bidx, mt, nt)
        full, free = queues
        for p0, pc in epilogue_pieces(mt[1]):  # as the sfp hands each piece of rows over (the base's store)
            ls.emit(Pop(full))
            for name, access in self.epi.stores:
                a, isz = self.p.at(name, c), ITEMSIZE[access.dtype]
                for row, rows, at in g.stored(mt[0] + p0, pc):
                    origin = at + bidx[0] * g.out_n_stride + nt[0]
                    ls.emit(Store(ls.dev(g.out, origin * isz), ls.sp(a.offset + (p0 + row) * a.row_stride), rows,
                                  nt[1] * isz, g.out_ow_stride * isz if rows > 1 else 0, a.row_stride))
        ls.emit(Push(free))
        return None


def patch_core(gather: PatchRuns | ShiftedWindow):
    """The core factory build_matmul_program takes."""
    return lambda *args: PatchCore(gather, *args)


__all__ = ["PatchCore", "patch_core"]
