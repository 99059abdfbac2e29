"""Shared by the compiled-kernel benchmarks: compile time, and the reports of one call."""

from __future__ import annotations

import json
import time
import warnings

import torch

warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")


def _call_seconds(compiled, *args) -> float:
    start = time.perf_counter()
    out = compiled(*args)
    if any(o.device.type == "spyre" for o in (out if isinstance(out, tuple) else (out,))):
        torch.spyre.synchronize()
    return time.perf_counter() - start


_warmed: set[str] = set()


def _warm_up(device: str) -> None:
    # The first compile in a process pays one-time costs (imports, the C++ toolchain's first
    # run for Inductor's CPU backend): pay them on a throwaway function, not on the measured one.
    if device not in _warmed:
        _warmed.add(device)
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True):
            torch.compile(lambda a: (a * 2).sum(-1) + 1)(torch.ones(8, 64, device=device))


def compile_seconds(fn, *args) -> tuple[float, object]:
    """Seconds the first call takes beyond a warm call (tracing, lowering, planning, codegen), cold:
    dynamo reset and Inductor's caches off, so nothing is served from an earlier run."""
    _warm_up(args[0].device.type)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(fn)
        first = _call_seconds(compiled, *args)
    warm = min(_call_seconds(compiled, *args) for _ in range(2))
    return first - warm, compiled


def reports_of_one_call(compiled, *args):
    """(output, kernel reports) of one call, after earlier launches have finished."""
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    out = compiled(*args)
    torch.spyre.synchronize()
    return out, torch.spyre.kernel_reports()


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- one table row of a compiled kernel -----------------------------------------------------

KERNEL_HEADER = ["kernel", "programs", "cores", "simulated us", "roofline us", "efficiency"]


def plan_labels(records, label) -> str:
    """`label(plan.json)` of each recorded kernel's artifact ("cpu fallback" for one without)."""
    out = []
    for r in records:
        if r.artifact is None:
            out.append("cpu fallback")
            continue
        out.append(label(json.loads((r.artifact / "plan.json").read_text())))
    return ", ".join(out) or "-"


def kernel_row(name: str, fn, dev_args, cpu_args, want, label) -> list:
    """The shared columns of a compiled-kernel table row: KERNEL_HEADER, TRAFFIC_HEADER, what the
    plans chose (`label(records)`), max |err| against `want`, compile seconds."""
    from _bench import traffic_columns
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    with record_kernels() as records:
        spyre_s, compiled = compile_seconds(fn, *dev_args)
    out, reports = reports_of_one_call(compiled, *dev_args)
    sim = sum(r.simulated_ns for r in reports)
    roof = sum(r.roofline_ns for r in reports)
    err = (out.cpu().float() - want.float()).abs().max().item()
    return [name, len(reports), max(r.cores_used for r in reports), sim / 1e3, roof / 1e3,
            roof / sim if sim else 0.0, *traffic_columns(reports, nbytes(*cpu_args), nbytes(want)),
            label(records), err, spyre_s]
