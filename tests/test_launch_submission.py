"""A launch is handed to the queue without taking it (DeviceQueue.submit).

`launch_jobplan` checks its arguments, reads their storage addresses and
hands the launch over: the queue enqueues it later, in order, whoever comes
next (a thread that waits or enqueues, or the submission worker). These pin
down what must hold although nothing was enqueued when the call returned.
"""

from __future__ import annotations

import time

import pytest
import torch

from compiler.pointwise_ir import binary_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime import _C, launch
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.queue import StreamError
from spyre_runtime.queue.runtime import current

SHAPE = (48, 40)


@pytest.fixture(scope="module")
def add_plan(tmp_path_factory):
    return prepare_kernel(compile_kernel(binary_kernel("add", SHAPE, "fp32"), tmp_path_factory.mktemp("art")))


def test_a_launch_runs_without_the_host_waiting_for_it(add_plan):
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys, out = x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")
    torch.spyre.synchronize()
    launch_jobplan(add_plan, [xs, ys, out])
    queue = current().queue(0)
    deadline = time.monotonic() + 30
    # Nothing here takes the queue: only the submission worker can enqueue and run it.
    while not (queue.inflight == {} and not queue.submission.submitted) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not queue.submission.submitted and not queue.inflight, "the handed-over launch never ran"
    assert torch.equal(out.cpu(), x + y)


def test_an_input_freed_right_after_its_launch_stays_allocated_until_the_launch_is_done(add_plan):
    from spyre_runtime.queue import Signal, SoftSignal, Wait

    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    ys, out = y.to("spyre"), torch.empty(SHAPE, device="spyre")
    xs = x.to("spyre")
    torch.spyre.synchronize()
    queue, stream = current().queue(0), _C.current_stream_id(0)
    release = SoftSignal()
    queue.enqueue(stream, Wait(release))  # the launch cannot run yet
    allocated = torch.spyre.memory_allocated()
    with queue.lock:  # hold the queue: the launch stays handed over, not enqueued
        launch_jobplan(add_plan, [xs, ys, out])
        assert queue.submission.submitted
        del xs
        assert torch.spyre.memory_allocated() == allocated  # the handed-over launch holds it
    assert not queue.query_stream(stream)  # enqueued now, and it lets go of its arguments
    # Freed, but kept for the launch: it owns sequence numbers the block waits for.
    assert _C.pending_free_bytes(0) >= x.numel() * 4
    queue.enqueue(torch.spyre.Stream().stream_id, Signal(release))
    torch.spyre.synchronize()
    assert _C.pending_free_bytes(0) == 0
    assert torch.equal(out.cpu(), x + y)


def test_an_eager_op_after_a_launch_sees_its_result(add_plan):
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys, out = x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")
    queue = current().queue(0)
    with queue.lock:
        launch_jobplan(add_plan, [xs, ys, out])
    # The copy enqueues the handed-over launch ahead of itself.
    assert torch.equal(out.cpu(), x + y)


def test_a_launch_that_cannot_be_enqueued_stops_its_streams_and_the_device_stays_usable(add_plan, monkeypatch):
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys, out = x.to("spyre"), y.to("spyre"), torch.zeros(SHAPE, device="spyre")
    torch.spyre.synchronize()

    def broken(self):
        raise MemoryError("no pinned staging memory left (test)")

    monkeypatch.setattr(launch._Launch, "runs", broken)
    launch_jobplan(add_plan, [xs, ys, out])
    with pytest.raises(StreamError, match="no pinned staging memory left"):
        torch.spyre.synchronize()
    monkeypatch.undo()
    torch.spyre.clear_errors()
    assert torch.equal(out.cpu(), torch.zeros(SHAPE))  # it never ran
    launch_jobplan(add_plan, [xs, ys, out])
    assert torch.equal(out.cpu(), x + y)


def test_an_argument_freed_on_another_stream_before_the_launch_is_enqueued_is_still_bound(add_plan):
    """The allocator keeps a freed block only for the streams it was used on; a launch on
    another stream holds its arguments itself until it is enqueued (review finding)."""
    from spyre_runtime import tensors

    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys = x.to("spyre"), y.to("spyre")  # allocated on the default stream
    torch.spyre.synchronize()
    side = torch.spyre.Stream()
    queue = current().queue(0)
    with torch.spyre.stream(side):
        out = torch.empty(SHAPE, device="spyre")
        with queue.lock:
            launch_jobplan(add_plan, [xs, ys, out])
            del xs
            tensors._pieces_cache.clear()  # the launch must look its block up as it is now
    torch.spyre.synchronize()
    assert torch.equal(out.cpu(), x + y)


# ---- the queue's side, on a fake device ---------------------------------------------------


def _fake_queue():
    from test_queue_layer import FakeDevice

    return FakeDevice().queue()


class _Record:
    """A submission of one host callback that logs its name."""

    def __init__(self, log, name, stream=1):
        self.log, self.name, self.stream = log, name, stream

    def runs(self):
        from spyre_runtime.queue import HostCallback

        return ((self.stream, (HostCallback(lambda: self.log.append(self.name), name=self.name, cost_ns=1.0),)),)

    def enqueued(self, tickets):
        pass


def test_a_launch_handed_over_during_enqueue_runs_lands_before_its_runs_not_between_them():
    from spyre_runtime.queue import HostCallback

    q, log = _fake_queue(), []
    real = q.submission.take_seq

    def take(n=1):
        q.submit(_Record(log, "other"), (1,))  # another thread hands a launch over right now
        q.submission.take_seq = real
        return real(n)

    q.submission.take_seq = take
    tickets = q.enqueue_runs(((1, [HostCallback(lambda: log.append("a")), HostCallback(lambda: log.append("b"))]),))
    q.synchronize()
    assert log == ["other", "a", "b"]
    assert tickets[1].seq == tickets[0].seq + 1


def test_an_interrupt_while_enqueueing_a_launch_reaches_the_thread_and_fails_the_launchs_stream():
    from spyre_runtime.queue import StreamError

    q = _fake_queue()

    class Interrupted(_Record):
        def runs(self):
            raise KeyboardInterrupt

    with q.lock:
        q.submit(Interrupted([], "interrupted"), (1,))
    with pytest.raises(KeyboardInterrupt):
        q.synchronize()
    with pytest.raises(StreamError, match="could not be enqueued"):
        q.synchronize()


def test_the_submission_worker_comes_back_after_a_failure(monkeypatch):
    import threading

    q, log = _fake_queue(), []

    class Broken(_Record):
        def enqueued(self, tickets):
            raise RuntimeError("enqueued failed (test)")

    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)  # the worker dies of it, on purpose
    q.submit(Broken([], "broken"), (1,))
    first = q.submission.submitter
    first.join(10)
    assert not first.is_alive() and "enqueued failed" in str(died[0].exc_value)
    q.submit(_Record(log, "good"), (1,))
    deadline = time.monotonic() + 10
    while log != ["good"] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert log == ["good"], "a launch handed over after the failure was never enqueued"


def _names_of_launches(plan, calls):
    """The names of the operations `calls` launches of `plan` enqueue, in order."""
    from spyre_runtime.queue.timeline import Timeline

    queue = current().queue(0)
    torch.spyre.synchronize()
    with Timeline([queue]) as timeline:
        for args in calls:
            launch_jobplan(plan, args)
            torch.spyre.synchronize()
    return ["patch" if t.name.startswith(plan.patch_name) else t.name for _, t in timeline.tickets]


def test_a_relaunch_on_the_same_buffers_does_not_patch_again(add_plan):
    # Each correction area already holds the slot words once its patch is done: a loop that
    # relaunches on the same buffers is its computes alone, after one patch per area.
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys, out = x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")
    names = _names_of_launches(add_plan, [[xs, ys, out]] * 6)
    assert names.count(add_plan.name) == 6
    assert 1 <= names.count("patch") <= len(add_plan.areas)  # (they may hold an earlier test's words)
    computes = [k for k, n in enumerate(names) if n == add_plan.name]
    assert "patch" not in names[computes[len(add_plan.areas) - 1]:]  # none after each area's first
    assert torch.equal(out.cpu(), x + y)


def test_other_buffers_patch_the_area_again_and_each_launch_reads_its_own(add_plan):
    xs = [torch.randn(SHAPE).to("spyre") for _ in range(3)]
    outs = [torch.empty(SHAPE, device="spyre") for _ in range(3)]
    torch.spyre.synchronize()
    calls = [[xs[k % 3], xs[(k + 1) % 3], outs[k % 3]] for k in range(9)]
    names = _names_of_launches(add_plan, calls)
    # No two launches in a row share an area with the same words: every one patches.
    assert names.count("patch") == 9
    for k in range(3):
        assert torch.equal(outs[k].cpu(), xs[k].cpu() + xs[(k + 1) % 3].cpu())


def test_a_relaunch_after_a_failed_patch_patches_again(add_plan, monkeypatch):
    # The failed patches had the relaunch's very words: only their failing (not other words)
    # says the areas may not hold them.
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    xs, ys, out = x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")
    other = torch.empty(SHAPE, device="spyre")
    launch_jobplan(add_plan, [xs, ys, other])  # both areas hold other words
    launch_jobplan(add_plan, [xs, ys, other])
    torch.spyre.synchronize()
    engine = type(current().queue(0).data_movement)
    real = engine.run

    def failing_patch(self, transfer):
        if transfer.label == add_plan.patch_name:
            raise RuntimeError("injected patch failure")
        return real(self, transfer)
    monkeypatch.setattr(engine, "run", failing_patch)
    for _ in range(2):  # patch both areas with the relaunch's words, failing
        launch_jobplan(add_plan, [xs, ys, out])
    with pytest.raises(StreamError):
        torch.spyre.synchronize()
    torch.spyre.clear_errors()
    monkeypatch.undo()
    out.zero_()
    names = _names_of_launches(add_plan, [[xs, ys, out]] * 2)
    assert names.count("patch") == 2
    assert torch.equal(out.cpu(), x + y)


def test_host_values_in_other_places_patch_again():
    # Two launches whose device arguments and value words are the same, but whose host value
    # stands for another 0-d input: their slot words differ (which slot is a value stick), so
    # the second must patch the area the first left.
    import gc

    from spyre_runtime.prepare import JobPlan

    before = {id(o) for o in gc.get_objects() if type(o) is JobPlan}
    fn = torch.compile(lambda c, a, b: torch.where(c, a, b))
    c = torch.tensor([True, False] * 32)
    zero, five = torch.tensor(0.0), torch.tensor(5.0)
    cs = c.to("spyre")
    fn(cs, zero.to("spyre"), five.to("spyre"))
    torch.spyre.synchronize()
    (plan,) = [o for o in gc.get_objects() if type(o) is JobPlan and id(o) not in before and o.values]
    assert [a.shape for a in plan.args[:3]] == [(64,), (), ()]
    x = five.to("spyre")
    outs = []
    for args in ([cs, zero, x], [cs, zero, x], [cs, x, zero]):  # the third: the first's area again
        out = torch.empty(64, device="spyre")
        launch_jobplan(plan, [*args, out])
        torch.spyre.synchronize()
        outs.append(out.cpu())
    assert torch.equal(outs[0], torch.where(c, 0.0, 5.0)) and torch.equal(outs[2], torch.where(c, 5.0, 0.0))


def test_a_host_value_travels_as_its_value_and_a_bad_one_is_named():
    import gc

    from spyre_runtime.binding import LaunchError
    from spyre_runtime.prepare import JobPlan

    before = {id(o) for o in gc.get_objects() if type(o) is JobPlan}
    fn = torch.compile(lambda c, a, b: torch.where(c, a, b))
    c = torch.tensor([True, False] * 32)
    cs = c.to("spyre")
    fn(cs, torch.tensor(1.0).to("spyre"), torch.tensor(3.0).to("spyre"))
    torch.spyre.synchronize()
    (plan,) = [o for o in gc.get_objects() if type(o) is JobPlan and id(o) not in before and o.values]
    out = torch.empty(64, device="spyre")
    launch_jobplan(plan, [cs, torch._neg_view(torch.tensor(2.0)), torch.tensor(3.0), out])  # -2.0 by its bit
    assert torch.equal(out.cpu(), torch.where(c, -2.0, 3.0))
    with pytest.raises(LaunchError, match=r"argument 2 \('b2', input\): expected a tensor, got float"):  # not argument 1
        launch_jobplan(plan, [cs, torch.tensor(0.0), 5.0, out])
