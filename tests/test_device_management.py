"""torch.spyre and torch.accelerator agree on devices, properties and capability."""

import pytest
import torch


def test_accelerator_is_spyre():
    assert torch.accelerator.current_accelerator() == torch.device("spyre")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.spyre.device_count() == 3  # tests/conftest.py


def test_set_device_through_either_api():
    assert torch.spyre.current_device() == 0
    torch.spyre.set_device(1)
    try:
        assert torch.accelerator.current_device_index() == 1
        assert torch.empty(1, device="spyre").device == torch.device("spyre", 1)
    finally:
        torch.accelerator.set_device_index(0)
    assert torch.spyre.current_device() == 0


def test_device_context_manager_restores():
    with torch.spyre.device(1):
        assert torch.spyre.current_device() == 1
        assert torch.zeros(1, device="spyre").device.index == 1
    assert torch.spyre.current_device() == 0
    with torch.spyre.device("spyre:1"):
        assert torch.spyre.current_device() == 1


def test_bad_device_index_names_the_limit():
    with pytest.raises(IndexError, match="device index 5 is out of range; there are 3"):
        torch.spyre.set_device(5)
    with pytest.raises(IndexError, match="device index 7 is out of range"):
        torch.empty(1, device="spyre:7")
    with pytest.raises(ValueError, match="expected a spyre device"):
        torch.spyre.set_device("cpu")
    assert torch.empty(1, device="spyre").device.index == 0


def test_properties_come_from_the_hardware_config():
    props = torch.spyre.get_device_properties(0)
    assert props.cores == 32
    assert props.stick_bytes == 128
    assert props.scratchpad_bytes == 2 * 1024 * 1024
    assert props.total_memory == 128 * 2**30
    assert "Spyre" in torch.spyre.get_device_name()


def test_device_capability():
    cap = torch.accelerator.get_device_capability(torch.device("spyre", 0))
    assert torch.float16 in cap["supported_dtypes"]
    assert torch.bfloat16 in cap["supported_dtypes"]
    assert torch.spyre.get_device_capability() == cap


def test_synchronize_forms():
    torch.spyre.synchronize()
    torch.spyre.synchronize(1)
    torch.spyre.synchronize("spyre:0")
    torch.accelerator.synchronize()


def test_amp_dtypes_and_autocast_enters():
    assert torch.spyre.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    a = torch.ones(2, 2, device="spyre")
    with torch.autocast("spyre", dtype=torch.float16):
        # spyre's cast rules (device/autocast.py; tests/test_autocast.py): a matmul runs in fp16.
        assert (a @ a).dtype == torch.float16
