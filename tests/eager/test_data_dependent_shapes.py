"""Ops whose output's size depends on the data (nonzero, unique, a boolean-mask index) stay on the
CPU: a program's shapes are fixed when it is planned. Without strict mode they give the CPU's
answer through the fallback; under SPYRE_STRICT=1 each is refused naming the aten op, eager and
compiled alike (Dynamo breaks the graph at them, so the compiled call meets the same eager op).
"""

from __future__ import annotations

import pytest
import torch

from spyre_inductor.device.fallback import strict_mode

OPS = {
    "nonzero": (lambda x: x.nonzero(), "aten::nonzero"),
    "unique": (lambda x: torch.unique(x), "aten::_unique2"),
    "boolean_mask": (lambda x: x[x > 0], "aten::index.Tensor"),
    "masked_select": (lambda x: torch.masked_select(x, x > 1), "aten::masked_select"),
}


@pytest.fixture
def x():
    return torch.tensor([[0.0, 1.0, 2.0], [0.0, 3.0, 1.0]])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", OPS)
def test_without_strict_the_answer_is_the_cpus(name, compiled, x):
    fn, _ = OPS[name]
    run = torch.compile(fn) if compiled else fn
    torch._dynamo.reset()
    with strict_mode(False):
        out = run(x.to("spyre"))
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu(), fn(x))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", OPS)
def test_under_strict_each_is_refused_naming_the_op(name, compiled, x):
    fn, op = OPS[name]
    run = torch.compile(fn) if compiled else fn
    torch._dynamo.reset()
    with strict_mode(True), pytest.raises(NotImplementedError, match=f"{op}.*SPYRE_STRICT=1"):
        run(x.to("spyre"))
