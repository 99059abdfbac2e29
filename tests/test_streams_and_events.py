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
