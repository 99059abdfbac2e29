"""The hand-written programs at the sizes the benchmark uses (slow: `make test-slow`)."""

import pytest
import torch

from spyre_runtime.direct import run_program
from spyre_authoring.handwritten import row_softmax, tiled_matmul

pytestmark = pytest.mark.slow


def test_matmul_1024_cubed_fp16_on_32_cores():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g).half(), torch.randn(1024, 1024, generator=g).half()
    out = run_program(tiled_matmul(1024, 1024, 1024, "fp16", cores=32), a=a, b=b)["out"].cpu()
    ref = a.float() @ b.float()
    # fp32 sums in another order (k-tiles), then one fp16 rounding: within one fp16
    # ulp of the reference plus the fp32 reassociation bound (see test_handwritten_programs).
    bound = torch.finfo(torch.float16).eps * ref.abs() + 2 * 1024 * 2**-24 * (a.float().abs() @ b.float().abs())
    assert ((out.float() - ref).abs() <= bound + 2**-24).all()


def test_softmax_4096_squared_fp16_on_32_cores():
    x = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(1)).half()
    out = run_program(row_softmax(4096, 4096, "fp16", cores=32), x=x)["out"].cpu()
    ref = torch.softmax(x.float(), -1)
    assert ((out.float() - ref).abs() <= torch.finfo(torch.float16).eps * ref.abs() + 2**-24).all()
