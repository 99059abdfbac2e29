"""The scratchpad hazard check (spyre_runtime/program/hazards.py) on programs small enough to read.

Each hazard is a few instructions that put two live tiles on the same scratchpad bytes; each
pattern that merely looks like one (an update in place, part of a tile updated then the whole
read, a value computed and never used, a queue ordering the units) passes. The compiler's
kept programs of every family go through the same check (tests/compiler/test_program_verifier.py).
"""

from __future__ import annotations

import pytest

from spyre_authoring.calibration import CALIBRATION
from spyre_authoring.handwritten import cast_round_trip, ring_sum, row_softmax, tiled_matmul, vector_add
from spyre_runtime.program import isa
from spyre_runtime.program.hazards import ScratchpadHazard, check_scratchpad
from spyre_runtime.program.isa import Binary, EndLoop, Fill, Load, Loop, Pop, Push, Send, Store, Unary
from spyre_runtime.program.operands import Addr, DevAddr, Tile
from spyre_runtime.program.program import CoreProgram, Program, Queue, Symbol
from spyre_runtime.program.validate import PlacementError, validate

ROWS, COLS = 4, 32  # fp32 tiles of 4 rows of one stick
ROW = 128


def tile(addr, rows=ROWS, dtype="fp32", stride=ROW, cols=COLS):
    return Tile(Addr(addr), dtype, rows, cols, stride)


def program(units, queues=(), cores=None):
    """`units`: {unit: [instructions]} on core 0, or `cores`: {core: {unit: [...]}}."""
    cores = cores or {0: units}
    symbols = (Symbol("x", "input", "fp32", (ROWS, COLS), (COLS, 1)),
               Symbol("out", "output", "fp32", (ROWS, COLS), (COLS, 1)))
    p = Program("hazard_test", symbols,
                tuple(CoreProgram(c, tuple((u, tuple(i)) for u, i in us.items())) for c, us in sorted(cores.items())),
                tuple(queues))
    validate(p)  # (every program here is well formed: only its timing of tiles is in question)
    return p


def load(addr):
    return Load(Addr(addr), DevAddr("x"), ROWS, ROW, ROW, ROW)


def store(addr):
    return Store(DevAddr("out"), Addr(addr), ROWS, ROW, ROW, ROW)


FULL = Queue("full", (0, "ls"), (0, "sfp"))
DONE = Queue("done", (0, "sfp"), (0, "ls"))


def pipeline(sfp, ls_after=()):
    """ls loads x at 0 and hands it to the sfp, which runs `sfp` and hands back; ls stores 1024."""
    return program({"ls": [load(0), Push("full"), Pop("done"), store(1024), *ls_after],
                    "sfp": [Pop("full"), *sfp, Push("done")]}, (FULL, DONE))


def test_a_program_whose_units_meet_only_through_queues_passes():
    check_scratchpad(pipeline([Unary("exp", tile(512), tile(0)), Binary("mul", tile(1024), tile(512), tile(0))]))


def test_a_read_no_queue_orders_after_its_write_is_a_race():
    p = program({"ls": [load(0), Push("full")],
                 "sfp": [Unary("exp", tile(1024), tile(0)), Pop("full")]}, (FULL,))
    with pytest.raises(ScratchpadHazard, match=r"program 'hazard_test': core 0 unit sfp instruction 0 \(unary\) "
                                               r"reads scratchpad bytes \[0, 512\), which core 0 unit ls "
                                               r"instruction 0 \(load\) writes, and no queue orders the two"):
        check_scratchpad(p)


def test_a_write_no_queue_orders_after_another_units_write_is_a_race():
    """The ls unit loads the next tile onto the bytes the sfp writes its result to."""
    p = program({"ls": [load(0), Push("full"), load(1024)],
                 "sfp": [Pop("full"), Unary("exp", tile(1024), tile(0))]}, (FULL,))
    with pytest.raises(ScratchpadHazard, match=r"core 0 unit sfp instruction 1 \(unary\) writes scratchpad bytes "
                                               r"\[1024, 1536\), which core 0 unit ls instruction 2 \(load\) writes"):
        check_scratchpad(p)


def test_a_full_queue_orders_the_next_push_after_the_pop_that_made_room():
    """Depth 1: push k waits for pop k - 1. The ls unit reloads tile 0 after its third push,
    which waits for the sfp's second pop, after the sfp read the tile: ordered. After its second
    push (waiting only for the first pop, before the read) it would race the read."""
    q = Queue("q", (0, "ls"), (0, "sfp"), depth=1)
    sfp = [Pop("q"), Unary("exp", tile(1024), tile(0)), Pop("q"), Pop("q"), Pop("q"),
           Unary("exp", tile(1024), tile(0))]
    check_scratchpad(program({"ls": [load(0), Push("q"), Push("q"), Push("q"), load(0), Push("q")], "sfp": sfp},
                             (q,)))
    early = program({"ls": [load(0), Push("q"), Push("q"), load(0), Push("q"), Push("q")], "sfp": sfp}, (q,))
    with pytest.raises(ScratchpadHazard, match=r"ls instruction 3 \(load\) writes scratchpad bytes \[0, 512\), "
                                               r"which core 0 unit sfp instruction 1 \(unary\) reads"):
        check_scratchpad(early)


def test_reading_what_is_left_of_a_value_another_write_cut_into_is_a_clobber():
    # t (rows at 2048..2560) overwritten in its last two rows by u at 2304, then t read whole
    sfp = [Unary("exp", tile(2048), tile(0)), Unary("neg", tile(2304), tile(0)),
           Binary("add", tile(1024), tile(2048), tile(0))]
    with pytest.raises(ScratchpadHazard, match=r"instruction 3 \(binary\) reads scratchpad bytes \[2048, 2304\) "
                                               r"still holding the value core 0 unit sfp instruction 1 \(unary\) "
                                               r"wrote, beside \[2304, 2560\) written since, after core 0 unit "
                                               r"sfp instruction 2 \(unary\) overwrote part of that value"):
        check_scratchpad(pipeline(sfp))


def test_updating_part_of_a_tile_in_place_then_reading_it_whole_passes():
    """Attention keeps a 32-row tile and updates the rows a unit has in place: no clobber."""
    sfp = [Fill(tile(2048), 0.0), Binary("add", tile(2304, rows=2), tile(2304, rows=2), tile(0, rows=2)),
           Binary("add", tile(1024), tile(2048), tile(0))]
    check_scratchpad(pipeline(sfp))


def test_reading_bytes_written_over_a_value_nothing_read_is_a_dead_value():
    """Two constants on one stick: the first is overwritten before anything reads it."""
    sfp = [Fill(tile(2048, rows=1), 2.0), Fill(tile(2048, rows=1), 3.0),
           Binary("mul", tile(1024), tile(0), Tile(Addr(2048), "fp32", ROWS, COLS, ROW, "scalar"))]
    with pytest.raises(ScratchpadHazard, match=r"reads scratchpad bytes \[2048, 2176\) holding the value core 0 "
                                               r"unit sfp instruction 2 \(fill\) wrote over the value core 0 unit "
                                               r"sfp instruction 1 \(fill\) wrote before anything read it"):
        check_scratchpad(pipeline(sfp))


def test_a_value_computed_and_never_used_may_be_overwritten():
    sfp = [Unary("exp", tile(2048), tile(0)), Unary("neg", tile(2048), tile(0)), Unary("abs", tile(1024), tile(0))]
    check_scratchpad(pipeline(sfp))


def test_reading_a_tile_as_other_elements_than_were_written_is_a_hazard():
    """A tile of 4 fp32 rows 256 B apart, read as fp16 rows 128 B apart: another tile's bytes."""
    sfp = [Unary("exp", tile(2048, stride=256), tile(0)),
           Unary("copy", tile(1024, dtype="fp16", cols=64), tile(2048, dtype="fp16", cols=64))]
    with pytest.raises(ScratchpadHazard, match="as fp16 rows 128 B apart, which hold the value core 0 unit sfp "
                                               r"instruction 1 \(unary\) wrote as fp32 rows 256 B apart"):
        check_scratchpad(pipeline(sfp))


def test_a_ring_send_lands_on_the_neighbour_ordered_by_its_queue():
    q = Queue("ring", (0, "ls"), (1, "sfp"))
    send = Send(1, Addr(4096), Addr(0), 512)
    core0 = {"ls": [load(0), send, Push("ring")]}
    ok = program(None, (q,), {0: core0, 1: {"sfp": [Pop("ring"), Unary("exp", tile(1024), tile(4096))]}})
    check_scratchpad(ok)
    racy = program(None, (q,), {0: core0, 1: {"sfp": [Unary("exp", tile(1024), tile(4096)), Pop("ring")]}})
    with pytest.raises(ScratchpadHazard, match=r"core 1 unit sfp instruction 0 \(unary\) reads scratchpad bytes "
                                               r"\[4096, 4608\), which core 0 unit ls instruction 1 \(send\) writes"):
        check_scratchpad(racy)


def test_a_loop_runs_every_iteration():
    """One buffer for two iterations: the ls unit's second load races the sfp's first read."""
    loop = program({"ls": [Loop(2), load(0), Push("full"), EndLoop()],
                    "sfp": [Loop(2), Pop("full"), Unary("exp", tile(1024), tile(0)), EndLoop()]}, (FULL,))
    with pytest.raises(ScratchpadHazard, match=r"at loop indices \([01],\) reads scratchpad bytes \[0, 512\)"):
        check_scratchpad(loop)


def test_every_instruction_that_touches_memory_declares_what_it_does_to_the_scratchpad():
    base = isa.Instruction
    for opcode, cls in isa.REGISTRY.items():
        if cls.touches is not base.touches:
            assert cls.scratch_modes is not base.scratch_modes, opcode


def test_a_deadlock_is_a_placement_error():
    q = Queue("q", (0, "ls"), (0, "sfp"))
    p = Program("stuck", (), (CoreProgram(0, (("sfp", (Pop("q"), Push("r"))), ("ls", (Pop("r"), Push("q"))))),),
                (q, Queue("r", (0, "sfp"), (0, "ls"))))
    with pytest.raises(PlacementError, match="deadlock"):
        check_scratchpad(p)


@pytest.mark.parametrize("build", [
    lambda: vector_add(3000, "fp16", chunk=1024), lambda: cast_round_trip(5000, chunk=1024),
    lambda: row_softmax(64, 256, "fp16", 4), lambda: ring_sum(4096, 4, chunk=1024),
    lambda: tiled_matmul(128, 256, 96, "fp16", 2),
    *[c.build for c in CALIBRATION],
], ids=["vector_add", "cast_round_trip", "row_softmax", "ring_sum", "tiled_matmul",
        *[c.name for c in CALIBRATION]])
def test_the_hand_written_programs_pass(build):
    check_scratchpad(build())
