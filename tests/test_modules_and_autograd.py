"""Model-level habits: modules, state dicts, autograd, checkpointing, pinned loading."""

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.utils.data


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_module_to_spyre_moves_every_parameter(spyre):
    model = make_model().to("spyre")
    assert all(p.device == spyre for p in model.parameters())
    assert all(b.device == spyre for b in model.state_dict().values())


def test_forward_matches_cpu(spyre):
    model = make_model()
    x = torch.randn(5, 8)
    expected = model(x)
    got = model.to(spyre)(x.to(spyre))
    assert got.device == spyre
    torch.testing.assert_close(got.cpu(), expected)


def test_state_dict_round_trip_between_devices(spyre, tmp_path):
    model = make_model().to(spyre)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = make_model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(torch.load(path, map_location="cpu"))
    for (name, a), b in zip(fresh.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b.cpu()), name
    again = make_model().to(spyre)
    again.load_state_dict(torch.load(path, map_location="spyre"))
    assert next(again.parameters()).device == spyre


def test_autograd_through_the_fallback_gives_cpu_gradients(spyre):
    torch.manual_seed(1)
    x_cpu = torch.randn(4, 8, requires_grad=True)
    model = make_model()
    loss_cpu = model(x_cpu).pow(2).mean()
    loss_cpu.backward()
    grads_cpu = [p.grad.clone() for p in model.parameters()]

    model_s = make_model().to(spyre)
    x = x_cpu.detach().to(spyre).requires_grad_()
    loss = model_s(x).pow(2).mean()
    loss.backward()
    assert x.grad.device == spyre
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)
    for p, g in zip(model_s.parameters(), grads_cpu):
        assert p.grad.device == spyre
        torch.testing.assert_close(p.grad.cpu(), g)


def test_checkpoint_recomputes_on_spyre(spyre):
    x = torch.randn(6, device=spyre, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(lambda a: (a * a).sin(), x, use_reentrant=False)
    y.sum().backward()
    xc = x.detach().cpu()
    torch.testing.assert_close(x.grad.cpu(), torch.cos(xc * xc) * 2 * xc)


def test_optimizer_step_updates_in_place(spyre):
    model = make_model().to(spyre)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    model(torch.randn(3, 8, device=spyre)).sum().backward()
    opt.step()
    for p, b, in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), b - 0.1 * p.grad.cpu())


def test_cpu_pin_memory_while_spyre_is_the_accelerator():
    x = torch.randn(16)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert torch.equal(pinned, x)
    assert pinned[4:].is_pinned()  # views of pinned memory are pinned
    assert torch.empty(8, pin_memory=True).is_pinned()


def test_dataloader_with_pin_memory(spyre):
    data = torch.utils.data.TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    seen = 0
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        assert torch.equal(x.to(spyre, non_blocking=True).cpu(), x)
        seen += len(y)
    assert seen == 6


def test_convolution_forward_and_backward_match_cpu(spyre):
    # Convolution sends unknown devices to convolution_overrideable (and its
    # backward to convolution_backward_overrideable); spyre runs both as a patch
    # gather and matmuls in spyre programs (tests/compiler/test_conv2d.py).
    torch.manual_seed(2)
    conv = nn.Conv2d(3, 4, 3, padding=1, groups=1)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    conv(x).square().sum().backward()
    expected = [x.grad, conv.weight.grad, conv.bias.grad]

    conv_s = nn.Conv2d(3, 4, 3, padding=1).to(spyre)
    conv_s.load_state_dict(conv.state_dict())
    xs = x.detach().to(spyre).requires_grad_()
    conv_s(xs).square().sum().backward()
    for got, want in zip([xs.grad, conv_s.weight.grad, conv_s.bias.grad], expected):
        assert got.device == spyre
        torch.testing.assert_close(got.cpu(), want)


def test_mse_loss_reduces_into_a_scalar_out(spyre):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    got = nn.functional.mse_loss(a.to(spyre), b.to(spyre))
    assert got.device == spyre and got.shape == ()
    assert torch.equal(got.cpu(), nn.functional.mse_loss(a, b))
