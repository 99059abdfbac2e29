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

Everything is computed in int64 torch tensors holding 32-bit unsigned words (torch has no
general uint32 arithmetic); a 32x32 product is split so that nothing overflows int64.

Conversions (one counter per element):
* ``uniform``: the top 24 bits of word 0 times 2**-24, in [0, 1), exact in fp32 (torch's CPU
  generator also uses 24 bits for a float);
* ``normal``: Box-Muller of words 0 and 1: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1] (never
  log 0), computed in fp32;
* ``bits63``: a non-negative int64 from 63 bits of words 0 and 1 (randint: low + bits63 % range;
  a range wider than 2**63, such as the whole int64 range Inductor draws its seeds from, is made
  of two draws of 32 bits by the compiler).
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MODES = ("uniform", "normal", "bits63")


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of a * m, for a tensor of 32-bit words and a 32-bit constant."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    low_part = a * m_lo                      # < 2**48
    high_part = a * m_hi                     # < 2**48
    hi = (high_part + (low_part >> 16)) >> 16
    lo = (((high_part & 0xFFFF) << 16) + low_part) & MASK32
    return hi & MASK32, lo


def philox4x32(key: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit output words (int64 tensors) for int64 keys and counters (broadcast)."""
    key, counter = torch.broadcast_tensors(key.to(torch.int64), counter.to(torch.int64))
    k0, k1 = key & MASK32, (key >> 32) & MASK32
    c0, c1 = counter & MASK32, (counter >> 32) & MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & MASK32
        k1 = (k1 + _W1) & MASK32
    return c0, c1, c2, c3


def philox(key: torch.Tensor, counter: torch.Tensor, mode: str) -> torch.Tensor:
    """One random value per (key, counter) element: fp32 for uniform/normal, int64 for bits."""
    w0, w1, _, _ = philox4x32(key, counter)
    if mode == "uniform":
        return (w0 >> 8).to(torch.float32) * (2.0 ** -24)
    if mode == "normal":
        u1 = ((w0 >> 8) + 1).to(torch.float32) * (2.0 ** -24)   # (0, 1]
        u2 = (w1 >> 8).to(torch.float32) * (2.0 ** -24)         # [0, 1)
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    if mode == "bits63":
        return ((w1 & 0x7FFFFFFF) << 32) | w0
    raise ValueError(f"philox mode {mode!r} is not one of {MODES}")


def philox_result_dtype(mode: str) -> str:
    """The program dtype a mode produces (what its destination tile holds before any cast)."""
    return "fp32" if mode in ("uniform", "normal") else "int64"
