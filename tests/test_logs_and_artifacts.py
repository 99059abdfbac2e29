"""What PyTorch's own switches show of spyre: TORCH_LOGS="spyre" (each kernel planned, its
division and why; CPU fallbacks with their reasons), "+spyre" (every eager fallback),
"output_code" (each kernel's plan brief and program head beside the wrapper, as Inductor
shows Triton source), TORCH_COMPILE_DEBUG (the artifacts in its debug directory) and
SPYRE_ARTIFACTS=dir (a run's kernels under their names, for spyre-inspect)."""

from __future__ import annotations

import pytest
from conftest import run_python

COMPILE = """
import torch
x = torch.randn(64, 64, device="spyre")
f = torch.compile(lambda x: torch.softmax(x @ x, -1))
print(torch.allclose(f(x).cpu(), torch.softmax(x.cpu() @ x.cpu(), -1), atol=1e-5))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One compile with every switch on (each test reads its part): the logs, the output code,
    TORCH_COMPILE_DEBUG's directory and SPYRE_ARTIFACTS' collection."""
    root = tmp_path_factory.mktemp("switches")
    done = run_python(COMPILE, TORCH_LOGS="spyre,output_code", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
                      TORCH_COMPILE_DEBUG="1", TORCH_COMPILE_DEBUG_DIR=str(root / "debug"),
                      SPYRE_ARTIFACTS=str(root / "artifacts"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("True")
    return done, root


def test_torch_logs_spyre_names_each_kernel_its_division_and_why(run):
    done, _ = run
    assert "planned for aten.mm.default: kernel spyre_mm" in done.stderr
    assert "division: " in done.stderr and "kept: " in done.stderr and "candidate(s)" in done.stderr


def test_torch_logs_plus_spyre_names_eager_fallbacks():
    code = "import torch\nx = torch.randn(4, 4, device='spyre')\nprint(float(torch.linalg.det(x)))"
    done = run_python(code, TORCH_LOGS="+spyre")
    assert done.returncode == 0, done.stderr
    assert "eager CPU fallback: aten::_linalg_det" in done.stderr


def test_output_code_shows_each_kernels_plan_and_program_beside_the_wrapper(run):
    out = run[0].stderr
    assert "#   kernel spyre_mm" in out and "#   division:" in out
    assert "#   program, core 0" in out and "matmul" in out
    assert "launch_jobplan(spyre_plan_" in out


def test_torch_compile_debug_keeps_the_artifacts_in_its_directory(run):
    debug = run[1] / "debug"
    kept = sorted(p.parent.name for p in debug.rglob("spyre/*/launch_spec.json"))
    assert any(name.startswith("spyre_mm") for name in kept), kept
    assert any(name.startswith("spyre_red") for name in kept), kept


def test_spyre_artifacts_collects_a_runs_kernels_by_name_for_spyre_inspect(run):
    collected = run[1] / "artifacts"
    names = sorted(p.name for p in collected.iterdir())
    assert any(n.startswith("spyre_mm") for n in names) and all((collected / n / "launch_spec.json").exists()
                                                                for n in names)
    listed = run_python(f"from spyre_inductor.inspect.cli import main; main(['list', {str(collected)!r}])")
    assert listed.returncode == 0, listed.stderr
    assert f"{len(names)} of {len(names)} kernels" in listed.stdout
