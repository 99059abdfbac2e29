"""copy_ within one spyre device, across dtypes or layouts, as a compiled program.

A dense copy of one dtype is a d2d Transfer (device/copies.py); anything else
(a cast, a transposed or strided source or destination, a broadcast) used to
run as a host callback over the device bytes. It is an ordinary eager entry
of ``aten::copy_`` here: traced, compiled (one pointwise program: loads in the
source's layout and dtype, stores in the destination's), cached and launched
like any other op. When the compiler declines, the caller keeps its host
callback (a copy is never an "op without a kernel": no warning, no strict error).
"""

from __future__ import annotations

import torch

from .cache import CACHE
from .kernel import ENABLED, entry_for
from .key import make_key
from spyre_inductor.launcher.nesting import busy, dynamo_compiling
from spyre_inductor.device.fallback import formatting_a_tensor

from .launch import CompiledEntry
from .signature import signature_of

_SIG = None


def try_copy(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Copy `src` into `dst` (same spyre device) with a compiled program; False if it was not
    (the caller copies another way)."""
    global _SIG
    if not ENABLED[0] or busy() or dynamo_compiling():  # never compile inside a compile (kernel.py)
        return False
    if formatting_a_tensor():  # (torch's casts to format a tensor: not the user's, kernel.py)
        return False
    sig = _SIG
    if sig is None:
        sig = _SIG = signature_of(torch.ops.aten.copy_.default)
    values = (dst, src, False)
    key = make_key(sig, values)
    if key is None:
        return False
    entry = CACHE.get(key)
    if entry is None:
        entry = entry_for(sig, key, values, None)
    if not isinstance(entry, CompiledEntry) or entry.cpu_calls:
        return False
    entry.run(sig, values, values, {})
    return True
