"""The sort family: a SortKernel (sort, argsort, topk of rows) planned as a sorting network. Rows are
independent, so a dynamic count of rows is the default symbolic case (dim 0 of every buffer), but
the kernel is not a loop nest: its bucket's kernel is rebuilt here."""

from __future__ import annotations

import dataclasses

from ...core.family import Family, register
from ...ir.kernel_ir import SortKernel
from ...symbolic import planning
from .planner import plan_sort


class SortFamily(Family):
    name = "sort"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, SortKernel)

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_sort(kernel, cores=cores, max_cores=max_cores)

    def rebucket(self, kernel, n):
        # (a dynamic count of rows: every buffer's dim 0 is coef * size, planned at the bucket's maximum)
        sizes = planning.rebucketed_sizes(kernel, n)
        (_, _, hi), = sizes.sizes
        rows = {b: c * hi + k for b, _, _, c, k in sizes.buffers}
        buffers = tuple(dataclasses.replace(b, shape=(rows[b.name],) + b.shape[1:]) for b in kernel.buffers)
        return dataclasses.replace(kernel, buffers=buffers, symbolic=sizes)


FAMILY = register(SortFamily())
