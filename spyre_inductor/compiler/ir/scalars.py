"""PyTorch's conversion of a Python scalar to a tensor's dtype, for every path that bakes one in.

Inductor hands constants over as Python numbers (``a * 1e39`` is the constant 1e39). The
compiled path (core/layout.operand_value) and the in-graph CPU fallback
(launcher/host.constant) both turn them into values of a dtype here, so the two agree with
each other and with eager: through float64 / int64, a float beyond the type's range is +-inf,
nan stays nan, others round to nearest; an integer wraps to the type's width (two's
complement, as ``.to(torch.int32)`` does, where ``torch.tensor(300, dtype=torch.int8)``
would raise); a bool is itself.
"""

from __future__ import annotations

import math

import torch


def scalar_as(value, dtype: torch.dtype):
    """`value` (a Python bool, int or float) as a Python number of what `dtype` holds."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        try:
            wide = float(value)
        except OverflowError:  # a Python int beyond every float
            wide = math.inf if value > 0 else -math.inf
        return float(torch.tensor(wide, dtype=torch.float64).to(dtype))
    bits = torch.iinfo(dtype).bits
    wrapped = int(value) & ((1 << bits) - 1)
    return wrapped - (1 << bits) if wrapped >> (bits - 1) else wrapped
