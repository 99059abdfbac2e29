"""The reduction family on the shared planner skeleton (issue 15 Part 1): what its tile kernel says.

A reduction lowers to a TileKernel (family "reduction", axes outer and
reduced): every tile has a space (the axes it varies over) and a Role, and
nothing reads meaning from a tile's name. The plan search times a
candidate by one core where one core stands for its siblings and never
validates a candidate it does not keep.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from reduction_ir import layer_norm_kernel, row_reduce, softmax_kernel
from spyre_inductor.compiler import backend
from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.ir.kernel_ir import Buffer, Constant, Index, Kernel, Load, MatmulKernel, Op, Reduction, Store
from spyre_inductor.compiler.families.reduction import division as reduction_division
from spyre_inductor.compiler.families.reduction.argreduce import SLICE_START
from spyre_inductor.compiler.families.reduction.codegen import build_reduction_program
from spyre_inductor.compiler.families.reduction.division import plan
from spyre_inductor.compiler.families.reduction.lowering import empty_as_pointwise
from spyre_inductor.compiler.families.reduction.plan import verify_reduction
from spyre_inductor.compiler.core.tiles import ChunkValue, PhaseKind, Relayout, Role, Step

OUTER, REDUCED = "outer", "reduced"


def _steps(tk):
    return [s for p in tk.phases for s in p.steps] + list(tk.combine.steps if tk.combine else ())


def test_a_softmax_reduces_into_per_row_accumulators():
    c = plan_kernel(softmax_kernel((512, 1024), "fp16"))
    tk = c.plans.tile_kernel
    assert c.plans.family == tk.family == "reduction" and tk.axes == (OUTER, REDUCED)
    reduced = {s.op: tk.tile(s.dst) for s in _steps(tk) if s.kind == "reduce"}
    assert set(reduced) == {"max", "sum"}
    for t in reduced.values():
        assert t.role is Role.ACCUMULATOR and t.space == {OUTER} and t.dtype == "fp32"
    [x] = [tk.tile(name) for p in tk.phases for name, _ in p.loads]
    [out] = [tk.tile(name) for p in tk.phases for name, _ in p.stores]
    assert (x.role, x.space, x.dtype) == (Role.INPUT, {OUTER, REDUCED}, "fp16")
    assert (out.role, out.space, out.dtype) == (Role.OUTPUT, {OUTER, REDUCED}, "fp16")
    assert [p.kind for p in tk.phases] == [PhaseKind.CHUNK] and tk.combine is None  # resident rows: one phase


def test_what_no_group_changes_is_loaded_once_per_core_in_the_setup_phase():
    tk = plan_kernel(layer_norm_kernel((64, 1024), "fp16")).plans.tile_kernel  # resident rows
    setup, chunk = tk.phases
    assert (setup.kind, chunk.kind) == (PhaseKind.SETUP, PhaseKind.CHUNK) and not setup.steps
    assert [(a.buffer, tk.tile(n).space, tk.tile(n).role) for n, a in setup.loads] == [
        ("w", {REDUCED}, Role.INPUT), ("b", {REDUCED}, Role.INPUT)]
    assert [a.buffer for _, a in chunk.loads] == ["x"]


def test_a_chunked_plan_has_its_chunk_extents_as_chunk_constants():
    c = plan_kernel(layer_norm_kernel((3, 300_000), "fp32"))
    assert c.plans.stage("plan").mode == "chunked"
    tk, placement = c.plans.tile_kernel, c.plans.placement
    # each chunk's mean divides its sum by its extent, and Chan's combine weighs the chunk by it
    [extent] = tk.with_role(Role.CHUNK_CONSTANT)
    assert extent.chunk_value is ChunkValue.EXTENT and extent.space == frozenset()
    assert extent.dtype == "fp32" and any(s.op == "div" and s.args[1] == extent.name for s in _steps(tk))
    assert any(s.op == "add" and extent.name in s.args for s in _steps(tk))
    # one copy for the full chunk's extent, one for the remainder's
    assert sorted(a.copy for a in placement.allocations if a.tile == extent.name) == [0, 1]
    # a chunked argmax advances the index of each chunk's first element by the chunk's extent
    argmax = plan_kernel(row_reduce("argmax", (3, 300_000), -1, "fp32"), cores=1).plans.tile_kernel
    [extent] = argmax.with_role(Role.CHUNK_CONSTANT)
    assert (extent.chunk_value, extent.dtype) == (ChunkValue.EXTENT_INT, "int32")
    # two passes (the statistics, then the normalisation), each per group: init, chunks, epilogue;
    # the weight and bias vary over the reduced dim, so they stream with the second pass's chunks
    assert [p.kind for p in tk.phases] == [PhaseKind.INIT, PhaseKind.CHUNK, PhaseKind.EPILOGUE] * 2
    assert [tk.tile(n).space for n, _ in tk.phases[4].loads] == [{OUTER, REDUCED}, {REDUCED}, {REDUCED}]
    assert [p.reason for p in tk.phases if p.kind is PhaseKind.CHUNK] == [
        r.split(": ", 1)[1] for r in c.plans.stage("plan").pass_reasons]


def test_a_ring_plan_lands_each_partial_in_the_accumulators_landing_tile():
    c = plan_kernel(row_reduce("argmax", (8, 200_000), -1, "fp32"))
    assert c.plans.stage("plan").mode == "ring"
    tk = c.plans.tile_kernel
    assert tk.combine is not None and tk.combine.kind == "ring"
    landed = set()
    for acc in tk.combine.tiles:
        a = tk.tile(acc)
        assert a.role is Role.ACCUMULATOR
        [landing] = tk.serving(acc, Role.RING_LANDING)
        assert (landing.dtype, landing.space) == (a.dtype, a.space)
        landed.add(landing.name)
    assert {n for s in tk.combine.steps for n in s.args} >= landed
    # the first index of each core's slice is a typed fill value, not a name
    starts = [s for s in _steps(tk) if s.kind == "fill" and s.value is SLICE_START]
    assert len(starts) == 1 and tk.tile(starts[0].dst).role is Role.ACCUMULATOR


def test_relayouts_pass_through_staging_tiles_of_the_tile_they_serve():
    from spyre_inductor.compiler.families.reduction.lowering import lower

    # the reduced dim is not the contiguous one: the row-tile lowering (the planner may prefer
    # column tiles, which move x as it lies: tests/compiler/test_dim0_fusion.py)
    tk = lower(row_reduce("sum", (512, 1024), 0, "fp16"), "resident").tile_kernel
    [x] = [tk.tile(n) for p in tk.phases for n, _ in p.loads]
    [transposed] = tk.serving(x.name, Role.STAGING)
    assert transposed.relayout is Relayout.TRANSPOSED and transposed.of == x.name
    [out] = [tk.tile(n) for p in tk.phases for n, _ in p.stores]
    assert out.space == {OUTER}
    [row] = tk.serving(out.name, Role.STAGING)
    assert row.relayout is Relayout.ROW and row.space == {OUTER}


def _renamed(low, plan_, names):
    """The lowering and plan with every tile renamed by `names` (old -> new)."""
    tk = low.tile_kernel

    def step(s):
        return replace(s, dst=names[s.dst], args=tuple(names[a] for a in s.args))

    def phase(p):
        return replace(p, steps=tuple(map(step, p.steps)), loads=tuple((names[t], a) for t, a in p.loads),
                       stores=tuple((names[t], a) for t, a in p.stores))

    tiles = tuple(replace(t, name=names[t.name], of=names[t.of] if t.of else None) for t in tk.tiles)
    combine = tk.combine and replace(tk.combine, tiles=tuple(names[t] for t in tk.combine.tiles),
                                     steps=tuple(map(step, tk.combine.steps)))
    tk = replace(tk, tiles=tiles, constants=tuple((names[t], v) for t, v in tk.constants),
                 phases=tuple(map(phase, tk.phases)), combine=combine)
    placement = replace(plan_.placement, allocations=tuple(replace(a, tile=names[a.tile])
                                                           for a in plan_.placement.allocations))
    return replace(low, tile_kernel=tk), replace(plan_, placement=placement)


@pytest.mark.parametrize("kernel, cores", [
    (layer_norm_kernel((3, 300_000), "fp32"), None),        # chunked, chunk constants, setup loads
    (row_reduce("argmax", (3, 300_000), -1, "fp32"), 1),    # chunked argmax: the slice start
    (row_reduce("argmax", (8, 200_000), -1, "fp32"), None), # ring: landing tiles
    (row_reduce("sum", (512, 1024), 0, "fp16"), None),      # transposed and packed-row staging
], ids=["welford-chunked", "argmax-chunked", "argmax-ring", "sum-dim0"])
def test_no_meaning_travels_in_a_tile_name(kernel, cores):
    """Renaming every tile, to names that once meant something else, builds the same program."""
    plans, program = plan(kernel, cores=cores)
    low, plan_, division = plans.stage("lowering"), plans.stage("plan"), plans.division
    tiles = [t.name for t in low.tile_kernel.tiles]
    misleading = ["in:", "@n", "@inv_n", "@n_i", "base", "#rem", "#full", "^T", "^col", "^row"]
    names = {n: f"{misleading[k % len(misleading)]}{len(tiles) - k}" for k, n in enumerate(tiles)}
    low2, plan2 = _renamed(low, plan_, names)
    verify_reduction(plan2, low2)
    again = build_reduction_program(kernel, low2, plan2, division.shares, notes=program.notes)
    assert again.to_json() == program.to_json()


def test_a_planner_bug_raises_plan_error():
    plans, _ = plan(row_reduce("sum", (1 << 20,), 0, "fp32"))
    low, plan_ = plans.stage("lowering"), plans.stage("plan")
    assert low.mode == "ring"
    tk = low.tile_kernel
    # a step reading a tile the kernel does not have
    bad = replace(tk, phases=tk.phases[:1] + (replace(tk.phases[1], steps=tk.phases[1].steps + (
        Step("unary", "copy", tk.phases[1].steps[0].dst, ("nowhere",)),)),) + tk.phases[2:])
    with pytest.raises(PlanError, match="unknown tile 'nowhere'"):
        verify_reduction(plan_, replace(low, tile_kernel=bad))
    # an accumulator combined over the ring without a landing tile
    landing = {t.name for t in tk.with_role(Role.RING_LANDING)}
    bad = replace(tk, tiles=tuple(t for t in tk.tiles if t.name not in landing), combine=replace(
        tk.combine, steps=()))
    with pytest.raises(PlanError, match="no ring landing tile"):
        verify_reduction(plan_, replace(low, tile_kernel=bad))
    # an allocation smaller than its tile
    [acc] = tk.combine.tiles
    small = replace(plan_.placement, allocations=tuple(replace(a, nbytes=a.nbytes // 2) if a.tile == acc else a
                                                       for a in plan_.placement.allocations))
    with pytest.raises(PlanError, match=r"need \d+ B"):
        verify_reduction(replace(plan_, placement=small), low)


# ---- what planning builds and validates ----------------------------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """(programs built, programs validated) while planning: every build of a reduction program,
    every validate() (the kept program's, core/keep.py, and timing.estimate's)."""
    built, validated = [], []
    real_build = reduction_division.build_reduction_program

    def build(*args, **kw):
        built.append(real_build(*args, **kw))
        return built[-1]

    validate_module = sys.modules["spyre_runtime.program.validate"]
    real_validate = validate_module.validate

    def validate(program, *args, **kw):
        validated.append(program)
        return real_validate(program, *args, **kw)

    monkeypatch.setattr(reduction_division, "build_reduction_program", build)
    monkeypatch.setattr(validate_module, "validate", validate)  # (core/keep.py validates through it)
    return built, validated


def test_planning_a_softmax_builds_one_whole_program_and_validates_it_once(counted):
    """(64, 1000) fp16 over 32 cores: the 5 candidates are 3 distinct plans (both tile targets
    hold a core's 2 rows), each timed by a one-core program; the kept one is built whole once
    and validated once. Before the port: 6 builds (5 whole-size candidates' first cores and the
    kept program) and 6 validations (7 counting a later estimate of the kept program)."""
    built, validated = counted
    c = plan_kernel(softmax_kernel((64, 1000), "fp16"))
    assert c.plans.division.cores == 32 and len(c.plans.division.candidates) == 5
    whole = [p for p in built if len(p.cores) == 32]
    assert whole == [c.program] and whole[0] is c.program
    assert len(built) == 4 and all(len(p.cores) == 1 for p in built[:-1])
    assert len(validated) == 1 and validated[0] is c.program


def test_a_ring_candidate_timed_whole_is_kept_without_building_it_again(counted):
    built, validated = counted
    c = plan_kernel(row_reduce("sum", (1 << 20,), 0, "fp32"))
    assert c.plans.stage("plan").mode == "ring"
    assert any(p is c.program for p in built)          # the program its candidate was timed with
    assert len(built) == len({id(p) for p in built})
    assert len(validated) == 1 and validated[0] is c.program


# ---- a matmul the matmul family declines is a reduction whose reduction is a dot --------------


def _matmul(M, K, N, dtype="fp32"):
    return Kernel.of("mm", (M, N), (Buffer("a", dtype, (M, K), (K, 1)), Buffer("b", dtype, (K, N), (N, 1)),
                                    Buffer("out", dtype, (M, N), (N, 1))),
                     (Load("a", Index((K, 0, 1)), dtype), Load("b", Index((0, 1, N)), dtype),
                      Op("mul", (0, 1), "fp32"), Reduction("dot", 2, "fp32")),
                     (Store("out", Index((N, 1, 0)), 3),), (K,))


def test_a_dot_is_planned_as_a_sum(tmp_path):
    from spyre_runtime.launch import launch_jobplan
    from spyre_runtime.prepare import prepare_kernel

    k = _matmul(8, 48, 24)
    assert isinstance(k, MatmulKernel)
    assert empty_as_pointwise(_matmul(8, 0, 24)).values[3] == Constant(0.0, "fp32")  # K = 0: a sum's identity
    plans, program = plan(k)
    tk = plans.tile_kernel
    assert plans.stage("plan").mode == "resident"
    [red] = [s for s in _steps(tk) if s.kind == "reduce"]
    assert red.op == "sum" and tk.tile(red.dst).role is Role.ACCUMULATOR
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 48, generator=g), torch.randn(48, 24, generator=g)
    dev = [t.to("spyre") for t in (a, b, torch.empty(8, 24))]
    launch_jobplan(prepare_kernel(backend.compile_kernel(k, tmp_path)), dev)
    torch.spyre.synchronize()
    # fp32 products summed in fp32 over K = 48: a few ulps of the largest partial sums
    torch.testing.assert_close(dev[2].cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_a_long_dot_accumulates_from_zero_and_combines_over_the_ring_with_add():
    plans, _ = plan(_matmul(2, 300_000, 1))  # decode-shaped: 2 outputs, K = 300K
    low, division = plans.stage("lowering"), plans.division
    assert low.mode == "ring" and division.cores > 1
    tk = low.tile_kernel
    [red] = [s for s in _steps(tk) if s.kind == "reduce"]
    assert red.op == "sum" and red.accumulate
    [fill] = [s for s in _steps(tk) if s.kind == "fill" and s.dst == red.dst]
    assert fill.value == 0.0
    assert [s.op for s in tk.combine.steps] == ["add"] and tk.combine.tiles == (red.dst,)
