"""Symbolic sizes (issue 18): one artifact serves a range of sizes.

The program format: size symbols whose values the launch writes into the correction area after
the address slots; a placeholder's outermost dim and a loop's trip count may be a SizeExpr,
clamped to a static maximum, so the validator proves bounds once for every size; every transfer
of a buffer with a symbolic dim is clipped to the bytes it has at the launch's sizes. Then the
compiler: kernels over a dynamic outer dim are planned for a size bucket, and one compile
serves every size in it."""

from __future__ import annotations

import pytest
import torch

from spyre_runtime.launch import run_program
from spyre_runtime.program import isa
from spyre_runtime.program.operands import Addr, DevAddr, SizeExpr, Tile
from spyre_runtime.program.program import CoreProgram, Program, Queue, Symbol
from spyre_runtime.program.validate import ProgramError, validate
from spyre_runtime.program.timing import estimate

ROWS, COLS = 16, 32  # fp32: one stick per row... 32 * 4 = 128 B


def _doubling(hi_rows=ROWS, dim_hi=ROWS, loop=True, name="dbl"):
    """out[r] = 2 * x[r] for r < s0: a loop over row blocks of 4 whose count is ceil(s0 / 4)
    (when `loop`), each block loaded, doubled, stored; x and out have a symbolic dim 0."""
    s0 = SizeExpr("s0", hi=dim_hi)
    blocks = SizeExpr("s0", hi=-(-hi_rows // 4), const=3, div=4) if loop else -(-hi_rows // 4)
    row = COLS * 4
    syms = (Symbol("x", "input", "fp32", (ROWS, COLS), (COLS, 1), dims=(s0, None)),
            Symbol("out", "output", "fp32", (ROWS, COLS), (COLS, 1), dims=(s0, None)))
    tile = Tile(Addr(0), "fp32", 4, COLS, row)
    two = Tile(Addr(4 * row), "fp32", 4, COLS, row, "scalar")
    ls = (isa.Loop(blocks),
          isa.Load(Addr(0), DevAddr("x", 0, (4 * row,)), 4, row, row, row),
          isa.Push("full"), isa.Pop("done"),
          isa.Store(DevAddr("out", 0, (4 * row,)), Addr(0), 4, row, row, row),
          isa.EndLoop())
    sfp = (isa.Fill(two, 2.0), isa.Loop(blocks), isa.Pop("full"),
           isa.Binary("mul", tile, tile, two), isa.Push("done"), isa.EndLoop())
    queues = (Queue("full", (0, "ls"), (0, "sfp"), 1), Queue("done", (0, "sfp"), (0, "ls"), 1))
    return Program(name, syms, (CoreProgram(0, (("ls", ls), ("sfp", sfp))),), queues, sizes=("s0",))


@pytest.mark.parametrize("s", [1, 3, 4, 9, 16])
def test_one_program_serves_every_size_up_to_its_maximum(s):
    p = _doubling()
    validate(p)
    x = torch.randn(s, COLS)
    out = run_program(p, sizes={"s0": s}, x=x)["out"]
    assert out.shape == (s, COLS)
    torch.testing.assert_close(out.cpu(), 2 * x)


def test_a_transfer_never_passes_the_bytes_the_buffer_has():
    # The loop runs its static maximum (4 blocks = 16 rows) but the buffers have 5 rows: the
    # transfers are clipped at row 5, and the bytes after `out` in the same storage survive.
    p = _doubling(loop=False)
    backing = torch.full((ROWS, COLS), 7.0).to("spyre")
    x = torch.randn(5, COLS)
    run_program(p, sizes={"s0": 5}, x=x, out=backing[:5])
    got = backing.cpu()
    torch.testing.assert_close(got[:5], 2 * x)
    assert (got[5:] == 7.0).all()


def test_the_size_words_follow_the_address_slots():
    p = _doubling()
    assert p.correction_bytes == 128 and [e["offset"] for e in p.size_layout] == [32]
    assert Program.from_json(p.to_json()) == p


def test_timing_charges_the_rows_and_trips_of_the_size():
    p = _doubling()
    small, full = estimate(p, sizes={"s0": 4}), estimate(p, sizes={"s0": 16})
    assert small.bytes_read == 4 * COLS * 4 and full.bytes_read == 16 * COLS * 4
    assert small.simulated_ns < full.simulated_ns
    assert estimate(p).simulated_ns == full.simulated_ns  # no sizes: every size at its maximum


def test_the_validator_refuses_a_size_that_could_read_past_a_buffer():
    with pytest.raises(ProgramError, match="past"):
        validate(_doubling(dim_hi=ROWS + 1))
    with pytest.raises(ProgramError, match="outside|touches bytes"):
        validate(_doubling(hi_rows=ROWS + 4))  # a loop maximum of 5 blocks reads 20 rows of 16
    p = _doubling()
    with pytest.raises(ProgramError, match="not one of the program's sizes"):
        validate(Program(p.name, p.symbols, p.cores, p.queues, sizes=("s1",)))


def test_the_validator_refuses_a_symbolic_dim_that_is_not_the_outermost():
    p = _doubling()
    s0 = SizeExpr("s0", hi=COLS)
    bad = (Symbol("x", "input", "fp32", (ROWS, COLS), (COLS, 1), dims=(None, s0)), p.symbols[1])
    with pytest.raises(ProgramError, match="not the outermost"):
        validate(Program(p.name, bad, p.cores, p.queues, sizes=("s0",)))


def test_the_validator_refuses_queue_loops_that_match_at_one_size_only():
    p = _doubling()
    ls = dict(p.cores[0].units)["ls"]
    sfp = list(dict(p.cores[0].units)["sfp"])
    sfp[1] = isa.Loop(SizeExpr("s0", hi=4, const=0, div=4))  # floor instead of ceil: differs below 16
    bad = Program(p.name, p.symbols, (CoreProgram(0, (("ls", ls), ("sfp", tuple(sfp)))),), p.queues, sizes=("s0",))
    with pytest.raises(ProgramError, match="cannot match"):
        validate(bad)
