"""Shared set-up: three simulated devices, so multi-device behaviour is testable (devices 0 and 1;
device 2 is test_regions.py's alone: compiled eager ops keep their prepared programs on the
device they ran on while their cache entry lives, so only a device no test computes on stays
empty between tests).

SPYRE_NUM_DEVICES is read once, when the device registers (on `import torch`
through autoload), so it is set here before anything imports torch.
"""

import os
import subprocess
import sys
import threading

os.environ.setdefault("SPYRE_NUM_DEVICES", "3")

# The session's own Inductor cache (unless the caller chose one), removed when it ends: with its
# caches off Inductor keeps a directory per compile there (compile_fx.with_fresh_cache_if_config,
# on purpose), and many tests compile so; ours hold our artifacts too. A day of test runs then
# leaves nothing behind, and a session never removes another's (spyre-inspect clean tidies any
# other run's).
_SESSION_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    _SESSION_CACHE = tempfile.mkdtemp(prefix="spyre-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _SESSION_CACHE

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def spyre():
    return torch.device("spyre", 0)


@pytest.fixture
def fresh_cache():
    """The eager cache, empty, its capacity put back afterwards."""
    from spyre_inductor.eager.cache import CACHE

    capacity = CACHE.capacity
    CACHE.clear()
    yield CACHE
    CACHE.set_capacity(capacity)
    CACHE.clear()


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (for behaviour fixed at import time)."""
    full_env = {**os.environ, **{k: str(v) for k, v in env.items()}}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120
    )


def run_in_threads(fn, count: int, timeout: float = 60.0) -> None:
    """Run fn(0) .. fn(count - 1) on their own threads; re-raise the first failure."""
    errors = []

    def guarded(k):
        try:
            fn(k)
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


# The OpInfo tests' tiers (tests/eager/test_opinfo.py): fp32 and int64, first samples, by default;
# the other dtypes and the longer sample runs are marked slow here, at collection, because
# instantiate_device_type_tests generates the tests (one per op x dtype) where no decorator can
# mark them. (Here and not in a tests/eager/conftest.py: a second module named conftest would
# shadow this one for the `from conftest import ...` of the tests.)
_FAST_OPINFO_SUFFIXES = ("_float32", "_int64")  # spyre_inductor.testing.eager_opinfo.FAST_DTYPES


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects "slow"
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "test_opinfo.py" not in item.nodeid or not item.name.startswith("test_eager_matches_cpu"):
            continue
        if "_more_samples_" in item.name or not item.name.endswith(_FAST_OPINFO_SUFFIXES):
            item.add_marker(pytest.mark.slow)



def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        import shutil

        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
