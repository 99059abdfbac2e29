"""The compiler's failures: a node the kernel IR cannot express (NotCapturable), a kernel it declines
(Unsupported), and a plan that is wrong (PlanError)."""


class Unsupported(Exception):
    """The backend cannot compile this kernel; the caller falls back to the CPU. Never a wrong program."""


class PlanError(AssertionError):
    """A planner produced an inconsistent plan (a compiler bug), caught before emission."""


class NotCapturable(Exception):
    """A node (or group of nodes) the kernel IR cannot express; `reason` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class OutOfRange(NotCapturable):
    """The kernel would index a static buffer out of its range at these sizes (an embedding's
    positions past its table): sizes it is never launched at, not a kernel that cannot be captured."""
