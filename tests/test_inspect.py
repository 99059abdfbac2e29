"""`spyre-inspect` (spyre_inductor/inspect): every compiled kernel can be listed with its cost,
read per core and unit, and explained (its plan, its division's candidates, a picture of its
scratchpad map), by name, unique prefix or directory, with close matches for a wrong name."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.inspect import KernelNotFound, cost_of, find_kernel, kernels
from spyre_inductor.inspect.cli import main

FAMILIES = {  # a graph whose kernel each family plans
    "pointwise": lambda x, w, q, k, v, img, f: x * 2 + 1,
    "reduction": lambda x, w, q, k, v, img, f: x.sum(-1),
    "matmul": lambda x, w, q, k, v, img, f: x @ w,
    "attention": lambda x, w, q, k, v, img, f: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "conv": lambda x, w, q, k, v, img, f: F.conv2d(img, f, padding=1),
    "sort": lambda x, w, q, k, v, img, f: torch.topk(x, 4, dim=-1).values,
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, monkeypatch_module):
    """{family: its kernel's artifact}, each copied into one directory of their own."""
    monkeypatch_module.setenv("SPYRE_STRICT", "1")
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(64, 128, generator=g), torch.randn(128, 64, generator=g),
            *(torch.randn(1, 2, 64, 64, generator=g) for _ in range(3)),
            torch.randn(1, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g)]
    args = [a.to("spyre") for a in args]
    root = tmp_path_factory.mktemp("artifacts")
    found = {}
    for family, fn in FAMILIES.items():
        torch._dynamo.reset()
        with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            torch.compile(fn)(*args)
        programs = [r for r in records if r.artifact is not None]
        assert programs, f"{family}: nothing compiled"
        r = programs[-1]
        found[family] = (r, shutil.copytree(r.artifact, root / r.artifact.name, dirs_exist_ok=True))
    torch._dynamo.reset()
    return root, found


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_kernel_with_its_family_ops_and_cost(artifacts, capsys):
    root, found = artifacts
    code, out, _ = _run(capsys, "list", root)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["kernel", "family", "aten", "ops"]
    for family, (record, path) in found.items():
        row = next(line for line in lines if line.startswith(record.kernel.name))
        kernel = find_kernel(record.kernel.name, root)
        cost = cost_of(kernel.program())
        assert kernel.family in row.split()  # (the conv and sort kernels: their own families)
        assert record.ops.split(",")[0][:20] in row  # the aten ops it came from
        assert f"{cost.efficiency:.3g}" in row and cost.bound in row
        assert 0 < cost.efficiency <= 1 and cost.simulated_us >= cost.roofline_us > 0
    assert f"{len(found)} of {len(found)} kernels" in out


def test_show_reads_one_core_and_one_unit_with_the_placeholders_named(artifacts, capsys):
    root, found = artifacts
    name = found["attention"][0].kernel.name
    code, out, _ = _run(capsys, "show", name, "--dir", root, "--core", 0, "--unit", "pe")
    assert code == 0
    assert "correction area:" in out and "address of q" in out  # the slots the launch patches
    assert "core 0 " in out and "core 1 " not in out
    assert "[pe]" in out and "matmul" in out and "[ls]" not in out and "[sfp]" not in out
    code, whole, _ = _run(capsys, "show", found["attention"][1])  # by its directory
    assert code == 0 and "[ls]" in whole and "[sfp]" in whole and "queues:" in whole


def test_plan_explains_the_division_and_draws_the_scratchpad_map(artifacts, capsys, tmp_path):
    root, found = artifacts
    for family, (record, _) in found.items():
        svg = tmp_path / f"{family}.svg"
        code, out, _ = _run(capsys, "plan", record.kernel.name[:-4], "--dir", root, "--svg", svg)  # a prefix
        assert code == 0, family
        assert f"kernel {record.kernel.name}" in out and "scratchpad:" in out and "division" in out
        assert "cost:" in out and "efficiency" in out
        tree = ET.parse(svg).getroot()
        tiles = [g for g in tree.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "tile"]
        assert tiles, family  # a box per scratchpad allocation
        plan = find_kernel(record.kernel.name, root).plan
        assert len(tiles) == len(plan["scratchpad"]["allocations"])
        candidates = plan["division"].get("candidates") or []
        if len(candidates) > 1:
            assert out.count(" ns  ") == len(candidates) and "\n  * " in out  # the kept one marked


def test_a_wrong_name_is_refused_with_close_matches(artifacts, capsys):
    root, found = artifacts
    name = found["matmul"][0].kernel.name
    code, _, err = _run(capsys, "show", name[:6] + "x" + name[7:], "--dir", root)
    assert code == 2 and f"close matches: {name}" in err
    code, _, err = _run(capsys, "plan", "spyre_", "--dir", root)
    assert code == 2 and f"is a prefix of {len(found)} kernels" in err
    with pytest.raises(KernelNotFound, match="no kernel named 'nothing_like_it'"):
        find_kernel("nothing_like_it", root)
    code, _, err = _run(capsys, "list", root / "missing")
    assert code == 2 and "is not a directory" in err


def test_the_command_runs_as_a_module(artifacts):
    root, _ = artifacts
    done = subprocess.run([sys.executable, "-m", "spyre_inductor.inspect", "list", str(root), "--last", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2 of 6 kernels" in done.stdout and len(kernels(root)) == 6
