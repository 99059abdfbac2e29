"""The gather/scatter family: loads and stores at indices read from memory.

It claims the kernels that gather or scatter inside a reduction; an uncut gather or scatter
without one is cut into pieces by the pointwise family first, which hands each piece's rows
back to this family's plan.
"""

from __future__ import annotations

from ...core.compiled import Compiled
from ...core.family import Family, register
from ...ir.errors import Unsupported
from ...ir.kernel_ir import Indirect, IndirectKernel
from ...core.bounds import check_bounds
from .lowering import index_load
from .plan import plan


class IndirectFamily(Family):
    name = "indirect"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, IndirectKernel) and bool(kernel.reduction_ranges)

    def check(self, kernel) -> None:
        super().check(kernel)
        check_bounds(kernel, "a reduction's masks are not cut into pieces (only pointwise kernels are)")

    def plan(self, kernel, *, cores, max_cores, estimate):
        plans, program = plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
        return Compiled(plans, program)

    def fusion_vetoed(self, fused) -> bool:
        if not isinstance(fused, IndirectKernel):
            return False
        # a gather takes its indices from memory: their computation stays apart; and a gather or
        # scatter inside a reduction is not planned: apart, each compiles
        return not _indices_loaded(fused) or bool(fused.reduction_ranges)


def _indices_loaded(kernel) -> bool:
    try:
        for pos, v in enumerate(kernel.values):
            if isinstance(v, Indirect):
                index_load(kernel, pos)
    except Unsupported:
        return False
    return True


FAMILY = register(IndirectFamily())
