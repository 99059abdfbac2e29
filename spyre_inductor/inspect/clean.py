"""`spyre-inspect clean`: the artifacts nothing will load again, removed.

Where they pile up: each compiler version writes under <Inductor cache>/spyre/<version>, and
with Inductor's caches off (force_disable_caches, as benchmarks and many tests compile) every
compile gets a temporary cache directory of its own under the cache root (Inductor's
with_fresh_cache_if_config), kept on purpose because its modules must outlive the compile; our
artifacts land in it with Inductor's own files.

Removed by default, once untouched for --older-than hours: artifact roots of other compiler
versions (the version is in Inductor's FX-graph cache key: only that version's cached graphs
refer to them, and another checkout sharing the cache may still use them, hence the age), our
half-written staging directories, and Inductor's per-compile temporary directories holding
spyre artifacts (a process loads them when it compiles, not later). `--all` also removes this
version's artifacts together with Inductor's FX-graph and AOT caches that refer to them.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Removal:
    path: Path
    nbytes: int
    why: str


def _size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:  # (removed meanwhile)
            pass
    return total


def candidates(cache_root: Path, version: str, older_than_s: float, everything: bool = False) -> list[Removal]:
    now = time.time()
    out = []
    spyre_root = cache_root / "spyre"
    if spyre_root.is_dir():
        for d in spyre_root.iterdir():
            # (its time changes with each artifact renamed into it: another checkout's compiler,
            # sharing this cache, may still be writing and loading its own)
            if d.is_dir() and d.name != version and now - d.stat().st_mtime > older_than_s:
                out.append(Removal(d, _size(d), "another compiler version's artifacts, unused for a while"))
        current = spyre_root / version
        if current.is_dir():
            for d in current.iterdir():
                if d.name.startswith((".tmp-", ".corrupt-")) and now - d.stat().st_mtime > older_than_s:
                    out.append(Removal(d, _size(d), "a half-written or set-aside artifact"))
            if everything:
                out.append(Removal(current, _size(current), "this compiler version's artifacts (--all)"))
    for d in cache_root.glob("tmp*"):
        if d.is_dir() and (d / "spyre").is_dir() and now - d.stat().st_mtime > older_than_s:
            out.append(Removal(d, _size(d), "a per-compile cache directory (Inductor's caches off)"))
    if everything:
        for name in ("fxgraph", "aotautograd"):
            d = cache_root / name
            if d.is_dir():
                out.append(Removal(d, _size(d), f"Inductor's {name} cache (refers to the artifacts)"))
    return out


def remove(removals: list[Removal]) -> int:
    freed = 0
    for r in removals:
        shutil.rmtree(r.path, ignore_errors=True)
        if not r.path.exists():
            freed += r.nbytes
    return freed
