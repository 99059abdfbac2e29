"""Artifacts across processes: reused without planning, checked, and rebuilt when they went bad.

A compiled kernel is an artifact directory under Inductor's cache dir
(``<cache_dir>/spyre/<compiler version>/<hash of the kernel IR>``). What a
second process compiling the same function does:

- with Inductor's FX graph cache on (the default), the graph is a cache hit:
  the cached wrapper module is loaded and its first lines call
  ``prepare_kernel(<artifact dir>)``; our compiler does not run at all;
- with it off, Inductor compiles the graph again and our compile_kernel finds
  each kernel's directory, checks it and reuses it: nothing is planned.

The launch spec records the size and sha256 of the files the launch layer
reads (program.json, execution_plan.json) and the program's format, so a
truncated, altered or other-format file is found by hashing, without decoding
the program. ``prepare_kernel`` refuses such an artifact with an
``ArtifactError`` (a ValueError) naming the file and what is wrong, before
allocating anything; ``compile_kernel`` runs the same cheap check on every
reuse and rebuilds a bad directory in place, warning once why.

A cached graph whose artifact went bad recovers too: ArtifactError is also an
OSError, and Inductor treats an OSError while loading a cached module as a
cache miss: it compiles the graph again, which rebuilds the artifact at the
same path, so the cache entry is good again for the next process.

(The AOTAutograd cache, on by default, is built on the FX graph cache: with
``fx_graph_cache = False`` it is bypassed too. Note that the environment
variable TORCHINDUCTOR_FX_GRAPH_CACHE overrides the config setting.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from compiler.pointwise_ir import binary_kernel
from spyre_inductor.compiler import backend
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime.artifact import ArtifactError, check_artifact_files
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel

# ---- two processes --------------------------------------------------------------------------

# One process: compile a pointwise chain feeding a row reduction and a matmul, check it
# against the CPU, save the result, and report what the compilers did.
_CHILD = """
import json, os, warnings
import torch
from torch._dynamo.utils import counters
from spyre_inductor.compiler import backend

if os.environ["FX_CACHE"] == "0":
    torch._inductor.config.fx_graph_cache = False

def fn(x, w):
    y = torch.relu(x * 2 + 1)
    return y @ w, y.sum(dim=1)

g = torch.Generator().manual_seed(0)
x, w = torch.randn(64, 128, generator=g), torch.randn(128, 64, generator=g)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = torch.compile(fn)(x.to("spyre"), w.to("spyre"))
for o, r in zip(out, fn(x, w)):
    torch.testing.assert_close(o.cpu(), r, rtol=1e-4, atol=1e-4)
torch.save([o.cpu() for o in out], os.environ["RESULT"])
print(json.dumps({"stats": dict(backend.artifact_stats), "fx": dict(counters["inductor"]),
                  "aot": dict(counters["aot_autograd"]),
                  "rebuilt": [str(m.message) for m in caught if "rebuilt the corrupt artifact" in str(m.message)]}))
"""


def _compile_in_a_process(cache_dir: Path, result: Path, fx_cache: bool) -> dict:
    """Run _CHILD in a fresh interpreter on `cache_dir`. The FX graph cache is on by default and
    turned off as a user would (config.fx_graph_cache = False): no TORCHINDUCTOR_* variable is
    passed on (TORCHINDUCTOR_FX_GRAPH_CACHE would override the config)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), FX_CACHE=str(int(fx_cache)), RESULT=str(result),
               SPYRE_STRICT="1")
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["result"] = torch.load(result)
    return report


@pytest.fixture(scope="module")
def first_process(tmp_path_factory):
    """One process compiled the function into a cache dir (FX graph cache on: the dir holds both
    the FX graph entry and our artifacts); a snapshot of the dir and that process's report."""
    root = tmp_path_factory.mktemp("first")
    report = _compile_in_a_process(root / "cache", root / "result.pt", fx_cache=True)
    assert report["stats"].get("planned", 0) >= 2  # (the matmul and the reduction, at least)
    assert report["fx"].get("fxgraph_cache_miss") == 1
    shutil.copytree(root / "cache", root / "snapshot")
    return root, report


def _copy(first_process, tmp_path) -> tuple[Path, dict]:
    """The cache dir as the first process left it, at the path it used: a cached wrapper module
    names its artifact directories by absolute path (a copy elsewhere would still read the
    originals)."""
    root, report = first_process
    shutil.rmtree(root / "cache")
    shutil.copytree(root / "snapshot", root / "cache")
    return root / "cache", report


def _artifacts(cache: Path) -> list[Path]:
    found = sorted(p.parent for p in cache.glob("spyre/*/*/launch_spec.json"))
    assert found
    return found


def test_a_second_process_with_the_fx_graph_cache_loads_the_cached_graph_and_plans_nothing(first_process, tmp_path):
    cache, first = _copy(first_process, tmp_path)
    second = _compile_in_a_process(cache, tmp_path / "result.pt", fx_cache=True)
    assert second["fx"] == {"fxgraph_cache_hit": 1}
    assert second["stats"] == {}  # our compiler did not run: the cached module prepares the artifacts
    for a, b in zip(first["result"], second["result"]):
        assert torch.equal(a, b)


def test_a_second_process_without_the_fx_graph_cache_reuses_every_artifact_without_planning(first_process, tmp_path):
    cache, first = _copy(first_process, tmp_path)
    second = _compile_in_a_process(cache, tmp_path / "result.pt", fx_cache=False)
    assert second["stats"] == {"reused": first["stats"]["planned"]}  # checked and reused: none planned
    for a, b in zip(first["result"], second["result"]):
        assert torch.equal(a, b)


# One process without strict mode: a graph with a CPU kernel (a scan whose combine is not an
# add: not a program), run twice; what warned, and what the fallback reports counted.
_CPU_KERNEL_CHILD = """
import json, warnings
import torch
from torch._dynamo.utils import counters

x = torch.arange(64.0).reshape(4, 16) / 64
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = torch.compile(lambda a: torch.logcumsumexp(a, 1) * 2)
    f(x.to("spyre")), f(x.to("spyre"))
torch.spyre.synchronize()
print(json.dumps({"fx": dict(counters["inductor"]),
                  "warned": [str(m.message) for m in caught if "spyre" in str(m.message)],
                  "reports": [[r.kind, r.name, r.ops, r.calls] for r in torch.spyre.fallback_reports()]}))
"""


def test_a_graph_with_a_cpu_kernel_loaded_from_the_cache_warns_at_its_first_run_and_counts_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), SPYRE_STRICT="0")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CPU_KERNEL_CHILD], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["fx"].get("fxgraph_cache_miss") == 1 and second["fx"] == {"fxgraph_cache_hit": 1}
    for run in runs:  # the second compiled nothing, and still says what runs on the CPU, once
        (warning,) = run["warned"]
        assert re.search(r"aten\.logcumsumexp\.default cannot be compiled for spyre yet \(.*\).*as its kernel "
                         r"spyre_cpu_kernel_\d+", warning), warning
        (report,) = run["reports"]
        assert report[0] == "kernel" and report[1] in warning and report[2] == "aten.logcumsumexp.default"
        assert report[3] == 2


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2
    data[i] = ord("7") if data[i] != ord("7") else ord("8")
    path.write_bytes(bytes(data))


def test_an_artifact_corrupted_between_processes_is_rebuilt_by_a_compile_without_the_fx_graph_cache(
        first_process, tmp_path):
    cache, first = _copy(first_process, tmp_path)
    for d in _artifacts(cache):
        _flip_a_byte(d / "program.json")
    second = _compile_in_a_process(cache, tmp_path / "result.pt", fx_cache=False)
    n = first["stats"]["planned"]
    assert second["stats"] == {"planned": n, "rebuilt": n}
    assert len(second["rebuilt"]) == n and all("program.json: checksum mismatch" in m for m in second["rebuilt"])
    for a, b in zip(first["result"], second["result"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("harm", ["altered", "deleted"])
def test_a_cached_graph_whose_artifacts_went_bad_compiles_again_and_the_cache_entry_recovers(
        first_process, tmp_path, harm):
    """The FX cache hit loads the cached module; its prepare_kernel raises ArtifactError, an
    OSError, which Inductor takes for a cache miss: it compiles the graph, and our compile_kernel
    rebuilds each artifact at the same path, the one the cached module names, so the cache entry
    is good again for the next process (which then hits, as in the first test). The same when
    the artifacts are gone (``<cache dir>/spyre`` deleted, the FX graph entries kept)."""
    cache, first = _copy(first_process, tmp_path)
    artifacts = _artifacts(cache)
    for d in artifacts:
        if harm == "altered":
            _flip_a_byte(d / "program.json")
    if harm == "deleted":
        shutil.rmtree(cache / "spyre")
    second = _compile_in_a_process(cache, tmp_path / "result.pt", fx_cache=True)
    n = first["stats"]["planned"]
    assert second["stats"] == ({"planned": n, "rebuilt": n} if harm == "altered" else {"planned": n})
    assert "fxgraph_cache_hit" not in second["fx"] and second["fx"].get("fxgraph_cache_miss")
    assert _artifacts(cache) == artifacts
    for d in artifacts:
        check_artifact_files(d)
    for a, b in zip(first["result"], second["result"]):
        assert torch.equal(a, b)


# ---- one artifact gone bad: what prepare_kernel says, and a compile rebuilds it -------------


SHAPE = (64, 40)


def _kernel():
    return binary_kernel("add", SHAPE, "fp32")


def _record(d: Path, name: str, **changes) -> None:
    """Rewrite the launch spec's record of `name` as the writer would have (after an edit of it)."""
    spec = json.loads((d / "launch_spec.json").read_text())
    data = (d / name).read_bytes()
    spec["files"][name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), **changes)
    (d / "launch_spec.json").write_text(json.dumps(spec))


def _truncate(path: Path) -> int:
    n = path.stat().st_size
    path.write_bytes(path.read_bytes()[: n // 2])
    return n


def _set_json(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def _program_of_another_format(d: Path) -> None:
    """As a writer of program format 2 would leave it: the header and the spec's record agree."""
    doc = json.loads((d / "program.json").read_text())
    doc["header"]["version"] = 2
    (d / "program.json").write_text(json.dumps(doc))
    _record(d, "program.json", format=2)


def _spec(d):
    return re.escape(str(d / "launch_spec.json"))


def _prog(d):
    return re.escape(str(d / "program.json"))


def _plan(d):
    return re.escape(str(d / "execution_plan.json"))


# (what happened to the artifact, how, what prepare_kernel says: a regex given the directory)
BAD = {
    "program bytes altered": (lambda d: _flip_a_byte(d / "program.json"),
                              lambda d: rf"^{_prog(d)}: checksum mismatch: expected sha256 [0-9a-f]{{16}}\.\.\., "
                                        rf"found [0-9a-f]{{16}}\.\.\. \(the file was altered\)$"),
    "program truncated": (lambda d: _truncate(d / "program.json"),
                          lambda d: rf"^{_prog(d)}: truncated: expected (\d+) bytes, got (\d+)$"),
    "execution plan truncated": (lambda d: _truncate(d / "execution_plan.json"),
                                 lambda d: rf"^{_plan(d)}: truncated: expected \d+ bytes, got \d+$"),
    "launch spec truncated": (lambda d: _truncate(d / "launch_spec.json"),
                              lambda d: rf"^{_spec(d)}: not valid JSON, truncated or corrupt \(\d+ bytes; .+: "
                                        rf"byte \d+\)$"),
    "launch spec not text": (lambda d: (d / "launch_spec.json").write_bytes(b'{"format": \xff\xfe}'),
                             lambda d: rf"^{_spec(d)}: not valid JSON, corrupt \(14 bytes; not UTF-8 text: byte 11\)$"),
    "launch spec of another format": (lambda d: _set_json(d / "launch_spec.json", format=1),
                                      lambda d: rf"^{_spec(d)}: launch spec format 1; this runtime reads format 2$"),
    "program of another format": (_program_of_another_format,
                                  lambda d: rf"^{_prog(d)}: program format 2; this runtime reads format 1$"),
    "execution plan of another format": (lambda d: (_set_json(d / "execution_plan.json", format=7),
                                                    _record(d, "execution_plan.json")),
                                         lambda d: rf"^{_plan(d)}: execution plan format 7; this runtime reads "
                                                   rf"format 2$"),
    "program missing": (lambda d: (d / "program.json").unlink(),
                        lambda d: rf"^{re.escape(str(d))} is not a complete spyre artifact: {_prog(d)} is missing$"),
    "launch spec missing": (lambda d: (d / "launch_spec.json").unlink(),
                            lambda d: rf"^{re.escape(str(d))} is not a complete spyre artifact: {_spec(d)} is "
                                      rf"missing$"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_prepare_kernel_names_the_bad_file_and_what_is_wrong_and_allocates_nothing(tmp_path, what):
    corrupt, message = BAD[what]
    d = compile_kernel(_kernel(), tmp_path)
    corrupt(d)
    before = torch.spyre.memory_allocated()
    with pytest.raises(ValueError, match=message(d)) as raised:
        prepare_kernel(d)
    assert isinstance(raised.value, ArtifactError)
    assert torch.spyre.memory_allocated() == before
    if what == "program truncated":
        full, got = map(int, re.search(message(d), str(raised.value)).groups())
        assert got == full // 2


@pytest.mark.parametrize("what", list(BAD))
def test_a_compile_rebuilds_a_bad_artifact_in_place_warning_once_why(tmp_path, what):
    corrupt, message = BAD[what]
    d = compile_kernel(_kernel(), tmp_path)
    corrupt(d)
    stats = backend.artifact_stats.copy()
    with pytest.warns(RuntimeWarning, match="rebuilt the corrupt artifact") as caught:
        assert compile_kernel(_kernel(), tmp_path) == d
    assert len(caught) == 1 and str(d) in str(caught[0].message)
    assert backend.artifact_stats - stats == {"planned": 1, "rebuilt": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_kernel(_kernel(), tmp_path) == d  # intact now: reused, no warning
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]  # no staging or set-aside leftovers
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    out = torch.empty(SHAPE, device="spyre")
    launch_jobplan(prepare_kernel(d), [x.to("spyre"), y.to("spyre"), out])
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)


def test_an_intact_artifact_is_reused_without_planning(tmp_path):
    stats = backend.artifact_stats.copy()
    d = compile_kernel(_kernel(), tmp_path)
    assert compile_kernel(_kernel(), tmp_path) == d
    assert backend.artifact_stats - stats == {"planned": 1, "reused": 1}


def test_artifact_error_is_a_value_error_and_an_os_error():
    """A ValueError for callers of prepare_kernel; an OSError so that Inductor's FX graph cache
    takes a cached module that fails to load for a miss (codecache.cache_hit_post_compile)."""
    assert issubclass(ArtifactError, ValueError) and issubclass(ArtifactError, OSError)
    assert str(ArtifactError("/x/program.json: truncated")) == "/x/program.json: truncated"


def test_concurrent_compiles_of_a_corrupt_artifact_all_end_with_an_intact_one(tmp_path):
    """Rename-based: each compile writes its own staging directory; the bad directory is renamed
    aside, then a good one renamed in; a compile whose rename loses finds the winner's intact."""
    from conftest import run_in_threads

    d = compile_kernel(_kernel(), tmp_path)
    _flip_a_byte(d / "program.json")
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_in_threads(lambda k: results.append(compile_kernel(_kernel(), tmp_path)), 3)
    assert results == [d] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]
    prepare_kernel(d)
