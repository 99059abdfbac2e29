"""The run-time bucketed launcher: the prepared artifacts of one symbolic kernel, one per bucket of
its bucketed size and per value of the sizes it is specialized to, launched with the call's sizes.

Generated code calls it (compiler/inductor/wrapper.py); it knows the kernel IR an artifact keeps
and the launch layer, never the compiler: what a size outside the prepared buckets needs
(the kernel of its bucket, compiled; the launch's arguments) it asks the ``SizeHooks`` the
generated code hands it (compiler/inductor/buckets.py: the kernel's family answers).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from spyre_runtime.launch import launch_jobplan, release_plan
from spyre_runtime.prepare import prepare_kernel

from ..compiler.ir.kernel_ir import Kernel, kernel_from_json


class SizeHooks(Protocol):
    """What the launcher asks the compiler about a kernel over symbolic sizes."""

    def template(self, exact: str):
        """The Template (compiler/symbolic/exact.py) of a kernel specialized per value of some sizes,
        from the document the generated code carries; its ``base``: the values it was compiled at."""

    def bucket(self, kernel: Kernel, n: int):
        """A key of the bucket that serves size n (n itself when no bucket does)."""

    def compile(self, kernel: Kernel, text: str, template, n: int | None, values: tuple) -> tuple[str, Kernel]:
        """(artifact dir, its kernel) of `kernel` (kernel IR `text`) for bucketed size n at the
        specialized sizes' `values`; RuntimeError naming the kernel and the sizes if it cannot be."""

    def launch_args(self, kernel: Kernel, args, n: int):
        """The launch's arguments at size n, from the call's."""


class BucketedPlan:
    """The prepared artifacts of one symbolic kernel, one per bucket of its bucketed size and per
    value of the sizes it is specialized to (compiler/symbolic/exact.py), on one device: the wrapper
    launches through it (launch_bucketed) with the size values of the call."""

    def __init__(self, artifact_dir: str, device: int, hooks: SizeHooks, exact: str | None = None):
        self.device = device
        self.hooks = hooks
        self.text = (Path(artifact_dir) / "kernel.json").read_text()
        self.kernel = kernel_from_json(self.text)
        self.template = hooks.template(exact) if exact is not None else None
        base = self.template.base if self.template is not None else ()
        # values of the specialized sizes -> [(prepared plan, its kernel)], one per bucket
        self.plans = {base: [(prepare_kernel(artifact_dir, device=device), self.kernel)]}
        self.compiled = 0  # artifacts compiled at run time
        self._failed: dict = {}  # (bucket, values) -> the error its compile raised
        self._lock = threading.Lock()

    @property
    def bucketed(self) -> bool:
        return self.kernel.symbolic is not None

    def plan_for(self, n: int | None, values: tuple = ()):
        """(prepared plan, kernel) for bucketed size n (None: the kernel has none) at `values`."""
        found = self._find(n, values)
        if found is not None:
            return found
        with self._lock:
            found = self._find(n, values)
            if found is None:
                failed = self._failed.get((self._bucket(n), values))
                if failed is not None:
                    raise RuntimeError(str(failed)) from failed.__cause__  # (not compiled again per launch)
                try:
                    artifact, kernel = self.hooks.compile(self.kernel, self.text, self.template, n, values)
                    self.compiled += 1
                    found = prepare_kernel(artifact, device=self.device), kernel
                except RuntimeError as e:
                    self._failed[(self._bucket(n), values)] = e
                    raise
                self.plans.setdefault(values, []).append(found)
            return found

    def _bucket(self, n):
        return None if n is None else self.hooks.bucket(self.kernel, n)

    def _find(self, n, values):
        for plan, kernel in self.plans.get(values, ()):
            if n is None or plan.sizes[0].min <= n <= plan.sizes[0].max:
                return plan, kernel
        return None

    def release(self) -> None:
        """Release every prepared plan, each bucket's and each value's (its graph will not be called
        again: loaded.py)."""
        with self._lock:
            for plans in self.plans.values():
                for plan, _ in plans:
                    release_plan(plan)


def prepare_bucketed(artifact_dir: str, device: int, hooks: SizeHooks, exact: str | None = None) -> BucketedPlan:
    return BucketedPlan(artifact_dir, device, hooks, exact)


def launch_bucketed(plan: BucketedPlan, args, sizes) -> None:
    """Launch `plan` with the call's size values: the bucketed size first (if the kernel has one),
    then the values of the sizes it is specialized to."""
    sizes = tuple(int(v) for v in sizes)
    n, values = (sizes[0], sizes[1:]) if plan.bucketed else (None, sizes)
    bucket, kernel = plan.plan_for(n, values)
    if n is None:
        launch_jobplan(bucket, args)
        return
    launch_jobplan(bucket, plan.hooks.launch_args(kernel, args, n), sizes=(n,))
