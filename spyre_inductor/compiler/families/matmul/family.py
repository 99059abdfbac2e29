"""The matmul family: a dot of two operands on the PE arrays, with its prologue and epilogue.

What the PE plans decline (a prologue, operands walking several row dims) is still a reduction:
the dot is a sum of products, planned by the reduction family on the special-function pipeline.
"""

from __future__ import annotations

from ...core.family import Family, family, register
from ...ir.errors import Unsupported
from ...ir.kernel_ir import MatmulKernel, Reduction
from ...core import search
from ...core.bounds import check_bounds
from ...core.division import simulated_ns
from .lowering import analyse
from .planner import plan_matmul


class MatmulFamily(Family):
    name = "matmul"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, MatmulKernel) and 0 not in kernel.reduction_ranges

    def check(self, kernel) -> None:
        super().check(kernel)
        check_bounds(kernel, "a reduction's masks are not cut into pieces (only pointwise kernels are)")

    def plan(self, kernel, *, cores, max_cores, estimate):
        try:
            compiled = plan_matmul(kernel, cores=cores, max_cores=max_cores)
        except Unsupported as declined:
            try:
                return family("reduction").plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
            except Unsupported as e:
                raise Unsupported(f"{declined}; as a reduction: {e}") from e
        if not _row_dots(kernel):
            return compiled
        # One row against a weight stored transposed (a decode step's x @ W.t()): each output is
        # the dot of a contiguous weight row with x, which the sfp plans of a reduction do without
        # the on-chip transposes of W that the PE plans need (a k/v projection 1x256x128: 0.62 us
        # against 0.74 us); the timing model picks, a tie keeping the PE plan.
        try:
            as_dots = family("reduction").plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
        except Unsupported:
            return compiled
        # each timed whole, as it will run (the candidates' times may be one core's standing for all)
        pe_ns, dots_ns = simulated_ns(compiled.program, check=False), simulated_ns(as_dots.program, check=False)
        return as_dots if dots_ns < pe_ns and not search.close_to(pe_ns, dots_ns) else compiled

    def fusion_vetoed(self, fused) -> bool:
        return _several_dots(fused)

    def loses_to_fusion(self, fused, alone) -> bool:
        # Not when the group would lose the PE plans its matmul has alone: an epilogue operand
        # broadcast over one of the output's row dims (GPT-2's position embeddings in the first
        # block's residual) keeps the rows from merging into one m dim, and the matmul ran as
        # a reduction (1957 us, 168x its minimum bytes). Apart, the epilogue is a pointwise
        # kernel of its own.
        return _pe_declined(fused) and any(isinstance(part, MatmulKernel) and not _pe_declined(part)
                                           for part in alone())

def _row_dots(kernel) -> bool:
    """One row per batch against a B moved as [n, k] rows: a dot of contiguous rows per output."""
    try:
        shape, _ = analyse(kernel)
    except Unsupported:
        return False
    return shape.M == 1 and shape.b_transposed


def _several_dots(kernel) -> bool:
    """Two matmuls in one group (q, k and v projections of one x, fused horizontally because they
    share it): the PE plans take one dot per program, and as a reduction the group re-reads its
    operands once per output tile (80x the minimum bytes for a QKV projection); apart, each is a
    PE program that reads x once more, which costs far less."""
    if kernel is None:
        return False
    return sum(1 for v in kernel.values if isinstance(v, Reduction) and v.op == "dot") > 1


def _pe_declined(kernel) -> bool:
    """True for a matmul group the PE plans decline (lowering.analyse refuses it): it would be
    planned as a reduction on the special-function pipeline, which re-reads an operand per
    output row."""
    if not isinstance(kernel, MatmulKernel):
        return False
    try:
        analyse(kernel)
    except Unsupported:
        return True
    return False


FAMILY = register(MatmulFamily())
