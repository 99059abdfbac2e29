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


def test_reports_through_torch_spyre_with_roofline_and_bottleneck():
    from spyre_runtime.program.handwritten import row_softmax, tiled_matmul

    torch.spyre.reset_kernel_reports()
    run_program(vector_add(1 << 16, "fp16"), x=torch.randn(1 << 16).half(), y=torch.randn(1 << 16).half())
    run_program(tiled_matmul(64, 128, 128, "fp16", cores=2), a=torch.randn(64, 128).half(), b=torch.randn(128, 128).half())
    run_program(row_softmax(64, 256, "fp32", cores=2), x=torch.randn(64, 256))
    reports = torch.spyre.kernel_reports()
    assert [r.name for r in reports] == ["vector_add_fp16_65536", "tiled_matmul_fp16_64x128x128_on_2",
                                         "row_softmax_fp32_64x256"]
    for r in reports:
        assert r.simulated_us > 0 and r.roofline_us > 0
        assert 0 < r.efficiency <= 1  # the roofline uses rates no plan can beat
        assert r.bottleneck in ("memory", "compute", "ring", "latency")
        assert r.bytes_moved == r.bytes_read + r.bytes_written > 0
    assert reports[1].flops >= 2 * 64 * 128 * 128 and reports[1].cores_used == 2
    torch.spyre.reset_kernel_reports()
    assert torch.spyre.kernel_reports() == []


def test_a_pure_copy_is_memory_bound():
    from spyre_runtime.program import Store

    n = 1 << 16
    ls = (Loop(8), Load(Addr(0), DevAddr("x", 0, (n // 8 * 4,)), 1, n // 8 * 4, 0, n // 8 * 4),
          Store(DevAddr("y", 0, (n // 8 * 4,)), Addr(0), 1, n // 8 * 4, 0, n // 8 * 4), EndLoop())
    p = Program("copy", symbols=(Symbol("x", "input", "fp32", (n,), (1,)), Symbol("y", "output", "fp32", (n,), (1,))),
                cores=(CoreProgram(0, (("ls", ls),)),))
    torch.spyre.reset_kernel_reports()
    x = torch.randn(n)
    assert torch.equal(run_program(p, x=x)["y"].cpu(), x)
    (r,) = torch.spyre.kernel_reports()
    assert r.bottleneck == "memory" and r.bytes_read == r.bytes_written == n * 4


def test_per_unit_activity_can_be_recorded_for_a_compute():
    from spyre_runtime.program.timing import record_activity

    torch.spyre.reset_kernel_reports()
    with record_activity():
        run_program(vector_add(4096, "fp32"), x=torch.randn(4096), y=torch.randn(4096))
    (r,) = torch.spyre.kernel_reports()
    units = {(core, unit) for core, unit, *_ in r.activity}
    assert units == {(0, "ls"), (0, "sfp")}
    assert max(end for *_, end in r.activity) == pytest.approx(r.simulated_ns)
    trace = r.trace()["traceEvents"]
    assert {e["tid"] for e in trace} == {"ls", "sfp"} and all(e["ph"] == "X" for e in trace)
