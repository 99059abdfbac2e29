"""Loops counted on chip (issue 31): a loop count read from the scratchpad when the loop starts.

How a program skips work its data rules out (attention's key chunks past every row's position):
the count is computed on chip and every unit that takes part in the skipped work reads it. These
hand-written programs pin the semantics (0 skips the body, the value is clamped to the static
maximum), that the program runs on the general interpreter and is timed as its data makes it
run, and the validator's rule: the queue operations inside loops reading one count word must
match by themselves, or skipping them would unbalance the queues.
"""

import dataclasses

import pytest
import torch

from spyre_runtime.direct import run_program
from spyre_runtime.program import Program, validate
from spyre_runtime.program.emitter import Unit, assemble
from spyre_runtime.program.isa import Fence, Fill, Load, Pop, Push, Store
from spyre_runtime.program.operands import STICK, Addr, ScratchCount, Tile
from spyre_runtime.program.program import Queue, Symbol
from spyre_runtime.program.validate import PlacementError


def counted() -> Program:
    """out[0:32] = 1.0 when the count n[0] (clamped to [0, 1]) is 1, else the zeros it starts as;
    the ls loads the count, the sfp fills and hands a token to the ls under the loop, the ls takes
    it under a loop reading the same count word."""
    ls, sfp = Unit(), Unit()
    word, tile = 0, 4 * STICK
    count = ScratchCount(Tile(Addr(word), "int32", 1, 1, STICK), 1)
    queues = [Queue("c0.ready", (0, "ls"), (0, "sfp"), 2), Queue("c0.done", (0, "sfp"), (0, "ls"), 2)]
    ls.emit(Load(ls.sp(word), ls.dev("n", 0), 1, 4, 0, STICK), Fence(), Push("c0.ready"))
    sfp.emit(Pop("c0.ready"), Fill(sfp.tile(tile, "fp32", 1, 32, STICK), 0.0))
    with sfp.loop(count):
        sfp.emit(Fill(sfp.tile(tile, "fp32", 1, 32, STICK), 1.0), Push("c0.done"))
    sfp.emit(Push("c0.done"))
    ls.emit(Pop("c0.done"))
    with ls.loop(count):
        ls.emit(Pop("c0.done"))
    ls.emit(Store(ls.dev("out", 0), ls.sp(tile), 1, 128, 0, STICK))
    return assemble("counted_on_chip", [Symbol("n", "input", "int32", (1,), (1,)),
                                        Symbol("out", "output", "fp32", (32,), (1,))],
                    queues, {0: {"ls": ls.instrs, "sfp": sfp.instrs}}, check=False)


@pytest.mark.parametrize("n,ran", [(0, False), (1, True), (7, True), (-3, False)])
def test_a_count_read_from_the_scratchpad_runs_the_body_or_skips_it(n, ran):
    program = counted()
    validate(program)
    assert Program.from_json(program.to_json()) == program
    torch.spyre.reset_kernel_reports()
    out = run_program(program, n=torch.tensor([n], dtype=torch.int32))["out"].cpu()
    assert torch.equal(out, torch.full((32,), 1.0 if ran else 0.0))


def test_skipped_work_is_not_timed():
    program = counted()
    times = []
    for n in (0, 1):
        torch.spyre.reset_kernel_reports()
        run_program(program, n=torch.tensor([n], dtype=torch.int32))
        times.append(torch.spyre.kernel_reports()[-1].sfp_sticks)
    assert times[0] < times[1]


def test_queue_operations_under_one_count_must_match_by_themselves():
    program = counted()
    ls = dict(program.cores[0].units)["ls"]
    # the ls's pop inside the loop moved out of it: with the count 0 the sfp's push is skipped
    # and the ls would wait forever
    i = next(k for k, ins in enumerate(ls) if type(ins).__name__ == "Loop")
    moved = ls[:i] + (ls[i + 1],) + (ls[i],) + ls[i + 2:]
    core = dataclasses.replace(program.cores[0], units=tuple((u, moved if u == "ls" else instrs)
                                                             for u, instrs in program.cores[0].units))
    broken = dataclasses.replace(program, cores=(core,))
    with pytest.raises(PlacementError, match="loops counted at core 0"):
        validate(broken)
