"""Philox-4x32-10, the counter-based generator behind every random number a spyre program draws.

Why counter-based: a number is a pure function of (key, counter), so a program needs no
generator state on chip, any core can draw any element (element i uses counter offset + i),
and a generator's whole state is two integers, a seed and an offset, that the host advances by
the numbers each call drew (as CUDA's Philox generator does). The same function is the ISA's
``philox`` instruction (isa.py) and the host reference the compiler's custom op and the tests
use, so the device and the reference agree bit for bit.

Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11): 10 rounds of two 32x32
multiplies (hi and lo words) and xors, the key bumped by the Weyl constants between rounds.
Key = (seed low word, seed high word); counter = (counter low word, high word, 0, 0).

The rounds run on NumPy uint64 arrays holding 32-bit words (torch has no general unsigned
arithmetic): a 32x32-bit product is exact there; the words come back as int64 tensors.

Conversions (one counter per element):
* ``uniform``: the top 24 bits of word 0 times 2**-24, in [0, 1), exact in fp32 (torch's CPU
  generator also uses 24 bits for a float);
* ``normal``: Box-Muller of words 0 and 1 at 32 bits: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1]
  (never log 0), computed in fp64 (log and cos as polynomials, below) and rounded to fp32;
* ``bits63``: a non-negative int64 from 63 bits of words 0 and 1 (randint: low + bits63 % range;
  a range wider than 2**63, such as the whole int64 range Inductor draws its seeds from, is made
  of two draws of 32 bits by the compiler).
"""

from __future__ import annotations

import math

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
_MASK, _SHIFT = np.uint64(MASK32), np.uint64(32)
_M0_U, _M1_U, _W0_U, _W1_U = np.uint64(_M0), np.uint64(_M1), np.uint64(_W0), np.uint64(_W1)
MODES = ("uniform", "normal", "bits63")


def philox4x32(key: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit output words (int64 tensors) for int64 keys and counters (broadcast)."""
    key, counter = torch.broadcast_tensors(key.to(torch.int64), counter.to(torch.int64))
    shape = key.shape
    # NumPy's uint64: a 32x32-bit product is exact in it (no signed overflow to reason about),
    # and its per-call cost is a fraction of torch's on the small tiles a core draws.
    n = counter.reshape(-1).numpy().view(np.uint64)
    if all(st == 0 for st in key.stride()):  # one key (a broadcast seed): its schedule in scalars
        k = np.uint64(int(key.reshape(-1)[0]) % (1 << 64)) if key.numel() else np.uint64(0)
    else:
        k = key.reshape(-1).numpy().view(np.uint64)
    k0, k1 = k & _MASK, k >> _SHIFT
    c0, c1 = n & _MASK, n >> _SHIFT
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    for r in range(ROUNDS):
        p0 = c0 * _M0_U
        p1 = c2 * _M1_U
        c0, c1, c2, c3 = (p1 >> _SHIFT) ^ c1 ^ k0, p1 & _MASK, (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _MASK
        if r + 1 < ROUNDS:
            k0 = (k0 + _W0_U) & _MASK
            k1 = (k1 + _W1_U) & _MASK
    return tuple(torch.from_numpy(w.astype(np.int64)).reshape(shape) for w in (c0, c1, c2, c3))


# Box-Muller's log and cos, as the sfp would evaluate them: range reduction and polynomials in
# fp64 from elementwise adds, multiplies and divides only. Those are correctly rounded however a
# loop vectorizes them, so a value does not depend on which tile or how many cores computed it
# (torch's own log/cos round differently in a vectorized body and a scalar tail), and the fast
# form may draw every core's tile in one operation. Both are accurate to a few fp64 ulps, far
# below the fp32 result's rounding.
_LN2 = math.log(2.0)
_SQRT_HALF = math.sqrt(0.5)
_LOG_TERMS = tuple(1.0 / (2 * k + 1) for k in range(12))            # atanh series, |s| <= 0.172
_COS_TERMS = tuple((-1) ** k / math.factorial(2 * k) for k in range(12))  # x in [0, pi/2]


def _horner(x: torch.Tensor, coefficients) -> torch.Tensor:
    out = torch.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = out * x + c
    return out


def _log(u: torch.Tensor) -> torch.Tensor:
    """ln u for fp64 u > 0: u = m 2**e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s)."""
    m, e = torch.frexp(u)  # m in [0.5, 1)
    low = m < _SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    return e * _LN2 + 2.0 * s * _horner(s * s, _LOG_TERMS)


def _cos_2pi(u: torch.Tensor) -> torch.Tensor:
    """cos(2 pi u) for fp64 u in [0, 1): folded onto [0, pi/2] by its symmetries (exact steps)."""
    a = (u - 0.5).abs()               # cos(2 pi u) = -cos(2 pi a), a in [0, 0.5]
    far = a > 0.25
    b = torch.where(far, 0.5 - a, a)  # cos(2 pi a) = -cos(2 pi b) when far, b in [0, 0.25]
    x = b * (2.0 * math.pi)
    c = _horner(x * x, _COS_TERMS)
    return torch.where(far, c, -c)


def philox(key: torch.Tensor, counter: torch.Tensor, mode: str) -> torch.Tensor:
    """One random value per (key, counter) element: fp32 for uniform/normal, int64 for bits."""
    w0, w1, _, _ = philox4x32(key, counter)
    if mode == "uniform":
        return (w0 >> 8).to(torch.float32) * (2.0 ** -24)
    if mode == "normal":
        u1 = (w0 + 1).to(torch.float64) * (2.0 ** -32)  # (0, 1]: never log 0
        u2 = w1.to(torch.float64) * (2.0 ** -32)        # [0, 1)
        return (torch.sqrt(-2.0 * _log(u1)) * _cos_2pi(u2)).to(torch.float32)
    if mode == "bits63":
        return ((w1 & 0x7FFFFFFF) << 32) | w0
    raise ValueError(f"philox mode {mode!r} is not one of {MODES}")


def philox_result_dtype(mode: str) -> str:
    """The program dtype a mode produces (what its destination tile holds before any cast)."""
    return "fp32" if mode in ("uniform", "normal") else "int64"
