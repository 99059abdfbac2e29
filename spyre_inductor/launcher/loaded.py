"""Letting go of a compiled graph's generated module, and of the device memory its plans hold.

A spyre graph's module prepares its programs when it is loaded (compiler/inductor/wrapper.py:
``spyre_plan_0 = prepare_kernel(...)`` at module level), so every loaded
module holds each program's image and correction areas in device memory.
Inductor keeps every module it loads, for the process: PyCodeCache.modules
(a list, one entry per load), sys.modules under the module's name, and its
line map (PyCodeCache.linemaps, by path). A graph loaded with constants (as
compile_fx_inner always loads one) is a new module at every load, so
compiling the same graph again, even from the FX graph cache, loads another
module and prepares its programs again.

``release(compiled)`` is for an owner that knows a compiled graph will not be
called again (the eager cache, evicting an entry): it drops the graph's module
from those three records, as Inductor itself does for the modules it loads to
benchmark autotuning choices (select_algorithm, autotune_process), and releases
its plans (spyre_runtime.launch.release_plan: the memory comes back once the
launches already made are done). Only that module is touched: a newer load of
the same source (another module object under the same name) stays.
"""

from __future__ import annotations

import sys


def module_globals(compiled) -> dict | None:
    """The namespace of the module a CompiledFxGraph calls into, or None if it has none."""
    runner = getattr(compiled, "compiled_fn_runner", None)
    if runner is not None:  # (the Runner instance of the generated module)
        return getattr(type(runner).call, "__globals__", None)
    call = getattr(compiled, "current_callable", None)
    return getattr(call, "__globals__", None)


def plans_of(namespace: dict) -> list:
    """The prepared plans a generated module holds (a JobPlan each, or a BucketedPlan)."""
    from spyre_runtime.prepare import JobPlan

    from .bucketed import BucketedPlan

    return [v for v in namespace.values() if isinstance(v, (JobPlan, BucketedPlan))]


def release(compiled) -> bool:
    """Drop `compiled`'s module from Inductor's records and release its plans (the caller will not
    call the graph again). False if it has no generated module (nothing done)."""
    from torch._inductor.codecache import PyCodeCache

    from spyre_runtime.launch import release_plan
    from spyre_runtime.prepare import JobPlan

    namespace = module_globals(compiled)
    if namespace is None:
        return False
    module = next((m for m in PyCodeCache.modules if m.__dict__ is namespace), None)
    if module is not None:
        try:
            PyCodeCache.modules.remove(module)  # (one entry per load; another thread may append meanwhile)
        except ValueError:
            pass
        for path, kept in list(PyCodeCache.modules_no_attr.items()):
            if kept is module:
                PyCodeCache.modules_no_attr.pop(path, None)
        path = getattr(module, "__file__", None)
        if path is not None and not any(getattr(m, "__file__", None) == path for m in PyCodeCache.modules):
            PyCodeCache.linemaps.pop(path, None)
        name = namespace.get("__name__")
        if name is not None and sys.modules.get(name) is module:
            sys.modules.pop(name, None)
    for plan in plans_of(namespace):
        if isinstance(plan, JobPlan):
            release_plan(plan)
        else:
            plan.release()
    return True
