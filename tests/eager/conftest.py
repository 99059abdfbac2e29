"""The OpInfo tests' tiers: fp32 and int64 (the first samples) run by default; the other dtypes
and the longer sample runs are marked slow here, at collection, because instantiate_device_type_tests
generates the tests (one per op x dtype) where no decorator can mark them."""

import pytest

from spyre_inductor.testing.eager_opinfo import FAST_DTYPES

_FAST_SUFFIXES = tuple(f"_{str(d).removeprefix('torch.')}" for d in FAST_DTYPES)


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects "slow"
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "test_opinfo" not in item.nodeid:
            continue
        if "_more_samples_" in item.name or not item.name.endswith(_FAST_SUFFIXES):
            item.add_marker(pytest.mark.slow)
