"""Conv code generation: the matmul family's program (matmul/codegen.py: slots, queues, the
epilogue, the stores) with its A tiles gathered from the image and its PE steps per run.

A k chunk holds whole runs (lowering.PatchRuns). The load/store unit moves each A tile (or, when
the cores share A over the ring, its own slice of the tile's rows) as one Load per run and per
piece of the rows inside one output row (consecutive output columns read the image ``stride *
w-stride`` apart, one run each), into the run's stick-aligned columns. The PE multiplies each run's R columns of A with the R rows of B that hold the same
taps, so a run's padding up to its stick is moved (whole sticks) but never multiplied.
"""

from __future__ import annotations

from spyre_runtime.program.isa import Load, MatMul
from spyre_runtime.program.operands import ITEMSIZE

from ..matmul.codegen import MatmulCore
from .lowering import PatchRuns


class PatchCore(MatmulCore):
    """One core's block of the conv's output, its A tiles gathered in runs."""

    def __init__(self, patches: PatchRuns, *args):
        super().__init__(*args)
        self.patches = patches

    def move_rows(self, ls, which, dst, r0, count, bidx, mt, nt, kt, piece_bytes=None):
        """Rows [r0, r0 + count) of an A tile (a slot's whole tile, or this core's slice of one all
        the cores share over the ring) gathered from the image: a Load per run per piece of rows
        inside one output row."""
        if which != "a":
            return super().move_rows(ls, which, dst, r0, count, bidx, mt, nt, kt,
                                     *(() if piece_bytes is None else (piece_bytes,)))
        pr = self.patches
        isz = ITEMSIZE[pr.dtype]
        first, runs = kt[0] // pr.R, kt[1] // pr.R
        for row, rows, start in pr.rows(mt[0] + r0, count):
            at = dst.offset + (r0 + row) * dst.row_stride
            for j in range(runs):
                ls.emit(Load(ls.sp(at + j * pr.Rp * isz), ls.dev(pr.image, (start + pr.runs[first + j]) * isz), rows,
                             pr.R * isz, pr.ow_stride * isz if rows > 1 else 0, dst.row_stride))

    def matmul(self, pe, acc, a, b, mt, nt, kt, accumulate: bool) -> None:
        pr = self.patches
        if pr.Rp == pr.R:  # the runs fill whole sticks: the A tile's columns are k, one product
            return super().matmul(pe, acc, a, b, mt, nt, kt, accumulate)
        dtype_a, dtype_b = self.tk.tile(self.ta).dtype, self.tk.tile(self.tb).dtype
        for j in range(kt[1] // pr.R):
            pe.emit(MatMul(pe.tile(acc.offset, "fp32", mt[1], nt[1], acc.row_stride),
                           pe.tile(a.offset + j * pr.Rp * ITEMSIZE[dtype_a], dtype_a, mt[1], pr.R, a.row_stride),
                           pe.tile(b.offset + j * pr.R * b.row_stride, dtype_b, pr.R, nt[1], b.row_stride),
                           accumulate=accumulate or j > 0))


def patch_core(patches: PatchRuns):
    """The core factory build_matmul_program takes."""
    return lambda *args: PatchCore(patches, *args)


__all__ = ["PatchCore", "patch_core"]
