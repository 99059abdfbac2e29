"""Index values with Min, Max and Abs of several loop variables compile to spyre programs (issue 31).

Inductor folds integer arithmetic on iotas into one sympy index value: T5's relative position
bucket ``-torch.min(j - i, 0)`` arrives as ``-Min(0, -i0 + i1)``, a bidirectional bucket's
``abs(j - i)`` as ``Abs(i0 - i1)``, a clamp as ``Max(lo, Min(hi, ...))``. Each bend runs along a
diagonal, across two loop variables, so it is neither an affine Index nor a load's piecewise runs
along one variable. Capture computes it as eager does (inductor/index_bends.py): the affine
parts iotas, each bend one sfp op over them (minimum, maximum, abs), times its integer
coefficient. A gather whose index is computed through floats (the bucket's ``log``) reads a
realized index buffer (inductor/index_probe.py, lowerings.py), as gathers do. Everything here
runs under SPYRE_STRICT=1: a CPU fallback fails.
"""

from __future__ import annotations

import copy
import math

import pytest
import sympy
import torch

from inductor_helpers import compile_on_spyre
from spyre_inductor.compiler.inductor import index_bends
from spyre_inductor.compiler.ir.errors import NotCapturable
from spyre_inductor.compiler.ir.kernel_ir import IndexValue, Indirect, Load, Op
from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.device.fallback import strict_mode


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _positions(x):
    """(i as a column, j as a row): the query and key positions of a (q, k) score matrix."""
    q, k = x.shape[-2:]
    return torch.arange(q, device=x.device)[:, None], torch.arange(k, device=x.device)[None, :]


def _run(fn, *args):
    """fn compiled on spyre, every kernel a program: (outputs, records), each output equal to
    eager's on the CPU (integers exactly, fp32 within one rounding of the fp32 answer)."""
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    assert not warned
    want = fn(*args)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    for got, ref in zip(out, want, strict=True):
        assert got.device.type == "spyre"
        tol = dict(rtol=0, atol=0) if not ref.is_floating_point() else dict(rtol=0, atol=1e-5 * ref.abs().max().item())
        torch.testing.assert_close(got.cpu(), ref, **tol)
    assert records and all(r.artifact is not None for r in records)
    return out, records


def _ops(record) -> set[str]:
    return {v.name for v in record.kernel.values if isinstance(v, Op)}


# ---- the bends, one at a time -------------------------------------------------------------


def test_minimum_of_a_relative_position_and_zero():
    def fn(x):
        i, j = _positions(x)
        return x + torch.minimum(j - i, torch.zeros((), dtype=torch.long, device=x.device))

    _, (record,) = _run(fn, _rand(40, 70))
    # the diagonal j - i an iota of strides (-1, 1), its bend one sfp minimum: no load at all
    assert "minimum" in _ops(record)
    assert any(isinstance(v, IndexValue) and v.index.strides == (-1, 1) for v in record.kernel.values)


def test_negated_minimum_is_t5s_unidirectional_distance():
    def fn(x):
        i, j = _positions(x)
        return -torch.min(j - i, torch.zeros_like(j - i))

    (out,), (record,) = _run(fn, _rand(33, 33))
    assert {"minimum", "neg"} <= _ops(record)
    assert out.dtype == torch.int64


def test_abs_of_a_relative_position():
    def fn(x):
        i, j = _positions(x)
        return torch.abs(j - i), x * torch.abs(i - 2 * j).float()

    _, records = _run(fn, _rand(24, 50))
    assert all("abs" in _ops(r) for r in records)


@pytest.mark.parametrize("lo, hi", [(-3, 5), (0, 7), (-8, 0)])
def test_clamp_of_a_relative_position(lo, hi):
    def fn(x):
        i, j = _positions(x)
        return (j - i).clamp(lo, hi) + 3 * torch.maximum(i - j, torch.full_like(i - j, lo))

    _, (record,) = _run(fn, _rand(20, 36))
    assert {"minimum", "maximum"} <= _ops(record)


def test_maximum_with_a_coefficient_and_an_int32_value():
    def fn(x):
        i, j = _positions(x)
        return (x + 2 * torch.maximum(i - j, j - 2 * i).to(torch.int32).float(),
                (torch.maximum(i, j) - 5).to(torch.int32))

    _run(fn, _rand(16, 48))


def test_a_bend_over_three_loop_variables():
    def fn(x):
        b = torch.arange(x.shape[0], device=x.device)[:, None, None]
        i = torch.arange(x.shape[1], device=x.device)[None, :, None]
        j = torch.arange(x.shape[2], device=x.device)[None, None, :]
        return x + torch.minimum(b + i - j, torch.abs(j - 2 * b)).float()

    _run(fn, _rand(3, 10, 40))


def test_a_product_of_two_bends_is_refused_by_name():
    i, j = sympy.symbols("i0 i1", integer=True)
    with pytest.raises(NotCapturable, match=r"not an integer times one Min, Max or Abs"):
        index_bends.split(sympy.Min(0, j - i) * sympy.Max(0, i - j), "the index value")
    rest, bends = index_bends.split(3 + i - 2 * sympy.Min(0, j - i) + sympy.Abs(i - j), "v")
    assert rest == 3 + i
    assert sorted((b.coef, b.op) for b in bends) == [(-2, "minimum"), (1, "abs")]


# ---- T5's relative position bucket (the formula, not the model) ----------------------------


def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """transformers' T5Attention._relative_position_bucket, copied as a plain function."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_is_computed_on_chip(bidirectional):
    def fn(x):
        i, j = _positions(x)
        return t5_bucket(j - i, bidirectional, num_buckets=32, max_distance=128)

    (out,), (record,) = _run(fn, _rand(150, 150))  # distances past max_distance: the last bucket
    assert "log" in _ops(record)
    assert int(out.max()) == (31 if not bidirectional else 31) and int(out.min()) == 0


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_position_bias_gathers_from_a_bucket_buffer(bidirectional):
    """compute_bias: the bucket through floats is its own program, the embedding a gather of its
    rows, permuted to (heads, q, k) and added to scores."""
    def fn(scores, table):
        i, j = _positions(scores)
        bias = torch.nn.functional.embedding(t5_bucket(j - i, bidirectional, 8, 32), table)
        return scores + bias.permute(2, 0, 1)

    _, records = _run(fn, _rand(4, 40, 40), _rand(8, 4, seed=1))
    bucket, = [r for r in records if "log" in _ops(r)]
    assert not any(isinstance(v, (Load, Indirect)) for v in bucket.kernel.values)  # from the indices alone
    assert any(isinstance(v, Indirect) for r in records for v in r.kernel.values)  # the rows: a gather


def test_an_embedding_of_arange_positions_stays_a_direct_load():
    """Integer arithmetic on the loop indices is no gather: the realization above is only for
    indices computed otherwise (GPT-2's position embedding keeps its one plain load)."""
    fn = lambda x, table: x + torch.nn.functional.embedding(torch.arange(x.shape[0], device=x.device) + 2, table)  # noqa: E731
    _, (record,) = _run(fn, _rand(20, 64), _rand(30, 64, seed=1))
    assert not any(isinstance(v, Indirect) for v in record.kernel.values)


def test_an_embedding_of_positions_computed_from_data_reads_them_from_memory():
    """RoBERTa's create_position_ids_from_input_ids: positions from a cumsum of the non-padding
    mask. The index reads data: it is never run through the probe (its loader may not index a
    buffer whose layout Inductor has not fixed yet) and is realized, as gathers' indices are."""
    def fn(ids, table):
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        return torch.nn.functional.embedding(positions, table)

    ids = torch.randint(0, 4, (2, 24), generator=torch.Generator().manual_seed(0))
    _run(fn, ids, _rand(32, 64, seed=1))


def test_the_bucket_at_another_size_stays_on_chip():
    """PyTorch recompiles a graph called at a second size with symbolic sizes: the bucket and
    its gather become programs over a size symbol, which serve a third size too (square, as T5's
    self-attention bias is, and not)."""
    def fn(x, table):
        i, j = _positions(x)
        return x[..., None] + torch.nn.functional.embedding(t5_bucket(j - i, True, 8, 32), table)

    table = _rand(8, 4, seed=1)
    for sizes in ([(40, 48), (56, 64), (24, 30)], [(40, 40), (56, 56), (24, 24)]):
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        for n, (q, k) in enumerate(sizes):
            x = _rand(q, k, seed=q)
            with strict_mode(True), torch._inductor.config.patch(force_disable_caches=True), \
                    record_kernels() as records:
                got = compiled(x.to("spyre"), table.to("spyre")).cpu()
            torch.testing.assert_close(got, fn(x, table), rtol=0, atol=1e-6)
            if n == 1:  # the recompile: every kernel a program over a size symbol
                assert len(records) == 2
                assert all(r.artifact is not None and r.kernel.symbolic is not None for r in records)


# ---- transformers' own T5 ---------------------------------------------------------------------


def _t5_logits(compiled, model, input_ids, decoder_input_ids):
    with torch.no_grad():
        ref = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
        with strict_mode(True), torch._inductor.config.patch(force_disable_caches=True):
            out = compiled(input_ids=input_ids.to("spyre"), decoder_input_ids=decoder_input_ids.to("spyre")).logits
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_t5_for_conditional_generation_compiles_strict():
    """transformers' own encoder-decoder (tiny config, random weights), compiled under strict:
    its relative position buckets on chip, logits as the fp32 CPU model's."""
    from spyre_inductor.testing import hf_models

    model, inputs = hf_models.build("t5")
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model).to("spyre"))
    _t5_logits(compiled, model, inputs["input_ids"], inputs["decoder_input_ids"])


@pytest.mark.slow
def test_t5_at_a_second_sequence_length_stays_on_chip():
    from spyre_inductor.testing import hf_models

    model, _ = hf_models.build("t5")
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model).to("spyre"))
    for seq, decoder_seq in ((16, 8), (24, 12)):
        g = torch.Generator().manual_seed(seq)
        _t5_logits(compiled, model, torch.randint(3, 256, (1, seq), generator=g),
                   torch.randint(3, 256, (1, decoder_seq), generator=g))
