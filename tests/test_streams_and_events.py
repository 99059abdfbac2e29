"""Streams and events: real ids, per-thread current stream, event identity and timing."""

import threading

import pytest
import torch


def test_new_streams_get_distinct_ids():
    a, b = torch.Stream(device="spyre"), torch.Stream(device="spyre")
    assert a.stream_id != b.stream_id
    assert 0 not in (a.stream_id, b.stream_id)  # 0 is the default stream
    assert a.device == torch.device("spyre", 0)


def test_spyre_stream_carries_priority():
    s = torch.spyre.Stream(priority=-1)
    assert s.priority == -1
    assert torch.spyre.Stream().priority == 0
    assert torch.spyre.default_stream().stream_id == 0


def test_stream_context_sets_and_restores_the_current_stream():
    s = torch.spyre.Stream()
    assert torch.spyre.current_stream().stream_id == 0
    with torch.spyre.stream(s):
        assert torch.spyre.current_stream().stream_id == s.stream_id
        assert torch.accelerator.current_stream().stream_id == s.stream_id
    assert torch.spyre.current_stream().stream_id == 0


def test_stream_on_other_device_context_restores_both():
    s1 = torch.spyre.Stream(device=1)
    with torch.spyre.stream(s1):
        assert torch.spyre.current_stream(1).stream_id == s1.stream_id
    assert torch.spyre.current_device() == 0
    assert torch.spyre.current_stream(1).stream_id == 0


def test_current_stream_is_per_thread():
    s = torch.spyre.Stream()
    seen = {}
    with torch.spyre.stream(s):
        t = threading.Thread(target=lambda: seen.setdefault("id", torch.spyre.current_stream().stream_id))
        t.start()
        t.join()
    assert seen["id"] == 0


def test_stream_methods():
    s, other = torch.spyre.Stream(), torch.spyre.Stream()
    x = torch.ones(4, device="spyre")
    with torch.spyre.stream(s):
        y = x * 2
    other.wait_stream(s)
    e = s.record_event()
    other.wait_event(e)
    s.synchronize()
    assert s.query() and e.query()
    y.record_stream(other)
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))


def test_events_have_identity_and_elapsed_time():
    start = torch.Event(device="spyre", enable_timing=True)
    end = torch.spyre.Event(enable_timing=True)
    start.record()
    torch.randn(64, 64, device="spyre").sum()
    end.record()
    end.synchronize()
    assert start.event_id != end.event_id
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0.0
    assert isinstance(end, torch.spyre.Event) and isinstance(start, torch.spyre.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.spyre.Event)


def test_elapsed_time_needs_recorded_events():
    a, b = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    a.record()
    with pytest.raises(ValueError, match="must be recorded"):
        a.elapsed_time(b)


def test_bad_stream_device_names_the_limit():
    with pytest.raises(IndexError, match="out of range"):
        torch.spyre.Stream(device=9)


# ---- asynchronous behaviour (the queue layer under torch) -------------------

import time  # noqa: E402

from spyre_inductor.device import queues  # noqa: E402
from spyre_runtime.hardware import HARDWARE  # noqa: E402
from spyre_runtime.queue import Compute, Executor, HostCallback, StreamError  # noqa: E402


class Sleep(Executor):
    """A compute that holds the compute pipeline for a while (GIL released)."""

    def __init__(self, seconds: float, simulated_ns: float = 1e6):
        self.seconds, self.ns = seconds, simulated_ns

    def run(self, bindings):
        time.sleep(self.seconds)

    def cost_ns(self, bindings):
        return self.ns


def enqueue_slow_read(t: torch.Tensor, stream: torch.Stream, seconds: float = 0.3):
    q = queues.queue(t.device.index)
    return q.enqueue(stream.stream_id, Compute(Sleep(seconds), None, queues.footprint(reads=(t,)), name="slow read"))


def test_elapsed_time_is_simulated_device_time():
    x = torch.empty(1 << 22, dtype=torch.uint8).pin_memory()  # 4 MiB
    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    start.record()
    x.to("spyre", non_blocking=True)
    end.record()
    end.synchronize()
    expected_ms = (1 << 22) / HARDWARE.host_link_gbps / 1e6
    assert start.elapsed_time(end) == pytest.approx(expected_ms, rel=1e-6)


def test_waiting_on_a_never_recorded_event_is_a_no_op():
    e = torch.spyre.Event()
    torch.spyre.current_stream().wait_event(e)
    assert e.query()
    e.synchronize()


def test_events_can_be_recorded_again():
    s = torch.spyre.Stream()
    e = torch.spyre.Event()
    e.record(s)
    ticket = enqueue_slow_read(torch.ones(4, device="spyre"), s, 0.2)
    e.record(s)  # a fresh internal signal, after the slow read
    assert not e.query()
    e.synchronize()
    assert ticket.done and e.query()


def test_stream_query_reports_pending_work():
    s = torch.spyre.Stream()
    enqueue_slow_read(torch.ones(4, device="spyre"), s, 0.2)
    assert not s.query()
    s.synchronize()
    assert s.query()


def test_eager_code_on_two_streams_matches_one_stream():
    torch.manual_seed(0)
    host = torch.randn(64, 64).pin_memory()

    def program(s1, s2):
        with torch.spyre.stream(s1):
            a = host.to("spyre", non_blocking=True)
            b = (a @ a).relu()
        s2.wait_stream(s1)
        with torch.spyre.stream(s2):
            c = b.sum(0) + a[0]
            done = torch.spyre.Event()
            done.record()
        s1.wait_event(done)
        with torch.spyre.stream(s1):
            out = (c * 2).to("cpu")
        return out

    default = torch.spyre.current_stream()
    one = program(default, default)
    two = program(torch.spyre.Stream(), torch.spyre.Stream())
    torch.spyre.synchronize()
    assert torch.equal(one, two)


def test_freed_memory_is_not_reused_while_another_stream_reads_it():
    reader = torch.spyre.Stream()
    x = torch.ones(1 << 16, dtype=torch.uint8, device="spyre")
    region_offset = torch.spyre.describe(x)[0]
    ticket = enqueue_slow_read(x, reader, 0.3)
    x.record_stream(reader)
    allocated = torch.spyre.memory_allocated()
    del x
    # Still in use by `reader`: counted, and not handed out again.
    assert torch.spyre.memory_allocated() == allocated
    y = torch.empty(1 << 16, dtype=torch.uint8, device="spyre")
    assert torch.spyre.describe(y)[0] != region_offset
    reader.synchronize()
    assert ticket.done
    assert torch.spyre.memory_allocated() == allocated  # x's block came back, y took new space
    # It is handed out again: not necessarily first (earlier tests may have left free blocks of
    # the same size, and the allocator takes the best fit), but among blocks of its size.
    held = [torch.empty(1 << 16, dtype=torch.uint8, device="spyre") for _ in range(64)]
    assert region_offset in [torch.spyre.describe(z)[0] for z in held]


def test_non_blocking_copy_from_pageable_memory_snapshots_the_source():
    s = torch.spyre.Stream()
    enqueue_slow_read(torch.ones(1, device="spyre"), s, 0.2)  # keep the stream busy
    src = torch.arange(1000.0)
    with torch.spyre.stream(s):
        d = src.to("spyre", non_blocking=True)
    src.fill_(-1.0)  # after the call returns, before the transfer runs
    s.synchronize()
    assert torch.equal(d.cpu(), torch.arange(1000.0))


def test_staging_buffers_are_safe_under_four_concurrent_streams():
    from conftest import run_in_threads

    results = {}

    def worker(k):
        s = torch.spyre.Stream()
        outs = []
        with torch.spyre.stream(s):
            for i in range(25):
                src = torch.full((4096,), float(k * 100 + i))
                outs.append(src.to("spyre", non_blocking=True))
                src.fill_(-1.0)
        s.synchronize()
        results[k] = [o.cpu()[0].item() for o in outs] + [o.cpu()[-1].item() for o in outs]

    run_in_threads(worker, 4)
    for k in range(4):
        assert results[k] == [float(k * 100 + i) for i in range(25)] * 2


def test_a_failed_operation_surfaces_at_synchronize_and_is_sticky():
    s, other = torch.spyre.Stream(), torch.spyre.Stream()
    q = queues.queue(0)

    def boom():
        raise ValueError("bad bytes")

    q.enqueue(s.stream_id, HostCallback(boom, name="exploding callback"))
    after = q.enqueue(s.stream_id, HostCallback(lambda: "ran", name="later"))
    with torch.spyre.stream(other):
        ok = (torch.ones(3, device="spyre") * 2).cpu()  # other streams keep working
    assert torch.equal(ok, torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="exploding callback.*ValueError: bad bytes"):
        s.synchronize()
    assert after.skipped
    with pytest.raises(RuntimeError, match="exploding callback"):
        s.query()
    with pytest.raises(RuntimeError, match="exploding callback"):
        torch.spyre.synchronize()
    torch.spyre.clear_errors()
    s.synchronize()
    assert q.wait(q.enqueue(s.stream_id, HostCallback(lambda: 7))) == 7


def test_timeline_has_a_track_per_pipeline_and_stream(tmp_path):
    import json

    path = tmp_path / "run.json"
    s = torch.spyre.Stream()
    with torch.spyre.timeline(path):
        with torch.spyre.stream(s):
            a = torch.ones(1024).pin_memory().to("spyre", non_blocking=True)
            e = torch.spyre.Event()
            e.record()
        torch.spyre.current_stream().wait_event(e)
        (a + 1).cpu()
    trace = json.loads(path.read_text())["traceEvents"]
    names = {ev["args"]["name"] for ev in trace if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert {"pipeline compute", "pipeline h2d", "pipeline d2h", "pipeline host (host wall time)"} <= names
    assert f"stream {s.stream_id}" in names and "stream 0" in names
    slices = [ev["name"] for ev in trace if ev["ph"] == "X"]
    # a + 1: a compiled eager op (spyre_inductor/eager), its program on the compute pipeline
    assert "h2d 4096 B" in slices and any(n.startswith("spyre_pw_add_") for n in slices)
    assert any(ev["ph"] == "s" for ev in trace) and any(ev["ph"] == "f" for ev in trace)
    # two clocks, labelled: what the card runs lasts its simulated time, a host operation its wall time
    clocks = {ev["cat"]: ev["args"]["duration clock"] for ev in trace if ev["ph"] == "X"}
    assert clocks["compute"] == "simulated" and clocks["h2d"] == "simulated"
