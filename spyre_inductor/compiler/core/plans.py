"""The plan of one compiled kernel, whatever its family: what the artifact writer and the summary read.

``Plans`` holds the launch arguments (graph buffers in PyTorch's layout),
the tile kernel the family lowered to, every pass's result in pass order
(``stages``: each a Describable with its own ``describe()``), the
scratchpad placement and the division with the candidates it compared.
One template (templates/summary.txt.j2) renders any family's plan from
these; a family's own decisions reach it through ``TileKernel.notes``
and ``Division.reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._dump import Describable, plain
from .allocate import Placement
from .tiles import TileKernel


@dataclass(frozen=True)
class Division(Describable):
    """Which cores run what, and why: the candidates the timing model compared."""

    cores: int
    split: str                                   # what was split over the cores, for a person
    candidates: tuple[tuple[str, float], ...]    # (candidate, simulated ns)
    reason: str
    shares: tuple = ()                           # the family's per-core shares
    ns: float = 0.0                              # the chosen candidate's simulated ns (0: not timed)


@dataclass(frozen=True)
class Plans(Describable):
    family: str
    buffers: tuple                               # BufferLayout per launch argument, in order
    tile_kernel: TileKernel
    stages: tuple[tuple[str, Describable], ...]  # (pass, its result) in pass order
    placement: Placement
    division: Division

    def stage(self, name: str):
        for n, plan in self.stages:
            if n == name:
                return plan
        raise KeyError(f"{self.family} plans have no stage {name!r} (have {[n for n, _ in self.stages]})")

    def describe(self) -> dict:
        return {"family": self.family, "buffers": plain(self.buffers), "tile_kernel": self.tile_kernel.describe(),
                **{name: plan.describe() for name, plan in self.stages},
                "scratchpad": self.placement.describe(), "division": self.division.describe()}


__all__ = ["Division", "Plans"]
