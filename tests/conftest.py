"""Shared set-up: two simulated devices, so multi-device behaviour is testable.

SPYRE_NUM_DEVICES is read once, when the device registers (on `import torch`
through autoload), so it is set here before anything imports torch.
"""

import os
import subprocess
import sys

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
