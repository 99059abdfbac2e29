"""``randperm`` in a spyre program: the stable argsort of random keys, by the sort family's network.

One compiled graph per (n, dtype, out's layout):

1. ``keys = philox(state, [n], "randint")``: n int64 keys in [0, 2**62) from the device
   generator's Philox state (random.py), so a randperm is seeded and reproducible from
   ``torch.manual_seed`` / ``torch.spyre`` generator state and independent of the CPU generator;
   it advances the generator by n counters, like any fill of n elements.
2. ``out = argsort(keys, stable=True)``, cast to out's dtype: one sort family program (sorting.py,
   families/sort/: a bitonic network, ties broken by index, so the result is always a permutation
   whatever the keys are; with keys from 2**62 values a tie is about n**2 / 2**63 likely, so the
   tie-break biases nothing measurable).

``MAX_N`` is the longest row of int64 keys the network sorts in the scratchpad (32768: its keys,
int32 indices and int64 result, twice); above it the op keeps the CPU fallback, visibly (warned
once; SPYRE_STRICT=1 raises naming randperm and the limit). (Before the sort family it ranked the
keys by counting, n**2 compares, up to 4096.)
"""

from __future__ import annotations

import torch

from . import random

MAX_N = 32768

# Dtypes a program stores the permutation in; the others (float64) keep the CPU fallback.
DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                    torch.float32, torch.float16, torch.bfloat16})
_KEY_RANGE = 1 << 62


def check_dtype(n: int, dtype: torch.dtype) -> None:
    """The CPU's checks of randperm's result dtype (so a bad call raises the same error here)."""
    if dtype == torch.bool:
        raise NotImplementedError("\"randperm\" not implemented for 'Bool'")
    if not dtype.is_floating_point and n > 0 and n - 1 > torch.iinfo(dtype).max:
        raise RuntimeError(f"randperm: n = {n} does not fit {dtype}: value cannot be converted to type "
                           f"{str(dtype).removeprefix('torch.')} without overflow")
    if dtype == torch.float16 and n > 2049:
        raise RuntimeError("n cannot be greater than 2049 for Half type.")


def randperm_(out: torch.Tensor, n: int, generator=None) -> torch.Tensor:
    """Fill `out` (resized to (n,)) with a random permutation of 0 .. n-1 drawn on the device.
    The caller checks n <= MAX_N and the dtype (_randperm_out in device/random_ops.py)."""
    if tuple(out.shape) != (n,):
        out.resize_(n)
    if n == 0:
        return out
    dtype = out.dtype

    def build():
        def perm(out, state):
            keys = random.philox(state, [n], "randint")
            out.copy_(torch.sort(keys, stable=True).indices.to(dtype))
        return perm

    state = random.philox_state(generator, out.device, n, 0, _KEY_RANGE)
    random.launch_graph("randperm", build, (out, state))
    return out


def reference(key: int, offset: int, n: int) -> torch.Tensor:
    """What randperm_ computes for a generator at (key, offset), on the host (tests)."""
    keys = random.philox_reference(torch.tensor([key, offset, 0, _KEY_RANGE]), [n], "randint")
    return torch.argsort(keys, stable=True)
