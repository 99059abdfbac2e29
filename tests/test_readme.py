"""Every Python snippet of the README runs, in order, as a newcomer would paste them into one
session (with the few names the prose leaves to the reader defined first)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# What the prose around the snippets assumes the reader has: a spyre tensor `t`, a compiled function.
PRELUDE = """
import torch
t = torch.randn(32, 32, device="spyre")
compiled = torch.compile(lambda a: a * 2)
"""


def snippets() -> list[str]:
    text = README.read_text()
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M)
    return [textwrap.dedent(body) for _, body in blocks]


def test_the_readme_has_snippets_to_run():
    assert len(snippets()) >= 8


def test_every_readme_snippet_runs(tmp_path):
    parts = [PRELUDE] + [f"# ---- snippet {k}\n{code}\nprint('snippet {k} ran')\n" for k, code in enumerate(snippets())]
    script = tmp_path / "readme.py"
    script.write_text("\n".join(parts))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for k in range(len(snippets())):
        assert f"snippet {k} ran" in done.stdout
