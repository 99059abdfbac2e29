"""The backend registers itself on the first compile, not at `import torch`, and its version
reaches the FX graph cache key from the very first compile of a process."""

import subprocess
import sys

import torch

from conftest import run_python


def test_import_torch_does_not_import_inductor_or_the_compiler():
    result = run_python(
        "import sys, torch\n"
        "assert torch.device('spyre').type == 'spyre'\n"
        "loaded = [m for m in ('torch._inductor.scheduler', 'torch._inductor.codegen.common',\n"
        "          'spyre_inductor.compiler.inductor.registration') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        # Reading a name Inductor reads registers everything.
        "from spyre_inductor.compiler.inductor.scheduling import SpyreScheduling\n"
        "assert torch.spyre.Scheduling is SpyreScheduling\n"
        "from torch._inductor.codegen.common import get_scheduling_for_device, get_device_op_overrides\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "assert get_scheduling_for_device('spyre') is SpyreScheduling\n"
        "assert get_device_op_overrides('spyre').synchronize() == 'torch.spyre.synchronize()'\n"
        "assert get_interface_for_device('spyre').device_count() == torch.spyre.device_count()\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_all_four_inductor_names_exist():
    for name in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        assert getattr(torch.spyre, name, None) is not None, name
    assert "create" in vars(torch.spyre.PythonWrapperCodegen)  # else Inductor instantiates the base class
    assert not torch.spyre.CppWrapperCodegen  # spyre has no C++ wrapper (see wrapper.NoWrapper)


_CACHE_PROBE = """
import sys, torch
from torch._dynamo.utils import counters
import spyre_inductor.compiler.inductor.version as version
version.compiler_version = lambda: {version!r}
fn = lambda a: (a * 3).sigmoid() + 1
x = torch.randn(8, 32)
outcomes = []
for attempt in range({attempts}):
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(fn)(x.to("spyre"))
    torch.testing.assert_close(out.cpu(), fn(x))
    hit = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    miss = counters["inductor"]["fxgraph_cache_miss"]
    outcomes.append("hit" if hit and not miss else "miss" if miss and not hit else f"{{hit}}/{{miss}}")
from torch._inductor.codegen.common import custom_backend_passes
assert {version!r} in custom_backend_passes["spyre"].uuid()
print(" ".join(outcomes))
"""


def _probe(cache_dir, version: str, attempts: int = 1) -> subprocess.Popen:
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    import os

    return subprocess.Popen([sys.executable, "-c", _CACHE_PROBE.format(version=version, attempts=attempts)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _result(proc) -> list[str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.split()


def test_fx_graph_cache_key_includes_the_compiler_version(tmp_path):
    # The first compile of a process is the hard case: Inductor's own lazy
    # registration runs in the middle of computing that compile's cache key.
    assert _result(_probe(tmp_path, "version-a")) == ["miss"]
    same, other = _probe(tmp_path, "version-a"), _probe(tmp_path, "version-b", attempts=2)
    assert _result(same) == ["hit"]  # same compiler: its first compile is served from the cache
    assert _result(other) == ["miss", "hit"]  # another compiler misses, then caches its own entry


def test_the_cache_key_changes_with_the_compiler_config():
    # A graph compiled under max_cores=1 must never be served from the FX graph cache under
    # another setting: the config is part of the key Inductor hashes (the version pass's uuid).
    from spyre_inductor.compiler import config
    from spyre_inductor.compiler.inductor.registration import VERSION_PASS

    default = VERSION_PASS.uuid()
    with config.patch(max_cores=1):
        assert VERSION_PASS.uuid() != default
    assert VERSION_PASS.uuid() == default
