"""torch.profiler on spyre (device/profiler.py, spyre_runtime/csrc/profiler.cpp: a Kineto plugin
registered through PyTorch's PrivateUse1ProfilerRegistry). Each launch, eager op and transfer is
a device event whose duration is its simulated time on the card, counted as device time of the
CPU op that enqueued it in key_averages(), and exported in the Chrome trace on spyre's tracks."""

from __future__ import annotations

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from spyre_runtime.queue import stream_graph


@pytest.fixture(autouse=True)
def strict():
    """Every profiled op here runs as a spyre program: a CPU fallback raises instead of being profiled."""
    from spyre_inductor.device.fallback import strict_mode

    with strict_mode(True):
        yield


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


@pytest.fixture
def compiled():
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: torch.relu(x @ w) + 1)
    x, w = torch.randn(64, 128, device="spyre"), torch.randn(128, 64, device="spyre")
    f(x, w)
    torch.spyre.synchronize()
    yield f, x, w
    torch._dynamo.reset()


def test_spyre_is_a_profiler_activity():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()
    assert ProfilerActivity.SPYRE == ProfilerActivity.PrivateUse1  # (PyTorch names it after the device)


def test_a_launch_is_a_device_event_lasting_its_simulated_time(compiled, tmp_path):
    f, x, w = compiled
    torch.spyre.reset_kernel_reports()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.SPYRE]) as prof:
        f(x, w)
        torch.spyre.synchronize()
    report, = torch.spyre.kernel_reports()
    kernels = [e for e in _device_events(prof) if e.name == report.name]
    assert len(kernels) == 1
    assert kernels[0].time_range.elapsed_us() == pytest.approx(report.simulated_us, abs=1e-3)
    # counted as device time of the compiled region that launched it
    region = next(e for e in prof.key_averages() if e.key.startswith("Torch-Compiled Region"))
    assert region.device_time_total == pytest.approx(report.simulated_us, abs=0.01)  # (+ its 128 B patch)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernel = next(e for e in events if e.get("name") == report.name)
    assert kernel["cat"] == "kernel" and kernel["pid"] == 0
    assert float(kernel["args"]["simulated us"]) == pytest.approx(report.simulated_us, abs=1e-3)
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("pid") == 0
             and e["name"] in ("process_name", "thread_name")}
    assert {"spyre:0", "pipeline compute"} <= names


def test_eager_ops_and_transfers_carry_their_device_time():
    x = torch.randn(1000)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.SPYRE]) as prof:
        y = x.to("spyre")
        z = (y * 2).cpu()
    assert torch.equal(z, x * 2)
    kinds = {e.name.split(":")[0] for e in _device_events(prof)}
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mul"].device_time_total > 0  # its program, linked to the op that enqueued it
    copies = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1 and "h2d" in e.name]
    assert copies and all(e.time_range.elapsed_us() > 0 for e in copies), kinds


def test_work_on_another_stream_and_thread_is_recorded(tmp_path):
    import threading

    x = torch.randn(256, device="spyre")
    torch.spyre.synchronize()  # (x's own program runs before the profile)
    s = torch.spyre.Stream()
    done = []

    def work():
        with torch.spyre.stream(s):
            done.append((x + 1).sum())

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.SPYRE]) as prof:
        t = threading.Thread(target=work)
        t.start()
        t.join()
        torch.spyre.synchronize()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("spyre_")]
    assert kernels and all(e["args"]["stream"] == str(s.stream_id) for e in kernels)
    assert done[0].item() == pytest.approx((x + 1).sum().item())


def test_a_cpu_only_profile_records_no_spyre_work():
    x = torch.randn(256, device="spyre")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x * 3).sum().item()
    assert not _device_events(prof)
    assert stream_graph.correlation_source is None  # nothing is kept per enqueue outside a session
