"""The timing model's structure (issue 6, in progress): units overlap exactly as far
as their queues allow, bytes are counted in whole sticks, ring time grows with hops.

The constants are the hardware config's, not yet calibrated: these tests pin
relations between simulated times, not the times themselves.
"""

import pytest
import torch

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program import (
    Addr, CoreProgram, DevAddr, EndLoop, Load, Loop, Machine, Pop, Program, Push, Queue, Symbol, Tile, Unary,
    run_program,
)
from spyre_runtime.program.handwritten import ring_sum, vector_add
from spyre_runtime.program.run import kernel_reports, reset_kernel_reports
from spyre_runtime.program.timing import Timing

TILE = 32 * 1024  # bytes per tile: 8192 fp32
ELEMS = TILE // 4
STEPS = 8


def streaming(buffers: int) -> Program:
    """ls loads tile i, sfp exponentiates it; `buffers` scratchpad buffers (1 or 2)."""
    per = STEPS // buffers
    ls, sfp = [Loop(per)], [Loop(per)]
    for b in range(buffers):
        ls += [Pop(f"free{b}"), Load(Addr(b * TILE), DevAddr("x", b * TILE, (buffers * TILE,)), 1, TILE, 0, TILE),
               Push(f"full{b}")]
        tile = Tile(Addr(b * TILE), "fp32", 1, ELEMS, TILE)
        out = Tile(Addr(4 * TILE), "fp32", 1, ELEMS, TILE)
        sfp += [Pop(f"full{b}"), Unary("exp", out, tile), Push(f"free{b}")]
    ls.append(EndLoop())
    sfp.append(EndLoop())
    # The consumer frees each buffer once up front; the producer takes those back at the end.
    sfp = [Push(f"free{b}") for b in range(buffers)] + sfp
    ls += [Pop(f"free{b}") for b in range(buffers)]
    queues = tuple(q for b in range(buffers) for q in (Queue(f"full{b}", (0, "ls"), (0, "sfp"), 1),
                                                       Queue(f"free{b}", (0, "sfp"), (0, "ls"), 2)))
    return Program(f"stream{buffers}", symbols=(Symbol("x", "input", "fp32", (STEPS * ELEMS,), (1,)),),
                   queues=queues, cores=(CoreProgram(0, (("ls", tuple(ls)), ("sfp", tuple(sfp)))),))


def simulate(program: Program, nbytes: int):
    timing = Timing(program, HARDWARE)
    Machine(program, {"x": torch.zeros(nbytes, dtype=torch.uint8)}, HARDWARE.scratchpad_bytes, timing).run()
    return timing.finish()


def test_double_buffering_costs_the_larger_of_load_and_compute_single_buffering_their_sum():
    single = simulate(streaming(1), STEPS * TILE)
    double = simulate(streaming(2), STEPS * TILE)
    load, work = single.unit_busy_ns[(0, "ls")], single.unit_busy_ns[(0, "sfp")]
    assert double.unit_busy_ns == pytest.approx(single.unit_busy_ns)  # same work either way
    assert single.simulated_ns == pytest.approx(load + work, rel=1e-9)
    # One step of the smaller unit cannot be hidden: max + min/STEPS.
    assert double.simulated_ns == pytest.approx(max(load, work) + min(load, work) / STEPS, rel=1e-9)


def test_bytes_moved_are_whole_sticks_touched():
    reset_kernel_reports()
    run_program(vector_add(1000, "fp32"), x=torch.randn(1000), y=torch.randn(1000))
    (report,) = kernel_reports()
    assert report.bytes_read == 2 * 4096  # 4000 bytes per vector touch 32 sticks
    assert report.bytes_written == 4096


def test_the_compute_on_the_timeline_lasts_as_long_as_the_report_says():
    from spyre_inductor.device import queues
    from spyre_runtime.queue import Timeline

    reset_kernel_reports()
    with Timeline([queues.queue(0)]) as tl:
        run_program(vector_add(4096, "fp16"), x=torch.randn(4096).half(), y=torch.randn(4096).half())
    (report,) = kernel_reports()
    computes = [t for _, t in tl.tickets if t.pipeline == "compute"]
    assert len(computes) == 1 and report.simulated_ns > 0
    assert computes[0].sim_end - computes[0].sim_start == pytest.approx(report.simulated_ns)


def test_a_ring_reduction_takes_longer_with_more_hops():
    times = []
    for cores in (2, 4, 8):
        reset_kernel_reports()
        run_program(ring_sum(32 * cores, cores), x=torch.ones(32 * cores))
        times.append(kernel_reports()[0].simulated_ns)
    assert times[0] < times[1] < times[2]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 4096), st.integers(1, 600), st.integers(1, 2048), st.integers(0, 5000))
def test_dma_counts_every_stick_each_row_touches(offset, rows, row_bytes, stride):
    timing = Timing(vector_add(32, "fp32"), HARDWARE)
    timing.dma(offset, rows, row_bytes, stride, write=False)
    expected = sum(-(-(((offset + r * stride) % 128) + row_bytes) // 128) for r in range(rows)) * 128
    assert timing.report.bytes_read == expected
