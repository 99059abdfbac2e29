"""The compiler's two failures: a kernel it declines (Unsupported) and a plan that is wrong (PlanError)."""


class Unsupported(Exception):
    """The backend cannot compile this kernel; the caller falls back to the CPU. Never a wrong program."""


class PlanError(AssertionError):
    """A planner produced an inconsistent plan (a compiler bug), caught before emission."""
