"""The experts family (issue 31): a grouped matmul (mixture-of-experts routing) as one program
whose experts' row ranges are read from offs on chip, against grouped_mm_reference on the CPU.

Plan tests build the GroupedMatmulKernel by hand (no Inductor), compile it, launch it on spyre
and compare exactly where the products are exact in fp32 (small integers), else within fp32
summation order; the compiled tests are in test_experts_compiled.py's style below: the aten op
under torch.compile, strict.
"""

from __future__ import annotations

import pytest
import torch

from spyre_inductor.compiler.backend import compile_kernel, plan_kernel
from spyre_inductor.compiler.core.family import family_of
from spyre_inductor.compiler.ir.kernel_ir import (DTYPE_NAMES, Buffer, GroupedMatmulKernel, grouped_mm_reference,
                                                 kernel_from_json)
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel


def _kernel(a, w, offs, out_dtype=None):
    out_dtype = out_dtype or a.dtype
    S, N = a.shape[0], w.shape[2]
    buffers = (Buffer("a", DTYPE_NAMES[a.dtype], tuple(a.shape), tuple(a.stride())),
               Buffer("w", DTYPE_NAMES[w.dtype], tuple(w.shape), tuple(w.stride())),
               Buffer("offs", DTYPE_NAMES[offs.dtype], tuple(offs.shape), tuple(offs.stride())),
               Buffer("out", DTYPE_NAMES[out_dtype], (S, N), (N, 1)))
    return GroupedMatmulKernel("grouped_mm_test", buffers)


def run_kernel(tmp_path, a, w, offs, **options):
    """Compile the kernel of these CPU tensors, launch it on spyre: (out, report)."""
    kernel = _kernel(a, w, offs)
    artifact = compile_kernel(kernel, tmp_path, **options)
    plan = prepare_kernel(artifact)
    out = torch.full((a.shape[0], w.shape[2]), float("nan"), dtype=a.dtype, device="spyre")
    torch.spyre.reset_kernel_reports()
    launch_jobplan(plan, [a.to("spyre"), w.to("spyre"), offs.to("spyre"), out])
    torch.spyre.synchronize()
    return out.cpu(), torch.spyre.kernel_reports()[-1]


def _ints(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def _offs(counts, dtype=torch.int32):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(dtype)


@pytest.mark.parametrize("counts", [(8, 8, 8, 8), (0, 20, 0, 12), (32, 0, 0, 0), (0, 0, 0, 32), (3, 0, 0, 0),
                                    (1, 1, 0, 0)], ids=["even", "two-empty", "all-first", "all-last", "tail", "decode"])
def test_each_row_goes_through_its_own_experts_weights(tmp_path, counts):
    S = 32 if sum(counts) > 3 else max(sum(counts), 2) + 6
    a, w = _ints(S, 64, seed=1), _ints(4, 64, 96, seed=2)
    offs = _offs(counts)
    out, _ = run_kernel(tmp_path, a, w, offs)
    assert torch.equal(out, grouped_mm_reference(a, w, offs))  # (the rows past offs[-1] are zeros)


def test_transposed_weights_bf16_and_int64_offsets(tmp_path):
    """Mixtral's w is ``weight.transpose(-2, -1)`` of an [E, N, K] parameter (k contiguous)."""
    a = _ints(40, 128, dtype=torch.bfloat16, seed=3)
    w = _ints(4, 192, 128, dtype=torch.bfloat16, seed=4).transpose(1, 2)
    offs = _offs((10, 0, 25, 5), torch.int64)
    out, _ = run_kernel(tmp_path, a, w, offs)
    assert torch.equal(out, grouped_mm_reference(a, w, offs))


def test_fp32_products_match_the_cpu_within_summation_order(tmp_path):
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(24, 64, generator=g), torch.randn(3, 64, 64, generator=g)
    offs = _offs((5, 11, 8))
    out, _ = run_kernel(tmp_path, a, w, offs)
    torch.testing.assert_close(out, grouped_mm_reference(a, w, offs), rtol=1e-5, atol=1e-5)


def test_an_expert_without_rows_has_its_weights_skipped(tmp_path):
    """A decode step's rows choose two experts of eight: only their weights move."""
    a, w = _ints(2, 64, seed=6), _ints(8, 64, 128, seed=7)
    offs = _offs((0, 1, 0, 0, 0, 1, 0, 0))
    out, report = run_kernel(tmp_path, a, w, offs)
    assert torch.equal(out, grouped_mm_reference(a, w, offs))
    weights = 8 * 64 * 128 * 4
    assert report.bytes_moved < weights / 2  # two experts' of eight, the rows and the output


def test_the_kernel_ir_round_trips_and_the_experts_family_claims_it():
    a, w = _ints(16, 64), _ints(4, 64, 64)
    kernel = _kernel(a, w, _offs((4, 4, 4, 4)))
    assert kernel_from_json(kernel.to_json()) == kernel
    assert family_of(kernel).name == "experts"
    compiled = plan_kernel(kernel)
    assert compiled.plans.family == "experts"
    # 64 fp32 columns: two sticks, a column block each (each maybe dealt over row groups)
    assert {b.n0 for b in compiled.plans.division.shares} == {0, 32}


def test_a_malformed_kernel_is_refused_by_name():
    from spyre_inductor.compiler.ir.errors import Unsupported

    a, w = _ints(16, 64), _ints(4, 32, 64)
    with pytest.raises(Unsupported, match="do not match"):
        plan_kernel(_kernel(a, w, _offs((4, 4, 4, 4))))


def test_a_narrow_output_deals_its_row_tiles_over_row_groups(tmp_path):
    """64 fp32 columns are two sticks, 128 rows over two experts: the timing model deals each
    column block's row tiles over two cores (row tiles t % 2), every row still through its own
    expert's weights."""
    a, w = _ints(128, 128, seed=8), _ints(2, 128, 64, seed=9)
    offs = _offs((75, 53))
    shares = plan_kernel(_kernel(a, w, offs)).plans.division.shares
    assert {(b.n0, b.row_group, b.row_groups) for b in shares} == {(0, 0, 2), (0, 1, 2), (32, 0, 2), (32, 1, 2)}
    out, _ = run_kernel(tmp_path, a, w, offs)
    assert torch.equal(out, grouped_mm_reference(a, w, offs))


def test_a_k_too_long_for_a_resident_weight_tile_streams_the_weights_in_chunks(tmp_path):
    """[K, cols] weights that do not fit beside a row tile (K = 8192 fp32, k contiguous) move as
    [k, cols] chunks per row tile, the chunks' products summed in the fp32 accumulator."""
    a = _ints(6, 8192, seed=10)
    w = _ints(3, 32, 8192, seed=11).transpose(1, 2)
    offs = _offs((2, 0, 4))
    tiling = plan_kernel(_kernel(a, w, offs)).plans.stage("tiling")
    assert 0 < tiling.k < 8192
    out, _ = run_kernel(tmp_path, a, w, offs)
    assert torch.equal(out, grouped_mm_reference(a, w, offs))
