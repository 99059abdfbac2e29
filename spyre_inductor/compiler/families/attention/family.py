"""The attention family: a fused attention (spyre::attention) as one flash-style program.

Its symbolic sizes differ from every other family's: the sequence length is not a whole buffer
dim but each head's (a (batch, heads, seq, dim) buffer's heads are stride seq * dim apart), so
each head is its own placeholder (sizes.py), and the launch splits the call's buffers into heads.
"""

from __future__ import annotations

import dataclasses

from ...core.family import Family, register
from ...ir.kernel_ir import AttentionKernel
from . import sizes
from .planner import plan_attention


class AttentionFamily(Family):
    name = "attention"

    def claims(self, kernel) -> bool:
        return isinstance(kernel, AttentionKernel)

    def check(self, kernel) -> None:
        pass  # (an AttentionKernel is checked where it is built: inductor/attention_node.py)

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_attention(kernel, cores=cores, max_cores=max_cores)

    def program_with_sizes(self, program, kernel):
        # (its per-head placeholders carry their dims: sizes.py)
        return dataclasses.replace(program, sizes=tuple(n for n, _, _ in kernel.symbolic.sizes))

    def launch_shape(self, kernel, name, shape) -> list:
        return sizes.launch_shape(kernel, name, shape)

    def rebucket(self, kernel, n):
        return sizes.rebucket(kernel, n)

    def launch_args(self, kernel, args, n):
        return sizes.head_args(kernel, args, n)


FAMILY = register(AttentionFamily())
