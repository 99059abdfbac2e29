"""A launch on two streams: the patch on a preparation stream, the fetch and compute on the caller's.

What prepare_kernel resolves once and what a launch still checks, the two
correction areas launches alternate between, and the rules that keep a
launch's compute from ever running on addresses that are not its own.
"""

from __future__ import annotations

import pytest
import torch

from compiler.pointwise_ir import binary_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime import _C, launch
from spyre_runtime.binding import slot_words
from spyre_runtime.launch import launch_jobplan, preparation_stream, set_preparation_streams
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.queue import HostCallback, Signal, SoftSignal, StreamError, Wait
from spyre_runtime.queue.runtime import current

SHAPE = (48, 40)


@pytest.fixture(scope="module")
def add_plan(tmp_path_factory):
    return prepare_kernel(compile_kernel(binary_kernel("add", SHAPE, "fp32"), tmp_path_factory.mktemp("art")))


@pytest.fixture
def streams():
    """Restores the configured number of preparation streams after a test changes it."""
    before = launch.preparation_streams()
    yield set_preparation_streams
    set_preparation_streams(before)


def operands(seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    return x, y, x.to("spyre"), y.to("spyre"), torch.empty(SHAPE, device="spyre")


def _area(plan, k) -> torch.Tensor:
    area = plan.areas[k]
    offset = area.address.offset - plan.artifact.offset
    return _C.host_alias(plan.allocation)[offset: offset + 16 * len(plan.program.placeholders)].view(torch.int64)


def test_the_patch_runs_on_a_preparation_stream_of_the_launching_stream(add_plan):
    stream = _C.current_stream_id(0)
    prep = preparation_stream(0, stream)
    assert prep != stream and preparation_stream(0, stream) == prep  # one per stream, made once
    side = torch.spyre.Stream()
    assert preparation_stream(0, side.stream_id) not in (prep, side.stream_id)


def test_launches_alternate_between_two_correction_areas(add_plan):
    x, y, xs, ys, out = operands(1)
    torch.spyre.synchronize()
    first = next(add_plan.turns) % 2  # (peek: the next launch uses the other one)
    launch_jobplan(add_plan, [xs, ys, out])
    torch.spyre.synchronize()
    used = _area(add_plan, 1 - first).clone()
    x2, y2, xs2, ys2, out2 = operands(2)
    launch_jobplan(add_plan, [xs2, ys2, out2])
    torch.spyre.synchronize()
    assert torch.equal(_area(add_plan, 1 - first), used)  # the second launch patched the other area
    assert not torch.equal(_area(add_plan, first), used)
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    torch.testing.assert_close(out2.cpu(), x2 + y2, rtol=0, atol=0)


def test_an_area_is_patched_again_only_after_the_compute_that_read_it(add_plan):
    """Three launches while the compute stream is held: the first two patches go ahead (two
    areas), the third waits for the first compute, which reads the area it would overwrite."""
    stream = _C.current_stream_id(0)
    q = current().queue(0)
    runs = [operands(10 + k) for k in range(3)]
    torch.spyre.synchronize()
    release = SoftSignal()
    q.enqueue(stream, Wait(release))
    start = next(add_plan.turns)  # launches k = 1, 2, 3 use area (start + k) % 2
    for *_, xs, ys, out in runs:
        launch_jobplan(add_plan, [xs, ys, out])
    assert not q.query_stream(stream)  # (enqueues the launches handed over: the patches that can run do)
    reused = (start + 1) % 2
    words = [slot_words(r[2:]) for r in runs]
    assert _area(add_plan, reused).tolist() == words[0]  # launch 3 has not overwritten launch 1's
    assert _area(add_plan, 1 - reused).tolist() == words[1]
    q.enqueue(torch.spyre.Stream().stream_id, Signal(release))
    torch.spyre.synchronize()
    for x, y, _, _, out in runs:
        torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    assert _area(add_plan, reused).tolist() == words[2]


def test_a_failed_patch_skips_the_compute_instead_of_running_it_on_stale_addresses(add_plan):
    x, y, xs, ys, out = operands(3)
    out.zero_()
    torch.spyre.synchronize()
    prep = preparation_stream(0, _C.current_stream_id(0))

    def boom():
        raise RuntimeError("the preparation stream broke")

    current().queue(0).enqueue(prep, HostCallback(boom, name="broken"))  # the patch behind it is skipped
    launch_jobplan(add_plan, [xs, ys, out])
    with pytest.raises(StreamError, match=r"\(add_fp32\) failed: .*patch correction area.* did not complete"):
        torch.spyre.current_stream().synchronize()
    assert torch.count_nonzero(_C.host_alias(out)) == 0  # the program never ran
    torch.spyre.clear_errors()
    launch_jobplan(add_plan, [xs, ys, out])
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_one_or_several_preparation_streams_give_the_same_results(add_plan, streams, n):
    streams(n)
    results = []
    for seed in range(6):
        x, y, xs, ys, out = operands(20 + seed)
        launch_jobplan(add_plan, [xs, ys, out])
        results.append((x + y, out))
    torch.spyre.synchronize()
    for want, out in results:
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)


def test_a_compiled_function_gives_identical_bits_on_one_stream_and_on_two(streams):
    def f(a, b):
        return torch.softmax(a @ b, dim=-1) * 3 - a.sum(-1, keepdim=True)

    a, b = torch.randn(32, 64), torch.randn(64, 64)
    compiled = torch.compile(f, dynamic=False)
    got = {}
    for n in (0, 1):
        streams(n)
        got[n] = compiled(a.to("spyre"), b.to("spyre")).cpu()
    assert torch.equal(got[0], got[1])
    torch.testing.assert_close(got[1], f(a, b), rtol=1e-5, atol=1e-5)


def test_bad_settings_are_refused_naming_the_limit(streams):
    with pytest.raises(ValueError, match=r"integer in 0\.\.8, got 9"):
        streams(9)
    with pytest.raises(ValueError, match="got True"):
        streams(True)


def test_preparing_on_every_launch_the_old_way_gives_the_same_results(add_plan):
    x, y, xs, ys, out = operands(4)
    launch.set_prepare_each_launch(True)
    try:
        launch_jobplan(add_plan, [xs, ys, out])
    finally:
        launch.set_prepare_each_launch(False)
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


def test_a_compute_run_by_a_synchronizing_thread_ignores_that_threads_torch_modes():
    """A thread that synchronizes runs ready computes itself: under its default device of spyre
    the simulator's scratchpad became device memory and its first copy waited behind the very
    compute running it (a hang, found in review); under inference mode the scratchpad bank,
    which outlives the run, became an inference tensor."""
    def f(a, b):
        return a * 2 + b

    compiled = torch.compile(f, dynamic=False)
    a, b = torch.randn(16, 64), torch.randn(16, 64)
    torch.set_default_device("spyre")
    try:
        out = compiled(a.to("spyre"), b.to("spyre"))
        torch.spyre.synchronize()
    finally:
        torch.set_default_device(None)  # (not "cpu": that leaves a device mode on, which fills in device=cpu)
    assert torch.equal(out.cpu(), f(a, b))
    with torch.inference_mode():
        out = compiled(a.to("spyre"), b.to("spyre"))
        torch.spyre.synchronize()
    out = compiled(a.to("spyre"), b.to("spyre"))
    torch.spyre.synchronize()
    assert torch.equal(out.cpu(), f(a, b))


def test_a_failed_patch_names_the_kernel(add_plan):
    x, y, xs, ys, out = operands(5)
    torch.spyre.synchronize()
    prep = preparation_stream(0, _C.current_stream_id(0))
    current().queue(0).enqueue(prep, HostCallback(lambda: 1 / 0, name="broken"))
    launch_jobplan(add_plan, [xs, ys, out])
    with pytest.raises(StreamError, match=r"add_fp32: patch correction area: h2d \d+ B .* did not complete"):
        torch.spyre.current_stream().synchronize()
    torch.spyre.clear_errors()


def test_a_kernel_prepared_on_a_failed_stream_loads_its_program_when_next_launched(tmp_path):
    """Preparing transfers the program image on the current stream: on a stream that had failed
    the transfer is skipped, and the image was never written (a launch on any stream then read
    it as if it had been). The next launch loads it again, on its own stream, and runs."""
    side = torch.spyre.Stream()
    current().queue(0).enqueue(side.stream_id, HostCallback(lambda: 1 / 0, name="broken"))
    with torch.spyre.stream(side):
        plan = prepare_kernel(compile_kernel(binary_kernel("mul", SHAPE, "fp32"), tmp_path))
    with pytest.raises(StreamError, match="broken"):
        side.synchronize()
    x, y, xs, ys, out = operands(6)
    launch_jobplan(plan, [xs, ys, out])  # on the default stream, with no clear_errors()
    torch.testing.assert_close(out.cpu(), x * y, rtol=0, atol=0)
    image = plan.program.image()
    start = plan.program.allocation_bytes
    assert bytes(_C.host_alias(plan.allocation)[start:start + len(image)].numpy()) == bytes(image)
    torch.spyre.clear_errors()
