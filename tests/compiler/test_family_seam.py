"""The seam every kernel family plugs into (compiler/core/family.py): a registry in dispatch order,
the first family that claims a kernel plans it, and a family added later plugs in without
touching the planner (docs/adding_a_kernel_family.md)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from pointwise_ir import binary_kernel
from reduction_ir import row_reduce

from spyre_inductor.compiler import backend
from spyre_inductor.compiler.core import family as registry
from spyre_inductor.compiler.core.family import FAMILIES, Family, family_of, register
from spyre_inductor.compiler.ir.errors import Unsupported


@contextlib.contextmanager
def registered_first(fam: Family):
    """`fam` at the front of the dispatch order for the test, the registry as it was afterwards."""
    before = list(FAMILIES)
    register(fam)
    FAMILIES.insert(0, FAMILIES.pop())
    try:
        yield fam
    finally:
        FAMILIES[:] = before


def _kinds():
    """One kernel of each kind, captured from real graphs (tests/compiler/golden_programs.py's corpus
    has them all): {what: kernel}."""
    import torch.nn.functional as F

    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    dev = "spyre"
    fns = {
        "pointwise": (lambda a: a * 2 + 1, [torch.randn(8, 64)]),
        "reduction": (lambda a: a.sum(-1), [torch.randn(8, 64)]),
        "gather": (lambda w, i: F.embedding(i, w), [torch.randn(16, 64), torch.tensor([[3, 1]])]),
        "gather then sum": (lambda w, i: w[i].sum(1), [torch.randn(16, 64), torch.randint(0, 16, (1, 64))]),
        "matmul": (lambda x, w: x @ w, [torch.randn(16, 64), torch.randn(64, 32)]),
        "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                      [torch.randn(1, 2, 16, 32) for _ in range(3)]),
        "topk": (lambda a: torch.topk(a, 3), [torch.randn(8, 64)]),
    }
    kinds = {}
    for what, (fn, args) in fns.items():
        torch._dynamo.reset()
        with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            torch.compile(fn)(*[a.to(dev) for a in args])
        kinds[what] = [r.kernel for r in records if r.kernel is not None]
    return kinds


def test_each_kernel_goes_to_the_family_of_its_kind():
    kinds = _kinds()
    (gather,) = kinds["gather"]
    assert type(gather).__name__ == "IndirectKernel" and not registry.family("indirect").claims(gather)
    families = {what: [family_of(k).name for k in ks] for what, ks in kinds.items()}
    assert families == {"pointwise": ["pointwise"], "reduction": ["reduction"],
                        "gather": ["pointwise"],  # (cut into pieces first, the rows then the indirect plan)
                        "gather then sum": ["pointwise", "reduction"],  # (a gather is realized apart)
                        "matmul": ["matmul"],
                        "attention": ["attention"], "topk": ["sort"]}, families
    assert family_of(binary_kernel("add", (8, 64))).name == "pointwise"
    assert family_of(row_reduce("sum", (8, 64), 1)).name == "reduction"
    assert family_of(row_reduce("sum", (8, 0), 1)).name == "reduction"  # (handed to pointwise: identities)


def test_the_first_family_that_claims_a_kernel_plans_it():
    class Sums(Family):
        name = "sums"

        def claims(self, kernel):
            return any(getattr(v, "op", None) == "sum" for v in kernel.values)

        def plan(self, kernel, *, cores, max_cores, estimate):
            raise Unsupported(f"sums: not yet ({kernel.name})")

    with registered_first(Sums()):
        assert family_of(binary_kernel("add", (8, 64))).name == "pointwise"  # not claimed: the next family
        with pytest.raises(Unsupported, match="sums: not yet"):
            backend.plan_kernel(row_reduce("sum", (8, 64), 1))
    assert backend.plan_kernel(row_reduce("sum", (8, 64), 1)).plans.family == "reduction"


def test_a_family_is_registered_once_by_name():
    with pytest.raises(ValueError, match="a kernel family named 'pointwise' is registered already"):
        register(type("Again", (Family,), {"name": "pointwise", "claims": lambda self, k: False})())


def test_a_kernel_no_family_claims_is_refused_naming_the_families(monkeypatch):
    monkeypatch.setattr(registry, "FAMILIES", [f for f in FAMILIES if f.name != "pointwise"])
    with pytest.raises(Unsupported,
                       match=r"no kernel family claims kernel .*registered: \['attention', 'sort', 'experts', 'indirect'"):
        registry.family_of(binary_kernel("add", (8, 64)))


def test_planning_with_no_family_registered_is_a_planner_error_not_a_cpu_fallback(monkeypatch):
    monkeypatch.setattr(registry, "FAMILIES", [])
    with pytest.raises(RuntimeError, match="no kernel family is registered"):
        registry.family_of(binary_kernel("add", (8, 64)))


def test_a_family_without_a_planner_says_so():
    with pytest.raises(NotImplementedError, match="kernel family 'bare' has no planner"):
        type("Bare", (Family,), {"name": "bare"})().plan(None, cores=None, max_cores=None, estimate=None)


def test_a_family_vetoes_fusion_of_what_it_would_plan_worse(monkeypatch):
    """Inductor's fusion asks every family (core.family.fusion_vetoed): one that vetoes every
    fusion leaves each node its own kernel."""
    monkeypatch.setenv("SPYRE_STRICT", "1")

    class Apart(Family):
        name = "apart"

        def claims(self, kernel):
            return False

        def fusion_vetoed(self, fused):
            return True

    def kernels():
        from spyre_inductor.compiler.inductor.scheduling import record_kernels

        torch._dynamo.reset()
        x = torch.randn(8, 64).to("spyre")
        with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            out = torch.compile(lambda x: x - x.amax(-1, keepdim=True))(x)
        torch.testing.assert_close(out.cpu(), x.cpu() - x.cpu().amax(-1, keepdim=True))
        return len(records)

    fused = kernels()
    with registered_first(Apart()):
        apart = kernels()
    assert (fused, apart) == (1, 2)  # the max and its epilogue: one kernel, or one each
