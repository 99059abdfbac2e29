"""Every program the compiler writes for a corpus of kernels (golden_programs.py: every family,
symbolic sizes and eager ops included) is byte-identical to the one recorded in
golden_programs.json: what the launch layer reads of each artifact (the program, the execution
plan, the launch spec) hashes the same.

A restructuring of the compiler must keep this test passing unchanged. A change meant to change
programs bumps COMPILER_VERSION and rewrites the file (`python tests/compiler/golden_programs.py
--update`), and the diff of golden_programs.json shows which kernels it changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_every_program_of_the_corpus_is_byte_identical_to_the_recorded_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPYRE_STRICT", "TORCHINDUCTOR_"))}
    run = subprocess.run([sys.executable, str(HERE / "golden_programs.py"), "--json"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("JSON:"))[5:])
    want = json.loads((HERE / "golden_programs.json").read_text())
    assert sorted(got) == sorted(want), "the corpus's cases changed: rewrite the golden file"
    changed = [f"{case}: {kernel}: {want[case].get(kernel, 'not made before')[:16]} -> {digest[:16]}"
               for case in got for kernel, digest in got[case].items() if want[case].get(kernel) != digest]
    gone = [f"{case}: {kernel}" for case in want for kernel in want[case] if kernel not in got.get(case, {})]
    assert not changed and not gone, "programs changed:\n" + "\n".join(changed + [f"{g}: no longer made" for g in gone])
