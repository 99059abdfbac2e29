"""The launch layer: prepare a compiled artifact once, launch it per call on the current stream.

``prepare_kernel(artifact_dir)`` reads the artifact (program, launch spec,
execution plan), parses and validates the program, allocates its device
memory ([correction area][temporaries][program image], program.py) and
transfers the image there (an h2d Transfer on the current stream), and
turns the execution plan into typed steps.

``launch_jobplan(plan, args)`` checks the arguments against the launch spec
(raising, naming the argument, before anything is enqueued: a bad call
leaves the device untouched), resolves each argument's (region, offset),
and enqueues the plan's steps on the current stream without waiting, as one
unbroken run (DeviceQueue.enqueue_many): every launch of a plan patches the
same correction area, so another thread's launch between this one's patch
and its compute would hand this compute the other's addresses.

1. a HostCallback writes the addresses into a pinned staging buffer
   (the runtime's one completion-gated pool, shared with eager copies;
   filled in stream order, so a buffer whose last transfer is earlier on
   the same stream is safe to reuse);
2. a Transfer copies the staging buffer into the correction area;
3. a Barrier holds program distribution: the device fetches a program and
   its correction area ahead of execution, and without the Barrier the
   fetch could read the previous launch's addresses. It is scoped to the
   program's memory: it waits for its stream and for other streams' writes
   to that memory, not for unrelated work on every stream;
4. a Compute runs the program (the simulated device's
   device.programs.ProgramExecutor, whose prefetch is that fetch), with a
   footprint of what it reads and writes so the queue layer orders it
   against other streams' work.

Symbolic sizes (issue 18): a launch spec may declare ``sizes`` (name, min, max) and give an
argument's dim as a size's name. ``launch_jobplan(plan, args, sizes=(n, ...))`` binds them
(``bind_sizes``: each in its bounds, else LaunchError naming the size and the bounds, before
anything is enqueued), checks each symbolic dim against its size, and the resolve callback
writes the size words after the address slots (``write_size_words``); the same transfer
carries them into the correction area and the fetch reads them with the addresses.

A launch that fails on the device stops its stream like any failed
operation (the error names the kernel); ``torch.spyre.clear_errors()``
makes the stream usable again.

``run_program(program, **tensors)`` runs a hand-written program once on given
tensors and waits: the same allocation and address encoding, without an
artifact directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from . import _C
from .device.programs import ProgramExecutor
from .program.operands import DTYPES
from .program.operands import SizeExpr
from .program.program import SIZE_BYTES, SLOT_BYTES, Program
from .program.run import Artifact, ProgramExecutable
from .program.validate import validate_once
from .queue import Barrier, Compute, DeviceAddress, HostAddress, HostCallback, Transfer, TransferKind
from .queue.runtime import current
from .tensors import address, element_span, footprint, reach_bytes, storage_ranges

__all__ = ["ArgSpec", "JobPlan", "LaunchError", "SizeSpec", "bind_sizes", "launch_jobplan", "prepare_artifact", "prepare_kernel", "run_program",
           "write_correction_area"]

LAUNCH_FORMAT = 1


class LaunchError(TypeError):
    """The arguments do not match the kernel's launch spec (nothing was enqueued)."""


@dataclass(frozen=True)
class ArgSpec:
    index: int
    name: str
    role: str  # input, output, inout
    dtype: torch.dtype
    shape: tuple  # ints, and (issue 18) symbolic dims: a size's name, or a SizeExpr (coef * size + const)
    stride: tuple[int, ...]
    slot: int


@dataclass(frozen=True)
class SizeSpec:
    """A size symbol of the kernel (issue 18) and the bounds its artifact serves: a launch with a
    size outside [min, max] is refused before anything is enqueued."""

    name: str
    min: int
    max: int


# ---- symbolic sizes (issue 18) ----------------------------------------------------------


def dim_at(dim, sizes: dict[str, int]) -> int:
    """A launch-spec dim at the bound sizes: an int, a size's name, or a SizeExpr (unclamped:
    the tensor's dim must be exactly coef * size + const)."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, str):
        return sizes[dim]
    return dim.coef * sizes[dim.symbol] + dim.const


def _dim_symbol(dim) -> str:
    return dim if isinstance(dim, str) else dim.symbol


def _dim_max(dim, bounds: dict[str, SizeSpec]) -> int:
    if isinstance(dim, int):
        return dim
    return dim_at(dim, {_dim_symbol(dim): bounds[_dim_symbol(dim)].max})


def _parse_dim(d):
    """A launch spec's dim: an int, a size's name, or {"size": name, "coef": c, "const": k}."""
    if isinstance(d, (int, str)) and not isinstance(d, bool):
        return d
    if isinstance(d, dict) and isinstance(d.get("size"), str):
        return SizeExpr(d["size"], hi=0, coef=int(d.get("coef", 1)), const=int(d.get("const", 0)))
    raise ValueError(f"dim {d!r} is neither an int, a size's name nor {{'size', 'coef', 'const'}}")


def _parse_sizes(spec: dict) -> tuple[SizeSpec, ...]:
    out = []
    for s in spec.get("sizes", ()):
        lo, hi = s["min"], s["max"]
        if not (isinstance(s["name"], str) and isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
            raise ValueError(f"size {s!r}: a name and bounds 0 <= min <= max")
        out.append(SizeSpec(s["name"], lo, hi))
    return tuple(out)


def bind_sizes(plan: "JobPlan", sizes) -> dict[str, int]:
    """The launch's size values by name, each checked against the artifact's bounds (LaunchError,
    naming the size and the bounds: nothing is enqueued). `sizes`: in the launch spec's order, or
    a dict by name; a kernel without sizes takes none."""
    specs = plan.sizes
    if isinstance(sizes, dict):
        unknown = set(sizes) - {s.name for s in specs}
        if unknown:
            raise LaunchError(f"kernel {plan.name!r} has no size(s) {sorted(unknown)}; its sizes are "
                              f"{[s.name for s in specs]}")
        values = [sizes.get(s.name) for s in specs]
    else:
        values = list(sizes or ())
        if len(values) != len(specs):
            raise LaunchError(f"kernel {plan.name!r} takes {len(specs)} size(s) ({', '.join(s.name for s in specs)}), "
                              f"got {len(values)}")
    bound = {}
    for spec, v in zip(specs, values):
        if v is None:
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name} is missing")
        try:
            n = int(v)  # a SymInt's hint, a NumPy integer
        except (TypeError, ValueError):
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name} must be an integer, got {v!r}") from None
        if not spec.min <= n <= spec.max:
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name}={n} is outside the artifact's bounds "
                              f"[{spec.min}, {spec.max}] (compile it for a bucket that holds {n})")
        bound[spec.name] = n
    return bound


def write_size_words(words: torch.Tensor, program: Program, sizes: dict[str, int]) -> None:
    """The size words of the correction area (after the address slots) into `words` (int64)."""
    for entry in program.size_layout:
        words[entry["offset"] // SIZE_BYTES] = sizes[entry["size"]]


# ---- typed steps of the execution plan ------------------------------------------------


@dataclass(frozen=True)
class ResolveAddresses:
    """Host callback: each argument's (region, offset) into its correction slot in staging memory."""

    slots: tuple[tuple[int, int], ...]  # (slot, argument index)
    nbytes: int


@dataclass(frozen=True)
class PatchCorrectionArea:
    offset: int
    nbytes: int


@dataclass(frozen=True)
class HoldFetch:
    pass


@dataclass(frozen=True)
class RunProgram:
    reads: tuple[int, ...]   # argument indices
    writes: tuple[int, ...]


Step = ResolveAddresses | PatchCorrectionArea | HoldFetch | RunProgram


@dataclass(frozen=True)
class JobPlan:
    name: str
    artifact_dir: Path
    device: int
    program: Program
    args: tuple[ArgSpec, ...]
    steps: tuple[Step, ...]
    executor: ProgramExecutor  # what the queue layer runs for the plan's Compute
    artifact: Artifact
    allocation: torch.Tensor  # the program's device memory (kept alive by the plan)
    sizes: tuple[SizeSpec, ...] = ()  # issue 18: the size symbols and the bounds the artifact serves


def _steps(doc: dict, program: Program, args: tuple[ArgSpec, ...], bounds: dict | None = None) -> tuple[Step, ...]:
    """The execution plan's steps, each checked against the program it drives: the plan file is
    not covered by the program's checksum, and a wrong slot, size or footprint would bind or
    patch the wrong bytes silently."""
    where = f"execution plan of {program.name!r}"
    nargs = len(args)
    steps = []
    for s in doc["steps"]:
        kind = s.get("kind")
        if kind == "host_callback" and s.get("action") == "resolve_addresses":
            slots = tuple((x["slot"], x["arg"]) for x in s["slots"])
            if sorted(x for x, _ in slots) != list(range(len(program.placeholders))) or \
                    any(not 0 <= a < nargs for _, a in slots):
                raise ValueError(f"{where}: slots {slots} do not match the program's "
                                 f"{len(program.placeholders)} placeholder(s)")
            for slot, a in slots:
                _check_binding(where, slot, program.placeholders[slot], args[a], bounds)
            if s["staging_bytes"] < len(slots) * SLOT_BYTES + len(program.sizes) * SIZE_BYTES:
                raise ValueError(f"{where}: {s['staging_bytes']} staging bytes for {len(slots)} slot(s) "
                                 f"of {SLOT_BYTES} B and {len(program.sizes)} size word(s) of {SIZE_BYTES} B")
            steps.append(ResolveAddresses(slots, s["staging_bytes"]))
        elif kind == "transfer" and s.get("destination") == "correction_area":
            if (s["offset"], s["nbytes"]) != (program.correction_offset, program.correction_bytes):
                raise ValueError(f"{where}: correction transfer of {s['nbytes']} B at {s['offset']}; the "
                                 f"program's correction area is {program.correction_bytes} B at "
                                 f"{program.correction_offset}")
            steps.append(PatchCorrectionArea(s["offset"], s["nbytes"]))
        elif kind == "barrier":
            steps.append(HoldFetch())
        elif kind == "compute":
            reads, writes = tuple(s["reads"]), tuple(s["writes"])
            if any(not 0 <= i < nargs for i in reads + writes):
                raise ValueError(f"{where}: compute footprint {reads} / {writes} names arguments outside "
                                 f"0..{nargs - 1}")
            written = {a.index for a in args if a.role in ("output", "inout")}
            if set(writes) != written:
                raise ValueError(f"{where}: compute writes arguments {sorted(writes)}, the launch spec's "
                                 f"outputs are {sorted(written)}")
            steps.append(RunProgram(reads, writes))
        else:
            raise ValueError(f"{where}: unknown step {s!r}")
    shape = [type(st) for st in steps]
    if shape != list(_PLAN_SHAPE):
        raise ValueError(f"{where}: steps {[t.__name__ for t in shape]}; a launch is exactly "
                         f"{[t.__name__ for t in _PLAN_SHAPE]}, in that order (without the barrier the "
                         f"fetch reads unpatched addresses; a second compute would run on them unpatched)")
    if steps[1].nbytes > steps[0].nbytes:
        raise ValueError(f"{where}: the correction transfer reads past its {steps[0].nbytes}-byte staging buffer")
    return tuple(steps)


# The one plan shape the compiler emits (templates/execution_plan.json.j2) and this layer runs.
_PLAN_SHAPE = (ResolveAddresses, PatchCorrectionArea, HoldFetch, RunProgram)


def _check_binding(where: str, slot: int, sym, arg: ArgSpec, bounds: dict | None = None) -> None:
    """The launch spec's argument must be the program's placeholder: name, dtype, shape, strides
    (a symbolic dim: the same size as the symbol's SizeExpr, the symbol's dim its maximum)."""
    strides_agree = all(x == y for x, y, n in zip(sym.strides, arg.stride, sym.shape) if n > 1)
    dims = sym.dims or (None,) * len(sym.shape)
    try:
        shape = tuple(_dim_max(d, bounds or {}) for d in arg.shape)
    except (KeyError, TypeError):
        shape = None
    symbolic_agree = len(dims) == len(arg.shape) and all(
        (e is None) == isinstance(d, int) and (e is None or e.symbol == _dim_symbol(d))
        for e, d in zip(dims, arg.shape))
    if (sym.name, DTYPES[sym.dtype], tuple(sym.shape)) != (arg.name, arg.dtype, shape) or not strides_agree \
            or not symbolic_agree:
        raise ValueError(f"{where}: slot {slot} binds argument {arg.index} ({arg.name!r} {arg.dtype} "
                         f"{list(arg.shape)} strides {list(arg.stride)}) to the program's {sym.name!r} "
                         f"{sym.dtype} {list(sym.shape)} strides {list(sym.strides)}")


def prepare_kernel(artifact_dir, device: int | None = None) -> JobPlan:
    """Parse, validate, allocate and transfer the program of `artifact_dir` (once per artifact)."""
    root = Path(artifact_dir)
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)
                               or not 0 <= device < _C.device_count()):
        raise ValueError(f"prepare_kernel: device must be a spyre device index in 0..{_C.device_count() - 1}, "
                         f"got {device!r}")
    try:
        spec = json.loads((root / "launch_spec.json").read_text())
        if spec.get("format") != LAUNCH_FORMAT:
            raise ValueError(f"launch spec format {spec.get('format')}, this runtime reads {LAUNCH_FORMAT}")
        program = Program.load(root / spec["program"])
        for a in spec["args"]:
            if a["dtype"] not in DTYPES:
                raise ValueError(f"argument {a['name']!r} has dtype {a['dtype']!r}, not one of {sorted(DTYPES)}")
        args = tuple(ArgSpec(a["index"], a["name"], a["role"], DTYPES[a["dtype"]], tuple(map(_parse_dim, a["shape"])),
                             tuple(a["stride"]), a["slot"]) for a in spec["args"])
        sizes = _parse_sizes(spec)
        if tuple(s.name for s in sizes) != tuple(program.sizes):
            raise ValueError(f"launch spec sizes {[s.name for s in sizes]}, the program's are {list(program.sizes)}")
        plan_doc = json.loads((root / spec["execution_plan"]).read_text())
        steps = _steps(plan_doc, program, args, {s.name: s for s in sizes})
    except FileNotFoundError as e:
        raise ValueError(f"{root} is not a complete spyre artifact: {e.filename} is missing") from None
    except IsADirectoryError as e:
        raise ValueError(f"{root} is not a spyre artifact: {e.filename} is a directory, not a file") from None
    except OSError as e:
        raise ValueError(f"{root}: cannot read the artifact: {e}") from None
    except (KeyError, TypeError) as e:
        raise ValueError(f"{root}: malformed artifact ({type(e).__name__}: {e})") from None
    except ValueError as e:  # bad JSON, format, checksum, and the checks against the program
        raise ValueError(f"{root}: {e}") from None
    validate_once(program)  # ProgramExecutable will not validate it again
    device = _C.current_device() if device is None else device
    alloc, artifact = _allocate(program, device)
    return JobPlan(spec["kernel"], root, device, program, args, steps, ProgramExecutor(ProgramExecutable(program)),
                   artifact, alloc, sizes)


def _check(plan: JobPlan, args, sizes: dict[str, int] | None = None) -> None:
    if len(args) != len(plan.args):
        names = ", ".join(a.name for a in plan.args)
        raise LaunchError(f"kernel {plan.name!r} takes {len(plan.args)} argument(s) ({names}), got {len(args)}")
    want_device = torch.device("spyre", plan.device)
    for spec, t in zip(plan.args, args):
        where = f"kernel {plan.name!r} argument {spec.index} ({spec.name!r}, {spec.role})"
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{where}: expected a tensor, got {type(t).__name__}")
        if t.device != want_device:
            raise LaunchError(f"{where}: expected a tensor on {want_device}, got one on {t.device}")
        if t.dtype != spec.dtype:
            raise LaunchError(f"{where}: expected dtype {spec.dtype}, got {t.dtype}")
        shape = spec.shape if not sizes else tuple(dim_at(d, sizes) for d in spec.shape)
        if tuple(t.shape) != shape:
            shown = list(spec.shape) if shape == spec.shape else f"{list(shape)} ({list(spec.shape)})"
            raise LaunchError(f"{where}: expected shape {shown}, got {list(t.shape)}")
        if t.numel() > 1 and any(st != want for st, want, n in zip(t.stride(), spec.stride, shape) if n > 1):
            raise LaunchError(f"{where}: expected strides {list(spec.stride)}, got {list(t.stride())}")
        if t.numel() > 0:
            needed, have = reach_bytes(t), t.untyped_storage().nbytes()
            if have < needed:
                raise LaunchError(f"{where}: its storage holds {have} bytes but the tensor reaches byte {needed} "
                                  f"(was the storage resized under it?)")
    _check_overlap(plan, args)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The host addresses of a non-empty tensor's first and past-its-last touched byte."""
    lo, hi = element_span(t)
    base, size = t.untyped_storage().data_ptr(), t.element_size()
    return base + lo * size, base + (hi + 1) * size


def _check_overlap(plan: JobPlan, args) -> None:
    """A written argument may share bytes with an input only as the very same tensor layout (an
    in-place update: a program reads each tile before it writes it back): an output that
    overlaps an argument elsewhere would read what it has already written, and two outputs on
    the same bytes race. Refused conservatively, by byte span (two interleaved views of one
    buffer are refused too)."""
    for i, spec in enumerate(plan.args):
        if spec.role not in ("output", "inout") or args[i].numel() == 0:
            continue
        lo, hi = _span(args[i])
        for j, other in enumerate(plan.args):
            t = args[j]
            if j == i or t.numel() == 0:
                continue
            olo, ohi = _span(t)
            same = (other.role == "input" and (t.data_ptr(), tuple(t.shape), t.stride())
                    == (args[i].data_ptr(), tuple(args[i].shape), args[i].stride()))
            if lo < ohi and olo < hi and not same:
                raise LaunchError(f"kernel {plan.name!r}: argument {spec.index} ({spec.name!r}, {spec.role}) "
                                  f"overlaps argument {other.index} ({other.name!r}, {other.role}) in device "
                                  f"memory without being the same tensor; pass separate buffers")


def _slot_words(nbytes: int, bound) -> torch.Tensor:
    """The correction area's contents: for each (slot, tensor), the tensor's (region, offset)."""
    words = torch.zeros(nbytes // 8, dtype=torch.int64)
    for slot, t in bound:
        if t.numel() == 0 or not storage_ranges(t.untyped_storage()):
            region, offset = 1 << 62, 0  # nothing is touched: any address will do
        else:
            a = address(t)
            region, offset = a.region, a.offset
        words[slot * SLOT_BYTES // 8] = region
        words[slot * SLOT_BYTES // 8 + 1] = offset
    return words


def _allocate(program: Program, device: int) -> tuple[torch.Tensor, Artifact]:
    """The program's device allocation, [correction area][temporaries][image], filled in stream
    order on the current stream (a pinned host copy and one H2D transfer)."""
    image = program.image()
    host = torch.empty(program.allocation_bytes + len(image), dtype=torch.uint8, pin_memory=True)
    host[:program.allocation_bytes].zero_()  # (the image part is overwritten whole: not zeroed first)
    host[program.allocation_bytes:] = torch.frombuffer(bytearray(image), dtype=torch.uint8)
    alloc = torch.empty(host.numel(), dtype=torch.uint8, device=torch.device("spyre", device))
    current().queue(device).enqueue(_C.current_stream_id(device),
                                    Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), address(alloc),
                                             host.numel(), keepalive=host))
    piece = storage_ranges(alloc.untyped_storage())[0]
    return alloc, Artifact(device, piece.region, piece.offset)


def launch_jobplan(plan: JobPlan, args, sizes=()) -> None:
    """Enqueue one launch of `plan` on the current stream (asynchronous; see the module docstring).
    `sizes`: the values of the kernel's size symbols (issue 18), in launch-spec order."""
    if isinstance(args, torch.Tensor) or not isinstance(args, (list, tuple)):
        raise LaunchError(f"kernel {plan.name!r}: arguments must be a list of tensors in launch-spec order, "
                          f"got {type(args).__name__}")
    args = list(args)
    bound_sizes = bind_sizes(plan, sizes)
    _check(plan, args, bound_sizes)
    device = plan.device
    runtime = current()
    queue, stream = runtime.queue(device), _C.current_stream_id(device)
    alloc = plan.allocation
    resolve, patch, _, run = plan.steps  # the plan's shape is checked by prepare_kernel
    words = _slot_words(resolve.nbytes, [(slot, args[i]) for slot, i in resolve.slots])  # storage is fixed now
    write_size_words(words, plan.program, bound_sizes)
    reads = [args[i] for i in run.reads] + [alloc]
    writes = [args[i] for i in run.writes]
    if any(sym.role == "temp" for sym in plan.program.symbols):
        writes.append(alloc)  # temporaries live in it: two launches must not run on them at once
    fetch_reads = footprint(reads=[alloc])
    program_footprint = footprint(reads=reads, writes=writes)
    staging = runtime.staging
    staged = staging.acquire(resolve.nbytes, stream=(device, stream), filled_in_stream_order=True)

    def fill(buf=staged, words=words):
        buf.memory[: words.numel() * 8].copy_(words.view(torch.uint8))

    ops = (
        HostCallback(fill, name=f"{plan.name}: resolve addresses"),
        Transfer(TransferKind.H2D, HostAddress(staged.address),
                 DeviceAddress(plan.artifact.region, plan.artifact.offset + patch.offset), patch.nbytes,
                 keepalive=staged.memory),
        Barrier(name=f"{plan.name}: hold program fetch", footprint=fetch_reads),
        Compute(plan.executor, plan.artifact, program_footprint, name=plan.name),
    )
    # If this raises, the buffer is not returned to the pool: it may have come with an
    # earlier transfer of this stream still to read it, which only the pool's record of that
    # transfer protects (the transfer itself keeps its memory alive).
    tickets = queue.enqueue_many(stream, ops)
    staging.release(staged, tickets[1], (device, stream))


# ---- running a (hand-written) program once, blocking ------------------------------------


def prepare_artifact(program: Program, device: int) -> tuple[torch.Tensor, Artifact]:
    """The program's device allocation, filled before this returns (see _allocate)."""
    alloc, artifact = _allocate(program, device)
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    return alloc, artifact


def write_correction_area(program: Program, alloc: torch.Tensor, bound: dict[str, torch.Tensor],
                          sizes: dict[str, int] | None = None) -> None:
    """Resolve the placeholders now: each bound tensor's (region, offset) into its slot, and the
    size words (blocking, after the stream's earlier work; compiled launches stage this in stream
    order instead)."""
    device = alloc.device.index
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    words = _slot_words(program.correction_bytes, [(i, bound[s.name]) for i, s in enumerate(program.placeholders)])
    missing = [n for n in program.sizes if n not in (sizes or {})]
    if missing:
        raise TypeError(f"program {program.name!r}: no value for size(s) {', '.join(missing)}")
    write_size_words(words, program, sizes or {})
    start = program.correction_offset
    _C.host_alias(alloc)[start:start + program.correction_bytes].copy_(words.view(torch.uint8))


def run_program(program: Program, device: int = 0, sizes: dict[str, int] | None = None,
                **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run a program on the given tensors; returns every output by name. `sizes`: the values of
    the program's size symbols (issue 18); a symbolic dim's tensors have its size at them.

    Inputs may be CPU or spyre tensors (CPU ones are copied to the device);
    outputs not given are allocated with the symbol's shape and strides. The
    program runs as a Compute on the device's current stream; this waits.
    """
    validate_once(program)
    names = {s.name for s in program.placeholders}
    unknown = set(tensors) - names
    if unknown:
        raise TypeError(f"run_program({program.name!r}): unknown argument(s) {sorted(unknown)}; "
                        f"the program takes {sorted(names)}")
    spyre = torch.device("spyre", device)
    if program.sizes and not sizes:
        raise TypeError(f"run_program({program.name!r}): the program has sizes {list(program.sizes)}: give sizes=")

    def shape_of(sym):
        return sym.shape_at(sizes) if sym.sized else sym.shape

    bound = {}
    for sym in program.placeholders:
        t = tensors.get(sym.name)
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"run_program({program.name!r}): {sym.name!r} must be a tensor, got {type(t).__name__}")
        if t is None:
            if sym.role == "input":
                raise TypeError(f"run_program({program.name!r}): missing input {sym.name!r}")
            t = torch.empty_strided(shape_of(sym), sym.strides, dtype=DTYPES[sym.dtype], device=spyre)
        else:
            if tuple(t.shape) != tuple(shape_of(sym)) or t.dtype != DTYPES[sym.dtype]:
                raise TypeError(
                    f"run_program({program.name!r}): {sym.name!r} must be {sym.dtype}{list(shape_of(sym))}, "
                    f"got {t.dtype}{list(t.shape)}")
            t = t.to(spyre)
            if tuple(t.stride()) != tuple(sym.strides):
                raise TypeError(f"run_program({program.name!r}): {sym.name!r} must have strides "
                                f"{list(sym.strides)}, got {list(t.stride())}")
        bound[sym.name] = t
    alloc, artifact = prepare_artifact(program, device)
    write_correction_area(program, alloc, bound, sizes)
    queue, stream = current().queue(device), _C.current_stream_id(device)
    inputs = [bound[s.name] for s in program.placeholders if s.role == "input"]
    outputs = [bound[s.name] for s in program.placeholders if s.role == "output"]
    op = Compute(ProgramExecutor(ProgramExecutable(program)), artifact,
                 footprint(reads=inputs + [alloc], writes=outputs + [alloc]), name=program.name)
    # Blocking: run it on this thread once its turn comes (see DeviceQueue.run_inline).
    queue.run_inline(stream, op)
    return {s.name: bound[s.name] for s in program.placeholders if s.role == "output"}
