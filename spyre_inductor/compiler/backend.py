"""compile_kernel: one Kernel (kernel_ir) -> one planned, verified program in an artifact directory.

The pointwise passes run in order (spyre_inductor/compiler/passes): layout,
fusion (the tile kernel, tiles.py), tiling, scratchpad (which may shrink
the tile), the independent verifier, division (which emits and times
candidate programs, search.py), then emission of one plans.Plans.
Anything the passes cannot compile raises ``Unsupported`` (the caller runs
the kernel on the CPU); a program the validator rejects is never emitted.

Artifacts are content-addressed: the directory name is a hash of the kernel
IR (without its name), the compiler version, the options and the hardware
config, so an identical kernel compiled again reuses the directory, in this
process or another (one sharing Inductor's cache dir), without planning;
a directory found corrupt is rebuilt (compile_kernel).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.artifact import check_artifact_files
from spyre_runtime.program.program import Program

from .errors import PlanError, Unsupported
from .kernel_ir import AttentionKernel, IndirectKernel, Kernel, MatmulKernel
from .passes.tiles import PhaseKind
from .passes.codegen import build_program
from .passes.division import TIE, choose_division, chosen_ns, representative, simulated_ns
from .passes.emit import write_artifact
from .passes.fusion import plan_fusion
from .passes import pieces
from .passes.indirect_plan import plan as indirect_plan
from .passes.layout import TRANSPOSED_MODE, BufferLayout, buffers_of, plan_layout, symbols_of
from .passes.attention import plan_attention
from .passes.matmul import plan_matmul
from .passes.keep import kept
from .passes.minimum import union_traffic
from .passes.plans import Division, Plans
from .passes.reduction_division import plan as reduction_plan
from .passes.reduction_lowering import empty_as_pointwise
from .passes.scratchpad import plan_scratchpad
from .passes.tiling import BUFFER_CHOICES, ROW_STICKS, TARGETS, plan_tiling
from .passes.verify import verify

__all__ = ["COMPILER_VERSION", "Compiled", "PlanError", "Unsupported", "artifact_key", "compile_kernel",
           "plan_kernel"]

# Part of every artifact's key: bump it when the generated programs change.
COMPILER_VERSION = "spyre-7"  # 1: pointwise, 2: phased plans, 3: reductions, 4: matmuls, one planner, 5: relayouts on chip, 6: gathers/scatters, 7: fused attention


@dataclass(frozen=True)
class Compiled:
    plans: Plans
    program: Program


def _build(kernel: Kernel, fixed, division: Division, check: bool = True) -> Program:
    layout, tile_kernel, tiling, placement = fixed
    steps = tile_kernel.phase(PhaseKind.CHUNK).steps
    notes = (f"{COMPILER_VERSION}: {len(steps)} fused step(s), {layout.relayout} relayout, tiles {tiling.tile_rows}x"
             f"{tiling.tile_cols} streamed along dim {tiling.stream_dim}, {division.cores} core(s)")
    program = build_program(kernel.name, layout, tile_kernel, tiling, placement, division, notes)
    if check:  # (kept declares a symbolic kernel's sizes before it validates)
        return kept(kernel, program)
    # a candidate, only timed; the chosen program is built again and validated
    if getattr(kernel, "symbolic", None) is not None:  # (candidates are validated when timed: sizes first)
        from .symbolic import program_with_sizes

        program = program_with_sizes(program, kernel)
    return program


def _candidates(kernel, fixed, estimate):
    """(build, estimate) for timing division candidates: by one representative core
    (division.representative) unless the caller brought its own estimate."""
    build = lambda d: _build(kernel, fixed, d, check=False)  # noqa: E731 - timed only, never kept
    if estimate is not None:
        return build, estimate
    return representative(build)


def plan_kernel(kernel: Kernel, *, cores: int | None = None, max_cores: int | None = None,
                estimate=None) -> Compiled:
    """Run every pass of the kernel's family; the kept program records the kernel's minimum
    traffic (passes/minimum.py). `cores` forces the core count, `max_cores` caps it (default: the
    timing model chooses among up to all cores)."""
    for name, n in (("cores", cores), ("max_cores", max_cores)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= HARDWARE.cores):
            raise ValueError(f"{name} must be an integer in 1..{HARDWARE.cores}, got {n!r}")
    if cores is not None and max_cores is not None and cores > max_cores:
        raise ValueError(f"cores ({cores}) exceeds max_cores ({max_cores})")
    if isinstance(kernel, AttentionKernel):
        return plan_attention(kernel, cores=cores, max_cores=max_cores)
    try:
        kernel.check()
    except ValueError as e:
        raise Unsupported(str(e)) from e
    if kernel.reduction_ranges:
        # (pointwise kernels are checked piece by piece)
        pieces.check_bounds(kernel, "a reduction's masks are not cut into pieces (only pointwise kernels are)")
    if isinstance(kernel, IndirectKernel) and not kernel.reduction_ranges:
        return _plan_pointwise(kernel, cores, max_cores, estimate)  # (pieces first: a gather beside masks)
    if isinstance(kernel, IndirectKernel):
        plans, program = indirect_plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
        return Compiled(plans, program)
    if isinstance(kernel, MatmulKernel) and 0 not in kernel.reduction_ranges:
        try:
            return plan_matmul(kernel, cores=cores, max_cores=max_cores)
        except Unsupported as declined:
            # what the PE plans cannot take (a prologue, operands walking several row dims) is still
            # a reduction: the dot is a sum of products, planned on the special-function pipeline
            try:
                return _plan_reduction(kernel, cores, max_cores, estimate)
            except Unsupported as e:
                raise Unsupported(f"{declined}; as a reduction: {e}") from e
    if kernel.reduction_ranges:
        if 0 in kernel.reduction_ranges:
            # an empty reduced dim: every reduction is its identity, the rest is pointwise
            kernel = empty_as_pointwise(kernel)
        else:
            return _plan_reduction(kernel, cores, max_cores, estimate)
    return _plan_pointwise(kernel, cores, max_cores, estimate)


def _plan_pointwise(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """A pointwise kernel whole, or (when index masks cut it: a cat, a pad) piece by piece into one
    program (passes/pieces.py)."""
    cut = pieces.split(kernel)
    if cut is not None:
        pieces.check_independent(kernel)
    if cut is None:
        if any(pieces.cut_points(kernel)):  # cuttable, but into too many pieces to unroll
            pieces.check_bounds(kernel, f"its masks would cut it into more than {pieces.MAX_PIECES} pieces")
        else:
            pieces.check_bounds(kernel)
        return _plan_whole(kernel, cores, max_cores, estimate)
    units = []  # (pieces, the kernel planned for them, its plan): a stacked group or one piece
    for group in _shape_groups(cut):
        for piece in group:
            pieces.check_bounds(piece.kernel)
        together = pieces.stacked(group)
        if together is not None:
            try:
                units.append((group, together, _plan_whole(together, cores, max_cores, estimate)))
                continue
            except Unsupported:
                pass  # (more tiles per tile than fit: plan them one by one)
        units += [((p,), p.kernel, _plan_whole(p.kernel, cores, max_cores, estimate)) for p in group]
    stacked = sum(len(g) for g, _, _ in units if len(g) > 1)
    notes = (f"{COMPILER_VERSION}: {len(cut)} pieces cut at the index masks ({stacked} stacked into shared "
             f"tiles), {len(units)} plan(s) run one after another")
    program = units[0][2].program if len(units) == 1 else pieces.in_sequence(
        kernel.name, symbols_of(kernel), [c.program for _, _, c in units], notes)
    program = kept(kernel, dataclasses.replace(program, notes=notes), union_traffic([k for _, k, _ in units]))
    ns = simulated_ns(program)
    largest = max(units, key=lambda u: sum(math.prod(p.counts) for p in u[0]))[2].plans
    plan = pieces.PiecesPlan(pieces.cut_points(kernel), tuple(p.starts + p.counts for p in cut),
                             tuple(c.plans.division.cores for _, _, c in units),
                             tuple(c.plans.division.ns for _, _, c in units),
                             f"the index masks are constant on each piece: each is a plain kernel; pieces of "
                             f"one shape are stacked into one plan when none writes what another reads "
                             f"(their loads shared): {[len(g) for g, _, _ in units]} piece(s) per plan")
    division = Division(max(plan.cores), f"{len(cut)} pieces in {len(units)} plan(s), each over its own cores",
                        tuple((f"plan {k}", ns_k) for k, ns_k in enumerate(plan.ns)),
                        "each plan's division chosen alone; the tile kernel shown is the largest plan's",
                        (), ns)
    plans = Plans(largest.family, buffers_of(kernel), largest.tile_kernel, (("pieces", plan),) + largest.stages,
                  largest.placement, division)
    return Compiled(plans, program)


def _shape_groups(cut) -> list[tuple]:
    """The pieces grouped by box shape, in order of their first piece."""
    groups: dict[tuple, list] = {}
    for p in cut:
        groups.setdefault(p.counts, []).append(p)
    return [tuple(g) for g in groups.values()]


def _plan_whole(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """One uncut kernel (or piece): a gather/scatter by its family, dense work by the pointwise one."""
    if isinstance(kernel, IndirectKernel):
        plans, program = indirect_plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
        return Compiled(plans, program)
    return _plan_dense(kernel, cores, max_cores, estimate)


def _plan_dense(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """The pointwise family: its lowering (layout, fusion: the tile kernel), its plan variants
    (tile-size target x stream buffers x, in the transposed relayout, rows per block: each a tile
    shape and a placement), then the core count."""
    layout = plan_layout(kernel)
    tile_kernel = plan_fusion(kernel, layout)
    # Tile size and buffering are chosen at the most cores the kernel may use, then the core
    # count for the chosen variant: they change the time by a few percent at any count, so
    # timing every variant at every count would multiply the planning time for nothing.
    widest = cores or max_cores or HARDWARE.cores
    best, seen = None, set()
    blocks = ROW_STICKS if layout.relayout == TRANSPOSED_MODE else ROW_STICKS[:1]
    for target, buffers, rows in ((t, b, r) for t in TARGETS for b in BUFFER_CHOICES for r in blocks):
        placement, tiling = plan_scratchpad(tile_kernel, plan_tiling(layout, tile_kernel, target, buffers, rows))
        if tiling in seen:
            continue  # the kernel is smaller than the target: same plan
        seen.add(tiling)
        verify(tile_kernel, tiling, placement)
        fixed = (layout, tile_kernel, tiling, placement)
        build, timed = _candidates(kernel, fixed, estimate)
        trial = choose_division(tiling, build, force=widest, estimate=timed)
        ns = chosen_ns(trial)
        if best is None or ns < best[0] * (1 - TIE):  # ties go to the smaller tile, planned first
            best = (ns, fixed)
    fixed = best[1]
    layout, tile_kernel, tiling, placement = fixed
    build, timed = _candidates(kernel, fixed, estimate)
    division = choose_division(tiling, build, force=cores, estimate=timed, max_cores=max_cores)
    program = _build(kernel, fixed, division)
    plans = Plans("pointwise", layout.buffers, tile_kernel, (("layout", layout), ("tiling", tiling)), placement,
                  division)
    return Compiled(plans, program)


def _plan_reduction(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """Reductions and scans (passes/reduction_*.py): resident / chunked / ring plans chosen by the
    timing model; the kept program is validated once there."""
    kwargs = {} if estimate is None else {"estimate": estimate}
    plans, program = reduction_plan(kernel, cores=cores, max_cores=max_cores, **kwargs)
    return Compiled(plans, program)


def artifact_key(kernel: Kernel, cores: int | None = None, max_cores: int | None = None) -> str:
    ir = json.loads(kernel.to_json())
    ir.pop("name")  # identical kernels under different names share an artifact
    text = json.dumps({"ir": ir, "compiler": COMPILER_VERSION, "cores": cores, "max_cores": max_cores,
                       "hardware": dataclasses.asdict(HARDWARE)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# What compile_kernel did, per process: "planned" (a new artifact), "reused" (an intact one found:
# another compile, maybe another process's, wrote it), "rebuilt" (one found corrupt, replaced).
artifact_stats: collections.Counter[str] = collections.Counter()


def compile_kernel(kernel: Kernel, artifact_root: Path, *, cores: int | None = None,
                   max_cores: int | None = None) -> Path:
    """The artifact directory of `kernel` under `artifact_root`.

    An existing directory is reused once its files check out (launch.check_artifact_files: the
    launch spec parses and each file it reads has the size and sha256 recorded, a few hashes, no
    decoding). A directory that does not (truncated, altered, of another format, incomplete) is
    rebuilt in place, with one warning saying why. Writing is rename-based: the artifact is
    written in a staging directory and renamed into place, a corrupt one is first renamed out of
    the way, so a reader sees a whole artifact or none, and processes compiling the same kernel
    at once each end with an intact directory (whichever rename lands)."""
    root = Path(artifact_root)
    final = root / artifact_key(kernel, cores, max_cores)
    corrupt = _broken(final)
    if corrupt is None:
        artifact_stats["reused"] += 1
        return final
    # (a symbolic kernel is planned at its bucket's maximum; its program declares the size and
    # its symbolic dims where every family's program is validated: passes/keep.py)
    compiled = plan_kernel(kernel, cores=cores, max_cores=max_cores)
    artifact_stats["planned"] += 1
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write_artifact(staging, kernel, compiled.plans, compiled.program, COMPILER_VERSION)
        if corrupt and _broken(final):  # (still: another process may have rebuilt it meanwhile)
            _set_aside(final, root)
            artifact_stats["rebuilt"] += 1
            warnings.warn(f"spyre: rebuilt the corrupt artifact {final} of kernel {kernel.name!r} ({corrupt})",
                          RuntimeWarning, stacklevel=2)
        try:
            os.rename(staging, final)  # atomic: a reader sees a whole artifact or none
        except OSError:
            if _broken(final) is not None:  # not a concurrent compile of the same kernel
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _broken(directory: Path) -> str | None:
    """None if `directory` holds an intact artifact; "" if there is nothing there; else what is
    wrong with it (the launch layer's message, naming the file)."""
    if not os.path.lexists(directory):
        return ""
    try:
        check_artifact_files(directory)
    except FileNotFoundError as e:
        return f"{e.filename} is missing"
    except OSError as e:  # ArtifactError (an OSError too), or unreadable
        return str(e)
    return None


def _set_aside(directory: Path, root: Path) -> None:
    """Rename `directory` out of the way (then delete it): the name is free for the rebuilt one
    at once, and a reader of the old one never sees it half deleted. Someone else may have
    moved it already."""
    aside = Path(tempfile.mkdtemp(prefix=".corrupt-", dir=root))
    try:
        os.rename(directory, aside / "artifact")
    except FileNotFoundError:
        pass
    finally:
        shutil.rmtree(aside, ignore_errors=True)
