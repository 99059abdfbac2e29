"""`spyre-inspect trace | report | diff | clean`: a run as a trace on two labelled clocks (the
card's simulated one, the host's), a per-kernel perf report of it (text and one HTML page), what
changed between two kernels, and the artifacts nothing will load again removed."""

from __future__ import annotations

import html.parser
import json
import os
import time
from pathlib import Path

import pytest

from spyre_inductor.inspect import clean, report
from spyre_inductor.inspect.cli import main

SCRIPT = """
import sys, torch
n = int(sys.argv[1])
x = torch.randn(64, 128, device="spyre"); w = torch.randn(128, 64, device="spyre")
torch.spyre.synchronize()
f = torch.compile(lambda x, w: torch.softmax(x @ w, -1))
for _ in range(n):
    y = f(x, w)
print("ran", n)
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("traced")
    script = root / "script.py"
    script.write_text(SCRIPT)
    out = root / "trace.json"
    assert main(["trace", "-o", str(out), str(script), "3"]) == 0
    return root, json.loads(out.read_text()), out


def test_trace_has_the_device_on_its_simulated_clock_and_the_host_on_its_own(traced):
    _, trace, _ = traced
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {"spyre:0 (simulated clock)", "host (wall clock)", "spyre:0 cores (simulated clock)"} <= processes
    kernels = trace["spyreKernels"]
    mm = [k for k in kernels if k["name"].startswith("spyre_mm")]
    assert len(mm) == 3 and all(k["simulated_us"] > 0 and k["host_us"] > 0 for k in mm)
    # each launch's per-unit activity sits inside its span on the compute pipeline
    first = mm[0]
    spans = [e for e in events if e.get("cat") == first["name"] and e.get("ph") == "X"]
    assert spans and {e["name"] for e in spans} >= {"load", "matmul"}
    assert all(first["sim_start_us"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= first["sim_end_us"] + 1e-3
               for e in spans[:50])
    units = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert {"core 0 ls", "core 0 pe", "core 0 sfp", "pipeline compute"} <= units


def test_report_tables_each_kernel_and_sums_to_the_runs_device_time(traced, capsys, tmp_path):
    _, trace, path = traced
    kernels, summary = report.lines(trace["spyreKernels"])
    assert summary.launches == len(trace["spyreKernels"])
    assert summary.device_us == pytest.approx(sum(k.device_us for k in kernels))
    assert [k.device_us for k in kernels] == sorted((k.device_us for k in kernels), reverse=True)
    mm = next(k for k in kernels if k.name.startswith("spyre_mm"))
    assert mm.launches == 3 and 0 < mm.memory_pct <= 100 and mm.bound in ("memory", "pe", "sfp", "ring", "latency")
    page = tmp_path / "report.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["kernel", "launches", "device"] and mm.name in out
    assert f"{summary.launches} launches of {summary.kernels} kernels" in out

    class Tags(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.count: dict = {}

        def handle_starttag(self, tag, attrs):
            self.count[tag] = self.count.get(tag, 0) + 1

    tags = Tags()
    tags.feed(page.read_text())
    assert tags.count["tr"] == 1 + len(kernels)  # a row per kernel under the header
    assert tags.count["svg"] >= 2  # the timeline and at least one kernel's plan, inline
    text = page.read_text()
    assert "<script" not in text and "<link" not in text and 'src="' not in text  # one self-contained file


def test_report_runs_a_script_itself(traced, capsys):
    root, _, _ = traced
    assert main(["report", "--top", "1", "--steps", "2", str(root / "script.py"), "2"]) == 0  # (options before SCRIPT)
    out = capsys.readouterr().out
    assert "; per step of 2: " in out and " launches, " in out
    assert "ran 2" in out and "more kernels)" in out
    assert len([line for line in out.splitlines() if line.startswith("spyre_")]) == 1


def test_report_refuses_a_json_that_is_not_a_trace(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    assert main(["report", str(bad)]) == 2
    assert "not a spyre-inspect trace" in capsys.readouterr().err


def test_diff_shows_what_changed_between_two_kernels(traced, capsys):
    _, trace, _ = traced
    names = sorted({k["name"] for k in trace["spyreKernels"]})
    mm = next(n for n in names if n.startswith("spyre_mm"))
    red = next(n for n in names if n.startswith("spyre_red"))
    assert main(["diff", mm, red]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"--- {mm} (matmul") and f"+++ {red} (reduction" in out
    assert "plan: " in out and "line(s) differ" in out and "\n-kernel " in out
    code = main(["diff", mm, mm])
    same = capsys.readouterr()
    assert code == 0, same.err
    assert "plan: the same" in same.out


def _aged(path: Path, hours: float) -> Path:
    t = time.time() - hours * 3600
    os.utime(path, (t, t))
    return path


def test_clean_removes_only_what_nothing_loads_again(tmp_path):
    root = tmp_path / "cache"
    (root / "spyre" / "v-now" / "kept").mkdir(parents=True)
    (root / "spyre" / "v-old" / "a").mkdir(parents=True)
    (root / "spyre" / "v-old" / "a" / "program.json").write_text("x" * 100)
    _aged(root / "spyre" / "v-old", 2)  # another checkout's compiler, unused for two hours
    _mk(root / "spyre" / "v-other" / "b")  # another checkout's, in use a minute ago: kept
    _aged(_mk(root / "spyre" / "v-now" / ".tmp-half"), 2)
    _mk(root / "tmpold" / "spyre")
    _aged(root / "tmpold", 2)  # (the per-compile directory's own time is what counts)
    _mk(root / "tmpnew" / "spyre")  # a compile of a minute ago: maybe still loading
    _aged(_mk(root / "tmpforeign"), 2)  # no spyre artifacts: not ours
    (root / "fxgraph").mkdir()
    found = {r.path.relative_to(root).as_posix() for r in clean.candidates(root, "v-now", 3600)}
    assert found == {"spyre/v-old", "spyre/v-now/.tmp-half", "tmpold"}
    everything = {r.path.relative_to(root).as_posix() for r in clean.candidates(root, "v-now", 3600, True)}
    assert everything == found | {"spyre/v-now", "fxgraph"}
    freed = clean.remove(clean.candidates(root, "v-now", 3600))
    assert freed >= 100 and not (root / "spyre" / "v-old").exists() and (root / "spyre" / "v-now" / "kept").exists()
    assert (root / "tmpnew").exists() and (root / "tmpforeign").exists() and (root / "spyre" / "v-other").exists()


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
