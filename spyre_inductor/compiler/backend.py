"""compile_kernel: one PointwiseKernel -> one planned, verified program in an artifact directory.

The passes run in order (spyre_inductor/compiler/passes): layout, fusion,
tiling, scratchpad (which may shrink the tile), division (which emits and
times candidate programs), the independent verifier, then emission.
Anything the passes cannot compile raises ``Unsupported`` (the caller runs
the kernel on the CPU); a program the validator rejects is never emitted.

Artifacts are content-addressed: the directory name is a hash of the kernel
IR (without its name), the compiler version, the options and the hardware
config, so an identical kernel compiled again reuses the directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.program import Program
from spyre_runtime.program.validate import ProgramError, validate

from .errors import PlanError, Unsupported
from .kernel_ir import PointwiseKernel
from .passes.codegen import build_program
from .passes.division import DivisionPlan, choose_division
from .passes.emit import Plans, write_artifact
from .passes.fusion import plan_fusion
from .passes.layout import plan_layout
from .passes.scratchpad import plan_scratchpad
from .passes.tiling import plan_tiling
from .passes.verify import verify

__all__ = ["COMPILER_VERSION", "Compiled", "PlanError", "Unsupported", "artifact_key", "compile_kernel",
           "plan_kernel"]

# Part of every artifact's key: bump it when the generated programs change.
COMPILER_VERSION = "spyre-pointwise-1"


@dataclass(frozen=True)
class Compiled:
    plans: Plans
    program: Program


def _build(kernel: PointwiseKernel, plans_without_division, division: DivisionPlan) -> Program:
    layout, fusion, spad = plans_without_division
    notes = (f"{COMPILER_VERSION}: {len(fusion.steps)} fused step(s), tiles {spad.tiling.tile_rows}x"
             f"{spad.tiling.tile_cols} streamed along dim {spad.tiling.stream_dim}, {division.cores} core(s)")
    program = build_program(kernel.name, layout, fusion, spad, division, notes)
    try:
        validate(program)
    except ProgramError as e:
        raise Unsupported(f"kernel {kernel.name!r}: the planned program does not validate: {e}") from e
    return program


def plan_kernel(kernel: PointwiseKernel, *, cores: int | None = None, estimate=None) -> Compiled:
    """Run every pass; `cores` forces the core count (default: the timing model chooses)."""
    try:
        kernel.check()
    except ValueError as e:
        raise Unsupported(str(e)) from e
    if cores is not None and not 1 <= cores <= HARDWARE.cores:
        raise ValueError(f"cores must be in 1..{HARDWARE.cores}, got {cores}")
    layout = plan_layout(kernel)
    fusion = plan_fusion(kernel, layout)
    spad = plan_scratchpad(fusion, plan_tiling(layout, fusion))
    verify(spad, fusion)
    fixed = (layout, fusion, spad)
    kwargs = {} if estimate is None else {"estimate": estimate}
    division = choose_division(spad.tiling, lambda d: _build(kernel, fixed, d), force=cores, **kwargs)
    program = _build(kernel, fixed, division)
    return Compiled(Plans(layout, fusion, spad, division), program)


def artifact_key(kernel: PointwiseKernel, cores: int | None = None) -> str:
    ir = json.loads(kernel.to_json())
    ir.pop("name")  # identical kernels under different names share an artifact
    text = json.dumps({"ir": ir, "compiler": COMPILER_VERSION, "cores": cores,
                       "hardware": dataclasses.asdict(HARDWARE)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_kernel(kernel: PointwiseKernel, artifact_root: Path, *, cores: int | None = None) -> Path:
    """The artifact directory of `kernel` under `artifact_root` (reused if already compiled)."""
    root = Path(artifact_root)
    final = root / artifact_key(kernel, cores)
    if (final / "launch_spec.json").exists():
        return final
    compiled = plan_kernel(kernel, cores=cores)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write_artifact(staging, kernel, compiled.plans, compiled.program, COMPILER_VERSION)
        try:
            os.rename(staging, final)  # atomic: a reader sees a whole artifact or none
        except OSError:
            if not (final / "launch_spec.json").exists():  # not a concurrent compile of the same kernel
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final
