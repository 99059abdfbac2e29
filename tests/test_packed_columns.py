"""Packed columns (issue 31): a tile of one element per row whose rows are adjacent (row stride =
the element's size), as attention keeps its per-row statistics: a column of 1024 fp32 values is
4 KiB and 32 sticks for the sfp, not 128 KiB and 1024 sticks. Read as a column broadcast along a
tile's rows, it scales each row by its own value."""

import dataclasses

import pytest
import torch

from spyre_runtime.direct import run_program
from spyre_runtime.program import Program, validate
from spyre_runtime.program.emitter import Unit, assemble
from spyre_runtime.program.hazards import check_scratchpad
from spyre_runtime.program.isa import Binary, Fence, Load, Pop, Push, Reduce, Store
from spyre_runtime.program.operands import STICK, Addr, Tile
from spyre_runtime.program.program import Queue, Symbol
from spyre_runtime.program.validate import PlacementError

ROWS, COLS = 64, 32   # fp32: a row of x is one stick


def scaled_by_row_max() -> Program:
    """out = x * (2 * max(x, -1))[:, None]: the row maxima into a packed column, doubled there, then
    broadcast back."""
    ls, sfp = Unit(), Unit()
    x, col = 0, ROWS * STICK
    tile = Tile(Addr(x), "fp32", ROWS, COLS, STICK)
    column = Tile(Addr(col), "fp32", ROWS, 1, 4)
    queues = [Queue("c0.in", (0, "ls"), (0, "sfp"), 1), Queue("c0.out", (0, "sfp"), (0, "ls"), 1)]
    ls.emit(Load(ls.sp(x), ls.dev("x", 0), ROWS, COLS * 4, COLS * 4, STICK), Fence(), Push("c0.in"))
    sfp.emit(Pop("c0.in"), Reduce("max", column, tile), Binary("add", column, column, column),
             Binary("mul", tile, tile, Tile(Addr(col), "fp32", ROWS, COLS, 4, "cols")), Push("c0.out"))
    ls.emit(Pop("c0.out"), Store(ls.dev("out", 0), ls.sp(x), ROWS, COLS * 4, COLS * 4, STICK))
    return assemble("packed_column", [Symbol("x", "input", "fp32", (ROWS, COLS), (COLS, 1)),
                                      Symbol("out", "output", "fp32", (ROWS, COLS), (COLS, 1))],
                    queues, {0: {"ls": ls.instrs, "sfp": sfp.instrs}}, check=False)


def test_a_packed_column_holds_a_value_per_row():
    program = scaled_by_row_max()
    validate(program)
    check_scratchpad(program)   # (its sticks counted as the column's bytes: no hazard)
    assert Program.from_json(program.to_json()) == program
    x = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))
    torch.spyre.reset_kernel_reports()
    out = run_program(program, x=x)["out"].cpu()
    torch.testing.assert_close(out, x * (2 * x.amax(-1, keepdim=True)), rtol=0, atol=0)
    # the sfp: the reduce and the product pass over x's 64 sticks each; the column's own add over
    # its 256 bytes, 2 sticks (not one per row)
    assert torch.spyre.kernel_reports()[-1].sfp_sticks == 2 * ROWS + 2


def test_only_a_one_element_row_may_be_packed():
    program = scaled_by_row_max()
    sfp = dict(program.cores[0].units)["sfp"]
    wide = Tile(Addr(ROWS * STICK), "fp32", ROWS, 2, 8)   # two elements a row, 8 bytes apart: not a column
    core = dataclasses.replace(program.cores[0], units=tuple(
        (u, (sfp[0], dataclasses.replace(sfp[1], dst=wide)) + sfp[2:] if u == "sfp" else ins)
        for u, ins in program.cores[0].units))
    with pytest.raises(PlacementError, match="row stride 8"):
        validate(dataclasses.replace(program, cores=(core,)))
