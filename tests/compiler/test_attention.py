"""Fused attention (issue 17): SDPA and the explicit pattern become ONE flash-style spyre program.

Two tiers: the AttentionKernel compiled and launched directly against its definition
(kernel_ir.attention_reference), and whole functions compiled under SPYRE_STRICT=1 against the
same function on the CPU in fp32.

Tolerances: fp32 is tight (the PE accumulates in fp32; the online softmax only reorders sums).
fp16 outputs are compared at atol = rtol = 2e-3 against fp32 attention: the output's own rounding
is 2^-11 relative, and the probabilities are rounded to fp16 before PV where the function does
so itself (``softmax(...).to(q.dtype) @ v``), a further ~2^-11 of each weighted value.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from inductor_helpers import compile_on_spyre
from pointwise_ir import contiguous
from spyre_inductor.compiler.backend import compile_kernel
from spyre_inductor.compiler.ir.kernel_ir import DTYPE_NAMES, AttentionKernel, Buffer, attention_reference
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel

FP32 = dict(rtol=1e-5, atol=2e-6)
FP16 = dict(rtol=2e-3, atol=2e-3)


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def run_kernel(tmp_path, q, k, v, *, bias=None, keep=None, causal=None, empty_rows="zero", scale=None,
               p_dtype=None, **compile_options):
    """Compile the AttentionKernel of these CPU tensors, launch it on spyre, return (out, report)."""
    B, H, L, D = q.shape
    dtype = DTYPE_NAMES[q.dtype]
    buffers = [Buffer(n, dtype, tuple(t.shape), tuple(t.stride())) for n, t in (("q", q), ("k", k), ("v", v))]
    args = [q, k, v]   # (masks: moved as they are, then broadcast on the device)
    strides = {}
    for name, m in (("bias", bias), ("keep", keep)):
        if m is not None:
            full = m.expand(B, H, L, k.shape[2])
            buffers.append(Buffer(name, DTYPE_NAMES[m.dtype], tuple(full.shape), tuple(full.stride())))
            strides[name] = tuple(full.stride())
            args.append((m, full.shape))
    shape = (B, H, L, v.shape[3])
    buffers.append(Buffer("out", dtype, shape, contiguous(shape)))
    scale = D ** -0.5 if scale is None else scale
    kernel = AttentionKernel("attention_test", tuple(buffers), scale, causal, strides.get("bias"), strides.get("keep"),
                             empty_rows, p_dtype)
    artifact = compile_kernel(kernel, tmp_path, **compile_options)
    plan = prepare_kernel(artifact)
    dev = [a.to("spyre") if isinstance(a, torch.Tensor) else a[0].to("spyre").expand(a[1]) for a in args]
    out = torch.empty(shape, dtype=q.dtype, device="spyre")
    torch.spyre.reset_kernel_reports()
    launch_jobplan(plan, dev + [out])
    torch.spyre.synchronize()
    want = attention_reference(q, k, v, bias, keep, scale=scale, causal=causal, empty_rows=empty_rows,
                               p_dtype=TORCH.get(p_dtype), out_dtype=q.dtype)
    report = torch.spyre.kernel_reports()[-1]
    tiling = json.loads((artifact / "plan.json").read_text())["tiling"]
    report.rows_per_unit, report.kv_split, report.share = tiling["rows"], tiling["kv_split"], tiling["share"]
    return out.cpu(), want, report


TORCH = {"fp16": torch.float16, "fp32": torch.float32}


# ---- the kernel against its definition -----------------------------------------------------

@pytest.mark.parametrize("B,H,KVH,L,S,D", [
    (1, 2, 2, 8, 64, 64),        # one unit, one chunk
    (2, 4, 2, 40, 200, 64),      # GQA, rows and positions not multiples of the tiles
    (1, 8, 2, 1, 300, 128),      # decode: one row per head, four heads per kv head
    (1, 4, 1, 130, 130, 128),    # multi-query: every head reads the one kv head
])
def test_kernel_matches_its_definition_fp32(tmp_path, B, H, KVH, L, S, D):
    q, k, v = _randn(B, H, L, D), _randn(B, KVH, S, D, seed=1), _randn(B, KVH, S, D, seed=2)
    got, want, report = run_kernel(tmp_path, q, k, v)
    torch.testing.assert_close(got, want, **FP32)
    # the output written once, q once per part of the positions (a decode's kv split), K and V
    # once per ring group of blocks of query rows (a block alone when K/V are not shared over
    # the ring): no score matrix
    groups = -(-(-(-L // report.rows_per_unit)) // report.share)
    assert report.bytes_moved == 4 * ((1 + report.kv_split) * B * H * L * D + 2 * groups * B * KVH * S * D)


@pytest.mark.parametrize("causal", [0, 5, -3])
def test_causal_diagonal_skips_what_no_row_sees(tmp_path, causal):
    # -3: the first three rows see nothing (zeros, as SDPA's math path gives them)
    q, k, v = _randn(1, 2, 70, 64), _randn(1, 2, 90, 64, seed=1), _randn(1, 2, 90, 64, seed=2)
    got, want, report = run_kernel(tmp_path, q, k, v, causal=causal)
    torch.testing.assert_close(got, want, **FP32)
    if causal < 0:
        assert got[:, :, :3].abs().max() == 0


def test_masks_bias_and_keep_broadcast(tmp_path):
    q, k, v = _randn(2, 4, 24, 64), _randn(2, 4, 96, 64, seed=1), _randn(2, 4, 96, 64, seed=2)
    bias = _randn(2, 1, 1, 96, seed=3)                        # a padding-style row per batch
    keep = torch.rand(1, 4, 24, 96, generator=torch.Generator().manual_seed(4)) > 0.3   # per head and row
    got, want, _ = run_kernel(tmp_path, q, k, v, bias=bias, keep=keep)
    torch.testing.assert_close(got, want, **FP32)


@pytest.mark.parametrize("empty_rows", ["zero", "nan"])
def test_rows_with_no_finite_score(tmp_path, empty_rows):
    q, k, v = _randn(1, 1, 16, 64), _randn(1, 1, 64, 64, seed=1), _randn(1, 1, 64, 64, seed=2)
    keep = torch.ones(1, 1, 16, 64, dtype=torch.bool)
    keep[..., 3, :] = False
    got, want, _ = run_kernel(tmp_path, q, k, v, keep=keep, empty_rows=empty_rows)
    torch.testing.assert_close(got, want, **FP32, equal_nan=True)
    assert (got[0, 0, 3] == 0).all() if empty_rows == "zero" else got[0, 0, 3].isnan().all()


@pytest.mark.parametrize("mask", ["none", "keep", "one_position"])
def test_decode_splits_the_positions_over_cores(tmp_path, mask):
    # one query row per head: the positions are dealt over neighbouring cores, each core's partial
    # softmax travels the ring to the part before and is combined there (flash decoding); a part
    # that keeps no position at all (one_position) contributes nothing
    q, k, v = _randn(1, 8, 1, 64), _randn(1, 2, 2000, 64, seed=1), _randn(1, 2, 2000, 64, seed=2)
    keep = None
    if mask == "keep":
        keep = torch.rand(1, 1, 1, 2000, generator=torch.Generator().manual_seed(3)) > 0.5
    elif mask == "one_position":
        keep = torch.zeros(1, 1, 1, 2000, dtype=torch.bool)
        keep[..., 1500] = True
    got, want, report = run_kernel(tmp_path, q, k, v, keep=keep)
    torch.testing.assert_close(got, want, **FP32)
    assert report.kv_split > 1 and report.cores_used > 2


def test_fp16_with_fp16_probabilities(tmp_path):
    q, k, v = (_randn(1, 4, 64, 128, dtype=torch.float16, seed=s) for s in range(3))
    got, want, _ = run_kernel(tmp_path, q, k, v, causal=0, p_dtype="fp16")
    torch.testing.assert_close(got, want, **FP16)


def test_every_core_count_gives_the_same_answer(tmp_path):
    q, k, v = _randn(1, 4, 64, 64), _randn(1, 2, 128, 64, seed=1), _randn(1, 2, 128, 64, seed=2)
    outs = [run_kernel(tmp_path / str(n), q, k, v, causal=0, cores=n)[0] for n in (1, 2, 3)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=0)


# ---- whole functions under SPYRE_STRICT=1 --------------------------------------------------

def _programs(records):
    return [r for r in records if r.artifact is not None]


def _check(fn, args, tol, expect_programs=1):
    out, _, records, _, _ = compile_on_spyre(fn, *args)
    want = fn(*[a.float() if a.is_floating_point() else a for a in args])
    torch.testing.assert_close(out[0].cpu().float(), want.float(), **tol, equal_nan=True)
    programs = _programs(records)
    assert [p.kernel.name.startswith("spyre_attn") for p in programs].count(True) == 1
    assert len(programs) == expect_programs, [p.kernel.name for p in programs]
    return programs


def test_sdpa_causal_is_one_program_with_no_mask_read(strict):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    (program,) = _check(f, [_randn(1, 4, 128, 64, seed=s) for s in range(3)], FP32)
    assert program.kernel.causal == 0 and program.kernel.keep is None and program.kernel.bias is None


def test_sdpa_boolean_mask_scale_and_gqa_reads_kv_heads_once(strict):
    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)

    mask = torch.arange(256)[None, :] <= torch.arange(100, 104)[:, None]   # a decode-style keep mask
    (program,) = _check(f, [_randn(1, 8, 4, 64), _randn(1, 2, 256, 64, seed=1), _randn(1, 2, 256, 64, seed=2), mask],
                        FP32)
    kernel = program.kernel
    assert kernel.group == 4 and kernel.k.shape == (1, 2, 256, 64)   # K and V never copied per head
    assert math.isclose(kernel.scale, 0.3, rel_tol=1e-12)


def test_sdpa_additive_mask_fp16(strict):
    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    pad = torch.zeros(2, 1, 1, 128, dtype=torch.float16)
    pad[1, ..., 100:] = float("-inf")                                     # BERT-style padding
    _check(f, [_randn(2, 4, 128, 64, dtype=torch.float16, seed=s) for s in range(3)] + [pad], FP16)


def test_sdpa_decode_over_a_long_kv(strict):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    _check(f, [_randn(1, 8, 1, 128, dtype=torch.float16), _randn(1, 2, 512, 128, dtype=torch.float16, seed=1),
               _randn(1, 2, 512, 128, dtype=torch.float16, seed=2)], FP16)


def test_explicit_pattern_fuses_to_the_same_program(strict):
    # what model code writes: repeat_kv, q k^T * scale, a causal masked_fill, softmax in fp32
    def f(q, k, v):
        b, kvh, s, d = k.shape
        rep = q.shape[1] // kvh
        k = k[:, :, None].expand(b, kvh, rep, s, d).reshape(b, kvh * rep, s, d)
        v = v[:, :, None].expand(b, kvh, rep, s, d).reshape(b, kvh * rep, s, d)
        scores = q @ k.transpose(-2, -1) * d ** -0.5
        keep = torch.ones(q.shape[2], s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

    (program,) = _check(f, [_randn(1, 8, 64, 64, dtype=torch.float16), _randn(1, 2, 64, 64, dtype=torch.float16, seed=1),
                            _randn(1, 2, 64, 64, dtype=torch.float16, seed=2)], FP16)
    assert program.kernel.causal == 0 and program.kernel.group == 4   # the tril folded, repeat_kv gone


def test_heads_transposed_from_the_projection_are_read_where_they_lie(strict):
    def f(x, w):
        q = (x @ w).view(1, 64, 4, 64).transpose(1, 2)          # [B, H, L, D] view of the matmul output
        return F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(1, 64, 256)

    programs = _check(f, [_randn(1, 64, 256), _randn(256, 256, seed=1) * 0.05], FP32, expect_programs=2)
    attention = next(p for p in programs if p.kernel.name.startswith("spyre_attn"))
    assert attention.kernel.q.strides[1:] == (64, 256, 1)       # (heads, rows, features) of the (1, 64, 256) output
    assert attention.kernel.out.strides[1:] == (64, 256, 1)     # written back in the same layout: no copy after


def test_a_softmax_over_another_dim_is_left_alone():
    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v

    out, _, records, _, _ = compile_on_spyre(f, *[_randn(1, 2, 32, 64, seed=s) for s in range(3)])
    assert not any(r.kernel is not None and r.kernel.name.startswith("spyre_attn") for r in records)
    torch.testing.assert_close(out[0].cpu(), f(*[_randn(1, 2, 32, 64, seed=s) for s in range(3)]), **FP32)


def test_an_attention_no_tiling_fits_falls_back_visibly(monkeypatch):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    args = [_randn(1, 1, 8, 8192, seed=s) for s in range(3)]       # a K chunk of 64 rows alone needs 2 MiB
    out, _, records, warnings, _ = compile_on_spyre(f, *args)
    torch.testing.assert_close(out[0].cpu(), f(*args), **FP32)
    assert any("scaled_dot_product_attention" in w and "no tiling fits" in w for w in warnings)
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(Exception, match="scaled_dot_product_attention"):
        compile_on_spyre(f, *args)


def test_a_finite_fill_is_written_as_it_is(strict):
    # GPT-2's eager code: torch.where(causal, scores, torch.finfo(dtype).min); a row whose every
    # position is dropped then averages all of them, as eager does (no -inf: no NaN, no zeros)
    def f(q, k, v, keep):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=-1) @ v

    keep = torch.ones(48, 48, dtype=torch.bool).tril()
    keep[5] = False
    (program,) = _check(f, [_randn(2, 4, 48, 64, seed=s) for s in range(3)] + [keep], FP32)
    assert program.kernel.masked_score == torch.finfo(torch.float32).min and program.kernel.causal is None


def test_a_scaling_outside_the_bias_is_not_taken_for_the_scores_scale():
    # (q k^T + bias) * 0.5 scales the bias too: not what the fused op computes, so it is not fused
    def f(q, k, v, bias):
        return torch.softmax((q @ k.transpose(-2, -1) + bias) * 0.5, dim=-1) @ v

    args = [_randn(1, 2, 32, 64, seed=s) for s in range(3)] + [_randn(32, 32, seed=3)]
    out, _, records, _, _ = compile_on_spyre(f, *args)
    assert not any(r.kernel is not None and r.kernel.name.startswith("spyre_attn") for r in records)
    torch.testing.assert_close(out[0].cpu(), f(*args), **FP32)


def test_views_with_a_storage_offset_are_read_where_they_start(strict):
    # a window of a KV cache and a fused qkv projection split in three: every operand is a view
    # with an offset (the address a launch resolves already includes it)
    def window(q, kc, vc):
        return F.scaled_dot_product_attention(q, kc[:, :, 4:260], vc[:, :, 4:260], is_causal=True)

    _check(window, [_randn(1, 2, 8, 64), _randn(1, 2, 300, 64, seed=1), _randn(1, 2, 300, 64, seed=2)], FP32)

    def fused_qkv(x, w):
        q, k, v = (x @ w).view(2, 24, 3, 3, 32).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 24, 96)

    _check(fused_qkv, [_randn(2, 24, 96), _randn(96, 288, seed=1) * 0.1], FP32, expect_programs=2)


def test_upcast_inputs_keep_an_fp32_result(strict):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float())

    out, _, records, _, _ = compile_on_spyre(f, *[_randn(1, 2, 16, 64, dtype=torch.float16, seed=s) for s in range(3)])
    assert out[0].dtype == torch.float32
    (program,) = [r for r in records if r.kernel is not None and r.kernel.name.startswith("spyre_attn")]
    assert program.kernel.p_dtype is None and program.kernel.out.dtype == "fp32"


def test_a_mask_added_to_flattened_heads_is_split_back(strict):
    B, H, L, S = 2, 3, 16, 40

    def f(q, k, v, m3):
        s = (q @ k.transpose(-2, -1) * 0.125).reshape(B * H, L, S) + m3
        return torch.softmax(s, -1) @ v.reshape(B * H, S, 64)

    _check(f, [_randn(B, H, L, 64), _randn(B, H, S, 64, seed=1), _randn(B, H, S, 64, seed=2),
               _randn(B * H, L, S, seed=3)], FP32)


def test_a_softmax_over_flattened_scores_is_left_alone():
    def f(q, k, v):
        return torch.softmax((q @ k.transpose(-2, -1)).flatten(-2), -1).view(1, 2, 16, 64) @ v

    args = [_randn(1, 2, 16, 64), _randn(1, 2, 64, 64, seed=1), _randn(1, 2, 64, 64, seed=2)]
    out, _, records, _, _ = compile_on_spyre(f, *args)
    assert not any(r.kernel is not None and r.kernel.name.startswith("spyre_attn") for r in records)
    torch.testing.assert_close(out[0].cpu(), f(*args), **FP32)


def test_a_kv_cache_mask_from_positions_is_computed_on_chip(strict):
    # what a decoder writes for prefill into a cache and for decode: arange(S) <= pos[:, None]
    def f(q, k, v, pos):
        keep = torch.arange(k.shape[2], device=q.device) <= pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)

    for L, pos in ((1, torch.tensor([70])), (24, torch.arange(40, 64)), (3, torch.tensor([-1, 5, 300]))):
        (program,) = _check(f, [_randn(1, 4, L, 64), _randn(1, 2, 128, 64, seed=1), _randn(1, 2, 128, 64, seed=2), pos],
                            FP32)
        assert program.kernel.positions is not None and program.kernel.keep is None   # no mask program, no mask read


def test_a_decode_steps_key_and_value_writes_are_one_program(strict):
    # two tiny scatters indexed by the same positions share an 8-byte read: on spyre a launch costs
    # more than that, so they fuse (choices.py) into one program
    def f(kc, vc, pos, k, v):
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        return kc.sum() + vc.sum()

    args = [torch.zeros(1, 2, 64, 64), torch.zeros(1, 2, 64, 64), torch.tensor([5]), _randn(1, 2, 1, 64),
            _randn(1, 2, 1, 64, seed=1)]
    out, dev, records, _, _ = compile_on_spyre(f, *args)
    scatters = [r for r in records if r.kernel is not None and "index_put" in r.ops]
    assert len(scatters) == 1 and len(scatters[0].nodes) == 2
    want = [a.clone() for a in args]
    f(*want)
    torch.testing.assert_close(dev[0].cpu(), want[0], rtol=0, atol=0)
    torch.testing.assert_close(dev[1].cpu(), want[1], rtol=0, atol=0)


def test_a_fused_qkv_projection_split_in_three_is_read_in_place(strict):
    # GPT-2: q, k, v = c_attn(x).split(d, dim=2), each viewed into heads: the pieces of a split are
    # views of the projection's output, which the attention reads where they lie
    def f(x, w, b):
        q, k, v = (t.view(2, 32, 4, 64).transpose(1, 2) for t in (x @ w + b).split(256, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 32, 256)

    programs = _check(f, [_randn(2, 32, 256), _randn(256, 768, seed=1) * 0.05, _randn(768, seed=2)], FP32,
                      expect_programs=2)
    attention = next(p for p in programs if p.kernel.name.startswith("spyre_attn"))
    assert attention.kernel.q.strides[1:] == (64, 768, 1) and attention.kernel.k.shape == (2, 4, 32, 64)
