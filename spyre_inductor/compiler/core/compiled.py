"""What planning a kernel produces, whatever its family, and the version every artifact is keyed by."""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.program.program import Program

from .plans import Plans

# Part of every artifact's key: bump it when the generated programs change (and rewrite
# tests/compiler/golden_programs.json, which pins every program of a corpus).
COMPILER_VERSION = "spyre-10"  # 1: pointwise, 2: phased plans, 3: reductions, 4: matmuls, one planner, 5: relayouts on chip, 6: gathers/scatters, 7: fused attention, 8: split-k matmuls, 9: attention chunks counted on chip, 10: attention ring groups, sort/conv/experts families, matmul transfers in pieces


@dataclass(frozen=True)
class Compiled:
    plans: Plans
    program: Program


__all__ = ["COMPILER_VERSION", "Compiled"]
