"""What a program would take on the card: a discrete-event model of its units.

Two phases. While the functional machine (execute.py) runs a program, every
unit's instructions are recorded in order with what they demand: a fixed
duration for compute and on-chip moves (each instruction's ``cost`` in
isa.py, beside its semantics, computed from the rates below), a transfer of
whole sticks for device loads and stores, and the queue pushes and pops that
order the units. ``finish()`` then replays that record on simulated clocks:

* A unit runs its instructions in order; a pop waits for a token, a push for
  a free slot (queue depth), so units overlap exactly as far as their queues
  allow (a double-buffered loop costs about the larger of load and compute,
  a single-buffered one their sum).
* Device loads and stores are issued to the data-movement engine and run
  asynchronously; the issuing unit goes on. A push from that unit (the
  signal that data has landed or a buffer is free) and any of its later
  non-transfer work wait until its transfers are done, and a transfer waits
  for an earlier one of the same unit whose scratchpad or device bytes it
  overlaps.
* The transfers in flight share device memory as a fluid: the aggregate rate
  is the measured ceiling for that many transfers in flight (a core keeps
  one in flight in the measured reductions: 11% of the bus for 1, 22% for 2,
  43% for 4, 54% for 8-16, 72% for 32), capped by the sustained rate for the
  current read/write mix (150 GB/s pure, 105 GB/s balanced: the turnaround),
  and split evenly among them, no core getting more than the most one core
  was measured to move (67 GB/s). So cores contend for bandwidth, and a plan
  that separates a read phase from a write phase beats one that interleaves
  them.
* Ring sends take bytes / ring bandwidth plus 5 ns per hop; ring links are
  not contended in this model.

Bytes moved are counted by the data-movement engine as it executes: every
stick a row touches, whole, and the bursts (at most 32 contiguous sticks)
it issues; no per-burst overhead is charged (nothing measured to fit one).

Every constant is a field of the one hardware config (hardware.py) with its
source; docs/timing_model.md has the calibration table.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from dataclasses import dataclass, field

from .operands import STICK, sticks


def interpolate(table, x: float) -> float:
    xs = [p[0] for p in table]
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def mix_gbps(hw, reads: float, writes: float) -> float:
    """Sustained device bandwidth for a read/write mix: pure streams vs the balanced turnaround."""
    total = reads + writes
    if total <= 0:
        return hw.device_memory_gbps_sustained
    balance = 2 * min(reads, writes) / total
    return hw.device_memory_gbps_sustained + (hw.device_memory_gbps_mixed - hw.device_memory_gbps_sustained) * balance


def aggregate_gbps(hw, reads: int, writes: int) -> float:
    """Device-memory bandwidth shared by `reads` + `writes` transfers in flight."""
    n = reads + writes
    ceiling = interpolate(hw.bus_ceiling, n) * hw.device_memory_gbps_nominal
    return min(ceiling, mix_gbps(hw, reads, writes))


@dataclass
class Report:
    """One kernel's simulated cost on the card."""

    name: str
    simulated_ns: float
    unit_busy_ns: dict = field(default_factory=dict)  # (core, unit) -> ns busy (ls: with a transfer in flight)
    bytes_read: int = 0                                 # what the program moved (whole sticks)
    bytes_written: int = 0
    minimum_bytes: int | None = None                    # what the kernel needs at least (None: unknown)
    minimum_read_bytes: int | None = None               # the reads' part of it (None: not separated)
    bursts: int = 0                                     # device bursts (<= burst_sticks contiguous sticks)
    ring_bytes: int = 0
    macs: int = 0
    sfp_sticks: int = 0                                 # sticks through the special-function pipeline
    sfp_elements: int = 0
    cores_used: int = 0
    memory_ns: float = 0.0                              # time with any device transfer in flight
    compute_ns: dict = field(default_factory=dict)      # core -> pe + sfp busy (the busier)
    ring_ns: dict = field(default_factory=dict)         # core -> ring sends
    roof_flops_per_ns: float = 0.0                      # the card's sustained matrix rate, FLOPs
    activity: list = field(default_factory=list)        # (core, unit, opcode, start ns, end ns) if recorded
    hardware: object = None

    def copy(self) -> "Report":
        """A report of its own with the same figures (one launch's copy of a cached report)."""
        r = object.__new__(Report)
        r.__dict__.update(self.__dict__)
        r.unit_busy_ns, r.compute_ns, r.ring_ns = dict(self.unit_busy_ns), dict(self.compute_ns), dict(self.ring_ns)
        r.activity = list(self.activity)
        return r

    @property
    def simulated_us(self) -> float:
        return self.simulated_ns / 1e3

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def flops(self) -> int:
        return 2 * self.macs + self.sfp_elements

    @property
    def minimum_write_bytes(self) -> int | None:
        if self.minimum_bytes is None or self.minimum_read_bytes is None:
            return None
        return self.minimum_bytes - self.minimum_read_bytes

    def _compute_ns(self) -> float:
        return self.flops / self.roof_flops_per_ns if self.roof_flops_per_ns else 0.0

    def _stream_ns(self, nbytes: int) -> float:
        return nbytes / self.hardware.device_memory_gbps_sustained

    @property
    def roofline_ns(self) -> float:
        """max(FLOPs at the card's sustained matrix rate, the kernel's minimum bytes at the card's
        pure-stream bandwidth); the bytes the program moved when the minimum is unknown.

        The minimum (every input element read once, every output element written once, from the
        compiler) makes a plan that re-reads an operand show the re-reads as lost efficiency; a
        program without one (hand-written, or an artifact from before the field) is rated against
        the bytes it chose to move (moved_roofline_ns).
        The card, not the cores the plan used: a plan that leaves cores idle shows it as lost
        efficiency. For any mix the best rate is the pure-stream one: a plan can always run its
        reads and its writes as separate phases, and the turnaround only costs plans that
        interleave them, so it shows as lost efficiency too.
        """
        if self.minimum_bytes is None:
            return self.moved_roofline_ns
        return max(self._compute_ns(), self._stream_ns(self.minimum_bytes))

    @property
    def roofline_us(self) -> float:
        return self.roofline_ns / 1e3

    @property
    def efficiency(self) -> float:
        """roofline / simulated: 1 is the card's limit; never above it (the model never beats its caps)."""
        return min(1.0, self.roofline_ns / self.simulated_ns) if self.simulated_ns else 0.0

    @property
    def moved_roofline_ns(self) -> float:
        """The roofline of the bytes the program moved: max(FLOPs at the matrix rate, bytes_moved at
        the pure-stream bandwidth). What roofline_ns is when the minimum is unknown."""
        return max(self._compute_ns(), self._stream_ns(self.bytes_moved))

    @property
    def moved_efficiency(self) -> float:
        """moved roofline / simulated: how close the program runs to the limit of its own traffic."""
        return min(1.0, self.moved_roofline_ns / self.simulated_ns) if self.simulated_ns else 0.0

    @property
    def bytes_over_minimum(self) -> float | None:
        """bytes_moved / minimum_bytes (None: the minimum is unknown)."""
        return _ratio(self.bytes_moved, self.minimum_bytes)

    @property
    def refetch(self) -> float | None:
        """Bytes read from device memory over the minimum read bytes (1.0: every input byte read once,
        to whole sticks); bytes moved over the minimum when only the total is known; None when the
        minimum is unknown."""
        if self.minimum_read_bytes is not None:
            return _ratio(self.bytes_read, self.minimum_read_bytes)
        return self.bytes_over_minimum

    @property
    def bottleneck(self) -> str:
        """memory, compute or ring: the kind of work that kept the card busy >= 60% of the time; else latency."""
        parts = {
            "memory": self.memory_ns,
            "compute": max(self.compute_ns.values(), default=0.0),
            "ring": max(self.ring_ns.values(), default=0.0),
        }
        kind, busiest = max(parts.items(), key=lambda kv: kv[1])
        return kind if self.simulated_ns and busiest >= 0.6 * self.simulated_ns else "latency"

    def utilization(self) -> float:
        """Mean over the card's cores of the busiest unit's busy fraction (idle cores count as 0)."""
        if not self.simulated_ns or self.hardware is None:
            return 0.0
        per_core = collections.defaultdict(float)
        for (core, _), busy in self.unit_busy_ns.items():
            per_core[core] = max(per_core[core], busy)
        return sum(per_core.values()) / (self.hardware.cores * self.simulated_ns)

    def summary(self) -> dict:
        return {"name": self.name, "simulated_us": self.simulated_us, "roofline_us": self.roofline_us,
                "efficiency": self.efficiency, "bytes_moved": self.bytes_moved,
                "minimum_bytes": self.minimum_bytes, "refetch": self.refetch, "flops": self.flops,
                "cores_used": self.cores_used, "utilization": self.utilization(), "bottleneck": self.bottleneck}

    def __repr__(self) -> str:
        # (not the dataclass's: that one prints every unit's busy time and the whole hardware config)
        return (f"Report({self.name!r}, {self.simulated_us:.3g} us simulated, roofline {self.roofline_us:.3g} us, "
                f"efficiency {self.efficiency:.2f}, {self.cores_used} cores, {self.bottleneck})")

    def describe(self) -> str:
        """One line: time, roofline, efficiency, bytes moved against the minimum, bottleneck."""
        against = "the minimum bytes" if self.minimum_bytes is not None else "the bytes moved; minimum unknown"
        traffic = f"{self.bytes_moved:,} bytes moved"
        if self.minimum_bytes is not None:
            traffic += f" vs {self.minimum_bytes:,} minimum ({self.bytes_over_minimum:.2f}x"
            traffic += f", refetch {self.refetch:.2f})" if self.minimum_read_bytes is not None else ")"
        return (f"{self.name}: {self.cores_used} cores, {self.simulated_us:.1f} us simulated, roofline "
                f"{self.roofline_us:.1f} us (against {against}), efficiency {self.efficiency:.2f}, {traffic}, "
                f"bottleneck {self.bottleneck}")

    def trace(self) -> dict:
        """The recorded per-unit activity as a Chrome trace (one process per core, a track per unit)."""
        events = []
        for core, unit, opcode, start, end in self.activity:
            events.append({"name": opcode, "ph": "X", "pid": core, "tid": unit, "ts": start / 1e3,
                           "dur": (end - start) / 1e3})
        return {"traceEvents": events, "displayTimeUnit": "ns"}


def _ratio(num: int, den: int | None) -> float | None:
    if den is None:
        return None
    if den == 0:
        return 1.0 if num == 0 else math.inf
    return num / den


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


# ---- what the instructions demand --------------------------------------------------------

_POP, _PUSH, _WORK, _DMA, _FENCE = range(5)


def _fixed_cost_instructions() -> frozenset:
    from . import isa

    # Their cost is a function of operand shapes (ring sends: of the two cores), not of addresses.
    return frozenset({isa.MatMul, isa.Unary, isa.Binary, isa.Select, isa.Reduce, isa.Fill, isa.Iota, isa.Copy,
                      isa.Send, isa.Transpose, isa.Philox})


_FIXED_COST = _fixed_cost_instructions()
FENCE = object()  # what Fence.cost returns
# Elementwise passes that turn Philox words into the mode's values (timing.philox): a shift and a
# multiply for uniform; Box-Muller's two conversions, log, sqrt, cos and two multiplies for
# normal; a shift, mask and or for the integer modes. An assumption (kind E), like the scan's.
PHILOX_CONVERT = {"uniform": 2, "normal": 8, "bits63": 3}


@dataclass(frozen=True)
class Transfer:
    """One device load or store as the data-movement engine sees it."""

    nbytes: int
    write: bool              # to device memory (a store)
    symbol: str
    dev_span: tuple[int, int]  # [lo, hi) bytes of the symbol
    sp_span: tuple[int, int]   # [lo, hi) bytes of the core's scratchpad

    def conflicts(self, other: "Transfer") -> bool:
        # A store reads the scratchpad and writes the device; a load the reverse.
        sp = _overlap(self.sp_span, other.sp_span) and (not self.write or not other.write)
        dev = self.symbol == other.symbol and _overlap(self.dev_span, other.dev_span) and (self.write or other.write)
        return sp or dev


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class Timing:
    """Attach to a Machine to time its run; ``finish()`` returns the Report.

    `replicas` > 1 times a program of one representative core as if that many
    identical cores ran it in step: their transfers share device memory with
    its own (see estimate()).
    """

    def __init__(self, program, hardware, replicas: int = 1, phases: dict | None = None):
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"replicas must be a positive integer (identical cores in step), got {replicas!r}")
        self.hw = hardware
        self.replicas = replicas
        # Where each device buffer starts within a stick (its bound address mod 128): a view
        # bound at an unaligned address moves the sticks its rows really touch. Unknown (a
        # planner's estimate): 0, every allocation starts on a stick.
        self.phases = phases or {}
        self.program = program
        self.depth = {q.name: q.depth for q in program.queues}
        self.items: dict[tuple[int, str], list] = collections.defaultdict(list)
        self.report = Report(program.name, 0.0, hardware=hardware,
                             minimum_bytes=getattr(program, "minimum_bytes", None),
                             minimum_read_bytes=getattr(program, "minimum_read_bytes", None))
        self.report.cores_used = len(program.cores)
        self.report.roof_flops_per_ns = 2 * hardware.matrix_macs_per_ns_per_core * hardware.cores
        self.record = _recording
        self._unit = None
        self._memo: dict[int, tuple] = {}  # id(instruction) -> (cost, report additions); the program keeps them alive
        # Per buffer with a symbolic dim, its bytes at the launch's sizes (issue 18; set by the
        # Machine): transfers are charged for the rows that exist. A cached report must be keyed
        # by the sizes too.
        self.limits: dict[str, int] = {}

    # ---- recording, called by the machine ------------------------------------------------

    def pop(self, core: int, unit: str, queue: str) -> None:
        self.items[(core, unit)].append((_POP, queue))

    def push(self, core: int, unit: str, queue: str, depth: int) -> None:
        self.items[(core, unit)].append((_PUSH, queue))

    def run(self, core: int, unit: str, ins, idx) -> None:
        self._unit = (core, unit)
        if type(ins) in _FIXED_COST:
            # Compute costs depend on tile shapes, never on loop counters: work one out once per
            # instruction and replay it (with what it adds to the report) on every iteration.
            memo = self._memo.get(id(ins))
            if memo is None:
                r = self.report
                before = (r.macs, r.sfp_sticks, r.sfp_elements, r.ring_bytes)
                cost = ins.cost(self, core, idx)
                memo = self._memo[id(ins)] = (cost, r.macs - before[0], r.sfp_sticks - before[1],
                                              r.sfp_elements - before[2], r.ring_bytes - before[3])
            else:
                cost, macs, sticks, elements, ring = memo
                r = self.report
                r.macs += macs
                r.sfp_sticks += sticks
                r.sfp_elements += elements
                r.ring_bytes += ring
        else:
            cost = ins.cost(self, core, idx)
        if isinstance(cost, Transfer):
            self.items[(core, unit)].append((_DMA, ins.opcode, cost))
        elif cost is FENCE:
            self.items[(core, unit)].append((_FENCE,))
        elif cost:
            kind = "ring" if ins.opcode == "send" else unit
            self.items[(core, unit)].append((_WORK, ins.opcode, cost, kind))

    # ---- rates the instructions' costs use ------------------------------------------------

    def dma(self, symbol: str, offset: int, rows: int, row_bytes: int, stride: int,
            sp_addr: int, sp_stride: int, write: bool) -> Transfer:
        """Device transfer of `rows` rows: every stick a row touches moves, in bursts."""
        # A row's sticks depend on where it starts within a stick, which
        # repeats every `period` rows: count one period, not every row.
        start = offset + self.phases.get(symbol, 0)  # where in a stick the rows start (alignment only)
        if rows == 1 or stride % STICK == 0:  # every row starts at the same place in its stick
            per_row = [-(-((start % STICK) + row_bytes) // STICK)]
        else:
            period = STICK // math.gcd(stride % STICK, STICK)
            per_row = [-(-(((start + r * stride) % STICK) + row_bytes) // STICK) for r in range(min(period, rows))]
        full, rest = divmod(rows, len(per_row)) if per_row else (0, 0)
        touched = full * sum(per_row) + sum(per_row[:rest])
        nbytes = touched * STICK
        if write:
            self.report.bytes_written += nbytes
        else:
            self.report.bytes_read += nbytes
        burst = self.hw.burst_sticks
        if stride == row_bytes and row_bytes % STICK == 0:  # rows back to back: one contiguous run
            self.report.bursts += -(-touched // burst)
        else:
            self.report.bursts += (full * sum(-(-s // burst) for s in per_row)
                                   + sum(-(-s // burst) for s in per_row[:rest]))
        last = offset + (rows - 1) * stride if rows else offset
        dev = (min(offset, last), max(offset, last) + row_bytes)
        sp_last = sp_addr + (rows - 1) * sp_stride if rows else sp_addr
        sp = (min(sp_addr, sp_last), max(sp_addr, sp_last) + sticks(row_bytes))
        return Transfer(nbytes, write, symbol, dev, sp)

    def indirect_dma(self, symbol: str, offset: int, rows: int, row_bytes: int, stride: int, indices,
                     sp_addr: int, sp_stride: int, write: bool, read_back: bool = False) -> Transfer:
        """A gather or scatter (issue 16): every row is its own DMA of the whole sticks it may
        touch. Where a row starts depends on the data, so the charge may not: each row costs the
        most sticks any start its address terms allow (their common stick alignment), and the
        transfer spans every byte the indices' bounds let it reach. `read_back`: an accumulating
        scatter reads each row before writing it."""
        align = math.gcd((offset + self.phases.get(symbol, 0)) % STICK, stride % STICK, STICK, *(term.stride % STICK for term in indices))
        per_row = -(-(row_bytes + (STICK - align if align < STICK else 0)) // STICK) if row_bytes else 0
        nbytes = rows * per_row * STICK
        if write:
            self.report.bytes_written += nbytes
        if not write or read_back:
            self.report.bytes_read += nbytes
        self.report.bursts += rows * -(-per_row // self.hw.burst_sticks) * (2 if read_back else 1)
        lo = offset + sum(term.reach()[0] for term in indices)
        hi = offset + (rows - 1) * stride + sum(term.reach()[1] for term in indices) + row_bytes
        sp_last = sp_addr + (rows - 1) * sp_stride if rows else sp_addr
        sp = (min(sp_addr, sp_last), max(sp_addr, sp_last) + sticks(row_bytes))
        return Transfer(nbytes * (2 if read_back else 1), write, symbol, (lo, hi), sp)

    def pe(self, m: int, n: int, k: int) -> float:
        """Matrix tile on the PE array: passes of 8 rows at the sustained MAC rate times the fill efficiency."""
        self.report.macs += m * n * k
        rows = -(-m // 8) * 8
        return rows * n * k / (self.hw.matrix_macs_per_ns_per_core * interpolate(self.hw.pe_fill, m))

    def sfp(self, rows: int, cols: int, itemsize: int) -> float:
        """Special-function work over a rows x cols tile: one pass per stick of the widest operand."""
        sticks = rows * -(-(cols * itemsize) // STICK)
        self.report.sfp_sticks += sticks
        self.report.sfp_elements += rows * cols
        return sticks / (self.hw.sfp_sticks_per_us_per_core / 1e3)

    def scan(self, rows: int, cols: int, itemsize: int) -> float:
        """A prefix along tile rows. No figure was published for it, so it is costed as the
        sfp would do it with elementwise passes: a Hillis-Steele shift-and-combine across the
        lanes of each stick (log2(lanes) passes) and one more to add each stick's carry-in."""
        lanes = STICK // itemsize
        passes = 1 + lanes.bit_length() - 1
        return passes * self.sfp(rows, cols, itemsize)  # the tile's sticks counted once, timed `passes` times

    def philox(self, rows: int, cols: int, mode: str) -> float:
        """Philox-4x32-10 over a tile (the ``philox`` instruction). No figure was published for it,
        so it is costed as the sfp would do it with elementwise passes over 32-bit lanes: per
        round, two 32x32 multiplies for both words (4 passes), three xors and the key bump
        (4 passes), i.e. 8 passes x 10 rounds, plus the conversion (PHILOX_CONVERT)."""
        passes = 8 * 10 + PHILOX_CONVERT[mode]
        return passes * self.sfp(rows, cols, 4)  # the tile's sticks counted once, timed `passes` times

    def ring(self, src: int, dst: int, nbytes: int) -> float:
        hops = min((dst - src) % self.hw.cores, (src - dst) % self.hw.cores)
        self.report.ring_bytes += nbytes
        bytes_per_ns = self.hw.ring_bytes_per_cycle * self.hw.clock_ghz
        return nbytes / bytes_per_ns + hops * self.hw.ring_hop_ns

    def local(self, nbytes: int) -> float:
        """Scratchpad-to-scratchpad copy on one core: one stick per cycle."""
        return nbytes / (STICK * self.hw.clock_ghz)

    def fence(self):
        return FENCE

    def transpose(self, nbytes: int) -> float:
        return nbytes / self.hw.transpose_gbps_per_core

    # ---- replay -------------------------------------------------------------------------

    def finish(self) -> Report:
        _Replay(self).run()
        return self.report


class _Flow:
    __slots__ = ("transfer", "remaining", "unit", "start", "opcode", "rate")

    def __init__(self, transfer, unit, start, opcode):
        self.transfer, self.unit, self.start, self.opcode = transfer, unit, start, opcode
        self.remaining = float(transfer.nbytes)
        self.rate = 0.0


class _Replay:
    """The discrete-event replay of the recorded per-unit streams."""

    def __init__(self, timing: Timing):
        self.t = timing
        self.hw = timing.hw
        self.report = timing.report
        self.keys = list(timing.items)
        self.pc = {k: 0 for k in self.keys}
        self.busy_until: dict = {}        # unit -> end of its fixed work in progress
        self.outstanding = {k: [] for k in self.keys}
        self.flows: list[_Flow] = []
        self.tokens = {q: 0 for q in timing.depth}
        self.heap: list = []
        self.now = 0.0
        self.busy = collections.defaultdict(float)
        self.kind_busy = collections.defaultdict(float)  # (core, kind) -> ns
        # Units that may be able to move: only a token, a freed slot or a finished
        # transfer or instruction can unblock a unit, so only those wake it.
        ends = {q.name: (q.producer, q.consumer) for q in timing.program.queues}
        self.producer = {q: p for q, (p, _) in ends.items()}
        self.consumer = {q: c for q, (_, c) in ends.items()}
        self.ready = collections.deque(self.keys)
        self.queued = set(self.keys)

    def _wake(self, key) -> None:
        if key not in self.queued and key in self.pc:
            self.queued.add(key)
            self.ready.append(key)

    def _span(self, unit, opcode, start, end) -> None:
        if self.t.record:
            self.report.activity.append((unit[0], unit[1], opcode, start, end))

    def _advance(self, key) -> bool:
        """Run `key`'s instructions at `now` until it blocks; True if it moved."""
        items, moved = self.t.items[key], False
        while key not in self.busy_until and self.pc[key] < len(items):
            item = items[self.pc[key]]
            kind = item[0]
            if kind == _POP:
                if not self.tokens[item[1]]:
                    break
                self.tokens[item[1]] -= 1
                self._wake(self.producer[item[1]])
            elif kind == _PUSH:
                if self.outstanding[key] or self.tokens[item[1]] >= self.t.depth[item[1]]:
                    break
                self.tokens[item[1]] += 1
                self._wake(self.consumer[item[1]])
            elif kind == _FENCE:
                if self.outstanding[key]:
                    break
            elif kind == _WORK:
                if self.outstanding[key]:
                    break
                _, opcode, ns, what = item
                end = self.now + ns
                self.busy_until[key] = end
                heapq.heappush(self.heap, (end, key))
                self.busy[key] += ns
                self.kind_busy[(key[0], what)] += ns
                self._span(key, opcode, self.now, end)
            else:
                _, opcode, transfer = item
                if any(transfer.conflicts(f.transfer) for f in self.outstanding[key]):
                    break
                if transfer.nbytes:
                    flow = _Flow(transfer, key, self.now, opcode)
                    self.flows.append(flow)
                    self.outstanding[key].append(flow)
            self.pc[key] += 1
            moved = True
        return moved

    def _rates(self) -> None:
        n = self.t.replicas  # identical cores in step: each flow stands for n flows
        writes = sum(1 for f in self.flows if f.transfer.write) * n
        reads = len(self.flows) * n - writes
        share = aggregate_gbps(self.hw, reads, writes) / (reads + writes)  # GB/s = bytes per ns
        per_core = collections.Counter(f.unit[0] for f in self.flows)
        cap = self.hw.core_dma_gbps
        for f in self.flows:
            # No core moves more than the most one core was measured to move.
            f.rate = min(share, cap / per_core[f.unit[0]])

    def run(self) -> None:
        while True:
            while self.ready:
                key = self.ready.popleft()
                self.queued.discard(key)
                self._advance(key)
            if not self.flows and not self.heap:
                stuck = [k for k in self.keys if self.pc[k] < len(self.t.items[k])]
                if stuck:
                    raise RuntimeError(f"timing replay of {self.t.program.name!r} stalled at {stuck} "
                                       f"(the functional run did not): a timing-model bug")
                self._close()
                return
            step = math.inf
            if self.flows:
                self._rates()
                step = min(f.remaining / f.rate for f in self.flows)
            if self.heap:
                step = min(step, self.heap[0][0] - self.now)
            step = max(step, 0.0)
            if self.flows:
                self.report.memory_ns += step
                for key in {f.unit for f in self.flows}:
                    self.busy[key] += step
            self.now += step
            self._progress(step)

    def _progress(self, step: float) -> None:
        done = []
        for f in self.flows:
            f.remaining -= f.rate * step
            if f.remaining <= 1e-6 * f.transfer.nbytes:
                done.append(f)
        for f in done:
            self.flows.remove(f)
            self.outstanding[f.unit].remove(f)
            self._span(f.unit, f.opcode, f.start, self.now)
            self._wake(f.unit)
        while self.heap and self.heap[0][0] <= self.now + 1e-9:
            _, key = heapq.heappop(self.heap)
            del self.busy_until[key]
            self._wake(key)

    def _close(self) -> None:
        r = self.report
        r.simulated_ns = self.now
        r.unit_busy_ns = dict(self.busy)
        compute = collections.defaultdict(float)
        for (core, kind), ns in self.kind_busy.items():
            if kind in ("pe", "sfp"):
                compute[core] = max(compute[core], ns)
            elif kind == "ring":
                r.ring_ns[core] = ns
        r.compute_ns = dict(compute)


def estimate(program, hardware=None, replicas: int = 1, *, check: bool = True, sizes=None) -> Report:
    """The simulated cost of `program` without computing its results (for planners choosing between plans).

    replicas=N: `program` holds one core's share of a plan whose N cores all run the same
    program on equal shares (addresses aside); it is timed as N such cores in step, sharing
    device memory, at 1/N of the cost of timing all N. Exact for equal shares; with a ragged
    last share it is the time of the larger shares. Planners use it to compare candidates;
    a launched program is always timed whole.

    sizes: the values of the program's size symbols (issue 18); None times every symbolic
    size at its maximum.

    check=False: a planner's candidate, only timed and never launched, is not validated (the
    plan it stands for is checked by the planner's verifier, and the program kept is validated
    once); a malformed one fails in the replay instead of with validate()'s named error.
    """
    from ..hardware import HARDWARE
    from .execute import Machine

    hw = hardware or HARDWARE
    if replicas > 1 and len(program.cores) != 1:
        raise ValueError(f"estimate: replicas={replicas} times ONE representative core as that many in step; "
                         f"program {program.name!r} has {len(program.cores)} cores")
    timing = Timing(program, hw, replicas)
    # Named errors for a malformed program (unknown queue, unmatched loop, ...) instead of a
    # failure deep in the replay; validated once per program, as for a launch.
    from .validate import validate_once

    if check:
        validate_once(program)
    Machine(program, {}, hw.scratchpad_bytes, timing, functional=False, sizes=sizes).run()
    return timing.finish()
