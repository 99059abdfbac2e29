"""Which aten ops get a compile-backed PrivateUse1 kernel, and registering them.

The table names operators (overload packets) by family; every overload of
one whose schema the eager path takes (signature.signature_of) is registered:
the functional form, ``out=`` and the in-place form (``add_``) are separate
operators in the table. Left out, whatever the table says:

* CompositeImplicitAutograd overloads (``linear``, ``softmax``,
  ``index_select`` with a Dimname...): PyTorch decomposes them above the
  backend, into ops that are here; a backend kernel would also take their
  autograd away.
* overloads that already have a spyre kernel (views, copies, resize).
* random ops (``normal_``, ``uniform_``, ``bernoulli``, ``randint``...):
  another issue's. The mechanism takes them as they are (a Generator
  argument is keyed; an explicit generator goes to the CPU fallback, the
  default one is Inductor's seeds input): adding their names to RANDOM
  below, once the compiler lowers random ops, routes them.

An op in the table that the compiler cannot do for some inputs is not an
error: that call's entry is a CPU route (warned once per op; strict mode
raises naming the op and why).
"""

from __future__ import annotations

import torch

from spyre_inductor.device.routes import HOST_ROUTES

from .convolution import make_convolution_kernel, with_host_route
from .kernel import make_kernel
from .signature import signature_of

POINTWISE = (
    "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
    "sigmoid", "tanh", "relu", "leaky_relu", "hardtanh", "hardsigmoid", "hardswish", "gelu", "silu",
    "softplus", "mish", "elu", "sin", "cos", "tan", "erf", "floor", "ceil", "round", "trunc", "frac", "sign",
    "sgn", "isnan", "isinf", "isfinite", "isneginf", "isposinf", "nan_to_num", "logical_not", "bitwise_not", "square",
    "add", "sub", "rsub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "minimum", "maximum", "fmax", "fmin",
    "clamp", "clamp_min", "clamp_max", "where", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift", "lerp", "addcmul", "addcdiv", "threshold", "masked_fill",
    "fill", "fill_", "zero", "zero_", "clone", "_to_copy",
    # their in-place forms
    "abs_", "neg_", "exp_", "exp2_", "expm1_", "log_", "log2_", "log10_", "log1p_", "sqrt_", "rsqrt_",
    "reciprocal_", "sigmoid_", "tanh_", "relu_", "leaky_relu_", "hardtanh_", "hardsigmoid_", "hardswish_",
    "gelu_", "silu_", "mish_", "elu_", "sin_", "cos_", "tan_", "erf_", "floor_", "ceil_", "round_", "trunc_",
    "frac_", "sign_", "sgn_", "nan_to_num_", "logical_not_", "bitwise_not_", "square_",
    "add_", "sub_", "mul_", "div_", "floor_divide_", "remainder_", "fmod_", "pow_", "clamp_", "clamp_min_", "clamp_max_",
    "eq_", "ne_", "lt_", "le_", "gt_", "ge_", "logical_and_", "logical_or_", "logical_xor_",
    "bitwise_and_", "bitwise_or_", "bitwise_xor_", "bitwise_left_shift_", "bitwise_right_shift_", "lerp_",
    "addcmul_", "addcdiv_", "threshold_", "masked_fill_",
    # backward pointwise ops autograd calls
    "threshold_backward", "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward",
    "leaky_relu_backward", "hardtanh_backward", "elu_backward", "softplus_backward", "mish_backward",
    "hardsigmoid_backward", "hardswish_backward",
)

REDUCTIONS = (
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all", "var", "std",
    "var_mean", "std_mean", "logsumexp", "_softmax", "_log_softmax", "_safe_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "cumsum", "cumprod", "cumsum_", "cumprod_", "norm", "linalg_vector_norm",
    "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    # losses and their backward (what training a model calls)
    "mse_loss", "mse_loss_backward", "nll_loss_forward", "nll_loss_backward", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy", "binary_cross_entropy_backward",
)

MATMULS = ("mm", "bmm", "addmm", "addmm_", "baddbmm", "baddbmm_", "dot", "mv", "addmv")

DATA_MOVEMENT = (
    "cat", "stack", "constant_pad_nd", "index_select", "embedding", "embedding_dense_backward", "gather",
    "scatter", "scatter_", "scatter_add", "scatter_add_", "index_add", "index_add_", "index_copy",
    "index_copy_", "index_put", "index_put_", "_index_put_impl_", "index", "roll", "tril", "triu", "tril_", "triu_",
    "slice_scatter", "select_scatter", "repeat", "flip", "arange", "linspace", "isin",
    "scatter_reduce", "scatter_reduce_", "_embedding_bag", "_embedding_bag_forward_only",
)

# sort and topk: the sort family's network (compiler/inductor/sorting.py, families/sort/); argsort is
# CompositeImplicitAutograd (PyTorch calls sort for it)
SORTING = ("sort", "topk")

# mixture-of-experts routing: counting per expert, the grouped matmul (compiler/inductor/experts.py)
EXPERTS = ("histc", "_grouped_mm")

ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",)

# What PyTorch dispatches a spyre convolution and its backward to (conv2d as a patch gather and a
# matmul: eager/convolution.py); their CPU route is the CPU convolution (device/routes.py).
CONVOLUTIONS = ("convolution_overrideable", "convolution_backward_overrideable")

# Random ops: not routed yet (issue 19's RNG half, compiled in another branch).
RANDOM: tuple[str, ...] = ()

ROUTED = (POINTWISE + REDUCTIONS + MATMULS + DATA_MOVEMENT + SORTING + EXPERTS + RANDOM
          + CONVOLUTIONS)

_lib: torch.library.Library | None = None
registered: dict[str, object] = {}   # "aten::add.Tensor" -> Signature


def overloads():
    """(overload, qualified name) of every overload the table routes."""
    for packet_name in ROUTED:
        packet = getattr(torch.ops.aten, packet_name, None)
        if packet is None:
            continue
        for overload_name in packet.overloads():
            op = getattr(packet, overload_name)
            qualified = op._schema.name + ("" if overload_name == "default" else f".{overload_name}")
            yield op, qualified, overload_name


def install() -> None:
    """Register the compile-backed kernels (once; cheap: no Inductor import)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, qualified, overload_name in overloads():
        try:
            if has_kernel(qualified, "CompositeImplicitAutograd") or has_kernel(qualified, "PrivateUse1"):
                continue
        except RuntimeError:  # a TorchScript-only overload (aten::neg.int): not in the dispatcher
            continue
        sig = signature_of(op)
        if sig is None:
            continue
        if op in HOST_ROUTES:
            sig = with_host_route(sig)
            kernel = make_convolution_kernel(sig)
        else:
            kernel = make_kernel(sig)
        lib.impl(qualified.partition("::")[2], kernel, "PrivateUse1")
        registered[qualified] = sig
    # The fused optimizers write lists of tensors: a kernel of their own over the same compile path
    from . import fused_adam

    fused_adam.install(lib)
    _lib = lib
