"""torch.profiler on spyre: the Python side of the Kineto plugin (spyre_runtime/csrc/profiler.cpp).

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.SPYRE])`` (SPYRE is
PyTorch's name for the PrivateUse1 activity of a device called spyre) starts a session: every
device operation completed until it stops is recorded (a Timeline over every device's queue),
with the correlation id of the CPU op that enqueued it. When the trace is processed each becomes
a Kineto activity: a program launch a kernel, a transfer a memcpy, a host operation (an eager op's
CPU fallback, a launch's address patch) a runtime event, on the device's track, one per pipeline.

Two clocks: an activity starts at the host time its operation started running in the simulator,
and lasts its SIMULATED duration (the card's time, not the host's), so key_averages() shows
device time as the card would take it; its simulated start and host duration are in its args.
"""

from __future__ import annotations

import time

from spyre_runtime import _C
from spyre_runtime.queue import stream_graph
from spyre_runtime.queue.workers import PIPELINES

from . import queues

_KIND = {"compute": "kernel", "h2d": "memcpy", "d2h": "memcpy", "d2d": "memcpy", "host": "runtime", "link": "kernel"}
_TRACK = {name: k for k, name in enumerate(PIPELINES)}

_session: dict = {}


def _start() -> None:
    _stop()  # (a session that was never stopped lets go of the queues first)
    _session["records"] = None
    timeline = queues.timeline()
    timeline.__enter__()
    # perf_counter_ns (the tickets' host clock) -> the wall clock Kineto's events are on
    _session.update(timeline=timeline, offset=time.time_ns() - time.perf_counter_ns())
    stream_graph.correlation_source = _C.profiler_correlation


def _stop() -> None:
    stream_graph.correlation_source = None
    timeline = _session.pop("timeline", None)
    if timeline is None:
        return
    try:
        timeline.__exit__(None, None, None)  # (synchronizes: what was enqueued is in the trace)
    finally:  # (the recorders are detached whatever happens: they would grow with every operation)
        _session["records"] = activities(timeline, _session["offset"])


def _collect() -> list:
    records = _session.get("records") or []
    _session["records"] = None
    return records


def activities(timeline, offset_ns: int) -> list[tuple]:
    """(name, kind, device, track, start ns, end ns, correlation id, {arg: text}) of each recorded
    operation that ran on a pipeline (control operations take no time on the card)."""
    out = []
    for device, t in timeline.tickets:
        pipeline = t.pipeline.split(":")[0]  # (the link's lanes are on its track)
        kind = _KIND.get(pipeline)
        if kind is None or not t.host_start:
            continue
        start = t.host_start + offset_ns
        simulated = max(t.sim_end - t.sim_start, 0.0)
        out.append((t.name, kind, device, _TRACK[pipeline], start, start + int(round(simulated)), t.correlation,
                    {"pipeline": t.pipeline, "stream": str(t.stream.id), "simulated start us": f"{t.sim_start / 1e3:.3f}",
                     "simulated us": f"{simulated / 1e3:.3f}", "host us": f"{(t.host_end - t.host_start) / 1e3:.1f}",
                     "status": "failed" if t.error else ("skipped" if t.skipped else "ok"),
                     "duration clock": "host wall time" if t.wall_clock else "simulated"}))
    return out


def install() -> None:
    _C.set_profiler_hooks(_start, _stop, _collect)
