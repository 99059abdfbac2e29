"""What a program would take on the card: per-unit timelines as it executes.

Work in progress (issue 6): the structure is here, the constants are the
hardware config's and are NOT yet calibrated against SPYRE_MEASUREMENTS.md.

Each (core, unit) has a clock. An instruction starts when its unit is free
and, for a pop, when the token it takes was pushed; a push waits for a free
slot (the pop that freed it). So units overlap exactly as far as their
queues allow: a double-buffered loop costs about the larger of load and
compute, a single-buffered one about their sum. Each instruction's duration
is its ``cost`` (isa.py, next to its semantics), computed from the rates
below; the data-movement engine counts the bytes it moves in whole sticks
touched, as it executes.

Device-memory bandwidth is shared: each core doing device transfers gets
the aggregate the active core count reaches (the measured ceilings) divided
among them, capped by the pure-read/write or mixed sustained figure.
"""

from __future__ import annotations

import bisect
import math
import collections
from dataclasses import dataclass, field

from .operands import STICK

# Fraction of the nominal bus that reductions reach on 1, 2, 4, 8 and 16
# cores (SPYRE_MEASUREMENTS, M); beyond 16 cores the sustained figures cap it.
_BUS_FRACTION = ((1, 0.11), (2, 0.22), (4, 0.43), (8, 0.54), (16, 0.54))
# PE fill efficiency by rows per core (F): 0.50 at 2 rows, 0.72 at 8, full from 64.
_FILL = ((1, 0.5), (2, 0.5), (8, 0.72), (64, 1.0))


def _interpolate(table, x: float) -> float:
    xs = [p[0] for p in table]
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class Report:
    """One kernel's simulated cost (first draft of issue 6's report)."""

    name: str
    simulated_ns: float
    unit_busy_ns: dict = field(default_factory=dict)  # (core, unit) -> ns
    bytes_read: int = 0
    bytes_written: int = 0
    ring_bytes: int = 0
    macs: int = 0
    sfp_elements: int = 0
    cores_used: int = 0

    @property
    def simulated_us(self) -> float:
        return self.simulated_ns / 1e3

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def flops(self) -> int:
        return 2 * self.macs + self.sfp_elements

    # Time each core spent per kind of work, for the bottleneck.
    memory_ns: dict = field(default_factory=dict)   # core -> device transfers
    ring_ns: dict = field(default_factory=dict)     # core -> ring sends
    roof_matrix_ns_per_mac: float = 0.0              # 1 / (sustained MAC rate of the cores used)
    roof_read_gbps: float = 0.0
    roof_mixed_gbps: float = 0.0
    activity: list = field(default_factory=list)    # (core, unit, opcode, start ns, end ns) if recorded

    @property
    def roofline_ns(self) -> float:
        """max(matrix FLOPs at the sustained matrix rate, bytes at the sustained bandwidth for this mix)."""
        compute = self.macs * self.roof_matrix_ns_per_mac
        total = self.bytes_moved
        if total == 0:
            return compute
        # Pure reads or writes sustain roof_read_gbps, a balanced mix roof_mixed_gbps.
        balance = 2 * min(self.bytes_read, self.bytes_written) / total
        gbps = self.roof_read_gbps + (self.roof_mixed_gbps - self.roof_read_gbps) * balance
        return max(compute, total / gbps)

    @property
    def roofline_us(self) -> float:
        return self.roofline_ns / 1e3

    @property
    def efficiency(self) -> float:
        return self.roofline_ns / self.simulated_ns if self.simulated_ns else 0.0

    @property
    def bottleneck(self) -> str:
        """memory, compute, ring, or latency (time mostly spent waiting on dependencies)."""
        compute = collections.defaultdict(float)
        for (core, unit), busy in self.unit_busy_ns.items():
            if unit in ("pe", "sfp"):
                compute[core] = max(compute[core], busy)
        parts = {
            "memory": max(self.memory_ns.values(), default=0.0),
            "compute": max(compute.values(), default=0.0),
            "ring": max(self.ring_ns.values(), default=0.0),
        }
        kind, busiest = max(parts.items(), key=lambda kv: kv[1])
        return kind if busiest >= 0.6 * self.simulated_ns else "latency"

    def trace(self) -> dict:
        """The recorded per-unit activity as a Chrome trace (one process per core, a track per unit)."""
        events = []
        for core, unit, opcode, start, end in self.activity:
            events.append({"name": opcode, "ph": "X", "pid": core, "tid": unit, "ts": start / 1e3,
                           "dur": (end - start) / 1e3})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def utilization(self) -> float:
        """Mean busy fraction of the cores' busiest unit."""
        if not self.simulated_ns or not self.cores_used:
            return 0.0
        per_core = collections.defaultdict(float)
        for (core, _), busy in self.unit_busy_ns.items():
            per_core[core] = max(per_core[core], busy)
        return sum(per_core.values()) / (len(per_core) * self.simulated_ns)


_recording = False


class record_activity:
    """``with record_activity():`` keeps every instruction's simulated span in the reports."""

    def __enter__(self):
        global _recording
        self._previous, _recording = _recording, True
        return self

    def __exit__(self, *exc):
        global _recording
        _recording = self._previous


class Timing:
    def __init__(self, program, hardware):
        self.hw = hardware
        self.program = program
        self.free: dict[tuple[int, str], float] = collections.defaultdict(float)
        self.busy: dict[tuple[int, str], float] = collections.defaultdict(float)
        self.push_times = {q.name: collections.deque() for q in program.queues}
        self.pop_times = {q.name: [] for q in program.queues}
        self.pushed = {q.name: 0 for q in program.queues}
        self.report = Report(program.name, 0.0)
        self._core = 0
        loads, stores, cores = False, False, set()
        for cp in program.cores:
            for _, instrs in cp.units:
                for ins in instrs:
                    if ins.opcode == "load":
                        loads = True
                        cores.add(cp.core)
                    elif ins.opcode == "store":
                        stores = True
                        cores.add(cp.core)
        self.report.cores_used = len(program.cores)
        self.report.roof_matrix_ns_per_mac = 1.0 / (hardware.matrix_macs_per_ns_per_core * max(len(program.cores), 1))
        self.report.roof_read_gbps = hardware.device_memory_gbps_sustained
        self.report.roof_mixed_gbps = hardware.device_memory_gbps_mixed
        self.record = _recording
        active = max(len(cores), 1)
        nominal = hardware.device_memory_gbps_nominal
        cap = hardware.device_memory_gbps_mixed if (loads and stores) else hardware.device_memory_gbps_sustained
        aggregate = min(_interpolate(_BUS_FRACTION, active) * nominal if active <= 16 else cap, cap)
        self.core_gbps = aggregate / active  # bytes per ns for each active core

    # ---- token causality ----------------------------------------------------------

    def pop(self, core: int, unit: str, queue: str) -> None:
        key = (core, unit)
        start = max(self.free[key], self.push_times[queue].popleft())
        self.free[key] = start
        self.pop_times[queue].append(start)

    def push(self, core: int, unit: str, queue: str, depth: int) -> None:
        key = (core, unit)
        n = self.pushed[queue]
        start = self.free[key]
        if n >= depth:
            start = max(start, self.pop_times[queue][n - depth])
        self.pushed[queue] = n + 1
        self.push_times[queue].append(start)
        self.free[key] = start

    def run(self, core: int, unit: str, ins, idx) -> None:
        self._core = core
        cost = ins.cost(self, core, idx)
        if cost:
            key = (core, unit)
            start = self.free[key]
            self.free[key] = start + cost
            self.busy[key] += cost
            if self.record:
                self.report.activity.append((core, unit, ins.opcode, start, start + cost))

    def finish(self) -> Report:
        self.report.simulated_ns = max(self.free.values(), default=0.0)
        self.report.unit_busy_ns = dict(self.busy)
        return self.report

    # ---- rates the instructions' costs use ---------------------------------------------

    def dma(self, offset: int, rows: int, row_bytes: int, stride: int, write: bool) -> float:
        """Device transfer of `rows` rows: every stick a row touches moves."""
        # A row's sticks depend on where it starts within a stick, which
        # repeats every `period` rows: count one period, not every row.
        period = STICK // math.gcd(stride % STICK, STICK) if stride % STICK else 1
        per_row = [-(-(((offset + r * stride) % STICK) + row_bytes) // STICK) for r in range(min(period, rows))]
        full, rest = divmod(rows, len(per_row)) if per_row else (0, 0)
        sticks = full * sum(per_row) + sum(per_row[:rest])
        nbytes = sticks * STICK
        if write:
            self.report.bytes_written += nbytes
        else:
            self.report.bytes_read += nbytes
        ns = nbytes / self.core_gbps
        self.report.memory_ns[self._core] = self.report.memory_ns.get(self._core, 0.0) + ns
        return ns

    def pe(self, m: int, n: int, k: int) -> float:
        macs = m * n * k
        self.report.macs += macs
        passes_rate = self.hw.matrix_macs_per_ns_per_core * _interpolate(_FILL, m)
        return macs / passes_rate

    def sfp(self, elements: int) -> float:
        self.report.sfp_elements += elements
        return elements / (self.hw.sfp_results_per_us_per_core / 1e3)

    def ring(self, src: int, dst: int, nbytes: int) -> float:
        hops = min((dst - src) % self.hw.cores, (src - dst) % self.hw.cores)
        self.report.ring_bytes += nbytes
        bytes_per_ns = self.hw.ring_bytes_per_cycle * self.hw.clock_ghz
        ns = nbytes / bytes_per_ns + hops * self.hw.ring_hop_ns
        self.report.ring_ns[src] = self.report.ring_ns.get(src, 0.0) + ns
        return ns

    def local(self, nbytes: int) -> float:
        return nbytes / (self.hw.ring_bytes_per_cycle * self.hw.clock_ghz)
