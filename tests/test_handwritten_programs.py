"""Hand-written programs (spyre_authoring/handwritten.py) against torch on the CPU.

Tolerances, and why:

* vector add, cast round trip: exact. One fp32 operation (fp16 operands are
  exact in fp32), then one rounding to the output dtype; fp32 has
  24 >= 2 * 11 + 2 significand bits, so computing an fp16 sum in fp32 and
  rounding again equals the correctly rounded fp16 sum, which is what torch
  gives too.
* tiled matmul: the products of fp16 values are exact in fp32; only the
  fp32 additions round, and the simulator adds in a different order (per
  k-tile, then across k-tiles) than torch's fp32 matmul. So (1) with data
  whose every partial sum is exact in fp32 the result is bit-for-bit
  (a.float() @ b.float()).half(); (2) with random data each element is within
  1 fp16 ulp plus the bound on two fp32 summation orders,
  2 * gamma_k * sum_i |a_i| |b_i| (gamma_k = k u / (1 - k u), u = 2^-24).
  The second term only matters for outputs near zero (cancellation), where
  an fp16 ulp is smaller than fp32 reassociation noise: plain "1 ulp"
  fails there by tens of ulps for k-tiled plans, by construction, not by bug.
* row softmax: both sides compute in fp32 (x - max is exact, exp, a sum of
  `cols` terms in different orders, a division): relative difference below
  2 (cols + 4) u. For fp16 that is far below half an fp16 ulp, so after the
  one rounding the outputs differ by at most 1 fp16 ulp; fp32 is checked
  with that relative bound.
* ring sum: fp32 sums of the same numbers in two orders differ by at most
  2 gamma_(n-1) sum |x|; with small integers every order is exact, so equal.
"""

import math

import pytest
import torch

from spyre_runtime.direct import run_program
from spyre_runtime.program import Program, validate
from spyre_authoring.handwritten import (
    cast_round_trip, ring_sum, row_softmax, tiled_matmul, vector_add,
)

U32 = 2.0 ** -24


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def ulp16(x: torch.Tensor) -> torch.Tensor:
    """Spacing of fp16 numbers at |x| (subnormal spacing below 2^-14)."""
    x = x.abs().float().clamp(min=2.0 ** -14)
    return torch.exp2(torch.floor(torch.log2(x)) - 10)


def run(program, **tensors):
    out = run_program(program, **tensors)
    return {k: v.cpu() for k, v in out.items()}


def check_format(program: Program) -> None:
    validate(program)
    assert Program.from_json(program.to_json()) == program
    listing = program.listing()
    for cp in program.cores:
        assert f"core {cp.core}  (scratchpad" in listing


# ---- vector add ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("chunk", [None, 128])  # one partial chunk / 7 chunks + a remainder
def test_vector_add_is_exact(dtype, chunk):
    name = {torch.float32: "fp32", torch.float16: "fp16"}[dtype]
    p = vector_add(1000, name, chunk=chunk)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, generator=g).to(dtype), torch.randn(1000, generator=g).to(dtype)
    assert torch.equal(run(p, x=x, y=y)["out"], x + y)
    check_format(p)


def test_vector_add_masks_the_partial_stick():
    p = vector_add(1000)  # 4000 bytes: 31 sticks and a quarter
    load = next(i for i in p.cores[0].unit("ls") if i.opcode == "load")
    assert load.row_bytes == 4000 and load.dst_stride == 4096
    sentinel = torch.full((1024,), 7.0)
    x = torch.ones(1000)
    dev = sentinel.to("spyre")
    run_program(p, x=x, y=x, out=dev[:1000])  # a view: the bytes after its 4000 must survive
    back = dev.cpu()
    assert torch.equal(back[:1000], torch.full((1000,), 2.0)) and torch.equal(back[1000:], sentinel[1000:])


def test_the_same_program_runs_twice_with_different_tensors():
    p = vector_add(1000)
    x1, y1, x2, y2 = (torch.randn(1000) for _ in range(4))
    out1 = run_program(p, x=x1, y=y1)["out"]
    out2 = run_program(p, x=x2, y=y2)["out"]
    assert torch.equal(out1.cpu(), x1 + y1) and torch.equal(out2.cpu(), x2 + y2)
    m = tiled_matmul(64, 96, 128, cores=2)
    for seed in (1, 2):
        a, b = matmul_exact_data(64, 96, 128, seed)
        assert torch.equal(run(m, a=a, b=b)["out"], (a.float() @ b.float()).half())


# ---- tiled matmul -------------------------------------------------------------------------


def matmul_exact_data(m, k, n, seed):
    """Multiples of 1/8 in [-2, 2]: every product is a multiple of 1/64 below 4 in
    magnitude, every partial sum needs at most 6 + 10 bits (k <= 256): exact in fp32,
    in any order. The sums still need rounding to fp16 (up to 16 significant bits)."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(-16, 17, (m, k), generator=g) / 8).half()
    b = (torch.randint(-16, 17, (k, n), generator=g) / 8).half()
    return a, b


MATMULS = [
    # (m, k, n), builder kwargs, which loop alternates the two a/b buffers
    ((64, 96, 128), dict(cores=2), None),
    ((64, 96, 128), dict(cores=4), None),
    ((64, 256, 128), dict(cores=2, tile_k=64, tile_n=64), "k"),   # 4 k-steps, 2 n-tiles
    ((96, 192, 64), dict(cores=4, tile_k=64), "k"),               # odd k-step count: a tail step
    ((64, 96, 128), dict(cores=2, tile_n=32), "n"),               # one k-step: buffers alternate over n
    ((64, 96, 64), dict(cores=2, tile_m=8), "m"),                 # ... and over m
]


@pytest.mark.parametrize("shape,kwargs,rot", MATMULS)
def test_tiled_matmul_accumulates_in_fp32_and_rounds_once(shape, kwargs, rot):
    m, k, n = shape
    p = tiled_matmul(m, k, n, **kwargs)
    a, b = matmul_exact_data(m, k, n, seed=m + k + n)
    expected = (a.float() @ b.float()).half()
    assert not torch.equal(expected.float(), a.float() @ b.float())  # rounding did happen
    assert torch.equal(run(p, a=a, b=b)["out"], expected)
    check_format(p)


@pytest.mark.parametrize("shape,kwargs,rot", MATMULS)
def test_tiled_matmul_random_data_within_one_ulp_plus_reassociation(shape, kwargs, rot):
    m, k, n = shape
    p = tiled_matmul(m, k, n, **kwargs)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()
    out = run(p, a=a, b=b)["out"].float()
    ref = (a.float() @ b.float()).half().float()
    reassoc = 2 * gamma(k) * (a.double().abs() @ b.double().abs()).float()
    assert ((out - ref).abs() <= ulp16(torch.maximum(out.abs(), ref.abs())) + reassoc).all()
    big = ref.abs() >= 1  # where reassociation noise is far below an ulp
    assert ((out - ref).abs()[big] <= ulp16(ref[big])).all()


def test_tiled_matmul_double_buffers_the_k_tiles():
    p = tiled_matmul(64, 256, 128, cores=2, tile_k=64)
    ls, pe = p.cores[0].unit("ls"), p.cores[0].unit("pe")
    a_loads = {i.dst.base for i in ls if i.opcode == "load" and i.src.symbol == "a"}
    assert len(a_loads) == 2  # two a buffers (and two b buffers), alternating
    matmuls = [i for i in pe if i.opcode == "matmul"]
    assert [i.accumulate for i in matmuls][0] is False and all(i.accumulate for i in matmuls[1:])
    assert {i.a.addr.base for i in matmuls} == a_loads
    assert any(i.opcode == "loop" for i in ls)  # the k-steps are a loop, not one copy per tile


def test_tiled_matmul_big_plan_fits_and_is_small():
    p = tiled_matmul(1024, 1024, 1024, cores=32)
    assert len(p.cores) == 32
    assert max(p.scratchpad_high_water().values()) <= 2 * 1024 * 1024 - 64 * 1024
    assert sum(len(instrs) for cp in p.cores for _, instrs in cp.units) < 64 * 32


def test_tiled_matmul_rejects_tiles_that_do_not_divide():
    with pytest.raises(ValueError, match="tile_k"):
        tiled_matmul(64, 96, 128, cores=2, tile_k=64)


# ---- row softmax --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("tile_rows", [None, 4])  # one tile per core / 4 tiles + a remainder
def test_row_softmax(dtype, tile_rows):
    rows, cols = 50, 100  # 50 rows over 3 cores: 17, 17, 16; 100 columns: partial sticks
    name = {torch.float32: "fp32", torch.float16: "fp16"}[dtype]
    p = row_softmax(rows, cols, name, cores=3, tile_rows=tile_rows)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(rows, cols, generator=g) * 3).to(dtype)
    out = run(p, x=x)["out"]
    ref = torch.softmax(x.float(), -1).to(dtype)
    if dtype == torch.float16:
        assert ((out.float() - ref.float()).abs() <= ulp16(torch.maximum(out.abs(), ref.abs()))).all()
    else:
        torch.testing.assert_close(out, ref, rtol=2 * (cols + 4) * U32, atol=0)
    check_format(p)


def test_row_softmax_big_plan_fits():
    p = row_softmax(4096, 4096, "fp16", cores=32)
    assert len(p.cores) == 32
    assert max(p.scratchpad_high_water().values()) <= 2 * 1024 * 1024 - 64 * 1024


# ---- ring sum -----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 64])  # one chunk per core / several (and a remainder)
def test_ring_sum(chunk):
    n = 1000
    p = ring_sum(n, 4, chunk=chunk)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, generator=g)
    out = run(p, x=x)["out"]
    assert out.shape == (1,)
    bound = 2 * gamma(n - 1) * x.abs().sum().item()
    assert abs(out.item() - x.sum().item()) <= bound
    ints = torch.randint(-100, 101, (n,), generator=g).float()  # every partial sum exact
    assert torch.equal(run(p, x=ints)["out"], ints.sum().reshape(1))
    check_format(p)


def test_ring_sum_sends_whole_sticks_to_the_next_core_only():
    p = ring_sum(1000, 4)
    for cp in p.cores:
        sends = [i for i in cp.unit("ls") if i.opcode == "send"]
        if cp.core < 3:
            assert len(sends) == 1 and sends[0].core == cp.core + 1 and sends[0].nbytes == 128
        else:
            assert not sends and any(i.opcode == "store" for i in cp.unit("ls"))


# ---- cast round trip ----------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 128])
def test_cast_round_trip_rounds_to_nearest_even(chunk):
    special = torch.tensor([
        1 + 2 ** -11,        # halfway between 1 and 1 + 2^-10: to 1 (even)
        1 + 3 * 2 ** -11,    # halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9 (even)
        -(1 + 2 ** -11), 2049.0, 2051.0,  # integers halfway between fp16 neighbours
        65519.0, 65520.0,    # the largest finite fp16 / the first value that rounds to inf
        2 ** -25, 3 * 2 ** -26, 1e-8,  # subnormal halfway and below
        0.1, -0.0, float("inf"), float("nan"),
    ])
    g = torch.Generator().manual_seed(9)
    x = torch.cat([special, torch.randn(1000 - len(special), generator=g) * 100])
    p = cast_round_trip(1000, chunk=chunk)
    out = run(p, x=x)["out"]
    expected = x.half().float()
    assert torch.equal(out.isnan(), expected.isnan())
    keep = ~expected.isnan()
    assert torch.equal(out[keep], expected[keep])
    assert out[0] == 1 and out[1] == 1 + 2 ** -9 and out[3] == 2048 and out[4] == 2052
    assert out[6] == math.inf and torch.signbit(out[11])
    check_format(p)
