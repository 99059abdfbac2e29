"""compile_kernel: one Kernel (ir/kernel_ir.py) -> one planned, verified program in an artifact directory.

The family that claims the kernel (core/family.py, families/<name>/) plans it on the planner
core (core/: tiles, allocation, the candidate search against the timing model, keep/validate),
then core/emit.py writes the artifact. Anything the families cannot compile raises
``Unsupported`` (the caller runs the kernel on the CPU); a program the validator rejects is
never emitted.

Artifacts are content-addressed: the directory name is a hash of the kernel
IR (without its name), the compiler version, the options and the hardware
config, so an identical kernel compiled again reuses the directory, in this
process or another (one sharing Inductor's cache dir), without planning;
a directory found corrupt is rebuilt (compile_kernel).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.artifact import check_artifact_files

from . import families  # noqa: F401 - registers every kernel family, in dispatch order
from .core.compiled import COMPILER_VERSION, Compiled
from .core.emit import write_artifact
from .core.family import family_of
from .ir.kernel_ir import Kernel

__all__ = ["artifact_key", "compile_kernel", "plan_kernel"]


def plan_kernel(kernel: Kernel, *, cores: int | None = None, max_cores: int | None = None,
                estimate=None) -> Compiled:
    """Run every pass of the family that claims the kernel (core/family.py: the first in dispatch
    order); the kept program records the kernel's minimum traffic (core/minimum.py). `cores` forces the core count, `max_cores` caps it (default: the
    timing model chooses among up to all cores)."""
    for name, n in (("cores", cores), ("max_cores", max_cores)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= HARDWARE.cores):
            raise ValueError(f"{name} must be an integer in 1..{HARDWARE.cores}, got {n!r}")
    if cores is not None and max_cores is not None and cores > max_cores:
        raise ValueError(f"cores ({cores}) exceeds max_cores ({max_cores})")
    family = family_of(kernel)
    family.check(kernel)
    return family.plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)


def artifact_key(kernel: Kernel, cores: int | None = None, max_cores: int | None = None) -> str:
    ir = json.loads(kernel.to_json())
    ir.pop("name")  # identical kernels under different names share an artifact
    text = json.dumps({"ir": ir, "compiler": COMPILER_VERSION, "cores": cores, "max_cores": max_cores,
                       "hardware": HARDWARE.program_figures()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# What compile_kernel did, per process: "planned" (a new artifact), "reused" (an intact one found:
# another compile, maybe another process's, wrote it), "rebuilt" (one found corrupt, replaced).
artifact_stats: collections.Counter[str] = collections.Counter()


def compile_kernel(kernel: Kernel, artifact_root: Path, *, cores: int | None = None,
                   max_cores: int | None = None) -> Path:
    """The artifact directory of `kernel` under `artifact_root`.

    An existing directory is reused once its files check out
    (spyre_runtime.artifact.check_artifact_files: the launch spec parses and each file it reads
    has the size and sha256 recorded, a few hashes, no decoding). A directory that does not
    (truncated, altered, of another format, incomplete) is rebuilt in place, with one warning
    saying why. Writing is rename-based: the artifact is
    written in a staging directory and renamed into place, a corrupt one is first renamed out of
    the way, so a reader sees a whole artifact or none, and processes compiling the same kernel
    at once each end with an intact directory (whichever rename lands)."""
    root = Path(artifact_root)
    final = root / artifact_key(kernel, cores, max_cores)
    corrupt = _broken(final)
    if corrupt is None:
        artifact_stats["reused"] += 1
        return final
    # (a symbolic kernel is planned at its bucket's maximum; its program declares the size and
    # its symbolic dims where every family's program is validated: core/keep.py)
    compiled = plan_kernel(kernel, cores=cores, max_cores=max_cores)
    artifact_stats["planned"] += 1
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write_artifact(staging, kernel, compiled.plans, compiled.program, COMPILER_VERSION)
        if corrupt and _broken(final):  # (still: another process may have rebuilt it meanwhile)
            _set_aside(final, root)
            artifact_stats["rebuilt"] += 1
            warnings.warn(f"spyre: rebuilt the corrupt artifact {final} of kernel {kernel.name!r} ({corrupt})",
                          RuntimeWarning, stacklevel=2)
        try:
            os.rename(staging, final)  # atomic: a reader sees a whole artifact or none
        except OSError:
            if _broken(final) is not None:  # not a concurrent compile of the same kernel
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _broken(directory: Path) -> str | None:
    """None if `directory` holds an intact artifact; "" if there is nothing there; else what is
    wrong with it (the launch layer's message, naming the file)."""
    if not os.path.lexists(directory):
        return ""
    try:
        check_artifact_files(directory)
    except FileNotFoundError as e:
        return f"{e.filename} is missing"
    except OSError as e:  # ArtifactError (an OSError too), or unreadable
        return str(e)
    return None


def _set_aside(directory: Path, root: Path) -> None:
    """Rename `directory` out of the way (then delete it): the name is free for the rebuilt one
    at once, and a reader of the old one never sees it half deleted. Someone else may have
    moved it already."""
    aside = Path(tempfile.mkdtemp(prefix=".corrupt-", dir=root))
    try:
        os.rename(directory, aside / "artifact")
    except FileNotFoundError:
        pass
    finally:
        shutil.rmtree(aside, ignore_errors=True)
