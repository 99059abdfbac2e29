"""An artifact's call.py runs from wherever the artifact is.

Each artifact directory carries a ``call.py``: the wrapper's call of the kernel
(prepare its program once, launch it with the arguments in launch-spec order),
for a person or a script to re-run the kernel outside the compiled graph. The
compiler writes an artifact into a staging directory (``.tmp-...``) and
renames it into place, so that a reader sees a whole artifact or none; call.py
used to name the staging directory, which no longer exists once the artifact
is in place, and failed ("... is not a complete spyre artifact"). It now
names its own directory, through ``__file__``, so it also survives the
artifact being moved or copied.
"""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import torch

from inductor_helpers import compile_on_spyre
from pointwise_ir import binary_kernel
from spyre_inductor.compiler.backend import compile_kernel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32,
          "int64": torch.int64, "int8": torch.int8, "bool": torch.bool}


def _arguments(artifact, seed=0):
    """CPU tensors for the artifact's launch-spec arguments, by name (inputs random, outputs zero)."""
    spec = json.loads((artifact / "launch_spec.json").read_text())
    g = torch.Generator().manual_seed(seed)
    args = {}
    for a in spec["args"]:
        dtype = DTYPES[a["dtype"]]
        t = torch.randn(a["shape"], generator=g).to(dtype) if a["role"] != "output" else \
            torch.zeros(a["shape"], dtype=dtype)
        assert list(t.stride()) == a["stride"]
        args[a["name"]] = t
    return args


def _run_call_py(artifact, args):
    """Run artifact/call.py as a script (its __file__ is that path) on spyre copies of `args`."""
    spyre = {name: t.to("spyre") for name, t in args.items()}
    runpy.run_path(str(artifact / "call.py"), init_globals=spyre)
    torch.spyre.synchronize()
    return {name: t.cpu() for name, t in spyre.items()}


def test_call_py_runs_from_the_artifacts_final_directory(tmp_path):
    root = tmp_path / "artifacts"
    artifact = compile_kernel(binary_kernel("add", (4, 64)), root)
    assert [p.name for p in root.iterdir()] == [artifact.name]  # the staging directory is gone
    assert ".tmp-" not in (artifact / "call.py").read_text()
    args = _arguments(artifact)
    out = _run_call_py(artifact, args)
    torch.testing.assert_close(out["out"], args["x"] + args["y"], rtol=0, atol=0)


def test_call_py_runs_after_the_artifact_is_moved(tmp_path):
    """Location-independent: a copied artifact directory prepares its own program, not the original's."""
    artifact = compile_kernel(binary_kernel("mul", (4, 64)), tmp_path / "artifacts")
    moved = Path(shutil.move(str(artifact), str(tmp_path / "elsewhere")))
    args = _arguments(moved, seed=1)
    out = _run_call_py(moved, args)
    torch.testing.assert_close(out["out"], args["x"] * args["y"], rtol=0, atol=0)


def test_call_py_of_a_compiled_graphs_artifact_runs_from_inductors_cache():
    """The artifact torch.compile put under Inductor's cache dir: its call.py re-runs the kernel."""
    fn = lambda a: torch.sigmoid(a) * 2.5 - 1.5  # noqa: E731
    _, _, records, _, _ = compile_on_spyre(fn, torch.randn(8, 64))
    [record] = [r for r in records if r.artifact is not None]
    artifact = record.artifact
    assert artifact.is_dir() and not artifact.name.startswith(".tmp-")
    spec = json.loads((artifact / "launch_spec.json").read_text())
    [x] = [a["name"] for a in spec["args"] if a["role"] == "input"]
    [y] = [a["name"] for a in spec["args"] if a["role"] == "output"]
    args = _arguments(artifact, seed=2)
    out = _run_call_py(artifact, args)
    torch.testing.assert_close(out[y], fn(args[x]), rtol=1.3e-6, atol=1e-5)  # fp32 (test_compiled_pointwise)
