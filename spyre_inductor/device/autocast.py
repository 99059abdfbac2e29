"""Autocast for spyre: cast rules on the AutocastPrivateUse1 dispatch key (issue 19).

torch 2.13 ships cast rules for CPU, CUDA, XPU and MPS only; for PrivateUse1 every op falls
through (spyre_runtime/csrc/kernels.cpp), so under ``torch.autocast("spyre")`` a matmul would
stay fp32. These kernels are the rules, with CUDA's lists (aten/src/ATen/autocast_mode.cpp) as
the reference for which op gets which policy:

* LOWER: matmuls, linear, convolutions, RNN cells, SDPA run in the autocast dtype
  (``torch.get_autocast_dtype("spyre")``: fp16 by default, bf16 if asked for; both are
  supported, api.get_amp_supported_dtype);
* FP32: ops that lose too much in 16 bits (exp, log, pow, norms, losses, softplus, logsumexp,
  distances, upsampling) run in fp32;
* FP32_SET_OPT_DTYPE: softmax, log_softmax, sum, prod, cumsum, cumprod, vector/matrix norms
  run with ``dtype=torch.float32`` unless the caller gave a dtype;
* PROMOTE: ops that mix operands (cat, stack, index_put, scatter_add, addcmul, dot, ...) run in
  the widest floating dtype among them.

Only floating spyre tensors other than fp64 are cast (CUDA's "eligible"). The kernel sits above
Autograd (Autocast keys come first), so autograd records the casts and gradients come back in
the parameters' dtypes. Inside torch.compile the same kernels run while AOT traces the graph,
so the casts become part of the compiled programs.

Casts to the autocast dtype go through autocast's own cached cast (``spyre::autocast_cast``, a
small C++ op: the cache has no Python binding), as CUDA's do: within one autocast region an fp32
leaf that requires grad (a weight) is cast once however many ops use it, and torch.autocast
clears the cache when its outermost region exits.

Installed at device registration (device/__init__.py), cheap: no Inductor import.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_lib: torch.library.Library | None = None

LOWER = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = ("prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                      "linalg_matrix_norm", "sum")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add", "cat", "stack")


def _eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "spyre"
            and t.dtype != torch.float64)


def _cast(value, dtype: torch.dtype, cast=lambda t, dtype: t.to(dtype)):
    if _eligible(value):
        return value if value.dtype == dtype else cast(value, dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, cast) for v in value)
    return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _widest(args, kwargs) -> torch.dtype | None:
    dtypes = {t.dtype for v in (*args, *kwargs.values()) for t in _tensors(v) if _eligible(t)}
    if not dtypes:
        return None
    if len(dtypes) == 1:
        return dtypes.pop()
    return torch.float32  # fp16 with bf16, or either with fp32: fp32 holds both


class _Off:
    """Autocast off for the op's own call (else the op would come back to this kernel)."""

    def __enter__(self):
        self._guard = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))
        self._guard.__enter__()

    def __exit__(self, *exc):
        self._guard.__exit__(*exc)
        return False


def _cast_cached(value, dtype: torch.dtype):
    """_cast to the autocast dtype, through autocast's cache of casted weights."""
    return _cast(value, dtype, torch.ops.spyre.autocast_cast)


def _lower(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("spyre")
        with _Off():
            return op(*_cast_cached(args, dtype), **_cast_cached(kwargs, dtype))
    return kernel


def _fp32(op):
    def kernel(*args, **kwargs):
        with _Off():
            return op(*_cast(args, torch.float32), **_cast(kwargs, torch.float32))
    return kernel


def _promote(op):
    def kernel(*args, **kwargs):
        dtype = _widest(args, kwargs)
        with _Off():
            if dtype is None:
                return op(*args, **kwargs)
            return op(*_cast(args, dtype), **_cast(kwargs, dtype))
    return kernel


def _set_opt_dtype(op):
    names = [a.name for a in op._schema.arguments]
    position = names.index("dtype")

    def kernel(*args, **kwargs):
        # fp32 output unless the caller chose a dtype, when the input is a castable tensor
        given = args[position] if position < len(args) else kwargs.get("dtype")
        with _Off():
            if given is not None or not args or not _eligible(args[0]):
                return op(*args, **kwargs)
            if position < len(args):
                args = (*args[:position], torch.float32, *args[position + 1:])
            else:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


def _overloads(name: str):
    packet = getattr(aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in packet.overloads()]


def rules() -> dict[str, str]:
    """{overload name: policy} of every registered rule (tests, documentation)."""
    out = {}
    for policy, names in (("lower", LOWER), ("fp32", FP32), ("fp32_set_opt_dtype", FP32_SET_OPT_DTYPE),
                          ("promote", PROMOTE)):
        for name in names:
            for op in _overloads(name):
                if policy == "fp32_set_opt_dtype" and "dtype" not in [a.name for a in op._schema.arguments]:
                    continue  # (an out= or Dimname overload without a dtype: falls through)
                if op._schema.overload_name.endswith("out"):
                    continue  # autocast leaves out= variants alone, as CUDA's does
                out[op.name()] = policy
    return out


_MAKERS = {"lower": _lower, "fp32": _fp32, "fp32_set_opt_dtype": _set_opt_dtype, "promote": _promote}


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for qualified, policy in rules().items():
        name = qualified.split("::", 1)[1]
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet), overload or "default")
        _lib.impl(name, _MAKERS[policy](op), _KEY)
