"""What each reduction is: its identity, how two partial results combine, what it accumulates in.

A "dot" (a matmul's reduction: the sum over k of its argument, a product
of two operands) is a sum here: a matmul the matmul family declines is
still planned as a reduction.
"""

from __future__ import annotations

import torch

from ..ir.errors import Unsupported
from ..ir.kernel_ir import TORCH_DTYPES
from .layout import FLOATS, operand_value

IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": False, "all": True}
# The binary step that combines two partial results of a reduction (or two scan prefixes).
COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "any": "or", "all": "and"}
ALIASES = {"dot": "sum"}
INTEGERS = ("int64", "int32", "int8")
INDEX_OPS = {"argmax": "max", "argmin": "min"}
WELFORD = ("welford_mean", "welford_m2", "welford_weight")


def op_of(name: str) -> str:
    """The reduction a kernel IR reduction computes (a dot is the sum of its product)."""
    return ALIASES.get(name, name)


def identity(op: str, dtype: str):
    """The fill that starts an accumulator (what an element past a masked size is to `op`):
    max/min (and argmax/argmin) of integers start from the dtype's bounds, of bools from the
    other one."""
    op = INDEX_OPS.get(op, op)
    if op in ("max", "min") and dtype not in FLOATS:
        if dtype == "bool":
            return op == "min"
        info = torch.iinfo(TORCH_DTYPES[dtype])
        return info.min if op == "max" else info.max
    return operand_value(IDENTITY[op], dtype)


def accumulator_dtype(where: str, i: int, result_dtype: str, arg_dtype: str, what: str) -> str:
    """The tile dtype a sum/prod/max/min (or scan) of `arg_dtype` into `result_dtype` accumulates
    in: fp32 for floats; for integers the result's own width (PyTorch sums and prods integers
    into int64, max/min keep the dtype), so the result is exact and wraps only where PyTorch's does."""
    if result_dtype in FLOATS and arg_dtype in FLOATS:
        return "fp32"
    if result_dtype in INTEGERS and arg_dtype in INTEGERS + ("bool",):
        return result_dtype
    raise Unsupported(f"{where}: value {i}: {what} {arg_dtype} into {result_dtype}")


__all__ = ["ALIASES", "COMBINE", "IDENTITY", "INDEX_OPS", "INTEGERS", "WELFORD", "accumulator_dtype", "identity",
           "op_of"]
