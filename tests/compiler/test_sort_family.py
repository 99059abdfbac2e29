"""The sort family (issue 31) over hand-built kernel IR: the SortKernel, the bitonic network, its
plan and its program run on the simulated card against the CPU's stable sort."""

from __future__ import annotations

import pytest
import torch

from spyre_inductor.compiler import backend
from spyre_inductor.compiler.core.family import family_of
from spyre_inductor.compiler.families.sort.network import NetworkStep, network, padded, steps
from spyre_inductor.compiler.ir.errors import Unsupported
from spyre_inductor.compiler.ir.kernel_ir import DTYPE_NAMES, Buffer, SortKernel, kernel_from_json, sort_reference
from spyre_runtime.direct import run_program
from spyre_runtime.program.isa import CompareExchange
from spyre_runtime.program.operands import Addr, Tile

NAN = float("nan")


def sort_kernel(R, n, k, dtype=torch.float32, descending=False, source_stride=None):
    d = DTYPE_NAMES[dtype]
    return SortKernel("sort", (Buffer("source", d, (R, n), (source_stride or n, 1)),
                               Buffer("values", d, (R, k), (k, 1)),
                               Buffer("indices", "int64", (R, k), (k, 1))), descending)


def tied(R, n, dtype, seed=0):
    """Values from a set of 5 (most rows have ties); NaNs and a -0.0 in float rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (R, n), generator=g).to(dtype)
    if dtype.is_floating_point:
        x = x + torch.rand((R, n), generator=g).to(dtype).round()
        x.view(-1)[:: max(1, x.numel() // 5)] = NAN
        x.view(-1)[min(1, x.numel() - 1)] = -0.0
    return x


def test_a_sort_kernel_round_trips_through_json_and_the_sort_family_claims_it():
    kernel = sort_kernel(3, 10, 4, torch.float16, descending=True)
    again = kernel_from_json(kernel.to_json())
    assert again == kernel and isinstance(again, SortKernel)
    assert family_of(kernel).name == "sort"


def test_the_network_has_the_bitonic_steps_and_pads_to_a_power_of_two():
    assert steps(8) == ((1, 2), (2, 4), (1, 4), (4, 8), (2, 8), (1, 8))
    assert len(steps(4096)) == 12 * 13 // 2
    assert [padded(n) for n in (1, 2, 3, 64, 65, 1000)] == [1, 2, 4, 64, 128, 1024]
    with pytest.raises(ValueError, match="power of two"):
        steps(12)


def test_a_topk_network_sorts_blocks_of_k_then_halves_the_row_to_them():
    S = NetworkStep
    assert network(16, 3) == (S(1, 2, 16), S(2, 4, 16), S(1, 4, 16),      # blocks of K = 4 sorted
                              S(4, 16, 16, True), S(2, 4, 8), S(1, 4, 8),  # halved to 8, runs merged
                              S(4, 8, 8, True), S(2, 4, 4), S(1, 4, 4))    # to 4: the top 4 in order
    assert network(16, 9) == tuple(S(d, b, 16) for d, b in steps(16))     # K = N: the sort
    assert [s.cols for s in network(8, 1)] == [8, 4, 2]                    # k = 1: halvings only


@pytest.mark.parametrize("R,n,k,dtype,descending", [
    (8, 24, 24, torch.float32, True),     # padded, a sort
    (37, 100, 7, torch.float16, False),   # padded, a topk(largest=False), rows over many cores
    (5, 64, 64, torch.int64, False),      # no padding
    (3, 5, 2, torch.int32, True),         # integers padded with their minimum
    (4, 33, 33, torch.bfloat16, True),
    (6, 17, 3, torch.uint8, False),       # integers padded with their maximum
    (2, 1, 1, torch.float32, False),      # rows of one element: no step at all
    (3, 4096, 8, torch.float32, True),    # a top-k network: blocks of 8, halved 9 times
    (4, 300, 1, torch.float16, False),    # k = 1: halvings only
])
def test_the_planned_program_sorts_rows_like_the_cpu_stable_sort(R, n, k, dtype, descending):
    kernel = sort_kernel(R, n, k, dtype, descending)
    program = backend.plan_kernel(kernel).program
    x = tied(R, n, dtype)
    values = torch.empty(R, k, dtype=dtype, device="spyre")
    indices = torch.empty(R, k, dtype=torch.int64, device="spyre")
    run_program(program, source=x.to("spyre"), values=values, indices=indices)
    want_values, want_indices = sort_reference(x, k, descending)
    torch.testing.assert_close(values.cpu(), want_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices.cpu(), want_indices)


def test_rows_that_are_not_adjacent_are_read_where_they_lie():
    """A source whose rows are further apart than their length (a slice of a wider buffer)."""
    kernel = sort_kernel(4, 20, 20, source_stride=32)
    program = backend.plan_kernel(kernel).program
    wide = tied(4, 32, torch.float32, seed=3)
    values = torch.empty(4, 20, device="spyre")
    indices = torch.empty(4, 20, dtype=torch.int64, device="spyre")
    run_program(program, source=wide.to("spyre").as_strided((4, 20), (32, 1)), values=values, indices=indices)
    want_values, want_indices = sort_reference(wide[:, :20], 20, False)
    torch.testing.assert_close(values.cpu(), want_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices.cpu(), want_indices)


def test_rows_are_divided_over_cores_and_the_plan_says_how():
    compiled = backend.plan_kernel(sort_kernel(256, 1024, 1024, torch.float16))
    division = compiled.plans.division
    assert division.cores > 1 and sum(count for _, count in division.shares) == 256
    assert compiled.plans.family == "sort"
    assert any("bitonic network over rows of 1024" in note for note in compiled.plans.tile_kernel.notes)
    forced = backend.plan_kernel(sort_kernel(256, 1024, 1024, torch.float16), cores=1)
    assert forced.plans.division.cores == 1


def test_a_row_too_long_for_the_scratchpad_is_refused_by_name():
    with pytest.raises(Unsupported, match="does not fit the scratchpad"):
        backend.plan_kernel(sort_kernel(1, 65537, 1))


def test_an_empty_sort_and_a_bool_key_are_refused():
    with pytest.raises(Unsupported, match="nothing to sort"):
        backend.plan_kernel(sort_kernel(0, 8, 8))
    with pytest.raises(Unsupported, match="keys of bool"):
        backend.plan_kernel(sort_kernel(2, 8, 8, torch.bool))


def _tile(dtype, rows, cols):
    return Tile(Addr(0), dtype, rows, cols, 4096)


def test_cmpx_names_what_is_wrong_with_its_operands():
    ok = CompareExchange(_tile("fp32", 2, 8), _tile("int64", 2, 8), 2, 4)
    assert ok.problem() is None
    assert "int32 or int64" in CompareExchange(_tile("fp32", 2, 8), _tile("fp32", 2, 8), 2, 4).problem()
    assert "powers of two" in CompareExchange(_tile("fp32", 2, 12), _tile("int64", 2, 12), 2, 4).problem()
    assert "does not fit" in CompareExchange(_tile("fp32", 2, 8), _tile("int64", 2, 8), 4, 4).problem()
    assert "same full tiles" in CompareExchange(_tile("fp32", 2, 8), _tile("int64", 1, 8), 2, 4).problem()
