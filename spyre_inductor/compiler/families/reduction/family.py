"""The reduction and scan family: resident, chunked and ring plans, chosen by the timing model.

A kernel whose reduced dim is empty is pointwise: every reduction is its identity, handed to the
pointwise family.
"""

from __future__ import annotations

from ...core.compiled import Compiled
from ...core.family import Family, family, register
from ...ir.errors import Unsupported
from ...ir.kernel_ir import IndirectKernel
from ...core.bounds import check_bounds
from .division import plan
from .lowering import empty_as_pointwise
from .space import canonical

_MASKS = "a reduction's masks are not cut into pieces (only pointwise kernels are)"


class ReductionFamily(Family):
    name = "reduction"

    def claims(self, kernel) -> bool:
        return bool(kernel.reduction_ranges)

    def check(self, kernel) -> None:
        super().check(kernel)
        check_bounds(kernel, _MASKS)

    def plan(self, kernel, *, cores, max_cores, estimate):
        if 0 in kernel.reduction_ranges:
            return family("pointwise").plan(empty_as_pointwise(kernel), cores=cores, max_cores=max_cores,
                                            estimate=estimate)
        kwargs = {} if estimate is None else {"estimate": estimate}
        plans, program = plan(kernel, cores=cores, max_cores=max_cores, **kwargs)
        return Compiled(plans, program)

    def fusion_vetoed(self, fused) -> bool:
        return not _plannable_shape(fused) or not _masks_plannable(fused)


def _plannable_shape(kernel) -> bool:
    """False if the reduction planner would refuse the kernel's iteration space outright: fusing
    into such a group would turn nodes that compile on their own into one CPU fallback (found
    by the graph fuzzer). Reduced dims that do not merge into one are planned (chunked, the
    others looped) unless the kernel scans over them. A cheap check, not a plan."""
    if kernel is None or not kernel.reduction_ranges or 0 in kernel.reduction_ranges:
        return True
    looped = canonical(kernel)[4]
    return not (looped and kernel.has_scan)


def _masks_plannable(kernel) -> bool:
    """False for a reduction (or matmul) group with a masked load outside its buffer (a pad fused
    into a reduction as its prologue): only pointwise kernels are cut at their masks, so the
    group would run on the CPU where its nodes apart compile (found by the graph fuzzer). (A
    gather or scatter inside one: the indirect family's veto.)"""
    if kernel is None or not kernel.reduction_ranges or isinstance(kernel, IndirectKernel):
        return True
    try:
        check_bounds(kernel)
    except Unsupported:
        return False
    return True


FAMILY = register(ReductionFamily())
