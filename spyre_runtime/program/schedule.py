"""Running a program fast: its data instructions in a precomputed order over views bound once.

The general interpreter (execute.py) steps every unit, reads every loop counter
and builds every operand view again for each instruction it runs. None of that
depends on the data: loop counts and queue pushes and pops are static, so the
order the interpreter runs the data instructions in is a property of the
program, and the views a run needs are a property of its bound addresses.

* `Schedule` (once per program): the interpreter's own walk of the control flow,
  without data (``Machine(functional=False)``), recording each data
  instruction with its loop indices in the order it ran. A walk that fails (a
  deadlock) leaves the program to the general interpreter, which raises
  as it always has.
* `BoundRun` (once per program, bound addresses and scratchpad bank): each
  scheduled instruction turned into a callable over views resolved now, by the
  instruction's own fast form (``bind`` in isa.py; ``run`` when it has none,
  e.g. gathers and scatters, whose addresses come from the data). When no two
  cores share data (no ring sends, no device bytes one core writes and another
  touches), the cores' streams are independent but for what the ring carries:
  in rounds, every core's next instruction that waits for nothing another core
  has yet to do runs, alike ones as one operation over all their tiles (the bank
  keeps every core's scratchpad in one tensor), keeping each core's own order.
  What one core must wait for is the schedule's own: a ring send into bytes
  another core touches, ordered as the interpreter ordered the two. Before the
  rounds, each core's back-to-back loads (stores) that continue one another are
  joined into one (`coalesce`); in a round, alike instructions at different pcs
  go together when their cores are then evenly spaced (`BoundRun._regroup`), and
  a group a fast form cannot take whole goes in evenly spaced runs of cores
  (`spaced_runs`) before one core at a time.

A failing operation is run again one instruction at a time by the general
semantics, so the error names the core, unit and instruction as the
interpreter's does (the failing instructions check before they write).
"""

from __future__ import annotations

import collections
import functools
from dataclasses import fields

import torch

from . import isa
from .execute import Machine, ScratchBank, failure, run_one
from .operands import COMPUTE, DTYPES, ITEMSIZE, Addr, DevAddr, Tile, sticks
from .validate import ProgramError

MAX_BOUND_STEPS = 200_000  # a longer schedule is run by `run` in order (views are built per step)
# Batching across cores pays where each instruction's overhead outweighs its work: small tiles.
# Over big tiles it loses what the interpreter's order keeps: one core's tile stays in the host's
# cache from one instruction to the next (measured: a 4096 x 4096 softmax on 32 cores ran 2-5x
# slower batched). So a schedule is batched only when its steps average at most this many bytes.
BATCH_STEP_BYTES = 16 * 1024


class Schedule:
    """The order a program's data instructions run in: [(core, unit, pc, instruction, loop indices)]."""

    def __init__(self, program, scratchpad_bytes: int):
        steps: list = []
        walk = Machine(program, {}, scratchpad_bytes, None, functional=False, trace=steps)
        walk.run()
        self.steps = steps
        # Loops counted on chip (issue 31), walked at their maximum: per step the count words that
        # skip it when 0 (a run reads each once, when first needed); a program qualifies only if
        # nothing writes a count word once a loop has read it (then the words' values after a run
        # are the ones every loop read, and time the run: `count_words`)
        self.guards = walk.guards if any(walk.guards) else None
        self.count_words = tuple(sorted(walk.count_words))
        self.counted = not walk.count_words or _counts_written_first(steps, walk.guards, walk.count_words)
        self.shares_scratchpads = any(touch[0] == "sp_rows_on" for _, _, _, ins, _ in steps
                                      for touch in ins.touches())
        # step -> the steps of other cores it must follow (scratchpad addresses are static)
        self.after = ring_order(steps) if self.shares_scratchpads else {}
        sizes = {}
        for _, _, _, ins, _ in steps:
            if id(ins) not in sizes:
                sizes[id(ins)] = step_bytes(ins)
        self.mean_step_bytes = sum(sizes[id(ins)] for _, _, _, ins, _ in steps) / max(len(steps), 1)
        self._joined = None

    def joined(self):
        """(steps, parts, absorbed) for a batched run: `steps` with each core's back-to-back
        transfers that continue one another joined (coalesce)."""
        if self._joined is None:
            self._joined = coalesce(self.steps, self.after)
        return self._joined


def _counts_written_first(steps, guards, words) -> bool:
    """Whether every write of a count word comes before the first step a loop reading it guards."""
    first: dict = {}
    for k, g in enumerate(guards):
        for core, addr, _ in g:
            first.setdefault((core, addr), k)
    for k, (core, _, _, ins, idx) in enumerate(steps):
        for touch, mode in zip(ins.touches(), ins.scratch_modes()):
            if "w" not in mode:
                continue
            owner, lo, hi = _scratch_spans(touch, idx, core)
            for wcore, addr, dtype in words:
                if wcore == owner and lo < addr + ITEMSIZE[dtype] and addr < hi and k >= first.get((wcore, addr), k + 1):
                    return False
    return True


def step_bytes(ins) -> int:
    """The most bytes one operand of `ins` spans (its work, for the batching choice)."""
    most = 0
    for touch in ins.touches():
        if touch[0] == "tile" and touch[1] is not None:
            rows, cols = touch[1].stored_shape
            most = max(most, rows * cols * ITEMSIZE[touch[1].dtype])
        elif touch[0] in ("sp_rows", "dev_rows"):
            most = max(most, touch[2] * touch[3])
    return most


def _scratch_spans(touch, idx, core: int):
    """(whose scratchpad, first byte, end byte) of one scratchpad access of `touches` (rows and
    the gaps between them: a superset orders more, never less)."""
    kind = touch[0]
    if kind == "tile":
        tile = touch[1]
        rows, cols = tile.stored_shape
        addr, nbytes, stride = tile.addr.at(idx), cols * ITEMSIZE[tile.dtype], tile.row_stride
    elif kind == "sp_rows":
        _, a, rows, nbytes, stride = touch
        addr = a.at(idx)
    else:  # "sp_rows_on"
        _, core, a, rows, nbytes, stride = touch
        addr = a.at(idx)
    last = addr + (rows - 1) * stride
    return core, min(addr, last), max(addr, last) + nbytes


def ring_order(steps) -> dict[int, set[int]]:
    """Per step (its index), the earlier steps of other cores that touch the same scratchpad
    bytes, one of the two writing: what a ring send couples. Only a send touches another
    core's scratchpad, so only pairs with a send's far side are compared."""
    accesses = collections.defaultdict(list)  # scratchpad owner -> [(lo, hi, writes, step, core)]
    foreign = []
    for k, (core, _, _, ins, idx) in enumerate(steps):
        for touch, mode in zip(ins.touches(), ins.scratch_modes()):
            if not mode:
                continue
            owner, lo, hi = _scratch_spans(touch, idx, core)
            access = (lo, hi, "w" in mode, k, core)
            accesses[owner].append(access)
            if owner != core:
                foreign.append((owner, access))
    after: dict[int, set[int]] = collections.defaultdict(set)
    for owner, (lo, hi, writes, k, core) in foreign:
        for olo, ohi, owrites, j, other in accesses[owner]:
            if other != core and (writes or owrites) and olo < hi and lo < ohi:
                first, then = (j, k) if j < k else (k, j)
                after[then].add(first)
    return dict(after)


# Fast forms whose bind raised, by (instruction, exception): the general semantics ran those steps,
# correctly but slowly; a bug in a fast form shows here rather than only in the time (tests).
BIND_ERRORS: collections.Counter = collections.Counter()


class Binder:
    """Operand views resolved once, for the instructions' fast forms (isa.py ``bind``).

    Every method takes one operand per member of a group (cores running the same
    instruction) and returns one view with a leading axis over the members, or
    None when the members' addresses are not evenly spaced (or leave their bounds).
    """

    NOTHING = object()  # a fast form with nothing to do (fence)

    def __init__(self, buffers: dict[str, torch.Tensor], bank: ScratchBank):
        self.buffers, self.bank = buffers, bank
        self.sp_bytes = bank.nbytes

    @staticmethod
    def _spacing(starts: list[int]) -> int | None:
        if len(starts) == 1:
            return 0
        step = starts[1] - starts[0]
        if step < 0:  # as_strided takes no negative strides (members in descending addresses)
            return None
        return step if all(s == starts[0] + k * step for k, s in enumerate(starts)) else None

    def _rows_fit(self, addr: int, rows: int, nbytes: int, stride: int, limit: int) -> bool:
        last = addr + (rows - 1) * stride
        return rows > 0 and stride >= 0 and addr >= 0 and last + nbytes <= limit

    def sp_rows(self, members: list[tuple[int, int]], rows: int, nbytes: int, stride: int):
        """[(core, scratchpad byte address)] -> uint8 view (members, rows, nbytes) into the bank."""
        S = self.sp_bytes
        if any(not 0 <= core < self.bank.cores or not self._rows_fit(addr, rows, nbytes, stride, S)
               for core, addr in members):
            return None
        starts = [core * S + addr for core, addr in members]
        step = self._spacing(starts)
        if step is None:
            return None
        return torch.as_strided(self.bank.data, (len(members), rows, nbytes), (step, stride, 1), starts[0])

    def dev_rows(self, symbol: str, offsets: list[int], rows: int, nbytes: int, stride: int):
        """Byte offsets into a device buffer -> uint8 view (members, rows, nbytes)."""
        buf = self.buffers[symbol]
        if any(not self._rows_fit(o, rows, nbytes, stride, buf.numel()) for o in offsets):
            return None
        step = self._spacing(offsets)
        if step is None:
            return None
        return torch.as_strided(buf, (len(offsets), rows, nbytes), (step, stride, 1),
                                buf.storage_offset() + offsets[0])

    def tile(self, members):
        """[(core, Tile, loop indices)], tiles alike but for where -> (members, *stored shape) in the tile's dtype."""
        _, tile, _ = members[0]
        size, S = ITEMSIZE[tile.dtype], self.sp_bytes
        rows, cols = tile.stored_shape
        starts = []
        for core, t, idx in members:
            addr = t.addr.at(idx)
            if (not 0 <= core < self.bank.cores or t.shape_key != tile.shape_key or addr % size
                    or t.row_stride % size or not self._rows_fit(addr, rows, cols * size, t.row_stride, S)):
                return None
            starts.append((core * S + addr) // size)
        step = self._spacing(starts)
        if step is None:
            return None
        return torch.as_strided(self.bank.typed(DTYPES[tile.dtype]), (len(members), rows, cols),
                                (step, tile.row_stride // size, 1), starts[0])

    @staticmethod
    def operand(view: torch.Tensor, tile) -> torch.Tensor | None:
        """What Machine.read gives for `tile` over a bound view if that is the view itself (its
        dtype is the arithmetic type; broadcasts expanded), else None: a conversion per run."""
        if view.dtype != COMPUTE[tile.dtype]:
            return None
        return view.expand(view.shape[:-2] + (tile.rows, tile.cols)) if tile.broadcast != "none" else view

    @staticmethod
    def reader(view: torch.Tensor, tile, dtype: torch.dtype | None = None):
        """What Machine.read gives for `tile` over a bound view: its arithmetic type, broadcasts expanded."""
        dtype = dtype or COMPUTE[tile.dtype]
        shape = view.shape[:-2] + (tile.rows, tile.cols)
        if view.dtype == dtype:  # .to() would return the view itself: expand once, now
            value = view.expand(shape) if tile.broadcast != "none" else view
            return lambda: value
        if tile.broadcast != "none":
            return lambda: view.to(dtype).expand(shape)
        return lambda: view.to(dtype)


    @staticmethod
    def buffer(shape, dtype: torch.dtype) -> torch.Tensor:
        return member_buffer(shape, dtype)

    @staticmethod
    def converted(view: torch.Tensor, tile, dtype: torch.dtype):
        """(refresh, value): `value` is what Machine.read gives for `tile` over a bound view once
        `refresh()` ran (None: nothing to run, the view is read as it is); a conversion is made
        into a buffer allocated now, so a fast form may keep slices of it (one member each)."""
        shape = view.shape[:-2] + (tile.rows, tile.cols)
        if view.dtype == dtype:
            return None, (view.expand(shape) if tile.broadcast != "none" else view)
        buffer = member_buffer(view.shape, dtype)
        return functools.partial(buffer.copy_, view), (buffer.expand(shape) if tile.broadcast != "none" else buffer)

    @staticmethod
    def into(view: torch.Tensor, tile, dtype: torch.dtype):
        """As `reader`, converting into a buffer of its own allocated now (a conversion per run,
        no allocation per run): for operands a fast form reads once per run and does not keep."""
        if view.dtype == dtype:
            return Binder.reader(view, tile, dtype)
        buffer = torch.empty(view.shape, dtype=dtype)
        value = buffer.expand(view.shape[:-2] + (tile.rows, tile.cols)) if tile.broadcast != "none" else buffer
        return lambda: (buffer.copy_(view), value)[1]


def member_buffer(shape, dtype: torch.dtype) -> torch.Tensor:
    """An empty (members, rows, cols) tensor whose members each start on 64 bytes, as a tensor
    of their own would (a library kernel may take another path over unaligned operands)."""
    members, rows, cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    slot = -(-rows * cols * size // 64) * 64 // size
    return torch.empty(members * slot, dtype=dtype).as_strided((members, rows, cols), (slot, cols, 1))


def _device_spans(steps, buffers):
    """Per step, the device bytes it touches as (address lo, hi, writes), from `touches`."""
    spans = []
    for core, _, _, ins, idx in steps:
        mine = []
        for touch in ins.touches():
            kind = touch[0]
            if kind == "dev_rows":
                _, addr, rows, nbytes, stride = touch
                buf = buffers[addr.symbol]
                start = buf.data_ptr() + addr.at(idx)
                last = start + (rows - 1) * stride
                mine.append((min(start, last), max(start, last) + nbytes, ins.writes_device))
            elif kind == "dev_indirect":  # data-dependent rows: the whole buffer
                buf = buffers[touch[1].symbol]
                mine.append((buf.data_ptr(), buf.data_ptr() + buf.numel(), ins.writes_device))
        spans.append((core, mine))
    return spans


def cores_independent(steps, buffers) -> bool:
    """No device byte one core writes is touched by another core."""
    events = sorted((lo, hi, core, w) for core, mine in _device_spans(steps, buffers) for lo, hi, w in mine
                    if hi > lo)
    # Swept by start: an earlier interval overlaps this one iff it ends after this one starts, so
    # per core the furthest end of what it touched (and of what it wrote) so far is enough.
    reach: dict[int, int] = {}
    wrote: dict[int, int] = {}
    for lo, hi, core, w in events:
        for other, end in (reach if w else wrote).items():
            if other != core and end > lo:
                return False
        reach[core] = max(reach.get(core, hi), hi)
        if w:
            wrote[core] = max(wrote.get(core, hi), hi)
    return True


class BoundRun:
    """One program's schedule bound to buffers and a scratchpad bank: `run()` runs it."""

    def __init__(self, schedule: Schedule, program, buffers: dict[str, torch.Tensor], bank: ScratchBank):
        self.program, self.bank = program, bank
        self.parts: dict[int, list] = {}  # id of a joined step -> the program's steps it joins
        self.absorbed: set[int] = set()  # ids of steps a joined step does (they do nothing themselves)
        self.machine = m = Machine(program, buffers, bank.nbytes)
        m.bank = bank  # never released by this machine: the bound run's caller owns the bank
        steps = schedule.steps
        self.guards = schedule.guards
        if self.guards is not None:  # (each step its own operation: its count words are its core's)
            self.words = {w: bank.core(w[0])[w[1]:w[1] + ITEMSIZE[w[2]]].view(DTYPES[w[2]])
                          for g in self.guards for w in g}
            self.guard_of: list = []
        if self.guards is not None or schedule.mean_step_bytes > BATCH_STEP_BYTES or \
                not cores_independent(steps, buffers):
            groups = [[s] for s in steps]
            self.batched = False
        else:
            steps, self.parts, self.absorbed = schedule.joined()
            groups = _round_groups(steps, schedule.after, functools.partial(self._regroup, bank.nbytes))
            self.batched = True
        b = Binder(buffers, bank)
        self.ops: list = []
        self._index = {id(step): k for k, step in enumerate(steps)}
        for group in groups:
            self._bind(b, group)
        del self._index

    def _regroup(self, sp_bytes: int, groups: list) -> list:
        """A round's groups (by unit and pc), those of the same instruction at different pcs taken
        as one where their cores are then evenly spaced: a combining core runs the others'
        loads, transposes and products at pcs of its own, and would cut their round in runs."""
        alike: dict = {}
        for group in groups:
            live = [step for step in group if id(step) not in self.absorbed]
            if live:
                alike.setdefault((live[0][1], _likeness(live[0][3])), []).append(live)
        out = []
        for same in alike.values():
            if len(same) > 1:
                union = sorted((step for group in same for step in group), key=lambda step: step[0])
                if len(spaced_runs(union, sp_bytes)) == 1:
                    out.append(union)
                    continue
            out.extend(same)
        return out

    def _bind(self, b: Binder, group) -> None:
        if self.absorbed:
            group = [step for step in group if id(step) not in self.absorbed]
            if not group:
                return
        cls = type(group[0][3])
        try:
            fn = cls.bind(b, [(core, ins, idx) for core, _, _, ins, idx in group])
        except Exception as e:  # a fast form that cannot bind these operands: the general semantics
            fn = None           # run them (and raise, if they are wrong, where the interpreter would)
            BIND_ERRORS[(cls.__name__, type(e).__name__)] += 1  # counted: a fast form's bug only slows
        if fn is b.NOTHING:
            return
        if self.guards is not None:  # a step's count words, by its place in the schedule
            fn = fn or (lambda: run_one(self.machine, *group[0]))
            self.ops.append((fn, group, self.guards[self._index[id(group[0])]]))
            return
        if fn is not None:
            self.ops.append((fn, group))
        elif len(group) > 1:
            runs = spaced_runs(group, b.sp_bytes)
            if len(runs) == 1:  # evenly spaced, yet not taken whole: by pc (_regroup's parts), else alone
                pcs: dict = {}
                for step in group:
                    pcs.setdefault(step[2], []).append(step)
                runs = list(pcs.values()) if len(pcs) > 1 else [[step] for step in group]
            for run in runs:
                self._bind(b, run)
        else:
            m = self.machine
            for core, unit, pc, ins, idx in self.parts.get(id(group[0]), group):
                self.ops.append((functools.partial(run_one, m, core, unit, pc, ins, idx), group))

    def run(self) -> None:
        if self.guards is not None:
            return self._run_counted()
        for fn, group in self.ops:
            try:
                fn()
            except Exception as e:
                self._failed(group, e)

    def _run_counted(self) -> None:
        """The schedule's steps but those a count word holding 0 skips (issue 31): each word read
        once, when a step it guards is first reached (it is written before, never after)."""
        seen: dict = {}
        words = self.words
        for fn, group, guard in self.ops:
            run = True
            for w in guard:
                v = seen.get(w)
                if v is None:
                    v = seen[w] = int(words[w]) > 0
                if not v:
                    run = False
                    break
            if run:
                try:
                    fn()
                except Exception as e:
                    self._failed(group, e)

    def _failed(self, group, e: Exception):
        if isinstance(e, ProgramError):  # the general semantics failed: already named
            raise e
        # A fast form failed: again by the general semantics, one instruction at a time, so the
        # error names where (the failing instructions check before they write).
        group = [part for step in group for part in self.parts.get(id(step), (step,))]
        for core, unit, pc, ins, idx in group:
            run_one(self.machine, core, unit, pc, ins, idx)
        core, unit, pc, ins, idx = group[0]
        raise failure(self.program, core, unit, pc, ins, e) from e


def coalesce(steps, after):
    """Each core's back-to-back loads (stores) that continue one another joined into one: the
    next one moves the rows right after the last one's, from the same buffer with the same
    strides, into (from) the scratchpad rows right after its. A matmul's weight tile comes in as
    several loads of a few rows; joined, a batched run moves it in one operation.

    Joined loads write the very bytes the parts wrote and read the very bytes they read; the
    later part runs when the earlier would, which nothing forbids: it is the next step of its
    core, rows never overlap, and a step that waits for another core's step (`after`: a ring send
    into its bytes) is never joined to the one before it. The joined step takes the first part's
    place; the later parts keep theirs, as steps that do nothing (`absorbed`), so that cores
    whose loads join and cores whose loads do not still reach the same instructions in the
    same rounds. Returns (steps, {id(joined step): [the program's steps it joins]}, absorbed ids)."""
    out, parts, absorbed, last = list(steps), {}, set(), {}
    for k, step in enumerate(steps):
        core = step[0]
        j = last.get(core)
        if j is not None and not after.get(k):
            joined = _join(out[j], step)
            if joined is not None:
                parts[id(joined)] = parts.pop(id(out[j]), [out[j]]) + [step]
                out[j] = joined
                absorbed.add(id(step))
                continue
        last[core] = k
    return out, parts, absorbed


def _join(first, then):
    """One Load (Store) step doing `first` and then `then`, or None if they do not continue.
    (The stride of a transfer of one row is no part of what it does: a row joins the next
    whatever its stride.)"""
    core, unit, pc, a, ia = first
    _, unit2, _, b, ib = then
    kind = type(a)
    if kind is not type(b) or kind not in (isa.Load, isa.Store) or unit != unit2 or a.row_bytes != b.row_bytes:
        return None
    load = kind is isa.Load
    da, db = (a.src, b.src) if load else (a.dst, b.dst)
    sa, sb = (a.dst, b.dst) if load else (a.src, b.src)
    if da.symbol != db.symbol:
        return None
    dev_at, sp_at = da.at(ia), sa.at(ia)
    dev_gap, sp_gap = db.at(ib) - dev_at, sb.at(ib) - sp_at

    def strides(i):  # (device stride, scratchpad stride)
        return (i.src_stride, i.dst_stride) if load else (i.dst_stride, i.src_stride)

    if a.rows > 1:
        dev_stride, sp_stride = strides(a)
    elif b.rows > 1:
        dev_stride, sp_stride = strides(b)
    else:
        dev_stride, sp_stride = dev_gap, sp_gap
    if (b.rows > 1 and strides(b) != (dev_stride, sp_stride)) or \
            (dev_gap, sp_gap) != (a.rows * dev_stride, a.rows * sp_stride):
        return None
    # rows apart (a load writes each scratchpad row's padding too; a store's rows land in order)
    if sp_stride < sticks(a.row_bytes) or dev_stride < 0 or (not load and dev_stride < a.row_bytes):
        return None
    rows = a.rows + b.rows
    if load:
        joined = isa.Load(Addr(sp_at), DevAddr(da.symbol, dev_at), rows, a.row_bytes, dev_stride, sp_stride)
    else:
        joined = isa.Store(DevAddr(da.symbol, dev_at), Addr(sp_at), rows, a.row_bytes, dev_stride, sp_stride)
    return core, unit, pc, joined, ()


def _likeness(ins) -> tuple:
    """What a fast form needs alike in the members it takes as one: every operand but where it
    sits (tiles by shape and dtype, device addresses by buffer; a send's far core is where its
    destination sits, spaced with it by _addresses)."""
    key = [type(ins)]
    for f in fields(ins):
        value = getattr(ins, f.name)
        if isinstance(value, Addr) or f.name == "core":
            continue
        key.append(value.symbol if isinstance(value, DevAddr) else
                   value.shape_key if isinstance(value, Tile) else value)
    return tuple(key)


def _addresses(step, sp_bytes: int):
    """Where `step`'s operands sit, one number per operand in the frames a Binder spaces members
    in (the bank for scratchpad operands, a buffer's bytes for device ones), and what must be
    alike besides (_likeness); None for an operand found only at run time (gathers, scatters)."""
    core, _, _, ins, idx = step
    where, names = [], [_likeness(ins)]
    for touch in ins.touches():
        kind = touch[0]
        if kind == "tile":
            if touch[1] is not None:
                where.append(core * sp_bytes + touch[1].addr.at(idx))
        elif kind == "sp_rows":
            where.append(core * sp_bytes + touch[1].at(idx))
        elif kind == "sp_rows_on":
            where.append(touch[1] * sp_bytes + touch[2].at(idx))
        elif kind == "dev_rows":
            where.append(touch[1].at(idx))
            names.append(touch[1].symbol)
        elif kind.startswith("dev"):
            return None
    return tuple(where), tuple(names)


def spaced_runs(group, sp_bytes: int) -> list[list]:
    """A round's group that a fast form cannot take whole, cut into runs of consecutive members
    whose operands are all evenly spaced (what a Binder view over members needs), so a fast form
    may take each run as one operation. A round's steps touch no bytes another of them writes, so
    they may run in any grouping. Members whose addresses come from the data stay alone."""
    runs: list[list] = []
    run, step, last = [], None, None
    for member in group:
        here = _addresses(member, sp_bytes)
        if here is None:
            runs.extend([run, [member]] if run else [[member]])
            run, step, last = [], None, None
            continue
        if run and here[1] == last[1] and len(here[0]) == len(last[0]):
            diff = tuple(h - p for h, p in zip(here[0], last[0]))
            if min(diff, default=0) >= 0 and (step is None or diff == step):
                run.append(member)
                step, last = diff, here
                continue
        if run:
            runs.append(run)
        run, step, last = [member], None, here
    if run:
        runs.append(run)
    return runs


def _round_groups(steps, after, regroup=None):
    """Independent cores, in rounds: each core's next step if the steps of other cores it must
    follow (`after`) ran in an earlier round; those of a round by instruction (same unit and pc).

    Whatever the interpreter ran before a core's next step ran in an earlier round, so some core
    always moves on; and two steps of one round touch no bytes one of them writes (else one
    would follow the other), so a round's operations may run in any order. Without ring sends
    (`after` empty) a round is the k-th step of every core."""
    per_core: dict[int, list[int]] = collections.defaultdict(list)
    for k, step in enumerate(steps):
        per_core[step[0]].append(k)
    streams = [per_core[c] for c in sorted(per_core)]
    heads = [0] * len(streams)
    done = [False] * len(steps)
    groups, left = [], len(steps)
    while left:
        at_k: dict = {}
        ran = []
        for s, stream in enumerate(streams):
            if heads[s] < len(stream):
                k = stream[heads[s]]
                if all(done[j] for j in after.get(k, ())):
                    core, unit, pc, ins, idx = steps[k]
                    at_k.setdefault((type(ins), unit, pc), []).append(steps[k])
                    ran.append(k)
                    heads[s] += 1
        if not ran:  # (cannot happen: the interpreter's order is one the rounds can follow)
            raise AssertionError("a schedule's ring order has a cycle")
        for k in ran:
            done[k] = True
        left -= len(ran)
        groups.extend(regroup(list(at_k.values())) if regroup is not None else at_k.values())
    return groups
