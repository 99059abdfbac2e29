"""``torch.optim.Adam``/``AdamW(fused=True)`` on spyre: each parameter's update as one compiled program.

The fused optimizers call ``aten::_fused_adam_`` / ``_fused_adamw_`` once per step with every
parameter of a device and dtype in lists, and write the parameters, both moments (and the
amsgrad maximum, and the unscaled gradients under a GradScaler) in place. Its spyre kernel here
decomposes the update of one parameter into pointwise ops, traced and compiled through the same
path as every compile-backed eager op (compile.trace_function: functionalized, Inductor's
decompositions, compile_fx_inner with our backend); the writes are the graph's input mutations,
so Inductor fuses the whole update into one program that reads the parameter, its gradient and
its moments once and writes them back. Entries are cached per parameter layout and
hyperparameters (layers of one shape share theirs), in the eager cache (cache.py).

What travels at launch, so that a step changes nothing the compile depends on: the step count
(the optimizer's device tensor) and the learning rate (a 0-d spyre tensor, given or copied from
the float each call: a schedule changes it every step). The betas, eps and weight decay are
baked (constant over a run).

The arithmetic is the CPU kernel's (aten/src/ATen/native/cpu/FusedAdamKernel.cpp), in fp32 for
fp16/bf16 parameters as its opmath: the bias corrections, which the CPU kernel computes in
double from the step on the host, are computed on chip as ``-expm1(step * ln(beta))`` with the
logarithm taken on the host in double: ``1 - beta ** step`` in fp32 would lose 5 digits for
beta2 = 0.999, this keeps fp32's. ``exp_avg.lerp_(grad, 1 - beta1)`` is taken in the CPU's
form for its weight (below 0.5: ``m + w * (g - m)``, else ``g - (g - m) * (1 - w)``), rounded
twice where the CPU's fused multiply-add rounds once.

Calls the compiled path does not take (a dtype spyre programs do not compute, a parameter off
spyre, inside a trace) run through the CPU fallback, which strict mode refuses naming the op.
"""

from __future__ import annotations

import math
import weakref

import torch

from spyre_inductor.device import fallback
from spyre_inductor.launcher import loaded, nesting
from spyre_inductor.launcher.nesting import STATE, busy, dynamo_compiling

from . import compile as compiling
from .cache import CACHE

aten = torch.ops.aten

# The dtypes a parameter may have here (the moments have the parameter's; the step is fp32).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def update(decoupled: bool, beta1: float, beta2: float, weight_decay: float, eps: float, amsgrad: bool,
           maximize: bool, scaled: bool, skipping: bool):
    """The update of one parameter as a function of its tensors, writing them in place:
    ``fn(param, grad, exp_avg, exp_avg_sq, [max_exp_avg_sq], step, lr, [grad_scale], [found_inf])``.
    `decoupled`: AdamW's weight decay (the parameter scaled by 1 - lr * wd), else Adam's (wd * p
    added to the gradient)."""
    w = 1.0 - beta1
    log_beta1, log_beta2 = math.log(beta1), math.log(beta2)

    def fn(*tensors):
        tensors = list(tensors)
        param, grad, exp_avg, exp_avg_sq = tensors[:4]
        rest = tensors[4:]
        max_exp_avg_sq = rest.pop(0) if amsgrad else None
        step, lr = rest[0], rest[1]
        grad_scale = rest[2] if scaled else None
        found_inf = rest[-1] if skipping else None

        p, g, m, v = param.float(), grad.float(), exp_avg.float(), exp_avg_sq.float()
        if grad_scale is not None:
            g = g / grad_scale.float()
            unscaled = g
        if maximize:
            g = -g
        if weight_decay != 0:
            if decoupled:
                p = p * (1 - lr * weight_decay)
            else:
                g = g + p * weight_decay
        if abs(w) < 0.5:
            m = m + w * (g - m)
        else:
            m = g - (g - m) * (1.0 - w)
        v = v * beta2 + (1.0 - beta2) * g * g
        if amsgrad:
            v_max = torch.maximum(max_exp_avg_sq.float(), v)
        bias_correction1 = -torch.expm1(step * log_beta1)
        bias_correction2_sqrt = torch.sqrt(-torch.expm1(step * log_beta2))
        step_size = lr / bias_correction1
        denom = torch.sqrt(v_max if amsgrad else v) / bias_correction2_sqrt + eps
        p = p + (-step_size) * m / denom

        writes = [(param, p), (exp_avg, m), (exp_avg_sq, v)]
        if amsgrad:
            writes.append((max_exp_avg_sq, v_max))
        if grad_scale is not None:
            writes.append((grad, unscaled))
        for target, value in writes:
            value = value.to(target.dtype)
            if found_inf is not None:  # (the CPU kernel returns before touching anything)
                value = torch.where(found_inf == 1.0, target, value)
            target.copy_(value)
        return ()

    return fn


class _Entry:
    """One compiled parameter update (its graph is released with the entry, as launch.py's)."""

    __slots__ = ("fn", "programs", "__weakref__")

    def __init__(self, compiled):
        self.fn = compiled.fn
        self.programs = compiled.programs
        weakref.finalize(self, loaded.release, compiled.fn).atexit = False

    def describe(self) -> str:
        return f"{self.programs} spyre program launch(es) per parameter"


class _Declined:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def describe(self) -> str:
        return f"CPU fallback: {self.reason}"


def _layout(t: torch.Tensor):
    offset = t.storage_offset()
    return (t.dtype, t.shape, t.stride(), t.get_device(), (offset * t.element_size()) & 127 if offset else 0)


class _Kind:
    """What leads an update's cache key, as a Signature leads an op's (key.py): the op."""

    __slots__ = ("op", "name")

    def __init__(self, op, name: str):
        self.op, self.name = op, name


def make_kernel(op, decoupled: bool):
    """The PrivateUse1 kernel of `op` (_fused_adam_ or _fused_adamw_, either overload)."""
    name = f"{op._schema.name}.{op._overloadname}"
    kind = _Kind(op, name)

    def kernel(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
               weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        args = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        kwargs = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
                      maximize=maximize, grad_scale=grad_scale, found_inf=found_inf)
        if not self:
            return None
        from .kernel import ENABLED

        if not ENABLED[0]:
            return fallback.run(op, args, kwargs, "compiled eager ops are off (SPYRE_EAGER_COMPILE=0)")
        if busy() or dynamo_compiling():
            return fallback.run(op, args, kwargs, "reached inside a compile or a compiled graph")
        refused = _refused(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad, grad_scale,
                           found_inf)
        if refused is not None:
            return fallback.run(op, args, kwargs, refused)
        device = self[0].device
        if not isinstance(lr, torch.Tensor):
            lr = torch.tensor(lr, dtype=torch.float32)
        if lr.device != device:
            lr = lr.to(device, non_blocking=True)
        extra = [t for t in (grad_scale, found_inf) if t is not None]
        extra = [t if t.device == device else t.to(device, non_blocking=True) for t in extra]
        hyper = (decoupled, float(beta1), float(beta2), float(weight_decay), float(eps), bool(amsgrad),
                 bool(maximize), grad_scale is not None, found_inf is not None)
        for i in range(len(self)):
            tensors = [self[i], grads[i], exp_avgs[i], exp_avg_sqs[i]]
            if amsgrad:
                tensors.append(max_exp_avg_sqs[i])
            tensors += [state_steps[i], lr, *extra]
            key = (kind, hyper, *(_layout(t) for t in tensors))
            entry = CACHE.get(key)
            if entry is None:
                entry = _compile(op, name, key, hyper, tensors)
            if isinstance(entry, _Declined):
                # (the whole call, not this parameter alone: the others may be updated already,
                # and the fallback runs the CPU kernel over every parameter: only the first can
                # decline, as every entry shares the hyperparameters and the dtype)
                return fallback.run(op, args, kwargs, entry.reason)
            outer, STATE.busy = busy(), True
            try:
                entry.fn(tensors)
            finally:
                STATE.busy = outer
        return None

    kernel.__name__ = f"spyre_eager_{op._schema.name.partition('::')[2]}_{op._overloadname}"
    return kernel


def _refused(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad, grad_scale, found_inf):
    """Why the compiled path does not take the call, or None."""
    n = len(params)
    lists = [grads, exp_avgs, exp_avg_sqs, steps] + ([max_exp_avg_sqs] if amsgrad else [])
    if any(len(x) != n for x in lists):
        return "its tensor lists differ in length"
    dtype, device = params[0].dtype, params[0].device
    if device.type != "spyre":
        return "a parameter is not on spyre"
    if dtype not in _DTYPES:
        return f"{dtype} is not a dtype spyre programs compute"
    for group in [params] + lists:
        for t in group:
            if t.device != device:
                return "its tensors are not all on one spyre device"
    for group in [params, grads, exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad else []):
        for t in group:
            if t.dtype != dtype:
                return "its parameters, gradients and moments do not all have one dtype"
    for t in steps:
        if t.numel() != 1 or not t.dtype.is_floating_point:
            return "a step is not a one-element floating tensor"
    for t in (grad_scale, found_inf):
        if t is not None and (t.numel() != 1 or t.device.type not in ("spyre", "cpu")):
            return "grad_scale or found_inf is not a one-element tensor"
    for i, p in enumerate(params):
        if grads[i].shape != p.shape or exp_avgs[i].shape != p.shape or exp_avg_sqs[i].shape != p.shape:
            return "a gradient or moment's shape is not its parameter's"
    return None


def _compile(op, name, key, hyper, tensors):
    """Compile one parameter's update (or decline it); cache and return the entry."""
    with compiling.COMPILE_LOCK:
        entry = CACHE.peek(key)
        if entry is not None:
            return entry
        with nesting.nested():
            try:
                gm, fakes = compiling.trace_function(update(*hyper), tensors)
                compiled = compiling.compile_graph(gm, fakes, op)
            except Exception as e:  # noqa: BLE001 - strict or not, a compile failure is named
                from .kernel import _first_line, _strict_refusal

                if _strict_refusal(e):
                    raise NotImplementedError(f"spyre: {name} cannot run entirely in spyre programs: {e}") from e
                entry = _Declined(f"the compile failed: {type(e).__name__}: {_first_line(e)}")
                CACHE.put(key, entry, kind="cpu")
                return entry
        if compiled.cpu_calls:
            loaded.release(compiled.fn)
            entry = _Declined(f"its update runs partly on the CPU ({', '.join(compiled.cpu_calls)})")
            CACHE.put(key, entry, kind="cpu")
            return entry
        entry = _Entry(compiled)
        CACHE.put(key, entry, kind="compiled", seconds=compiled.seconds)
        return entry


def install(lib: torch.library.Library) -> list[str]:
    """Register the kernels on `lib` (aten, IMPL); the names registered."""
    names = []
    for packet, decoupled in ((aten._fused_adam_, False), (aten._fused_adamw_, True)):
        for overload in packet.overloads():
            op = getattr(packet, overload)
            qualified = op._schema.name + ("" if overload == "default" else f".{overload}")
            lib.impl(qualified.partition("::")[2], make_kernel(op, decoupled), "PrivateUse1")
            names.append(qualified)
    return names
