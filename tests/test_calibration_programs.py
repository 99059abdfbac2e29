"""Calibration programs (spyre_authoring/calibration.py): valid at full size, correct scaled down.

Full-size programs are only validated here (simulating them is the job of
benchmarks/calibration.py); their simulated times are pinned, and held to the
measured bounds, in tests/test_timing_model.py. Scaled down (same plans, fewer
cores, small chunks so that every core streams several chunks plus a partial
one) they run on the functional simulator over CPU tensors and are compared
with torch on the CPU:

* neg, add, x*2 + x*3: exact (one fp32 operation on fp16 values per rounding,
  and the fused kernel rounds x*3 and the sum to fp16 exactly as torch's
  eager fp16 x*2 + x*3 does).
* row sum: small integers, so every fp32 summation order is exact: equal to
  torch's fp16 sum.
* softmax over dim 0 (fp16 intermediates): against a torch emulation of the
  same fp16 roundings within 2 fp16 ulps (the fp32 column sum is added in a
  different order), and loosely against the fp32 softmax.
"""

import pytest
import torch

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program import Load, Machine, Store, validate
from spyre_authoring.calibration import (
    CALIBRATION, add, fused_mul_add, matmul, neg, row_sum, softmax_dim0, softmax_dim0_from_memory,
)
from spyre_runtime.program.operands import STICK


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _run(program, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    buffers = {k: _bytes(v.contiguous()) for k, v in inputs.items()}
    buffers["out"] = _bytes(out)
    Machine(program, buffers, HARDWARE.scratchpad_bytes).run()
    return out


@pytest.mark.parametrize("entry", CALIBRATION, ids=lambda e: f"{e.name} on {e.cores}")
def test_full_size_program_validates_and_fits(entry):
    program = entry.build()
    validate(program)
    assert len(program.cores) == entry.cores
    assert entry.kind in ("memory", "matmul") and entry.measured_us > 0
    assert max(program.scratchpad_high_water().values()) <= HARDWARE.scratchpad_usable_bytes


def test_resident_softmax_moves_no_device_memory():
    for cores in (1, 4):
        program = softmax_dim0(512, 1024, cores)
        assert not program.symbols
        assert all(not isinstance(i, (Load, Store)) for cp in program.cores for _, ins in cp.units for i in ins)


def test_matmul_is_the_single_core_tiled_matmul():
    program = matmul()
    assert [cp.core for cp in program.cores] == [0]
    assert "256x256x512" in program.notes


def _data(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 4).half()


@pytest.mark.parametrize("rows,cols,cores,chunk", [(24, 136, 3, 512), (2, 5, 2, 128), (64, 64, 32, 256)])
def test_neg(rows, cols, cores, chunk):
    x = _data((rows, cols))
    out = _run(neg(rows, cols, cores, chunk=chunk), {"x": x}, torch.empty_like(x))
    assert torch.equal(out, -x)


@pytest.mark.parametrize("n,cores,chunk", [(3000, 3, 512), (64 * 5 + 7, 4, 256), (100, 1, 128)])
def test_fused_mul_add(n, cores, chunk):
    x = _data((n,))
    out = _run(fused_mul_add(n, cores, chunk=chunk), {"x": x}, torch.empty_like(x))
    assert torch.equal(out, x * 2 + x * 3)


@pytest.mark.parametrize("rows,cols,cores,chunk", [(40, 130, 4, 512), (16, 64, 1, 256), (8, 8, 3, 128)])
def test_add(rows, cols, cores, chunk):
    x, y = _data((rows, cols), 1), _data((rows, cols), 2)
    out = _run(add(rows, cols, cores, chunk=chunk), {"x": x, "y": y}, torch.empty_like(x))
    assert torch.equal(out, x + y)


@pytest.mark.parametrize("rows,cols,cores,chunk", [(37, 200, 4, 1024), (64, 130, 2, 128), (5, 64, 3, 4096)])
def test_row_sum(rows, cols, cores, chunk):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-8, 9, (rows, cols), generator=g).half()
    out = _run(row_sum(rows, cols, cores, chunk=chunk), {"x": x}, torch.empty(rows, dtype=torch.half))
    assert torch.equal(out, x.sum(dim=1))


def _softmax_dim0_fp16(x: torch.Tensor) -> torch.Tensor:
    """The program's roundings: max exact, x - max, exp and the column sum rounded to fp16."""
    d = (x.float() - x.amax(dim=0).float()).half()
    e = d.float().exp().half()
    s = e.float().sum(dim=0).half()
    return (e.float() / s.float()).half()


@pytest.mark.parametrize("rows,cols,cores", [(48, 40, 1), (100, 37, 4), (512, 64, 2)])
def test_softmax_dim0_resident(rows, cols, cores):
    x = _data((rows, cols), 4)
    program = softmax_dim0(rows, cols, cores)
    row = -(-rows * 2 // STICK) * STICK
    m = Machine(program, {}, HARDWARE.scratchpad_bytes)
    xt = x.t().contiguous()  # the resident layout: columns of x are scratchpad rows
    pads, col0 = [], 0
    for cp in program.cores:
        count = cols // cores + (cp.core < cols % cores)
        sp = m.scratch(cp.core)
        view = torch.as_strided(sp.view(torch.float16), (count, rows), (row // 2, 1))
        view.copy_(xt[col0:col0 + count])
        pads.append((view, col0, count))
        col0 += count
    m.run()
    out_t = torch.empty_like(xt)
    for view, c0, count in pads:
        out_t[c0:c0 + count] = view
    out = out_t.t()
    ref = _softmax_dim0_fp16(x)
    ulp = torch.finfo(torch.float16).eps * ref.float().abs().clamp_min(2.0 ** -14)
    assert ((out.float() - ref.float()).abs() <= 2 * ulp).all()
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), dim=0), atol=3e-3, rtol=2e-2)


@pytest.mark.parametrize("rows,cols,cores", [(48, 40, 1), (100, 37, 4), (64, 200, 3)])
def test_softmax_dim0_from_memory(rows, cols, cores):
    x = _data((rows, cols), 5)
    out = _run(softmax_dim0_from_memory(rows, cols, cores), {"x": x}, torch.empty_like(x))
    # Its roundings: max exact, x - max and exp rounded to fp16, the column sum in fp32.
    e = (x.float() - x.amax(dim=0).float()).half().float().exp().half().float()
    ref = (e / e.sum(dim=0)).half()
    ulp = torch.finfo(torch.float16).eps * ref.float().abs().clamp_min(2.0 ** -14)
    assert ((out.float() - ref.float()).abs() <= 2 * ulp).all()
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), dim=0), atol=3e-3, rtol=2e-2)
