"""A kernel's cost on the card, from the timing model: what `spyre-inspect list` shows per kernel.

The program is timed as the planner times its candidates (timing.estimate): every buffer at a
stick-aligned address, symbolic sizes at their maximum. A launch at other addresses may cost a
little more; its own figures are in torch.spyre.kernel_reports().
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """The report's bottleneck (memory, compute, ring or latency: Report.bottleneck), with compute
    named by the unit that kept a core busiest: pe (the matrix arrays) or sfp."""
    kind = report.bottleneck
    if kind != "compute":
        return kind
    busiest = {}
    for (_, unit), ns in report.unit_busy_ns.items():
        if unit in ("pe", "sfp"):
            busiest[unit] = max(busiest.get(unit, 0.0), ns)
    return max(busiest, key=busiest.get) if busiest else kind


def cost_of(program, hardware=None) -> Cost:
    from spyre_runtime.program.timing import estimate

    r = estimate(program, hardware)
    return Cost(r.simulated_us, r.roofline_us, r.efficiency, bound_of(r), r.bytes_over_minimum,
                r.cores_used, r.flops, r.bytes_moved)
