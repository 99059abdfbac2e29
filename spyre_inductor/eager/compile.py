"""Compiling one eager call: trace the op's decomposition into an FX graph, hand it to Inductor.

The graph is what torch.compile would hand our backend for the same op: the
op traced on fake tensors with functionalization (in-place and out= ops
become their functional form plus a ``copy_`` into the written input, which
Inductor keeps as an input mutation) and Inductor's own decomposition table
(select_decomp_table: the decompositions every spyre graph is lowered
through). It goes to ``compile_fx_inner`` -- the same Inductor entry
AOTAutograd calls for a torch.compile'd graph -- so lowering, our scheduling,
the planner, the artifact cache on disk and the FX graph cache are the ones
compiled code uses. Dynamo is not involved: an eager compile never counts
against, or shares, Dynamo's recompile limit (torch._dynamo.config
.recompile_limit is about user frames), and there is no frame to graph-break.

What comes back is classified from its generated wrapper: how many spyre
programs it launches, and which calls run on the CPU (a host kernel, an extern
ATen kernel). A graph that launches no program at all is not worth keeping
compiled: the call goes to the eager CPU fallback instead (one warning, and
strict mode's error, naming the op).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import warnings
from dataclasses import dataclass

import torch

from .signature import Kind, Mode, Signature

# The dtypes the ISA computes (compiler/core/layout.py): anything else goes to the CPU fallback
# without trying (float64, complex, int16, uint8 would only fail in the planner).
COMPILED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                             torch.int8, torch.bool})

# Inductor is not thread-safe; one eager compile at a time (a call that finds its entry
# compiled meanwhile uses it).
COMPILE_LOCK = threading.Lock()


class Declined(Exception):
    """The call is not compiled; the message says why (the CPU fallback runs it)."""


class TraceError(Exception):
    """Tracing the op on fake tensors raised: most often the user's inputs are wrong (shapes
    that do not broadcast, a dtype an out= cannot take). Not cached: the CPU fallback runs
    the call and raises PyTorch's own error, or strict mode raises this one's cause."""


class Rejected(TraceError):
    """The op refuses these inputs although they trace (a check neither fake tensors nor the
    decomposition make): the caller's error, as a TraceError whose op runs on fakes is not."""


@dataclass(frozen=True)
class Compiled:
    fn: object                      # Inductor's CompiledFxGraph: fn(list of tensors) -> outputs
    programs: int                   # spyre programs it launches per call
    cpu_calls: tuple[str, ...]      # calls in its wrapper that run on the CPU
    seconds: float


def check_dtypes(tensors) -> None:
    for t in tensors:
        if t.dtype not in COMPILED_DTYPES:
            raise Declined(f"{t.dtype} is not a dtype spyre programs compute")


def _rebuild(sig: Signature, values: tuple, tensors) -> tuple[list, dict]:
    """The op's (args, kwargs) with `tensors` (in tensors_of order) in place of the call's."""
    it = iter(tensors)
    out = []
    for value, kind in zip(values, sig.kinds):
        if kind is Kind.TENSOR:
            out.append(next(it) if isinstance(value, torch.Tensor) else value)
        elif kind is Kind.TENSOR_LIST:
            out.append([next(it) if isinstance(t, torch.Tensor) else t for t in value])
        else:
            out.append(value)
    return out[: sig.positional], dict(zip(sig.names[sig.positional:], out[sig.positional:]))


def _graph_fn(sig: Signature, values: tuple):
    def fn(*tensors):
        args, kwargs = _rebuild(sig, values, tensors)
        result = sig.op(*args, **kwargs)
        if sig.mode is not Mode.FUNCTIONAL:
            return ()  # the writes are the graph's input mutations
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)
    return fn


def resized_outputs(sig: Signature, values: tuple, tensors) -> dict[int, torch.Size] | None:
    """For an out= call: the shapes its out= tensors must be resized to (by position in
    `tensors`), or None if they already have them. Runs the op on fake tensors."""
    fakes, _, error = on_fakes(sig.op, sig, values, tensors)  # (the resize warning is Resize.run's)
    if error is not None:  # the user's inputs, reported by the CPU fallback
        raise TraceError(f"{type(error).__name__}: {error}") from error
    changed = {i: fakes[i].shape for i in _written_tensor_positions(sig, values)
               if fakes[i].shape != tensors[i].shape}
    return changed or None


def runs_on_fake(sig: Signature, values: tuple, tensors) -> bool:
    """Whether the op itself accepts these inputs (run on fake tensors, nothing traced): tells a
    caller's mistake (it does not) from a failure of our tracing (it does)."""
    return rejection_on_fake(sig, values, tensors) is None


def on_fakes(op, sig: Signature, values: tuple, tensors):
    """`op` run on fake copies of the call's `tensors` (tensors_of order), the call's other values
    as they are: (the fakes, its result, None) or (the fakes, None, its error). A probe: the
    warnings it raises and the fake mode's log of a failing meta kernel are not the user's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t.detach()) for t in tensors]
    try:
        with _plain_dispatch(), _quiet_fakes(), mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args, kwargs = _rebuild(sig, values, fakes)
            return fakes, op(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001
        return fakes, None, e


@contextlib.contextmanager
def _quiet_fakes():
    # FakeTensorMode logs every meta kernel that raises, with its traceback, at ERROR: for a probe
    # of inputs that may be wrong (shapes that do not broadcast), that is noise on the user's stderr
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def rejection_on_fake(sig: Signature, values: tuple, tensors) -> Exception | None:
    """The error the op itself raises for these inputs (run on fake tensors), or None. An output
    whose shape depends on the data (``x[mask]``, ``nonzero``) is no rejection: fake tensors have
    no data to say it, and the CPU kernel takes the inputs."""
    error = on_fakes(sig.op, sig, values, tensors)[2]
    return None if data_dependent(error) else error


def data_dependent(error: BaseException | None) -> bool:
    """Whether `error` (or what caused it) is fake tensors meeting an output shape or a value
    that only the data decides: no program of a fixed shape can compute the op."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, (DynamicOutputShapeException, DataDependentOutputException)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _functional_twin(op: torch._ops.OpOverload):
    """aten.mul.Tensor for aten.mul_.Tensor: the op an in-place overload writes the result of."""
    base = op._schema.name.split("::", 1)[1]
    if not base.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, base[:-1], None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def unsafe_inplace_cast(sig: Signature, values: tuple, tensors) -> str | None:
    """PyTorch's error if an in-place op's result cannot be cast to its tensor's dtype (x.mul_(0.5)
    on integers), else None. Fake tensors do not check this (their in-place kernels cast
    anything) and neither does a decomposition, which copies its result back."""
    if sig.mode is not Mode.INPLACE or not tensors:
        return None
    twin = _functional_twin(sig.op)
    if twin is None:
        return None
    _, result, _ = on_fakes(twin, sig, values, tensors)  # (the twin refusing what the op takes: no verdict)
    written = tensors[0].dtype  # (self: the first tensor of an in-place op)
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, written):
        return f"result type {_type_name(result.dtype)} can't be cast to the desired output type {_type_name(written)}"
    return None


def refused_dtypes(sig: Signature, values: tuple, tensors) -> str | None:
    """The CPU's error if a matmul's operands have different dtypes (fake tensors take them;
    compiler/inductor/operand_dtypes.py), else None."""
    from spyre_inductor.compiler.inductor.operand_dtypes import mixed_dtypes_error

    args, kwargs = _rebuild(sig, values, tensors)
    error = mixed_dtypes_error(sig.op, args, kwargs)
    return None if error is None else str(error)


def _type_name(dtype: torch.dtype) -> str:
    # PyTorch's words for it (c10's ScalarType names: Float, Long, Bool, Half, BFloat16...)
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool"}.get(dtype, str(dtype))


def _written_tensor_positions(sig: Signature, values: tuple) -> list[int]:
    """Positions in tensors_of(...) of the tensors the op writes."""
    positions, n = [], 0
    for i, (value, kind) in enumerate(zip(values, sig.kinds)):
        if kind is Kind.TENSOR:
            if isinstance(value, torch.Tensor):
                if i in sig.written:
                    positions.append(n)
                n += 1
        elif kind is Kind.TENSOR_LIST:
            n += sum(isinstance(t, torch.Tensor) for t in value)
    return positions


_TABLE = None


def _decompositions() -> dict:
    """Inductor's decomposition table without its out= entries (functionalization turns an out=
    call into the functional op plus a copy_ first, and the packet-wide registrations
    (``register_decomposition(aten.mm)``) also name ``mm.out`` with a function that takes no out=),
    and with spyre's own where Inductor's would not run on the card (decompositions.py)."""
    global _TABLE
    if _TABLE is None:
        from torch._inductor.decomposition import select_decomp_table

        from .decompositions import TABLE as SPYRE

        _TABLE = {op: fn for op, fn in select_decomp_table().items()
                  if not (isinstance(op, torch._ops.OpOverload) and any(a.is_out for a in op._schema.arguments))}
        _TABLE.update(SPYRE)
    return _TABLE


def _keys(*names: str):
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
    for name in names:
        if hasattr(torch._C.DispatchKey, name):  # (not every key has a Python name)
            keys = keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
    return keys


# What a kernel below autograd runs with excluded (autograd's and autocast's keys): a trace needs
# no more excluded than that. Called from a user's TorchDispatchMode (FlopCounterMode, a debug
# mode), this kernel runs with every key from Python down excluded, functionalization among them,
# and a trace there would see its fake tensors' functional wrappers as real tensors.
_KERNEL_EXCLUDES = _keys("AutogradOther", "AutogradNestedTensor", "AutocastCPU", "AutocastMTIA", "AutocastMAIA",
                         "AutocastXPU", "AutocastIPU", "AutocastHPU", "AutocastXLA", "AutocastMPS", "AutocastCUDA",
                         "AutocastPrivateUse1")


def _plain_dispatch():
    """The dispatch state of a kernel below autograd, whatever called it."""
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                           torch._C._dispatch_tls_local_exclude_set() & _KERNEL_EXCLUDES)


def trace(sig: Signature, values: tuple, tensors) -> tuple[torch.fx.GraphModule, list]:
    """The op's functionalized, decomposed graph over fake copies of `tensors`, and the fakes."""
    return trace_function(_graph_fn(sig, values), tensors)


def trace_function(fn, tensors) -> tuple[torch.fx.GraphModule, list]:
    """`fn(*tensors)`'s functionalized, decomposed graph over fake copies of `tensors` (what it
    writes in place becomes the graph's input mutations), and the fakes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    # detached: the kernel runs below autograd; the graph is the op's forward only
    fakes = [mode.from_tensor(t.detach()) for t in tensors]
    try:
        with _plain_dispatch(), _quiet_fakes(), mode, torch.no_grad():
            gm = make_fx(torch.func.functionalize(fn, remove="mutations"),
                         decomposition_table=_decompositions())(*fakes)
    except Exception as e:  # noqa: BLE001
        raise TraceError(f"{type(e).__name__}: {e}") from e
    return gm, fakes


_LAUNCH = re.compile(r"\blaunch_(jobplan|bucketed)\(")
_CPU = re.compile(r"\b(spyre_cpu_kernel_\w+|extern_kernels\.\w+|aten\.\w+(\.\w+)?|torch\.ops\.\w+\.\w+)\(")


def classify(source: str) -> tuple[int, tuple[str, ...]]:
    """(spyre programs launched, CPU calls) of a generated wrapper's ``call``."""
    body = source.partition("def call(")[2].partition("\ndef ")[0]
    programs, cpu = 0, []
    for line in body.splitlines():
        if _LAUNCH.search(line):
            programs += 1
            continue
        m = _CPU.search(line)
        if m is not None:
            cpu.append(m.group(1))
    return programs, tuple(cpu)


# Ops whose CPU kernel refuses a negative index ("index out of range in self", "index -1 is out
# of bounds for dimension 0 with size 4") where aten.index and aten.index_put, which their
# decompositions go through, wrap it as Python does: their graphs are compiled with indices that
# do not wrap, so the program's gather or scatter stops at a negative one, naming it.
_NO_NEGATIVE_INDEX = frozenset({"aten::index_select", "aten::index_copy", "aten::index_copy_", "aten::index_add",
                                "aten::index_add_", "aten::embedding_dense_backward"})


def compile_graph(gm: torch.fx.GraphModule, fakes: list, op: torch._ops.OpOverload) -> Compiled:
    """Inductor (with our backend registered) on the traced graph of `op`: its kernels' errors
    and warnings name `op` (not the decomposition's pieces), and index as `op`'s CPU kernel does."""
    from torch._inductor.compile_fx import compile_fx_inner

    from spyre_inductor.launcher import nesting
    from spyre_inductor.compiler.inductor import registration

    registration.register()
    start = time.perf_counter()
    with nesting.compiling_eager_op(op, wrap_negative=op._schema.name not in _NO_NEGATIVE_INDEX):
        fn = compile_fx_inner(gm, fakes)
    seconds = time.perf_counter() - start
    programs, cpu = classify(getattr(fn, "source_code", "") or "")
    return Compiled(fn, programs, cpu, seconds)
