"""Values computed from the loop indices, and masks on them, compile to spyre programs (issue 16).

``arange``, causal and padding masks are index values computed on chip (an
``iota`` and a compare); a cat, a pad, a rotary embedding's ``rotate_half``
arrive as one kernel whose masks pick each element's source, and the planner
cuts the iteration space where the masks change (families/pointwise/pieces.py): each
piece is a plain copy or fill, and the pieces run one after another in ONE
program. Everything here runs under SPYRE_STRICT=1: a CPU fallback fails.
"""

from __future__ import annotations

import json

import pytest
import torch

from inductor_helpers import SPYRE, compile_on_spyre
from spyre_inductor.compiler.ir.errors import Unsupported
from spyre_inductor.compiler.ir.kernel_ir import Buffer, Constant, Index, IndexValue, Kernel, Load, Op, Store
from spyre_inductor.compiler.core.bounds import check_bounds
from spyre_inductor.compiler.families.pointwise import pieces

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _rand(*shape, dtype=torch.float32, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def _run(fn, *args):
    """fn compiled on spyre: (outputs, records), each output equal to eager's on the CPU (moves
    and selects are exact; the fused arithmetic below is on fp32 values only)."""
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    assert not warned
    want = fn(*args)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    out = tuple(out[0]) if len(out) == 1 and isinstance(out[0], (tuple, list)) else out
    for got, ref in zip(out, want, strict=True):
        assert got.device.type == "spyre"
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
    assert records and all(r.artifact is not None for r in records)
    return out, records


def _plan(record) -> dict:
    return json.loads((record.artifact / "plan.json").read_text())


def _one_report(fn, *cpu_args):
    """(output, the report of its one program) of a warm compiled call of fn on spyre copies."""
    args = [a.to("spyre") for a in cpu_args]
    torch._dynamo.reset()
    compiled = torch.compile(fn)
    compiled(*args)
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    out = compiled(*args)
    torch.spyre.synchronize()
    (report,) = torch.spyre.kernel_reports()
    return out, report


# ---- index values on chip ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
def test_arange_is_computed_on_chip(dtype):
    fn = lambda x: x + torch.arange(3, 3 + 2 * x.shape[1], 2, dtype=dtype, device=x.device)  # noqa: E731
    x = _rand(8, 70).to(dtype) if dtype.is_floating_point else torch.randint(-5, 5, (8, 70), dtype=dtype)
    _, (record,) = _run(fn, x)
    steps = [s for p in _plan(record)["tile_kernel"]["phases"] for s in p["steps"]]
    assert any(s["kind"] == "iota" for s in steps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("diagonal", [0, 1, -2])
def test_tril_and_triu(dtype, diagonal):
    x = _rand(67, 130, dtype=dtype)
    _run(lambda a: (torch.tril(a, diagonal), torch.triu(a, diagonal)), x)


def test_causal_mask_fill_from_indices():
    def fn(scores):
        n = scores.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~keep, float("-inf"))

    _run(fn, _rand(2, 4, 64, 64))


def test_where_over_an_index_range():
    fn = lambda x: torch.where(torch.arange(x.shape[1], device=x.device) < 10, x, -x)  # noqa: E731
    _run(fn, _rand(16, 100))


def test_full_zeros_ones_and_python_scalars_inside_graphs():
    def fn(x):
        return (x * torch.ones_like(x) + torch.full((x.shape[0], 1), 2.5, device=x.device) - 3,
                torch.zeros(5, 7, device=x.device) + 1.25, torch.full_like(x, 7, dtype=torch.int32))

    _run(fn, _rand(9, 33))


# ---- masks that cut: one program writing each part ---------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_is_one_program_writing_each_part(dtype, dim):
    parts = [_rand(8, 30, dtype=dtype, seed=1), _rand(8, 30, dtype=dtype, seed=2), _rand(8, 30, dtype=dtype, seed=3)]
    if dim != 0:
        parts[1] = _rand(8, 35, dtype=dtype, seed=4)  # not a whole number of sticks: unaligned parts
    _, (record,) = _run(lambda a, b, c: torch.cat([a, b, c], dim), *parts)
    plan = _plan(record)
    assert len(plan["pieces"]["boxes"]) == 3, plan["pieces"]


def test_stack_and_cat_of_computed_parts():
    _run(lambda a, b: (torch.stack([a, b]), torch.cat([a * 2, b.exp()], 1)), _rand(6, 64), _rand(6, 64, seed=1))


@pytest.mark.parametrize("pad", [(2, 3), (-2, 3), (1, -1, 2, 0), (0, 0, -1, -1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_constant_pad_nd_including_negative_pads(pad, dtype):
    _run(lambda a: torch.nn.functional.pad(a, pad, value=-1.5), _rand(9, 60, dtype=dtype))


def test_split_chunk_unbind_and_unaligned_slices():
    def fn(x):
        a, b, c = x.split([7, 50, 7], 1)
        d, e = x.chunk(2, 0)
        rows = x.unbind(0)
        return a * 2, b + 1, c.neg(), d - e, rows[3] * rows[4], x[:, 3:41] + x[:, 20:58]

    _run(fn, _rand(10, 64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_embedding_rotate_half(dtype):
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def rope(q, cos, sin):
        return q * cos + rotate_half(q) * sin

    q = _rand(1, 4, 16, 128, dtype=dtype)
    cos, sin = _rand(16, 128, dtype=dtype, seed=1), _rand(16, 128, dtype=dtype, seed=2)
    out, _, records, warned, _ = compile_on_spyre(rope, q, cos, sin)
    assert not warned and len(records) == 1 and records[0].artifact is not None
    ref = rope(q.float(), cos.float(), sin.float())
    # fp32 arithmetic on chip, rounded once: within one rounding of the fp32 answer
    tol = {torch.float32: 1e-6, torch.float16: 2 ** -10}[dtype]
    torch.testing.assert_close(out[0].cpu().float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_a_cat_of_two_computed_halves_returned_is_two_programs_not_overlapping_outputs():
    """gpt-oss's rotary: cat((first_, second_), -1) whose result is not read pointwise. Inductor
    computes each half into its slice of the cat (ConcatKernel); fused, one launch would write two
    interleaved views of one buffer, which the launch refuses, so each half is its own program."""
    def rotary(x, cos, sin):
        a, b = torch.chunk(x, 2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def attention_input(q, w, cos, sin):  # q after its projection, split into heads
        return rotary((q @ w).view(1, 6, 4, 16).transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))

    args = _rand(1, 6, 32), _rand(32, 64, seed=3), _rand(1, 6, 8, seed=1), _rand(1, 6, 8, seed=2)
    out, _, records, warned, _ = compile_on_spyre(attention_input, *args)
    assert not warned and all(r.artifact is not None for r in records)
    torch.testing.assert_close(out[0].cpu(), attention_input(*args), rtol=1e-6, atol=1e-5)


# ---- the pass alone, on hand-written IR ---------------------------------------------------


def _cat_kernel():
    """out[i, j] = where(j < 64, a[i, j], b[i, j - 64]) over (8, 96): Inductor's pointwise cat."""
    bufs = (Buffer("a", "fp32", (8, 64), (64, 1)), Buffer("b", "fp32", (8, 32), (32, 1)),
            Buffer("out", "fp32", (8, 96), (96, 1)))
    values = (IndexValue(Index((0, 1)), "int64"), Constant(64, "int64"), Op("lt", (0, 1), "bool"),
              Load("a", Index((64, 1)), "fp32"), Load("b", Index((32, 1), -64), "fp32"),
              Op("where", (2, 3, 4), "fp32"))
    return Kernel.of("cat", (8, 96), bufs, values, (Store("out", Index((96, 1)), 5),))


def test_cut_points_are_where_the_masks_change():
    assert pieces.cut_points(_cat_kernel()) == ((), (64,))


def test_each_piece_is_a_plain_copy_of_one_source():
    first, second = pieces.split(_cat_kernel())
    assert (first.starts, first.counts, second.starts, second.counts) == ((0, 0), (8, 64), (0, 64), (8, 32))
    for piece, buffer in ((first, "a"), (second, "b")):
        (load,) = [v for v in piece.kernel.values if isinstance(v, Load)]
        assert load.buffer == buffer and not any(isinstance(v, (Op, IndexValue)) for v in piece.kernel.values)
        check_bounds(piece.kernel)
    assert [v for v in second.kernel.values if isinstance(v, Load)][0].index.offset == 0  # b[i, j - 64] at j = 64


def _split_rotary_kernel():
    """transformers' rotate_half as Inductor hands it over when it splits the head dim 16 into
    (2, 8): out[h, i, j] = where(8*i + j < 8, -x[h, i, j + 8], x[h, i, j - 8]) over (4, 2, 8). The
    compare reads two dims, but every slab i = const decides it."""
    bufs = (Buffer("x", "fp32", (4, 16), (16, 1)), Buffer("out", "fp32", (4, 16), (16, 1)))
    values = (IndexValue(Index((0, 8, 1)), "int64"), Constant(8, "int64"), Op("lt", (0, 1), "bool"),
              Load("x", Index((16, 8, 1), 8), "fp32"), Op("neg", (3,), "fp32"),
              Load("x", Index((16, 8, 1), -8), "fp32"), Op("where", (2, 4, 5), "fp32"))
    return Kernel.of("rot", (4, 2, 8), bufs, values, (Store("out", Index((16, 8, 1)), 6),))


def test_a_compare_over_two_dims_cuts_along_the_dim_that_decides_it():
    kernel = _split_rotary_kernel()
    with pytest.raises(Unsupported, match=r"'x' reaches elements \[8, 71\] of a buffer of 64"):
        check_bounds(kernel)  # whole, x[.., j + 8] leaves x on the second half
    assert pieces.cut_points(kernel) == ((), (1,), ())
    first, second = pieces.split(kernel)
    assert (first.starts, first.counts, second.starts, second.counts) == ((0, 0, 0), (4, 1, 8), (0, 1, 0), (4, 1, 8))
    for piece in (first, second):
        check_bounds(piece.kernel)
        assert not any(isinstance(v, IndexValue) for v in piece.kernel.values)


@pytest.mark.parametrize("strides, constant, op, expected", [
    ((0, 8, 1), 8, "lt", ((), (1,), ())),     # decided by the middle dim alone
    ((0, -8, -1), -8, "gt", ((), (1,), ())),  # the same, with negative strides
    ((0, 8, 1), 12, "lt", ((), (), ())),      # 8*i + j < 12 is not decided by any one dim: no cut
    ((0, 8, 1), 8, "eq", ((), (), ())),       # 8*i + j == 8 is true at one element only: no cut
    ((0, 16, 0), 16, "eq", ((), (1,), ())),   # a one-dim eq decided on each slab of its own dim
])
def test_cut_points_of_compares_over_several_dims(strides, constant, op, expected):
    bufs = (Buffer("x", "fp32", (4, 16), (16, 1)), Buffer("out", "fp32", (4, 16), (16, 1)))
    values = (IndexValue(Index(strides), "int64"), Constant(constant, "int64"), Op(op, (0, 1), "bool"),
              Load("x", Index((16, 8, 1)), "fp32"), Constant(0.0, "fp32"), Op("where", (2, 3, 4), "fp32"))
    kernel = Kernel.of("cmp", (4, 2, 8), bufs, values, (Store("out", Index((16, 8, 1)), 5),))
    assert pieces.cut_points(kernel) == expected


def test_transformers_rotary_embedding_compiles_to_spyre_programs_under_strict(monkeypatch):
    # Llama, Mistral, Qwen, Gemma, Granite and Phi-3 share this code; before the cut above every
    # one of them was refused here under strict
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    monkeypatch.setenv("SPYRE_STRICT", "1")
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128)
    rope = LlamaRotaryEmbedding(cfg)

    def fn(q, k, positions):
        cos, sin = rope(q, positions)
        return apply_rotary_pos_emb(q, k, cos, sin)

    q, k, positions = _rand(1, 4, 16, 16), _rand(1, 2, 16, 16, seed=1), torch.arange(3, 19)[None]
    ref = fn(q, k, positions)
    rope.to(SPYRE)
    out, _, records, warned, _ = compile_on_spyre(fn, q, k, positions)
    assert not warned and records and all(r.artifact is not None for r in records)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-6, atol=1e-6 * r.abs().max().item())


def test_a_masked_load_that_no_cut_keeps_in_bounds_is_refused():
    # where(j <= i, a[i, j - 1], 0): the mask is a triangle (no one-dim cut), and at j = 0 the load
    # would read before a's first element: refused, never run
    bufs = (Buffer("a", "fp32", (8, 8), (8, 1)), Buffer("out", "fp32", (8, 8), (8, 1)))
    values = (IndexValue(Index((-1, 1)), "int64"), Constant(0, "int64"), Op("le", (0, 1), "bool"),
              Load("a", Index((8, 1), -1), "fp32"), Constant(0.0, "fp32"), Op("where", (2, 3, 4), "fp32"))
    kernel = Kernel.of("tri", (8, 8), bufs, values, (Store("out", Index((8, 1)), 5),))
    assert pieces.split(kernel) is None
    with pytest.raises(Unsupported, match=r"'a' reaches elements \[-1, 62\] of a buffer of 64"):
        check_bounds(kernel)


# ---- index values inside reductions -----------------------------------------------------


def _causal_softmax(scores):
    n, m = scores.shape[-2:]
    keep = torch.ones(n, m, dtype=torch.bool, device=scores.device).tril()
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)


@pytest.mark.parametrize("shape", [(64, 64), (2, 96, 96), (8, 4000)])
def test_causal_softmax_is_one_reduction_program(shape):
    x = _rand(*shape)
    out, _, records, warned, _ = compile_on_spyre(_causal_softmax, x)
    assert not warned and len(records) == 1 and records[0].artifact is not None
    torch.testing.assert_close(out[0].cpu(), _causal_softmax(x), rtol=1e-5, atol=1e-6)


def test_reductions_of_index_values_along_and_across_the_reduced_dim():
    def fn(x):
        n = x.shape[1]
        weights = torch.arange(n, device=x.device, dtype=torch.float32)
        rows = torch.arange(x.shape[0], device=x.device, dtype=torch.float32)[:, None]
        return (x * weights).sum(1), (x + rows).sum(0), torch.arange(n, device=x.device).sum(), (x - weights).amax(1)

    x = _rand(33, 70)
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    assert not warned and all(r.artifact is not None for r in records)
    for got, want in zip(out, fn(x)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)


# ---- loops split where modular indexing needs it (repeat, expand + reshape) ------------------


@pytest.mark.parametrize("fn", [
    lambda a: a.repeat(2, 3),
    lambda a: a.repeat(3, 1, 2)[..., :40] + 1,
    lambda a: torch.tile(a, (2, 1)),
    lambda a: (a.t() + 1).reshape(-1) * 2,
    lambda a: a.repeat_interleave(2, dim=1),
    lambda a: a.repeat(1, 2).amax(1),
], ids=["repeat", "repeat-3d", "tile", "reshape-of-transpose", "repeat_interleave", "max-of-repeat"])
def test_repeat_and_reshapes_split_the_loops(fn):
    _run(fn, _rand(8, 64))


def test_grouped_kv_heads_expanded_and_reshaped():
    # what a GQA model does to its KV heads before attention: expand then reshape (a copy)
    fn = lambda k: k[:, :, None].expand(1, 2, 4, 16, 64).reshape(1, 8, 16, 64) * 1.0  # noqa: E731
    _run(fn, _rand(1, 2, 16, 64))


@pytest.mark.parametrize("mode", ["replicate", "reflect", "circular"])
def test_pads_whose_index_clamps_or_reflects_are_pieces(mode):
    # Inductor indexes these with Min/Max/Abs (or a modulo) of one loop variable: affine runs,
    # turned into index masks and cut (no element is read twice or from outside x)
    x = _rand(2, 8, 64)
    _, (record,) = _run(lambda a: torch.nn.functional.pad(a, (2, 3), mode=mode), x)
    assert len(_plan(record)["pieces"]["boxes"]) >= 3


def test_eye_and_index_values_in_narrow_integer_types():
    _run(lambda x: x + torch.eye(16, device=x.device), _rand(16, 16))


@pytest.mark.parametrize("shifts,dims", [(3, 1), (-5, 1), ((2, -1), (0, 1)), (7, None)])
def test_roll_is_two_copies_not_a_gather(shifts, dims):
    # the reference decomposition indexes with (arange + s) % n: computed from the loop indices,
    # so capture keeps it a direct (piecewise) index instead of a gather
    x = _rand(8, 64)
    fn = (lambda a: torch.roll(a, shifts)) if dims is None else (lambda a: torch.roll(a, shifts, dims))
    _, records = _run(fn, x)
    assert all("pieces" in _plan(r) for r in records)


def test_flip():
    _run(lambda a: (torch.flip(a, [1]), torch.flip(a, [0]), torch.flip(a, [0, 1])), _rand(8, 64))
    # every dim walked backwards by the load and forwards by the store: loops around one-row tiles
    _run(lambda a: torch.flip(a, [0]), torch.randint(-2, 3, (3, 1), dtype=torch.int32))
    _run(lambda a: torch.flip(a, [0]), _rand(300))


def test_rotary_reads_each_element_once():
    # the two halves of rotate_half are pieces of one shape, stacked so their loads are shared;
    # the cos/sin tables (broadcast over heads) get the rows along the heads, loaded once per tile
    def rope(q, cos, sin):
        return q * cos + torch.cat((-q[..., 64:], q[..., :64]), dim=-1) * sin

    q, cos, sin = _rand(1, 8, 64, 128), _rand(64, 128, seed=1), _rand(64, 128, seed=2)
    out, report = _one_report(rope, q, cos, sin)
    assert report.refetch == pytest.approx(1.0)
    torch.testing.assert_close(out.cpu(), rope(q, cos, sin), rtol=1e-6, atol=1e-6)


# ---- review regressions and the pass's structure ------------------------------------------


@pytest.mark.parametrize("op", ["&", "|", "^"])
def test_bitwise_ops_on_a_piece_constant_are_arithmetic(op):
    # a pad border is a constant in its piece; 6 & 3 is 2, not True (it folded as logic)
    fn = eval(f"lambda a: torch.nn.functional.pad(a, (2, 2), value=6) {op} 3")  # noqa: S307
    _run(fn, torch.arange(32, dtype=torch.int32).reshape(4, 8))
    fn = eval(f"lambda a: torch.nn.functional.pad(a, (1, 1), value=12) {op} 10")  # noqa: S307
    _run(fn, torch.arange(16, dtype=torch.uint8).reshape(2, 8))


def test_pieces_minimum_is_the_union_of_what_they_read():
    # a replicate pad reads its border elements in several pieces: each counts once
    x = _rand(2, 8, 64)
    fn = lambda a: torch.nn.functional.pad(a, (2, 3), mode="replicate")  # noqa: E731
    _, report = _one_report(fn, x)
    assert report.minimum_read_bytes == x.numel() * 4
    assert report.minimum_bytes == x.numel() * 4 + 2 * 8 * 69 * 4


def test_pieces_run_in_sequence_with_renamed_queues_and_a_handoff():
    from spyre_inductor.compiler.backend import plan_kernel
    from spyre_runtime.program.isa import Fence, Pop, Push

    kernel = _cat_kernel()
    program = plan_kernel(kernel, cores=2).program
    names = [q.name for q in program.queues]
    assert len(names) == len(set(names)) and all(n.startswith(("p0.", "p1.")) for n in names)
    for cp in program.cores:
        ls, sfp = cp.unit("ls"), cp.unit("sfp")
        handoff = [i for i, ins in enumerate(ls) if isinstance(ins, Push) and ins.queue.startswith("p1.next")]
        assert len(handoff) == 1 and isinstance(ls[handoff[0] - 1], Fence)
        # the sfp takes the token before any of piece 1's work
        first_p1 = next(i for i, ins in enumerate(sfp) if isinstance(ins, (Push, Pop)) and ins.queue.startswith("p1."))
        assert isinstance(sfp[first_p1], Pop) and sfp[first_p1].queue.startswith("p1.next")


def test_a_masked_load_inside_a_reduction_is_refused_by_name():
    bufs = (Buffer("a", "fp32", (8, 8), (8, 1)), Buffer("out", "fp32", (8,), (1,)))
    # sum over j of where(j >= 1, a[i, j - 1], 0): a pad fused into a reduction
    values = (IndexValue(Index((0, 1)), "int64"), Constant(1, "int64"), Op("ge", (0, 1), "bool"),
              Load("a", Index((8, 1), -1), "fp32"), Constant(0.0, "fp32"), Op("where", (2, 3, 4), "fp32"),
              )
    from spyre_inductor.compiler.backend import plan_kernel
    from spyre_inductor.compiler.ir.kernel_ir import Reduction

    kernel = Kernel.of("padsum", (8,), bufs, values + (Reduction("sum", 5, "fp32"),),
                       (Store("out", Index((1, 0)), 6),), (8,))
    with pytest.raises(Unsupported, match="a reduction's masks are not cut into pieces"):
        plan_kernel(kernel)


@pytest.mark.parametrize("shape", [(2, 70000), (1, 300000)])
def test_causal_style_masks_in_chunked_and_ring_reductions(shape):
    # too long for resident rows: chunked (2 rows) and ring (1 row over the cores) plans
    def fn(x):
        keep = torch.arange(x.shape[-1], device=x.device) <= torch.arange(x.shape[0], device=x.device)[:, None] * 5000 + 7
        return torch.softmax(x.masked_fill(~keep, float("-inf")), -1)

    x = _rand(*shape)
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    assert not warned and all(r.artifact is not None for r in records)
    plan = _plan(records[-1])
    assert "resident" not in json.dumps(plan["tile_kernel"]["notes"])
    torch.testing.assert_close(out[0].cpu(), fn(x), rtol=1e-5, atol=1e-7)


def test_an_index_from_the_loop_indices_wraps_negative_values():
    # x[:, arange(n) - n]: every index negative, wrapped as eager does: the identity, no gather
    fn = lambda a: a[:, torch.arange(a.shape[1], device=a.device) - a.shape[1]] * 2  # noqa: E731
    _, records = _run(fn, _rand(4, 64))
    assert all(r.kernel.__class__.__name__ != "IndirectKernel" for r in records)


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.nn.functional.layer_norm(torch.cat([a, b], -1), (a.shape[-1] + b.shape[-1],)),
    lambda a, b: torch.nn.functional.pad(a, (1, 1)).sum(-1) + b.sum(-1),
], ids=["layer_norm-of-cat", "sum-of-pad"])
def test_a_cat_or_pad_feeding_a_reduction_is_its_own_program(fn):
    # realized on spyre: a node the scheduler keeps apart from the reduction (not cut at masks)
    a, b = _rand(8, 64), _rand(8, 32, seed=1)
    out, _, records, warned, _ = compile_on_spyre(fn, a, b)
    assert not warned and len(records) >= 2 and all(r.artifact is not None for r in records)
    torch.testing.assert_close(out[0].cpu(), fn(a, b), rtol=1e-5, atol=1e-5)


def test_an_operand_broadcast_over_rows_is_read_once_when_its_row_is_chunked():
    # x (1, 32, 256, 128) * t (256, 128): the seq and head dims merge into one long stick dim,
    # chunked; blocks of head rows share each chunk of t instead of reloading it per head
    fn = lambda a, t: a * t  # noqa: E731
    x, t = _rand(1, 32, 256, 128, dtype=torch.float16), _rand(256, 128, dtype=torch.float16, seed=1)
    out, report = _one_report(fn, x, t)
    assert report.refetch == pytest.approx(1.0)
    torch.testing.assert_close(out.cpu(), fn(x.float(), t.float()).half(), rtol=0, atol=0)


def test_a_position_offset_by_a_cache_length_is_a_load_at_every_length(monkeypatch):
    # GPT-2 called with past_key_values computes its positions as past_length + arange(new), and
    # Inductor folds the embedding's index into that expression: a direct load at a symbolic
    # offset, not a gather (it was refused: "bounds check of s40 against 128")
    monkeypatch.setenv("SPYRE_STRICT", "1")
    table = _rand(16, 64)

    def positions(past, table):
        pos = torch.arange(2, device=past.device) + past.shape[1]
        return torch.nn.functional.embedding(pos, table) * 2

    torch._dynamo.reset()
    compiled = torch.compile(positions)
    spyre_table = table.to(SPYRE)
    for n in (3, 5, 9, 14):  # the second length recompiles with a symbolic size
        past = torch.zeros(1, n)
        assert torch.equal(compiled(past.to(SPYRE), spyre_table).cpu(), positions(past, table))
    with pytest.raises(RuntimeError, match="reaches elements .* of a buffer of 1024"):
        compiled(torch.zeros(1, 15).to(SPYRE), spyre_table)  # past the table: refused, never read
