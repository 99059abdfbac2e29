"""The launch layer: launch a prepared plan per call on the current stream.

``launch_jobplan(plan, args)`` (plan: prepare.prepare_kernel's JobPlan) only
binds: it checks the arguments against the launch spec (raising, naming the
argument and both values, before anything is enqueued: a bad call leaves the
device untouched), reads each argument's storage address, and hands the launch
to the device's queue (DeviceQueue.submit: its sequence numbers are taken
then, so the allocator keeps a tensor freed after the call until the launch is
done). Whoever enqueues it next (a thread that waits or enqueues, or the
queue's submission worker) resolves the addresses to (region, offset) slot
words, remembered per binding, and enqueues two typed operations for the four
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
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import threading

import torch

from . import _C
from .binding import ArgTable, LaunchError
from .hardware import preparation_streams_from_env
from .prepare import JobPlan, load_image, prepare_kernel, use_streams
from .queue import Compute, Footprint, HostAddress, Transfer, TransferKind
from .queue.runtime import current
from .sizes import bind_sizes, dim_at, size_words
from .values import bind_values, host_positions

__all__ = ["launch_jobplan", "preparation_stream", "preparation_streams", "release_plan", "set_prepare_each_launch",
           "set_preparation_streams"]


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
            load_image(plan)
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
            use_streams(plan, device, (stream, prep))
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
