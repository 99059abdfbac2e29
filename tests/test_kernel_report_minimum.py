"""Kernel reports rated against the kernel's minimum traffic (issue 15).

A program may carry the bytes its kernel needs at least (Program.minimum_bytes,
and of it minimum_read_bytes): part of the checksummed body, absent in
hand-written programs and older artifacts. Reports then carry bytes moved and
the minimum side by side, and their roofline and efficiency are against the
minimum, so a plan that re-reads an operand does not look efficient; reports
of programs without a minimum are what they always were.
"""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.direct import run_program
from spyre_runtime.program import (
    Addr, Binary, CoreProgram, DevAddr, Load, Pop, Program, ProgramFormatError, Push, Queue, Store, Symbol, Tile,
)
from spyre_runtime.program.timing import Report, estimate

N = 4096  # fp32 elements: 16 KiB, whole sticks
NB = N * 4
ROW = NB


def doubling(reads: int = 1, writes: int = 1, **minimum) -> Program:
    """y = 2 * x on one core; x loaded `reads` times and y stored `writes` times (the same bytes)."""
    tile_in = Tile(Addr(0), "fp32", 1, N, ROW)
    tile_out = Tile(Addr(ROW), "fp32", 1, N, ROW)
    ls = (*(Load(Addr(0), DevAddr("x"), 1, NB, 0, ROW) for _ in range(reads)), Push("in"), Pop("out"),
          *(Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW) for _ in range(writes)))
    sfp = (Pop("in"), Binary("add", tile_out, tile_in, tile_in), Push("out"))
    return Program(
        f"doubling_r{reads}_w{writes}",
        symbols=(Symbol("x", "input", "fp32", (N,), (1,)), Symbol("y", "output", "fp32", (N,), (1,))),
        queues=(Queue("in", (0, "ls"), (0, "sfp")), Queue("out", (0, "sfp"), (0, "ls"))),
        cores=(CoreProgram(0, (("ls", ls), ("sfp", sfp))),),
        **minimum,
    )


MINIMUM = dict(minimum_bytes=2 * NB, minimum_read_bytes=NB)  # x read once, y written once


def pure_stream_ns(nbytes: int) -> float:
    return nbytes / HARDWARE.device_memory_gbps_sustained


# ---- the program format ------------------------------------------------------------------------


def test_the_minimum_round_trips_and_is_part_of_the_checksum():
    p = doubling(**MINIMUM)
    q = Program.from_json(p.to_json())
    assert q == p and (q.minimum_bytes, q.minimum_read_bytes, q.minimum_write_bytes) == (2 * NB, NB, NB)
    assert p.checksum() != doubling().checksum()
    assert p.checksum() != doubling(minimum_bytes=2 * NB).checksum()
    doc = json.loads(p.to_json())
    assert doc["body"]["minimum_bytes"] == 2 * NB and doc["body"]["minimum_read_bytes"] == NB
    doc["body"]["minimum_bytes"] = NB + 1  # a smaller minimum would flatter the report
    with pytest.raises(ProgramFormatError, match="checksum mismatch"):
        Program.from_json(json.dumps(doc))


def test_a_program_without_a_minimum_keeps_its_body_and_checksum():
    p = doubling()
    assert p.minimum_bytes is None and p.minimum_read_bytes is None and p.minimum_write_bytes is None
    doc = json.loads(p.to_json())
    assert set(doc["body"]) == {"queues", "cores"}  # what every artifact before the field had
    body_text = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
    assert p.checksum() == hashlib.sha256(body_text.encode()).hexdigest()
    assert Program.from_json(p.to_json()).minimum_bytes is None
    # an artifact with only the total: refetch falls back to bytes moved over it
    q = Program.from_json(doubling(minimum_bytes=2 * NB).to_json())
    assert (q.minimum_bytes, q.minimum_read_bytes) == (2 * NB, None)


def test_the_listing_shows_the_minimum():
    assert f"minimum traffic: {2 * NB} B ({NB} B read, {NB} B written)" in doubling(**MINIMUM).listing()
    assert "minimum traffic" not in doubling().listing()


@pytest.mark.parametrize("bad", [
    dict(minimum_bytes=-1), dict(minimum_bytes=1.5), dict(minimum_bytes=True), dict(minimum_bytes="8"),
    dict(minimum_read_bytes=8), dict(minimum_bytes=8, minimum_read_bytes=9),
])
def test_a_malformed_minimum_is_refused(bad):
    with pytest.raises(ValueError, match="minimum"):
        doubling(**bad)
    doc = json.loads(doubling().to_json())
    doc["body"].update(bad)
    body_text = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
    doc["header"]["checksum"] = hashlib.sha256(body_text.encode()).hexdigest()
    with pytest.raises(ProgramFormatError, match="minimum"):
        Program.from_json(json.dumps(doc))


def test_a_numpy_integer_minimum_is_stored_as_an_int():
    p = doubling(minimum_bytes=np.int64(2 * NB), minimum_read_bytes=np.int64(NB))
    assert type(p.minimum_bytes) is int and Program.from_json(p.to_json()) == p


def test_the_minimum_can_be_set_on_a_built_program():
    built = doubling()
    p = dataclasses.replace(built, **MINIMUM)
    assert p.minimum_bytes == 2 * NB and p.checksum() == doubling(**MINIMUM).checksum()
    assert built.minimum_bytes is None and built.checksum() == doubling().checksum()


# ---- reports -----------------------------------------------------------------------------------


def test_a_program_with_a_known_minimum_reports_efficiency_against_it():
    r = estimate(doubling(**MINIMUM))
    assert (r.bytes_read, r.bytes_written, r.bytes_moved) == (NB, NB, 2 * NB)
    assert (r.minimum_bytes, r.minimum_read_bytes, r.minimum_write_bytes) == (2 * NB, NB, NB)
    compute = r.flops / r.roof_flops_per_ns
    assert r.roofline_ns == pytest.approx(max(compute, pure_stream_ns(2 * NB)), rel=1e-12)
    assert r.efficiency == pytest.approx(r.roofline_ns / r.simulated_ns, rel=1e-12)
    assert r.refetch == 1.0 and r.bytes_over_minimum == 1.0
    # moving exactly the minimum: both rooflines agree
    assert r.efficiency == pytest.approx(r.moved_efficiency, rel=1e-12)


def test_a_program_moving_twice_its_minimum_reports_at_most_half_the_efficiency():
    r = estimate(doubling(reads=2, writes=2, **MINIMUM))
    assert r.bytes_moved == 2 * r.minimum_bytes
    assert r.efficiency <= 0.5 * r.moved_efficiency * (1 + 1e-9)
    assert r.efficiency == pytest.approx(0.5 * r.moved_efficiency, rel=0.01)  # memory-bound: half
    assert r.refetch == 2.0 and r.bytes_over_minimum == 2.0
    # the case: an operand re-read (x twice), the output written once
    reread = estimate(doubling(reads=2, **MINIMUM))
    assert reread.refetch == 2.0 and reread.bytes_over_minimum == 1.5
    assert reread.efficiency < reread.moved_efficiency
    # with only the total known, refetch is bytes moved over it
    total_only = estimate(doubling(reads=2, minimum_bytes=2 * NB))
    assert total_only.refetch == 1.5 and total_only.minimum_write_bytes is None


def test_reports_of_programs_without_a_minimum_are_unchanged():
    for reads, writes in ((1, 1), (2, 2)):
        plain = estimate(doubling(reads, writes))
        rated = estimate(doubling(reads, writes, **MINIMUM))
        assert plain.minimum_bytes is None and plain.refetch is None and plain.bytes_over_minimum is None
        # the roofline they always had: FLOPs at the matrix rate, bytes moved at the pure-stream rate
        compute = plain.flops / plain.roof_flops_per_ns
        assert plain.roofline_ns == max(compute, pure_stream_ns(plain.bytes_moved))
        assert plain.roofline_ns == plain.moved_roofline_ns and plain.efficiency == plain.moved_efficiency
        # the minimum changes the rating only, never the simulation
        assert (plain.simulated_ns, plain.bytes_read, plain.bytes_written, plain.flops) == \
            (rated.simulated_ns, rated.bytes_read, rated.bytes_written, rated.flops)
        assert plain.efficiency == pytest.approx(rated.moved_efficiency, rel=1e-12)
        assert plain.summary()["minimum_bytes"] is None and "minimum unknown" in plain.describe()


def test_the_roofline_against_the_minimum_is_the_larger_of_compute_and_bytes():
    rate = 2 * HARDWARE.matrix_macs_per_ns_per_core * HARDWARE.cores
    base = dict(simulated_ns=1e6, bytes_read=300_000_000, bytes_written=100_000_000, roof_flops_per_ns=rate,
                hardware=HARDWARE, minimum_bytes=4_000_000, minimum_read_bytes=3_000_000)
    memory = Report("memory", macs=1000, **base)
    assert memory.roofline_ns == pytest.approx(pure_stream_ns(4_000_000))
    assert memory.moved_roofline_ns == pytest.approx(pure_stream_ns(400_000_000))
    assert memory.refetch == 100.0 and memory.bytes_over_minimum == 100.0
    compute = Report("compute", macs=10**12, **base)  # FLOPs dominate: the minimum does not matter
    assert compute.roofline_ns == compute.moved_roofline_ns == pytest.approx(2 * 10**12 / rate)
    # a kernel that needs to read nothing (a fill): refetch 1 if it reads nothing, else unbounded
    fill = Report("fill", simulated_ns=10.0, bytes_written=128, hardware=HARDWARE,
                  minimum_bytes=100, minimum_read_bytes=0)
    assert fill.refetch == 1.0
    assert dataclasses.replace(fill, bytes_read=128).refetch == float("inf")


def test_launched_programs_report_their_minimum_through_torch_spyre():
    x = torch.randn(N)
    torch.spyre.reset_kernel_reports()
    run_program(doubling(reads=2, **MINIMUM), x=x)
    y = run_program(doubling(), x=x)["y"]
    torch.spyre.synchronize()
    assert torch.equal(y.cpu(), 2 * x)
    rated, plain = torch.spyre.kernel_reports()
    assert (rated.minimum_bytes, rated.bytes_moved, rated.refetch) == (2 * NB, 3 * NB, 2.0)
    assert rated.efficiency < rated.moved_efficiency
    assert plain.minimum_bytes is None and plain.efficiency == plain.moved_efficiency
    s = rated.summary()
    assert (s["bytes_moved"], s["minimum_bytes"], s["refetch"]) == (3 * NB, 2 * NB, 2.0)
    line = rated.describe()
    assert f"{3 * NB:,} bytes moved vs {2 * NB:,} minimum (1.50x, refetch 2.00)" in line
    assert "against the minimum bytes" in line
