"""Two simulated cards ordering each other: events both ways, wait_stream, copies.

A wait on one device for an event of another orders the two devices as
CUDA's cudaStreamWaitEvent does: the waiting stream holds until the event's
work is done, and the wait and everything behind it complete on the waiting
device's own queue (its workers, its memory, its bookkeeping). Each test
holds device work behind a gate, so the waits really are pending when they
are enqueued, then checks every value against what the CPU would give.
"""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import run_python
from spyre_inductor.device import queues
from spyre_runtime.queue import HostCallback

LIMIT = 30.0  # seconds a test waits for something that must happen long before


class Gate:
    """A host callback that holds a stream of a device until opened."""

    def __init__(self, device: int, stream: torch.Stream | None = None):
        self.opened = threading.Event()
        stream_id = (stream or torch.spyre.current_stream(device)).stream_id
        self.ticket = queues.queue(device).enqueue(stream_id, HostCallback(self._hold, name="gate"))

    def _hold(self):
        assert self.opened.wait(LIMIT), "gate never opened"

    def open(self):
        self.opened.set()


def synchronize_within(device: int, limit: float = LIMIT) -> None:
    """torch.spyre.synchronize(device), failing the test instead of hanging it."""
    errors: list[BaseException] = []

    def run():
        try:
            torch.spyre.synchronize(device)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"synchronize({device}) hung"
    if errors:
        raise errors[0]


@pytest.fixture(autouse=True)
def _clean():
    yield
    for d in range(2):
        torch.spyre.clear_errors(d)


def test_a_wait_for_another_devices_event_leaves_that_devices_memory_alone():
    """The issue's probe: copies on spyre:0, an event after them, spyre:1's stream waits on
    it, then copies on spyre:1. Before the fix the wait completed on device 0's queue (its
    workers, region handles and in-flight set): a spyre:0 tensor was overwritten, the
    spyre:1 copy was lost and synchronize(1) hung."""
    nines = torch.full((256,), 9.0).to("spyre:0")
    sevens = torch.full((256,), 7.0).to("spyre:1")
    on1 = torch.zeros(256).to("spyre:1")
    gate = Gate(0)
    staged0 = torch.empty(256, device="spyre:0")
    staged0.copy_(nines, non_blocking=True)
    event = torch.Event(device="spyre:0")
    event.record(torch.spyre.current_stream(0))
    s1 = torch.spyre.current_stream(1)
    s1.wait_event(event)
    on1.copy_(sevens, non_blocking=True)
    copy_done = torch.Event(device="spyre:1")
    copy_done.record(s1)
    assert not event.query() and not copy_done.query()  # both held behind the gate
    gate.open()
    synchronize_within(1)
    synchronize_within(0)
    assert event.query() and copy_done.query()
    assert torch.equal(nines.cpu(), torch.full((256,), 9.0))
    assert torch.equal(staged0.cpu(), torch.full((256,), 9.0))
    assert torch.equal(on1.cpu(), torch.full((256,), 7.0))


def test_the_waiting_device_holds_until_the_event_fires():
    """Device 1's work behind the wait must not run while device 0's work before the event
    is still held, and must run once it is released."""
    src = torch.arange(64, dtype=torch.float32).to("spyre:1")
    dst = torch.zeros(64).to("spyre:1")
    gate = Gate(0)
    event = torch.Event(device="spyre:0")
    event.record(torch.spyre.current_stream(0))
    torch.spyre.current_stream(1).wait_event(event)
    dst.copy_(src, non_blocking=True)
    after = torch.Event(device="spyre:1")
    after.record(torch.spyre.current_stream(1))
    threading.Event().wait(0.2)  # time enough for the copy to run, were it not held
    assert not after.query()
    gate.open()
    synchronize_within(1)
    assert torch.equal(dst.cpu(), torch.arange(64, dtype=torch.float32))


@pytest.mark.parametrize("waiter,recorder", [(1, 0), (0, 1)])
def test_events_order_devices_both_ways(waiter, recorder):
    held = torch.zeros(32).to(f"spyre:{waiter}")
    ones = torch.ones(32).to(f"spyre:{waiter}")
    gate = Gate(recorder)
    event = torch.Event(device=f"spyre:{recorder}")
    event.record(torch.spyre.current_stream(recorder))
    torch.spyre.current_stream(waiter).wait_event(event)
    held.copy_(ones, non_blocking=True)
    gate.open()
    synchronize_within(waiter)
    synchronize_within(recorder)
    assert torch.equal(held.cpu(), torch.ones(32))


def test_a_wait_enqueued_before_its_event_is_recorded_on_another_device():
    """The wait may come first (an event recorded later, on another device's stream):
    recording it releases the waiter on its own device."""
    dst = torch.zeros(16).to("spyre:1")
    src = torch.full((16,), 3.0).to("spyre:1")
    from spyre_runtime.queue import Signal, SoftSignal, Wait

    signal = SoftSignal()
    s1 = torch.spyre.current_stream(1).stream_id
    wait = queues.queue(1).enqueue(s1, Wait(signal))
    dst.copy_(src, non_blocking=True)
    assert not wait.done
    queues.queue(0).enqueue(torch.spyre.current_stream(0).stream_id, Signal(signal))
    synchronize_within(1)
    assert wait.done and wait.device == 1
    assert torch.equal(dst.cpu(), torch.full((16,), 3.0))


def test_wait_stream_across_devices():
    """stream.wait_stream(other_device_stream): a copy on spyre:1 that follows spyre:0's copy
    sees its result when it reads through the host, in order."""
    s0 = torch.spyre.Stream(0)
    s1 = torch.spyre.Stream(1)
    a0 = torch.zeros(128).to("spyre:0")
    b1 = torch.zeros(128).to("spyre:1")
    src0 = torch.full((128,), 5.0).to("spyre:0")
    src1 = torch.full((128,), 6.0).to("spyre:1")
    gate = Gate(0, s0)
    with torch.spyre.stream(s0):
        a0.copy_(src0, non_blocking=True)
    s1.wait_stream(s0)
    with torch.spyre.stream(s1):
        b1.copy_(src1, non_blocking=True)
    done = torch.Event(device="spyre:1")
    done.record(s1)
    assert not done.query()
    gate.open()
    synchronize_within(1)
    assert torch.equal(a0.cpu(), torch.full((128,), 5.0))
    assert torch.equal(b1.cpu(), torch.full((128,), 6.0))


def test_a_cross_device_copy_waits_for_a_write_to_its_source_on_another_stream():
    """The source is being written on a stream of its device that is not the current one:
    the copy to spyre:1 waits for that write (before, it synchronized only the current
    stream and copied the zeros that were there)."""
    side = torch.spyre.Stream(0)
    src = torch.zeros(256).to("spyre:0")
    ones = torch.ones(256).to("spyre:0")
    torch.spyre.synchronize(0)
    gate = Gate(0, side)
    with torch.spyre.stream(side):
        src.copy_(ones, non_blocking=True)
    threading.Timer(0.3, gate.open).start()
    moved = src.to("spyre:1")
    assert torch.equal(moved.cpu(), torch.ones(256))


BOTH_COMPUTE = """
import torch
torch.manual_seed(0)
f = torch.compile(lambda a, b: (a * 2 + b).relu())
xs = [torch.randn(64, 64) for _ in range(6)]
ys = [torch.randn(64, 64) for _ in range(6)]
dev = [[x.to(f"spyre:{d}") for x in xs] for d in range(2)]
ydev = [[y.to(f"spyre:{d}") for y in ys] for d in range(2)]
for i in range(6):
    out0 = f(dev[0][i], ydev[0][i])
    out1 = f(dev[1][i], ydev[1][i])
    moved = out0.to("spyre:1")
    back = out1.to("spyre:0")
    expect = (xs[i] * 2 + ys[i]).relu()
    assert torch.equal(moved.cpu(), expect) and torch.equal(back.cpu(), expect), i
    assert torch.equal(moved.cpu(), out1.cpu()), i
torch.spyre.synchronize(0)
torch.spyre.synchronize(1)
print("ok")
"""


def test_copies_between_devices_while_both_compute():
    """Copies spyre:0 -> spyre:1 and back, while both devices run compiled kernels on other
    tensors and eager ops: every value matches the CPU. (In a fresh process: the loaded
    kernels keep their programs on both devices, and later tests expect spyre:1 empty.)"""
    result = run_python(BOTH_COMPUTE, SPYRE_NUM_DEVICES=2)
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stderr[-3000:]


def test_the_timeline_draws_a_cross_device_wait_from_the_recording_device():
    gate = Gate(0)
    event = torch.Event(device="spyre:0")
    with torch.spyre.timeline() as tl:
        event.record(torch.spyre.current_stream(0))
        torch.spyre.current_stream(1).wait_event(event)
        gate.open()
        synchronize_within(1)
    starts = [e for e in tl.trace()["traceEvents"] if e.get("ph") == "s" and e["name"] == "event"]
    finishes = [e for e in tl.trace()["traceEvents"] if e.get("ph") == "f" and e["name"] == "event"]
    assert [(s["pid"], f["pid"]) for s, f in zip(starts, finishes)] == [(0, 1)]
