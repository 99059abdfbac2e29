"""Random fills on the device generator (issue 19): Philox in spyre programs.

Everything here runs under SPYRE_STRICT=1 (autouse fixture), so a fill that fell back to the
CPU would raise instead of passing. Statistical bounds are 5 standard errors of the estimate
(a correct generator fails one of them about once in a million runs; a broken one, e.g. a
constant, a repeated offset or a wrong scale, fails them outright).

Against the host reference (compiler/random.philox_reference) every fill is bit-exact: the
rounds are integer arithmetic, and normal's log and cos are polynomials of correctly rounded
fp64 operations (spyre_runtime/program/philox.py), the same bits in any tile of any core; a
cast to fp16/bf16 rounds the one fp32 value.
"""

from __future__ import annotations

import math

import pytest
import torch

from hypothesis import HealthCheck, given, settings, strategies as st

from spyre_inductor.compiler.inductor import randperm
from spyre_inductor.compiler.inductor.random import philox_reference
from spyre_inductor.device import fallback
from spyre_inductor.device import random as device_random
from spyre_runtime.program.philox import philox, philox4x32


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _key(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _reference(seed, offset, shape, mode, low=0, high=0):
    return philox_reference(torch.tensor([_key(seed), offset, low, high]), list(shape), mode)


# ---- the generator itself ------------------------------------------------------------------


def test_philox_known_answer_and_a_plain_integer_implementation():
    # Random123's known-answer test for Philox-4x32-10, counter 0 and key 0.
    words = [int(w) for w in philox4x32(torch.tensor([0]), torch.tensor([0]))]
    assert words == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]

    def plain(key, ctr):
        m = 0xFFFFFFFF
        k0, k1, c = key & m, key >> 32 & m, [ctr & m, ctr >> 32 & m, 0, 0]
        for _ in range(10):
            p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
            c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        return c

    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2 ** 62, (64,), generator=g)
    ctrs = torch.randint(0, 2 ** 40, (64,), generator=g)
    got = torch.stack(philox4x32(keys, ctrs), dim=1).tolist()
    assert got == [plain(int(k), int(c)) for k, c in zip(keys, ctrs)]


def test_the_fills_are_the_reference_draws_at_the_generator_offset(spyre):
    torch.spyre.manual_seed(11)
    u = torch.rand(300, device=spyre).cpu()
    n = torch.randn(7, 9, device=spyre).cpu()
    i = torch.randint(-5, 17, (40,), device=spyre).cpu()
    assert torch.equal(u, _reference(11, 0, (300,), "uniform"))
    assert torch.equal(n, _reference(11, 300, (7, 9), "normal"))
    assert torch.equal(i, _reference(11, 363, (40,), "randint", -5, 17))
    # the offset advanced by the numbers drawn, nothing else
    assert device_random.philox_state(0) == (11, 403)


def test_seeded_reproducible_and_advancing(spyre):
    torch.spyre.manual_seed(1234)
    a = torch.randn(64, device=spyre).cpu()
    b = torch.randn(64, device=spyre).cpu()
    torch.spyre.manual_seed(1234)
    assert torch.equal(torch.randn(64, device=spyre).cpu(), a)
    assert torch.equal(torch.randn(64, device=spyre).cpu(), b)
    assert not torch.equal(a, b)
    torch.spyre.manual_seed(1235)
    assert not torch.equal(torch.randn(64, device=spyre).cpu(), a)


def test_independent_of_the_cpu_generator(spyre):
    torch.spyre.manual_seed(3)
    a = torch.rand(100, device=spyre).cpu()
    torch.spyre.manual_seed(3)
    torch.default_generator.manual_seed(999)  # the CPU generator only
    torch.rand(1000)  # draws on the CPU
    assert torch.equal(torch.rand(100, device=spyre).cpu(), a)
    # and not the CPU's numbers for the same seed (a different generator)
    assert not torch.equal(a, torch.rand(100, generator=torch.Generator().manual_seed(3)))


def test_torch_manual_seed_seeds_spyre_too(spyre):
    torch.manual_seed(7)
    a = torch.randint(0, 100, (16,), device=spyre).cpu()
    torch.manual_seed(7)
    assert torch.equal(a, torch.randint(0, 100, (16,), device=spyre).cpu())


# ---- statistics -----------------------------------------------------------------------------

N = 1 << 17


def _within(value, expected, stderr, what):
    assert abs(value - expected) < 5 * stderr, f"{what}: {value} is not within 5 x {stderr} of {expected}"


def test_normal_statistics(spyre):
    torch.spyre.manual_seed(0)
    x = torch.randn(N, device=spyre).cpu().double()
    _within(x.mean().item(), 0.0, 1 / math.sqrt(N), "mean")
    _within(x.var().item(), 1.0, math.sqrt(2 / N), "variance")
    _within((x.abs() < 1).double().mean().item(), 0.682689, math.sqrt(0.2166 / N), "P(|x| < 1)")
    # neighbouring counters are uncorrelated
    _within(torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item(), 0.0, 1 / math.sqrt(N), "lag-1 correlation")
    y = torch.empty(N, device=spyre).normal_(2.0, 3.0).cpu().double()
    _within(y.mean().item(), 2.0, 3 / math.sqrt(N), "normal_(2, 3) mean")
    _within(y.std().item(), 3.0, 3 / math.sqrt(2 * N), "normal_(2, 3) std")


def test_uniform_statistics(spyre):
    torch.spyre.manual_seed(1)
    x = torch.rand(N, device=spyre).cpu().double()
    assert 0 <= x.min() and x.max() < 1
    _within(x.mean().item(), 0.5, math.sqrt(1 / 12 / N), "mean")
    _within(x.var().item(), 1 / 12, math.sqrt(1 / 180 / N), "variance")
    y = torch.empty(N, device=spyre).uniform_(-2.0, 6.0).cpu().double()
    assert -2 <= y.min() and y.max() < 6
    _within(y.mean().item(), 2.0, 8 * math.sqrt(1 / 12 / N), "uniform_(-2, 6) mean")


def test_integer_and_bernoulli_statistics(spyre):
    torch.spyre.manual_seed(2)
    k = torch.randint(3, 13, (N,), device=spyre).cpu()
    assert k.dtype == torch.int64 and 3 <= k.min() and k.max() <= 12
    counts = torch.bincount(k - 3, minlength=10).double()
    chi2 = ((counts - N / 10) ** 2 / (N / 10)).sum().item()
    assert chi2 < 9 + 5 * math.sqrt(18), chi2  # 9 degrees of freedom
    b = torch.bernoulli(torch.full((N,), 0.3).to(spyre)).cpu()  # (fill_ itself is not a spyre kernel yet)
    _within(b.mean().item(), 0.3, math.sqrt(0.21 / N), "bernoulli(0.3)")
    c = torch.empty(N, device=spyre).bernoulli_(0.8).cpu()
    assert set(c.unique().tolist()) <= {0.0, 1.0}
    _within(c.mean().item(), 0.8, math.sqrt(0.16 / N), "bernoulli_(0.8)")


def test_other_distributions_from_the_same_draws(spyre):
    torch.spyre.manual_seed(7)
    e = torch.empty(N, device=spyre).exponential_(2.0).cpu().double()
    assert e.min() >= 0
    _within(e.mean().item(), 0.5, 0.5 / math.sqrt(N), "exponential_(2) mean")
    ln = torch.empty(N, device=spyre).log_normal_(0.0, 0.5).cpu().double().log()
    _within(ln.mean().item(), 0.0, 0.5 / math.sqrt(N), "log_normal_(0, 0.5): mean of the log")
    _within(ln.std().item(), 0.5, 0.5 / math.sqrt(2 * N), "log_normal_(0, 0.5): std of the log")
    c = torch.empty(N, device=spyre).cauchy_(1.0, 2.0).cpu().double()
    _within(c.median().item(), 1.0, math.pi * 2.0 / (2 * math.sqrt(N)), "cauchy_(1, 2) median")
    _within((c.sub(1).abs() < 2).double().mean().item(), 0.5, math.sqrt(0.25 / N), "cauchy_: P(|x - m| < s)")
    for sigma in (0.0, -1.0):  # refused as on the CPU, naming the argument
        with pytest.raises(RuntimeError, match=f"cauchy_ expects sigma > 0.0, but found sigma={sigma}"):
            torch.empty(4, device=spyre).cauchy_(0.0, sigma)
    g = torch.empty(N, device=spyre).geometric_(0.25).cpu().double()
    assert g.min() >= 1 and torch.equal(g, g.round())
    _within(g.mean().item(), 4.0, math.sqrt(12 / N), "geometric_(0.25) mean")


def test_random_ranges_follow_the_cpu(spyre):
    torch.spyre.manual_seed(4)
    assert 0 <= torch.empty(4096, device=spyre).random_(10).cpu().max() < 10
    h = torch.empty(4096, dtype=torch.float16, device=spyre).random_().cpu()
    assert 0 <= h.min() and h.max() <= 2 ** 11
    u8 = torch.empty(4096, dtype=torch.uint8, device=spyre).random_().cpu()
    assert u8.max() > 200  # the whole byte range
    i64 = torch.empty(4096, dtype=torch.int64, device=spyre).random_().cpu()  # [0, 2**63 - 1]
    assert i64.min() >= 0 and i64.max() > 1 << 62
    assert torch.equal(i64, _reference(4, 3 * 4096, (4096,), "span63"))
    full = torch.empty(4096, dtype=torch.int64, device=spyre).random_(-(1 << 63), (1 << 63) - 1).cpu()
    assert full.min() < -(1 << 62) and full.max() > 1 << 62  # both halves of the int64 range


# ---- state ----------------------------------------------------------------------------------


def test_rng_state_round_trip_carries_the_offset(spyre):
    torch.spyre.manual_seed(9)
    torch.rand(10, device=spyre)
    state = torch.spyre.get_rng_state()
    assert state.dtype == torch.uint8
    a = torch.randn(5, device=spyre).cpu()
    torch.randn(50, device=spyre)
    torch.spyre.set_rng_state(state)
    assert torch.equal(torch.randn(5, device=spyre).cpu(), a)
    torch.spyre.manual_seed(10)
    torch.spyre.set_rng_state(state)  # also restores the seed
    assert torch.equal(torch.randn(5, device=spyre).cpu(), a)
    bad = state.clone()
    bad[:8] = torch.tensor([12345], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(ValueError, match="inconsistent"):
        torch.spyre.set_rng_state(bad)


def test_fork_rng_restores_spyre_state(spyre):
    torch.spyre.manual_seed(0)
    with torch.random.fork_rng(devices=[0], device_type="spyre"):
        torch.rand(10, device=spyre)
    after_fork = torch.rand(3, device=spyre).cpu()
    torch.spyre.manual_seed(0)
    assert torch.equal(after_fork, torch.rand(3, device=spyre).cpu())


def test_explicit_generators_have_their_own_state(spyre):
    g = torch.Generator(device="spyre").manual_seed(3)
    a = torch.rand(8, device=spyre, generator=g).cpu()
    b = torch.rand(8, device=spyre, generator=torch.Generator(device="spyre").manual_seed(3)).cpu()
    assert torch.equal(a, b)
    assert not torch.equal(torch.rand(8, device=spyre, generator=g).cpu(), a)
    g.manual_seed(4)  # a seed restarts its offset
    assert torch.equal(torch.rand(8, device=spyre, generator=g).cpu(), _reference(4, 0, (8,), "uniform"))


def test_the_default_generator_passed_explicitly_is_the_default(spyre):
    torch.spyre.manual_seed(21)
    a = torch.rand(8, device=spyre).cpu()
    b = torch.rand(8, device=spyre, generator=torch.spyre.default_generators[0]).cpu()
    assert torch.equal(b, _reference(21, 8, (8,), "uniform")) and not torch.equal(a, b)


def _draws(spyre, generator=None):
    """One of each eager fill kind, drawn from `generator` (None: the default generator)."""
    t = torch.empty(5, 7, device=spyre)
    return [torch.randn(9, device=spyre, generator=generator).cpu(),
            torch.rand(3, 4, device=spyre, generator=generator).cpu(),
            t.normal_(2.0, 0.5, generator=generator).cpu(),
            torch.randint(0, 100, (6,), device=spyre, generator=generator).cpu()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_generator_reseeded_with_its_own_seed_replays(spyre):
    # manual_seed restarts the Philox offset at 0 whatever the seed, as CUDA's generator does,
    # for torch.Generator objects and the default generator's own object alike.
    for g in (torch.Generator(device="spyre"), torch.spyre.default_generators[0]):
        g.manual_seed(7)
        first = _draws(spyre, g)
        g.manual_seed(7)
        assert _same(_draws(spyre, g), first)
        assert g.get_offset() == sum(t.numel() for t in first)
    torch.spyre.default_generators[0].manual_seed(7)
    assert _same(_draws(spyre), first)  # the default generator is the one ops use without one


def test_generator_set_state_replays_seed_and_offset(spyre):
    for g in (torch.Generator(device="spyre"), torch.spyre.default_generators[0]):
        g.manual_seed(5)
        torch.rand(10, device=spyre, generator=g)
        state = g.get_state()
        first = _draws(spyre, g)
        g.set_state(state)
        assert _same(_draws(spyre, g), first)
        g.manual_seed(6)  # another seed, then back: both the seed and the offset are restored
        g.set_state(state)
        assert g.initial_seed() == 5 and g.get_offset() == 10
        assert _same(_draws(spyre, g), first)
    # the default generator's state is torch.spyre's RNG state: one state, two views
    torch.spyre.manual_seed(5)
    torch.rand(10, device=spyre)
    assert torch.equal(torch.spyre.get_rng_state(), state)
    assert _same(_draws(spyre), first)


def test_the_cpu_fallback_writes_back_its_twister_and_keeps_the_philox_offset(spyre):
    # A random op on the CPU fallback draws from the generator's Mersenne Twister and writes its
    # state back: in one step that keeps the Philox seed and offset as they are then (a program's
    # draw by another thread in between is not undone), and it takes spyre generators only.
    g = torch.Generator(device=spyre)
    g.manual_seed(3)
    twister = device_random.twister_state(g)
    torch.rand(100, device=spyre, generator=g)  # a Philox draw after the fallback read the Twister
    offset = g.get_offset()
    assert offset > 0
    device_random.set_twister_state(g, twister)
    assert (g.get_offset(), g.initial_seed()) == (offset, 3)
    with pytest.raises(ValueError, match="set_twister_state: expected a spyre generator, got one of cpu"):
        device_random.set_twister_state(torch.Generator(), twister)


def test_a_refused_rng_state_leaves_the_generator_as_it_was(spyre):
    g = torch.Generator(device="spyre").manual_seed(8)
    torch.rand(4, device=spyre, generator=g)
    state = g.get_state()
    bad = state.clone()
    bad[:8] = torch.tensor([12345], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(ValueError, match="inconsistent"):
        g.set_state(bad)
    with pytest.raises(ValueError, match="16 bytes of Philox state"):
        g.set_state(state[:16].clone())
    assert torch.equal(g.get_state(), state)


def test_cloned_and_offset_set_generators_draw_from_their_state(spyre):
    g = torch.Generator(device="spyre").manual_seed(9)
    g.set_offset(40)
    assert torch.equal(torch.rand(8, device=spyre, generator=g).cpu(), _reference(9, 40, (8,), "uniform"))
    assert g.get_offset() == 48
    twin = g.clone_state()
    assert torch.equal(torch.rand(8, device=spyre, generator=twin).cpu(),
                       torch.rand(8, device=spyre, generator=g).cpu())


def test_reseeding_the_default_generator_replays_dropout(spyre):
    x = torch.randn(32, 32, device=spyre)
    torch.spyre.default_generators[0].manual_seed(3)
    a = torch.nn.functional.dropout(x, 0.5, training=True).cpu()
    torch.spyre.default_generators[0].manual_seed(3)
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=True).cpu(), a)
    with torch.random.fork_rng(devices=[0], device_type="spyre"):
        b = torch.nn.functional.dropout(x, 0.5, training=True).cpu()
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=True).cpu(), b)


# (Each device's own state: tests/test_multi_device.py, in a child process, as spyre:1 must stay
# empty for the other tests.)


# ---- in spyre programs ----------------------------------------------------------------------


def test_fills_run_as_spyre_programs_in_every_float_dtype(spyre):
    torch.spyre.reset_kernel_reports()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        torch.spyre.manual_seed(8)
        x = torch.randn(33, 65, dtype=dtype, device=spyre).cpu()
        assert x.dtype == dtype
        assert torch.equal(x, _reference(8, 0, (33, 65), "normal").to(dtype))
    names = [r.name for r in torch.spyre.kernel_reports()]
    assert sum("randn" in n for n in names) >= 3, names


def test_non_contiguous_fill_draws_in_logical_order(spyre):
    torch.spyre.manual_seed(12)
    base = torch.zeros(6, 8).to(spyre)
    view = base.t()  # 8 x 6, strides (1, 8)
    view.uniform_()
    assert torch.equal(view.cpu(), _reference(12, 0, (8, 6), "uniform"))


def test_dropout_forward_and_backward(spyre):
    torch.spyre.manual_seed(13)
    x = torch.randn(64, 64, device=spyre, requires_grad=True)
    y = torch.nn.functional.dropout(x, 0.25, training=True)
    y.backward(torch.ones(64, 64).to(spyre))  # (sum's backward would fill_, not a spyre kernel yet)
    yc, xc, gc = y.detach().cpu(), x.detach().cpu(), x.grad.cpu()
    kept = yc != 0
    _within(kept.double().mean().item(), 0.75, math.sqrt(0.1875 / kept.numel()), "kept fraction")
    torch.testing.assert_close(yc[kept], xc[kept] / 0.75)
    torch.testing.assert_close(gc, kept.float() / 0.75)
    # evaluation mode is the identity
    assert torch.equal(torch.nn.functional.dropout(x.detach(), 0.25, training=False).cpu(), xc)


# ---- randperm: keys sorted by the sort family in a program (compiler/inductor/randperm.py) ---------------


def test_randperm_is_the_stable_argsort_of_keys_drawn_at_the_generator_offset(spyre):
    torch.spyre.manual_seed(21)
    torch.rand(5, device=spyre)  # the offset is not 0
    assert device_random.philox_state(0) == (21, 5)
    p = torch.randperm(50, device=spyre).cpu()
    assert p.dtype == torch.int64
    assert torch.equal(p, randperm.reference(21, 5, 50))
    assert device_random.philox_state(0) == (21, 55)  # one counter per element


def test_randperm_seeded_reproducible_and_independent_of_the_cpu_generator(spyre):
    torch.manual_seed(4)  # seeds spyre too
    a = torch.randperm(50, device=spyre).cpu()
    b = torch.randperm(50, device=spyre).cpu()
    assert not torch.equal(a, b)
    torch.manual_seed(4)
    torch.default_generator.manual_seed(999)  # the CPU generator only
    torch.randperm(50)  # draws on the CPU
    assert torch.equal(torch.randperm(50, device=spyre).cpu(), a)
    assert torch.equal(torch.randperm(50, device=spyre).cpu(), b)
    # and not the CPU's permutation for the same seed (another generator)
    assert not torch.equal(a, torch.randperm(50, generator=torch.Generator().manual_seed(4)))


def test_randperm_with_an_explicit_generator_draws_from_its_own_state(spyre):
    torch.spyre.manual_seed(2)
    before = device_random.philox_state(0)
    g = torch.Generator(device=spyre).manual_seed(77)
    a = torch.randperm(50, generator=g, device=spyre).cpu()
    assert torch.equal(a, randperm.reference(77, 0, 50))
    assert torch.equal(torch.randperm(50, generator=g, device=spyre).cpu(), randperm.reference(77, 50, 50))
    assert device_random.philox_state(0) == before  # the default generator did not move
    with pytest.raises(RuntimeError, match="Expected a 'spyre' device type for generator"):
        torch.randperm(50, generator=torch.Generator(), device=spyre)


# (the autouse strict fixture holds for every example: its env var is set once per test)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 63 - 1), offset=st.integers(0, 2 ** 40), n=st.sampled_from([1, 2, 3, 50]))
def test_randperm_is_always_a_permutation(seed, offset, n):
    # (few distinct n: each is its own compiled program; seeds and offsets travel at launch)
    spyre = torch.device("spyre", 0)
    torch.spyre.manual_seed(seed)
    torch.spyre.set_rng_state(_rng_state_at(seed, offset))
    p = torch.randperm(n, device=spyre).cpu()
    assert sorted(p.tolist()) == list(range(n))
    assert torch.equal(p, randperm.reference(_key(seed), offset, n))


def test_randperm_puts_every_value_at_every_position_alike(spyre):
    # 400 draws of randperm(8): each (position, value) cell is Binomial(400, 1/8)
    torch.spyre.manual_seed(5)
    draws = torch.stack([torch.randperm(8, device=spyre).cpu() for _ in range(400)])
    counts = torch.zeros(8, 8)
    for position in range(8):
        counts[position] = torch.bincount(draws[:, position], minlength=8).float()
    expected, stderr = 400 / 8, math.sqrt(400 * (1 / 8) * (7 / 8))
    worst = (counts - expected).abs().max().item()
    assert worst < 5 * stderr, f"a (position, value) count is {worst} from {expected} (5 x {stderr:.2f} allowed)"


def _rng_state_at(seed: int, offset: int) -> torch.Tensor:
    # torch.spyre's state tensor with the Philox offset moved (the first 16 bytes: seed, offset)
    state = torch.spyre.get_rng_state().clone()
    state[8:16] = torch.tensor([offset], dtype=torch.int64).view(torch.uint8)
    return state


def test_randperm_of_zero_and_one_elements(spyre):
    torch.spyre.manual_seed(0)
    empty = torch.randperm(0, device=spyre)
    assert empty.shape == (0,) and empty.dtype == torch.int64
    assert device_random.philox_state(0) == (0, 0)  # nothing drawn
    assert torch.randperm(1, device=spyre).cpu().tolist() == [0]
    assert torch.randperm(1, dtype=torch.float32, device=spyre).cpu().tolist() == [0.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8, torch.float32, torch.float16,
                                   torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
def test_randperm_honours_its_dtype(spyre, dtype):
    torch.spyre.manual_seed(9)
    p = torch.randperm(50, dtype=dtype, device=spyre).cpu()
    assert p.dtype == dtype
    assert torch.equal(p, randperm.reference(9, 0, 50).to(dtype))


def test_randperm_out_is_resized_and_may_be_strided(spyre):
    torch.spyre.manual_seed(6)
    out = torch.empty(3, dtype=torch.int64, device=spyre)
    assert torch.randperm(50, out=out) is out
    assert out.shape == (50,) and torch.equal(out.cpu(), randperm.reference(6, 0, 50))
    base = torch.full((100,), -1, dtype=torch.int64).to(spyre)
    torch.randperm(50, out=base[::2])
    assert torch.equal(base[::2].cpu(), randperm.reference(6, 50, 50))
    assert (base[1::2].cpu() == -1).all()  # the gaps are untouched


def test_randperm_refuses_what_the_cpu_refuses(spyre):
    with pytest.raises(NotImplementedError, match="'Bool'"):
        torch.randperm(5, dtype=torch.bool, device=spyre)
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.randperm(257, dtype=torch.uint8, device=spyre)
    with pytest.raises(RuntimeError, match="2049"):
        torch.randperm(2050, dtype=torch.float16, device=spyre)
    with pytest.raises(RuntimeError, match="negative"):
        torch.randperm(-1, device=spyre)


def test_randperm_above_its_limit_is_a_visible_cpu_fallback(spyre, monkeypatch):
    n = randperm.MAX_N + 1
    with pytest.raises(NotImplementedError, match=f"randperm.*above its in-program limit of {randperm.MAX_N}"):
        torch.randperm(n, device=spyre)
    with pytest.raises(NotImplementedError, match="randperm.*float64"):
        torch.randperm(5, dtype=torch.float64, device=spyre)
    monkeypatch.setenv("SPYRE_STRICT", "0")
    fallback.reset_warnings()
    with pytest.warns(UserWarning, match=f"randperm.*{randperm.MAX_N}"):
        p = torch.randperm(n, device=spyre).cpu()
    assert sorted(p.tolist()) == list(range(n))


def test_randperm_at_its_limit_runs_in_a_program(spyre):
    torch.spyre.manual_seed(1)
    p = torch.randperm(randperm.MAX_N, device=spyre).cpu()
    assert torch.equal(p, randperm.reference(1, 0, randperm.MAX_N))


def test_randperm_inside_a_compiled_graph_draws_the_same(spyre):
    # Inductor calls randperm as an extern kernel: the same program, from the same generator
    x = torch.arange(50.0).to(spyre)
    f = torch.compile(lambda x: x + torch.randperm(50, device=x.device))
    torch.spyre.manual_seed(8)
    got = f(x).cpu()
    assert torch.equal(got, torch.arange(50.0) + randperm.reference(8, 0, 50))


def test_dtypes_without_programs_keep_the_visible_cpu_fallback(spyre, monkeypatch):
    with pytest.raises(NotImplementedError, match="normal_"):
        torch.randn(3, dtype=torch.float64, device=spyre)
    monkeypatch.setenv("SPYRE_STRICT", "0")
    with pytest.warns(UserWarning, match="normal_"):
        x = torch.randn(3, dtype=torch.float64, device=spyre).cpu()
    assert x.dtype == torch.float64 and x.isfinite().all()


def test_integer_and_bool_fills(spyre):
    torch.spyre.manual_seed(6)
    b = torch.randint(0, 2, (256,), dtype=torch.bool, device=spyre).cpu()
    assert b.dtype == torch.bool and b.any() and not b.all()
    i = torch.empty(256, dtype=torch.int32, device=spyre).random_().cpu()
    assert i.min() >= 0 and i.max() > 1 << 29
    torch.spyre.manual_seed(6)
    assert torch.equal(torch.randint(0, 2, (256,), dtype=torch.bool, device=spyre).cpu(), b)


def test_compiled_kernels_are_cached_per_shape(spyre):
    from spyre_inductor.compiler.inductor.random import cache_stats

    torch.rand(5, 7, device=spyre)
    before = cache_stats()
    for _ in range(3):
        torch.rand(5, 7, device=spyre)
    after = cache_stats()
    assert after["misses"] == before["misses"] and after["hits"] == before["hits"] + 3


# ---- the instruction, hand-written --------------------------------------------------------------


def _philox_program(mode="uniform", key_dtype="int64", cores=2, n=64):
    """Each core draws `n` values at counters 1000 + core * n + c under key -7 (a broadcast)."""
    from spyre_runtime.program import isa
    from spyre_runtime.program.operands import Addr, DevAddr, Tile
    from spyre_runtime.program.program import CoreProgram, Program, Queue, Symbol

    out_dtype = "fp32" if mode in ("uniform", "normal") else "int64"
    size = 4 if out_dtype == "fp32" else 8
    syms = (Symbol("out", "output", out_dtype, (cores * n,), (1,)),)
    cps, queues = [], []
    for c in range(cores):
        done = f"c{c}.done"
        queues.append(Queue(done, (c, "sfp"), (c, "ls"), 1))
        key = Tile(Addr(0), key_dtype, 1, n, 128, "scalar")
        counter = Tile(Addr(1024), "int64", 1, n, 1024)
        dst = Tile(Addr(2048), out_dtype, 1, n, 1024)
        sfp = (isa.Fill(key, -7), isa.Iota(counter, 1000 + c * n, (), 0, 1), isa.Philox(mode, dst, key, counter),
               isa.Push(done))
        ls = (isa.Pop(done), isa.Store(DevAddr("out", c * n * size), Addr(2048), 1, n * size, 0, 1024))
        cps.append(CoreProgram(c, (("ls", ls), ("sfp", sfp))))
    return Program(f"philox_{mode}", syms, tuple(cps), tuple(queues))


@pytest.mark.parametrize("mode", ["uniform", "normal", "bits63"])
def test_the_philox_instruction_is_the_reference(mode):
    from spyre_runtime.direct import run_program

    out = run_program(_philox_program(mode))["out"].cpu()
    want = philox(torch.tensor(-7), 1000 + torch.arange(128), mode)
    assert torch.equal(out, want)
    report = torch.spyre.kernel_reports()[-1]
    assert report.bottleneck == "compute"  # 80 rounds of passes: the sfp, not memory, bounds a draw


def test_the_validator_refuses_a_bad_philox():
    from spyre_runtime.program.validate import ProgramError, validate

    with pytest.raises(ProgramError, match="philox"):
        validate(_philox_program(key_dtype="fp32"))
    with pytest.raises(ProgramError, match="philox mode"):
        validate(_philox_program(mode="gumbel"))


def test_the_kernel_functions_are_callable_directly(spyre):
    # what a compile-backed eager dispatcher routes to (spyre_inductor/compiler/inductor/random.py)
    from spyre_inductor.compiler.inductor import random as kernels

    torch.spyre.manual_seed(30)
    k = kernels.randint(-3, 3, (50,), device=spyre).cpu()
    assert torch.equal(k, _reference(30, 0, (50,), "randint", -3, 3))
    out, mask = kernels.native_dropout(torch.ones(40).to(spyre), 0.5, True)
    assert torch.equal(out.cpu(), mask.cpu().float() * 2)
    assert torch.equal(mask.cpu(), _reference(30, 50, (40,), "uniform") < 0.5)


def test_threads_draw_disjoint_counters(spyre):
    from conftest import run_in_threads

    torch.spyre.manual_seed(40)
    torch.rand(256, device=spyre)  # compiled once before the threads race
    torch.spyre.manual_seed(40)
    got = {}

    def draw(k):
        got[k] = [torch.rand(256, device=spyre).cpu() for _ in range(3)]

    run_in_threads(draw, 4)
    blocks = sorted((tuple(b.tolist()) for bs in got.values() for b in bs))
    want = sorted(tuple(_reference(40, 256 * i, (256,), "uniform").tolist()) for i in range(12))
    assert blocks == want  # each call got its own 256 counters: none shared, none skipped
