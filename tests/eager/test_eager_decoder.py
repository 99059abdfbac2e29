"""The Llama-style decoder (spyre_inductor/testing/models.py) run eagerly on spyre, no torch.compile,
under SPYRE_STRICT=1: every op of the forward (embedding, the rotary tables indexed by positions,
RMSNorm in fp32 with pow/mean/rsqrt, q/k/v matmuls, rotate_half's slices, neg and cat, both KV
caches updated in place by ``index_copy_``, the causal mask from arange and a comparison, GQA
attention, SwiGLU, the LM head) is a compile-backed eager op running a spyre program; strict mode
raises on any CPU fallback. Views (view, transpose, slices, expand) stay views of the device bytes.

Attention both ways the model offers: ``explicit`` (repeat_kv, matmuls, masked_fill, softmax) and
``sdpa``: F.scaled_dot_product_attention on a spyre tensor takes PyTorch's math path
(``_scaled_dot_product_attention_math``, CompositeImplicitAutograd: the GQA repeat, bmm, the mask
converted by ``where``, ``_safe_softmax``, which calls ``isneginf``), each of those ops a program.

The reference is the model's fp32 copy on the CPU; tolerances are tests/compiler/test_models.py's
(relative to max|reference|, derived there): fp32 1e-5, fp16 4 * 2^-11. The caches too: written rows
under the same tolerance, every other row bit for bit. The second forward (same shapes) must be all
eager-cache hits: no compile, no miss.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.testing import models

U16 = 2.0 ** -11
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4 * U16}  # x max|reference| (test_models.py)


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _assert_close_scaled(got, want, dtype, what):
    scale = want.abs().max().item()
    err = (got.float() - want).abs().max().item()
    assert err <= TOLERANCE[dtype] * scale, (
        f"{what}: max |spyre - cpu fp32| = {err:.3g} exceeds {TOLERANCE[dtype]:.3g} x {scale:.3g}")


def _check_cache(before, after, ref, pos, dtype, what):
    written = torch.zeros(before.shape[2], dtype=torch.bool)
    written[pos] = True
    assert torch.equal(after[:, :, ~written], before[:, :, ~written]), f"{what}: rows the call does not write changed"
    _assert_close_scaled(after[:, :, written], ref[:, :, written], dtype, f"{what} (written rows)")


def run_decoder(spyre, dtype, *, attention, n_layers, seq, cache_len=128):
    """Forward the decoder eagerly on spyre twice (fresh caches each time) and check both against
    the CPU fp32 reference; returns the eager cache statistics before and after the second."""
    model = models.build(models.llama_config(attention=attention, n_layers=n_layers)).to(dtype)
    reference = models.fp32_copy(model)
    ids, pos, k, v = models.llama_inputs(model, seq=seq, cache_len=cache_len)
    k, v = [t.to(dtype) for t in k], [t.to(dtype) for t in v]
    ref_k, ref_v = [t.float() for t in k], [t.float() for t in v]
    device_model = copy.deepcopy(model).to(spyre)
    with torch.no_grad():
        want = reference(ids, pos, ref_k, ref_v)
        stats = []
        for _ in range(2):
            dev_k, dev_v = [t.to(spyre) for t in k], [t.to(spyre) for t in v]
            stats.append(torch.spyre.eager_cache_stats())
            got = device_model(ids.to(spyre), pos.to(spyre), dev_k, dev_v).cpu()
            assert got.dtype == dtype
            _assert_close_scaled(got, want, dtype, "logits")
            for i, (before, after, ref) in enumerate(zip(k + v, dev_k + dev_v, ref_k + ref_v)):
                _check_cache(before, after.cpu(), ref, pos, dtype, f"cache {i}")
    stats.append(torch.spyre.eager_cache_stats())
    return stats[1], stats[2]


def _assert_all_hits(before, after):
    assert after.misses == before.misses and after.compiles == before.compiles, (
        f"the second forward compiled or missed: {before} -> {after}")
    assert after.cpu_routes == before.cpu_routes and after.hits > before.hits


# ---- the default tier ------------------------------------------------------------------------------

def test_one_layer_decode_step_fp32_runs_eagerly_in_spyre_programs(spyre):
    """One token at position 96 of a cache of 128, one layer, fp32, explicit attention."""
    _assert_all_hits(*run_decoder(spyre, torch.float32, attention="explicit", n_layers=1, seq=1))


def test_sdpa_with_a_bool_mask_and_gqa_runs_in_spyre_programs(spyre):
    """The math path of F.scaled_dot_product_attention on spyre tensors (what the decoder's sdpa
    form calls), small: 4 query heads over 2 KV heads, a causal-over-the-cache bool mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, s, 16, generator=g) for h, s in ((4, 3), (2, 8), (2, 8)))
    mask = torch.arange(8) <= torch.tensor([4, 5, 6])[:, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = F.scaled_dot_product_attention(q.to(spyre), k.to(spyre), v.to(spyre), attn_mask=mask.to(spyre),
                                         enable_gqa=True)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_safe_softmax_zeroes_fully_masked_rows(spyre):
    """_safe_softmax (sdpa's math path): a row that is -inf everywhere gives zeros, not NaN."""
    x = torch.tensor([[0.5, -1.0, float("-inf")], [float("-inf")] * 3])
    want = torch.ops.aten._safe_softmax(x, -1)
    assert torch.equal(want[1], torch.zeros(3))
    torch.testing.assert_close(torch.ops.aten._safe_softmax(x.to(spyre), -1).cpu(), want)


@pytest.mark.parametrize("op", [torch.isneginf, torch.isposinf])
def test_isneginf_and_isposinf(spyre, op):
    x = torch.tensor([float("-inf"), -1.0, 0.0, float("inf"), float("nan")])
    assert torch.equal(op(x.to(spyre)).cpu(), op(x))
    assert torch.equal(op(x.half().to(spyre)).cpu(), op(x.half()))


def test_the_decoders_views_stay_views(spyre):
    """The view ops of the forward (head split, transpose, rotate_half's slices, repeat_kv's
    expand) alias the device bytes: none of them is a program or a copy."""
    x = torch.randn(1, 3, 8 * 16).to(spyre)
    before = torch.spyre.eager_cache_stats()
    heads = x.view(1, 3, 8, 16).transpose(1, 2)
    views = [heads, heads[..., 8:], heads[..., :8], heads[:, :, None].expand(1, 8, 2, 3, 16),
             torch.as_strided(x, (3, 16), (128, 1))]
    after = torch.spyre.eager_cache_stats()
    assert after.misses == before.misses and after.hits == before.hits
    for view in views:
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


# ---- slow: both layers, both dtypes, prefill and decode, both attention forms ---------------------

@pytest.mark.slow
@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("seq", [8, 1], ids=["prefill8", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_two_layer_decoder_runs_eagerly_in_spyre_programs(spyre, dtype, seq, attention):
    """A prefill of 8 tokens (positions 120..127 of a cache of 128) or a decode step at 96."""
    _assert_all_hits(*run_decoder(spyre, dtype, attention=attention, n_layers=2, seq=seq))
