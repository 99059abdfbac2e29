"""A Min/Max of sizes alone, specialized per value as a size of its own (issue 31).

A sliding window's kv offset is ``Max(0, n - window + 1)``: affine in the cache length n on each
side of n = window, not across it, so no multilinear template in n fits a kernel that reads it
(symbolic/exact.py). Such a term (symbolic/capture.size_terms) becomes one more size the kernel is
specialized to: the generated call computes its value from the sizes and hands it to the launch,
the kernel is multilinear in the sizes and the terms together, and the template is checked at
sizes on both sides of where the term's arguments cross. One graph serves every n, under strict.
"""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.utils._sympy.functions import Max, Min

from spyre_inductor.compiler import backend
from spyre_inductor.compiler.symbolic.exact import Template, _bends, _far_points

SPYRE = torch.device("spyre", 0)
WINDOW = 8
# across the bend at n = WINDOW: first above it (the compile), then below, at, and far above
LENGTHS = (12, 5, 8, 9, 3, 40, 7)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The kernels compiled into artifacts, in order, in a fresh artifact root; strict."""
    from spyre_inductor.compiler.inductor import scheduling

    planned = []
    compile_kernel = backend.compile_kernel

    def counting(kernel, root, **kw):
        planned.append(kernel)
        return compile_kernel(kernel, root, **kw)

    monkeypatch.setattr(backend, "compile_kernel", counting)
    monkeypatch.setattr(scheduling, "artifact_root", lambda: tmp_path)
    monkeypatch.setenv("SPYRE_STRICT", "1")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield planned


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def sliding_mask(k):
    """transformers' sliding-window mask for the last 4 queries over a cache of n = len(k): the
    kv positions kept are kv_offset + arange(WINDOW), kv_offset = max(n - WINDOW + 1, 0)
    (Dynamo turns max over sizes into Max), each query sees the WINDOW positions up to itself."""
    n = k.shape[0]
    kv_offset = max(n - WINDOW + 1, 0)
    kv = kv_offset + torch.arange(WINDOW, device=k.device)
    q = n - 1 - torch.arange(4, device=k.device)
    keep = (kv[None, :] <= q[:, None]) & (kv[None, :] > q[:, None] - WINDOW)
    return torch.where(keep, k[0, 0] * 0 + 1.0, -1e4)


def window_of(k):
    """The last WINDOW rows of k, from a clamped offset (torch.clamp(n - w, min=0)'s form)."""
    start = max(k.shape[0] - WINDOW, 0)
    return k[start:] * 2 + 1


def masked_softmax(k):
    """A softmax over the sliding-window mask: the size term inside a reduction whose result is
    written over the reduced dim (the attention weights transformers' eager path computes)."""
    return torch.softmax(sliding_mask(k) * 0.5, dim=-1)


@pytest.mark.parametrize("fn", [sliding_mask, window_of, masked_softmax], ids=["mask", "slice", "softmax"])
def test_a_clamped_size_offset_is_served_on_both_sides_of_its_bend_in_one_graph(counted, fn):
    compiled = torch.compile(fn)
    for k, n in enumerate(LENGTHS):
        x = torch.randn(n, 32)
        xs = x.to(SPYRE)
        if k == 0:
            torch._dynamo.mark_dynamic(xs, 0)
        out = compiled(xs).cpu()
        torch.testing.assert_close(out, fn(x), rtol=1e-6, atol=1e-6)
    assert _graphs() == 1
    assert counted  # compiled for the card, under strict (no CPU kernel)
    # one artifact per value of (n, the term): the kernels made at launch at the other values
    assert len({k.name for k in counted}) > 1


def test_the_template_is_checked_on_both_sides_of_a_terms_bend():
    n = sympy.Symbol("s0", integer=True, positive=True)
    term = Max(0, n - 7)
    assert _bends(term, n, {}) == {6, 7, 8, 9}
    template = Template(base=(12, 5), step=(1, 1), terms=())
    points = _far_points(template, [n, term], [(2, None), (0, None)])
    # the term takes its value at the sizes of each point, never one chosen apart from them
    assert all(t == max(0, v - 7) for v, t in points)
    assert {v for v, _ in points if v <= 7} and {v for v, _ in points if v > 7}
    assert {6, 7, 8, 9} <= {v for v, _ in points}


def test_a_bend_in_a_second_size_is_found_with_the_others_at_their_base():
    n, w = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    assert _bends(Min(n, Max(0, n - w)), n, {w: 16}) == {15, 16, 17, 18}


def test_a_symbolic_stride_of_a_one_element_dim_does_not_keep_a_kernel_off_the_card(counted):
    # A sliding cache keeps a view of its last rows (keys[:, :, -7:]): after a call at another
    # length Dynamo makes its strides sizes of their own; the batch dim's, of one element, is
    # never stepped along.
    fn = lambda k, new: torch.cat([k, new], dim=2) * 2  # noqa: E731
    # (a view of 2 of 3 heads: the batch stride is no multiple of the others, a size of its own)
    compiled = torch.compile(fn)
    for total in (10, 12, 9, 20):
        full = torch.randn(1, 3, total, 16)
        k, new = full[:, 1:, -7:], torch.randn(1, 2, 1, 16)
        out = compiled(full.to(SPYRE)[:, 1:, -7:], new.to(SPYRE)).cpu()
        torch.testing.assert_close(out, fn(k, new))
    assert counted


def test_a_size_takes_its_own_value_when_its_square_is_a_term_of_its_own():
    """T5's attention scores (heads, s, s) at a second length: the stride s**2 is not multilinear
    in s, so s**2 is specialized per value as a size of its own (capture.size_terms, as a Min/Max
    of sizes is; tests/compiler/test_piecewise_index.py runs T5 at two lengths). The template's
    corners step s**2 apart from s, where sympy's subs would read s**2 = 145 as s = sqrt(145)."""
    from spyre_inductor.compiler.inductor import indexing
    from spyre_inductor.compiler.symbolic.exact import exact_values

    s = sympy.Symbol("s0", integer=True, positive=True)
    with exact_values({s: 12, s**2: 145}):
        assert indexing.static_int(s, "a loop range") == 12
        assert indexing.static_int(s**2, "a stride") == 145
        assert indexing.specialized(3 * s**2 + 2 * s, "an index") == 3 * 145 + 24
