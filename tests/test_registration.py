"""The device exists under its own name, as soon as torch is imported."""

import torch

from conftest import run_python


def test_plain_import_torch_registers_spyre():
    result = run_python(
        "import sys, torch\n"
        "assert 'spyre_inductor' in sys.modules\n"
        # Autoload must not pull in Inductor: that is what makes it cheap (the first eager op,
        # compiled through Inductor, imports it).
        "assert 'torch._inductor.compile_fx' not in sys.modules\n"
        "print(torch.device('spyre').type, torch.spyre.is_available(), torch.ones(2, device='spyre').device)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["spyre", "True", "spyre:0"]


def test_import_spyre_inductor_registers_without_autoload():
    result = run_python(
        "import torch\nassert not hasattr(torch, 'spyre')\nimport spyre_inductor\nprint(torch.zeros(1, device='spyre').device)",
        TORCH_DEVICE_BACKEND_AUTOLOAD=0,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "spyre:0"


def test_privateuse1_is_renamed():
    assert torch._C._get_privateuse1_backend_name() == "spyre"
    assert torch.empty(1, device="spyre").is_spyre


def test_registration_is_idempotent():
    import spyre_inductor.device as device

    device.register()
    device.register()
    assert torch.spyre.device_count() == 3  # tests/conftest.py


def test_device_count_defaults_to_one():
    result = run_python("import torch; print(torch.spyre.device_count())", SPYRE_NUM_DEVICES=1)
    assert result.stdout.strip() == "1", result.stderr


def test_bad_device_count_names_the_variable():
    # A bad value warns and falls back to one device; `import torch` still works.
    result = run_python("import torch; print(torch.spyre.device_count())", SPYRE_NUM_DEVICES="many")
    assert result.returncode == 0, result.stderr
    assert "SPYRE_NUM_DEVICES='many'" in result.stderr and "using the default 1" in result.stderr
    assert result.stdout.split() == ["1"]


CUDA_NAMES = [
    "is_available", "device_count", "current_device", "set_device", "device",
    "get_device_name", "get_device_properties", "synchronize", "manual_seed",
    "manual_seed_all", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "memory_stats",
    "reset_peak_memory_stats", "empty_cache", "mem_get_info",
    "Stream", "Event", "stream", "current_stream", "default_stream", "set_stream",
]


def test_torch_spyre_mirrors_torch_cuda_names():
    missing = [n for n in CUDA_NAMES if not hasattr(torch.spyre, n)]
    assert not missing
    assert hasattr(torch.spyre, "get_amp_supported_dtype")  # autocast asks custom devices for it
    # Each of these exists on torch.cuda too, so habits carry over.
    assert all(hasattr(torch.cuda, n) for n in CUDA_NAMES)
