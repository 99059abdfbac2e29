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
from spyre_runtime.launch import launch_jobplan, prepare_kernel
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
    while not (queue.inflight == {} and not queue._submitted) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not queue._submitted and not queue.inflight, "the handed-over launch never ran"
    assert torch.equal(out.cpu(), x + y)


def test_an_input_freed_right_after_its_launch_stays_allocated_until_the_launch_is_done(add_plan):
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    ys, out = y.to("spyre"), torch.empty(SHAPE, device="spyre")
    xs = x.to("spyre")
    torch.spyre.synchronize()
    queue = current().queue(0)
    with queue.lock:  # hold the queue: the launch stays handed over, not enqueued
        launch_jobplan(add_plan, [xs, ys, out])
        assert queue._submitted
        del xs
        # The launch owns its sequence numbers already, so the freed block waits for it.
        assert _C.pending_free_bytes(0) >= x.numel() * 4
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
