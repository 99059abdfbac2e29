"""What each layer may know (../shared/DESIGN.md), pinned: one owner for each shared thing.

* program authoring (hand-written and calibration programs) lives in
  spyre_authoring, outside the simulator (spyre_runtime.program);
* one runtime per process and one pool of pinned staging buffers, which the
  PyTorch-facing device, the launch layer and torch.spyre's statistics share;
* one once-per-op warning record for the eager and the compiled CPU fallback.

(The queue layer's executor interface is pinned in test_queue_layer.py.)
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import pytest
import torch

from spyre_inductor.device import fallback, queues
from spyre_runtime.queue import runtime as runtime_module

ROOT = Path(__file__).resolve().parent.parent


# ---- program authoring -----------------------------------------------------------------


def test_the_authoring_modules_left_the_simulator():
    for name in ("handwritten", "calibration"):
        assert importlib.util.find_spec(f"spyre_runtime.program.{name}") is None
        assert not (ROOT / "spyre_runtime" / "program" / f"{name}.py").exists()
        assert importlib.util.find_spec(f"spyre_authoring.{name}") is not None
    import spyre_runtime.program as program

    assert not {"handwritten", "calibration"} & set(vars(program))


def test_authored_programs_build_and_run_through_the_launch_layer():
    from spyre_authoring.calibration import CALIBRATION, neg
    from spyre_authoring.handwritten import vector_add
    from spyre_runtime.direct import run_program

    assert CALIBRATION
    x = torch.randn(64, 64).half()
    torch.testing.assert_close(run_program(neg(64, 64, 2), x=x)["out"].cpu(), -x)
    x, y = torch.randn(300), torch.randn(300)
    torch.testing.assert_close(run_program(vector_add(300, "fp32"), x=x, y=y)["out"].cpu(), x + y)


def test_nothing_in_the_runtime_or_the_compiler_depends_on_authoring():
    imports = re.compile(r"^\s*(from|import)\s+spyre_authoring\b", re.M)
    for package in ("spyre_runtime", "spyre_inductor"):
        users = [p for p in (ROOT / package).rglob("*.py") if imports.search(p.read_text())]
        assert users == [], users


def test_the_authoring_package_is_packaged():
    text = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"^include\s*=\s*\[(.*)\]", text, re.M).group(1)
    assert '"spyre_authoring*"' in include


# ---- the artifact format ----------------------------------------------------------------


def test_the_artifact_format_imports_neither_torch_nor_the_extension(tmp_path):
    """The compiler reads the artifact format (spyre_runtime.artifact) instead of the launch
    layer: importing it, and checking an artifact's files with it, loads no torch and no _C."""
    from compiler.pointwise_ir import binary_kernel
    from conftest import run_python
    from spyre_inductor.compiler.backend import compile_kernel

    artifact_dir = compile_kernel(binary_kernel("add", (8, 64), "fp32"), tmp_path)
    r = run_python(
        "import sys\n"
        "from spyre_runtime.artifact import LAUNCH_FORMAT, check_artifact_files\n"
        f"spec = check_artifact_files({str(artifact_dir)!r})\n"
        "assert spec['format'] == LAUNCH_FORMAT\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m in "
        "('spyre_runtime._C', 'spyre_runtime.program', 'spyre_runtime.queue')))\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---- one runtime, one staging pool ------------------------------------------------------


def test_one_runtime_for_the_device_and_the_launch_layer():
    rt = queues.runtime()
    assert rt is runtime_module.current() is runtime_module.installed() is queues.install()
    with pytest.raises(RuntimeError, match="one per process"):
        runtime_module.set_current(object())
    assert queues.staging() is rt.staging


def test_copies_and_launches_draw_from_one_staging_pool(monkeypatch, tmp_path):
    from compiler.pointwise_ir import binary_kernel
    from spyre_inductor.compiler.backend import compile_kernel
    from spyre_runtime.launch import launch_jobplan
    from spyre_runtime.prepare import prepare_kernel

    pool = queues.staging()
    drawn = []
    acquire = pool.acquire

    def recording(nbytes, *args, **kwargs):
        drawn.append(nbytes)
        return acquire(nbytes, *args, **kwargs)

    monkeypatch.setattr(pool, "acquire", recording)
    shape = (8, 64)
    plan = prepare_kernel(compile_kernel(binary_kernel("add", shape, "fp32"), tmp_path))
    x, y = torch.randn(shape), torch.randn(shape)
    xs = torch.empty(shape, device="spyre")
    xs.copy_(x, non_blocking=True)  # pageable source: staged through the pool
    ys, out = y.to("spyre"), torch.empty(shape, device="spyre")
    launch_jobplan(plan, [xs, ys, out])  # its correction slots: staged through the pool
    torch.spyre.synchronize()
    torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    assert drawn[0] == x.numel() * 4 and len(drawn) >= 2  # the copy's, then the launch's
    stats = torch.spyre.memory_stats()
    assert stats["host_staging.buffers"] == pool.created >= 1
    assert stats["host_staging.bytes"] == pool.created_bytes
    assert torch.spyre.memory_stats(1)["host_staging.buffers"] == pool.created  # one pool for every device


# ---- one once-per-op warning record -----------------------------------------------------


@pytest.mark.parametrize("order", ["eager first", "compiled first"])
def test_an_op_warns_once_and_each_compiled_cpu_kernel_at_its_first_run(order):
    """A float64 multiply has neither an eager spyre program (aten::mul's compile-backed kernel
    declines float64 and runs it through the eager fallback) nor a compiled one (spyre kernels
    have no float64: the node is a CPU kernel inside the graph). The eager fallback warns once
    per op, unless a compiled kernel of the op already did; a compiled CPU kernel warns when it
    first runs, even if the op was warned about (it is another kernel running on the CPU)."""
    x = torch.randn(64, 32, dtype=torch.float64).to("spyre")
    torch._dynamo.reset()
    fallback.reset_warnings()
    with warnings.catch_warnings(record=True) as seen, torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("always")
        compiled = torch.compile(lambda a: a * 3)
        if order == "eager first":
            eager, graph = x * 3, compiled(x)
        else:
            graph, eager = compiled(x), x * 3
        compiled(x), x * 3  # (again: neither warns again)
    torch.testing.assert_close(graph.cpu(), eager.cpu(), rtol=0, atol=0)
    about_mul = [str(w.message) for w in seen if "mul" in str(w.message)]
    kernel = "cannot be compiled for spyre yet (arg0_1 has dtype torch.float64"
    if order == "eager first":
        # eager: aten::mul has a compile-backed kernel, which declines float64 (spyre_inductor/eager)
        assert len(about_mul) == 2 and "could not run as a spyre program" in about_mul[0], about_mul
        assert kernel in about_mul[1] and "as its kernel spyre_cpu_kernel_" in about_mul[1]
    else:
        assert len(about_mul) == 1 and kernel in about_mul[0], about_mul


def test_operator_names_are_one_op_whatever_the_overload():
    assert {fallback.operator_name(n) for n in ("aten.cos.default", "aten::cos.out", "aten::cos")} == {"aten::cos"}
    assert fallback.operator_name("aten::index.Tensor_out") == fallback.operator_name("aten.index.Tensor")
    assert fallback.operator_name("buf3") == "buf3"
    fallback.reset_warnings()
    assert fallback.first_warning(["aten::cos", "aten::sin"])
    assert not fallback.first_warning(["aten::sin"])
    assert fallback.first_warning(["aten::sin", "aten::tan"])  # one new op: warn
    fallback.reset_warnings()
