"""Shared set-up: two simulated devices, so multi-device behaviour is testable.

SPYRE_NUM_DEVICES is read once, when the device registers (on `import torch`
through autoload), so it is set here before anything imports torch.
"""

import os
import subprocess
import sys
import threading

os.environ.setdefault("SPYRE_NUM_DEVICES", "2")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def spyre():
    return torch.device("spyre", 0)


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
