"""The queue layer (spyre_runtime.queue) on its own: no torch, fake device memory.

Device memory is a handful of ctypes buffers, one per region handle; host
memory is more ctypes buffers. Every test builds its own DeviceQueue (its
pipeline workers are daemon threads started on first use) and is bounded in
time: slow operations either sleep a fixed short time or block on a gate that
the test opens (and that gives up by itself after 2 s, so nothing can hang).
"""

from __future__ import annotations

import ctypes
import json
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from spyre_runtime.device import SimulatedDataMovement, TransferCosts
from spyre_runtime.queue import (
    Barrier,
    Compute,
    DataMovement,
    DeviceAddress,
    DeviceQueue,
    Executor,
    Footprint,
    HostAddress,
    HostCallback,
    Range,
    Signal,
    SoftSignal,
    StagingPool,
    StreamError,
    Timeline,
    Transfer,
    TransferKind,
    Wait,
    WaitTimeout,
    in_host_operation,
)

H2D, D2H, D2D = TransferKind.H2D, TransferKind.D2H, TransferKind.D2D
COSTS = TransferCosts(host_link_gbps=25.0, device_memory_gbps=105.0)
MiB = 1 << 20
GATE_LIMIT = 2.0  # the longest any gate holds a pipeline if a test forgets to open it


# ---- fakes -------------------------------------------------------------------


class FakeDevice:
    """Device memory: one ctypes buffer per region handle (1, 2, ...)."""

    def __init__(self, sizes: dict[int, int] | None = None, initial=None):
        sizes = sizes or {1: 64, 2: 64}
        self.buffers = {}
        for region, n in sizes.items():
            init = initial(region, n) if initial else bytes(n)
            self.buffers[region] = ctypes.create_string_buffer(bytes(init), n)

    def resolve(self, region: int) -> int:
        return ctypes.addressof(self.buffers[region])

    def address(self, rng: Range) -> int:
        return self.resolve(rng.region) + rng.offset

    def read(self, rng: Range) -> bytes:
        return ctypes.string_at(self.address(rng), rng.length)

    def write(self, rng: Range, data: bytes) -> None:
        assert len(data) == rng.length
        ctypes.memmove(self.address(rng), data, rng.length)

    def region(self, region: int) -> bytes:
        return self.buffers[region].raw

    def queue(self, **kwargs) -> DeviceQueue:
        return DeviceQueue(device=0, data_movement=SimulatedDataMovement(COSTS, self.resolve), **kwargs)


def host_buffer(data: bytes | int):
    """A host buffer (ctypes) and its HostAddress."""
    buf = ctypes.create_string_buffer(data, data if isinstance(data, int) else len(data))
    return buf, HostAddress(ctypes.addressof(buf))


def dev(rng: Range) -> DeviceAddress:
    return DeviceAddress(rng.region, rng.offset)


def affine(data: bytes) -> bytes:
    return bytes((b * 3 + 1) % 256 for b in data)


class Affine(Executor):
    """A compute executor: dst[i] = (src[i] * 3 + 1) % 256 over two device ranges.

    `log` (a list, appended to from the worker thread; list.append is atomic)
    records `tag` when it runs.
    """

    def __init__(self, device: FakeDevice, log: list, tag, pause: float = 0.0):
        self.device, self.log, self.tag, self.pause = device, log, tag, pause

    def run(self, bindings):
        src, dst = bindings
        data = self.device.read(src)
        if self.pause:
            time.sleep(self.pause)
        self.device.write(dst, affine(data))
        self.log.append(self.tag)


class TimedAffine(Affine):
    """The same, with a simulated cost on the card."""

    def cost_ns(self, bindings):
        return 2_000.0


class Sleep(Executor):
    """A compute that holds the compute pipeline for `seconds` (time.sleep releases the GIL)."""

    def __init__(self, seconds: float, ns: float = 1_000_000, log: list | None = None, tag=None):
        self.seconds, self.ns, self.log, self.tag = seconds, ns, log, tag

    def run(self, bindings):
        time.sleep(self.seconds)
        if self.log is not None:
            self.log.append(self.tag)

    def cost_ns(self, bindings):
        return self.ns


class Gate(Executor):
    """A compute that holds its pipeline until the test opens it (or GATE_LIMIT passes).

    `then` runs after the gate opens, still inside the operation.
    """

    def __init__(self, ns: float = 1_000_000, then=None):
        self.ns, self.then = ns, then
        self.started = threading.Event()
        self._open = threading.Event()

    def run(self, bindings):
        self.started.set()
        if not self._open.wait(GATE_LIMIT):
            raise TimeoutError("the test never opened this gate")
        if self.then is not None:
            self.then()

    def cost_ns(self, bindings):
        return self.ns

    def open(self):
        self._open.set()


def hold_compute(q: DeviceQueue, stream: int, footprint: Footprint = Footprint(), then=None, name="gated compute"):
    """Enqueue a Gate compute and wait until it is running; returns (gate, ticket)."""
    gate = Gate(then=then)
    ticket = q.enqueue(stream, Compute(gate, None, footprint, name=name))
    assert gate.started.wait(GATE_LIMIT), "the compute pipeline never started the gated compute"
    return gate, ticket


# ---- 1. property: concurrent execution == serial execution in enqueue order ----------

RANGES = [Range(region, offset, 16) for region in (1, 2) for offset in (0, 8, 16, 32)]
REGION_BYTES = 48

_range = st.sampled_from(RANGES)
_op = st.one_of(
    st.tuples(st.just("h2d"), _range, st.binary(min_size=16, max_size=16)),
    st.tuples(st.just("d2h"), _range),
    st.tuples(st.just("d2d"), _range, _range),
    st.tuples(st.just("compute"), _range, _range, st.booleans(), st.booleans()),  # (timed, pause)
    st.tuples(st.just("fill"), _range, st.integers(0, 255)),
)


def _initial(region: int, n: int) -> bytes:
    return bytes((region * 37 + i) % 256 for i in range(n))


@settings(max_examples=40, deadline=None)
@given(n_streams=st.integers(1, 4), program=st.lists(st.tuples(st.integers(0, 3), _op), min_size=1, max_size=30))
def test_concurrent_execution_matches_serial_reference(n_streams, program):
    """Whatever runs concurrently, the result is that of running the ops one by one
    in enqueue order: conflicting ops on different streams are ordered by derived
    edges (in enqueue order), non-conflicting ones commute. Each stream also runs
    its own ops strictly in enqueue order, and conflicting ops never overlap in
    host time."""
    device = FakeDevice({1: REGION_BYTES, 2: REGION_BYTES}, initial=_initial)
    q = device.queue()
    ref = {r: bytearray(_initial(r, REGION_BYTES)) for r in (1, 2)}
    log: list = []  # (stream, index) appended by computes and callbacks as they run
    keep = []  # host buffers must outlive the queue's use of them
    d2h_checks = []  # (host buffer, expected bytes)
    tickets = []

    def span(rng):
        return slice(rng.offset, rng.offset + rng.length)

    def fill(rng, value, tag):
        def fn():
            device.write(rng, bytes([value]) * rng.length)
            log.append(tag)
        return fn

    for index, (s, op) in enumerate(program):
        stream = 100 + s % n_streams  # arbitrary ids
        tag = (stream, index)
        kind = op[0]
        if kind == "h2d":
            _, dst, data = op
            buf, addr = host_buffer(data)
            keep.append(buf)
            operation = Transfer(H2D, addr, dev(dst), 16)
            ref[dst.region][span(dst)] = data
        elif kind == "d2h":
            _, src = op
            buf, addr = host_buffer(16)  # its own buffer: host memory is in no footprint
            keep.append(buf)
            operation = Transfer(D2H, dev(src), addr, 16)
            d2h_checks.append((buf, bytes(ref[src.region][span(src)])))
        elif kind == "d2d":
            _, src, dst = op
            operation = Transfer(D2D, dev(src), dev(dst), 16)
            ref[dst.region][span(dst)] = bytes(ref[src.region][span(src)])
        elif kind == "compute":
            _, src, dst, timed, pause = op
            exe = (TimedAffine if timed else Affine)(device, log, tag, pause=0.001 if pause else 0.0)
            operation = Compute(exe, (src, dst), Footprint(reads=(src,), writes=(dst,)), name=f"affine {index}")
            ref[dst.region][span(dst)] = affine(bytes(ref[src.region][span(src)]))
        else:
            _, dst, value = op
            operation = HostCallback(fill(dst, value, tag), Footprint(writes=(dst,)), name=f"fill {index}")
            ref[dst.region][span(dst)] = bytes([value]) * 16
        tickets.append((stream, operation, q.enqueue(stream, operation)))

    q.synchronize()

    # (a) the serial reference
    for r in (1, 2):
        assert device.region(r) == bytes(ref[r]), f"region {r}"
    for buf, expected in d2h_checks:
        assert buf.raw == expected

    # (b) per-stream execution order is enqueue order
    for stream in {s for s, _, _ in tickets}:
        mine = [t for s, _, t in tickets if s == stream]
        for before, after in zip(mine, mine[1:]):
            assert after.host_start >= before.host_end, (before, after)
            assert after.sim_start >= before.sim_end, (before, after)
        ran = [i for (s, i) in log if s == stream]
        assert ran == sorted(ran)

    # conflicting ops on different streams ran in enqueue order, one after the other
    for i, (si, oi, ti) in enumerate(tickets):
        for sj, oj, tj in tickets[i + 1:]:
            if si != sj and oi.footprint.conflicts(oj.footprint):
                assert tj.host_start >= ti.host_end, (ti, tj)
    assert all(t.done and not t.skipped and t.error is None for _, _, t in tickets)


# ---- 2. pipelines: a transfer overlaps a compute of another stream -----------------------


def test_transfer_on_another_stream_overlaps_a_running_compute():
    """h2d has its own pipeline and worker: a transfer on stream 2 with a footprint
    disjoint from a slow compute on stream 1 finishes while the compute still runs,
    and on the simulated timeline it lies inside the compute's interval."""
    device = FakeDevice({1: 64, 2: MiB})
    q = device.queue()
    src, addr = host_buffer(b"\x5a" * MiB)
    compute = q.enqueue(1, Compute(Sleep(0.3, ns=1_000_000), None, Footprint(writes=(Range(1, 0, 64),)), name="slow"))
    xfer = q.enqueue(2, Transfer(H2D, addr, DeviceAddress(2, 0), MiB))
    assert xfer.edges == []  # nothing orders it after the compute
    q.wait(xfer)
    assert not compute.done
    q.wait(compute)
    assert compute.sim_start == 0.0 and compute.sim_end == 1_000_000
    assert xfer.sim_end - xfer.sim_start == pytest.approx(MiB / 25.0)  # bytes / (GB/s) = ns
    assert compute.sim_start <= xfer.sim_start <= xfer.sim_end <= compute.sim_end
    assert device.region(2) == b"\x5a" * MiB


def test_transfer_on_the_same_stream_waits_for_the_compute():
    """The same two operations on ONE stream run in stream order, in host time and
    in simulated time."""
    device = FakeDevice({1: 64, 2: MiB})
    q = device.queue()
    src, addr = host_buffer(b"\x5a" * MiB)
    compute = q.enqueue(1, Compute(Sleep(0.3, ns=1_000_000), None, Footprint(writes=(Range(1, 0, 64),)), name="slow"))
    xfer = q.enqueue(1, Transfer(H2D, addr, DeviceAddress(2, 0), MiB))
    assert not xfer.done
    assert xfer.edges == [(compute, "stream")]
    q.wait(xfer)
    assert compute.done
    assert xfer.host_start >= compute.host_end
    assert xfer.sim_start >= compute.sim_end == 1_000_000


# ---- 3. one compute pipeline, shared by all streams --------------------------------------


def test_computes_of_different_streams_never_overlap():
    """There is one compute pipeline: computes on different streams with disjoint
    footprints still run one at a time, in host time and in simulated time."""
    q = FakeDevice().queue()
    a = q.enqueue(1, Compute(Sleep(0.05, ns=1_000_000), None, Footprint(writes=(Range(1, 0, 8),))))
    b = q.enqueue(2, Compute(Sleep(0.05, ns=500_000), None, Footprint(writes=(Range(2, 0, 8),))))
    assert b.edges == []  # nothing orders them but the pipeline
    q.synchronize()
    first, second = sorted((a, b), key=lambda t: t.sim_start)
    assert second.sim_start >= first.sim_end
    first, second = sorted((a, b), key=lambda t: t.host_start)
    assert second.host_start >= first.host_end


def test_ready_computes_go_by_stream_priority_then_enqueue_order():
    """Among computes that are ready at the same time, the lower priority number
    runs first; equal priorities go in enqueue order."""
    priority = {1: 0, 2: 5, 3: -1, 4: 5}
    q = FakeDevice().queue(stream_priority=lambda sid: priority[sid])
    order: list = []
    gate, _ = hold_compute(q, 1)  # every later compute is ready while this one runs
    q.enqueue(2, Compute(Sleep(0, log=order, tag="low, enqueued first"), None))
    q.enqueue(3, Compute(Sleep(0, log=order, tag="high"), None))
    q.enqueue(4, Compute(Sleep(0, log=order, tag="low, enqueued second"), None))
    gate.open()
    q.synchronize()
    assert order == ["high", "low, enqueued first", "low, enqueued second"]


# ---- 4. signals ------------------------------------------------------------------


def test_wait_holds_its_stream_until_a_later_signal_fires():
    """A Wait may be enqueued before its Signal (on another stream): it holds its
    stream until the Signal fires, and completes after it."""
    completed: list = []
    q = FakeDevice().queue(wait_timeout=5.0, on_completed=lambda sid, seq: completed.append(seq))
    ran: list = []
    sig = SoftSignal()
    wait = q.enqueue(1, Wait(sig))
    after = q.enqueue(1, HostCallback(lambda: ran.append("after wait")))
    gate, slow = hold_compute(q, 2, then=lambda: ran.append("before signal"))
    signal = q.enqueue(2, Signal(sig))
    assert sig.ticket is signal
    assert (signal, "event") in wait.edges
    assert not (wait.done or after.done or sig.fired)
    gate.open()
    q.wait(after)
    assert ran == ["before signal", "after wait"]
    assert sig.fired and sig.sim_time_ns == slow.sim_end
    assert completed.index(signal.seq) < completed.index(wait.seq) < completed.index(after.seq)
    assert wait.sim_start >= signal.sim_end == slow.sim_end
    assert after.host_start >= slow.host_end


def test_wait_on_an_already_fired_signal_does_not_hold():
    """A Wait on a signal that already fired completes at once, but still starts
    no earlier than the signal in simulated time."""
    q = FakeDevice().queue()
    sig = SoftSignal()
    q.enqueue(1, Compute(Sleep(0, ns=1_000_000), None))
    signal = q.enqueue(1, Signal(sig))
    q.wait(signal)
    with Timeline([q]):  # (a finished ticket keeps its edges only while a Timeline records)
        wait = q.enqueue(2, Wait(sig))
        assert wait.done
        assert wait.edges == [(signal, "event")]
    assert wait.sim_start == signal.sim_end == 1_000_000


def test_a_signal_is_single_use():
    """A SoftSignal is fired by exactly one Signal operation: a second one is
    refused (on any stream), and the refusal leaves the queue untouched."""
    q = FakeDevice().queue()
    sig = SoftSignal()
    first = q.enqueue(1, Signal(sig))
    with pytest.raises(ValueError, match="single-use"):
        q.enqueue(2, Signal(sig))
    with pytest.raises(ValueError, match="single-use"):
        q.enqueue(1, Signal(sig))
    assert sig.ticket is first
    q.synchronize()
    assert q.query_stream(1) and q.query_stream(2)


def test_wait_for_a_signal_that_never_comes_times_out():
    """A Wait whose Signal is never enqueued fails after wait_timeout with
    WaitTimeout; the stream's error names the wait, later ops of that stream are
    skipped, and nothing hangs."""
    q = FakeDevice().queue(wait_timeout=0.2)
    sig = SoftSignal()
    ran: list = []
    t0 = time.monotonic()
    wait = q.enqueue(3, Wait(sig))
    after = q.enqueue(3, HostCallback(lambda: ran.append("after")))
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(3)
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 0.2 + 2.0
    message = str(info.value)
    assert wait.name in message and f"wait {sig.ident}" in message
    assert "WaitTimeout" in message
    assert isinstance(info.value.__cause__, WaitTimeout)
    assert isinstance(wait.error, WaitTimeout)
    assert after.skipped and ran == []
    assert sig.waiters == [] and not sig.fired


# ---- 5. derived (footprint) edges ----------------------------------------------------

R = Range(1, 0, 16)
ADJACENT = Range(1, 16, 16)  # touches R, does not overlap it
ORIGINAL = bytes(range(64))


def _derived_case(case, device, seen):
    """(A's footprint, what A does once released, B's op, a probe op on B's pipeline
    with a disjoint footprint, check after everything ran)."""
    new, new_addr = host_buffer(b"\xbb" * 16)
    probe_host, probe_addr = host_buffer(16)
    out, out_addr = host_buffer(16)
    keep = (new, probe_host, out)
    if case == "RAW":  # A writes R, B reads it
        fp_a = Footprint(writes=(R,))
        then = lambda: device.write(R, b"\xaa" * 16)  # noqa: E731
        op_b = Transfer(D2H, dev(R), out_addr, 16)
        probe = Transfer(D2H, dev(ADJACENT), probe_addr, 16)

        def check():
            assert out.raw == b"\xaa" * 16  # B read what A wrote
    elif case == "WAR":  # A reads R, B writes it
        fp_a = Footprint(reads=(R,))
        then = lambda: seen.append(device.read(R))  # noqa: E731
        op_b = Transfer(H2D, new_addr, dev(R), 16)
        probe = Transfer(H2D, new_addr, dev(ADJACENT), 16)

        def check():
            assert seen == [ORIGINAL[:16]]  # A read the data from before B's write
            assert device.read(R) == b"\xbb" * 16
    else:  # WAW: both write R
        fp_a = Footprint(writes=(R,))
        then = lambda: device.write(R, b"\xaa" * 16)  # noqa: E731
        op_b = HostCallback(lambda: device.write(R, b"\xee" * 16), Footprint(writes=(R,)), name="fill R")
        probe = HostCallback(lambda: None, Footprint(writes=(ADJACENT,)), name="probe")

        def check():
            assert device.read(R) == b"\xee" * 16  # B's write is the last one
    return fp_a, then, op_b, probe, check, keep


@pytest.mark.parametrize("case", ["RAW", "WAR", "WAW"])
def test_conflicting_op_on_another_stream_waits(case):
    """An op on stream B whose footprint conflicts with an unfinished op on stream A
    (read-after-write, write-after-read, write-after-write) waits for it: a derived
    edge. The probe, enqueued after B's op on the same pipeline with a disjoint
    footprint, finishes first, which shows B's op was not even ready."""
    device = FakeDevice({1: 64, 2: 64}, initial=lambda r, n: ORIGINAL[:n])
    q = device.queue()
    seen: list = []
    fp_a, then, op_b, probe_op, check, _keep = _derived_case(case, device, seen)
    gate, a = hold_compute(q, 1, fp_a, then=then, name="slow A")
    try:
        b = q.enqueue(2, op_b)
        probe = q.enqueue(3, probe_op)
        assert (a, "derived") in b.edges
        q.wait(probe)
        assert not b.done and not a.done
    finally:
        gate.open()
    q.synchronize()
    assert b.host_start >= a.host_end
    assert b.sim_start >= a.sim_end
    check()


def test_disjoint_op_on_another_stream_does_not_wait():
    """Footprints that only touch (R and the range right after it) do not conflict:
    B's op runs while A's slow op on R still runs."""
    device = FakeDevice()
    q = device.queue()
    src, addr = host_buffer(b"\xcc" * 16)
    with Timeline([q]):  # keeps finished tickets' edges for inspection
        gate, a = hold_compute(q, 1, Footprint(reads=(R,), writes=(R,)))
        try:
            b = q.enqueue(2, Transfer(H2D, addr, dev(ADJACENT), 16))
            q.wait(b)
            assert not a.done
            assert b.edges == []
            assert device.read(ADJACENT) == b"\xcc" * 16
        finally:
            gate.open()


@pytest.mark.parametrize("edge", ["derived", "barrier"])
def test_ordering_edges_to_finished_ops_still_order_simulated_time(edge):
    """An op that must come after a compute (it reads what the compute wrote, or it
    follows a Barrier) should not start before that compute ends on the simulated
    timeline, even when the compute has already finished in host time when the op
    is enqueued; were it still running, the edge would put the op after it."""
    device = FakeDevice()
    q = device.queue()
    compute = q.enqueue(1, Compute(Sleep(0, ns=1_000_000), None, Footprint(writes=(R,)), name="writer"))
    deadline = time.monotonic() + GATE_LIMIT
    while not q.query_stream(1):  # the host polls, as torch.spyre.Stream.query() does
        assert time.monotonic() < deadline
        time.sleep(0.001)
    out, out_addr = host_buffer(16)
    if edge == "barrier":
        q.enqueue(2, Barrier())
    reader = q.enqueue(2, Transfer(D2H, dev(R), out_addr, 16))
    q.synchronize()
    assert reader.sim_start >= compute.sim_end


def test_finished_writer_is_followed_in_simulated_time_however_many_ops_came_after():
    """Like the test above, with 20 more (unrelated) computes on the writer's
    stream between the write and the read."""
    device = FakeDevice()
    q = device.queue()
    writer = q.enqueue(1, Compute(Sleep(0, ns=1_000_000), None, Footprint(writes=(R,)), name="writer"))
    for i in range(20):
        q.enqueue(1, Compute(Sleep(0, ns=10), None, Footprint(writes=(Range(2, i, 1),)), name=f"other {i}"))
    deadline = time.monotonic() + GATE_LIMIT
    while not q.query_stream(1):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    out, out_addr = host_buffer(16)
    reader = q.enqueue(2, Transfer(D2H, dev(R), out_addr, 16))
    q.synchronize()
    assert reader.sim_start >= writer.sim_end


# ---- 6. barrier --------------------------------------------------------------------


def test_barrier_waits_for_every_earlier_op_on_every_stream():
    """A Barrier on stream B holds B until everything enqueued before it, on any
    stream, is done; ops enqueued after it on other streams are not held."""
    device = FakeDevice()
    q = device.queue()
    ran: list = []
    gate, a = hold_compute(q, 1, Footprint(writes=(Range(1, 0, 8),)))
    try:
        src, addr = host_buffer(b"\x01" * 8)
        q.enqueue(3, Transfer(H2D, addr, DeviceAddress(2, 0), 8))
        barrier = q.enqueue(2, Barrier())
        after = q.enqueue(2, HostCallback(lambda: ran.append("after barrier")))
        later_elsewhere = q.enqueue(4, Transfer(H2D, addr, DeviceAddress(2, 32), 8))
        q.wait(later_elsewhere)
        assert not barrier.done and not after.done and ran == []
        assert (a, "barrier") in barrier.edges
    finally:
        gate.open()
    q.wait(after)
    assert ran == ["after barrier"]
    assert after.host_start >= a.host_end
    assert barrier.sim_start >= a.sim_end and after.sim_start >= a.sim_end


# ---- 7. errors ---------------------------------------------------------------------


class Exploding(Executor):
    """A compute that fails (once the test lets it)."""

    def __init__(self):
        self.go = threading.Event()

    def run(self, bindings):
        self.go.wait(GATE_LIMIT)
        raise RuntimeError("kaboom: bad tile 42")


def test_a_failed_op_poisons_only_its_stream_until_cleared():
    """A failing op makes its stream's error sticky: the stream's later ops are
    skipped, query/synchronize of the stream and of the device raise a StreamError
    naming the op and the original error, until clear_error(); other streams keep
    working."""
    device = FakeDevice()
    q = device.queue()
    ran: list = []
    boom = Exploding()
    failed = q.enqueue(1, Compute(boom, None, name="exploding matmul"))
    src, addr = host_buffer(b"\xff" * 16)
    skipped = [
        q.enqueue(1, HostCallback(lambda: ran.append("A after failure"))),
        q.enqueue(1, Transfer(H2D, addr, DeviceAddress(1, 0), 16)),
        q.enqueue(1, Compute(Sleep(0, log=ran, tag="A compute after failure"), None)),
    ]
    fine = q.enqueue(2, HostCallback(lambda: ran.append("B") or "B result"))
    boom.go.set()

    with pytest.raises(StreamError) as info:
        q.synchronize_stream(1)
    message = str(info.value)
    assert "exploding matmul" in message and "kaboom: bad tile 42" in message and "RuntimeError" in message
    assert f"#{failed.seq}" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(failed.error, RuntimeError)
    with pytest.raises(RuntimeError, match="kaboom"):
        q.wait(failed)  # waiting on the failed op itself gives the original error

    assert all(t.done and t.skipped for t in skipped)
    assert device.read(Range(1, 0, 16)) == bytes(16)  # the skipped transfer did not happen
    with pytest.raises(StreamError):
        q.wait(skipped[0])  # waiting on a skipped op gives the stream's error

    # stream B is unaffected
    assert q.wait(fine) == "B result"
    q.synchronize_stream(2)
    assert q.query_stream(2) is True

    # sticky: raises again, from every query, and poisons new ops on the stream
    with pytest.raises(StreamError, match="exploding matmul"):
        q.query_stream(1)
    with pytest.raises(StreamError, match="kaboom"):
        q.synchronize_stream(1)
    with pytest.raises(StreamError, match="exploding matmul"):
        q.synchronize()
    late = q.enqueue(1, HostCallback(lambda: ran.append("enqueued while poisoned")))
    assert late.skipped

    q.clear_error(1)
    assert q.query_stream(1) is True
    after = q.enqueue(1, HostCallback(lambda: ran.append("A after clear") or 7))
    assert q.wait(after) == 7
    q.synchronize_stream(1)
    q.synchronize()
    assert "A after failure" not in ran and "A compute after failure" not in ran
    assert "enqueued while poisoned" not in ran and "A after clear" in ran


def test_waiting_on_a_skipped_op_after_clear_error_still_reports_why_it_was_skipped():
    """A skipped op stays skipped: waiting on it later, even after the stream's
    error was cleared, should raise the StreamError that caused the skip."""
    q = FakeDevice().queue()
    boom = Exploding()
    boom.go.set()
    q.enqueue(1, Compute(boom, None, name="exploding matmul"))
    skipped = q.enqueue(1, HostCallback(lambda: None))
    with pytest.raises(StreamError):
        q.synchronize_stream(1)
    assert skipped.skipped
    q.clear_error(1)
    with pytest.raises(StreamError, match="exploding matmul"):
        q.wait(skipped)


def test_a_skipped_op_still_passes_simulated_time_along():
    """Stream 1 writes R (1 ms simulated), then fails, so its next write to R is
    skipped. A write of R on stream 2, enqueued while all of that is pending, waits
    in host time for the first write, and should also start after it in simulated
    time. (A write: a read of R would now fail, as the next test pins.)"""
    device = FakeDevice()
    q = device.queue()
    src, addr = host_buffer(b"\x11" * 16)
    other, other_addr = host_buffer(b"\x22" * 16)

    def fail():
        raise RuntimeError("callback failed")

    gate, write = hold_compute(q, 1, Footprint(writes=(R,)), name="write R")
    try:
        q.enqueue(1, HostCallback(fail, name="failing callback"))
        skipped = q.enqueue(1, Transfer(H2D, addr, dev(R), 16))
        reader = q.enqueue(2, Transfer(H2D, other_addr, dev(R), 16))
    finally:
        gate.open()
    with pytest.raises(StreamError, match="failing callback"):
        q.synchronize()
    assert skipped.skipped and reader.host_start >= write.host_end
    assert reader.sim_start >= write.sim_end


# ---- what a failed operation was to write is never read as if it had run (issue 29) ----------

S = Range(2, 0, 16)


def _failed_writer(q: DeviceQueue, stream: int, writes=(R,), name="exploding matmul"):
    """A compute on `stream` that writes `writes`, failing once the test lets it; returns its gate."""
    boom = Exploding()
    q.enqueue(stream, Compute(boom, None, Footprint(writes=writes), name=name))
    return boom


def _root_named(info) -> None:
    message = str(info.value)
    assert "exploding matmul" in message and "kaboom: bad tile 42" in message, message


def test_a_read_on_another_stream_of_what_a_failed_op_was_to_write_fails():
    """Stream 1's compute was to write R and failed. A read of R on stream 2 (enqueued while the
    compute ran: a derived edge) and one on stream 3 (enqueued after it failed: no edge) fail
    instead of reading R, naming the original failure, and stop their streams; a read of memory
    the failed op did not write runs."""
    device = FakeDevice(initial=_initial)
    q = device.queue()
    boom = _failed_writer(q, 1)
    out, out_addr = host_buffer(16)
    before = q.enqueue(2, Transfer(D2H, dev(R), out_addr, 16))
    boom.go.set()
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(2)
    _root_named(info)
    assert before.done and before.error is not None and out.raw == bytes(16)  # nothing was read
    late = q.enqueue(3, Transfer(D2H, dev(Range(1, 8, 8)), out_addr, 8))
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(3)
    _root_named(info)
    assert late.error is not None and out.raw == bytes(16)
    unrelated = q.enqueue(4, Transfer(D2H, dev(Range(1, 16, 16)), out_addr, 16))
    q.synchronize_stream(4)
    assert unrelated.succeeded and out.raw == device.read(Range(1, 16, 16))


def test_a_failure_spreads_through_what_reads_it_and_names_the_original():
    """A compute that reads R (which a failed op was to write) and writes S fails without running,
    so S is never written either: a read of S fails too, naming the first failure, not the
    compute that only followed from it; an index error stays an IndexError all the way."""
    device = FakeDevice()
    q = device.queue()
    _failed_writer(q, 1).go.set()
    with pytest.raises(StreamError):
        q.synchronize_stream(1)
    ran: list = []
    q.enqueue(2, Compute(Affine(device, ran, "affine"), (R, S), Footprint(reads=(R,), writes=(S,)), name="affine"))
    _, out_addr = host_buffer(16)
    q.enqueue(3, Transfer(D2H, dev(S), out_addr, 16))
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(3)
    _root_named(info)
    assert "affine" in str(info.value) and ran == []


def test_a_read_of_what_a_skipped_op_was_to_write_fails():
    """Stream 1 failed, so its later write of S is skipped: S is never written, and a read of it
    on stream 2 fails naming the failure that stopped stream 1."""
    q = FakeDevice().queue()
    _failed_writer(q, 1, writes=()).go.set()
    src, addr = host_buffer(b"\x11" * 16)
    skipped = q.enqueue(1, Transfer(H2D, addr, dev(S), 16))
    _, out_addr = host_buffer(16)
    q.enqueue(2, Transfer(D2H, dev(S), out_addr, 16))
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(2)
    _root_named(info)
    assert skipped.skipped and f"#{skipped.seq}" in str(info.value)


def test_an_inline_read_of_a_failed_output_raises_to_its_caller_only():
    """A host read (inline: item(), a blocking copy, the CPU fallback) of what a failed op was to
    write raises to its caller, naming the failure, without running; the caller is told at once
    and nothing was written, so its stream goes on."""
    q = FakeDevice().queue()
    _failed_writer(q, 1).go.set()
    with pytest.raises(StreamError):
        q.synchronize_stream(1)
    ran: list = []
    with pytest.raises(StreamError) as info:
        q.run_inline(2, HostCallback(lambda: ran.append("read"), Footprint(reads=(R,)), name="item",
                                     raise_to_caller=True))
    _root_named(info)
    out, out_addr = host_buffer(16)
    with pytest.raises(StreamError) as info:
        q.run_inline(2, Transfer(D2H, dev(R), out_addr, 16))
    _root_named(info)
    assert ran == [] and out.raw == bytes(16)
    assert q.query_stream(2) is True and q.run_inline(2, HostCallback(lambda: 5)) == 5


def test_a_wait_on_a_signal_behind_a_failure_fails_and_stops_its_stream():
    """A Signal skipped because its stream failed fires failed: the Wait on it fails, naming the
    original failure, and what follows the wait on the waiting stream is skipped (it would run
    as if the failed work had run)."""
    q = FakeDevice().queue()
    boom = _failed_writer(q, 1, writes=())
    sig = SoftSignal()
    q.enqueue(1, Signal(sig))
    wait = q.enqueue(2, Wait(sig))
    ran: list = []
    after = q.enqueue(2, HostCallback(lambda: ran.append("after the wait")))
    boom.go.set()
    with pytest.raises(StreamError) as info:
        q.synchronize_stream(2)
    _root_named(info)
    assert f"wait {sig.ident}" in str(info.value) and wait.error is not None
    assert after.skipped and ran == []
    assert sig.fired and sig.failure is not None


def test_poisoned_memory_is_cleared_by_clear_error_or_a_transfer_over_it():
    """What a failed op was to write stays unreadable until clear_error() (its bytes then hold
    whatever they held) or until a transfer writes them anew (a transfer writes every byte of
    its destination; a compute's declared writes may have holes, so a compute does not clear
    it). clear_error() also clears the failed mark of the signals fired behind the failure."""
    device = FakeDevice()
    q = device.queue()
    _failed_writer(q, 1).go.set()
    sig = SoftSignal()
    q.enqueue(1, Signal(sig))
    with pytest.raises(StreamError):
        q.synchronize_stream(1)
    ran: list = []
    q.enqueue(2, Compute(Affine(device, ran, "over R"), (S, R), Footprint(reads=(S,), writes=(R,))))
    q.synchronize_stream(2)
    assert ran == ["over R"]
    src, addr = host_buffer(b"\x22" * 8)
    q.enqueue(2, Transfer(H2D, addr, dev(Range(1, 0, 8)), 8))
    out, out_addr = host_buffer(16)
    q.run_inline(3, Transfer(D2H, dev(Range(1, 0, 8)), out_addr, 8))  # rewritten: readable
    assert out.raw[:8] == b"\x22" * 8
    with pytest.raises(StreamError, match="exploding matmul"):
        q.run_inline(3, Transfer(D2H, dev(Range(1, 8, 8)), out_addr, 8))  # only computed over
    assert sig.failure is not None
    q.clear_error()
    assert sig.failure is None
    q.run_inline(3, Transfer(D2H, dev(R), out_addr, 16))
    q.synchronize()


def test_a_block_handed_out_again_is_not_poisoned():
    """Memory the allocator hands out anew holds a new tensor's uninitialized bytes, not the failed
    op's missing output: the queue asks the device to note allocations only while something is
    poisoned, and a block handed out since clears what it covers."""
    handed: list = []
    watching: list = []
    device = FakeDevice()
    q = device.queue(watch_allocations=watching.append,
                     take_allocations=lambda: [handed.pop() for _ in range(len(handed))])
    _failed_writer(q, 1).go.set()
    with pytest.raises(StreamError):
        q.synchronize_stream(1)
    assert watching == [True]
    _, out_addr = host_buffer(16)
    with pytest.raises(StreamError, match="exploding matmul"):
        q.run_inline(2, Transfer(D2H, dev(R), out_addr, 16))
    handed.append((R.region, R.offset, R.length))  # the tensor was freed and its block handed out
    q.run_inline(2, Transfer(D2H, dev(R), out_addr, 16))
    assert watching == [True, False]  # nothing is poisoned: the device stops noting
    q.clear_error()


# ---- 8. inline operations ----------------------------------------------------------


def test_run_inline_runs_on_the_calling_thread_after_earlier_ops():
    """run_inline waits for the stream's earlier ops, then runs the callback on the
    calling thread (as a host operation) and returns its result."""
    q = FakeDevice().queue()
    slow = q.enqueue(1, Compute(Sleep(0.1, ns=1_000_000), None))
    seen = {}

    def fn():
        seen.update(thread=threading.get_ident(), slow_done=slow.done, nested=in_host_operation())
        return "result"

    assert q.run_inline(1, HostCallback(fn, name="eager op")) == "result"
    assert seen == {"thread": threading.get_ident(), "slow_done": True, "nested": True}
    assert not in_host_operation()


def test_inline_error_raised_to_caller_does_not_poison_the_stream():
    """With raise_to_caller=True an inline callback's failure (an eager op's argument
    error) is raised to the caller and the stream stays usable; without it, the
    failure is raised too but the stream's error becomes sticky."""
    q = FakeDevice().queue()

    def bad_argument():
        raise ValueError("bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        q.run_inline(1, HostCallback(bad_argument, raise_to_caller=True))
    assert q.query_stream(1) is True
    q.synchronize_stream(1)
    assert q.run_inline(1, HostCallback(lambda: 3)) == 3

    with pytest.raises(ValueError, match="bad argument"):
        q.run_inline(2, HostCallback(bad_argument, name="poisoning op"))
    with pytest.raises(StreamError, match="poisoning op"):
        q.query_stream(2)


def test_inline_compute_still_shares_the_one_compute_pipeline():
    """The one-compute-pipeline rule should hold for an inline Compute too."""
    q = FakeDevice().queue()
    with Timeline([q]) as timeline:
        gate, running = hold_compute(q, 1)
        threading.Timer(0.2, gate.open).start()
        q.run_inline(2, Compute(Sleep(0, ns=1_000_000), None, name="inline compute"))
    (inline,) = [t for _, t in timeline.tickets if t.name == "inline compute"]
    first, second = sorted((running, inline), key=lambda t: t.host_start)
    assert second.host_start >= first.host_end
    first, second = sorted((running, inline), key=lambda t: t.sim_start)
    assert second.sim_start >= first.sim_end


def test_run_inline_accepts_a_control_operation():
    """run_inline of a Barrier on an idle queue returns at once (a control op
    completes as soon as it is ready) and leaves the stream idle."""
    q = FakeDevice().queue()
    outcome = {}

    def call():
        try:
            outcome["value"] = q.run_inline(1, Barrier())
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(GATE_LIMIT)
    assert not caller.is_alive()
    assert outcome == {"value": None}
    assert q.query_stream(1) is True


def test_a_host_callback_may_run_inline_work_on_another_stream():
    """A host callback run by the host pipeline's worker may run an inline host
    operation on another stream: nothing orders that one after the callback."""
    q = FakeDevice().queue()
    outer = q.enqueue(1, HostCallback(lambda: q.run_inline(2, HostCallback(lambda: "inner")), name="outer"))
    deadline = time.monotonic() + 1.0
    while not outer.done and time.monotonic() < deadline:
        time.sleep(0.005)
    assert outer.done
    assert q.wait(outer) == "inner"


# ---- 9. staging buffers ------------------------------------------------------------


class PinnedBuffer:
    """Stands in for a pinned CPU tensor: host memory with a data_ptr()."""

    def __init__(self, nbytes: int):
        self.buf = ctypes.create_string_buffer(nbytes)

    def data_ptr(self) -> int:
        return ctypes.addressof(self.buf)


def test_staging_buffer_is_reused_only_when_safe():
    """A released staging buffer whose last transfer has not run is not handed out
    (its taker fills it at once, on the host); once the transfer is done it is
    reused without allocating, and one released with no reader is free at once."""
    device = FakeDevice()
    q = device.queue()
    pool = StagingPool(allocate=PinnedBuffer)
    buf = pool.acquire(100)
    assert pool.created == 1 and buf.nbytes == 4096  # at least min_bytes
    ctypes.memmove(buf.address, b"\x42" * 16, 16)

    gate, _ = hold_compute(q, 1)
    try:
        xfer = q.enqueue(1, Transfer(H2D, HostAddress(buf.address), DeviceAddress(1, 0), 16))
        pool.release(buf, xfer)
        assert not xfer.done
        other = pool.acquire(100)
        assert other is not buf and pool.created == 2
        pool.release(other, None)  # (its transfer was never enqueued)
        assert pool.acquire(100) is other and pool.created == 2
    finally:
        gate.open()
    q.wait(xfer)
    assert device.read(Range(1, 0, 16)) == b"\x42" * 16
    assert pool.acquire(100) is buf
    assert pool.created == 2


def test_staging_pool_sizes_and_best_fit():
    """Buffers are powers of two (at least min_bytes); acquire picks the smallest
    free buffer that fits; an object with a `.done` flag can stand for a ticket."""

    class Done:
        done = True

    pool = StagingPool(allocate=PinnedBuffer, min_bytes=64)
    small, big = pool.acquire(10), pool.acquire(5000)
    assert (small.nbytes, big.nbytes) == (64, 8192)
    pool.release(big, Done())
    pool.release(small, Done())
    assert pool.acquire(60) is small
    assert pool.acquire(100) is big
    assert pool.created == 2


def test_staging_pool_hands_out_the_oldest_released_buffer_that_is_done():
    """A launch-bound loop keeps many buffers released and not yet read: acquire looks at the
    oldest few of a size (transfers finish roughly in order), not at every one."""

    class Busy:
        done = False

    class Done:
        done = True

    pool = StagingPool(allocate=PinnedBuffer, min_bytes=64)
    bufs = [pool.acquire(64) for _ in range(3)]
    pool.release(bufs[0], Busy())
    pool.release(bufs[1], Done())
    pool.release(bufs[2], Done())
    assert pool.acquire(64) is bufs[1]  # the oldest done, past a busy one
    assert pool.acquire(64) is bufs[2]
    assert pool.acquire(64) is not bufs[0] and pool.created == 4

    # busy buffers at the front (a stream held behind slow work) are moved to the back: a done
    # one behind more than a look's worth of them is found, and few new buffers are made
    pool = StagingPool(allocate=PinnedBuffer, min_bytes=64)
    bufs = [pool.acquire(64) for _ in range(6)]
    for b in bufs[:5]:
        pool.release(b, Busy())
    pool.release(bufs[5], Done())
    first, second = pool.acquire(64), pool.acquire(64)
    assert first not in bufs and second is bufs[5] and pool.created == 7


# ---- 10. timeline ----------------------------------------------------------------


def test_timeline_writes_a_chrome_trace(tmp_path):
    """Timeline collects every op completed while active and writes Chrome-trace
    JSON: a named track per pipeline and per stream, an "X" slice per op on its
    pipeline and stream tracks, and a flow arrow (s -> f) for each event edge."""
    device = FakeDevice()
    q = device.queue(wait_timeout=5.0)
    path = tmp_path / "trace.json"
    src, addr = host_buffer(b"\x07" * 16)
    with Timeline([q], path) as timeline:
        sig = SoftSignal()
        wait = q.enqueue(2, Wait(sig))
        q.enqueue(2, Transfer(H2D, addr, DeviceAddress(2, 0), 16))
        q.enqueue(1, Compute(Sleep(0.02, ns=1_000_000), None, Footprint(writes=(R,)), name="matmul"))
        signal = q.enqueue(1, Signal(sig))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]

    names = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for pipeline in ("compute", "h2d", "d2h", "d2d"):
        assert f"pipeline {pipeline}" in names
    assert "pipeline host (host wall time)" in names  # (its operations last their host time there)
    assert "stream 1" in names and "stream 2" in names

    slices = [e for e in events if e["ph"] == "X"]
    matmul = [e for e in slices if e["name"] == "matmul"]
    assert {e["tid"] for e in matmul} == {names["pipeline compute"], names["stream 1"]}
    assert all(e["ts"] == 0 and e["dur"] == pytest.approx(1000.0) for e in matmul)  # microseconds
    h2d = [e for e in slices if e["name"] == "h2d 16 B"]
    assert {e["tid"] for e in h2d} == {names["pipeline h2d"], names["stream 2"]}
    assert all(e["ts"] >= 1000.0 for e in h2d)  # after the wait, after the signal
    assert {e["name"] for e in slices} >= {wait.name, signal.name}  # control ops: stream track only

    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    event_flows = [i for i, e in finishes.items() if e["name"] == "event"]
    assert event_flows and all(i in starts for i in event_flows)
    flow = event_flows[0]
    assert starts[flow]["tid"] == names["stream 1"] and finishes[flow]["tid"] == names["stream 2"]

    assert timeline.makespan_ns() == pytest.approx(1_000_000 + 16 / 25.0)
    assert timeline.busy_ns("compute") == 1_000_000


# ---- operation basics --------------------------------------------------------------


def test_simulated_costs_of_each_kind_of_operation():
    """Transfers cost bytes / bandwidth (host link for h2d/d2h, device memory for
    d2d); a compute costs its executor's cost_ns (0 by default); a host
    callback costs its host wall time."""
    device = FakeDevice({1: 4096, 2: 4096})
    q = device.queue()
    src, src_addr = host_buffer(4096)
    out, out_addr = host_buffer(4096)
    ops = {
        "h2d": Transfer(H2D, src_addr, DeviceAddress(1, 0), 4096),
        "d2h": Transfer(D2H, DeviceAddress(1, 0), out_addr, 4096),
        "d2d": Transfer(D2D, DeviceAddress(1, 0), DeviceAddress(2, 0), 4096),
        "timed": Compute(Sleep(0, ns=1234.0), None),
        "untimed": Compute(Affine(device, [], None), (Range(1, 0, 8), Range(2, 0, 8))),
        "host": HostCallback(lambda: time.sleep(0.01)),
    }
    t = {name: q.enqueue(i, op) for i, (name, op) in enumerate(ops.items())}
    q.synchronize()
    cost = {name: ticket.sim_end - ticket.sim_start for name, ticket in t.items()}
    assert cost["h2d"] == pytest.approx(4096 / 25.0)
    assert cost["d2h"] == pytest.approx(4096 / 25.0)
    assert cost["d2d"] == pytest.approx(4096 / 105.0)
    assert cost["timed"] == 1234.0
    assert cost["untimed"] == 0.0
    assert cost["host"] >= 10_000_000  # >= 10 ms of wall time
    busy = q.sim_busy_ns()
    assert busy["d2d"] == pytest.approx(4096 / 105.0) and busy["compute"] == 1234.0


def test_transfer_checks_its_operands():
    """A Transfer's kind fixes which side is host and which is device memory, and
    its footprint is derived from its device addresses."""
    with pytest.raises(TypeError):
        Transfer(H2D, DeviceAddress(1, 0), DeviceAddress(1, 0), 8)
    with pytest.raises(ValueError):
        Transfer(D2D, DeviceAddress(1, 0), DeviceAddress(1, 8), -1)
    fp = Transfer(D2D, DeviceAddress(1, 4), DeviceAddress(2, 8), 16).footprint
    assert fp == Footprint(reads=(Range(1, 4, 16),), writes=(Range(2, 8, 16),))
    assert Transfer(H2D, HostAddress(0), DeviceAddress(1, 0), 8).footprint.reads == ()


def test_malformed_operations_are_refused_at_enqueue():
    """Bad operations fail where they are made, naming what is wrong, not on a worker."""
    q = FakeDevice().queue()
    with pytest.raises(TypeError, match="cannot enqueue str; operations are HostCallback"):
        q.enqueue(1, "copy please")
    with pytest.raises(TypeError, match="Compute 'k': the executor must be an Executor"):
        Compute(object(), None, name="k")

    class RunOnly:  # has run(), but is not an Executor: the queue does not guess
        def run(self, bindings):
            pass

    with pytest.raises(TypeError, match="Compute 'r': the executor must be an Executor"):
        Compute(RunOnly(), None, name="r")
    with pytest.raises(TypeError, match="data_movement must be a DataMovement engine"):
        DeviceQueue(device=0, data_movement=COSTS)
    with pytest.raises(TypeError, match="HostCallback 'h': fn must be callable"):
        HostCallback(42, name="h")
    assert q.query_stream(1)


def test_exiting_with_work_still_queued_finishes_it_and_exits_cleanly():
    # Without draining at exit, a worker still running a torch op while the interpreter and
    # torch tear down aborts the process ("terminate called without an active exception").
    from conftest import run_python

    code = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.softmax(x, -1) * 2)\n"
        "x = torch.randn(2048, 4096).to('spyre')\n"
        "ys = [f(x) for _ in range(3)]\n"  # launched asynchronously, never synchronized
    )
    for _ in range(2):
        r = run_python(code)
        assert r.returncode == 0, r.stderr[-500:]


def test_enqueueing_looks_only_at_streams_that_can_still_order_it():
    """After 1,000 streams have each done some work and the host has synchronized, a new
    operation is checked against none of them (before, every enqueue walked every stream
    ever created: 13x the cost after 1,000 streams, for good; benchmarks/queue_layer.py
    prints the ratio) and is still ordered against a stream that is busy."""
    device = FakeDevice()
    q = device.queue()
    for sid in range(1, 1001):
        q.enqueue(sid, HostCallback(lambda: None, Footprint(writes=(Range(1, sid, 1),))))
    q.synchronize()
    gate, held = hold_compute(q, 2000, Footprint(writes=(Range(1, 5, 1),)))
    try:
        reader = q.enqueue(3000, HostCallback(lambda: None, Footprint(reads=(Range(1, 5, 1),))))
        assert [s.id for s in q.graph.busy] == [2000, 3000]
        assert (held, "derived") in reader.edges
        assert len(q.graph.recent) <= 1  # the idle streams were dropped
    finally:
        gate.open()
    q.synchronize()


# ---- the executor interface: the queue runs what it is handed, without probing it ------


class Recorder(Executor):
    """Records every call the queue makes, in order; has nothing but the Executor methods."""

    def __init__(self, log: list, tag, ns: float = 0.0):
        self.log, self.tag, self.ns = log, tag, ns

    def prefetch(self, bindings):
        self.log.append(("prefetch", self.tag, bindings))

    def run(self, bindings):
        self.log.append(("run", self.tag, bindings))

    def cost_ns(self, bindings):
        self.log.append(("cost", self.tag, bindings))
        return self.ns


def test_a_stub_executor_with_only_run_needs_nothing_else():
    """An Executor that defines run() alone (no fetch, no simulated_ns, nothing to find by
    hasattr) runs, costs 0 simulated ns and prefetches nothing: the defaults are the
    interface's, not a guess of the queue's."""
    ran = []

    class OnlyRun(Executor):
        def run(self, bindings):
            ran.append(bindings)

    assert not hasattr(OnlyRun(), "fetch") and not hasattr(OnlyRun(), "simulated_ns")
    q = FakeDevice().queue()
    t = q.enqueue(1, Compute(OnlyRun(), "b", name="stub"))
    inline = q.run_inline(2, Compute(OnlyRun(), "inline"))
    q.synchronize()
    assert sorted(ran) == ["b", "inline"] and inline is None
    assert t.sim_end - t.sim_start == 0.0


def test_the_queue_calls_prefetch_run_and_cost_in_that_order():
    """prefetch when enqueued (ahead of the stream's earlier work), run when its turn
    comes, cost_ns right after: the simulated duration on the compute timeline."""
    log: list = []
    q = FakeDevice().queue()
    gate, held = hold_compute(q, 1)
    try:
        t = q.enqueue(1, Compute(Recorder(log, "k", ns=4_321.0), "bindings"))
        assert log == [("prefetch", "k", "bindings")]  # fetched ahead: the gate still runs
    finally:
        gate.open()
    q.wait(t)
    assert log == [("prefetch", "k", "bindings"), ("run", "k", "bindings"), ("cost", "k", "bindings")]
    assert t.sim_end - t.sim_start == 4_321.0
    assert t.sim_start >= held.sim_end


@pytest.mark.parametrize("hold", ["a barrier ahead", "the compute's own hold_fetch"])
def test_a_held_fetch_waits_until_the_compute_is_ready(hold):
    """Behind a Barrier that has not completed, or with hold_fetch (a launch's compute, whose
    correction area the patch it follows is still writing), the prefetch waits until the
    Compute is ready: program distribution must not read a correction area being patched."""
    log: list = []
    q = FakeDevice().queue()
    gate, held = hold_compute(q, 1)
    try:
        if hold == "a barrier ahead":
            q.enqueue(1, Barrier())
        t = q.enqueue(1, Compute(Recorder(log, "k"), None, hold_fetch=hold != "a barrier ahead"))
        time.sleep(0.05)
        assert log == []  # not fetched while it is held
    finally:
        gate.open()
    q.wait(t)
    assert [call for call, *_ in log] == ["prefetch", "run", "cost"]


class BadPrefetch(Executor):
    def __init__(self, ran: list):
        self.ran = ran

    def prefetch(self, bindings):
        raise RuntimeError("the correction area's region is gone")

    def run(self, bindings):
        self.ran.append("ran")


@pytest.mark.parametrize("behind_barrier", [False, True])
def test_a_failing_prefetch_fails_its_operation_on_its_stream(behind_barrier):
    """A prefetch that raises is the operation's failure, reported like a failing run (its
    stream's error, naming it), whether it ran at enqueue or when a barrier let it go: it
    neither escapes into the enqueuer nor kills a worker, and the run never happens."""
    ran: list = []
    q = FakeDevice().queue()
    gate, held = hold_compute(q, 1)
    try:
        if behind_barrier:
            q.enqueue(1, Barrier())
        failed = q.enqueue(1, Compute(BadPrefetch(ran), None, name="stale fetch"))
        after = q.enqueue(1, HostCallback(lambda: ran.append("after")))
    finally:
        gate.open()
    with pytest.raises(StreamError, match=r"stale fetch.*region is gone"):
        q.synchronize_stream(1)
    assert failed.done and isinstance(failed.error, RuntimeError) and after.skipped and ran == []
    with pytest.raises(RuntimeError, match="region is gone"):
        q.run_inline(2, Compute(BadPrefetch(ran), None, name="inline"))
    q.clear_error()
    assert q.run_inline(1, HostCallback(lambda: "fine")) == "fine" and ran == []


class CountingMover(DataMovement):
    """A data-movement engine that moves nothing: it counts and prices."""

    def __init__(self):
        self.moved: list[Transfer] = []

    def run(self, transfer):
        self.moved.append(transfer)

    def cost_ns(self, transfer):
        return 10.0 * len(self.moved)


def test_transfers_go_to_the_device_engine_the_queue_was_handed():
    """The queue layer moves no bytes itself: every Transfer is its engine's to run and
    price (the simulated device's memmove lives in spyre_runtime.device)."""
    mover = CountingMover()
    q = DeviceQueue(device=0, data_movement=mover)
    src, src_addr = host_buffer(b"\x07" * 16)
    ops = [Transfer(H2D, src_addr, DeviceAddress(1, 0), 16),
           Transfer(D2D, DeviceAddress(1, 0), DeviceAddress(2, 0), 16),
           Transfer(D2H, DeviceAddress(2, 0), src_addr, 16)]
    tickets = [q.enqueue(1, op) for op in ops]
    q.synchronize()
    assert mover.moved == ops  # in stream order, each once
    assert [t.sim_end - t.sim_start for t in tickets] == [10.0, 20.0, 30.0]
    assert src.raw[:16] == b"\x07" * 16  # nothing was copied behind the engine's back


def test_the_simulated_engine_moves_and_prices_every_kind():
    device = FakeDevice({1: 32, 2: 32})
    engine = SimulatedDataMovement(COSTS, device.resolve)
    src, src_addr = host_buffer(bytes(range(16)))
    out, out_addr = host_buffer(16)
    for op in (Transfer(H2D, src_addr, DeviceAddress(1, 4), 16),
               Transfer(D2D, DeviceAddress(1, 4), DeviceAddress(2, 8), 16),
               Transfer(D2H, DeviceAddress(2, 8), out_addr, 16)):
        engine.run(op)
    assert out.raw[:16] == bytes(range(16)) and device.region(2)[8:24] == bytes(range(16))
    assert engine.cost_ns(Transfer(D2D, DeviceAddress(1, 0), DeviceAddress(2, 0), 105)) == pytest.approx(1.0)
    assert engine.cost_ns(Transfer(H2D, src_addr, DeviceAddress(1, 0), 25)) == pytest.approx(1.0)


def test_the_queue_layer_imports_neither_programs_nor_the_device_nor_torch():
    from conftest import run_python

    r = run_python(
        "import sys, spyre_runtime.queue\n"
        "print(sorted(m for m in sys.modules if m == 'ctypes' or m.startswith(('torch', "
        "'spyre_runtime.program', 'spyre_runtime.device', 'spyre_runtime.launch', 'spyre_runtime.prepare', "
        "'spyre_runtime.direct', 'spyre_runtime.artifact'))))\n",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
