"""Printing a spyre tensor (repr, str): the CPU's text and the device, under strict mode too, with nothing run on the card.

torch formats a tensor by running ops on it (isfinite, masked_select, abs, min,
max, ceil, an item per element...). The user called none of them: on spyre they
run on the CPU over the device's bytes (device/fallback.py: formatting_a_tensor),
so strict mode does not forbid them, no warning names them, and no eager op is
looked up, compiled or launched for them.
"""

import warnings

import pytest
import torch

from spyre_inductor.device.fallback import SpyreFallbackWarning

TENSORS = {
    "fp32": lambda: torch.randn(6, 5) * 100,
    "fp16": lambda: torch.randn(7).half(),
    "bf16": lambda: torch.randn(3, 4).bfloat16(),
    "int64": lambda: torch.randint(-1000, 1000, (4, 5)),
    "int32": lambda: torch.randint(-9, 9, (9,), dtype=torch.int32),
    "bool": lambda: torch.randn(2, 7) > 0,
    "0-d": lambda: torch.tensor(-2.5),
    "empty": lambda: torch.empty(0, 3),
    "large, summarized": lambda: torch.randn(40, 50),
    "non-contiguous": lambda: torch.randn(5, 6).t(),
    "a strided slice": lambda: torch.arange(60.0).reshape(6, 10)[::2, 1::3],
    "non-finite": lambda: torch.tensor([1.5, float("nan"), float("inf"), -float("inf"), 0.0]),
    "whole numbers": lambda: torch.tensor([1.0, -2.0, 300.0]),
    "scientific": lambda: torch.tensor([1e-8, 3.0, 1e9]),
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_printing_gives_the_cpus_text_under_strict_mode_running_nothing_on_the_card(spyre, name, monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")
    cpu = TENSORS[name]()
    t = cpu.to(spyre)
    torch.spyre.synchronize()
    before = torch.spyre.eager_cache_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpyreFallbackWarning)  # (no fallback warning either)
        text = repr(t)
        assert str(t) == text
    assert torch._tensor_str._tensor_str(cpu, len("tensor(")) in text  # the values as the CPU writes them
    assert "device='spyre:0'" in text
    after = torch.spyre.eager_cache_stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)  # no eager op was even looked up
