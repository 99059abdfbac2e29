"""The compiled kernels of a directory, and naming one of them.

A kernel's artifact directory (compiler/core/emit.py) is complete once it has launch_spec.json;
anything else under the directory is skipped. By default the directories are where this
compiler version writes (Inductor's cache dir, and the per-compile ones Inductor makes with its
caches off), so `spyre-inspect list` after a run shows that run's kernels, newest first.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from spyre_inductor.compiler.core.emit import SOURCES


class KernelNotFound(LookupError):
    pass


@dataclass(frozen=True)
class KernelArtifact:
    path: Path
    name: str
    compiler: str
    mtime: float

    @cached_property
    def plan(self) -> dict:
        return json.loads((self.path / "plan.json").read_text())

    @property
    def family(self) -> str:
        return self.plan.get("family", "?")

    @property
    def sources(self) -> tuple[str, ...]:
        f = self.path / SOURCES
        return tuple(line for line in f.read_text().splitlines() if line) if f.exists() else ()

    def program(self):
        from spyre_runtime.program.program import Program

        return Program.load(self.path / "program.json")

    def text(self, name: str) -> str:
        return (self.path / name).read_text()


def default_directory() -> Path:
    from spyre_inductor.compiler.inductor.scheduling import artifact_root

    return artifact_root()


def default_roots() -> list[Path]:
    """Where this compiler version's artifacts are: its root in Inductor's cache, and the same
    under each per-compile cache directory Inductor made with its caches off (a compile with
    force_disable_caches, as the demo and the benchmarks run, writes there)."""
    main = default_directory()
    cache_root, tail = main.parents[1], main.relative_to(main.parents[1])
    return [main] + sorted(d / tail for d in cache_root.glob("tmp*") if (d / tail).is_dir())


def kernels(directory: str | Path | None = None) -> list[KernelArtifact]:
    """Every complete kernel artifact under `directory` (default: default_roots()), newest first;
    a kernel compiled again into another directory is listed once, its newest."""
    roots = [Path(directory)] if directory is not None else default_roots()
    for root in roots[:1]:
        if not root.is_dir():
            if directory is None:
                return []
            raise FileNotFoundError(f"spyre-inspect: {str(root)!r} is not a directory")
    found = []
    for root in roots:
        found += _scan(root)
    newest: dict = {}
    for k in sorted(found, key=lambda k: -k.mtime):
        newest.setdefault(k.name, k)
    return sorted(newest.values(), key=lambda k: (-k.mtime, k.name))


def _scan(root: Path) -> list[KernelArtifact]:
    found = []
    for spec in root.rglob("launch_spec.json"):
        if spec.parent.name.startswith("."):
            continue  # (a compile's staging directory, renamed into place once whole)
        try:
            meta = json.loads(spec.read_text())
            mtime = spec.stat().st_mtime
            found.append(KernelArtifact(spec.parent, meta["kernel"], meta.get("compiler", "?"), mtime))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # (renamed away meanwhile, or damaged: not a kernel to show)
    return found


def find_kernel(query: str, directory: str | Path | None = None) -> KernelArtifact:
    """The kernel `query` names: an artifact directory, a kernel name, or a unique prefix of one."""
    path = Path(query)
    if (path / "launch_spec.json").exists():
        meta = json.loads((path / "launch_spec.json").read_text())
        return KernelArtifact(path, meta["kernel"], meta.get("compiler", "?"), (path / "launch_spec.json").stat().st_mtime)
    everything = kernels(directory)
    exact = [k for k in everything if k.name == query]
    if exact:
        return exact[0]
    names = sorted({k.name for k in everything if k.name.startswith(query)})
    if len(names) == 1:
        return next(k for k in everything if k.name == names[0])
    where = directory if directory is not None else default_directory()
    if names:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise KernelNotFound(f"{query!r} is a prefix of {len(names)} kernels in {where}: {shown}")
    close = difflib.get_close_matches(query, sorted({k.name for k in everything}), n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise KernelNotFound(f"no kernel named {query!r} in {where} ({len(everything)} kernels){hint}")
