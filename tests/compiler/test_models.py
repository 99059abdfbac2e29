"""Whole transformers compiled on spyre under SPYRE_STRICT=1, with no CPU fallback at all (issue 17).

The models are the shared reference models (spyre_inductor/testing/models.py): a Llama-style
decoder (RMSNorm in fp32, rotary embeddings, GQA, SwiGLU, KV caches updated in place by
``index_copy_``), a GPT-2-style model and a BERT-style encoder, small configs, random weights.
Every test sets SPYRE_STRICT=1: a node that would run through the compiled graph's CPU fallback
fails the compile, and an op left to the eager device's CPU fallback fails the call; on top of
that each test checks that every scheduled node became a spyre program.

The reference is the same model on the CPU in fp32: for a 16-bit model, its weights and buffers
widened exactly (models.fp32_copy). Tolerances are relative to each compared tensor's scale
s = max|reference| (the logits, the hidden states, each KV cache):

* fp32: 1e-5 * s. Spyre and the CPU compute the same fp32 math in other orders (matmul sums over
  K up to 1024, norms over 256, softmax over up to 1024 keys) with other exp/rsqrt/erf/tanh
  implementations: a few units of 2^-24 per op, random-walking through ~15 ops per layer to
  about 1e-6 * s (measured 4e-7 .. 8e-7 * s). 1e-5 leaves a 10x margin and is still 50x below one
  fp16 rounding: any value rounded to 16 bits on the way fails it.
* fp16: 4 * 2^-11 * s. The fp16 model rounds every stored intermediate to fp16 (unit roundoff
  u = 2^-11; inside a program the math is fp32, matmuls accumulate in fp32), about ten roundings
  per layer on the residual path that add in quadrature and that the norms rescale. CPU eager
  fp16 lands at 0.8 .. 2.5 u * s on these models, spyre at 0.6 .. 1.7 u * s (fused intermediates
  stay fp32); 4 u * s covers both. A matmul accumulated in fp16 instead (sqrt(768) ~ 28 u of
  rounding noise over K = 768) would not pass.
* bf16 (slow tier only): the same 4 u * s with bf16's u = 2^-8.

The Llama caches are compared too: rows the call writes (its positions) under the same
tolerance, every other row bit for bit (nothing else may be touched).

Attention is tested both ways the models offer: ``attention="explicit"`` (HF-style eager code)
and ``attention="sdpa"`` (F.scaled_dot_product_attention); both become the one fused attention
program (attention_fusion.py).

The default tier runs a one-layer decode step and the compiler fixes these models needed, each
pinned on the smallest graph that shows it; whole models, every dtype and both attention forms
are ``slow``. Programs per decoder layer (two layers' programs minus one layer's) and each
kernel's simulated time are printed by the slow counting test (``-s`` to see them;
benchmarks/models.py prints the same as a table).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from spyre_inductor.compiler.ir.kernel_ir import MatmulKernel
from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.device import fallback
from spyre_inductor.testing import models

from inductor_helpers import SPYRE, compile_on_spyre

U16 = 2.0 ** -11
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4 * U16, torch.bfloat16: 4 * 2.0 ** -8}  # x max|reference| (docstring)


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


# ---- running a model both ways -------------------------------------------------------------------

def _to(a, device):
    if isinstance(a, torch.Tensor):
        return a.to(device)
    if isinstance(a, list):
        return [_to(t, device) for t in a]
    return a


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, list):
        return [_clone(t) for t in a]
    return a


def _widen(a):
    if isinstance(a, torch.Tensor):
        return a.float() if a.is_floating_point() else a
    if isinstance(a, list):
        return [_widen(t) for t in a]
    return a


def compile_model(model: nn.Module, inputs: tuple):
    """Compile `model` (a CPU model, moved to spyre) fresh and run it once on spyre copies of
    `inputs`; returns (output on the CPU, the spyre inputs after the call, kernel records)."""
    torch._dynamo.reset()
    fallback.reset_warnings()
    args = tuple(_to(a, SPYRE) for a in inputs)
    with torch.no_grad(), record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        out = torch.compile(model.to(SPYRE))(*args)
        torch.spyre.synchronize()
    return out.cpu(), args, records


def assert_close_scaled(got, want, dtype, what):
    scale = want.abs().max().item()
    err = (got.float() - want).abs().max().item()
    assert err <= TOLERANCE[dtype] * scale, (
        f"{what}: max |spyre - cpu fp32| = {err:.3g} exceeds {TOLERANCE[dtype]:.3g} x {scale:.3g} "
        f"({err / scale:.3g} of the scale)")


def assert_all_on_spyre(records):
    assert records, "nothing was compiled"
    cpu = [(r.ops, r.fallback_reason) for r in records if r.artifact is None and r.kernel is not None]
    assert not cpu, f"ran on the CPU: {cpu}"


def check_model(model: nn.Module, inputs: tuple, dtype: torch.dtype):
    """Compile `model` in `dtype` on spyre, compare with its fp32 copy on the CPU (output, and any
    list of caches the call updates in place); returns the kernel records."""
    model = model.to(dtype)
    reference = models.fp32_copy(model)
    inputs = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point()
                   else [t.to(dtype) for t in a] if isinstance(a, list) else a for a in inputs)
    ref_inputs = tuple(_widen(_clone(a)) for a in inputs)
    with torch.no_grad():
        want = reference(*ref_inputs)
    got, args, records = compile_model(model, inputs)
    assert_all_on_spyre(records)
    assert got.dtype == dtype
    assert_close_scaled(got, want, dtype, "output")
    for before, after, ref in zip(inputs, args, ref_inputs):
        if isinstance(before, list):  # caches updated in place
            for i, (b, a, r) in enumerate(zip(before, after, ref)):
                _check_cache(b, a.cpu(), r, inputs[1], dtype, f"cache {i}")
    return records


def _check_cache(before, after, ref, pos, dtype, what):
    written = torch.zeros(before.shape[2], dtype=torch.bool)
    written[pos] = True
    assert torch.equal(after[:, :, ~written], before[:, :, ~written]), f"{what}: rows the call does not write changed"
    assert_close_scaled(after[:, :, written], ref[:, :, written], dtype, f"{what} (written rows)")


def llama(dtype=torch.float32, *, attention="explicit", n_layers=2, **inputs):
    model = models.build(models.llama_config(attention=attention, n_layers=n_layers))
    return check_model(model, models.llama_inputs(model, **inputs), dtype)


# ---- the default tier -------------------------------------------------------------------------------

def test_llama_decode_step_fp16_one_layer():
    """One token at position 96 of a cache of 128, one decoder layer, fp16: embedding, RMSNorm,
    q/k/v, rotary, both caches updated in place, masked GQA attention over the whole cache,
    SwiGLU, final norm and LM head, all in spyre programs."""
    from spyre_runtime.program.schedule import BIND_ERRORS

    before = BIND_ERRORS.copy()
    records = llama(torch.float16, n_layers=1, seq=1, cache_len=128)
    kinds = [type(r.kernel).__name__ for r in records]
    assert kinds.count("MatmulKernel") == 8  # q, k, v, o, gate, up, down, lm head
    assert kinds.count("AttentionKernel") == 1  # scores, softmax and p @ v: one fused program
    # every step the simulator binds a fast form for binds without raising (a raise only slows)
    assert BIND_ERRORS == before


def test_matmul_of_merged_heads_reads_its_operand_contiguously():
    """``attn.transpose(1, 2).reshape(b, s, h * d) @ W.t()`` (every attention's output projection).

    Inductor lays the clone that the reshape needs out in its input's order (a memcpy), and the
    reshape then read k as (h, d) with strides (s * d, 1): the matmul's k was not one dim, it ran
    as a looped reduction on the special-function pipeline (a decoder layer's o_proj: 481 us
    simulated, 148x its minimum bytes). Lowering now freezes that buffer contiguous, as the graph
    says the clone is: a permute copy, then a PE matmul that reads each operand once."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(1, 8, 128, 64, generator=g).half(), torch.randn(256, 512, generator=g).half()

    def o_proj(attn, weight):
        return attn.transpose(1, 2).reshape(1, 128, 512) @ weight.t()

    out, args, records, warned, _ = compile_on_spyre(o_proj, a, w)
    assert not warned
    torch.testing.assert_close(out[0].cpu().float(), o_proj(a.float(), w.float()), atol=0.05, rtol=2 * U16)
    (mm,) = [r.kernel for r in records if isinstance(r.kernel, MatmulKernel)]
    assert len(mm.reduction_ranges) == 1  # k is one contiguous dim of the operand
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    torch.compile(o_proj)(*args)
    torch.spyre.synchronize()
    report = next(r for r in torch.spyre.kernel_reports() if r.name == mm.name)
    assert report.bytes_read <= 1.05 * report.minimum_read_bytes  # each operand read once


def test_identical_layers_share_one_program():
    """The same kernel in two layers (other buffers, same computation) is compiled once: artifacts
    are compiled from the kernel with its buffers named by position, so both layers get one
    artifact, prepared once by the wrapper and launched once per layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()).eval()
    x = torch.randn(32, 64)
    with torch.no_grad():
        want = model(x)
        out, _, records, warned, code = compile_on_spyre(model.to(SPYRE), x)
    assert not warned
    torch.testing.assert_close(out[0].cpu(), want, atol=1e-5, rtol=1e-5)
    artifacts = [r.artifact for r in records]
    assert len(artifacts) == 2 and artifacts[0] == artifacts[1]
    assert records[0].kernel.name == records[1].kernel.name
    assert records[0].kernel.buffers != records[1].kernel.buffers  # the record keeps Inductor's names
    assert code.count("prepare_kernel(") == 1 and code.count("launch_jobplan(") == 2


def test_an_epilogue_that_would_cost_a_matmul_its_pe_plan_stays_apart():
    """GPT-2's first block: the residual is the embeddings' sum, never stored, so the MLP's down
    projection had ``tok + pos + h @ W.t() + b`` as its epilogue, with ``pos`` broadcast over the
    batch. That operand keeps the batch and sequence dims from merging into one m dim, the PE
    plans decline two m dims, and the group ran as a reduction (1957 us, 168x its minimum bytes).
    The scheduler no longer fuses what would cost a matmul its PE plan: the matmul is planned on
    the PE arrays and the add runs apart."""
    g = torch.Generator().manual_seed(0)
    tok, pos = torch.randn(2, 128, 256, generator=g).half(), torch.randn(128, 256, generator=g).half()
    h, w = torch.randn(2, 128, 1024, generator=g).half(), (torch.randn(256, 1024, generator=g) / 32).half()
    bias = torch.randn(256, generator=g).half()

    def residual_down(tok, pos, h, w, bias):
        return tok + pos + torch.nn.functional.linear(h, w, bias)

    out, _, records, warned, _ = compile_on_spyre(residual_down, tok, pos, h, w, bias)
    assert not warned
    want = residual_down(*(t.float() for t in (tok, pos, h, w, bias)))
    assert_close_scaled(out[0].cpu(), want, torch.float16, "output")
    families = [json.loads((r.artifact / "plan.json").read_text())["family"] for r in records]
    matmuls = [r for r in records if isinstance(r.kernel, MatmulKernel)]
    assert len(matmuls) == 1 and families[records.index(matmuls[0])] == "matmul"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_padding_mask_is_loaded_once_per_group_of_rows(dtype):
    """BERT's softmax: scores (b, h, q, k) plus an additive mask built from a (b, k) attention mask,
    broadcast over heads and query rows. The mask is constant down a group of rows (they lie
    along the merged (h, q) dim) and varies only with b, which the outer loop walks: it is loaded
    as one row per group and broadcast, not once per row (4.96x the minimum read bytes)."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 4, 128, 128, generator=g).to(dtype)
    mask = (torch.arange(128) < torch.tensor([[128], [88]])).long()

    def masked_softmax(scores, mask):
        additive = (1.0 - mask[:, None, None, :].to(scores.dtype)) * torch.finfo(scores.dtype).min
        return torch.softmax((scores * 0.125 + additive).float(), -1).to(scores.dtype)

    out, args, records, warned, _ = compile_on_spyre(masked_softmax, scores, mask)
    assert not warned
    want = masked_softmax(scores.float(), mask)
    assert_close_scaled(out[0].cpu(), want, dtype, "softmax")
    assert torch.equal(out[0].cpu()[1, :, :, 88:], torch.zeros(4, 128, 40, dtype=dtype))  # padded keys: exactly 0
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    torch.compile(masked_softmax)(*args)
    torch.spyre.synchronize()
    (report,) = torch.spyre.kernel_reports()
    assert report.refetch <= 1.3


# ---- whole models (slow) ------------------------------------------------------------------------------

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
ATTENTION = ["explicit", "sdpa"]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_prefill(dtype, attention):
    """128 tokens into caches of 128 (every row written), 2 layers."""
    llama(dtype, attention=attention, seq=128, cache_len=128)


@pytest.mark.slow
@pytest.mark.parametrize("cache_len", [128, 1024])
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_decode(dtype, attention, cache_len):
    """One token at 3/4 of the cache, 2 layers; the caches updated in place."""
    llama(dtype, attention=attention, seq=1, cache_len=cache_len)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_batch_of_two(dtype):
    llama(dtype, batch=2, seq=1, cache_len=128)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt2(dtype, attention):
    config = models.gpt2_config(attention=attention)
    check_model(models.build(config), models.gpt2_inputs(config), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bert(dtype, attention):
    config = models.bert_config(attention=attention)
    check_model(models.build(config), models.bert_inputs(config), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama", "gpt2", "bert"])
def test_bf16(model):
    """bf16 too (not a target dtype of the issue): the fp16 reasoning with u = 2^-8."""
    if model == "llama":
        llama(torch.bfloat16, seq=128, cache_len=128)
    elif model == "gpt2":
        config = models.gpt2_config()
        check_model(models.build(config), models.gpt2_inputs(config), torch.bfloat16)
    else:
        config = models.bert_config()
        check_model(models.build(config), models.bert_inputs(config), torch.bfloat16)


def programs_per_layer(seq: int, cache_len: int, dtype=torch.float16):
    """(programs per decoder layer, the 2-layer model's kernel reports of one call)."""
    counts = {}
    for n_layers in (1, 2):
        model = models.build(models.llama_config(n_layers=n_layers)).to(dtype)
        inputs = models.llama_inputs(model, seq=seq, cache_len=cache_len)
        inputs = (inputs[0], inputs[1], [c.to(dtype) for c in inputs[2]], [c.to(dtype) for c in inputs[3]])
        _, args, records = compile_model(model, inputs)
        assert_all_on_spyre(records)
        counts[n_layers] = len(records)
    torch.spyre.reset_kernel_reports()
    with torch.no_grad():
        torch.compile(model)(*args)  # the 2-layer model, compiled above
        torch.spyre.synchronize()
    return counts[2] - counts[1], torch.spyre.kernel_reports()


@pytest.mark.slow
@pytest.mark.parametrize("seq,cache_len", [(128, 128), (1, 1024)], ids=["prefill128", "decode1024"])
def test_programs_per_decoder_layer(seq, cache_len):
    """How many programs a Llama decoder layer is, and what each costs on the card (printed). With
    explicit attention a prefill layer is 17 programs: RMSNorm (the scaled rows, in one reduction
    program), q, q's rotary, k, v, k's rotary with both caches' index_copy_, two repeat_kv copies,
    scores, the masked softmax, p @ v, the heads permute, o_proj + residual, RMSNorm, gate, up
    (silu(gate) * up as its epilogue), down + residual. A decode step is 16: no heads permute (one
    token), k's repeat read in place by the scores, v's index_copy_ a program of its own. The
    counts are bounds: a fusion lost fails here."""
    per_layer, reports = programs_per_layer(seq, cache_len)
    total = sum(r.simulated_us for r in reports)
    print(f"\nLlama layer, {seq} token(s), cache {cache_len}: {per_layer} programs per layer; "
          f"2 layers + head: {len(reports)} programs, {total:.1f} us simulated")
    for r in sorted(reports, key=lambda r: -r.simulated_us):
        print(f"  {r.simulated_us:8.2f} us  {100 * r.simulated_us / total:5.1f}%  {r.name}")
    assert per_layer <= (17 if seq > 1 else 16)
