"""CPU fallback for ops that have no spyre kernel yet.

The op runs on CPU tensors that alias the device bytes (the simulated device
memory is host-addressable), so in-place ops and out= arguments write straight
into device memory and views of inputs stay views. Fresh results are copied to
the device. It runs as a host operation on the current stream, with the
op's tensors as its footprint, so it follows queued copies and work on other
streams that touch the same memory; the caller waits for it (output shapes
are only known once it has run). Each op warns once, naming itself; ``SPYRE_STRICT=1`` turns the
fallback into an error naming the op.

"Once" is per op for the whole process: this fallback and the compiled
graph's (launcher/fallback_policy.py) share one record of the ops already
warned about (first_warning), so an op shown by one is not shown again by
the other. An op is its operator, whatever the overload: eager runs
structured ops as their out= overload (aten::cos.out) where a compiled graph
names the functional one (aten.cos.default).

What the fallback does is counted where users look: ``torch.spyre.fallback_reports()`` gives,
per eager op and per compiled graph's CPU kernel (launcher/host.py), its calls and the
host seconds its CPU work took, since ``torch.spyre.reset_fallback_reports()``.

Later issues replace the fallback op by op with compile-backed kernels.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from spyre_runtime import _C

from . import queues, random

log = logging.getLogger(__name__)  # TORCH_LOGS="+spyre"


class SpyreFallbackWarning(UserWarning):
    """An op ran on the CPU because spyre has no kernel for it yet."""


# The ops already warned about (operator names, "aten::cos"), by either fallback. Its lock
# is a leaf: nothing else is taken while it is held.
_warned: set[str] = set()
_warned_kernels: weakref.WeakSet = weakref.WeakSet()  # and the compiled graphs' CPU kernels
_warned_lock = threading.Lock()
_lib: torch.library.Library | None = None
_cpu = torch.device("cpu")
_thread_state = threading.local()


@dataclass(frozen=True)
class _OpPlan:
    """What the fallback needs to know about one op, read once from its schema."""

    name: str
    operator: str                     # the op without its overload ("aten::cos"): what warns once
    arg_names: tuple[str, ...]
    out_args: frozenset[str]          # out= tensors (CPU kernels may resize them)
    written_args: frozenset[str]      # every argument the op writes
    generator_args: frozenset[str]
    # For each return: the name of the argument it aliases, or None if fresh.
    return_aliases: tuple[str | None, ...]


_plans: dict[torch._ops.OpOverload, _OpPlan] = {}


def strict() -> bool:
    """SPYRE_STRICT=1: an op that would run through the CPU fallback (eager or inside a compiled
    graph) raises, naming it. Read at every use, so tests and users can flip it."""
    return os.environ.get("SPYRE_STRICT", "0") not in ("", "0")


@contextlib.contextmanager
def strict_mode(on: bool = True):
    """SPYRE_STRICT on (or off) inside the block; whatever the user had is restored after."""
    old = os.environ.get("SPYRE_STRICT")
    os.environ["SPYRE_STRICT"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["SPYRE_STRICT"]
        else:
            os.environ["SPYRE_STRICT"] = old


def _plan_for(op: torch._ops.OpOverload) -> _OpPlan:
    plan = _plans.get(op)
    if plan is not None:
        return plan
    schema = op._schema
    name = schema.name if op._overloadname == "default" else f"{schema.name}.{op._overloadname}"
    alias_owner: dict[str, str] = {}
    out_args, written, generators = set(), set(), set()
    for arg in schema.arguments:
        info = arg.alias_info
        if info is not None:
            for alias_set in info.before_set:
                alias_owner.setdefault(alias_set, arg.name)
            if info.is_write:
                written.add(arg.name)
                if arg.is_out:
                    out_args.add(arg.name)
        if "Generator" in str(arg.type):
            generators.add(arg.name)
    returns = []
    for ret in schema.returns:
        info = ret.alias_info
        owner = None
        if info is not None:
            owner = next((alias_owner[s] for s in info.before_set if s in alias_owner), None)
        returns.append(owner)
    plan = _OpPlan(
        name=name,
        operator=schema.name,
        arg_names=tuple(a.name for a in schema.arguments),
        out_args=frozenset(out_args),
        written_args=frozenset(written),
        generator_args=frozenset(generators),
        return_aliases=tuple(returns),
    )
    _plans[op] = plan
    return plan


@dataclass(frozen=True)
class FallbackReport:
    """The CPU fallback work of one eager op, or of one CPU kernel of a compiled graph, since
    reset_fallback_reports()."""

    kind: str            # "op": an eager op run on the CPU; "kernel": a compiled graph's CPU kernel
    name: str            # the op ("aten::cummax") or the kernel's name in its graph ("spyre_cpu_kernel_0")
    ops: str             # the aten ops it computes (a kernel's origin ops; an op: its own name)
    graph: str           # a kernel's compiled module (its file); "" for an op
    calls: int
    host_seconds: float  # host time its CPU work took (in its host operation; queueing not included)


_reports: dict[tuple[str, str, str], list] = {}  # (kind, name, graph) -> [ops, calls, seconds]
_reports_lock = threading.Lock()  # a leaf lock


def record_fallback(kind: str, name: str, ops: str, graph: str, seconds: float) -> None:
    """Count one call of CPU fallback work (the eager fallback's and compiled CPU kernels')."""
    key = (kind, name, graph)
    with _reports_lock:
        entry = _reports.get(key)
        if entry is None:
            _reports[key] = [ops, 1, seconds]
        else:
            entry[1] += 1
            entry[2] += seconds


def fallback_reports() -> list[FallbackReport]:
    """Every op and compiled CPU kernel that ran on the CPU since reset_fallback_reports(), in
    the order each first ran."""
    with _reports_lock:
        return [FallbackReport(kind, name, ops, graph, calls, seconds)
                for (kind, name, graph), (ops, calls, seconds) in _reports.items()]


def reset_fallback_reports() -> None:
    with _reports_lock:
        _reports.clear()


def operator_name(op: str) -> str:
    """The operator an op name denotes, without its overload, as a schema names it:
    "aten.cos.default", "aten::cos.out" and "aten::cos" are all "aten::cos". A name that is
    not an op's ("buf3") is returned as it is."""
    namespace, sep, rest = op.partition("::")
    if not sep:
        namespace, sep, rest = op.partition(".")
        if not sep:
            return op
    return f"{namespace}::{rest.partition('.')[0]}"


def first_warning(operators) -> bool:
    """Record `operators` (operator_name() names) as warned about; True if any of them was
    not yet, i.e. the caller should warn. Shared by the eager and the compiled fallback."""
    with _warned_lock:
        new = [op for op in operators if op not in _warned]
        _warned.update(new)
    return bool(new)


def first_kernel_warning(code) -> bool:
    """Record a compiled graph's CPU kernel (its body's code object: one per kernel of a loaded
    module) as warned about; True if it was not yet (compiler/fallback_policy.first_run)."""
    with _warned_lock:
        if code in _warned_kernels:
            return False
        _warned_kernels.add(code)
    return True


def reset_warnings() -> None:
    """Forget which ops and kernels were warned about (tests)."""
    with _warned_lock:
        _warned.clear()
        _warned_kernels.clear()


# torch._tensor_str._str formats a tensor under torch._C._DisableFuncTorch, which excludes this
# key in the thread's dispatch state: a test of a thread-local, which the stack walk then confirms
# (few others disable functorch, none of them while reaching a spyre kernel on every op).
_FORMATTING_KEY = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_TENSOR_STR = os.path.join("torch", "_tensor_str.py")


def formatting_a_tensor() -> bool:
    """Whether this thread is inside torch's formatting of a tensor (repr, str, print, a
    debugger's view, Inductor writing a constant into its repro text). Formatting runs ops on
    the tensor (isfinite, masked_select, abs, min, max, ceil, item per element...) that the user
    never called: on spyre they run on the CPU over the device's bytes, never as compiled
    programs, never warned about, and strict mode does not forbid them (a compile that prints a
    constant must not fail for it, nor launch or compile anything)."""
    if not _excluded(_FORMATTING_KEY):
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_TENSOR_STR):
            return True
        frame = frame.f_back
    return False


def _inside_inductor_constant_folding() -> bool:
    # Inductor's joint-graph pass evaluates uniform constants (aten.scalar_tensor, pointwise ops on
    # them) eagerly on the graph's device while compiling, and keeps only the value it reads back:
    # nothing of that op runs in the compiled graph, so strict mode has nothing to forbid there.
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(("_inductor/constant_folding.py", "fx_passes/joint_graph.py")):
            return True
        frame = frame.f_back
    return False


def _announce(plan: _OpPlan, reason: str | None = None, stacklevel: int = 3) -> None:
    # `reason`: why an op that has a compile-backed kernel (spyre_inductor/eager) still runs here.
    if formatting_a_tensor():
        return  # (formatting a tensor: not the user's op, neither forbidden nor warned about)
    log.debug("eager CPU fallback: %s (%s)", plan.name, reason or "no spyre kernel")
    if strict():
        if _inside_inductor_constant_folding():
            return  # compile-time work of Inductor's, not the user's op: not forbidden
        what = "has no spyre kernel" if reason is None else f"has no spyre program for these inputs ({reason})"
        raise NotImplementedError(
            f"spyre: {plan.name} {what} and SPYRE_STRICT=1 forbids "
            f"running it through the CPU fallback"
        )
    if plan.operator in _warned or _inside_inductor_constant_folding() or not first_warning((plan.operator,)):
        return  # (nor warned, inside constant folding: the stack is walked only for a first warning)
    what = "has no spyre kernel yet" if reason is None else f"could not run as a spyre program ({reason})"
    warnings.warn(
        f"spyre: {plan.name} {what}; it runs on the CPU over the "
        f"device bytes (this warning is shown once per op)",
        SpyreFallbackWarning,
        stacklevel=stacklevel,
    )


class _Call:
    """One fallback call: maps arguments to CPU, remembers what to map back."""

    def __init__(self, plan: _OpPlan):
        self.plan = plan
        self.device: torch.device | None = None
        # (spyre tensor, its host alias) for every aliased argument, by name.
        self.aliases: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.out_temps: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.generators: list[tuple[torch.Generator, torch.Generator]] = []

    def _note_device(self, device: torch.device) -> None:
        if self.device is None:
            self.device = device
        elif self.device != device:
            raise RuntimeError(
                f"{self.plan.name}: expected all tensors to be on the same device, "
                f"but found at least two devices, {self.device} and {device}!"
            )

    def to_host(self, name: str, value):
        if isinstance(value, torch.Tensor):
            if value.device.type != "spyre":
                return value
            self._note_device(value.device)
            if name in self.plan.out_args:
                # CPU kernels may resize out= (even ones that already have
                # elements); an alias cannot grow. Compute into a CPU tensor
                # of the same layout, then resize the device tensor and copy.
                temp = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype)
                self.out_temps[name] = (value, temp)
                return temp
            alias = _C.host_alias(value)
            self.aliases.setdefault(name, (value, alias))
            return alias
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_host(name, v) for v in value)
        if isinstance(value, torch.device) and value.type == "spyre":
            self._note_device(_with_index(value))
            return _cpu
        return value

    def host_generator(self, value):
        if value is None and self.device is None:
            return None
        if value is None:
            value = _C.default_generator(self.device.index)
        elif value.device.type != "spyre":
            return value
        host = _host_generator()
        host.set_state(random.twister_state(value))
        self.generators.append((value, host))
        return host

    def finish(self, result):
        for device_gen, host_gen in self.generators:
            random.set_twister_state(device_gen, host_gen.get_state())
        for name, (tensor, temp) in self.out_temps.items():
            if tensor.shape != temp.shape:
                tensor.resize_(temp.shape)
            # Already in stream order (a host operation): copy the bytes directly.
            _C.host_alias(tensor).copy_(temp)
        for name in self.plan.written_args:
            if name in self.aliases:
                _follow_metadata(*self.aliases[name])
        aliases = self.plan.return_aliases
        if len(aliases) == 1:
            return self._to_device(result, aliases[0])
        if isinstance(result, tuple):
            return tuple(self._to_device(r, a) for r, a in zip(result, aliases))
        return result

    def _to_device(self, value, alias_of: str | None):
        if isinstance(value, (list, tuple)):
            return type(value)(self._to_device(v, alias_of) for v in value)
        if not isinstance(value, torch.Tensor) or self.device is None:
            return value
        if alias_of is not None:
            if alias_of in self.out_temps:
                return self.out_temps[alias_of][0]
            if alias_of in self.aliases:
                device_tensor, host = self.aliases[alias_of]
                if value is host:
                    return device_tensor
                return _view_of(device_tensor, host, value)
        out = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=self.device)
        _C.host_alias(out).copy_(value)
        return out


def _with_index(device: torch.device) -> torch.device:
    if device.index is None:
        return torch.device("spyre", _C.current_device())
    return device


def _host_generator() -> torch.Generator:
    gen = getattr(_thread_state, "generator", None)
    if gen is None:
        gen = _thread_state.generator = torch.Generator(device="cpu")
    return gen


def _view_of(device_tensor: torch.Tensor, host: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The spyre view matching a CPU view `view` of `host` (the alias of `device_tensor`)."""
    delta_bytes = view.data_ptr() - host.data_ptr()
    if delta_bytes % view.element_size() != 0 or view.dtype != device_tensor.dtype:
        return view.to(device_tensor.device)
    offset = device_tensor.storage_offset() + delta_bytes // view.element_size()
    return torch.as_strided(device_tensor, view.size(), view.stride(), offset)


def _follow_metadata(device_tensor: torch.Tensor, host: torch.Tensor) -> None:
    """An in-place op that changed its argument's shape: make the device tensor match."""
    if host.size() == device_tensor.size() and host.stride() == device_tensor.stride():
        return
    delta = (host.data_ptr() - device_tensor.data_ptr()) // max(host.element_size(), 1)
    device_tensor.set_(
        device_tensor.untyped_storage(),
        device_tensor.storage_offset() + delta,
        host.size(),
        host.stride(),
    )


def check_devices(op, args, kwargs) -> None:
    """Raise PyTorch's error if the call mixes devices, as a CUDA kernel and torch.compile do:
    "Expected all tensors to be on the same device, but found at least two devices, spyre:0 and
    cpu!". Beside spyre tensors a CPU 0-d tensor is a scalar and may mix in; for anything else
    the verdict is fake tensors' (what a torch.compile'd call gets, including the ops that take
    host tensors, such as indexing with CPU indices), asked once per op and pattern of devices."""
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if all(t.device.type == "spyre" or (t.device.type == "cpu" and t.dim() == 0) for t in tensors):
        return
    pattern = (op, tuple((t.device, t.dim() == 0) for t in tensors))
    verdict = _device_verdicts.get(pattern)
    if verdict is None:
        verdict = _fake_device_verdict(op, args, kwargs)
        if verdict is not None:  # (None: fake tensors failed on something else; ask again next time)
            _device_verdicts[pattern] = verdict
    if verdict:
        raise RuntimeError(verdict)


_device_verdicts: dict[tuple, str] = {}  # (op, devices and ranks of its tensors) -> the error, or ""


def _fake_device_verdict(op, args, kwargs) -> str | None:
    """Fake tensors' error for the call's devices, "" if they take them, None if they failed on
    something else (a shape: the CPU kernel reports it; the devices may still be refused with
    other shapes, so that is no verdict)."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode
    from torch.utils._pytree import tree_map

    mode = FakeTensorMode()
    try:
        fake_args, fake_kwargs = tree_map(
            lambda v: mode.from_tensor(v.detach()) if isinstance(v, torch.Tensor) else v, (args, kwargs))
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*fake_args, **fake_kwargs)
    except FakeTensorDeviceMismatchError as e:
        return str(e)
    except Exception:  # noqa: BLE001 - not a verdict on devices
        return None
    return ""


def _fallback(keyset, op, *args, **kwargs):
    check_devices(op, args, kwargs)
    plan = _plan_for(op)
    _announce(plan)
    return _on_stream(plan, op, args, kwargs)


def run(op, args, kwargs, reason: str | None = None):
    """Run `op` through the CPU fallback, as if it had no spyre kernel: for the compile-backed
    eager kernels (spyre_inductor/eager), on inputs they do not compile. `reason` says why (in
    the once-per-op warning, and in strict mode's error)."""
    check_devices(op, args, kwargs)
    plan = _plan_for(op)
    _announce(plan, reason, stacklevel=4)
    return _on_stream(plan, op, args, kwargs)


def run_checking_inputs(op, args, kwargs, reason: str):
    """Like run(), for inputs the compiled path could not even trace (most often the caller's
    mistake: shapes that do not broadcast): the CPU kernel runs first, so PyTorch's own error
    reaches the caller, in strict mode too; only a call that succeeds is announced."""
    check_devices(op, args, kwargs)
    plan = _plan_for(op)
    if strict():
        # nothing may run on the CPU: the trace's error (a fake tensor's: same check, own words)
        raise RuntimeError(f"spyre: {plan.name} rejects its inputs: {reason}")
    result = _on_stream(plan, op, args, kwargs)
    _announce(plan, reason, stacklevel=4)
    return result


def run_on_host(announced, host_op, *args, reason: str | None = None, **kwargs):
    """Run `host_op` on host aliases as the fallback for `announced`.

    For ops whose generic kernel refuses unknown devices (convolution's
    ``*_overrideable``): they get a spyre kernel that computes the CPU op.
    `reason`: why the op's compile-backed kernel did not run it (as in run()).
    """
    _announce(_plan_for(announced), reason, stacklevel=5)
    return _on_stream(_plan_for(host_op), host_op, args, kwargs)


def _spyre_tensors(value):
    if isinstance(value, torch.Tensor):
        if value.device.type == "spyre":
            yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _spyre_tensors(v)


def _on_stream(plan: _OpPlan, op, args, kwargs):
    """Run the op as a host operation on the current stream, in order with queued work."""
    named = list(zip(plan.arg_names, args)) + list(kwargs.items())
    reads = [t for _, v in named for t in _spyre_tensors(v)]
    if not reads:  # a factory: its outputs reach the device through copies
        return _execute(plan, op, args, kwargs)
    writes = [t for name, v in named if name in plan.written_args for t in _spyre_tensors(v)]
    return queues.run_on_host(
        reads[0].device.index, lambda: _execute(plan, op, args, kwargs),
        reads=reads, writes=writes, name=plan.name,
    )


def _execute(plan: _OpPlan, op, args, kwargs):
    start = time.perf_counter()
    try:
        return _execute_on_host(plan, op, args, kwargs)
    finally:
        record_fallback("op", plan.name, plan.name, "", time.perf_counter() - start)


def _execute_on_host(plan: _OpPlan, op, args, kwargs):
    call = _Call(plan)
    names = plan.arg_names
    host_args = [call.to_host(names[i], a) for i, a in enumerate(args)]
    host_kwargs = {k: call.to_host(k, v) for k, v in kwargs.items()}
    if plan.generator_args:
        for i, a in enumerate(args):
            if names[i] in plan.generator_args:
                host_args[i] = call.host_generator(a)
        for k in plan.generator_args:
            if k in host_kwargs or (k not in names[: len(args)]):
                host_kwargs[k] = call.host_generator(kwargs.get(k))
    result = op(*host_args, **host_kwargs)
    return call.finish(result)


def install() -> None:
    """Register the fallback for every op without a spyre kernel (once)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(_fallback, "PrivateUse1", with_keyset=True)
