"""Emission: the artifact directory of one compiled kernel.

    kernel.json           the kernel IR it was compiled from
    program.json          the program (program.py's checksummed format)
    listing.txt           its per-core, per-unit listing (listing.py)
    symbols.json          the symbol table: placeholders and temporaries
    execution_plan.json   what a launch does, step by step (spyre_runtime/prepare.py reads it)
    launch_spec.json      the arguments: order, role, dtype, shape, stride
    plan.json             every pass's result (Plans.describe()), for debugging and tests
    summary.txt           a person's view of the plan (templates/summary.txt.j2, any family)
    call.py               the wrapper's call (names its own directory: artifacts are
                          written in a staging directory, then renamed into place)
    sources.txt           the aten ops of the graphs whose kernels compiled to it, a line each
                          (note_source; not part of what the artifact is keyed on)

The JSON and text files are rendered through the jinja2 templates next to
this package (templates/); launch_spec.json is written last, so a
directory that has it is complete. It records the size and sha256 of
program.json and execution_plan.json (and the program's format): a file
truncated or altered since is found by hashing, without decoding it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2

from spyre_runtime.artifact import LAUNCH_FORMAT, PROGRAM_FORMAT  # the reader's format is the one written
from spyre_runtime.program.program import Program

from ..ir.kernel_ir import Kernel
from ..symbolic.planning import launch_sizes
from .family import family_of
from ._dump import plain
from .plans import Plans

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined)
_env.filters["json"] = lambda v: json.dumps(plain(v))


def _brief(stage) -> str:
    """A stage's one line: its fields that are numbers, strings or flat lists (any family's)."""
    def flat(v):
        return v is None or isinstance(v, (bool, int, float, str)) or (
            isinstance(v, list) and all(isinstance(x, (int, float, str)) or (
                isinstance(x, list) and all(isinstance(y, (int, float, str)) for y in x)) for x in v))

    return ", ".join(f"{k} {v}" for k, v in stage.describe().items() if flat(v))


def _step(st) -> str:
    args = ", ".join(st.args) + (", " if st.args and st.value is not None else "") + (
        repr(st.value) if st.value is not None else "")
    return f"{st.dst} {'+' if st.accumulate else ''}= {st.kind} {st.op}({args})"


_env.filters["brief"] = _brief
_env.filters["step"] = _step


def _summary(plans: Plans):
    """(template, context) of summary.txt: one template for every family's Plans."""
    return "summary.txt.j2", dict(plans=plans)


def launch_args(kernel: Kernel, buffers) -> list[dict]:
    """The launch arguments, in order: `buffers` (Plans.buffers), each a BufferLayout."""
    read = set(kernel.inputs)
    family = family_of(kernel)
    args = []
    for i, b in enumerate(buffers):
        role = "inout" if (b.role == "output" and b.name in read) else b.role
        args.append({"index": i, "name": b.name, "role": role, "dtype": b.dtype,
                     "shape": family.launch_shape(kernel, b.name, b.shape),
                     "stride": list(b.strides), "storage_offset": b.offset, "slot": i})
    return args


# The files the launch layer reads besides the launch spec: the spec records each one's size and
# sha256 (and the program's format), so a truncated or altered file is found without decoding it
# (spyre_runtime.artifact.check_artifact_files, run by the compiler on every reuse of an artifact).
RECORDED = ("program.json", "execution_plan.json")


def recorded(directory: Path) -> dict:
    """The launch spec's record of the RECORDED files as written in `directory`."""
    out = {}
    for name in RECORDED:
        data = (directory / name).read_bytes()
        out[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    out["program.json"]["format"] = PROGRAM_FORMAT
    return out


def write_artifact(directory: Path, kernel: Kernel, plans: Plans, program: Program,
                   compiler: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    summary_template, summary_context = _summary(plans)
    args = launch_args(kernel, plans.buffers)
    arg_of = {a["name"]: a["index"] for a in args}
    slots = [{"slot": s["slot"], "arg": arg_of[s["symbol"]], "symbol": s["symbol"], "offset": s["offset"]}
             for s in program.correction_layout]
    common = {"format": LAUNCH_FORMAT, "kernel": kernel.name, "compiler": compiler}

    def render(template: str, **extra) -> str:
        return _env.get_template(template).render(**common, **extra)

    files = {
        "kernel.json": kernel.to_json(),
        "listing.txt": program.listing(),
        "plan.json": json.dumps(plans.describe(), indent=1),
        "symbols.json": render("symbols.json.j2", symbols=program.symbols),
        "execution_plan.json": render(
            "execution_plan.json.j2", slots=slots, correction_offset=program.correction_offset,
            correction_bytes=program.correction_bytes,
            reads=[a["index"] for a in args if a["role"] in ("input", "inout")],
            writes=[a["index"] for a in args if a["role"] in ("output", "inout")]),
        "summary.txt": render(summary_template, **summary_context),
        # No path: `directory` is the staging directory (backend.compile_kernel), gone once renamed.
        "call.py": render("call.py.j2", plan_var=f"plan_{kernel.name}", args=[a["name"] for a in args],
                          sizes=[s["name"] for s in launch_sizes(kernel)]),
    }
    program.save(directory / "program.json")  # (remembered: prepare_kernel gets this very program back)
    for name, text in files.items():
        if name.endswith(".json"):
            json.loads(text)  # a template bug fails here, not at launch
        (directory / name).write_bytes(text.encode())
    spec = render("launch_spec.json.j2", args=args, files=recorded(directory), sizes=launch_sizes(kernel))
    json.loads(spec)
    (directory / "launch_spec.json").write_text(spec)
    return directory


SOURCES = "sources.txt"


def note_source(directory: Path, ops: str) -> None:
    """Add `ops` (a scheduler node's aten ops) to the artifact's sources.txt unless it is there:
    one content-addressed artifact serves every graph whose kernel compiles to the same program,
    so what it came from is a list that grows, written beside what the artifact is keyed on.
    Best effort: a read-only cache loses only this note."""
    f = Path(directory) / SOURCES
    try:
        if f.exists() and ops in f.read_text().splitlines():
            return
        with open(f, "a") as out:  # (one short append: whole even with another process appending)
            out.write(ops.replace("\n", " ") + "\n")
    except OSError:
        pass


BRIEF_LISTING_LINES = 16


def brief(directory: Path) -> list[str]:
    """A kernel artifact in a few lines: its summary's first line, its division and why, and the
    head of its first core's program (what TORCH_LOGS=output_code shows beside the wrapper, as
    Inductor shows a Triton kernel's source; `spyre-inspect show|plan` has the rest)."""
    directory = Path(directory)
    try:
        summary = (directory / "summary.txt").read_text().splitlines()
        division = json.loads((directory / "plan.json").read_text()).get("division") or {}
        listing = (directory / "listing.txt").read_text()
    except (OSError, ValueError):
        return [f"(artifact {directory} unreadable)"]
    lines = summary[:1]
    if division:
        lines.append(f"division: {division.get('cores', '?')} core(s), {division.get('split', '')}")
        if division.get("reason"):
            lines.append(f"  kept: {division['reason']}")
    body = listing.partition("\ncore ")[2]
    if body:
        core = ("core " + body).split("\ncore ")[0].splitlines()
        lines.append(f"program, {core[0].strip()} of {listing.count(chr(10) + 'core ')}:")
        lines += core[1:1 + BRIEF_LISTING_LINES]
        if len(core) > 1 + BRIEF_LISTING_LINES:
            lines.append(f"  ... {len(core) - 1 - BRIEF_LISTING_LINES} more line(s): spyre-inspect show "
                         f"{summary[0].split()[1] if summary and len(summary[0].split()) > 1 else directory}")
    return lines
