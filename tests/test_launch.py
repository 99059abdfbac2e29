"""The launch layer: prepare_kernel once, launch_jobplan per call, on the current stream, asynchronously."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from compiler.pointwise_ir import KernelBuilder, binary_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime.binding import LaunchError
from spyre_runtime.launch import launch_jobplan, release_plan
from spyre_runtime.prepare import HoldFetch, PatchCorrectionArea, ResolveAddresses, RunProgram, prepare_kernel
from spyre_runtime.queue import HostCallback, Signal, SoftSignal, Wait
from spyre_runtime.queue.runtime import current
from spyre_runtime import _C

SHAPE = (67, 71)


@pytest.fixture(scope="module")
def add_plan(tmp_path_factory):
    return prepare_kernel(compile_kernel(binary_kernel("add", SHAPE, "fp32"), tmp_path_factory.mktemp("art")))


def operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    return x, y, x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")


def test_plan_has_ordered_typed_steps(add_plan):
    assert [type(s) for s in add_plan.steps] == [ResolveAddresses, PatchCorrectionArea, HoldFetch, RunProgram]
    assert [(a.name, a.role, a.dtype, a.shape, a.stride) for a in add_plan.args] == [
        ("x", "input", torch.float32, SHAPE, (71, 1)), ("y", "input", torch.float32, SHAPE, (71, 1)),
        ("out", "output", torch.float32, SHAPE, (71, 1))]


def test_launch_many_times_with_different_arguments(add_plan):
    results = []
    for seed in range(4):
        x, y, xs, ys, out = operands(seed)
        launch_jobplan(add_plan, [xs, ys, out])  # no synchronize between launches
        results.append((x + y, out))
    torch.spyre.synchronize()
    for want, out in results:
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)


def test_launch_does_not_block_and_orders_on_the_current_stream(add_plan):
    x, y, xs, ys, out = operands(5)
    out.zero_()
    torch.spyre.synchronize()
    gate = threading.Event()
    q, stream = current().queue(0), _C.current_stream_id(0)
    q.enqueue(stream, HostCallback(lambda: gate.wait(30), name="gate"))
    launch_jobplan(add_plan, [xs, ys, out])  # returns while the stream is held
    assert torch.count_nonzero(_C.host_alias(out)) == 0  # nothing ran yet
    gate.set()
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


def test_launch_on_a_side_stream_is_ordered_against_the_producer(add_plan):
    x, y, xs, ys, out = operands(6)
    side = torch.spyre.Stream()
    with torch.spyre.stream(side):
        launch_jobplan(add_plan, [xs, ys, out])
    side.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


@pytest.mark.parametrize("bad,match", [
    (lambda a: a[:2], "takes 3 argument"),
    (lambda a: [a[0].half(), a[1], a[2]], r"argument 0 \('x', input\): expected dtype torch.float32"),
    (lambda a: [a[0], a[1][:5], a[2]], r"argument 1 \('y', input\): expected shape"),
    (lambda a: [a[0], a[1], a[2].t().contiguous().t()], r"argument 2 \('out', output\): expected strides"),
    (lambda a: [a[0].cpu(), a[1], a[2]], r"argument 0 \('x', input\): expected a tensor on spyre:0"),
])
def test_bad_arguments_raise_naming_the_argument_and_leave_the_device_usable(add_plan, bad, match):
    x, y, xs, ys, out = operands(7)
    with pytest.raises(LaunchError, match=match):
        launch_jobplan(add_plan, bad([xs, ys, out]))
    launch_jobplan(add_plan, [xs, ys, out])
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


def test_an_output_overlapping_an_input_is_refused_unless_it_is_the_same_tensor(add_plan):
    x, y, xs, ys, out = operands(8)
    both = torch.empty((2 * SHAPE[0], SHAPE[1]), device="spyre")
    both[: SHAPE[0]].copy_(xs)
    shifted = both[1: SHAPE[0] + 1]  # shares all but one row with the input
    with pytest.raises(LaunchError, match=r"argument 2 \('out', output\) overlaps argument 0 \('x', input\)"):
        launch_jobplan(add_plan, [both[: SHAPE[0]], ys, shifted])
    launch_jobplan(add_plan, [xs, ys, xs])  # in place: the same tensor in both roles
    torch.spyre.synchronize()
    torch.testing.assert_close(xs.cpu(), x + y, rtol=0, atol=0)


def test_a_launch_that_fails_on_the_device_leaves_it_usable(tmp_path, add_plan):
    k = KernelBuilder("idiv", (64,))
    for name in ("a", "b", "out"):
        k.buffer(name, "int32", (64,))
    k.store("out", k.op("floordiv", k.load("a"), k.load("b"), dtype="int32"))
    plan = prepare_kernel(compile_kernel(k.build(), tmp_path))
    a = torch.arange(64, dtype=torch.int32).to("spyre")
    zero = torch.zeros(64, dtype=torch.int32).to("spyre")
    out = torch.empty(64, dtype=torch.int32, device="spyre")
    torch.spyre.synchronize()
    launch_jobplan(plan, [a, zero, out])  # integer division by zero fails inside the program
    with pytest.raises(RuntimeError, match="idiv"):
        torch.spyre.synchronize()
    torch.spyre.clear_errors()
    x, y, xs, ys, res = operands(8)
    launch_jobplan(add_plan, [xs, ys, res])
    two = torch.full((64,), 2, dtype=torch.int32).to("spyre")
    launch_jobplan(plan, [a, two, out])
    torch.spyre.synchronize()
    torch.testing.assert_close(res.cpu(), x + y, rtol=0, atol=0)
    assert torch.equal(out.cpu(), torch.arange(64, dtype=torch.int32) // 2)


def test_prepare_validates_the_program(tmp_path):
    d = compile_kernel(binary_kernel("mul", (64,), "fp32"), tmp_path)
    text = (d / "program.json").read_text()
    (d / "program.json").write_text(text.replace('"mul"', '"add"', 1))
    with pytest.raises(ValueError, match="checksum"):
        prepare_kernel(d)


def _edit_json(path, edit):
    """Edit an artifact's JSON file and keep the artifact consistent (the launch spec records the
    size and sha256 of the files it names): a wrong artifact as a buggy compiler would write it,
    which only the checks against the program can refuse."""
    import hashlib
    import json

    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    spec_path = path.parent / "launch_spec.json"
    spec = json.loads(spec_path.read_text())
    if path.name in spec.get("files", {}):
        data = path.read_bytes()
        spec["files"][path.name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        spec_path.write_text(json.dumps(spec))


def test_an_incomplete_or_malformed_artifact_is_refused_naming_it(tmp_path):
    d = compile_kernel(binary_kernel("mul", (64,), "fp32"), tmp_path)
    (d / "execution_plan.json").unlink()
    with pytest.raises(ValueError, match="not a complete spyre artifact: .*execution_plan.json is missing"):
        prepare_kernel(d)
    d = compile_kernel(binary_kernel("sub", (64,), "fp32"), tmp_path / "b")
    _edit_json(d / "launch_spec.json", lambda doc: doc.pop("args"))
    with pytest.raises(ValueError, match="malformed artifact .*args"):
        prepare_kernel(d)
    with pytest.raises(ValueError, match="device must be a spyre device index"):
        prepare_kernel(d, device=7)


def test_a_launch_spec_that_disagrees_with_its_program_is_refused(tmp_path):
    # The spec and the execution plan are outside the program's checksum: a stale or edited
    # one must not bind arguments to the wrong placeholders or patch the wrong bytes.
    d = compile_kernel(binary_kernel("mul", (64,), "fp32"), tmp_path)
    _edit_json(d / "launch_spec.json", lambda doc: doc["args"][0].update(shape=[32, 2], stride=[2, 1]))
    with pytest.raises(ValueError, match="slot 0 binds argument 0"):
        prepare_kernel(d)
    d = compile_kernel(binary_kernel("sub", (64,), "fp32"), tmp_path / "b")
    _edit_json(d / "execution_plan.json",
               lambda doc: next(s for s in doc["steps"] if s["kind"] == "compute").update(writes=[]))
    with pytest.raises(ValueError, match="compute writes arguments \\[\\], the launch spec's outputs are \\[2\\]"):
        prepare_kernel(d)


def test_arguments_must_be_a_list_of_tensors(add_plan):
    x, y, xs, ys, out = operands(6)
    with pytest.raises(LaunchError, match="must be a list of tensors"):
        launch_jobplan(add_plan, xs)


@pytest.mark.parametrize("edit,match", [
    (lambda steps: [s for s in steps if s["kind"] != "barrier"], "a launch is exactly"),
    (lambda steps: steps + [dict(steps[-1])], "a launch is exactly"),
    (lambda steps: [steps[0], steps[2], steps[1], steps[3]], "a launch is exactly"),
])
def test_an_execution_plan_of_another_shape_is_refused(tmp_path, edit, match):
    """Without its barrier the fetch reads unpatched addresses; a second compute would run on
    them unpatched; reordered steps patch after the fetch. prepare_kernel accepted all three
    and the launches then ran wrongly."""
    d = compile_kernel(binary_kernel("mul", (64,), "fp32"), tmp_path)
    _edit_json(d / "execution_plan.json", lambda doc: doc.update(steps=edit(doc["steps"])))
    with pytest.raises(ValueError, match=match):
        prepare_kernel(d)


def test_a_program_json_that_is_a_directory_is_refused_naming_it(tmp_path):
    d = compile_kernel(binary_kernel("mul", (64,), "fp32"), tmp_path)
    (d / "program.json").unlink()
    (d / "program.json").mkdir()
    with pytest.raises(ValueError, match=r"program.json.* is a directory"):
        prepare_kernel(d)


def test_a_storage_resized_to_zero_under_an_argument_is_refused_at_the_launch(add_plan):
    """Before, the launch passed its checks and the program then failed on the device naming
    a nonsense region handle, leaving the stream in error."""
    x, y, xs, ys, out = operands(9)
    ys.untyped_storage().resize_(0)
    with pytest.raises(LaunchError, match=r"argument 1 \('y', input\): its storage holds 0 bytes"):
        launch_jobplan(add_plan, [xs, ys, out])
    small = torch.empty(SHAPE, device="spyre")
    small.untyped_storage().resize_(64)
    with pytest.raises(LaunchError, match=r"argument 2 \('out', output\): its storage holds 64 bytes"):
        launch_jobplan(add_plan, [xs, xs, small])
    torch.spyre.synchronize()  # nothing was enqueued: the stream is fine
    launch_jobplan(add_plan, [xs, xs, out])
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + x, rtol=0, atol=0)


def test_a_launch_does_not_wait_for_unrelated_work_on_other_streams(add_plan):
    """The fetch barrier holds only the program's own memory: before, every launch waited for
    everything enqueued earlier on every stream (an independent kernel waited behind another
    stream's copies, and one stuck stream stalled every launch until the wait timeout)."""
    x, y, xs, ys, out = operands(10)
    other = torch.zeros(SHAPE).to("spyre")
    torch.spyre.synchronize()
    stuck = torch.spyre.Stream()
    release = SoftSignal()
    current().queue(0).enqueue(stuck.stream_id, Wait(release))  # held until we signal
    with torch.spyre.stream(stuck):
        other.copy_(xs, non_blocking=True)  # unrelated work queued behind the wait
    launch_jobplan(add_plan, [xs, ys, out])
    deadline = time.monotonic() + 10
    finished = False
    while not finished and time.monotonic() < deadline:
        finished = torch.spyre.current_stream().query()
        time.sleep(0.001)
    current().queue(0).enqueue(torch.spyre.Stream().stream_id, Signal(release))
    stuck.synchronize()
    assert finished, "the launch waited for an unrelated stream"
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    torch.testing.assert_close(other.cpu(), x, rtol=0, atol=0)


def test_a_released_plan_gives_its_memory_back_once_its_launches_are_done(tmp_path):
    """release_plan does not wait: a launch still held on a side stream (not the stream the plan was
    prepared on) keeps the program's bytes until it has run, then they come back."""
    plan = prepare_kernel(compile_kernel(binary_kernel("add", SHAPE, "fp32"), tmp_path))
    nbytes = plan.allocation.untyped_storage().nbytes()
    x, y, xs, ys, out = operands(9)
    torch.spyre.synchronize()
    q, side, gate = current().queue(0), torch.spyre.Stream(), SoftSignal()
    q.enqueue(side.stream_id, Wait(gate))
    with torch.spyre.stream(side):
        launch_jobplan(plan, [xs, ys, out])  # held behind the gate
    held = torch.spyre.memory_allocated()
    release_plan(plan)
    assert torch.spyre.memory_allocated() == held  # its launch may still fetch the program
    with pytest.raises(LaunchError, match="released"):
        launch_jobplan(plan, [xs, ys, out])
    q.enqueue(torch.spyre.Stream().stream_id, Signal(gate))
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)  # it ran on its program, intact
    assert torch.spyre.memory_allocated() <= held - nbytes
