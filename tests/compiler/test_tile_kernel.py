"""The planner skeleton's contract, as the pointwise family uses it: a tile kernel whose tiles say
what they are by role and space (never by name), one Plans per kernel, and a planner bug that
raises PlanError before anything is emitted."""

from __future__ import annotations

import dataclasses

import pytest

from pointwise_ir import KernelBuilder, binary_kernel
from spyre_inductor.compiler.backend import compile_kernel, plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.core.allocate import Need, allocate, check_needs, check_placement
from spyre_inductor.compiler.core.fusion import plan_fusion
from spyre_inductor.compiler.core.layout import plan_layout
from spyre_inductor.compiler.core.plans import Division, Plans
from spyre_inductor.compiler.core.scratchpad import plan_scratchpad
from spyre_inductor.compiler.core.tiles import PhaseKind, Role, Step, TileKernel, broadcast_of, space
from spyre_inductor.compiler.core.tiling import plan_tiling
from spyre_inductor.compiler.core.verify import verify
from spyre_runtime.program.isa import Binary, Load

FULL = space("rows", "sticks")


def broadcast_add():
    """out = x + r * c + 2 and row = r, on (37, 130) fp32: x full, r a row (130,), c a column (37, 1)."""
    k = KernelBuilder("bcast_add", (37, 130))
    k.buffer("x", "fp32", (37, 130))
    k.buffer("r", "fp32", (130,))
    k.buffer("c", "fp32", (37, 1))
    k.buffer("out", "fp32", (37, 130))
    k.buffer("row", "fp32", (37, 130))
    r = k.load("r")
    k.store("out", k.op("add", k.op("add", k.load("x"), k.op("mul", r, k.load("c"))), k.const(2.0)))
    k.store("row", r)
    return k.build()


def _planned(kernel):
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    placement, tiling = plan_scratchpad(tk, plan_tiling(lay, tk))
    return tk, tiling, placement


def test_broadcast_add_tiles_say_what_they_are_by_role_and_space():
    kernel = broadcast_add()
    tk = plan_fusion(kernel, plan_layout(kernel))
    assert isinstance(tk, TileKernel) and tk.family == "pointwise" and tk.axes == ("rows", "sticks")
    assert tk.full == FULL
    chunk = tk.phase(PhaseKind.CHUNK)
    assert [p.kind for p in tk.phases] == [PhaseKind.CHUNK]
    loaded = {access.buffer: tk.tile(name) for name, access in chunk.loads}
    assert {b: (t.role, t.space) for b, t in loaded.items()} == {
        "x": (Role.INPUT, FULL),                # varies over both axes
        "r": (Role.INPUT, space("sticks")),     # one row, the same for every row
        "c": (Role.INPUT, space("rows")),       # one element per row
    }
    (const, value), = tk.constants
    assert (tk.tile(const).role, tk.tile(const).space, value) == (Role.CONSTANT, space(), 2.0)
    assert {t.space for t in tk.with_role(Role.TEMPORARY)} == {FULL}  # the sfp writes whole tiles
    stored = {access.buffer: tk.tile(name) for name, access in chunk.stores}
    assert {b: (t.role, t.space, t.dtype) for b, t in stored.items()} == {
        "out": (Role.OUTPUT, FULL, "fp32"), "row": (Role.OUTPUT, FULL, "fp32")}
    # the broadcast row stored whole goes through a final copy; the sum's own tile is stored as it is
    copies = [s for s in chunk.steps if s.op == "copy"]
    assert [(s.args, s.dst) for s in copies] == [((loaded["r"].name,), stored["row"].name)]
    assert all(s.dst != stored["out"].name or s.op == "add" for s in chunk.steps)
    # every name a step or a move uses is a tile of the kernel
    tk.check()


def test_spaces_give_the_isa_broadcasts_and_the_bytes_loaded():
    assert [broadcast_of(s, "rows", "sticks") for s in (FULL, space("sticks"), space("rows"), space())] == [
        "none", "rows", "cols", "scalar"]
    assert [broadcast_of(s, "rows", None) for s in (space("rows"), space())] == ["none", "rows"]
    kernel = broadcast_add()
    compiled = plan_kernel(kernel, cores=1)
    tk, placement = compiled.plans.tile_kernel, compiled.plans.placement
    (core,) = compiled.program.cores
    sfp = [i for i in core.unit("sfp") if isinstance(i, Binary)]
    assert {t.broadcast for i in sfp for t in (i.a, i.b)} == {"none", "rows", "cols", "scalar"}
    assert {i.dst.broadcast for i in sfp} == {"none"}
    chunk = tk.phase(PhaseKind.CHUNK)
    by_offset = {placement.at(name, 0).offset: access.buffer for name, access in chunk.loads}
    loads = {by_offset[i.dst.base]: (i.rows, i.row_bytes) for i in core.unit("ls")
             if isinstance(i, Load) and i.dst.base in by_offset}
    assert loads == {"x": (37, 130 * 4), "r": (1, 130 * 4), "c": (37, 4)}


def test_plans_are_one_object_for_the_artifact_and_its_summary(tmp_path):
    kernel = binary_kernel("add", (67, 71), "fp32", y_shape=(71,))
    plans = plan_kernel(kernel).plans
    assert isinstance(plans, Plans) and plans.family == "pointwise"
    assert [n for n, _ in plans.stages] == ["layout", "tiling"]
    assert [b.name for b in plans.buffers] == ["x", "y", "out"]
    assert isinstance(plans.division, Division) and plans.division.cores == len(plans.division.shares)
    assert plans.division.ns in [ns for _, ns in plans.division.candidates]  # the chosen one's time
    d = compile_kernel(kernel, tmp_path)
    summary = (d / "summary.txt").read_text()
    assert "pointwise" in summary and "tile kernel on axes rows, sticks" in summary
    assert "input" in summary and "varies over {sticks}" in summary and "varies over {rows, sticks}" in summary
    assert "chunk phase" in summary and "binary add(" in summary
    assert "candidate" in summary and plans.division.reason in summary
    for n in plans.tile_kernel.notes:
        assert n in summary


def test_a_planner_bug_raises_plan_error():
    kernel = broadcast_add()
    tk, tiling, placement = _planned(kernel)
    verify(tk, tiling, placement)
    # two temporaries live at the same step on the same bytes
    temps = [a for a in placement.allocations if a.live is not None]
    a, b = next((a, b) for a in temps for b in temps
                if a is not b and not (a.live[1] < b.live[0] or b.live[1] < a.live[0]))
    moved = tuple(dataclasses.replace(x, offset=a.offset) if x is b else x for x in placement.allocations)
    with pytest.raises(PlanError, match="overlap while both are live"):
        verify(tk, tiling, dataclasses.replace(placement, allocations=moved))
    # a stream buffer missing
    streamed = next(x for x in placement.allocations if x.copy == 1)
    fewer = tuple(x for x in placement.allocations if x is not streamed)
    with pytest.raises(PlanError, match=f"tile {streamed.tile!r} has copies"):
        verify(tk, tiling, dataclasses.replace(placement, allocations=fewer))
    # a tile too small for its rows
    tall = next(x for x in placement.allocations if x.nbytes > x.row_stride)
    shrunk = tuple(dataclasses.replace(x, nbytes=x.row_stride) if x is tall else x for x in placement.allocations)
    with pytest.raises(PlanError, match=r"has \d+ B, its \d+ row\(s\)"):
        verify(tk, tiling, dataclasses.replace(placement, allocations=shrunk))
    # a step that reads a tile the kernel does not have
    chunk = tk.phase(PhaseKind.CHUNK)
    bad = dataclasses.replace(chunk, steps=chunk.steps + (Step("unary", "neg", chunk.steps[0].dst, ("nowhere",)),))
    with pytest.raises(PlanError, match="unknown tile 'nowhere'"):
        verify(dataclasses.replace(tk, phases=(bad,)), tiling, placement)


def test_the_shared_allocator_reuses_dead_bytes_and_its_checks_catch_overlap():
    needs = [Need("k", 128, 128), Need("s", 1024, 256, copies=2),
             Need("a", 512, 256, live=(0, 1)), Need("b", 512, 256, live=(1, 2)), Need("c", 512, 256, live=(2, 3))]
    placement = allocate(needs, 1 << 20)
    offsets = {x.name: x.offset for x in placement.allocations}
    assert offsets == {"k": 0, "s[0]": 128, "s[1]": 1152, "a": 2176, "b": 2688, "c": 2176}  # c reuses a's bytes
    check_needs("test", needs, placement)
    check_placement("test", placement.allocations, placement.usable)
    overlapping = tuple(dataclasses.replace(x, offset=2176) if x.name == "b" else x for x in placement.allocations)
    with pytest.raises(PlanError, match=r"test: a \[2176, 2688\) and b \[2176, 2688\) overlap"):
        check_placement("test", overlapping, placement.usable)
    with pytest.raises(PlanError, match="copies and a live range"):
        allocate([Need("x", 128, 128, copies=2, live=(0, 1))], 1 << 20)
