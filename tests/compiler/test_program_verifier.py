"""Every family's kept program goes through one independent check of its scratchpad (issue 29).

keep.validated is where each family's kept program ends (pointwise, gathers, reductions, matmul,
attention): the validator (bounds, sticks, queues) and then the replay of the program for two
tiles live on the same bytes (spyre_runtime/program/hazards.py). Here real kept programs of each
family are corrupted as a planner bug would: a tile moved onto one live beside it, a tile pushed
past the end of the scratchpad, a queue pop dropped. Each raises PlanError naming the kernel, the
core, the unit, the instruction and the bytes (or the queue); the programs as planned pass.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from pointwise_ir import binary_kernel, contiguous
from reduction_ir import layer_norm_kernel
from test_matmul_plans import matmul_kernel
from spyre_inductor.compiler.families.pointwise import plan as pointwise_plan
from spyre_inductor.compiler.inductor import scheduling
from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.ir.kernel_ir import AttentionKernel, Buffer, Index, Indirect, Kernel, Load, Store
from spyre_inductor.compiler.core.keep import validated
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program import isa
from spyre_runtime.program.operands import STICK, Addr, RowIndex, Tile
from spyre_runtime.program.program import CoreProgram


def embedding_kernel(V=100, N=512, D=256):
    return Kernel.of("embedding", (N, D), [Buffer("w", "fp16", (V, D), (D, 1)), Buffer("ids", "int64", (N,), (1,)),
                                          Buffer("out", "fp16", (N, D), (D, 1))],
                     [Load("ids", Index((1, 0)), "int64"), Indirect(0, V, True, "aten.embedding.default"),
                      Load("w", Index((0, 1), 0, ((1, D),)), "fp16")],
                     [Store("out", Index((D, 1)), 2)])


def attention_kernel(B=1, H=2, L=40, S=200, D=64):
    shapes = {"q": (B, H, L, D), "k": (B, H, S, D), "v": (B, H, S, D), "out": (B, H, L, D)}
    buffers = tuple(Buffer(n, "fp32", s, contiguous(s)) for n, s in shapes.items())
    return AttentionKernel("attention", buffers, D ** -0.5, None, None, None, "zero", None)


# Per family: a kernel that loops over several tiles on one core, and the tile a planner bug would
# put on a live one (its second stream buffer on its first: the load/store unit then fills the
# buffer the other unit is still reading, or overwrites a tile nothing has read yet).
FAMILIES = {
    "pointwise": (lambda: binary_kernel("add", (64, 4096), "fp16"), "in0[1]", "in0[0]"),
    "gather": (embedding_kernel, "in1[1]", "in1[0]"),
    "reduction": (lambda: layer_norm_kernel((64, 512), "fp16"), "t0[1]", "t0[0]"),
    "matmul": (lambda: matmul_kernel(128, 256, 96, bias=True), "a0[1]", "a0[0]"),
    "attention": (attention_kernel, "s[1]", "s[0]"),
}


@pytest.fixture(scope="module")
def planned():
    """family -> (kernel, its Compiled on one core: kept, so already through the checks)."""
    out = {}
    for family, (build, _, _) in FAMILIES.items():
        kernel = build()
        compiled = plan_kernel(kernel, cores=1)
        assert compiled.plans.family == {"gather": "indirect"}.get(family, family)
        out[family] = kernel, compiled
    return out


def moved(program, lo: int, hi: int, to: int):
    """`program` with every scratchpad address in [lo, hi) moved by to - lo (on every core, in
    every operand): what a placement putting the tile at `to` would have emitted."""
    delta = to - lo

    def move(o):
        if isinstance(o, Addr):
            return dataclasses.replace(o, base=o.base + delta) if lo <= o.base < hi else o
        if isinstance(o, (Tile, RowIndex, isa.Instruction)):
            changed = {f.name: move(getattr(o, f.name)) for f in dataclasses.fields(o)}
            return dataclasses.replace(o, **changed)
        if isinstance(o, tuple):
            return tuple(move(x) for x in o)
        return o

    cores = tuple(CoreProgram(c.core, tuple((u, move(instrs)) for u, instrs in c.units)) for c in program.cores)
    return dataclasses.replace(program, cores=cores)


WHERE = r"core \d+ unit (ls|pe|sfp) instruction \d+ \(\w+\)"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_planned_program_passes(planned, family):
    kernel, compiled = planned[family]
    assert validated(kernel, compiled.program) is compiled.program


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tile_moved_onto_a_live_one_raises_naming_where(planned, family):
    kernel, compiled = planned[family]
    _, name, onto = FAMILIES[family]
    by_name = {a.name: a for a in compiled.plans.placement.allocations}
    tile, live = by_name[name], by_name[onto]
    bad = moved(compiled.program, tile.offset, tile.offset + tile.nbytes, live.offset)
    with pytest.raises(PlanError) as e:
        validated(kernel, bad)
    message = str(e.value)
    assert message.startswith(f"kernel {kernel.name!r}: the planned program is wrong: program {kernel.name!r}: ")
    assert re.search(rf"{WHERE}( at loop indices \(\d+(, \d+)*,?\))? (reads|writes|overwrites) scratchpad bytes "
                     rf"\[\d+, \d+\)", message), message
    assert re.search(rf"which {WHERE} (reads|writes)|value {WHERE} wrote", message), message
    assert message.endswith("two tiles live at once share these bytes")
    # the bytes named are the live tile's
    lo, hi = map(int, re.search(r"scratchpad bytes \[(\d+), (\d+)\)", message).groups())
    assert live.offset <= lo < hi <= live.offset + live.nbytes + STICK


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tile_pushed_past_the_end_of_the_scratchpad_raises(planned, family):
    kernel, compiled = planned[family]
    last = max(compiled.plans.placement.allocations, key=lambda a: a.offset + a.nbytes)
    usable = HARDWARE.scratchpad_usable_bytes
    to = (usable - last.nbytes) // STICK * STICK + STICK  # its last stick past the usable bytes
    bad = moved(compiled.program, last.offset, last.offset + last.nbytes, to)
    with pytest.raises(PlanError, match=rf"kernel {re.escape(repr(kernel.name))}: .*{WHERE}: .*touches scratchpad "
                                        rf"bytes \[\d+, \d+\) outside the usable {usable} bytes"):
        validated(kernel, bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_dropped_queue_pop_raises_naming_the_queue_and_its_units(planned, family):
    kernel, compiled = planned[family]
    program = compiled.program
    core = program.cores[0]
    unit, instrs = next((u, i) for u, i in core.units if any(isinstance(x, isa.Pop) for x in i))
    k = max(n for n, x in enumerate(instrs) if isinstance(x, isa.Pop))
    units = tuple((u, i[:k] + i[k + 1:] if u == unit else i) for u, i in core.units)
    bad = dataclasses.replace(program, cores=(CoreProgram(core.core, units),) + program.cores[1:])
    queue = instrs[k].queue
    with pytest.raises(PlanError, match=rf"kernel {re.escape(repr(kernel.name))}: .*queue {re.escape(repr(queue))} "
                                        rf"gets \d+ pushes \(core \d+ unit \w+\) but \d+ pops \(core {core.core} "
                                        rf"unit {unit}\)"):
        validated(kernel, bad)


@pytest.mark.parametrize("strict", ["1", "0"])
def test_a_compiled_function_with_a_planner_bug_raises_and_never_falls_back(monkeypatch, tmp_path, strict):
    """A pointwise plan whose temporary lands on the input's stream buffer: compiling raises the
    PlanError, strict or not (a CPU fallback would hide the bug)."""
    monkeypatch.setenv("SPYRE_STRICT", strict)
    build = pointwise_plan.build_program

    def buggy(name, layout, tile_kernel, tiling, placement, division, notes, *args):
        program = build(name, layout, tile_kernel, tiling, placement, division, notes, *args)
        copies = sorted((a for a in placement.allocations if a.copy is not None), key=lambda a: a.offset)
        one, zero = copies[1], copies[0]  # two stream buffers, live together
        return moved(program, one.offset, one.offset + one.nbytes, zero.offset)

    monkeypatch.setattr(pointwise_plan, "build_program", buggy)
    monkeypatch.setattr(scheduling, "artifact_root", lambda: tmp_path)  # (planned now, not an artifact reused)
    torch._dynamo.reset()
    x = torch.randn(1024, 4096).to("spyre")  # (several tiles per core: the buffers take turns)
    with pytest.raises(Exception, match="two tiles live at once share these bytes"), \
            torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(lambda x: (x * 2).exp())(x)
    torch._dynamo.reset()


def test_an_attention_placement_with_two_tiles_on_the_same_bytes_raises(monkeypatch):
    """The one overlap the replay cannot see: a constant placed exactly on a temporary, both only
    the sfp's, reads as one tile updated in place. Attention's placement is checked too, as every
    other family's is (allocate.check_placement): PlanError naming both tiles."""
    from spyre_inductor.compiler.families.attention import planner as attention

    place = attention.placement

    def onto(shape, tiling):
        p = place(shape, tiling)
        t1 = p.at("t1")
        return dataclasses.replace(p, allocations=tuple(
            dataclasses.replace(a, offset=t1.offset) if a.tile == "scale" else a for a in p.allocations))

    monkeypatch.setattr(attention, "placement", onto)
    with pytest.raises(PlanError, match=r"attention scratchpad plan: (scale|t1) \[\d+, \d+\) and (t1|scale) "
                                        r"\[\d+, \d+\) overlap while both are live"):
        plan_kernel(attention_kernel(), cores=1)
