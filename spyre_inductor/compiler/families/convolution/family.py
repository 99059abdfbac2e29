"""The conv family: conv2d as an implicit GEMM on the PE arrays (issue 31), its A tiles gathered
from the image (no patch matrix in device memory), the rest the matmul family's PE plan.

A ConvKernel is captured by inductor/convolution_node.py where the conv lowering hands the
family a convolution it takes (lowering.analyse: the layouts whose patch rows are runs of
whole taps); everything else, and the backward, stays the patch-copy lowering
(inductor/convolution.py). Before matmul in dispatch order (a ConvKernel is no MatmulKernel, so
the order only says it is planned on its own terms).
"""

from __future__ import annotations

from ...core.family import Family, register
from ...ir.kernel_ir import ConvKernel
from .plan import plan_conv


class ConvFamily(Family):
    name = "conv"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, ConvKernel)

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_conv(kernel, cores=cores, max_cores=max_cores, estimate=estimate)


FAMILY = register(ConvFamily())
