"""Shared by the Inductor-facing compiler tests: compile on spyre, record what became of each node."""

from __future__ import annotations

import warnings

import torch
from torch._inductor.utils import run_and_get_code

from spyre_inductor.compiler.ir.kernel_ir import Constant, Load, Op
from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.device import fallback

SPYRE = torch.device("spyre", 0)


def to_spyre(args, device=SPYRE):
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def compile_on_spyre(fn, *cpu_args, device=SPYRE, **compile_kwargs):
    """Compile `fn` (fresh: no FX cache, dynamo reset) and run it on spyre copies of `cpu_args`.

    Returns (outputs as a tuple, spyre args after the call, kernel records,
    compiler warnings, the generated wrapper source).
    """
    torch._dynamo.reset()
    fallback.reset_warnings()  # the once-per-op record both fallbacks share
    args = to_spyre(cpu_args, device)
    with warnings.catch_warnings(record=True) as caught, record_kernels() as records, \
            torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("always")
        out, code = run_and_get_code(torch.compile(fn, **compile_kwargs), *args)
    out = out if isinstance(out, tuple) else (out,)
    spyre_warnings = [str(w.message) for w in caught if "cannot be compiled for spyre" in str(w.message)]
    return out, args, records, spyre_warnings, code[0]


def refuse_every_kernel(monkeypatch) -> None:
    """Make the backend refuse every kernel (Unsupported "refused by the test"), so each node
    runs as an in-graph CPU fallback kernel."""
    from spyre_inductor.compiler import backend
    from spyre_inductor.compiler.ir.errors import Unsupported

    def refuse(kernel, artifact_root, **kwargs):
        raise Unsupported("refused by the test")

    monkeypatch.setattr(backend, "compile_kernel", refuse)


def assert_close_to_cpu(out, ref, **tol):
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert o.device.type == "spyre"
        torch.testing.assert_close(o.cpu(), r, **tol)


def loads(kernel):
    return [v for v in kernel.values if isinstance(v, Load)]


def op_names(kernel):
    return [v.name for v in kernel.values if isinstance(v, Op)]


def constants(kernel):
    return [(v.value, v.dtype) for v in kernel.values if isinstance(v, Constant)]


def input_like(kernel, tensor):
    """The kernel's input buffers with `tensor`'s shape and strides."""
    return [b for b in kernel.buffers if b.name in kernel.inputs
            and b.shape == tuple(tensor.shape) and b.strides == tuple(tensor.stride())]
