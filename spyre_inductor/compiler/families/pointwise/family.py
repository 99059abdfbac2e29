"""The pointwise family: whatever no other family claims, a kernel over its ranges with no
reduction (gathers and scatters too: cut into pieces here first, their rows then planned by the
indirect family)."""

from __future__ import annotations

from ...core.family import Family, register
from .plan import plan_pointwise


class PointwiseFamily(Family):
    name = "pointwise"

    def claims(self, kernel) -> bool:
        return True

    def plan(self, kernel, *, cores, max_cores, estimate):
        return plan_pointwise(kernel, cores, max_cores, estimate)


FAMILY = register(PointwiseFamily())
