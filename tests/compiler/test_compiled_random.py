"""Random ops inside torch.compile on spyre (issue 19), under SPYRE_STRICT=1.

Inductor's own random lowering (inductor_seeds / lookup_seed / inductor_random) reaches us as
``ops.rand(seed, index)`` in a pointwise node, which becomes the ISA's philox instruction in the
same program as its consumers; the seeds come from the device generator (an eager random_ on
spyre). Statistical bounds: 5 standard errors (see tests/test_random.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from inductor_helpers import compile_on_spyre, op_names
from spyre_inductor.device import random as device_random


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _all_compiled(records):
    assert records and all(r.artifact is not None for r in records), records


def test_rand_like_runs_in_one_program_with_its_consumer():
    x = torch.randn(64, 96)
    torch.spyre.manual_seed(5)
    (out,), _, records, warned, _ = compile_on_spyre(lambda x: x + torch.rand_like(x), x)
    assert not warned
    _all_compiled(records)
    random_kernels = [r for r in records if "rand" in op_names(r.kernel)]
    assert len(random_kernels) == 1 and "add" in op_names(random_kernels[0].kernel)  # fused: one program
    u = (out.cpu() - x).double()
    assert -1e-6 <= u.min() and u.max() < 1 + 1e-6
    n = u.numel()
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)


def test_seeded_reproducible_and_fresh_per_call():
    f = torch.compile(lambda x: x * torch.randn_like(x), dynamic=False)
    x = torch.ones(32, 64).to("spyre")
    torch.spyre.manual_seed(1)
    a = f(x).cpu()
    b = f(x).cpu()
    torch.spyre.manual_seed(1)
    assert torch.equal(f(x).cpu(), a)
    assert not torch.equal(a, b)
    # the seeds are drawn from the device generator: its offset advanced
    assert device_random.philox_state(0)[1] > 0
    z = a.double()
    assert abs(z.mean().item()) < 5 / math.sqrt(z.numel())
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / z.numel())


def test_every_reseed_replays_a_compiled_graph():
    # The graph's seeds are drawn from the default generator, so each way of putting it back
    # (torch.manual_seed, the generator object's own manual_seed or set_state) replays.
    f = torch.compile(lambda x: x + torch.rand_like(x), dynamic=False)
    x = torch.zeros(16, 64).to("spyre")
    gen = torch.spyre.default_generators[0]
    torch.manual_seed(7)
    a = f(x).cpu()
    torch.manual_seed(7)
    assert torch.equal(f(x).cpu(), a)
    gen.manual_seed(7)
    assert torch.equal(f(x).cpu(), a)
    state = gen.get_state()
    b = f(x).cpu()
    gen.set_state(state)
    assert torch.equal(f(x).cpu(), b)
    assert not torch.equal(a, b)


def test_randint_and_bernoulli_in_a_graph():
    def f(x):
        k = torch.randint(0, 7, x.shape, device=x.device)
        return k, torch.bernoulli(torch.full_like(x, 0.25))

    x = torch.zeros(48, 64)
    (k, b), _, records, warned, _ = compile_on_spyre(f, x)
    assert not warned
    _all_compiled(records)
    k, b = k.cpu(), b.cpu()
    assert k.dtype == torch.int64 and 0 <= k.min() and k.max() <= 6 and len(k.unique()) == 7
    assert abs(b.mean().item() - 0.25) < 5 * math.sqrt(0.1875 / b.numel())


def test_dropout_in_training_compiles_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).to("spyre")
    model.train()
    compiled = torch.compile(model)
    x = torch.randn(32, 64).to("spyre")
    torch.spyre.manual_seed(3)
    y = compiled(x)
    y.backward(torch.ones(32, 64).to("spyre"))
    dropped = (y.detach().cpu() == 0).double().mean().item()
    assert abs(dropped - 0.5) < 5 * math.sqrt(0.25 / y.numel())
    # the bias gradient counts, per column, the rows the mask kept, times 1 / (1 - p)
    kept = (y.detach().cpu() != 0).float()
    torch.testing.assert_close(model[0].bias.grad.cpu(), kept.sum(0) * 2)
    torch.spyre.manual_seed(3)
    assert torch.equal(compiled(x).detach().cpu(), y.detach().cpu())


def test_the_program_uses_the_philox_instruction():
    from spyre_runtime.prepare import prepare_kernel  # noqa: F401  (the artifact's program)
    from spyre_runtime.program.program import Program

    (out,), _, records, _, _ = compile_on_spyre(lambda x: torch.rand_like(x) * x, torch.ones(16, 64))
    listings = [Program.from_json((r.artifact / "program.json").read_text()).listing() for r in records]
    assert any("philox" in text and "uniform" in text for text in listings)


def test_fallback_random_gives_the_eager_numbers():
    # config.fallback_random keeps aten's random ops in the graph: they run as the eager spyre
    # kernels (programs too), so a compiled graph draws exactly what eager draws.
    x = torch.ones(16, 64).to("spyre")
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        f = torch.compile(lambda x: x * torch.randn_like(x))
        torch.spyre.manual_seed(3)
        a = f(x).cpu()
    torch.spyre.manual_seed(3)
    assert torch.equal(a, torch.randn(16, 64, device="spyre").cpu())
