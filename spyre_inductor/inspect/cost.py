"""A kernel's cost on the card, from the timing model: what `spyre-inspect list` shows per kernel.

The program is timed as the planner times its candidates (timing.estimate): every buffer at a
stick-aligned address, symbolic sizes at their maximum. A launch at other addresses may cost a
little more; its own figures are in torch.spyre.kernel_reports().
"""

from __future__ import annotations

from dataclasses import dataclass

# the kind of work that kept the card busy at least this share of the time names the bound
BOUND_SHARE = 0.6


@dataclass(frozen=True)
class Cost:
    simulated_us: float
    roofline_us: float
    efficiency: float
    bound: str               # memory, pe, sfp, ring, or latency (nothing kept the card busy)
    bytes_over_minimum: float | None
    cores: int
    flops: int
    bytes_moved: int


def bound_of(report) -> str:
    """memory, pe, sfp or ring: the work that kept the card busy >= BOUND_SHARE of the time
    (the busiest core's pe or sfp unit for compute); latency when none did."""
    busy = {"memory": report.memory_ns}
    for (core, unit), ns in report.unit_busy_ns.items():
        if unit in ("pe", "sfp"):
            busy[unit] = max(busy.get(unit, 0.0), ns)
    busy["ring"] = max(report.ring_ns.values(), default=0.0)
    kind, ns = max(busy.items(), key=lambda kv: kv[1])
    return kind if report.simulated_ns and ns >= BOUND_SHARE * report.simulated_ns else "latency"


def cost_of(program, hardware=None) -> Cost:
    from spyre_runtime.program.timing import estimate

    r = estimate(program, hardware)
    return Cost(r.simulated_us, r.roofline_us, r.efficiency, bound_of(r), r.bytes_over_minimum,
                r.cores_used, r.flops, r.bytes_moved)
