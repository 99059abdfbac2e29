"""Conv code generation: the matmul family's program (matmul/codegen.py: slots, queues, the
epilogue, the stores) with its A tiles gathered from the image and its PE steps per run.

A k chunk holds whole runs (lowering.PatchRuns). The load/store unit moves each A tile as one
Load per run and per piece of the tile's rows inside one output row (consecutive output
columns read the image ``stride * w-stride`` apart, one run each), into the run's stick-aligned
columns. The PE multiplies each run's R columns of A with the R rows of B that hold the same
taps, so a run's padding up to its stick is moved (whole sticks) but never multiplied.
"""

from __future__ import annotations

from spyre_runtime.program.isa import Load, MatMul, Pop, Push
from spyre_runtime.program.operands import ITEMSIZE

from ..matmul.codegen import MatmulCore
from .lowering import PatchRuns


class PatchCore(MatmulCore):
    """One core's block of the conv's output, its A tiles gathered in runs."""

    def __init__(self, patches: PatchRuns, *args):
        super().__init__(*args)
        self.patches = patches

    def load_operand(self, ls, queues, which, slot, bidx, mt, nt, kt, after=None):
        if which != "a":
            return super().load_operand(ls, queues, which, slot, bidx, mt, nt, kt, after)
        pr, full, free = self.patches, queues[0], queues[1]
        isz = ITEMSIZE[pr.dtype]
        dst = self.p.at(self.ta, slot)
        first, count = divmod(kt[0], pr.R)[0], kt[1] // pr.R
        ls.emit(Pop(free))
        for r0, rows, start in pr.rows(mt[0], mt[1]):
            for j in range(count):
                ls.emit(Load(ls.sp(dst.offset + r0 * dst.row_stride + j * pr.Rp * isz),
                             ls.dev(pr.image, (start + pr.runs[first + j]) * isz), rows, pr.R * isz,
                             pr.ow_stride * isz if rows > 1 else 0, dst.row_stride))

        def finish():
            ls.emit(Push(full))

        if after is None:
            finish()
        else:
            after.append(finish)

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
