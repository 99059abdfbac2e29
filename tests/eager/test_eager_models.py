"""Models run eagerly on spyre: forward, autograd and SGD steps match the CPU, under SPYRE_STRICT=1
(every op of forward, backward and the optimizer step a spyre program). Weights are initialized
on the CPU and moved (random fills on the device are another branch's)."""

import copy

import pytest
import torch
import torch.nn.functional as F


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4))


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _train(model, x, y, steps, loss_fn):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def test_mlp_sgd_steps_match_the_cpu(spyre, strict):
    cpu_model = _mlp()
    spyre_model = copy.deepcopy(cpu_model).to(spyre)
    torch.manual_seed(1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    cpu_losses = _train(cpu_model, x, y, 4, F.mse_loss)
    spyre_losses = _train(spyre_model, x.to(spyre), y.to(spyre), 4, F.mse_loss)
    # fp32 throughout; a few steps of matmuls whose sums run in another order than the CPU's
    torch.testing.assert_close(torch.stack([l.cpu() for l in spyre_losses]), torch.stack(cpu_losses),
                               rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(cpu_model.named_parameters(), spyre_model.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=1e-5, atol=1e-5, msg=name)
    assert cpu_losses[-1] < cpu_losses[0]


def test_classifier_with_cross_entropy_trains_like_the_cpu(spyre):
    cpu_model = _mlp()
    spyre_model = copy.deepcopy(cpu_model).to(spyre)
    torch.manual_seed(2)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    cpu_losses = _train(cpu_model, x, y, 3, F.cross_entropy)
    spyre_losses = _train(spyre_model, x.to(spyre), y.to(spyre), 3, F.cross_entropy)
    torch.testing.assert_close(torch.stack([l.cpu() for l in spyre_losses]), torch.stack(cpu_losses),
                               rtol=1e-5, atol=1e-5)


def test_classifier_with_cross_entropy_under_strict_mode(spyre, strict):
    # nll_loss_backward runs pointwise (eager/decompositions.py), not as a scatter at an index
    # computed on chip
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).to(spyre)
    torch.manual_seed(2)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    losses = _train(model, x.to(spyre), y.to(spyre), 2, F.cross_entropy)
    torch.testing.assert_close(torch.stack([l.cpu() for l in losses]),
                               torch.stack(_train(cpu_model, x, y, 2, F.cross_entropy)), rtol=1e-5, atol=1e-5)


def test_mlp_inference_smoke_under_strict_mode(spyre, strict):
    model = _mlp()
    x = torch.randn(5, 16)
    expected = model(x)
    spyre_model = copy.deepcopy(model).to(spyre)
    with torch.no_grad():
        got = spyre_model(x.to(spyre))
        probs = torch.softmax(got, -1)
        top = probs.argmax(-1)
    torch.testing.assert_close(got.cpu(), expected.detach(), rtol=1.3e-6, atol=1e-5)
    assert torch.equal(top.cpu(), expected.argmax(-1))


def test_greedy_decoding_host_ops_under_strict_mode(spyre, strict):
    """What a generation loop calls between forwards: argmax over logits, isin against stop
    tokens, cat of the new ids, where, comparisons, all/any. The forward here is a stand-in (a
    linear head over an embedding); every op of the loop is a spyre program."""
    torch.manual_seed(3)
    vocab, dim = 32, 16
    emb, head = torch.randn(vocab, dim), torch.randn(vocab, dim)
    ids = torch.tensor([[1, 5, 7], [2, 3, 4]])
    stop = torch.tensor([0, 9])

    def step(ids, emb, head, stop, finished):
        logits = F.linear(F.embedding(ids[:, -1], emb), head)
        nxt = logits.argmax(-1)
        nxt = torch.where(finished, torch.zeros_like(nxt), nxt)
        finished = finished | torch.isin(nxt, stop)
        return torch.cat([ids, nxt[:, None]], dim=1), finished

    cpu = (ids, torch.zeros(2, dtype=torch.bool))
    dev = (ids.to(spyre), torch.zeros(2, dtype=torch.bool).to(spyre))
    for _ in range(4):
        cpu = step(cpu[0], emb, head, stop, cpu[1])
        dev = step(dev[0], emb.to(spyre), head.to(spyre), stop.to(spyre), dev[1])
        assert bool(dev[1].all()) == bool(cpu[1].all()) and bool((dev[0] > 0).any()) == bool((cpu[0] > 0).any())
    assert torch.equal(dev[0].cpu(), cpu[0]) and torch.equal(dev[1].cpu(), cpu[1])
