"""`make demo` in a reduced size: the Llama-style model compiled under strict, checked against the
CPU, traced and reported; the trace, the HTML report and the top kernels' plans written out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_reports_its_run_and_writes_the_trace_and_report(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--quick", "--layers", "1", "--prefill",
                           "16", "--steps", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "no CPU fallback" in text and "the same as the fp32 CPU model's" in text
    assert "launches of" in text and "device us" in text and "spyre-inspect show spyre_attn" in text
    trace = json.loads((out / "trace.json").read_text())
    assert trace["spyreKernels"] and any(k["name"].startswith("spyre_attn") for k in trace["spyreKernels"])
    page = (out / "report.html").read_text()
    assert page.count("<svg") >= 2 and "<table>" in page
    assert list(out.glob("*.svg"))
    assert "1/2" in done.stderr and "2/2" in done.stderr  # the progress bar of prefill and decode


def test_the_demo_says_what_its_options_are():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    for option in ("--layers", "--d", "--prefill", "--steps", "--out", "--quick"):
        assert option in done.stdout
