"""Reference models: the small transformers that the tests, the demo and the benchmarks share.

Written from ``torch.nn`` pieces the way Hugging Face-style code writes them (nothing is
downloaded; weights are random, from a seed; configs are small), so that what compiles here is
what real model code hands torch.compile:

* ``Llama``: a Llama-style decoder. Token embedding, RMSNorm computed in fp32 and cast back,
  rotary embeddings (cos/sin tables indexed by the positions, ``rotate_half`` with slices and a
  cat), grouped-query attention (``n_heads`` query heads over ``n_kv_heads`` key/value heads),
  a SwiGLU MLP, residuals, a final norm and the LM head. ``forward(ids, pos, k_caches,
  v_caches)`` writes the new keys and values into the caches in place
  (``index_copy_(2, pos, k)``, one K and one V cache per layer, each (batch, n_kv_heads,
  max_len, head_dim)) and attends over the whole cache under the mask
  ``arange(max_len) <= pos[:, None]``: the same code is a prefill (128 tokens into a cache of
  128) and a decode step (1 token, a cache of 128..1024).
* ``GPT2``: token and learned position embeddings, LayerNorm, one fused qkv ``nn.Linear`` with
  bias split in three, causal attention, a tanh-GELU MLP, residuals, tied LM head.
* ``Bert``: word, position and token-type embeddings, LayerNorm, non-causal attention under a
  padding mask (an additive mask from a 0/1 ``attention_mask`` per token, broadcast over heads
  and query rows), post-norm residuals, an erf-GELU MLP.

Attention is selectable in every model (``attention=``): ``"sdpa"`` calls
``F.scaled_dot_product_attention`` (a bool mask and ``enable_gqa=True`` for Llama,
``is_causal=True`` for GPT-2, the additive float mask for BERT); ``"explicit"`` writes it out as
HF-style eager code does: ``repeat_kv`` by expand + reshape, ``q @ k.transpose(-2, -1) *
scale``, the mask applied (``masked_fill`` for Llama, ``torch.where`` for GPT-2, an add for
BERT), ``softmax(scores.float(), -1).to(q.dtype)`` and ``@ v``.

``llama_config()``, ``gpt2_config()`` and ``bert_config()`` give the small configs (d=256,
head_dim 64, 2 layers, vocab 1000); ``build(config, seed=..., dtype=...)`` makes the model with
seeded random weights (norm weights and biases random too, so that a wrong broadcast of them
shows), in eval mode.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION = ("explicit", "sdpa")


# ---- configs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 1000
    d: int = 256
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64        # q projects d -> n_heads * head_dim (512), as in models whose head_dim != d / n_heads
    hidden: int = 768         # SwiGLU width (about 8/3 d, a multiple of 64)
    max_len: int = 1024       # rows of the rotary tables: the largest cache a decode step may use
    eps: float = 1e-6
    rope_theta: float = 10000.0
    attention: str = "explicit"


@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 1000
    d: int = 256
    n_layers: int = 2
    n_heads: int = 4          # head_dim 64
    max_len: int = 1024       # learned positions
    eps: float = 1e-5
    attention: str = "explicit"


@dataclass(frozen=True)
class BertConfig:
    vocab: int = 1000
    d: int = 256
    n_layers: int = 2
    n_heads: int = 4          # head_dim 64
    intermediate: int = 1024
    max_len: int = 512
    type_vocab: int = 2
    eps: float = 1e-12
    attention: str = "explicit"


def llama_config(**overrides) -> LlamaConfig:
    return replace(LlamaConfig(), **overrides)


def gpt2_config(**overrides) -> GPT2Config:
    return replace(GPT2Config(), **overrides)


def bert_config(**overrides) -> BertConfig:
    return replace(BertConfig(), **overrides)


def build(config, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model for `config` with random weights from `seed`, in `dtype`, in eval mode (on the CPU).
    The global RNG is left as it was."""
    cls = {LlamaConfig: Llama, GPT2Config: GPT2, BertConfig: Bert}[type(config)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        for module in model.modules():  # norms start at ones and zeros: make them count
            if isinstance(module, (nn.LayerNorm, RMSNorm)):
                nn.init.normal_(module.weight, 1.0, 0.1)
                if getattr(module, "bias", None) is not None:
                    nn.init.normal_(module.bias, 0.0, 0.1)
    return model.to(dtype).eval()


def fp32_copy(model: nn.Module) -> nn.Module:
    """An fp32 copy of `model` (a CPU model) with every parameter and buffer widened exactly: the
    reference a compiled 16-bit model is compared with (the same weights, the same rotary tables)."""
    return copy.deepcopy(model).float()


def llama_inputs(model: "Llama", *, batch: int = 1, seq: int = 128, cache_len: int = 128, seed: int = 0):
    """(ids, pos, k_caches, v_caches) on the CPU for one call of `model`.

    seq > 1 is a prefill of positions cache_len - seq .. cache_len - 1 (a prefill of 128 into a
    cache of 128: positions 0..127); seq == 1 is a decode step at position 3/4 of the cache, so
    rows past it (masked out) and before it (attended) both hold earlier values. The caches are
    random, as earlier steps would have left them: whatever the call does not write must come
    back unchanged."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab, (batch, seq), generator=g)
    start = cache_len - seq if seq > 1 else 3 * cache_len // 4
    pos = torch.arange(start, start + seq)
    k, v = model.new_caches(batch, cache_len, seed=seed + 1)
    return ids, pos, k, v


def gpt2_inputs(config: GPT2Config, *, batch: int = 2, seq: int = 128, seed: int = 0):
    """(ids,) on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, config.vocab, (batch, seq), generator=g),)


def bert_inputs(config: BertConfig, *, batch: int = 2, seq: int = 128, seed: int = 0):
    """(ids, token_type_ids, attention_mask) on the CPU: two segments (types 0 then 1), and every
    sequence after the first padded at its end (the i-th by 40 * i tokens, at most seq - 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab, (batch, seq), generator=g)
    token_types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    lengths = torch.tensor([max(1, seq - 40 * i) for i in range(batch)])
    attention_mask = (torch.arange(seq) < lengths[:, None]).long()
    return ids, token_types, attention_mask


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, not {attention!r}")


# ---- pieces ----------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Llama's RMSNorm: computed in fp32, cast back to the input's dtype, then scaled."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep: int):
    """(b, kv_heads, L, hd) -> (b, kv_heads * n_rep, L, hd) by expand + reshape (HF's repeat_kv)."""
    if n_rep == 1:
        return x
    b, kv, length, hd = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, length, hd).reshape(b, kv * n_rep, length, hd)


def explicit_attention(q, k, v, *, mask=None, additive=None, fill: str = "masked_fill"):
    """softmax(q @ k^T * scale, masked) @ v as HF-style eager code writes it: the scores' softmax in
    fp32, cast back to q's dtype before the product with v. `mask` is a bool mask (True: attend),
    applied by `fill` ("masked_fill" with -inf, or "where" with the dtype's lowest value);
    `additive` is added to the scores."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        if fill == "masked_fill":
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    if additive is not None:
        scores = scores + additive
    p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return p @ v


def _heads(x, b: int, s: int, n: int, hd: int):
    return x.view(b, s, n, hd).transpose(1, 2)


def _merge_heads(x):
    b, n, s, hd = x.shape
    return x.transpose(1, 2).reshape(b, s, n * hd)


# ---- Llama -----------------------------------------------------------------------------------

class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        _check_attention(c.attention)
        self.c = c
        self.q_proj = nn.Linear(c.d, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d, bias=False)

    def forward(self, x, pos, cos, sin, k_cache, v_cache):
        c = self.c
        b, s, _ = x.shape
        q = _heads(self.q_proj(x), b, s, c.n_heads, c.head_dim)
        k = _heads(self.k_proj(x), b, s, c.n_kv_heads, c.head_dim)
        v = _heads(self.v_proj(x), b, s, c.n_kv_heads, c.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        mask = torch.arange(k_cache.shape[2], device=x.device) <= pos[:, None]  # (s, max_len): causal over the cache
        if c.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        else:
            n_rep = c.n_heads // c.n_kv_heads
            out = explicit_attention(q, repeat_kv(k_cache, n_rep), repeat_kv(v_cache, n_rep), mask=mask)
        return self.o_proj(_merge_heads(out))


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.d, c.hidden, bias=False)
        self.up_proj = nn.Linear(c.d, c.hidden, bias=False)
        self.down_proj = nn.Linear(c.hidden, c.d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_norm = RMSNorm(c.d, c.eps)
        self.attn = LlamaAttention(c)
        self.post_attention_norm = RMSNorm(c.d, c.eps)
        self.mlp = LlamaMLP(c)

    def forward(self, x, pos, cos, sin, k_cache, v_cache):
        x = x + self.attn(self.input_norm(x), pos, cos, sin, k_cache, v_cache)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        if c.n_heads % c.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.d)
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d, c.eps)
        self.lm_head = nn.Linear(c.d, c.vocab, bias=False)
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim)
        angles = torch.outer(torch.arange(c.max_len).float(), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def new_caches(self, batch: int, max_len: int, *, device=None, seed: int | None = None):
        """(k_caches, v_caches): one K and one V cache per layer, (batch, n_kv_heads, max_len, head_dim),
        zeros, or random values (as if earlier steps had filled them) when `seed` is given."""
        c = self.config
        shape = (batch, c.n_kv_heads, max_len, c.head_dim)
        dtype = self.embed.weight.dtype
        if seed is None:
            make = lambda: torch.zeros(shape, dtype=dtype)  # noqa: E731
        else:
            g = torch.Generator().manual_seed(seed)
            make = lambda: torch.randn(shape, generator=g).to(dtype)  # noqa: E731
        k, v = [make() for _ in range(c.n_layers)], [make() for _ in range(c.n_layers)]
        if device is not None:
            k, v = [t.to(device) for t in k], [t.to(device) for t in v]
        return k, v

    def forward(self, ids, pos, k_caches, v_caches):
        x = self.embed(ids)
        cos, sin = self.cos[pos], self.sin[pos]  # (s, head_dim): broadcast over batch and heads
        for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches):
            x = layer(x, pos, cos, sin, k_cache, v_cache)
        return self.lm_head(self.norm(x))


# ---- GPT-2 -----------------------------------------------------------------------------------

class GPT2Attention(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        _check_attention(c.attention)
        self.c = c
        self.c_attn = nn.Linear(c.d, 3 * c.d)   # q, k and v in one matmul, with bias
        self.c_proj = nn.Linear(c.d, c.d)

    def forward(self, x):
        c = self.c
        b, s, _ = x.shape
        hd = c.d // c.n_heads
        q, k, v = (_heads(t, b, s, c.n_heads, hd) for t in self.c_attn(x).split(c.d, dim=2))
        if c.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
            out = explicit_attention(q, k, v, mask=causal, fill="where")
        return self.c_proj(_merge_heads(out))


class GPT2Block(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.d, eps=c.eps)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.d, eps=c.eps)
        self.c_fc = nn.Linear(c.d, 4 * c.d)
        self.c_proj = nn.Linear(4 * c.d, c.d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.d)
        self.wpe = nn.Embedding(c.max_len, c.d)
        self.blocks = nn.ModuleList(GPT2Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d, eps=c.eps)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the LM head is tied to the token embedding


# ---- BERT ------------------------------------------------------------------------------------

class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        _check_attention(c.attention)
        self.c = c
        self.query, self.key, self.value = (nn.Linear(c.d, c.d) for _ in range(3))
        self.attn_out = nn.Linear(c.d, c.d)
        self.attn_norm = nn.LayerNorm(c.d, eps=c.eps)
        self.intermediate = nn.Linear(c.d, c.intermediate)
        self.output = nn.Linear(c.intermediate, c.d)
        self.out_norm = nn.LayerNorm(c.d, eps=c.eps)

    def forward(self, x, additive_mask):
        c = self.c
        b, s, _ = x.shape
        hd = c.d // c.n_heads
        q, k, v = (_heads(f(x), b, s, c.n_heads, hd) for f in (self.query, self.key, self.value))
        if c.attention == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)
        else:
            a = explicit_attention(q, k, v, additive=additive_mask)
        x = self.attn_norm(x + self.attn_out(_merge_heads(a)))          # post-norm residuals
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.word = nn.Embedding(c.vocab, c.d)
        self.position = nn.Embedding(c.max_len, c.d)
        self.token_type = nn.Embedding(c.type_vocab, c.d)
        self.norm = nn.LayerNorm(c.d, eps=c.eps)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.n_layers))

    def forward(self, ids, token_type_ids, attention_mask):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.norm(self.word(ids) + self.position(positions) + self.token_type(token_type_ids))
        # (b, s) 0/1 -> (b, 1, 1, s): 0 where attended, the dtype's lowest value where padded
        keep = attention_mask[:, None, None, :].to(x.dtype)
        additive = (1.0 - keep) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, additive)
        return x
