"""What the run-time bucketed launcher (spyre_inductor/launcher/bucketed.py) asks the compiler:
the kernel of another bucket or of other specialized sizes, compiled on first use, and the
launch's arguments; the kernel's family answers (core/family.py). Generated code hands
``BUCKETS`` to the launcher, which never imports the compiler."""

from __future__ import annotations

import json

from .. import backend
from ..core.family import family_of
from ..ir.errors import PlanError, Unsupported
from ..ir.errors import NotCapturable
from ..ir.kernel_ir import kernel_from_json
from ..symbolic.exact import Template
from ..symbolic.planning import bucket_of
from ..ir.naming import content_name
from .scheduling import artifact_root


class Buckets:
    def template(self, exact: str) -> Template:
        return Template.from_doc(json.loads(exact))

    def bucket(self, kernel, n: int):
        (name, _, _), = kernel.symbolic.sizes
        limits = {x: (a, b) for x, a, b in kernel.symbolic.limits}.get(name, (0, None))
        try:
            return bucket_of(n, limits)
        except ValueError:
            return n

    def compile(self, kernel, text: str, template, n, values):
        original = kernel
        try:
            if template is not None and values != template.base:
                kernel = content_name(kernel_from_json(template.kernel_json(text, values)))
            if n is not None:
                kernel = family_of(kernel).rebucket(kernel, n)
            artifact = backend.compile_kernel(kernel, artifact_root())
        except (Unsupported, NotCapturable, ValueError, PlanError) as e:
            raise RuntimeError(f"spyre: kernel {original.name!r} cannot be compiled for "
                               f"{_say_sizes(original, template, n, values)}: {e}") from e
        return artifact, kernel

    def launch_args(self, kernel, args, n: int):
        return family_of(kernel).launch_args(kernel, args, n)


def _say_sizes(kernel, template, n, values) -> str:
    parts = []
    if n is not None:
        (name, lo, hi), = kernel.symbolic.sizes
        parts.append(f"{name}={n} (compiled for [{lo}, {hi}])")
    if values:
        parts.append(f"the specialized sizes at {list(values)} (compiled at {list(template.base)})")
    return " and ".join(parts)


BUCKETS = Buckets()
