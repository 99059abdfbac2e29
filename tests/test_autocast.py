"""torch.autocast("spyre"): the cast rules of spyre_inductor/device/autocast.py (issue 19).

Eager ops here run under SPYRE_STRICT=1, as compile-backed spyre programs (fp64, which spyre
programs do not compute, is checked apart without it); what these tests check is the dtype
each op runs in. The compiled tests run under SPYRE_STRICT=1 too: there the casts and the ops
are part of the compiled programs.

Tolerances: a LOWER op (matmul, linear) on spyre and under CPU autocast both multiply the
fp16-rounded operands, accumulate in fp32 and round once to fp16, so they differ at most by
the accumulation order: one ulp, rtol 2**-10 for fp16 (2**-7 for bf16), plus atol 1e-3 (1e-2)
for sums that cancel to near zero (where one ulp of the operands' magnitude is far more than
one ulp of the result). An FP32
op (softmax, layer_norm) on an fp16 input is compared with the same op in fp32 on the
fp16 values: fp32's rtol 1.3e-6, atol 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.device import autocast

LOWER_TOL = {torch.float16: dict(rtol=2.0 ** -10, atol=1e-3), torch.bfloat16: dict(rtol=2.0 ** -7, atol=1e-2)}
FP32_TOL = dict(rtol=1.3e-6, atol=1e-5)


def _data(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def test_the_rules_follow_cudas_lists():
    rules = autocast.rules()
    for op in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::linear", "aten::matmul",
               "aten::scaled_dot_product_attention", "aten::conv2d", "aten::einsum"):
        assert rules[op] == "lower", op
    for op in ("aten::layer_norm", "aten::group_norm", "aten::exp", "aten::log", "aten::pow.Tensor_Scalar",
               "aten::mse_loss", "aten::nll_loss", "aten::binary_cross_entropy_with_logits", "aten::logsumexp"):
        assert rules[op] == "fp32", op
    for op in ("aten::softmax.int", "aten::log_softmax.int", "aten::sum", "aten::sum.dim_IntList", "aten::cumsum",
               "aten::prod"):
        assert rules[op] == "fp32_set_opt_dtype", op
    for op in ("aten::cat", "aten::stack", "aten::index_put", "aten::scatter_add", "aten::addcmul"):
        assert rules[op] == "promote", op
    assert not any(name.endswith("out") for name in rules)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eager_ops_run_in_their_policys_dtype(eager, dtype):
    x, w, b = _data(8, 16).to("spyre"), _data(4, 16, seed=1).to("spyre"), _data(4, seed=2).to("spyre")
    batch = _data(2, 8, 8, seed=3).to("spyre")
    with torch.autocast("spyre", dtype=dtype):
        assert (x @ x.t()).dtype == dtype
        assert F.linear(x, w, b).dtype == dtype
        assert torch.bmm(batch, batch).dtype == dtype
        assert torch.addmm(b, x, w.t()).dtype == dtype
        assert torch.baddbmm(batch, batch, batch).dtype == dtype
        q = batch.unsqueeze(0)
        assert F.scaled_dot_product_attention(q, q, q).dtype == dtype
        low = x.to(dtype)
        assert torch.softmax(low, -1).dtype == torch.float32
        assert torch.softmax(low, -1, dtype=dtype).dtype == dtype  # an explicit dtype is the caller's
        assert F.log_softmax(low, -1).dtype == torch.float32
        assert F.layer_norm(low, (16,)).dtype == torch.float32
        assert F.group_norm(low.view(2, 4, 16), 2).dtype == torch.float32
        assert torch.exp(low).dtype == torch.float32 and torch.log(low.abs()).dtype == torch.float32
        assert low.pow(2).dtype == torch.float32
        assert low.sum().dtype == torch.float32 and low.sum(0).dtype == torch.float32
        assert low.cumsum(0).dtype == torch.float32
        assert F.mse_loss(low, low).dtype == torch.float32
        assert torch.cat([low, x]).dtype == torch.float32 and torch.stack([low, low]).dtype == dtype
        assert (low + low).dtype == dtype  # ops without a rule keep their dtypes
        cpu = _data(4, 4)
        assert (cpu @ cpu).dtype == torch.float32  # spyre's autocast leaves CPU tensors alone
    assert (x @ x.t()).dtype == torch.float32  # and nothing outside the region changes


def test_fp64_is_never_cast(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "0")  # (fp64 matmuls run through the CPU fallback)
    x = _data(8, 16).double().to("spyre")
    with torch.autocast("spyre", dtype=torch.float16):
        assert torch.mm(x, x.t()).dtype == torch.float64


def test_eager_results_match_cpu_autocast(eager):
    x, w, b = _data(32, 64), _data(48, 64, seed=1), _data(48, seed=2)
    with torch.autocast("cpu", dtype=torch.float16):
        ref = F.linear(x, w, b)
    with torch.autocast("spyre", dtype=torch.float16):
        out = F.linear(x.to("spyre"), w.to("spyre"), b.to("spyre"))
        soft = torch.softmax(out, -1)
    assert out.dtype == ref.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), ref, **LOWER_TOL[torch.float16])
    torch.testing.assert_close(soft.cpu(), torch.softmax(out.cpu().float(), -1), **FP32_TOL)


def test_autograd_through_autocast_gives_fp32_gradients(eager):
    lin = torch.nn.Linear(16, 8).to("spyre")
    x = _data(4, 16).to("spyre")
    with torch.autocast("spyre", dtype=torch.float16):
        y = lin(x)
    assert y.dtype == torch.float16
    y.float().backward(torch.ones(4, 8).to("spyre"))
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    torch.testing.assert_close(lin.bias.grad.cpu(), torch.full((8,), 4.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_inside_torch_compile_runs_in_spyre_programs(monkeypatch, dtype):
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    monkeypatch.setenv("SPYRE_STRICT", "1")
    torch._dynamo.reset()
    lin = torch.nn.Linear(64, 32)
    x = _data(16, 64, seed=4)
    lin_s, x_s = torch.nn.Linear(64, 32).to("spyre"), x.to("spyre")
    lin_s.load_state_dict(lin.state_dict())

    def f(layer, x):
        with torch.autocast(x.device.type, dtype=dtype):
            y = layer(x)
            return y, torch.softmax(y, -1), F.layer_norm(y, (32,))

    # (caches off: a graph served from Inductor's FX graph cache generates no kernels to record)
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        y, s, n = torch.compile(f)(lin_s, x_s)
    assert records and all(r.artifact is not None for r in records), records
    assert (y.dtype, s.dtype, n.dtype) == (dtype, torch.float32, torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        ref = lin(x)
    torch.testing.assert_close(y.detach().cpu(), ref.detach(), **LOWER_TOL[dtype])
    y32 = y.detach().cpu().float()
    torch.testing.assert_close(s.detach().cpu(), torch.softmax(y32, -1), **FP32_TOL)
    torch.testing.assert_close(n.detach().cpu(), F.layer_norm(y32, (32,)), **FP32_TOL)


def test_a_compiled_training_step_under_autocast_with_dropout(monkeypatch):
    # Parts of issue 19 together, under SPYRE_STRICT=1: autocast's casts, dropout's Philox mask,
    # cross_entropy in fp32, and the backward, all in spyre programs; gradients come back fp32.
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    monkeypatch.setenv("SPYRE_STRICT", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 8)).to("spyre")
    x, target = _data(16, 32, seed=5).to("spyre"), torch.arange(16).remainder(8).to("spyre")

    def step(x, target):
        with torch.autocast("spyre", dtype=torch.float16):
            logits = model(x)
            loss = F.cross_entropy(logits, target)
        return loss, logits.detach()

    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        loss, logits = torch.compile(step)(x, target)
        loss.backward(torch.tensor(1.0).to("spyre"))  # (backward's own ones_like would be an eager fill_)
    assert records and all(r.artifact is not None for r in records), records
    assert (logits.dtype, loss.dtype) == (torch.float16, torch.float32)
    for p in model.parameters():
        assert p.grad.dtype == torch.float32 and p.grad.cpu().isfinite().all()
    assert 0 < loss.item() < 10


def _cast_of(y, w):
    """The autograd node that cast `w` on the way to `y` (it leads to w's AccumulateGrad)."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if type(nxt).__name__ == "AccumulateGrad" and nxt.variable is w:
                return node
            todo.append(nxt)
    raise AssertionError("no cast of the weight in the graph")


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_a_weight_used_twice_in_one_region_is_cast_once(eager, cache_enabled):
    # As CUDA's: autocast's cache of casted weights (fp32 leaves that require grad) holds for one
    # region, and torch.autocast clears it when the region exits.
    w = torch.nn.Parameter(_data(8, 16).to("spyre"))
    x = _data(4, 16)
    xs = x.to("spyre")
    with torch.autocast("spyre", dtype=torch.float16, cache_enabled=cache_enabled):
        y1, y2 = F.linear(xs, w), F.linear(xs * 2, w)
    with torch.autocast("spyre", dtype=torch.float16, cache_enabled=cache_enabled):
        y3 = F.linear(xs, w)
    one, two, three = (_cast_of(y, w) for y in (y1, y2, y3))
    assert (one is two) == cache_enabled and one is not three
    # the gradient reaches the weight through the one cast from both uses
    (y1.float().sum() + y2.float().sum()).backward()
    torch.testing.assert_close(w.grad.cpu(), (3 * x.half().float().sum(0)).expand(8, 16), **LOWER_TOL[torch.float16])
