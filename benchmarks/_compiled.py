"""Shared by the compiled-kernel benchmarks: compile time, and the reports of one call."""

from __future__ import annotations

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
