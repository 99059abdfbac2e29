"""The compiler's version, as the FX graph cache sees it.

Inductor's FX graph cache (and AOTAutograd's, built on the same details)
does not know our backend exists: a graph compiled by an older spyre
compiler would be reused, stale artifacts and all. The version below goes
into the key (registration.VersionPass.uuid). It is a hash of the compiler's
own sources and templates, so ANY change to the code that decides what a
kernel becomes invalidates old entries, without anyone remembering to bump a
number; the release number is there for people.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

RELEASE = "0.1"

# What decides the generated code: the compiler package (capture, the planner core and the
# families, templates, wrapper), what generated code calls at run time (spyre_inductor/launcher)
# and the launch layer under it, and the program format,
# ISA and timing model the planner builds and times its candidates with.
_PACKAGE = Path(__file__).resolve().parents[1]  # the compiler package, every layer of it
_RUNTIME = _PACKAGE.parent.parent / "spyre_runtime"
_LAUNCH = [_RUNTIME / name for name in ("artifact.py", "prepare.py", "launch.py")]
_LAUNCHER = _PACKAGE.parent / "launcher"  # what generated code calls at run time


@functools.cache
def compiler_version() -> str:
    """``<release>+<sha256 prefix of the compiler sources>``, computed once per process."""
    digest = hashlib.sha256()
    files = sorted(p for p in _PACKAGE.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".jinja"))
    files += sorted(_LAUNCHER.glob("*.py")) + [p for p in _LAUNCH if p.is_file()]
    files += sorted(p for p in (_RUNTIME / "program").glob("*.py")) + [_RUNTIME / "hardware.py"]
    for path in files:
        digest.update(str(path.relative_to(_PACKAGE.parent.parent)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return f"{RELEASE}+{digest.hexdigest()[:16]}"
