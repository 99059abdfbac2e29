"""A run's simulated timeline as Chrome trace / Perfetto JSON.

One process per device; one track per pipeline and one per stream; flow
arrows for event waits and derived (footprint) edges. Times are simulated
device time (microseconds in the file); host wall times are in each slice's
args. An operation the card does not run (a host callback: an eager op's CPU
fallback, a launch's address patch) has no simulated cost unless it declares
one: it lasts its host wall time there, on the track named for that clock, and
its args say which clock its duration is on.
"""

from __future__ import annotations

import json
from pathlib import Path

from .device_queue import DeviceQueue
from .tickets import Ticket
from .workers import PIPELINES

_PIPELINE_TID = {name: i + 1 for i, name in enumerate(PIPELINES)}
_STREAM_TID0 = 100


class Timeline:
    """Collect every operation completed while active; write the trace on exit."""

    def __init__(self, queues: list[DeviceQueue], path: str | Path | None = None):
        self.queues = queues
        self.path = Path(path) if path is not None else None
        self.tickets: list[tuple[int, Ticket]] = []
        self._recorders: list[list[Ticket]] = []

    def __enter__(self) -> Timeline:
        for q in self.queues:
            rec: list[Ticket] = []
            with q.lock:
                q.recorders.append(rec)
            self._recorders.append(rec)
        return self

    def __exit__(self, *exc) -> None:
        for q, rec in zip(self.queues, self._recorders):
            try:
                q.synchronize()
            except Exception:  # noqa: BLE001 - a failed stream still gets its trace
                pass
            with q.lock:
                q.recorders.remove(rec)
            self.tickets.extend((q.device, t) for t in rec)
        if self.path is not None:
            self.path.write_text(json.dumps(self.trace()))

    def trace(self) -> dict:
        events: list[dict] = []
        devices = sorted({d for d, _ in self.tickets})
        for d in devices:
            events.append(_meta("process_name", d, 0, {"name": f"spyre:{d}"}))
            for name, tid in _PIPELINE_TID.items():
                label = f"pipeline {name}" + (" (host wall time)" if name == "host" else "")
                events.append(_meta("thread_name", d, tid, {"name": label}))
        streams = sorted({(d, t.stream.id) for d, t in self.tickets})
        for d, sid in streams:
            events.append(_meta("thread_name", d, _STREAM_TID0 + sid, {"name": f"stream {sid}"}))
        flow = 0
        for d, t in self.tickets:
            args = {
                "seq": t.seq,
                "stream": t.stream.id,
                "host_us": (t.host_end - t.host_start) / 1e3,
                "status": "failed" if t.error else ("skipped" if t.skipped else "ok"),
                "duration clock": "host wall time" if t.wall_clock else "simulated",
            }
            for tid in (_PIPELINE_TID.get(t.pipeline.split(":")[0]), _STREAM_TID0 + t.stream.id):
                if tid is None:  # control operations appear on their stream only
                    continue
                events.append({
                    "name": t.name, "ph": "X", "pid": d, "tid": tid, "cat": t.pipeline,
                    "ts": t.sim_start / 1e3, "dur": max(t.sim_end - t.sim_start, 0.0) / 1e3, "args": args,
                })
            for source, why in t.edges:
                if why not in ("event", "derived"):
                    continue
                flow += 1
                # An event edge may come from another device (a cross-device wait).
                events.append({"name": why, "ph": "s", "id": flow, "pid": source.device if source.device >= 0 else d,
                               "tid": _STREAM_TID0 + source.stream.id, "ts": source.sim_end / 1e3, "cat": "edge"})
                events.append({"name": why, "ph": "f", "bp": "e", "id": flow, "pid": d,
                               "tid": _STREAM_TID0 + t.stream.id, "ts": t.sim_start / 1e3, "cat": "edge"})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def makespan_ns(self, device: int = 0) -> float:
        spans = [(t.sim_start, t.sim_end) for d, t in self.tickets if d == device]
        return max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0.0

    def busy_ns(self, pipeline: str, device: int = 0) -> float:
        return sum(t.sim_end - t.sim_start for d, t in self.tickets
                   if d == device and (t.pipeline == pipeline or t.pipeline.startswith(pipeline + ":")))


def _meta(kind: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}
