"""Instruction selection for reduction kernels: lowering (its tile kernel) + plan + shares -> one Program.

Per core (units ls and sfp, queues as in emitter.pipeline):

* "resident": groups of G rows stream through ``buffers`` copies with
  emitter.pipeline (load group t, sfp runs the chunk phase's steps on it,
  store its full-space and per-row outputs; load group t + 2), inside the
  loops of the other outer dims. Each input byte is read once.
* "chunked": per group, per pass, the init phase's fills, then the group's
  chunks stream through the pipeline (reductions accumulate into pinned
  per-row tiles, scans carry their last column), inside counted loops over
  any looped reduced dims, then the pass's epilogue; the last epilogue hands
  the per-row outputs to ls over ofull/ofree (ls primes ofree, so the sfp
  never overwrites a column whose store is in flight).
* "ring": each core streams its slice of the reduced dim (one group: all
  outer elements), then the partial accumulators travel 0 -> 1 -> ... ->
  n-1: core c pops ring<c-1> (core c-1 Sent its partials into c's
  RING_LANDING tiles), runs the combine (the incoming are the earlier
  indices: they win argmax ties) and Sends on; the last core runs the last
  epilogue and stores. No device temporaries. A kernel of scans keeps each
  core's slice resident instead: the slice's totals travel as running
  prefixes, and each core scans from the prefix it received and stores its slice.

The setup phase's loads (what no group changes) run once per core, before
any group. Per-row outputs are columns [G, 1] (one stick per row); ls
transposes them into their packed-row STAGING tile on chip before the store
when the output is contiguous along o, so the store moves packed sticks.
CHUNK_CONSTANT tiles are filled once per core for the full chunk (copy 0)
and the remainder (copy 1); a step reading one reads the copy of the chunk
it runs on.

Column tiles (``low.columns``, space.py): the tile rows are the
reduced dim, so a [Kc, G] full tile, a packed [1, G] per-row tile and a
[Kc, 1] along-reduced column are each moved with one Load or Store as they
lie in device memory, and a reduce step folds the rows (``fold_rows``):
rows [0, h) with rows [n - h, n) into the scratch tile, h = n // 2, until
one row is left, the last fold writing (or combining into) the destination.
A full tile moves as MOVE_PIECES blocks of rows, each its own transfer, so
one core keeps several in flight (timing.py: the bus share grows with the
transfers in flight, up to what one core was measured to move; one transfer
per core reaches 11% of the bus).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace

from spyre_runtime.program.emitter import Aff, Unit, assemble, pipeline, pipeline_queues, split_evenly
from spyre_runtime.program.isa import (Binary, Fill, Iota, Load, Philox, Pop, Push, Reduce, Scan, Select, Store, Transpose,
                                      Unary)
from spyre_runtime.program.operands import ITEMSIZE, STICK
from spyre_runtime.program.program import Program, Queue

from ...ir.kernel_ir import ReductionKernel
from ...core import combine
from ...core.division import CoreShare
from ...core.layout import symbols_of
from ...core.minimum import recorded
from .argreduce import SliceValue
from .lowering import ReductionLowering
from .plan import ReductionPlan, streamed
from ...core.reduction_ops import COMBINE
from .space import ALONG_REDUCED, FULL, OUTER, PER_ROW, REDUCED, SCALAR, Access
from ...core.tiles import ChunkValue, Relayout, Role, broadcast_of, tile_extent


MOVE_PIECES = 4  # transfers one column-tile move is issued as (module docstring)


def build_reduction_program(kernel: ReductionKernel, low: ReductionLowering, plan: ReductionPlan,
                            shares: tuple[CoreShare, ...], notes: str = "") -> Program:
    queues, cores = [], {}
    last = len(shares) - 1
    for pos, share in enumerate(shares):
        cores[share.core], qs = _Core(low, plan, share, pos, last).build()
        queues += qs
    program = assemble(kernel.name, symbols_of(kernel), queues, cores, notes, check=False)
    return recorded(kernel, program)  # the kernel's minimum traffic (the one kept is launched)


class _Core:
    def __init__(self, low, plan, share, pos, last):
        self.low, self.plan, self.share, self.pos, self.last = low, plan, share, pos, last
        self.ls, self.sfp = Unit(), Unit()
        c = share.core
        self.q, self.queues = pipeline_queues(c, plan.buffers)
        self.qn = {k: f"c{c}.{k}" for k in ("once", "gl", "ofull", "ofree", "ready")}
        self.queues += [Queue(self.qn["once"], (c, "ls"), (c, "sfp"), 1), Queue(self.qn["gl"], (c, "ls"), (c, "sfp"), 1),
                        Queue(self.qn["ofull"], (c, "sfp"), (c, "ls"), 1),
                        Queue(self.qn["ofree"], (c, "ls"), (c, "sfp"), 1),
                        Queue(self.qn["ready"], (c, "sfp"), (c, "ls"), 1)]
        self.columns = low.columns
        self.row_axis, self.stick_axis = low.tile_kernel.axes
        self.counters: dict[int, Aff] = {}
        self.looped: list[Aff] = []   # counters of the looped reduced dims, while inside them
        odim = len(low.outer) - 1
        self.odim = odim
        self.loop_dims = [d for d in range(odim) if share.counts[d] > 1] if low.mode != "ring" else []
        self.k0, self.kn = share.starts[-1], share.counts[-1]  # the reduced dim's (a ring plan splits it)
        kc = min(plan.chunk, self.kn) if self.kn else plan.chunk
        self.kc = max(kc, 1)
        self.chunks, self.krem = divmod(self.kn, self.kc)

    # ---- operands -------------------------------------------------------------------

    def sizes(self, space, g, kc):
        """(rows, cols) of a tile of `space` over g outer and kc reduced elements."""
        return tile_extent(space, self.row_axis, self.stick_axis, {OUTER: g, REDUCED: kc})

    def alloc(self, name, copy, ksize=None):
        """The allocation a step or move of tile `name` uses: stream buffer `copy` of a streamed
        tile, the full or remainder copy (ksize: the remainder's extent) of a chunk constant."""
        t = self.low.tile(name)
        if t.role is Role.CHUNK_CONSTANT:
            return self.plan.at(name, 1 if ksize else 0)
        return self.plan.at(name, copy if streamed(self.low, name) else None)

    def staging(self, name, relayout, copy):
        [st] = [s for s in self.low.tile_kernel.serving(name, Role.STAGING) if s.relayout is relayout]
        return self.alloc(st.name, copy)

    def landing(self, name):
        [t] = self.low.tile_kernel.serving(name, Role.RING_LANDING)
        return self.plan.at(t.name)

    def space(self, name):
        return self.low.tile(name).space

    def tile(self, u, name, copy, rows, cols, dst_space=None, ksize=None):
        a = self.alloc(name, copy, ksize)
        sp = self.space(name)
        bc = "none"
        if (dst_space is not None and sp != dst_space) or (sp == SCALAR and (rows, cols) != (1, 1)):
            bc = broadcast_of(sp, self.row_axis, self.stick_axis)
        return u.tile(a.offset, self.low.tile(name).dtype, rows, cols, a.row_stride, bc)

    def fill_value(self, value, kc):
        if isinstance(value, ChunkValue):
            return value.at(kc)
        if value is SliceValue.START:
            return self.k0
        return value

    def steps(self, u, steps, copy, g, ksize):
        kc = ksize or self.kc
        for st in steps:
            dsp = self.space(st.dst)
            rows, cols = self.sizes(dsp, g, kc)
            dst = self.tile(u, st.dst, copy, rows, cols)
            if st.kind == "reduce" and self.columns:
                self.fold_rows(u, st, dst, copy, g, kc)
                continue
            if st.kind == "reduce":  # src [g, kc] (an along-reduced source is broadcast over the rows)
                src = self.tile(u, st.args[0], copy, g, kc, FULL)
                u.emit(Reduce(st.op, dst, src, accumulate=st.accumulate))
                continue
            if st.kind == "scan":  # src [g, kc]; carry [g, 1] when chunked
                src = self.tile(u, st.args[0], copy, g, kc)
                carry = self.tile(u, st.args[1], copy, g, 1) if len(st.args) > 1 else None
                u.emit(Scan(st.op, dst, src, carry))
                continue
            args = [self.tile(u, a, copy, rows, cols, dsp, ksize) for a in st.args]
            if st.kind == "unary":
                u.emit(Unary(st.op, dst, args[0]))
            elif st.kind == "binary":
                u.emit(Binary(st.op, dst, args[0], args[1]))
            elif st.kind == "select":
                u.emit(Select(dst, *args))
            elif st.kind == "random":  # a philox draw (fusion.isa_op): args key, counter
                u.emit(Philox(st.op, dst, *args))
            else:  # fill
                u.emit(Fill(dst, self.fill_value(st.value, kc)))

    def fold_rows(self, u, st, dst, copy, g, kc):
        """A reduce step over column tiles: the source's kc rows folded pairwise (module docstring)."""
        op = COMBINE[st.op]
        src = self.tile(u, st.args[0], copy, kc, g, FULL)
        s = self.alloc(st.args[1], copy)
        sdt = self.low.tile(st.args[1]).dtype

        def rows(t, r0, n):
            return replace(t, addr=replace(t.addr, base=t.addr.base + r0 * t.row_stride), rows=n)

        scratch = u.tile(s.offset, sdt, 1, g, s.row_stride)
        cur, n = src, kc
        while n > 2:
            h = n // 2
            u.emit(Binary(op, rows(scratch, 0, h), rows(cur, 0, h), rows(cur, n - h, h)))
            if n % 2 and cur is src:  # the middle row is not folded at this level: it moves as it is
                u.emit(Unary("copy", rows(scratch, h, 1), rows(cur, h, 1)))
            cur, n = scratch, n - h
        if st.accumulate:
            for r in range(n):
                u.emit(Binary(op, dst, dst, rows(cur, r, 1)))
        elif n == 2:
            u.emit(Binary(op, dst, rows(cur, 0, 1), rows(cur, 1, 1)))
        else:
            u.emit(Unary("copy", dst, rows(cur, 0, 1)))

    # ---- device addresses ----------------------------------------------------------------

    def element(self, a: Access, group, chunk) -> Aff:
        """Element index of the access at a tile's origin (affine in the loop counters)."""
        s = self.share
        value = Aff(a.offset) + sum((a.outer_strides[d] * s.starts[d] for d in range(self.odim + 1)), 0)
        for d, c in self.counters.items():
            value = value + c * a.outer_strides[d]
        value = value + group * (a.outer_strides[self.odim] * self.plan.group)
        for c, stride in zip(self.looped, a.looped_strides):
            value = value + c * stride
        return value + (self.k0 * a.r_stride) + chunk * (a.r_stride * self.kc)

    def dev(self, u, a: Access, group, chunk):
        return u.dev(a.buffer, self.element(a, group, chunk) * ITEMSIZE[a.dtype])

    def o_stride(self, a: Access) -> int:
        """The access's stride along the innermost outer dim (0 for a full reduction)."""
        return a.outer_strides[self.odim] if a.outer_strides else 0

    def _element_rows(self, u, a: Access, element, dst, row_stride, rows, kc, col, store: bool):
        """`rows` tile rows of kc elements strided by r_stride in device memory (rows apart by
        the innermost outer stride), one element per stick through the [kc, 1] column `col`:
        gathered (load, then transpose into row i of the tile at `dst`) or scattered (the reverse)."""
        isz = ITEMSIZE[a.dtype]
        for i in u.range(rows):
            dev = u.dev(a.buffer, (element + i * self.o_stride(a)) * isz)
            column = u.tile(col.offset, a.dtype, kc, 1, STICK)
            row = u.tile(dst + i * row_stride, a.dtype, 1, kc, row_stride)
            stride = a.r_stride * isz if kc > 1 else 0
            if store:
                u.emit(Transpose(column, row), Store(dev, u.sp(col.offset), kc, isz, stride, STICK))
            else:
                u.emit(Load(u.sp(col.offset), dev, kc, isz, stride, STICK), Transpose(row, column))

    def count(self, u, a: Access, element, dst, dtype, rows, cols, row_stride, row_step, col_step):
        """An index value's tile, computed in place of its load: element indices from `element`."""
        start, steps = u.affine(element)
        u.emit(Iota(u.tile(dst, dtype, rows, cols, row_stride), start, steps, row_step, col_step))

    def gather(self, u, a: Access, element, dst, row_stride, rows, kc, col):
        self._element_rows(u, a, element, dst, row_stride, rows, kc, col, store=False)

    def load_f(self, u, tile, a, copy, g, kc, group, chunk):
        isz = ITEMSIZE[a.dtype]
        al = self.alloc(tile, copy)
        if self.columns:  # [kc, g] (an along-reduced [kc, 1]) as it lies: rows r_stride apart
            cols = 1 if self.low.tile(tile).space == ALONG_REDUCED else g
            if a.buffer is None:
                self.count(u, a, self.element(a, group, chunk), al.offset, a.dtype, kc, cols, al.row_stride,
                           a.r_stride, self.o_stride(a))
                return
            self.column_moves(u, Load, a, al, self.element(a, group, chunk), kc, cols * isz)
            return
        if a.buffer is None:
            rows = 1 if self.low.tile(tile).space == ALONG_REDUCED else g
            self.count(u, a, self.element(a, group, chunk), al.offset, a.dtype, rows, kc, al.row_stride,
                       self.o_stride(a), a.r_stride)
            return
        src = self.dev(u, a, group, chunk)
        if a.gathered:
            rows = 1 if self.low.tile(tile).space == ALONG_REDUCED else g
            self.gather(u, a, self.element(a, group, chunk), al.offset, al.row_stride, rows, kc,
                        self.staging(tile, Relayout.GATHERED, copy))
        elif self.low.tile(tile).space == ALONG_REDUCED:
            u.emit(Load(u.sp(al.offset), src, 1, kc * isz, 0, al.row_stride))
        elif a.transposed:
            st = self.staging(tile, Relayout.TRANSPOSED, copy)
            u.emit(Load(u.sp(st.offset), src, kc, g * isz, a.r_stride * isz if kc > 1 else 0, st.row_stride),
                   Transpose(u.tile(al.offset, a.dtype, g, kc, al.row_stride),
                             u.tile(st.offset, a.dtype, kc, g, st.row_stride)))
        else:
            u.emit(Load(u.sp(al.offset), src, g, kc * isz, a.outer_strides[self.odim] * isz if g > 1 else 0,
                        al.row_stride))

    def column_moves(self, u, kind, a: Access, al, element, kc, row_bytes):
        """A column tile's kc rows (row_bytes each, r_stride elements apart in device memory) moved
        in MOVE_PIECES blocks of rows, each one Load or Store (module docstring)."""
        isz = ITEMSIZE[a.dtype]
        pieces = min(MOVE_PIECES, kc)
        for r0, n in split_evenly(kc, pieces):
            sp = u.sp(al.offset + r0 * al.row_stride)
            dev = u.dev(a.buffer, (element + r0 * a.r_stride) * isz)
            stride = a.r_stride * isz if n > 1 else 0
            u.emit(Load(sp, dev, n, row_bytes, stride, al.row_stride) if kind is Load
                   else Store(dev, sp, n, row_bytes, stride, al.row_stride))

    def store_f(self, u, tile, a, copy, g, kc, group, chunk):
        isz = ITEMSIZE[a.dtype]
        al = self.alloc(tile, copy)
        dst = self.dev(u, a, group, chunk)
        if self.columns:
            self.column_moves(u, Store, a, al, self.element(a, group, chunk), kc, g * isz)
            return
        if a.gathered:  # scattered: the mirror image of a gathered load
            self._element_rows(u, a, self.element(a, group, chunk), al.offset, al.row_stride, g, kc,
                               self.staging(tile, Relayout.GATHERED, copy), store=True)
        elif a.transposed:
            st = self.staging(tile, Relayout.TRANSPOSED, copy)
            u.emit(Transpose(u.tile(st.offset, a.dtype, kc, g, st.row_stride),
                             u.tile(al.offset, a.dtype, g, kc, al.row_stride)),
                   Store(dst, u.sp(st.offset), kc, g * isz, a.r_stride * isz if kc > 1 else 0, st.row_stride))
        else:
            u.emit(Store(dst, u.sp(al.offset), g, kc * isz, a.outer_strides[self.odim] * isz if g > 1 else 0,
                         al.row_stride))

    def load_o(self, u, tile, a, copy, g, group):
        isz = ITEMSIZE[a.dtype]
        al = self.alloc(tile, copy)
        if self.columns:  # one packed row (the lowering checked that o is contiguous)
            if a.buffer is None:
                self.count(u, a, self.element(a, group, 0), al.offset, a.dtype, 1, g, al.row_stride, 0,
                           self.o_stride(a))
                return
            u.emit(Load(u.sp(al.offset), self.dev(u, a, group, 0), 1, g * isz, 0, al.row_stride))
            return
        if a.buffer is None:
            self.count(u, a, self.element(a, group, 0), al.offset, a.dtype, g, 1, STICK, self.o_stride(a), 0)
            return
        src = self.dev(u, a, group, 0)
        o = self.o_stride(a)
        if o == 1 and g > 1:
            row = self.staging(tile, Relayout.ROW, copy)
            u.emit(Load(u.sp(row.offset), src, 1, g * isz, 0, row.row_stride),
                   Transpose(u.tile(al.offset, a.dtype, g, 1, STICK), u.tile(row.offset, a.dtype, 1, g, row.row_stride)))
        else:
            u.emit(Load(u.sp(al.offset), src, g, isz, o * isz if g > 1 else 0, STICK))

    def store_o(self, u, tile, a, copy, g, group):
        isz = ITEMSIZE[a.dtype]
        al = self.alloc(tile, copy)
        dst = self.dev(u, a, group, 0)
        if self.columns:
            u.emit(Store(dst, u.sp(al.offset), 1, g * isz, 0, al.row_stride))
            return
        o = self.o_stride(a)
        if o == 1 and g > 1:
            row = self.staging(tile, Relayout.ROW, copy)
            u.emit(Transpose(u.tile(row.offset, a.dtype, 1, g, row.row_stride), u.tile(al.offset, a.dtype, g, 1, STICK)),
                   Store(dst, u.sp(row.offset), 1, g * isz, 0, row.row_stride))
        else:
            u.emit(Store(dst, u.sp(al.offset), g, isz, o * isz if g > 1 else 0, STICK))

    # ---- program -------------------------------------------------------------------------

    def load(self, u, tile, a, copy, g, kc, group, chunk):
        if self.space(tile) == PER_ROW:
            self.load_o(u, tile, a, copy, g, group)
        else:
            self.load_f(u, tile, a, copy, g, kc, group, chunk)

    def store(self, u, tile, a, copy, g, kc, group, chunk):
        if self.space(tile) == PER_ROW:
            self.store_o(u, tile, a, copy, g, group)
        else:
            self.store_f(u, tile, a, copy, g, kc, group, chunk)

    def build(self):
        low, plan, ls, sfp = self.low, self.plan, self.ls, self.sfp
        tk = low.tile_kernel
        for t, v in tk.constants:
            sfp.emit(Fill(self.tile(sfp, t, None, 1, 1), v))
        chunk_constants = {t.chunk_value: t for t in tk.with_role(Role.CHUNK_CONSTANT)}
        for copy, n in ((0, self.kc), (1, self.krem or self.kc)):  # the full chunk, the remainder
            for value in ChunkValue:
                if value in chunk_constants:
                    a = plan.at(chunk_constants[value].name, copy)
                    sfp.emit(Fill(sfp.tile(a.offset, value.dtype, 1, 1, STICK), value.at(n)))
        setup = low.setup
        if setup is not None and setup.loads:
            for t, a in setup.loads:
                isz = ITEMSIZE[a.dtype]
                al = self.alloc(t, None)
                n = plan.chunk if low.tile(t).space == ALONG_REDUCED else 1
                if self.columns:  # an along-reduced [n, 1] column, or a scalar
                    if a.buffer is None:
                        self.count(ls, a, self.element(a, 0, 0), al.offset, a.dtype, n, 1, al.row_stride,
                                   a.r_stride, 0)
                    else:
                        ls.emit(Load(ls.sp(al.offset), self.dev(ls, a, 0, 0) if n > 1 else
                                     ls.dev(a.buffer, a.offset * isz), n, isz, a.r_stride * isz if n > 1 else 0,
                                     al.row_stride))
                    continue
                if a.buffer is None:
                    self.count(ls, a, self.element(a, 0, 0), al.offset, a.dtype, 1, n, al.row_stride, 0, a.r_stride)
                    continue
                if a.gathered:
                    self.gather(ls, a, self.element(a, 0, 0), al.offset, al.row_stride, 1, n,
                                self.staging(t, Relayout.GATHERED, None))
                    continue
                ls.emit(Load(ls.sp(al.offset), self.dev(ls, a, 0, 0) if n > 1 else ls.dev(a.buffer, a.offset * isz),
                             1, n * isz, 0, al.row_stride))
            ls.emit(Push(self.qn["once"]))
            sfp.emit(Pop(self.qn["once"]))
        if low.mode == "resident":
            self._resident()
        elif low.mode == "chunked":
            self._chunked()
        else:
            self._ring()
        return {"ls": ls.instrs, "sfp": sfp.instrs}, self.queues

    @property
    def outer_stores(self):
        """The per-row stores after the last pass (chunked and ring plans)."""
        ep = self.low.passes[-1].epilogue
        return ep.stores if ep is not None else ()

    def _outer_loops(self, stack):
        for d in self.loop_dims:
            self.counters[d] = stack.enter_context(self.ls.loop(self.share.counts[d]))
            stack.enter_context(self.sfp.loop(self.share.counts[d]))

    def _resident(self):
        low, plan = self.low, self.plan
        p = low.passes[0].chunk
        count = self.share.counts[self.odim]
        G = min(plan.group, count)
        tiles, rem = divmod(count, G)
        K = low.K

        def load(u, t, b, size):
            for tile, a in p.loads:
                self.load(u, tile, a, b, size or G, K, t, 0)

        def compute(u, t, b, size):
            self.steps(u, p.steps, b, size or G, None)

        def store(u, t, b, size):
            for tile, a in p.stores:
                self.store(u, tile, a, b, size or G, K, t, 0)

        with ExitStack() as stack:
            self._outer_loops(stack)
            pipeline(self.ls, self.sfp, tiles, rem, self.q, load, compute, store, plan.buffers,
                      phased=plan.buffers == 2)

    def _group(self, g, group):
        """One group's passes (chunked and ring), but for the last pass's epilogue (``_epilogue``)."""
        low, ls, sfp = self.low, self.ls, self.sfp
        passes = low.passes
        group_loads = passes[0].init.loads if passes[0].init is not None else ()
        if group_loads:
            for tile, a in group_loads:
                self.load_o(ls, tile, a, None, g, group)
            ls.emit(Push(self.qn["gl"]))
            sfp.emit(Pop(self.qn["gl"]))
        for k, ps in enumerate(passes):
            p = ps.chunk
            if ps.init is not None:
                self.steps(sfp, ps.init.steps, None, g, None)

            def load(u, t, b, size, p=p):
                for tile, a in p.loads:
                    self.load_f(u, tile, a, b, g, size or self.kc, group, t)

            def compute(u, t, b, size, p=p):
                self.steps(u, p.steps, b, g, size)

            def store(u, t, b, size, p=p):
                for tile, a in p.stores:
                    self.store_f(u, tile, a, b, g, size or self.kc, group, t)

            with ExitStack() as loops:  # the looped reduced dims, outermost first, around the chunks
                for n in low.looped:
                    self.looped.append(loops.enter_context(ls.loop(n)))
                    loops.enter_context(sfp.loop(n))
                pipeline(ls, sfp, self.chunks, self.krem, self.q, load, compute, store, self.plan.buffers,
                          phased=self.plan.buffers == 2)
            self.looped.clear()
            if k < len(passes) - 1 and ps.epilogue is not None:
                self.steps(sfp, ps.epilogue.steps, None, g, None)

    def _epilogue(self, g, group):
        """The last pass's epilogue: the per-row epilogue, its outputs handed to ls and stored."""
        ls, sfp = self.ls, self.sfp
        ep = self.low.passes[-1].epilogue
        stores = self.outer_stores
        if stores:
            sfp.emit(Pop(self.qn["ofree"]))
        if ep is not None:
            self.steps(sfp, ep.steps, None, g, None)
        if stores:
            sfp.emit(Push(self.qn["ofull"]))
            ls.emit(Pop(self.qn["ofull"]))
            for tile, a in stores:
                self.store_o(ls, tile, a, None, g, group)
            ls.emit(Push(self.qn["ofree"]))

    def _chunked(self):
        plan, ls, sfp = self.plan, self.ls, self.sfp
        count = self.share.counts[self.odim]
        G = min(plan.group, count)
        groups, rem = divmod(count, G)
        if self.outer_stores:
            ls.emit(Push(self.qn["ofree"]))
        with ExitStack() as stack:
            self._outer_loops(stack)
            if groups:
                with ExitStack() as inner:
                    if groups > 1:
                        gi = inner.enter_context(ls.loop(groups))
                        inner.enter_context(sfp.loop(groups))
                    else:
                        gi = Aff(0)
                    self._group(G, gi)
                    self._epilogue(G, gi)
            if rem:
                self._group(rem, Aff(groups))
                self._epilogue(rem, Aff(groups))
        if self.outer_stores:
            sfp.emit(Pop(self.qn["ofree"]))

    def _ring(self):
        low, ls, sfp = self.low, self.ls, self.sfp
        c, g = self.share.core, self.share.counts[self.odim]
        if low.ring_scan:
            self._ring_scan(g)
            return
        self._group(g, Aff(0))
        if self.pos > 0:
            combine.receive(sfp, c)
            self.steps(sfp, low.combine.steps, None, g, None)
        self._send_on()
        if self.pos == self.last:
            if self.outer_stores:
                ls.emit(Push(self.qn["ofree"]))
            self._epilogue(g, Aff(0))
            if self.outer_stores:
                sfp.emit(Pop(self.qn["ofree"]))

    def _send_on(self):
        """Hand this core's accumulators to the next core's ring landing tiles (not from the last core)."""
        low, plan, ls, sfp, c = self.low, self.plan, self.ls, self.sfp, self.share.core
        if self.pos < self.last:
            moves = [(self.landing(acc).offset, plan.at(acc).offset, plan.at(acc).nbytes) for acc in low.combine.tiles]
            combine.send_on(ls, sfp, c, self.qn["ready"], moves)
            self.queues.append(combine.queue(c))

    def _ring_scan(self, g):
        """Ring mode for scans (scan.py): the slice [g, kn] resident and reduced to its
        total; the prefix of the earlier cores arrives, travels on, and starts the scan."""
        low, ls, sfp, c, kn = self.low, self.ls, self.sfp, self.share.core, self.kn
        chunk, epilogue = low.passes[0].chunk, low.passes[0].epilogue
        for tile, a in chunk.loads:
            self.load_f(ls, tile, a, 0, g, kn, Aff(0), Aff(0))
        ls.emit(Push(self.qn["gl"]))
        sfp.emit(Pop(self.qn["gl"]))
        self.steps(sfp, chunk.steps, 0, g, None)   # each carry: this slice's total
        if self.pos > 0:
            combine.receive(sfp, c)
            self.steps(sfp, low.combine.steps, None, g, None)   # carry = prefix through this core
        self._send_on()
        after = epilogue.steps
        if self.pos == 0:  # nothing came before core 0: its scans start from the identity
            after = tuple(replace(st, args=st.args[:1]) if st.kind == "scan" else st for st in after)
        self.steps(sfp, after, 0, g, None)
        sfp.emit(Push(self.qn["ofull"]))
        ls.emit(Pop(self.qn["ofull"]))
        for tile, a in epilogue.stores:
            self.store_f(ls, tile, a, 0, g, kn, Aff(0), Aff(0))
