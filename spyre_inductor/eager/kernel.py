"""The PrivateUse1 kernel of a compile-backed op: key, cache, compile on a miss, launch.

Per call (the warm path): bind the arguments in schema order, build the key
(key.py), look it up (cache.py) and run the entry (launch.py). On a miss the
call is traced and compiled (compile.py) under the compile lock, and whatever
came of it is cached: a compiled graph, a CPU route when the compiler
declined (so the decline is not retried per call), or a resize of out=.

Inside a trace: Dynamo and AOTAutograd trace spyre code on fake tensors, which
never reach a backend kernel, so what a torch.compile'd graph captures of an
op is Inductor's decomposition of it by construction, and it is fused with its
neighbours. Should this kernel still be reached during a torch.compile
(this thread's Dynamo CompileContext or TracingContext is active: an op run on
real spyre tensors while Dynamo traces, or Inductor's constant folding
evaluating `full` on spyre), it runs the op's composite kernel or the CPU
fallback, as before issue 19, and never compiles inside a compile. An op reached
while this thread runs an eager compile or a compiled graph (an extern ATen
kernel inside the graph, Inductor evaluating a constant) is nested: it runs
through the CPU fallback, never a compile inside a compile. So does an op
that torch runs to format a tensor for printing (device/fallback.py:
formatting_a_tensor): not an op the user called, nothing to compile.
"""

from __future__ import annotations

import os

import torch

from spyre_inductor.launcher import loaded, nesting
from spyre_inductor.launcher.nesting import busy, dynamo_compiling
from spyre_inductor.device import fallback

from . import compile as compiling
from . import scalars
from .cache import CACHE
from .key import make_key, tensors_of
from .launch import CompiledEntry, CpuRoute, InputsRejected, Resize, ValueKeyed, not_compiled
from .signature import Mode, Signature

__all__ = ["ENABLED", "entry_for", "make_kernel", "set_enabled"]


# Off: every routed op runs through the CPU fallback, as before issue 19 (benchmarks compare the
# two; SPYRE_EAGER_COMPILE=0 sets it at start-up). One list so the kernels read it without a lookup.
ENABLED = [os.environ.get("SPYRE_EAGER_COMPILE", "1") not in ("0", "")]


def set_enabled(on: bool) -> None:
    """Turn the compile-backed eager path on or off (off: the CPU fallback runs every op)."""
    ENABLED[0] = bool(on)


def make_kernel(sig: Signature):
    """The PrivateUse1 kernel for `sig`'s op."""
    op = sig.op
    generator_at = tuple(i for i, n in enumerate(sig.names) if sig.has_generator and n == "generator")
    compiling = dynamo_compiling  # (this thread's: launcher/nesting.py)
    aliasing = sig.mode is not Mode.FUNCTIONAL
    enabled = ENABLED
    formatting = fallback.formatting_a_tensor

    def kernel(*args, **kwargs):
        if formatting():
            # torch formatting a tensor for repr/str: not an op the user called (fallback.py)
            return fallback.run(op, args, kwargs)
        if not enabled[0]:
            return not_compiled(sig, args, kwargs, "compiled eager ops are off (SPYRE_EAGER_COMPILE=0)")
        if busy():
            return not_compiled(sig, args, kwargs, "reached inside an eager compile or a compiled graph")
        if compiling():
            # Dynamo tracing, or a torch.compile's Inductor evaluating a constant on spyre
            # (constant folding runs `full`/`scalar_tensor` eagerly): never compile inside a compile
            return _in_trace(sig, args, kwargs)
        values = _scalars_on_device(sig, sig.bind(args, kwargs))
        key = make_key(sig, values)
        if key is None:
            return not_compiled(sig, args, kwargs, "an argument is not a spyre tensor")
        if generator_at and any(values[i] is not None for i in generator_at):
            # The program draws from the device generator's state Inductor passes in (its seeds
            # input); an explicit generator's state cannot travel into it yet.
            return not_compiled(sig, args, kwargs, "an explicit generator")
        if aliasing and _aliased_write(sig, tensors_of(sig, values), values):
            # (each call, not only the first: the key does not say which tensors share memory)
            return not_compiled(sig, args, kwargs, "a tensor it writes shares memory with another of its arguments")
        entry = CACHE.get(key)
        if entry is None:
            entry = entry_for(sig, key, values, kernel)
        return entry.run(sig, values, args, kwargs)

    kernel.__name__ = f"spyre_eager_{sig.name.replace('::', '_').replace('.', '_')}"
    return kernel


def _scalars_on_device(sig: Signature, values: tuple) -> tuple:
    """`values` with each CPU 0-d tensor the op reads beside a spyre tensor copied to that
    tensor's device: PyTorch lets CPU scalars mix in (as CUDA passes them to its kernels), and a
    0-d spyre tensor promotes exactly as the CPU one does, so the op compiles like any other."""
    device, scalars = None, []
    for i in sig.tensor_at:
        t = values[i]
        if isinstance(t, torch.Tensor):
            if t.device.type == "spyre":
                device = device or t.device
            elif t.device.type == "cpu" and t.dim() == 0 and i not in sig.written:
                scalars.append(i)
    if device is None or not scalars:
        return values
    values = list(values)
    for i in scalars:  # (non-blocking: the source is snapshotted at enqueue, and no sync per call)
        values[i] = values[i].to(device, non_blocking=True)
    return tuple(values)


def _in_trace(sig, args, kwargs):
    # Not the decomposition run eagerly here: its own ops would come back to this kernel inside
    # the same compile (fill_ -> full_like -> fill_ ...). What the trace captures of the op is
    # already the decomposition (fake tensors never reach this kernel); a real tensor reaching it
    # is Inductor's own business (constant folding), run as before issue 19.
    return not_compiled(sig, args, kwargs, "reached inside a torch.compile")


def _aliased_write(sig: Signature, tensors, values) -> bool:
    """Whether a tensor the op writes shares memory with another of its tensors. The compiled
    graph treats its inputs as distinct buffers (a program reading what it overwrites
    elsewhere would read the new values): such calls go to the CPU fallback."""
    written = [values[i] for i in sig.written if values[i] is not None]
    ids = {id(t) for t in written}
    storages = {t.untyped_storage().data_ptr() for t in written}
    seen_written = 0
    for t in tensors:
        if id(t) in ids:
            seen_written += 1
            if seen_written > len(written):
                return True  # one written tensor passed twice
            continue
        if t.untyped_storage().data_ptr() in storages:
            return True
    return False


def entry_for(sig: Signature, key, values, kernel):
    """Compile (or decline) the call; cache and return its entry."""
    with compiling.COMPILE_LOCK:
        entry = CACHE.peek(key)  # another thread may have compiled it meanwhile
        if entry is not None:
            return entry
        with nesting.nested():
            try:
                entry, compiled = _build(sig, values, kernel, scalars.positions(sig, values, key))
            except compiling.TraceError as e:
                entry, compiled = None, None
                trace_error = e
        if entry is None:
            tensors = tensors_of(sig, values)
            if isinstance(trace_error, compiling.Rejected) or not compiling.runs_on_fake(sig, values, tensors):
                return InputsRejected(str(trace_error))  # the caller's error (not cached)
            if compiling.data_dependent(trace_error):
                entry = CpuRoute(f"its output's shape depends on its data ({_first_line(trace_error)})")
            else:  # the op takes these inputs; our trace of it failed: a decline like any other
                entry = CpuRoute(f"tracing its decomposition failed: {_first_line(trace_error)}")
            compiled = None
        kind = "compiled" if compiled is not None else "cpu" if isinstance(entry, CpuRoute) else "other"
        CACHE.put(key, entry, kind=kind, seconds=compiled.seconds if compiled else 0.0)
        return entry


def _build(sig: Signature, values, kernel, travel=()):
    tensors, dtypes, checks = tensors_of(sig, values), (), ()
    try:
        compiling.check_dtypes(tensors)
        if any(isinstance(values[i], torch.Tensor) and torch._debug_has_internal_overlap(values[i]) == 1
               for i in sig.written):  # (an expanded tensor written in place): PyTorch's error
            raise compiling.Rejected("unsupported operation: more than one element of the written-to tensor refers "
                                     "to a single memory location. Please clone() the tensor before performing "
                                     "the operation.")
        if (refused := compiling.unsafe_inplace_cast(sig, values, tensors)) is not None:
            raise compiling.Rejected(refused)
        if (refused := compiling.refused_dtypes(sig, values, tensors)) is not None:
            raise compiling.Rejected(refused)
        if not travel and (rejected := compiling.rejection_on_fake(sig, values, tensors)) is not None:
            # the op refuses these inputs where its decomposition would not (an in-place result
            # that cannot be cast to the tensor's dtype): PyTorch's error, not a program
            raise compiling.TraceError(f"{type(rejected).__name__}: {_first_line(rejected)}")
        if sig.mode is not Mode.FUNCTIONAL and _aliased_write(sig, tensors, values):
            raise compiling.Declined("a tensor it writes shares memory with another of its arguments")
        if sig.mode is Mode.OUT:
            shapes = compiling.resized_outputs(sig, values, tensors)
            if shapes is not None:
                return Resize(shapes, kernel), None
        tsig = sig
        if travel:  # (issue 19) traced and compiled with the scalars as 0-d inputs: scalars.py
            # the op on fakes with the scalars as they came, then as 0-d inputs: the same outputs
            # (dtypes, shapes), or the same error, or the scalars cannot travel
            found = scalars.outputs(sig, values)
            if found and found[0] == "raises":  # the caller's inputs are wrong: PyTorch's error
                compiling.trace(sig, values, tensors)  # (raises the TraceError entry_for handles)
                raise compiling.TraceError(f"{found[1].__name__} on fake tensors")
            out_dtypes = scalars.dtypes_of(found)
            tsig = scalars.traced_signature(sig, travel)
            tvalues, dtypes = scalars.with_inputs(sig, values, travel, tensors, out_dtypes)
            if scalars.outputs(tsig, tvalues) != found:
                return ValueKeyed("a 0-d input promotes unlike the scalar", kernel), None
            checks = scalars.checks(sig, travel, out_dtypes)
            values, tensors = tvalues, tensors_of(tsig, tvalues)
        try:
            compiled = _compiled(sig, tsig, values, tensors)
        except (compiling.TraceError, compiling.Declined, NotImplementedError) as e:
            if not travel:
                raise
            # with the scalar as a 0-d input it does not compile (or not entirely in programs):
            # each value compiles under its own key, as before issue 19
            return ValueKeyed(f"with the scalar as a 0-d input: {_first_line(e)}", kernel), None
        if travel and (compiled.cpu_calls or not scalars.launched_only(
                getattr(compiled.fn, "source_code", "") or "", scalars.input_names(tsig, values, travel))):
            loaded.release(compiled.fn)  # (not kept: its programs would stay on the device for nothing)
            return ValueKeyed("the compiled graph uses a scalar other than as a launch argument", kernel), None
        return CompiledEntry(sig, compiled, travel, dtypes, tsig, checks), compiled
    except compiling.Declined as e:
        return CpuRoute(str(e)), None


def _compiled(sig: Signature, tsig: Signature, values, tensors):
    gm, fakes = compiling.trace(tsig, values, tensors)
    try:
        compiled = compiling.compile_graph(gm, fakes, sig.op)
    except compiling.TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - any compile failure leaves the op on the CPU
        if _strict_refusal(e):
            # strict mode refused a CPU part of the graph: not a decline to cache (the same
            # call compiles, with a CPU part, once strict mode is off)
            raise NotImplementedError(f"spyre: {sig.name} cannot run entirely in spyre programs: {e}") from e
        raise compiling.Declined(f"the compile failed: {type(e).__name__}: {_first_line(e)}") from e
    if compiled.programs == 0 and compiled.cpu_calls:
        loaded.release(compiled.fn)
        raise compiling.Declined(f"Inductor runs it outside any spyre program ({', '.join(compiled.cpu_calls)})")
    return compiled


def _strict_refusal(e: BaseException) -> bool:
    """Whether strict mode refusing a CPU part is behind `e` (Inductor wraps what a backend raises)."""
    from spyre_inductor.launcher.fallback_policy import SpyreStrictError

    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, SpyreStrictError):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
