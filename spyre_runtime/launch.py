"""The launch layer: prepare a compiled artifact once, launch it per call on the current stream.

``prepare_kernel(artifact_dir)`` does everything that depends only on the
artifact, once: it reads the artifact (program, launch spec, execution
plan), parses and validates the program, allocates its device memory
([correction area][temporaries][program image][second correction area],
program.py) and transfers the image there (an h2d Transfer on the current
stream), turns the execution plan into typed steps, and resolves what every
launch needs (binding.ArgTable: the argument checks and the slot layout; each
correction area's address and footprints; the names of the operations).

``launch_jobplan(plan, args)`` only binds: it checks the arguments against
the launch spec (raising, naming the argument and both values, before
anything is enqueued: a bad call leaves the device untouched), reads each
argument's storage address, and hands the launch to the device's queue
(DeviceQueue.submit: its sequence numbers are taken then, so the allocator
keeps a tensor freed after the call until the launch is done). Whoever
enqueues it next (a thread that waits or enqueues, or the queue's
submission worker) resolves the addresses to (region, offset) slot words,
remembered per binding, and enqueues two typed operations for the four
steps of the execution plan:

1. resolve addresses and patch the correction area: the slot words are
   written, by whoever enqueues, into a pinned staging buffer (the runtime's
   one completion-gated pool, shared with eager copies: a buffer no transfer
   may still read), and one Transfer copies it into one of the plan's two
   correction areas (launches alternate). The words are known at launch, so
   no host callback waits in the stream for them: the host's work is part of
   the launch's host time, and the stream holds only the copy. It runs on a
   preparation stream of the launch's stream (preparation_stream), so a
   launch's patch overlaps the previous launch's compute; the patch of an
   area waits, by footprint, until the compute that last read it has
   finished;
2. hold the fetch and run the program: one Compute on the launch's stream
   runs it (the simulated device's device.programs.ProgramExecutor, whose
   prefetch is that fetch), with a footprint of what it reads and writes so
   the queue layer orders it against other streams' work. Program
   distribution fetches a program and its correction area ahead of
   execution; the Compute holds its fetch until it is ready (hold_fetch),
   and it requires the patch: if the patch failed, the compute fails
   without running, never on stale addresses.

A launch whose correction area already holds its slot words (each area's
last patch, done, wrote the same words, and every launch of that area since
had them too: a loop relaunching on the same buffers) is its Compute alone:
only this plan's patches write its areas, so there is nothing to transfer.

The two are enqueued under one hold of the queue, one launch after another
in the order they were handed over: every launch of a plan patches the same
two areas, so another thread's launch between this one's patch and its fetch
would hand this compute the other's addresses. ``set_preparation_streams(0)``
(or SPYRE_PREPARATION_STREAMS=0) puts both on the launch's own stream, as one
stream; results are the same.

``release_plan(plan)`` gives the plan's device memory back for an owner
that will not launch it again (an evicted eager entry): without waiting, as
a freed tensor's, once every stream the plan launched on has completed the
work enqueued before (each launch tells the allocator its streams, once per
stream and plan; the image transfer's stream is the allocation's own).

A launch that fails on the device stops its stream like any failed
operation (the error names the kernel); ``torch.spyre.clear_errors()``
makes the stream usable again.

``run_program(program, **tensors)`` runs a hand-written program once on given
tensors and waits: the same allocation and address encoding, without an
artifact directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import _C
from .binding import ArgSpec, ArgTable, LaunchError, slot_words
from .device.programs import ProgramExecutor
from .hardware import preparation_streams_from_env
from .program.operands import DTYPES, sticks
from .program.program import SIZE_BYTES, SLOT_BYTES, Program
from .program.run import Artifact, ProgramExecutable
from .program.validate import validate_once
from .queue import (Compute, DeviceAddress, Footprint, HostAddress, Range, Transfer,
                    TransferKind)
from .queue.runtime import current
from .sizes import SizeSpec, bind_sizes, dim_at, dim_max, dim_symbol, parse_dim, parse_sizes, size_words
from .tensors import address, footprint, storage_ranges
from .values import bind_values, host_positions, valued_area_bytes, valued_plan, value_inputs

__all__ = ["ArgSpec", "ArtifactError", "JobPlan", "LaunchError", "SizeSpec", "bind_sizes", "check_artifact_files",
           "launch_jobplan",
           "preparation_streams", "prepare_artifact", "prepare_kernel", "release_plan", "run_program", "set_prepare_each_launch",
           "set_preparation_streams", "write_correction_area"]

# 2: the launch spec records the size, sha256 (and the program's format) of the files it names
LAUNCH_FORMAT = 2


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


# Correction areas per plan: a launch patches one while the previous launch's compute may still
# read the other (its fetch has read it only once its compute is ready to run).
CORRECTION_AREAS = 2


@dataclass(frozen=True)
class CorrectionArea:
    """One of a plan's correction areas, and what a launch that uses it reads."""

    address: DeviceAddress      # where the patch lands
    artifact: Artifact          # the Compute's bindings: the allocation, fetched through this area
    program_reads: tuple[Range, ...]  # the run reads those and its temporaries


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
    # the program's device memory (kept alive by the plan; not in the repr, which would read it)
    allocation: torch.Tensor = field(repr=False)
    # Resolved once, when the plan is prepared, so a launch only binds:
    table: ArgTable | None = field(repr=False)  # None with sizes: _table_at
    areas: tuple[CorrectionArea, ...] = field(repr=False)
    temp_writes: tuple[Range, ...] = field(repr=False)  # the temporaries, if any: one launch at a time
    patch_bytes: int = field(repr=False)
    word_format: str = field(repr=False)  # struct format of the slot words
    patch_name: str = field(repr=False)
    turns: itertools.count = field(repr=False, compare=False)  # which area the next launch uses
    # launch_jobplan's reusable operations: (staging buffer, area, slot words) -> patch, and per
    # area the previous launch's compute with its slot words
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    last_compute: list = field(default_factory=lambda: [None] * CORRECTION_AREAS, repr=False, compare=False)
    # per area, the last launch that patched it (what the area holds once its patch is done), and
    # the lock under which a launch decides whether to patch and is handed over
    last_patched: list = field(default_factory=lambda: [None] * CORRECTION_AREAS, repr=False, compare=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    sizes: tuple[SizeSpec, ...] = ()  # the size symbols (issue 18) and the bounds the artifact serves
    tables: dict = field(default_factory=dict, repr=False, compare=False)  # with sizes: ArgTable per sizes
    # 0-d inputs a launch may give as host values (values.py), and those launches' view of the plan
    values: tuple[int, ...] = field(default=(), repr=False)
    valued: object = field(default=None, repr=False, compare=False)
    # The ticket of the transfer that loads the program image, until it has succeeded (then None;
    # shared with the valued view). Prepared on a stream that had failed, the load is skipped and
    # the image never written: the next launch loads it again (_load_image).
    image_load: list = field(default_factory=lambda: [None], repr=False, compare=False)
    # the streams whose launches may read the allocation (the allocator holds it for them once
    # freed: _use_streams), shared with the valued view, which launches from the same allocation
    streams: set = field(default_factory=set, repr=False, compare=False)


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
        shape = tuple(dim_max(d, bounds or {}) for d in arg.shape)
    except (KeyError, TypeError):
        shape = None
    symbolic_agree = len(dims) == len(arg.shape) and all(
        (e is None) == isinstance(d, int) and (e is None or _same_dim(e, d, bounds or {}))
        for e, d in zip(dims, arg.shape))
    if (sym.name, DTYPES[sym.dtype], tuple(sym.shape)) != (arg.name, arg.dtype, shape) or not strides_agree \
            or not symbolic_agree:
        raise ValueError(f"{where}: slot {slot} binds argument {arg.index} ({arg.name!r} {arg.dtype} "
                         f"{list(arg.shape)} strides {list(arg.stride)}) to the program's {sym.name!r} "
                         f"{sym.dtype} {list(sym.shape)} strides {list(sym.strides)}")


def _same_dim(expr, dim, bounds) -> bool:
    """The launch spec's symbolic dim is the program's at every size of the bounds (both are
    affine in the size up to the program's clamp: equal at the two ends, equal between)."""
    name = dim_symbol(dim)
    if expr.symbol != name or name not in bounds:
        return False
    return all(dim_at(dim, {name: v}) == expr.value({name: v}) for v in (bounds[name].min, bounds[name].max))


class ArtifactError(ValueError, OSError):
    """An artifact directory that cannot be used as it is: a file missing, truncated, altered or
    of another format. The message names the file and what is wrong; compiling the kernel again
    rebuilds the directory (backend.compile_kernel checks it with check_artifact_files).

    It is also an OSError, as a file that cannot be read is (like io.UnsupportedOperation, both
    ValueError and OSError): Inductor's FX graph cache treats an OSError raised while it loads a
    cached module (whose first lines call prepare_kernel) as a cache miss and compiles the graph
    again, so a cached graph whose artifact went bad is rebuilt instead of failing."""


def _json_file(path: Path):
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
    from .program.program import FORMAT_VERSION

    root = Path(artifact_dir)
    spec_path = root / "launch_spec.json"
    spec = _json_file(spec_path)
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
    if program_format != FORMAT_VERSION:
        raise ArtifactError(f"{root / spec['program']}: program format {program_format!r}; this runtime reads "
                            f"format {FORMAT_VERSION}")
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
    plan = _json_file(plan_path)  # (small: parsed here, its format checked, as the spec's)
    found = plan.get("format") if isinstance(plan, dict) else None
    if found != LAUNCH_FORMAT:
        raise ArtifactError(f"{plan_path}: execution plan format {found!r}; this runtime reads format "
                            f"{LAUNCH_FORMAT}")
    return spec


def prepare_kernel(artifact_dir, device: int | None = None) -> JobPlan:
    """Parse, validate, allocate and transfer the program of `artifact_dir` (once per artifact).

    An artifact that cannot be used raises ArtifactError (a ValueError) naming the file and what
    is wrong, before anything is allocated."""
    root = Path(artifact_dir)
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)
                               or not 0 <= device < _C.device_count()):
        raise ValueError(f"prepare_kernel: device must be a spyre device index in 0..{_C.device_count() - 1}, "
                         f"got {device!r}")
    try:
        spec = check_artifact_files(root)
        program_path, plan_path = root / spec["program"], root / spec["execution_plan"]
        try:
            program = Program.load(program_path)
        except ValueError as e:  # magic, version, checksum (the bytes are as recorded: written so)
            raise ArtifactError(f"{program_path}: {e}") from None
        for a in spec["args"]:
            if a["dtype"] not in DTYPES:
                raise ArtifactError(f"{root / 'launch_spec.json'}: argument {a['name']!r} has dtype "
                                    f"{a['dtype']!r}, not one of {sorted(DTYPES)}")
        args = tuple(ArgSpec(a["index"], a["name"], a["role"], DTYPES[a["dtype"]], tuple(map(parse_dim, a["shape"])),
                             tuple(a["stride"]), a["slot"]) for a in spec["args"])
        sizes = parse_sizes(spec)
        if tuple(s.name for s in sizes) != tuple(program.sizes):
            raise ArtifactError(f"{root / 'launch_spec.json'}: sizes {[s.name for s in sizes]}, the program's are "
                                f"{list(program.sizes)}")
        plan_doc = _json_file(plan_path)  # (its format checked with the files)
        try:
            steps = _steps(plan_doc, program, args, {s.name: s for s in sizes})
        except ValueError as e:  # the plan disagrees with the program or the launch spec
            raise ArtifactError(f"{plan_path}: {e}") from None
    except ArtifactError:
        raise
    except FileNotFoundError as e:
        raise ArtifactError(f"{root} is not a complete spyre artifact: {e.filename} is missing") from None
    except IsADirectoryError as e:
        raise ArtifactError(f"{root} is not a spyre artifact: {e.filename} is a directory, not a file") from None
    except OSError as e:
        raise ArtifactError(f"{root}: cannot read the artifact: {e}") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{root}: malformed artifact ({type(e).__name__}: {e})") from None
    except ValueError as e:
        raise ArtifactError(f"{root}: {e}") from None
    validate_once(program)  # ProgramExecutable will not validate it again
    device = _C.current_device() if device is None else device
    return _plan(spec["kernel"], root, device, program, args, steps, sizes)


def _plan(name: str, root: Path, device: int, program: Program, args, steps, sizes=()) -> JobPlan:
    values = value_inputs(args) if not sizes else ()
    valued_bytes = valued_area_bytes(program, len(values)) if values else 0
    alloc, artifact, offsets, load = _allocate(program, device, CORRECTION_AREAS, valued_bytes)
    region, base = artifact.region, artifact.offset
    image = Range(region, base + program.allocation_bytes, sticks(len(program.image())))
    temps = program.allocation_bytes - program.correction_bytes
    has_temps = any(sym.role == "temp" for sym in program.symbols)
    temp_ranges = (Range(region, base + program.correction_bytes, temps),) if has_temps and temps else ()
    areas = []
    for k, offset in enumerate(offsets):
        patched = Range(region, base + offset, program.correction_bytes if k < CORRECTION_AREAS else valued_bytes)
        areas.append(CorrectionArea(DeviceAddress(region, base + offset),
                                    Artifact(device, region, base, correction=base + offset),
                                    (image, patched, *temp_ranges)))
    resolve = steps[0]
    nwords = 2 * len(resolve.slots) + len(sizes)
    table = ArgTable(name, device, args, resolve.slots) if not sizes else None
    plan = JobPlan(name, root, device, program, args, steps, ProgramExecutor(ProgramExecutable(program)),
                   artifact, alloc, table, tuple(areas[:CORRECTION_AREAS]), temp_ranges,
                   steps[1].nbytes, f"<{nwords}q{steps[1].nbytes - 8 * nwords}x",
                   f"{name}: patch correction area", itertools.count(),
                   sizes=tuple(sizes), values=values, image_load=[load])
    if values:  # (the valued areas follow the others: _allocate)
        object.__setattr__(plan, "valued", valued_plan(plan, areas[CORRECTION_AREAS:]))
    return plan


def _table_at(plan: JobPlan, sizes: dict[str, int]) -> ArgTable:
    """The argument table of a plan with size symbols, at the launch's sizes (kept per sizes)."""
    key = tuple(sizes[s.name] for s in plan.sizes)
    table = plan.tables.get(key)
    if table is None:
        concrete = tuple(dataclasses.replace(a, shape=tuple(dim_at(d, sizes) for d in a.shape)) for a in plan.args)
        for a in concrete:
            if any(n < 0 for n in a.shape):
                raise LaunchError(f"kernel {plan.name!r} argument {a.index} ({a.name!r}): its shape at sizes "
                                  f"{sizes} is {list(a.shape)}")
        table = ArgTable(plan.name, plan.device, concrete, plan.steps[0].slots)
        if len(plan.tables) >= 64:
            plan.tables.clear()
        plan.tables[key] = table
    return table


def _allocate(program: Program, device: int, areas: int = 1,
              valued_bytes: int = 0) -> tuple[torch.Tensor, Artifact, tuple[int, ...], object]:
    """The program's device allocation, [correction area][temporaries][image][more correction
    areas][as many valued areas (values.py), if `valued_bytes`], filled in stream order on the
    current stream (a pinned host copy and one H2D transfer). Returns it, the Artifact, each
    correction area's offset in the allocation (the valued ones last), and the transfer's ticket."""
    image = program.image()
    end = program.allocation_bytes + sticks(len(image))
    offsets = (program.correction_offset,) + tuple(end + k * program.correction_bytes for k in range(areas - 1))
    total = end + (areas - 1) * program.correction_bytes
    if valued_bytes:
        offsets += tuple(total + k * valued_bytes for k in range(areas))
        total += areas * valued_bytes
    host = torch.zeros(total, dtype=torch.uint8, pin_memory=True)
    host[program.allocation_bytes:program.allocation_bytes + len(image)] = \
        torch.frombuffer(bytearray(image), dtype=torch.uint8)
    alloc = torch.empty(host.numel(), dtype=torch.uint8, device=torch.device("spyre", device))
    load = current().queue(device).enqueue(_C.current_stream_id(device),
                                           Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), address(alloc),
                                                    host.numel(), keepalive=host, label=f"{program.name}: load"))
    piece = storage_ranges(alloc.untyped_storage())[0]
    return alloc, Artifact(device, piece.region, piece.offset), offsets, load


def _load_image(plan: JobPlan) -> None:
    """Load the program image again, on the current stream: its last load failed or was skipped
    (prepared on a stream that had failed), so the image bytes are not the program's. Only the
    image: the correction areas hold what the plan's patches wrote, which launches rely on."""
    with plan.lock:
        load = plan.image_load[0]
        if load is None or not load.done or load.succeeded or plan.allocation is None:
            return  # (released: the launch refuses it)
        stream = _C.current_stream_id(plan.device)
        _use_streams(plan, plan.device, (stream,))  # (this load writes the allocation on it)
        image = plan.program.image()
        host = torch.zeros(sticks(len(image)), dtype=torch.uint8, pin_memory=True)
        host[:len(image)] = torch.frombuffer(bytearray(image), dtype=torch.uint8)
        where = DeviceAddress(plan.artifact.region, plan.artifact.offset + plan.program.allocation_bytes)
        plan.image_load[0] = current().queue(plan.device).enqueue(
            stream,
            Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), where, host.numel(), keepalive=host,
                     label=f"{plan.name}: load again"))


# ---- launching ------------------------------------------------------------------------------


def launch_jobplan(plan: JobPlan, args, sizes=()) -> None:
    """Enqueue one launch of `plan` on the current stream (asynchronous; see the module docstring).
    `sizes`: the values of the kernel's size symbols (issue 18), in launch-spec order."""
    if not isinstance(args, (list, tuple)):
        raise LaunchError(f"kernel {plan.name!r}: arguments must be a list of tensors in launch-spec order, "
                          f"got {type(args).__name__}")
    if _prepare_each_launch:
        plan = prepare_kernel(plan.artifact_dir, plan.device)
    load = plan.image_load[0]
    if load is not None and load.done:  # (once loaded, None: nothing to look at)
        if load.succeeded:
            plan.image_load[0] = None
        else:
            _load_image(plan)
    if plan.values and not sizes and (host := host_positions(plan, args)):
        # 0-d inputs given as host values: their bytes travel in a valued correction area (values.py)
        plan, table, bound, extra, turn = bind_values(plan, args, host)
    elif plan.sizes or sizes:
        values = bind_sizes(plan, sizes)
        table = _table_at(plan, values)
        bound, extra, turn = table.check(args), tuple(size_words(plan.program, values)), None
    else:
        table, bound, extra, turn = plan.table, plan.table.check(args), (), None
    device = plan.device
    stream = _C.current_stream_id(device)
    prep = preparation_stream(device, stream)
    # the slot words follow from these alone (the table: which slot is which argument, and with
    # host values which are sticks of the area; held, so no other table takes its id)
    words_key = (table, bound, extra, _C.region_epoch())
    queue = current().queue(device)
    with plan.lock:
        if plan.allocation is None:
            raise LaunchError(f"kernel {plan.name!r}: its plan was released (release_plan); prepare the artifact "
                              f"again to launch it")
        if stream not in plan.streams or prep not in plan.streams:
            _use_streams(plan, device, (stream, prep))
        if turn is None:  # (a launch with host values has its area already: its slot words name it)
            turn = next(plan.turns) % len(plan.areas)
        last = plan.last_patched[turn]
        if last is not None and last.words_key == words_key and last.patch_done():
            # The area already holds these words (nothing but this plan's patches writes it, and
            # every launch of this area since that patch had the same ones): no patch to enqueue.
            launch = _Launch(plan, turn, stream, prep, table, bound, extra, tuple(args), words_key, False)
            queue.submit(launch, (stream,))
        else:
            launch = plan.last_patched[turn] = _Launch(plan, turn, stream, prep, table, bound, extra,
                                                       tuple(args), words_key, True)
            queue.submit(launch, (prep, stream))


def _use_streams(plan: JobPlan, device: int, streams) -> None:
    """Tell the allocator that launches on `streams` read the plan's allocation: once it is freed
    (release_plan, or the plan dropped), its bytes are reused only after each of them has
    completed the work enqueued before, these launches among it (their sequence numbers are
    taken at submit). Once per stream and plan; the plan's lock is held."""
    for sid in streams:
        if sid not in plan.streams:
            kind = torch.accelerator.current_stream(device).device_type  # (spyre's number, as torch.Stream takes it)
            plan.allocation.record_stream(torch.Stream(stream_id=sid, device_index=device, device_type=kind))
            plan.streams.add(sid)


def release_plan(plan: JobPlan) -> None:
    """Give back the plan's device memory (program image, temporaries, correction areas) once the
    launches already made of it are done; launching it afterwards raises LaunchError. It does not
    wait: the allocator keeps the bytes until every stream the plan launched on has completed the
    work enqueued before this call (launches handed over and not yet enqueued included), as it
    does for a tensor freed while streams still use it. For a plan whose owner goes away (an
    evicted eager entry's compiled graph): dropping the plan unreleased frees the same bytes under
    the same rule, but only when the garbage collector gets to it."""
    views = (plan,) if plan.valued is None else (plan, plan.valued.plan)
    for view in views:
        with view.lock:
            # (the valued view's launches take its own lock: each view is let go under its own)
            object.__setattr__(view, "allocation", None)
            view.memo.clear()
            view.last_compute[:] = [None] * len(view.last_compute)
            view.last_patched[:] = [None] * len(view.last_patched)


class _Launch:
    """One launch handed to the queue (DeviceQueue.submit): its operations are made, and its
    staging buffer drawn, by whoever enqueues it, holding the queue. A launch whose area
    already holds its slot words (`patches` False) is its compute alone."""

    __slots__ = ("plan", "turn", "stream", "prep", "table", "bound", "extra", "args", "staged", "words_key",
                 "patches", "patch_ticket", "requires")

    def __init__(self, plan: JobPlan, turn: int, stream: int, prep: int, table: ArgTable, bound: tuple,
                 extra: tuple, args: tuple, words_key: tuple, patches: bool):
        self.plan, self.turn, self.stream, self.prep = plan, turn, stream, prep
        self.table, self.bound, self.extra = table, bound, extra  # extra: the size words, if any
        # Held until enqueued: an argument freed meanwhile keeps its block, which `bound` names,
        # even when the allocator would not wait for this stream (one it was not allocated on).
        self.args = args
        self.staged = None
        self.words_key, self.patches, self.patch_ticket = words_key, patches, None
        # The compute (operation 1) holds for the patch (operation 0), on whichever stream that
        # runs, and is skipped if the patch failed: never run on another launch's addresses.
        self.requires = _COMPUTE_REQUIRES_PATCH if patches else None

    def patch_done(self) -> bool:
        """Its patch ran to completion: the area holds its words."""
        t = self.patch_ticket
        return t is not None and t.succeeded

    def runs(self):
        plan, turn = self.plan, self.turn
        area = plan.areas[turn]
        resolved = self.table.resolve(self.bound)  # the same object while the binding is the same
        last = plan.last_compute[turn]  # (resolved, size words, slot words, Compute) of the area's last launch
        if last is not None and last[0] is resolved and last[1] == self.extra:
            words, compute = last[2], last[3]
        else:
            words, reads, writes = resolved
            words += self.extra
            compute = Compute(plan.executor, area.artifact,
                              Footprint(reads=reads + area.program_reads, writes=writes + plan.temp_writes),
                              name=plan.name, hold_fetch=True)
            plan.last_compute[turn] = (resolved, self.extra, words, compute)
        if not self.patches:
            return ((self.stream, (compute,)),)
        # Completion-gated: no transfer still reads the buffer, so it is filled now, not in the stream.
        staged = self.staged = current().staging.acquire(plan.patch_bytes)
        struct.pack_into(plan.word_format, staged.host_buffer(), 0, *words)
        # The operations are immutable: a launch with an earlier one's staging buffer and area
        # reuses its patch (a loop relaunching builds nothing).
        key = (staged.address, turn)
        patch = plan.memo.get(key)
        if patch is None:
            patch = Transfer(TransferKind.H2D, HostAddress(staged.address), area.address, plan.patch_bytes,
                             keepalive=staged.memory, label=plan.patch_name)
            if len(plan.memo) >= 64:
                plan.memo.clear()
            plan.memo[key] = patch
        if self.prep == self.stream:
            return ((self.stream, (patch, compute)),)
        return ((self.prep, (patch,)), (self.stream, (compute,)))

    def enqueued(self, tickets) -> None:
        if self.staged is not None:
            # Not enqueued (an error on the way): nothing reads the buffer, it is free at once.
            current().staging.release(self.staged, tickets[0] if tickets else None)
            if tickets:
                self.patch_ticket = tickets[0]
        self.staged = self.args = None


_COMPUTE_REQUIRES_PATCH = {1: (0,)}


# ---- the old way, kept to measure against -----------------------------------------------------

_prepare_each_launch = False


def set_prepare_each_launch(enabled: bool) -> None:
    """Prepare the artifact again on every launch (read, decode, validate, allocate, transfer
    the image), as a runtime that builds its launch graph per call does: for benchmarks that
    measure what preparing once saves (benchmarks/launch.py). Off by default."""
    global _prepare_each_launch
    _prepare_each_launch = bool(enabled)


# ---- preparation streams --------------------------------------------------------------------

_prep_lock = threading.Lock()
_prep_streams: dict[tuple[int, int], tuple[int, ...]] = {}
_prep_turn = itertools.count()
_preparation_streams = preparation_streams_from_env()


def set_preparation_streams(n: int) -> None:
    """How many preparation streams each compute stream's launches use: 0 puts the host
    callback and correction transfer on the compute stream itself (one stream, as before),
    1 (the default) on a stream of their own, more deals launches over that many."""
    global _preparation_streams
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 8:
        raise ValueError(f"set_preparation_streams: n must be an integer in 0..8, got {n!r}")
    with _prep_lock:
        _preparation_streams = n


def preparation_streams() -> int:
    return _preparation_streams


def preparation_stream(device: int, stream: int) -> int:
    """The stream a launch on (device, stream) patches its correction area on."""
    n = _preparation_streams
    if n == 0:
        return stream
    streams = _prep_streams.get((device, stream))
    if streams is None or len(streams) < n:
        with _prep_lock:
            streams = _prep_streams.get((device, stream), ())
            while len(streams) < n:
                streams += (torch.Stream(device=torch.device("spyre", device)).stream_id,)
            _prep_streams[(device, stream)] = streams
    return streams[0] if n == 1 else streams[next(_prep_turn) % n]


# ---- running a (hand-written) program once, blocking ------------------------------------


def prepare_artifact(program: Program, device: int) -> tuple[torch.Tensor, Artifact]:
    """The program's device allocation, filled before this returns (see _allocate)."""
    alloc, artifact, _, _ = _allocate(program, device)
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    return alloc, artifact


def write_correction_area(program: Program, alloc: torch.Tensor, bound: dict[str, torch.Tensor],
                          sizes: dict[str, int] | None = None) -> None:
    """Resolve the placeholders now: each bound tensor's (region, offset) into its slot, and the
    size words (blocking, after the stream's earlier work; compiled launches stage this in stream
    order instead)."""
    device = alloc.device.index
    current().queue(device).synchronize_stream(_C.current_stream_id(device))
    words = slot_words([bound[s.name] for s in program.placeholders])
    missing = [n for n in program.sizes if n not in (sizes or {})]
    if missing:
        raise TypeError(f"program {program.name!r}: no value for size(s) {', '.join(missing)}")
    if program.sizes:
        words += size_words(program, sizes)
    start = program.correction_offset
    area = _C.host_alias(alloc)[start:start + program.correction_bytes]
    area.zero_()
    struct.pack_into(f"<{len(words)}q", area.numpy(), 0, *words)


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
