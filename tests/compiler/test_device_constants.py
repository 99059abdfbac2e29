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


HOST_VALUES = {
    # the CPU's arange computes in fp64: moved to the card as Inductor would, a cast to fp64 in a
    # spyre program, refused under strict
    "torch.arange(16.).to(x.device)": lambda x: x + torch.arange(16.0).to(x.device),
    "torch.linspace(-1, 1, 16).to(x.device, torch.float16)":
        lambda x: x * torch.linspace(-1.0, 1.0, 16).to(x.device, torch.float16),
    "torch.full((16,), 0.1).to(x.device)": lambda x: x - torch.full((16,), 0.1).to(x.device),
}


@pytest.mark.parametrize("case", list(HOST_VALUES))
def test_a_value_computed_on_the_cpu_is_copied_as_the_cpu_computed_it(spyre, case):
    """A CPU tensor made inside the compiled function and moved to spyre is computed by a CPU
    kernel and copied, bit for bit the CPU's value, under strict; the op on it is a spyre program."""
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    torch._dynamo.reset()
    fn, a = HOST_VALUES[case], torch.randn(8, 16)
    dtype = torch.float16 if "float16" in case else torch.float32
    with strict_mode(True), record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        got = torch.compile(fn)(a.to(dtype).to(spyre))
    torch.testing.assert_close(got.cpu(), fn(a.to(dtype)), rtol=0, atol=0)
    assert [r.fallback_reason for r in records if r.kernel is None] == []
    assert len([r for r in records if r.artifact is not None]) == 1
