"""The threaded stress test, run as long as asked: `.venv/bin/python benchmarks/stress.py --seconds 120`.

Several threads launch shared and their own compiled kernels, eager ops and copies, on the
default stream and on their own streams, and compare every result with the CPU
(tests/test_threaded_launches.py; the default suite runs it for 3 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the threads run (default 60)")
    args = parser.parse_args()
    env = {**os.environ, "SPYRE_STRESS_SECONDS": str(args.seconds)}
    test = "tests/test_threaded_launches.py::test_threads_launching_shared_and_own_kernels_match_the_cpu"
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:warnings", test], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
