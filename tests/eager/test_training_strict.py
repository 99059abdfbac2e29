"""A training step in eager under SPYRE_STRICT=1: every op of forward, loss, backward and the
optimizer step a spyre program, with the CPU's numbers.

What a step of transformers' models needed beyond the forward (each refused under strict before):
cross_entropy's backward (nll_loss_backward: eager/decompositions.py, pointwise), the embedding's
backward (embedding_dense_backward: a scatter-add at the loaded ids), the attention softmax's
backward (Inductor's fma: compiler/inductor/capture.py), and AdamW/Adam(fused=True)
(_fused_adamw_ / _fused_adam_: eager/fused_adam.py, one program per parameter).

fp32 throughout; errors are measured relative to each tensor's largest magnitude.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.testing import hf_training

# Relative to max|reference| of each tensor, fp32. What the tiny models measure (GPT-2, BERT,
# Llama; fused, foreach and single-tensor AdamW) is in the report of check_step; the bounds:
LOSS_TOL, GRAD_TOL, STEP_TOL, PARAM_TOL = 1e-6, 5e-6, 5e-7, 5e-7
NOISE = 1e-4
LR = 1e-3


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().cpu().double(), ref.detach().cpu().double()
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def to_device(model, device):
    model = model.to(device)
    # nn.Module.to unties shared parameters on spyre (torch._has_compatible_shallow_copy_type
    # is False between CPU and PrivateUse1 tensors, so _apply makes a new Parameter per module):
    # GPT-2's lm_head and wte, BERT's decoder and word embeddings come out as two parameters.
    # transformers' own tie_weights() ties them again. (A device-layer bug, reported.)
    model.tie_weights()
    return model


def train_step(model, inputs, device, **adamw):
    """One step: forward with labels (the model's own cross_entropy), backward, AdamW.
    (loss, {name: grad}, {name: parameter after the step})"""
    model = to_device(model, device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, **adamw)
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    opt.step()
    return loss.detach().cpu(), grads, {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def cpu_adamw(model, grads, **adamw):
    """The CPU's AdamW step from `model`'s weights with the gradients `grads`."""
    model = copy.deepcopy(model)
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    torch.optim.AdamW(model.parameters(), lr=LR, **adamw).step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_step(name, spyre, **adamw):
    """The step on spyre under strict against the CPU's. Returns the measured errors.

    * the loss, and every gradient relative to its largest magnitude, floored at NOISE times the
      model's largest gradient: a true gradient of 0 (an attention's key bias, which softmax
      cancels) is rounding noise of ~1e-9 on both devices, with no scale of its own;
    * every parameter after the step within STEP_TOL of the CPU's AdamW applied to spyre's
      gradients (the optimizer alone, same inputs);
    * every parameter after the step within PARAM_TOL of the all-CPU step wherever its gradient
      is above NOISE times the model's largest, and within 2 lr elsewhere: Adam's first step
      moves an element by lr * g / (|g| + eps), so a gradient made of rounding noise becomes an
      update of up to lr in either direction, on the CPU as on spyre."""
    model, inputs = hf_training.build(name)
    start = copy.deepcopy(model)
    ref_loss, ref_grads, ref_params = train_step(copy.deepcopy(model), inputs, "cpu", **adamw)
    torch.spyre.reset_fallback_reports()
    loss, grads, params = train_step(model, inputs, spyre, **adamw)
    assert torch.spyre.fallback_reports() == []
    same_grads = cpu_adamw(start, grads, **adamw)
    floor = NOISE * max(g.abs().max().item() for g in ref_grads.values())
    errors = {"loss": rel_err(loss, ref_loss), "grad": 0.0, "step": 0.0, "param": 0.0}
    assert errors["loss"] <= LOSS_TOL, errors
    for n, g in ref_grads.items():
        err = (grads[n] - g).abs().max().item() / max(g.abs().max().item(), floor)
        errors["grad"] = max(errors["grad"], err)
        assert err <= GRAD_TOL, (n, err)
        err = rel_err(params[n], same_grads[n])
        errors["step"] = max(errors["step"], err)
        assert err <= STEP_TOL, (n, err)
        diff = (params[n] - ref_params[n]).abs()
        err = (diff * (g.abs() > floor)).max().item() / (ref_params[n].abs().max().item() or 1.0)
        errors["param"] = max(errors["param"], err)
        assert err <= PARAM_TOL, (n, err)
        assert diff.max().item() <= 2 * LR * (1 + 1e-5), n
    return errors


# ---- whole models ---------------------------------------------------------------------------

class TinyLM(torch.nn.Module):
    """What a language model's training step is made of, in few enough ops to compile in seconds:
    an embedding with a padding id, a layer norm, one softmax attention, a head tied to the
    embedding, and the model's own cross_entropy over labels with ignored positions."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim, padding_idx=0)
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def tie_weights(self):
        self.head.weight = self.emb.weight

    def forward(self, input_ids, labels):
        h = self.norm(self.emb(input_ids))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        logits = self.head(h)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return type("Output", (), {"loss": loss})


@pytest.mark.parametrize("strictness", ["1", "0"], ids=["strict", "lenient"])
def test_a_tiny_language_model_training_step_matches_the_cpu(strictness, spyre, monkeypatch):
    """The fast representative of the transformers models below (slow tier: each compiles its
    hundred-odd eager ops in a fresh process in half a minute or more)."""
    def build(name):
        torch.manual_seed(0)
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
        labels = ids.clone()
        labels[:, ::3] = -100
        return TinyLM().train(), {"input_ids": ids, "labels": labels}

    monkeypatch.setenv("SPYRE_STRICT", strictness)
    monkeypatch.setattr(hf_training, "build", build)
    check_step("tiny", spyre, fused=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
                                  "gemma3", "granite", "phi3", "mixtral", "gpt_oss"])
def test_training_step_with_fused_adamw_matches_the_cpu(name, spyre, strict):
    check_step(name, spyre, fused=True)


@pytest.mark.slow
@pytest.mark.parametrize("adamw", [dict(foreach=True), dict(foreach=False), {}], ids=["foreach", "single", "default"])
def test_training_step_with_each_adamw_flavour_matches_the_cpu(adamw, spyre, strict):
    check_step("llama", spyre, **adamw)


# ---- the losses -----------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("extra", [{}, dict(label_smoothing=0.1), dict(weight=True)], ids=["plain", "smoothing", "weight"])
def test_cross_entropy_and_its_backward_under_strict(reduction, extra, spyre, strict):
    torch.manual_seed(0)
    x, t = torch.randn(6, 10), torch.randint(0, 10, (6,))
    t[2] = -100  # ignored
    kw = dict(extra, reduction=reduction)
    if "weight" in kw:
        kw["weight"] = torch.rand(10)
    ref_x = x.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, t, **kw)
    ref.sum().backward()
    x_dev = x.to(spyre).requires_grad_()
    got = F.cross_entropy(x_dev, t.to(spyre), **{k: v.to(spyre) if isinstance(v, torch.Tensor) else v
                                                  for k, v in kw.items()})
    got.sum().backward()
    assert rel_err(got, ref) <= 1e-6
    assert rel_err(x_dev.grad, ref_x.grad) <= 1e-6
    assert torch.all(x_dev.grad.cpu()[2] == 0)


@pytest.mark.parametrize("reduction", [0, 1, 2], ids=["none", "mean", "sum"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_nll_loss_backward_is_the_cpus_bit_for_bit(reduction, ignore_index, spyre, strict):
    # the pointwise form computes the same products as the CPU kernel's scatter
    torch.manual_seed(1)
    logp = torch.randn(8, 12).log_softmax(-1)
    target = torch.tensor([3, 0, 11, -100, 3, 5, 7, 3]) if ignore_index == -100 else torch.tensor([3, 0, 11, 1, 3, 5, 7, 3])
    weight = torch.rand(12)
    out, total = torch.ops.aten.nll_loss_forward(logp, target, weight, reduction, ignore_index)
    grad = torch.randn(8) if reduction == 0 else torch.tensor(0.7)
    ref = torch.ops.aten.nll_loss_backward(grad, logp, target, weight, reduction, ignore_index, total)
    dev = lambda t: t.to(spyre)  # noqa: E731
    got = torch.ops.aten.nll_loss_backward(dev(grad), dev(logp), dev(target), dev(weight), reduction, ignore_index,
                                           dev(total))
    assert torch.equal(got.cpu(), ref)


def test_nll_loss_of_one_sample_without_a_batch_dim(spyre, strict):
    logp = torch.randn(7).log_softmax(-1).requires_grad_()
    ref = F.nll_loss(logp, torch.tensor(4))
    ref.backward()
    x = logp.detach().to(spyre).requires_grad_()
    got = F.nll_loss(x, torch.tensor(4).to(spyre))
    got.backward()
    assert rel_err(got, ref) == 0 and torch.equal(x.grad.cpu(), logp.grad)


# ---- embedding and softmax backward ---------------------------------------------------------

@pytest.mark.parametrize("padding_idx", [-1, 0, 5])
def test_embedding_backward_under_strict(padding_idx, spyre, strict):
    torch.manual_seed(2)
    ids = torch.randint(0, 9, (3, 7))
    ids[0, :3] = 5  # a repeated id accumulates
    ids[1, 0] = 0
    grad = torch.randn(3, 7, 4)
    ref = torch.ops.aten.embedding_dense_backward(grad, ids, 9, padding_idx, False)
    got = torch.ops.aten.embedding_dense_backward(grad.to(spyre), ids.to(spyre), 9, padding_idx, False)
    assert rel_err(got, ref) <= 1e-6
    if padding_idx >= 0:
        assert torch.all(got.cpu()[padding_idx] == 0)


def test_embedding_backward_of_ids_broadcast_over_the_batch(spyre, strict):
    # BERT's token_type_ids: one row expanded (stride 0) over the batch
    grad = torch.randn(3, 7, 4)
    ids = torch.tensor([[0, 1, 1, 0, 2, 2, 1]]).expand(3, 7)
    ref = torch.ops.aten.embedding_dense_backward(grad, ids, 3, -1, False)
    got = torch.ops.aten.embedding_dense_backward(grad.to(spyre), ids.to(spyre).expand(3, 7), 3, -1, False)
    assert rel_err(got, ref) <= 1e-6


@pytest.mark.parametrize("broadcast", [False, True])
def test_embedding_backward_scaled_by_frequency(broadcast, spyre, strict):
    torch.manual_seed(5)
    grad = torch.randn(2, 6, 4)
    ids = torch.tensor([[1, 3, 3, 0, 3, 2]]).expand(2, 6) if broadcast else torch.tensor([[1, 3, 3, 0, 3, 2],
                                                                                           [2, 2, 4, 1, 0, 0]])
    ref = torch.ops.aten.embedding_dense_backward(grad, ids, 5, 0, True)
    dev_ids = ids[:1].to(spyre).expand(2, 6) if broadcast else ids.to(spyre)
    got = torch.ops.aten.embedding_dense_backward(grad.to(spyre), dev_ids, 5, 0, True)
    assert rel_err(got, ref) <= 1e-6


def test_embedding_backward_with_an_index_outside_the_table_is_an_error_naming_the_op(spyre):
    # the CPU kernel skips it silently; a program's scatter stops at it (ids from a forward are in range)
    for bad in (9, -2):
        ids = torch.tensor([1, bad, 2])
        with pytest.raises(IndexError, match=rf"aten.embedding_dense_backward.default: index {bad} is out of bounds"):
            torch.ops.aten.embedding_dense_backward(torch.ones(3, 4).to(spyre), ids.to(spyre), 9, -1, False).cpu()
        torch.spyre.clear_errors()


def test_backward_of_rows_picked_by_ids_accumulates_repeated_ids_under_strict(spyre, strict):
    """x[ids]'s backward (autograd's _index_put_impl_ with accumulate): what a mixture-of-experts
    block's token gather needs in training."""
    x = torch.randn(6, 5)
    ids = torch.tensor([4, 0, 4, 2, 4])
    g = torch.randn(5, 5)
    xs = x.to(spyre).requires_grad_()
    xs[ids.to(spyre)].backward(g.to(spyre))
    xc = x.clone().requires_grad_()
    xc[ids].backward(g)
    assert rel_err(xs.grad, xc.grad) <= GRAD_TOL


def test_softmax_backward_under_strict(spyre, strict):
    torch.manual_seed(3)
    x = torch.randn(4, 5, 33).requires_grad_()
    g = torch.randn(4, 5, 33)
    torch.softmax(x, -1).backward(g)
    xd = x.detach().to(spyre).requires_grad_()
    torch.softmax(xd, -1).backward(g.to(spyre))
    assert rel_err(xd.grad, x.grad) <= 1e-6


# ---- the fused optimizers -------------------------------------------------------------------

def _params(device, dtype=torch.float32):
    torch.manual_seed(4)
    shapes = [(33, 17), (17,), (64, 64), ()]
    params = [torch.randn(s, dtype=dtype).to(device).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, dtype=dtype).to(device)
    return params


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam])
@pytest.mark.parametrize("options", [dict(), dict(amsgrad=True), dict(maximize=True, weight_decay=0.1),
                                     dict(betas=(0.3, 0.99), eps=1e-6, weight_decay=0.0)],
                         ids=["plain", "amsgrad", "maximize_wd", "small_beta1"])
def test_fused_adam_steps_match_the_cpus_fused_kernel(cls, options, spyre, strict):
    cpu, dev = _params("cpu"), _params(spyre)
    opts = [cls(ps, lr=1e-2, fused=True, **options) for ps in (cpu, dev)]
    for step in range(3):  # the bias corrections change with the step
        for o, ps in zip(opts, (cpu, dev)):
            o.step()
            for p in ps:  # a new gradient, the same on both
                p.grad.mul_(-0.5).add_(0.01 * step)
        for p, q in zip(cpu, dev):
            assert rel_err(q, p) <= 2e-7, (step, p.shape)
            assert rel_err(opts[1].state[q]["exp_avg_sq"], opts[0].state[p]["exp_avg_sq"]) <= 2e-7


def test_fused_adamw_takes_a_new_learning_rate_without_a_compile(spyre, strict, fresh_cache):
    params = _params(spyre)
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    compiles = fresh_cache.stats().compiles
    cpu = _params("cpu")
    ref = torch.optim.AdamW(cpu, lr=1e-2, fused=True)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    ref.step()
    ref_sched.step()
    opt.step()
    ref.step()
    assert fresh_cache.stats().compiles == compiles  # lr and step traveled as tensors
    for p, q in zip(cpu, params):
        assert rel_err(q, p) <= 2e-7


def test_fused_adamw_with_a_grad_scaler_skips_a_step_with_infs(spyre, strict):
    """grad_scale unscales the gradients in place; found_inf = 1 leaves everything as it was."""
    for found in (0.0, 1.0):
        cpu, dev = _params("cpu"), _params(spyre)
        outs = []
        for ps in (cpu, dev):
            o = torch.optim.AdamW(ps, lr=1e-2, fused=True)
            o.step()
            device = ps[0].device
            o.param_groups[0]["params"][0].grad.mul_(4.0)
            torch._fused_adamw_(ps, [p.grad for p in ps], [o.state[p]["exp_avg"] for p in ps],
                                [o.state[p]["exp_avg_sq"] for p in ps], [], [o.state[p]["step"] for p in ps],
                                lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
                                maximize=False, grad_scale=torch.tensor(4.0, device=device),
                                found_inf=torch.tensor(found, device=device))
            outs.append(ps)
        for p, q in zip(*outs):
            assert rel_err(q, p) <= 2e-7
            assert rel_err(q.grad, p.grad) <= 2e-7


def test_fused_adamw_in_half_precision_computes_in_fp32(spyre, strict):
    cpu, dev = _params("cpu", torch.bfloat16), _params(spyre, torch.bfloat16)
    for ps in (cpu, dev):
        torch.optim.AdamW(ps, lr=1e-2, fused=True).step()
    for p, q in zip(cpu, dev):
        # one rounding to bf16 of the same fp32 result; a last-bit difference at most
        assert rel_err(q, p) <= 2 ** -7


def test_fused_adamw_of_a_dtype_programs_do_not_compute_is_the_cpu_fallback(spyre, monkeypatch):
    cpu, dev = _params("cpu", torch.float64), _params(spyre, torch.float64)
    ref, opt = torch.optim.AdamW(cpu, lr=1e-2, fused=True), torch.optim.AdamW(dev, lr=1e-2, fused=True)
    ref.step()
    monkeypatch.setenv("SPYRE_STRICT", "0")
    opt.step()  # (the CPU fallback: warned once per op and process, maybe by an earlier test)
    for p, q in zip(cpu, dev):
        assert torch.equal(q.cpu(), p)
    monkeypatch.setenv("SPYRE_STRICT", "1")
    with pytest.raises(NotImplementedError, match="_fused_adamw_"):
        opt.step()


# ---- dropout --------------------------------------------------------------------------------

def test_dropout_in_train_mode_runs_on_the_card(spyre, strict):
    """Dropout draws from the device generator in a program: under strict, with p > 0, the
    training step runs, about p of the elements are dropped and the rest scaled by 1 / (1 - p)."""
    torch.spyre.reset_fallback_reports()
    x = torch.ones(64, 256, device=spyre, requires_grad=True)
    y = F.dropout(x, p=0.25, training=True)
    y.sum().backward()
    out = y.detach().cpu()
    kept = out != 0
    assert torch.all(out[kept] == 1 / 0.75)
    assert abs(kept.float().mean().item() - 0.75) < 0.02
    assert torch.equal(x.grad.cpu(), out)  # the backward scales by the same mask
    assert torch.spyre.fallback_reports() == []


@pytest.mark.slow
def test_gpt2_training_step_with_its_dropout_runs_on_the_card(spyre, strict):
    """transformers' GPT-2 with its default dropout (0.1 on embeddings, attention and residuals)
    in train mode: a strict step draws every mask on the card."""
    from spyre_inductor.testing import hf_models

    model, inputs = hf_models.build("gpt2")
    assert model.config.resid_pdrop > 0
    model = to_device(model, spyre).train()
    ids = inputs["input_ids"].to(spyre)
    torch.spyre.reset_fallback_reports()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    losses = [model(input_ids=ids, labels=ids).loss for _ in range(2)]  # two draws
    losses[0].backward()
    opt.step()
    assert torch.spyre.fallback_reports() == []
    a, b = (l.item() for l in losses)
    assert a == a and b == b and a != b  # finite, and the masks differ between draws

