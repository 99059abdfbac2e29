"""The experts family: a grouped matmul (GroupedMatmulKernel: mixture-of-experts routing) as one
program whose experts' row ranges are read and counted on chip."""

from __future__ import annotations

from ...core.family import Family, register
from ...ir.kernel_ir import GroupedMatmulKernel
from .planner import plan_experts


class ExpertsFamily(Family):
    name = "experts"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, GroupedMatmulKernel)

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_experts(kernel, cores=cores, max_cores=max_cores, estimate=estimate)


FAMILY = register(ExpertsFamily())
