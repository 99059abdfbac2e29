"""Cache entries: what a call does once its key is known. The warm path is ``CompiledEntry.run``.

* CompiledEntry: launch the compiled graph (it allocates the outputs and
  launches its prepared plans, spyre_runtime.launch.launch_jobplan, on the
  current stream) and return what the op returns: the new tensors, or self /
  the out= tensors it wrote.
  A call whose Python scalars travel (scalars.py) hands its compiled graph
  each scalar as a host value: a 0-d CPU tensor of its travel dtype, which
  the launch carries in the correction area.
* ValueKeyed: the kind's entry of a call whose scalars cannot travel after
  all (the compile checks, scalars.py): each value is looked up, and compiled, under
  its own value key, as before issue 19.
* CpuRoute: the call runs through the eager CPU fallback (warned once per op,
  forbidden under SPYRE_STRICT=1, naming the op and why), or through PyTorch's
  composite kernel for ops that have one (not_compiled).
* Resize: an out= call whose out= tensors have the wrong shape: resize them
  as PyTorch does (warning when one had elements), then dispatch again with
  the key of the resized call.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from spyre_inductor.launcher import loaded, nesting
from spyre_inductor.launcher.nesting import STATE  # set while this thread compiles or runs a graph
from spyre_inductor.device import fallback
from spyre_runtime.binding import LaunchError

from .key import tensors_of
from .scalars import HostValues, fits
from .signature import Mode, Signature


_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd


def not_compiled(sig: Signature, args, kwargs, reason: str):
    """Run a call the compiled path does not take: through PyTorch's composite kernel when the op
    has one (its pieces dispatch to spyre kernels again), else through the CPU fallback (warned
    once per op; strict mode raises naming the op and `reason`), or the op's own CPU route."""
    if sig.host is not None:
        return sig.host(*args, reason=reason, **kwargs)
    if sig.composite:
        return sig.op._op_dk(_COMPOSITE, *args, **kwargs)
    return fallback.run(sig.op, args, kwargs, reason)


class CompiledEntry:
    __slots__ = ("fn", "mode", "programs", "cpu_calls", "returns", "single", "written", "travel", "hosts", "traced", "checks",
                 "__weakref__")

    def __init__(self, sig: Signature, compiled, travel: tuple[int, ...] = (), dtypes: tuple = (),
                 traced: Signature | None = None, checks: tuple = ()):
        self.fn = compiled.fn
        self.mode = sig.mode
        self.programs = compiled.programs
        self.cpu_calls = compiled.cpu_calls
        self.written = sig.written
        self.single = sig.returns == 1
        self.travel = travel  # schema positions of the scalars given as host values, and their dtypes
        self.hosts = HostValues(dtypes) if travel else None
        self.traced = traced or sig  # the signature traced: the op's tensor twin if a Scalar travels
        self.checks = checks  # (position, dtype): values PyTorch converts with an overflow check
        # The compiled graph is this entry's alone: once the entry is gone (evicted, and no call
        # still running it) its module leaves Inductor's records and its programs' device memory
        # comes back (launcher/loaded.py). Not at exit: the process gives everything back then.
        weakref.finalize(self, loaded.release, compiled.fn).atexit = False

    def run(self, sig, values, args, kwargs):
        if self.cpu_calls and fallback.strict():
            raise NotImplementedError(
                f"spyre: {sig.name} runs part of itself on the CPU ({', '.join(self.cpu_calls)}) and "
                f"SPYRE_STRICT=1 forbids the CPU fallback")
        if self.travel:
            tensors = self._with_hosts(sig, values)
        else:
            tensors = tensors_of(sig, values)
        outer, STATE.busy = nesting.busy(), True  # (by hand, not nested(): this is every warm call)
        try:
            outs = self.fn(tensors)
        except LaunchError as e:
            # an argument the launch refuses (a storage resized under its tensor): the caller's
            # error, as a RuntimeError like the CPU kernel's (a LaunchError is a TypeError too,
            # which Tensor.__add__ would turn into NotImplemented)
            raise RuntimeError(f"spyre: {sig.name}: {e}") from e
        finally:
            STATE.busy = outer
        mode = self.mode
        if mode is Mode.FUNCTIONAL:
            return outs[0] if self.single else tuple(outs)
        if mode is Mode.INPLACE:
            return values[0]
        written = tuple(values[i] for i in self.written)
        if not sig.returns:
            return None
        return written[0] if len(written) == 1 else written

    def _with_hosts(self, sig, values) -> list:
        """The graph's inputs: the call's tensors with each traveling scalar's host value in place."""
        travel = self.travel
        for i, dtype in self.checks:
            fits(values[i], dtype)
        hosts = self.hosts.fill([values[i] for i in travel])
        if len(travel) == 1 and not self.traced.lists_at:  # the common case, without a copy of values
            i = travel[0]
            host = hosts[0]
            return [host if j == i else values[j] for j in self.traced.tensor_at
                    if j == i or isinstance(values[j], torch.Tensor)]
        held = list(values)
        for i, t in zip(travel, hosts):
            held[i] = t
        return tensors_of(self.traced, held)

    def describe(self) -> str:
        cpu = f", on the CPU: {', '.join(self.cpu_calls)}" if self.cpu_calls else ""
        travel = (f", scalar(s) at {list(self.travel)} given at launch ({', '.join(str(d) for d in self.hosts.dtypes)})"
                  if self.travel else "")
        return f"{self.programs} spyre program launch(es){cpu}{travel}"


class ValueKeyed:
    """A kind whose scalars cannot travel (scalars.py): each value goes by its own value key."""

    __slots__ = ("reason", "kernel")

    def __init__(self, reason: str, kernel):
        self.reason = reason
        self.kernel = kernel  # (entry_for compiles a missing value key through it)

    def run(self, sig, values, args, kwargs):
        from .cache import CACHE
        from .kernel import entry_for
        from .key import make_key

        key = make_key(sig, values, travel=False)
        entry = CACHE.get(key)
        if entry is None:
            entry = entry_for(sig, key, values, self.kernel)
        return entry.run(sig, values, args, kwargs)

    def describe(self) -> str:
        return f"scalars keyed by value: {self.reason}"


class CpuRoute:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def run(self, sig, values, args, kwargs):
        return not_compiled(sig, args, kwargs, self.reason)

    def describe(self) -> str:
        return f"CPU fallback: {self.reason}"


class InputsRejected:
    """Tracing the call on fake tensors raised (not cached): the CPU kernel runs it, so PyTorch's
    own error reaches the caller; strict mode raises the trace's error."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def run(self, sig, values, args, kwargs):
        if sig.composite or sig.host is not None:  # PyTorch's own kernel checks the inputs (and runs
            return not_compiled(sig, args, kwargs, self.reason)  # what it can on spyre), or the CPU route
        return fallback.run_checking_inputs(sig.op, args, kwargs, f"tracing it raised {self.reason}")


class Resize:
    __slots__ = ("shapes", "dispatch")

    def __init__(self, shapes: dict[int, torch.Size], dispatch):
        self.shapes = shapes      # position in tensors_of order -> the shape it must have
        self.dispatch = dispatch  # the kernel, called again once resized

    def run(self, sig, values, args, kwargs):
        tensors = tensors_of(sig, values)
        for i, shape in self.shapes.items():
            t = tensors[i]
            if t.numel() != 0:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(t.shape)}, "
                    f"which does not match the required output shape {list(shape)}. This behavior is "
                    f"deprecated, and in a future PyTorch release outputs will not be resized unless they "
                    f"have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                    f"to zero elements with t.resize_(0).", UserWarning, stacklevel=4)
            t.resize_(shape)
        return self.dispatch(*args, **kwargs)

    def describe(self) -> str:
        return f"resize out= to {[list(s) for s in self.shapes.values()]}, then dispatch again"
