"""The artifact format: the files a compiled kernel is, and the check that they are the ones written.

An artifact directory holds the program (program.json), the launch spec
(launch_spec.json: the arguments, the sizes, and the size and sha256 of
each file it names) and the execution plan (execution_plan.json). The
compiler writes them (spyre_inductor.compiler.core.emit) and checks an
existing directory before it reuses it (check_artifact_files); the launch
layer checks the same files before it prepares them (prepare.py).

The compiler imports this module, so it imports neither torch nor the C++
extension, nor anything that does (spyre_runtime.program does): the formats
are plain numbers here, and the program format is the one Program.dump writes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# 2: the launch spec records the size, sha256 (and the program's format) of the files it names
LAUNCH_FORMAT = 2
# The program file's format (spyre_runtime.program.program writes and reads it)
PROGRAM_FORMAT = 1


class ArtifactError(ValueError, OSError):
    """An artifact directory that cannot be used as it is: a file missing, truncated, altered or
    of another format. The message names the file and what is wrong; compiling the kernel again
    rebuilds the directory (backend.compile_kernel checks it with check_artifact_files).

    It is also an OSError, as a file that cannot be read is (like io.UnsupportedOperation, both
    ValueError and OSError): Inductor's FX graph cache treats an OSError raised while it loads a
    cached module (whose first lines call prepare_kernel) as a cache miss and compiles the graph
    again, so a cached graph whose artifact went bad is rebuilt instead of failing."""


def json_file(path: Path):
    """The parsed JSON document at `path` (ArtifactError naming the file if it is not JSON)."""
    data = path.read_bytes()
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON, truncated or corrupt ({len(data)} bytes; {e.msg}: byte "
                            f"{e.pos})") from None
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON, corrupt ({len(data)} bytes; not UTF-8 text: byte "
                            f"{e.start})") from None


def check_artifact_files(artifact_dir) -> dict:
    """The launch spec of `artifact_dir`, once its files are known to be the ones written: the spec
    parses and is of this runtime's format, and every file it records (the program, the execution
    plan) is there with the size and sha256 recorded and, for the program, of the format this
    runtime reads. Cheap (reads and hashes; the program is not decoded): the compiler runs it on
    every reuse of an artifact. The execution plan (small) is parsed and its format checked too.
    Raises ArtifactError naming the file and what is wrong (a missing file: FileNotFoundError, as
    reading it raises)."""
    root = Path(artifact_dir)
    spec_path = root / "launch_spec.json"
    spec = json_file(spec_path)
    if not isinstance(spec, dict) or "format" not in spec:
        raise ArtifactError(f"{spec_path}: not a spyre launch spec (no format field)")
    if spec["format"] != LAUNCH_FORMAT:
        raise ArtifactError(f"{spec_path}: launch spec format {spec['format']!r}; this runtime reads format "
                            f"{LAUNCH_FORMAT}")
    files = spec.get("files")
    names = (spec.get("program"), spec.get("execution_plan"))
    if not isinstance(files, dict) or not all(isinstance(n, str) and isinstance(files.get(n), dict) for n in names):
        raise ArtifactError(f"{spec_path}: malformed launch spec (no size and checksum recorded for "
                            f"{[n for n in names if not isinstance(files, dict) or n not in files]})")
    program_format = files[spec["program"]].get("format")
    if program_format != PROGRAM_FORMAT:
        raise ArtifactError(f"{root / spec['program']}: program format {program_format!r}; this runtime reads "
                            f"format {PROGRAM_FORMAT}")
    for name in names:
        path, record = root / name, files[name]
        data = path.read_bytes()
        if len(data) != record.get("bytes"):
            short = isinstance(record.get("bytes"), int) and len(data) < record["bytes"]
            what = "truncated" if short else "wrong size"
            raise ArtifactError(f"{path}: {what}: expected {record.get('bytes')} bytes, got {len(data)}")
        found = hashlib.sha256(data).hexdigest()
        if found != record.get("sha256"):
            raise ArtifactError(f"{path}: checksum mismatch: expected sha256 {str(record.get('sha256'))[:16]}..., "
                                f"found {found[:16]}... (the file was altered)")
    plan_path = root / spec["execution_plan"]
    plan = json_file(plan_path)  # (small: parsed here, its format checked, as the spec's)
    found = plan.get("format") if isinstance(plan, dict) else None
    if found != LAUNCH_FORMAT:
        raise ArtifactError(f"{plan_path}: execution plan format {found!r}; this runtime reads format "
                            f"{LAUNCH_FORMAT}")
    return spec


ARTIFACTS_ENV = "SPYRE_ARTIFACTS"


def collect(artifact_dir, into) -> Path | None:
    """A copy of the artifact directory `artifact_dir` as `into`/<its kernel's name>, unless one
    is there already (SPYRE_ARTIFACTS, TORCH_COMPILE_DEBUG's directory): a run's kernels under
    names a person can read, for `spyre-inspect`. Best effort: a copy that fails costs only the
    copy. Returns where it is, or None."""
    import shutil
    import tempfile

    src = Path(artifact_dir)
    try:
        name = json.loads((src / "launch_spec.json").read_text())["kernel"]
        dest = Path(into) / name
        if (dest / "launch_spec.json").exists():
            return dest
        Path(into).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=into))  # (one per copy: threads, processes)
        try:
            shutil.copytree(src, staging, dirs_exist_ok=True)
            os.rename(staging, dest)  # atomic; fails if another copy got there first, which is as good
        except OSError:
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dest if (dest / "launch_spec.json").exists() else None
    except (OSError, ValueError, KeyError):
        return None
