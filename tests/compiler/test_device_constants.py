"""Device tensor constants in a compiled function: made inside it, captured in a closure, a module's buffer.

Inductor writes the graph it compiles as repro text (compile_fx's save_graph_repro),
where a small constant appears as its repr: formatting a spyre tensor runs no
program and is not an op strict mode forbids (device/fallback.py:
formatting_a_tensor), so a compile that holds one succeeds under strict mode,
as without it, gives the CPU's numbers, and runs no eager op on the card.
"""

import pytest
import torch

from spyre_inductor.device.fallback import strict_mode


class Scaled(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.register_buffer("scale", torch.linspace(-1.0, 1.0, 16, device=device))

    def forward(self, x):
        return x * self.scale + 1.0


def _where_minus_one(x):
    return torch.where(x > 0, x, torch.tensor(-1.0, device=x.device))


def _listed(x):
    return x + torch.tensor([1.0, -2.0, 3.0, 0.5] * 4, device=x.device)


CASES = {
    "where with torch.tensor(-1.0, device=...)": lambda device: _where_minus_one,
    "torch.tensor([...], device=...) inside": lambda device: _listed,
    "a device tensor captured in a closure": lambda device: (
        lambda c: (lambda x: x - c))(torch.arange(16.0, device=device) / 4),
    "a buffer registered on an nn.Module": lambda device: Scaled(device),
}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not strict"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_device_constant_compiles_and_matches_the_cpu(spyre, case, strict):
    torch._dynamo.reset()
    a = torch.randn(8, 16)
    fn, want, x = CASES[case](spyre), CASES[case]("cpu")(a), a.to(spyre)
    before = torch.spyre.eager_cache_stats()
    with strict_mode(strict):
        got = torch.compile(fn)(x)
    torch.testing.assert_close(got.cpu(), want)
    after = torch.spyre.eager_cache_stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)  # no eager op, for bookkeeping or else
