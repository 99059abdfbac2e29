"""The seam every kernel family plugs into: what it claims, what it lets fuse, how it plans, and its
symbolic-size hooks; one registry in dispatch order.

A family (families/<name>/) is one ``Family`` subclass registered once when its package is
imported (families/__init__.py imports every family, in dispatch order). The planner asks the
registry which family claims a kernel (``family_of``: the first that does) and hands the kernel
to it; Inductor's fusion asks every family whether a fused group stays plannable
(``fusion_vetoed``); the artifact writer and the run-time bucketed launcher ask the kernel's
family for its launch shapes, its program's size declarations, the kernel of another bucket
and the launch arguments. The defaults below are those of a kernel whose symbolic dims are
whole buffer dims (every family's but attention's, which overrides them).

How to add a family: docs/adding_a_kernel_family.md.
"""

from __future__ import annotations

from ..ir.errors import Unsupported
from ..ir.kernel_ir import Kernel
from ..symbolic import planning


class Family:
    """A kernel family: override ``claims`` and ``plan``; the rest has defaults."""

    name: str = ""

    # ---- planning --------------------------------------------------------------------------

    def claims(self, kernel: Kernel) -> bool:
        """Whether this family plans `kernel` (asked in dispatch order; the first that claims it wins)."""
        raise NotImplementedError(f"kernel family {self.name!r} does not say which kernels it claims")

    def check(self, kernel: Kernel) -> None:
        """Unsupported if the kernel IR is not one the planner runs (before ``plan``)."""
        try:
            kernel.check()
        except ValueError as e:
            raise Unsupported(str(e)) from e

    def plan(self, kernel: Kernel, *, cores: int | None, max_cores: int | None, estimate):
        """The kernel planned and its program kept (core.compiled.Compiled), or Unsupported."""
        raise NotImplementedError(f"kernel family {self.name!r} has no planner")

    # ---- fusion ----------------------------------------------------------------------------

    def fusion_vetoed(self, fused: Kernel | None) -> bool:
        """True if fusing two groups into `fused` (their kernel as one, None if it has none) would
        leave this family with a kernel it refuses or plans far worse. A cheap check, not a plan."""
        return False

    def loses_to_fusion(self, fused: Kernel | None, alone) -> bool:
        """True if `fused` would lose a plan one of the parts has on its own; `alone()` yields each
        part's own kernel (or None). Asked only when no family vetoes `fused` outright: it may
        capture the parts."""
        return False

    # ---- symbolic sizes --------------------------------------------------------------------

    def program_with_sizes(self, program, kernel: Kernel):
        """The planned program with the kernel's size symbols and its buffers' symbolic dims declared."""
        return planning.program_with_sizes(program, kernel)

    def launch_shape(self, kernel: Kernel, name: str, shape) -> list:
        """A buffer's launch-spec shape, a symbolic dim named by its size."""
        return planning.launch_shape(kernel, name, shape)

    def rebucket(self, kernel: Kernel, n: int) -> Kernel:
        """The kernel for the bucket of size n (from an artifact's kernel IR)."""
        return planning.rebucket(kernel, n)

    def launch_args(self, kernel: Kernel, args, n: int):
        """The launch's arguments at size n, from the call's (the graph's buffers, in order)."""
        return args


FAMILIES: list[Family] = []  # in dispatch order


def register(family: Family) -> Family:
    """Add `family` at the end of the dispatch order (once per name)."""
    if any(f.name == family.name for f in FAMILIES):
        raise ValueError(f"a kernel family named {family.name!r} is registered already")
    FAMILIES.append(family)
    return family


def family(name: str) -> Family:
    """The registered family called `name` (one family handing a kernel to another)."""
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(f"no kernel family {name!r} (registered: {[f.name for f in FAMILIES]})")


def family_of(kernel: Kernel) -> Family:
    """The family that plans `kernel`: the first, in dispatch order, that claims it."""
    if not FAMILIES:  # (a planner bug, not a kernel to run on the CPU)
        raise RuntimeError("no kernel family is registered: import spyre_inductor.compiler.families "
                           "(compiler.backend does) before planning or emitting a kernel")
    for f in FAMILIES:
        if f.claims(kernel):
            return f
    raise Unsupported(f"no kernel family claims kernel {getattr(kernel, 'name', kernel)!r} "
                      f"(registered: {[f.name for f in FAMILIES]})")


def fusion_vetoed(fused: Kernel | None, alone) -> bool:
    """True if any family vetoes the fused group outright (Family.fusion_vetoed), else if any
    family would lose a part's own plan to it (Family.loses_to_fusion)."""
    return any(f.fusion_vetoed(fused) for f in FAMILIES) or any(f.loses_to_fusion(fused, alone) for f in FAMILIES)


__all__ = ["FAMILIES", "Family", "family", "family_of", "fusion_vetoed", "register"]
