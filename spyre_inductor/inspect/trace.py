"""`spyre-inspect trace SCRIPT [ARGS]`: run a script and write what it did as one Chrome trace /
Perfetto JSON, on two labelled clocks.

* "spyre:N (simulated clock)": the device's pipelines and streams (torch.spyre.timeline), with
  event and derived-dependency arrows; and under "spyre:N cores (simulated clock)" each
  program's per-core unit activity (ls, pe, sfp) from the timing model, placed at its launch's
  start on the compute pipeline.
* "host (wall clock)": when the host ran each operation (the simulator's own time, not the card's).

Beside the events, "spyreKernels" lists every launch (its kernel report's figures, its simulated
and host times): what `spyre-inspect report` reads.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

from .cost import bound_of

UNITS = ("ls", "pe", "sfp")
MAX_ACTIVITY_LAUNCHES = 200  # per-unit activity of at most this many launches (the file stays small)
HOST_PID = 10_000
CORES_PID0 = 1_000


def run_script(script: str, args: list[str]) -> None:
    """Run `script` as `python script args...` would, in this process."""
    argv, path0 = sys.argv, sys.path[0]
    sys.argv = [script] + list(args)
    sys.path[0] = str(Path(script).resolve().parent)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv, sys.path[0] = argv, path0


def record(fn) -> dict:
    """Run `fn()` and return the trace of everything the devices did meanwhile."""
    import torch
    from spyre_runtime.program.run import kernel_report_window, set_kernel_report_window
    from spyre_runtime.program.timing import record_activity

    window = kernel_report_window()
    set_kernel_report_window(None)
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    try:
        with record_activity(), torch.spyre.timeline() as timeline:
            fn()
        reports = torch.spyre.kernel_reports()
    finally:
        set_kernel_report_window(window)
    return build(timeline, reports)


def _launches(timeline, reports):
    """(device, ticket, report) of each program run, its report matched by name in order."""
    by_name: dict = {}
    for r in reports:
        by_name.setdefault(r.name, []).append(r)
    out = []
    for device, t in sorted(timeline.tickets, key=lambda dt: (dt[1].sim_start, dt[1].seq)):
        if t.pipeline != "compute":
            continue
        queue = by_name.get(t.name)
        if queue:
            out.append((device, t, queue.pop(0)))
    return out


def build(timeline, reports) -> dict:
    trace = timeline.trace()
    events = trace["traceEvents"]
    for e in events:  # the timeline's processes are the devices on the simulated clock
        if e.get("ph") == "M" and e["name"] == "process_name" and e["tid"] == 0:
            e["args"]["name"] = f"spyre:{e['pid']} (simulated clock)"
    launches = _launches(timeline, reports)
    host0 = min((t.host_start for _, t in timeline.tickets if t.host_start), default=0)
    events.append({"name": "process_name", "ph": "M", "pid": HOST_PID, "tid": 0,
                   "args": {"name": "host (wall clock)"}})
    for device, t in timeline.tickets:
        if t.host_start:
            events.append({"name": t.name, "ph": "X", "pid": HOST_PID, "tid": device, "cat": t.pipeline,
                           "ts": (t.host_start - host0) / 1e3, "dur": (t.host_end - t.host_start) / 1e3,
                           "args": {"device": device, "stream": t.stream.id}})
    named = set()
    for k, (device, t, r) in enumerate(launches[:MAX_ACTIVITY_LAUNCHES]):
        pid = CORES_PID0 + device
        if device not in named:
            named.add(device)
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"spyre:{device} cores (simulated clock)"}})
        for core, unit, opcode, start, end in r.activity:
            tid = core * len(UNITS) + (UNITS.index(unit) if unit in UNITS else 0)
            events.append({"name": opcode, "ph": "X", "pid": pid, "tid": tid, "cat": r.name,
                           "ts": (t.sim_start + start) / 1e3, "dur": (end - start) / 1e3})
    from spyre_runtime.hardware import HARDWARE

    for device in named:
        for core in range(HARDWARE.cores):
            for i, unit in enumerate(UNITS):
                events.append({"name": "thread_name", "ph": "M", "pid": CORES_PID0 + device,
                               "tid": core * len(UNITS) + i, "args": {"name": f"core {core} {unit}"}})
    trace["spyreKernels"] = [kernel_row(device, t, r) for device, t, r in launches]
    return trace


def kernel_row(device, t, r) -> dict:
    hw = r.hardware
    sim_ns = r.simulated_ns or 1.0
    peak_bytes_per_ns = hw.device_memory_gbps_sustained if hw is not None else 0.0
    return {"name": r.name, "device": device, "stream": t.stream.id, "seq": t.seq,
            "sim_start_us": t.sim_start / 1e3, "sim_end_us": t.sim_end / 1e3,
            "host_us": (t.host_end - t.host_start) / 1e3,
            "simulated_us": r.simulated_us, "roofline_us": r.roofline_us, "efficiency": r.efficiency,
            "cores": r.cores_used, "bound": bound_of(r), "bytes_moved": r.bytes_moved,
            "bytes_over_minimum": r.bytes_over_minimum, "flops": r.flops,
            "memory_pct": 100.0 * r.bytes_moved / sim_ns / peak_bytes_per_ns if peak_bytes_per_ns else None,
            "pe_pct": 100.0 * 2 * r.macs / sim_ns / r.roof_flops_per_ns if r.roof_flops_per_ns else None}


def write(trace: dict, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace))
    return path
