"""The sort family: a SortKernel (sort, argsort, topk of rows) planned as a sorting network."""

from __future__ import annotations

from ...core.family import Family, register
from ...ir.kernel_ir import SortKernel
from .planner import plan_sort


class SortFamily(Family):
    name = "sort"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, SortKernel)

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_sort(kernel, cores=cores, max_cores=max_cores)


FAMILY = register(SortFamily())
