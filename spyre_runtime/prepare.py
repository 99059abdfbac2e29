"""Preparing a compiled artifact once: the plan every launch of it binds.

``prepare_kernel(artifact_dir)`` does everything that depends only on the
artifact, once: it reads the artifact (program, launch spec, execution
plan; artifact.py checks the files), parses and validates the program,
allocates its device memory ([correction area][temporaries][program image]
[second correction area], program.py) and transfers the image there (an h2d
Transfer on the current stream), turns the execution plan into typed steps,
each checked against the program it drives, and resolves what every launch
needs (binding.ArgTable: the argument checks and the slot layout; each
correction area's address and footprints; the names of the operations). The
result is a JobPlan, which launch.py launches per call.

A plan's image is loaded again by the next launch if its load failed or was
skipped (prepared on a stream that had failed: load_image), and the allocator
keeps the plan's memory for every stream its launches read it on
(use_streams).
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import _C
from .artifact import ARTIFACTS_ENV, ArtifactError, check_artifact_files, collect, json_file
from .binding import ArgSpec, ArgTable
from .device.programs import ProgramExecutor
from .program.operands import DTYPES, sticks
from .program.program import SIZE_BYTES, SLOT_BYTES, Program
from .program.run import Artifact, ProgramExecutable
from .program.validate import validate_once
from .queue import DeviceAddress, HostAddress, Range, Transfer, TransferKind
from .queue.runtime import current
from .sizes import SizeSpec, dim_at, dim_max, dim_symbol, parse_dim, parse_sizes
from .tensors import address, storage_ranges
from .values import valued_area_bytes, valued_plan, value_inputs


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
    table: ArgTable | None = field(repr=False)  # None with sizes: launch._table_at
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
    # the image never written: the next launch loads it again (load_image).
    image_load: list = field(default_factory=lambda: [None], repr=False, compare=False)
    # the streams whose launches may read the allocation (the allocator holds it for them once
    # freed: use_streams), shared with the valued view, which launches from the same allocation
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


def prepare_kernel(artifact_dir, device: int | None = None) -> JobPlan:
    """Parse, validate, allocate and transfer the program of `artifact_dir` (once per artifact).

    An artifact that cannot be used raises ArtifactError (a ValueError) naming the file and what
    is wrong, before anything is allocated."""
    root = Path(artifact_dir)
    collect_into = os.environ.get(ARTIFACTS_ENV)
    if collect_into:  # a run's kernels by name (spyre-inspect list $SPYRE_ARTIFACTS)
        collect(root, collect_into)
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
        plan_doc = json_file(plan_path)  # (its format checked with the files)
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
    alloc, artifact, offsets, load = allocate(program, device, CORRECTION_AREAS, valued_bytes)
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
    if values:  # (the valued areas follow the others: allocate)
        object.__setattr__(plan, "valued", valued_plan(plan, areas[CORRECTION_AREAS:]))
    return plan


def allocate(program: Program, device: int, areas: int = 1,
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


def load_image(plan: JobPlan) -> None:
    """Load the program image again, on the current stream: its last load failed or was skipped
    (prepared on a stream that had failed), so the image bytes are not the program's. Only the
    image: the correction areas hold what the plan's patches wrote, which launches rely on."""
    with plan.lock:
        load = plan.image_load[0]
        if load is None or not load.done or load.succeeded or plan.allocation is None:
            return  # (released: the launch refuses it)
        stream = _C.current_stream_id(plan.device)
        use_streams(plan, plan.device, (stream,))  # (this load writes the allocation on it)
        image = plan.program.image()
        host = torch.zeros(sticks(len(image)), dtype=torch.uint8, pin_memory=True)
        host[:len(image)] = torch.frombuffer(bytearray(image), dtype=torch.uint8)
        where = DeviceAddress(plan.artifact.region, plan.artifact.offset + plan.program.allocation_bytes)
        plan.image_load[0] = current().queue(plan.device).enqueue(
            stream,
            Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), where, host.numel(), keepalive=host,
                     label=f"{plan.name}: load again"))


def use_streams(plan: JobPlan, device: int, streams) -> None:
    """Tell the allocator that launches on `streams` read the plan's allocation: once it is freed
    (release_plan, or the plan dropped), its bytes are reused only after each of them has
    completed the work enqueued before, these launches among it (their sequence numbers are
    taken at submit). Once per stream and plan; the plan's lock is held."""
    for sid in streams:
        if sid not in plan.streams:
            kind = torch.accelerator.current_stream(device).device_type  # (spyre's number, as torch.Stream takes it)
            plan.allocation.record_stream(torch.Stream(stream_id=sid, device_index=device, device_type=kind))
            plan.streams.add(sid)
