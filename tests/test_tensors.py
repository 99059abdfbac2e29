"""Creating, copying, viewing and reading spyre tensors behaves as on CPU."""

import copy
import io

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_factories_match_cpu(spyre, dtype):
    for factory in (torch.zeros, torch.ones, torch.empty):
        t = factory(2, 3, device=spyre, dtype=dtype)
        assert (t.device, t.dtype, t.shape) == (spyre, dtype, (2, 3))
    assert torch.equal(torch.zeros(2, 3, device=spyre, dtype=dtype).cpu(), torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(torch.ones(2, 3, device=spyre, dtype=dtype).cpu(), torch.ones(2, 3, dtype=dtype))
    assert torch.equal(torch.full((4,), 1, device=spyre, dtype=dtype).cpu(), torch.full((4,), 1, dtype=dtype))


def test_arange_and_tensor_literal(spyre):
    assert torch.equal(torch.arange(10, device=spyre).cpu(), torch.arange(10))
    assert torch.equal(torch.arange(1.0, 2.0, 0.25, device=spyre).cpu(), torch.arange(1.0, 2.0, 0.25))
    assert torch.equal(torch.tensor([[1, 2], [3, 4]], device=spyre).cpu(), torch.tensor([[1, 2], [3, 4]]))


@pytest.mark.parametrize("factory", [torch.rand, torch.randn])
def test_random_factories_are_reproducible(spyre, factory):
    torch.spyre.manual_seed(1234)
    a = factory(64, device=spyre).cpu()
    torch.spyre.manual_seed(1234)
    b = factory(64, device=spyre).cpu()
    assert torch.equal(a, b)
    assert not torch.equal(a, factory(64, device=spyre).cpu())
    # (The device generator is Philox in spyre programs, not the CPU's Mersenne Twister:
    # tests/test_random.py.)


def test_torch_manual_seed_seeds_spyre(spyre):
    torch.manual_seed(7)
    a = torch.randint(0, 100, (16,), device=spyre).cpu()
    torch.manual_seed(7)
    assert torch.equal(a, torch.randint(0, 100, (16,), device=spyre).cpu())


def test_explicit_spyre_generator(spyre):
    g = torch.Generator(device="spyre").manual_seed(3)
    assert g.device == spyre
    a = torch.rand(8, device=spyre, generator=g).cpu()
    b = torch.rand(8, device=spyre, generator=torch.Generator(device="spyre").manual_seed(3)).cpu()
    assert torch.equal(a, b)
    # Drawing advanced the generator's own state, not the default one's.
    assert not torch.equal(torch.rand(8, device=spyre, generator=g).cpu(), a)


def test_rng_state_round_trip(spyre):
    state = torch.spyre.get_rng_state()
    a = torch.randn(5, device=spyre).cpu()
    torch.spyre.set_rng_state(state)
    assert torch.equal(torch.randn(5, device=spyre).cpu(), a)
    assert torch.spyre.initial_seed() == torch.spyre.default_generators[0].initial_seed()


def test_round_trip_to_device_and_back(spyre):
    x = torch.randn(5, 7)
    assert torch.equal(x.to("spyre").cpu(), x)
    assert torch.equal(x.spyre().cpu(), x)
    back = x.to(spyre, non_blocking=True).to("cpu", non_blocking=True)
    torch.spyre.synchronize()  # as on CUDA, a non-blocking copy is only safe to read after a sync
    assert torch.equal(back, x)
    assert x.spyre().is_spyre and not x.is_spyre


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_copy_non_contiguous_both_sides_with_dtype_change(spyre, direction):
    src_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    src = src_cpu if direction == "h2d" else src_cpu.to(spyre)
    dst_device = "cpu" if direction == "d2h" else spyre
    # Non-contiguous source (transpose + slice) into a non-contiguous destination.
    src_view = src.t()[1:5:2]
    dst = torch.zeros(6, 4, dtype=torch.float16, device=dst_device).t()[:, 0:2]
    dst.copy_(src_view.t())
    expected = torch.zeros(6, 4, dtype=torch.float16).t()[:, 0:2].copy_(src_cpu.t()[1:5:2].t())
    assert torch.equal(dst.cpu(), expected)


def test_views_share_storage(spyre):
    x = torch.zeros(4, 6, device=spyre)
    views = [
        x.view(24), x.reshape(6, 4), x.t(), x.permute(1, 0), x[1:, 2:4],
        x.expand(2, 4, 6), torch.as_strided(x, (3,), (7,), 1),
    ]
    for v in views:
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x.view(24)[7] = 5.0
    assert x[1, 1].item() == 5.0
    assert torch.as_strided(x, (3,), (7,), 1)[1].item() == 0.0
    x.t()[3, 2] = 9.0
    assert x.cpu()[2, 3] == 9.0


def test_as_strided_offset_is_absolute_in_the_storage(spyre):
    x = torch.arange(10.0, device=spyre)
    tail = x[4:]
    assert torch.equal(torch.as_strided(tail, (2,), (1,), 1).cpu(), torch.tensor([1.0, 2.0]))


def test_item_and_scalars(spyre):
    assert torch.tensor(3.5, device=spyre).item() == 3.5
    assert torch.tensor([7], device=spyre, dtype=torch.int64).item() == 7
    assert torch.tensor(True, device=spyre).item() is True
    assert float(torch.ones(1, device=spyre) * 2) == 2.0


def test_print_shows_values_and_device(spyre, recwarn):
    text = repr(torch.arange(3, device=spyre))
    assert text == "tensor([0, 1, 2], device='spyre:0')"
    assert "device='spyre:0'" in str(torch.randn(2, 2, device=spyre))
    assert "1.5000" in str(torch.tensor([1.5, float("nan")], device=spyre))


def test_untyped_storage_on_device(spyre):
    s = torch.UntypedStorage(256, device="spyre")
    assert s.device == spyre and s.nbytes() == 256
    s.resize_(512)
    assert s.nbytes() == 512
    t = torch.empty(0, device=spyre).set_(s, 0, (4,), (1,))
    assert t.device == spyre


def test_storage_resize_keeps_contents(spyre):
    t = torch.arange(4.0, device=spyre)
    s = t.untyped_storage()
    s.resize_(32)
    assert torch.equal(torch.empty(0, device=spyre).set_(s, 0, (4,), (1,)).cpu(), torch.arange(4.0))


def test_deepcopy_is_a_separate_device_copy(spyre):
    x = torch.arange(6.0, device=spyre)
    y = copy.deepcopy(x)
    assert y.device == spyre and torch.equal(y.cpu(), x.cpu())
    y.add_(1)
    assert x[0].item() == 0.0


def test_save_then_load_to_spyre(spyre, tmp_path):
    x = torch.randn(3, 4, device=spyre)
    path = tmp_path / "x.pt"
    torch.save({"x": x, "cpu": x.cpu()}, path)
    loaded = torch.load(path, map_location="spyre")
    assert loaded["x"].device == spyre and loaded["cpu"].device == spyre
    assert torch.equal(loaded["x"].cpu(), x.cpu())
    assert torch.load(path)["x"].device == spyre
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    assert torch.load(buf, map_location="cpu").device.type == "cpu"


def test_resize_grows_on_device(spyre):
    x = torch.arange(3.0, device=spyre)
    x.resize_(10)
    assert x.shape == (10,) and x.device == spyre
    assert torch.equal(x[:3].cpu(), torch.arange(3.0))


def test_zero_size_and_scalar_tensors(spyre):
    e = torch.empty(0, 3, device=spyre)
    assert e.numel() == 0 and e.cpu().shape == (0, 3)
    assert torch.equal(e.sum(0).cpu(), torch.zeros(3))
    s = torch.tensor(2.0, device=spyre)
    assert s.dim() == 0 and torch.equal((s * s).cpu(), torch.tensor(4.0))


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_copy_between_shapes_broadcasts_or_raises_like_the_cpu(direction):
    # Same numel is not the same shape: (3, 2) <- (2, 3) must raise, not reinterpret the bytes.
    make = {"h2d": ("spyre", "cpu"), "d2h": ("cpu", "spyre"), "d2d": ("spyre", "spyre")}[direction]
    dst = torch.empty(3, 2, device=make[0])
    with pytest.raises(RuntimeError, match="cannot be broadcast|must match"):
        dst.copy_(torch.ones(2, 3, device=make[1]))
    row = torch.arange(4.0, device=make[1])
    wide = torch.empty(3, 4, device=make[0]).copy_(row)
    assert torch.equal(wide.cpu(), torch.arange(4.0).expand(3, 4))
