"""Hand-written dataflow programs: reference plans for the program format.

Each builder returns a validated :class:`Program` whose docstring states the
plan: how the data is tiled, how the work is split across cores, how
scratchpad buffers are reused and which queues carry which tokens.

They are written with the shared emitter (spyre_runtime/program/emitter.py:
``Unit``, ``Aff``, ``pipeline``), whose docstring describes the idioms they
use. Program authoring, used by tests and benchmarks: the simulator does not
depend on it.
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import (
    Aff, Scratch, Unit, assemble, nothing, pipeline, pipeline_queues, split_evenly, sticks,
)
from spyre_runtime.program.isa import Binary, Fill, Load, MatMul, Pop, Push, Reduce, Send, Store, Unary
from spyre_runtime.program.operands import ITEMSIZE, STICK, Addr, DevAddr
from spyre_runtime.program.program import Program, Queue, Symbol

__all__ = ["cast_round_trip", "ring_sum", "row_softmax", "tiled_matmul", "vector_add"]

FLOATS = ("fp16", "bf16", "fp32")


def _vector(name, role, dtype, n) -> Symbol:
    return Symbol(name, role, dtype, (n,), (1,))


def _check_dtype(dtype: str) -> None:
    if dtype not in FLOATS:
        raise ValueError(f"dtype must be one of {FLOATS}, got {dtype!r}")



# ---- vector add ----------------------------------------------------------------------


def vector_add(n: int, dtype: str = "fp32", *, chunk: int | None = None) -> Program:
    """out[n] = x[n] + y[n] on core 0.

    Plan: the vectors are cut into chunks of `chunk` elements (default: the
    largest whole number of sticks for which two buffers of x and y chunks
    fit in the usable scratchpad: 126976 fp32 / 253952 fp16 elements) plus
    one remainder chunk; a smaller n is just the remainder chunk. Each buffer
    b holds an x chunk and a y chunk, one row each. ls loads chunk t into buffer t % 2 (queue
    full<b>), sfp adds in fp32 and writes the sum over the x chunk, rounding
    to `dtype` (queue done<b>), ls stores it from there and loads chunk t + 2
    into the freed buffer. The remainder chunk is not a whole number of
    sticks: its loads move whole sticks and zero the masked tail, its store
    lands only the valid bytes.
    """
    _check_dtype(dtype)
    if n < 1:
        raise ValueError("n must be positive")
    isz = ITEMSIZE[dtype]
    stick_elems = STICK // isz
    usable = HARDWARE.scratchpad_usable_bytes
    if chunk is None:
        chunk = usable // (4 * STICK) * stick_elems  # 2 buffers x (x, y)
    if chunk % stick_elems:
        raise ValueError(f"chunk must be a whole number of sticks ({stick_elems} {dtype} elements)")
    tiles, rem = divmod(n, chunk)
    if tiles == 0:
        chunk, tiles, rem = 0, 0, n  # one (partial) chunk
    width = chunk or rem
    sp = Scratch(usable)
    bufs = [(sp.take(width * isz), sp.take(width * isz)) for _ in range(2)]
    q, queues = pipeline_queues(0)
    ls, sfp = Unit(), Unit()

    def load(u, t, b, size):
        cnt = size or chunk
        for sym, addr in zip(("x", "y"), bufs[b]):
            u.emit(Load(u.sp(addr), u.dev(sym, t * (chunk * isz)), 1, cnt * isz, 0, sticks(cnt * isz)))

    def compute(u, t, b, size):
        cnt = size or chunk
        xt, yt = (u.tile(a, dtype, 1, cnt, sticks(cnt * isz)) for a in bufs[b])
        u.emit(Binary("add", xt, xt, yt))

    def store(u, t, b, size):
        cnt = size or chunk
        u.emit(Store(u.dev("out", t * (chunk * isz)), u.sp(bufs[b][0]), 1, cnt * isz, 0, sticks(cnt * isz)))

    pipeline(ls, sfp, tiles, rem, q, load, compute, store)
    return assemble(
        f"vector_add_{dtype}_{n}",
        [_vector("x", "input", dtype, n), _vector("y", "input", dtype, n), _vector("out", "output", dtype, n)],
        queues, {0: {"ls": ls.instrs, "sfp": sfp.instrs}},
        notes=f"{tiles} chunk(s) of {chunk} + remainder {rem}, double-buffered, 1 core",
    )


# ---- cast round trip --------------------------------------------------------------------


def cast_round_trip(n: int, *, chunk: int | None = None) -> Program:
    """out[n] (fp32) = fp32(fp16(x[n])): two casts, each rounding to nearest even.

    Plan: as vector_add (core 0, chunks of whole sticks through two buffers,
    one remainder chunk). Per chunk the sfp does Unary "copy" from the fp32
    chunk into an fp16 tile (the store into the fp16 tile rounds to nearest
    even; values past the fp16 range become inf) and Unary "copy" back over
    the fp32 chunk (exact), which ls stores.
    """
    if n < 1:
        raise ValueError("n must be positive")
    usable = HARDWARE.scratchpad_usable_bytes
    if chunk is None:
        chunk = usable // (2 * 3 * STICK) * 64  # 2 buffers x (fp32 + fp16 chunk), 64 elements a step
    if chunk % 64:
        raise ValueError("chunk must be a multiple of 64 elements (whole fp16 and fp32 sticks)")
    tiles, rem = divmod(n, chunk)
    if tiles == 0:
        chunk, tiles, rem = 0, 0, n
    width = chunk or rem
    sp = Scratch(usable)
    bufs = [(sp.take(width * 4), sp.take(width * 2)) for _ in range(2)]
    q, queues = pipeline_queues(0)
    ls, sfp = Unit(), Unit()

    def load(u, t, b, size):
        cnt = size or chunk
        u.emit(Load(u.sp(bufs[b][0]), u.dev("x", t * (chunk * 4)), 1, cnt * 4, 0, sticks(cnt * 4)))

    def compute(u, t, b, size):
        cnt = size or chunk
        wide = u.tile(bufs[b][0], "fp32", 1, cnt, sticks(cnt * 4))
        half = u.tile(bufs[b][1], "fp16", 1, cnt, sticks(cnt * 2))
        u.emit(Unary("copy", half, wide), Unary("copy", wide, half))

    def store(u, t, b, size):
        cnt = size or chunk
        u.emit(Store(u.dev("out", t * (chunk * 4)), u.sp(bufs[b][0]), 1, cnt * 4, 0, sticks(cnt * 4)))

    pipeline(ls, sfp, tiles, rem, q, load, compute, store)
    return assemble(
        f"cast_round_trip_{n}",
        [_vector("x", "input", "fp32", n), _vector("out", "output", "fp32", n)],
        queues, {0: {"ls": ls.instrs, "sfp": sfp.instrs}},
        notes=f"fp32 -> fp16 -> fp32, {tiles} chunk(s) of {chunk} + remainder {rem}",
    )


# ---- row softmax ------------------------------------------------------------------------


def row_softmax(rows: int, cols: int, dtype: str = "fp16", cores: int = 4, *,
                tile_rows: int | None = None) -> Program:
    """out[rows, cols] = softmax(x, dim=-1), x and out contiguous `dtype`.

    Plan: rows are split into `cores` contiguous near-equal blocks, one per
    core (core c handles its own block; no cross-core traffic). A core walks
    its block in tiles of `tile_rows` rows (default: as few tiles as fit, of
    near-equal size; 43 rows for 4096 x 4096 fp16 on 32 cores) plus one
    remainder tile. Per core the scratchpad holds two `dtype` input buffers
    (rows padded to whole sticks), ONE fp32 work tile and two fp32 column
    tiles (row max, row sum; one stick per row):

        per row: 2 * sticks(cols * itemsize) + sticks(cols * 4) + 2 * 128 bytes

    ls loads tile t into buffer t % 2 (queue full<b>); sfp computes

        mx  = reduce max (x)               fp32 [R, 1]
        w   = x - mx   (mx broadcast "cols")   fp32 [R, C]
        w   = exp(w)
        s   = reduce sum (w)               fp32 [R, 1]
        x   = w / s    (s broadcast "cols"), rounded to dtype on this write

    so all arithmetic is fp32 and the only rounding to `dtype` is the final
    write, into the input buffer itself (the input is dead by then); then
    pushes done<b>, and ls stores the buffer and loads tile t + 2 into it.
    """
    _check_dtype(dtype)
    if rows < 1 or cols < 1 or not 1 <= cores <= HARDWARE.cores:
        raise ValueError("need rows, cols >= 1 and 1 <= cores <= %d" % HARDWARE.cores)
    isz = ITEMSIZE[dtype]
    usable = HARDWARE.scratchpad_usable_bytes
    in_row, w_row = sticks(cols * isz), sticks(cols * 4)
    per_row = 2 * in_row + w_row + 2 * STICK
    max_rows = usable // per_row
    if max_rows < 1:
        raise ValueError(f"a row of {cols} {dtype} does not fit the scratchpad (needs {per_row} B); "
                         "column tiling (online softmax) is not planned here")
    if tile_rows is not None and not 1 <= tile_rows <= max_rows:
        raise ValueError(f"tile_rows must be in 1..{max_rows} for {cols} {dtype} columns")
    symbols = [Symbol("x", "input", dtype, (rows, cols), (cols, 1)),
               Symbol("out", "output", dtype, (rows, cols), (cols, 1))]
    queues, programs = [], {}
    for core, (row0, count) in enumerate(split_evenly(rows, cores)):
        if count == 0:
            continue
        if tile_rows is None:
            ntiles = -(-count // max_rows)
            r = -(-count // ntiles)
        else:
            r = min(tile_rows, count)
        tiles, rem = divmod(count, r)
        sp = Scratch(usable)
        bufs = [sp.take(r * in_row), sp.take(r * in_row)]
        work, mx, sm = sp.take(r * w_row), sp.take(r * STICK), sp.take(r * STICK)
        q, qs = pipeline_queues(core)
        queues += qs
        ls, sfp = Unit(), Unit()
        base = row0 * cols * isz

        def load(u, t, b, size, r=r, bufs=bufs, base=base):
            u.emit(Load(u.sp(bufs[b]), u.dev("x", base + t * (r * cols * isz)), size or r,
                        cols * isz, cols * isz, in_row))

        def store(u, t, b, size, r=r, bufs=bufs, base=base):
            u.emit(Store(u.dev("out", base + t * (r * cols * isz)), u.sp(bufs[b]), size or r,
                         cols * isz, cols * isz, in_row))

        def compute(u, t, b, size, r=r, bufs=bufs, work=work, mx=mx, sm=sm):
            n = size or r
            x = u.tile(bufs[b], dtype, n, cols, in_row)
            w = u.tile(work, "fp32", n, cols, w_row)
            u.emit(
                Reduce("max", u.tile(mx, "fp32", n, 1, STICK), x),
                Binary("sub", w, x, u.tile(mx, "fp32", n, cols, STICK, "cols")),
                Unary("exp", w, w),
                Reduce("sum", u.tile(sm, "fp32", n, 1, STICK), w),
                Binary("div", x, w, u.tile(sm, "fp32", n, cols, STICK, "cols")),
            )

        pipeline(ls, sfp, tiles, rem, q, load, compute, store)
        programs[core] = {"ls": ls.instrs, "sfp": sfp.instrs}
    return assemble(f"row_softmax_{dtype}_{rows}x{cols}", symbols, queues, programs,
                    notes=f"rows split over {cores} core(s), double-buffered row tiles, fp32 inside sfp")


# ---- ring sum -----------------------------------------------------------------------------


def ring_sum(n: int, cores: int, *, chunk: int | None = None) -> Program:
    """out[1] (fp32) = sum(x[n]), x fp32, with the partials passed around the ring.

    Plan: x is split into `cores` contiguous near-equal slices, core c owning
    slice c. Each core streams its slice through two scratchpad buffers in
    chunks of `chunk` elements (default: as big as two buffers allow,
    253920; a smaller slice is one chunk) with the full<b>/done<b> queues of
    vector_add, and the sfp folds every chunk into its partial P (a 1x1 fp32
    tile in its own stick, zeroed by a Fill first) with Reduce sum
    (accumulate). Then the partials travel 0 -> 1 -> ... -> cores-1:

    * core c > 0, sfp: pop the cross-core queue ring<c-1> (producer core
      c-1 ls, consumer core c sfp), P = P + IN, where IN is the stick core
      c-1 sent; then push ready (sfp -> ls of the same core).
    * core c, ls: pop ready; if c is not the last core, Send the whole stick
      holding P to core c+1's IN (a ring neighbour) and push ring<c>; the
      last core instead stores the 4 valid bytes of P to out.

    The order of summation is: within a chunk as Reduce does it, chunks in
    order, then the cores' partials left to right.
    """
    if n < 1 or not 1 <= cores <= HARDWARE.cores:
        raise ValueError("need n >= 1 and 1 <= cores <= %d" % HARDWARE.cores)
    usable = HARDWARE.scratchpad_usable_bytes
    if chunk is None:
        chunk = (usable - 2 * STICK) // (2 * STICK) * (STICK // 4)
    if chunk % (STICK // 4):
        raise ValueError("chunk must be a whole number of fp32 sticks (32 elements)")
    queues, programs = [], {}
    last = cores - 1
    for core, (start, count) in enumerate(split_evenly(n, cores)):
        tiles, rem = divmod(count, chunk)
        size = chunk
        if tiles == 0:
            size, rem = 0, count
        sp = Scratch(usable)
        part, incoming = sp.take(4), sp.take(4)
        width = size or rem
        bufs = [sp.take(width * 4), sp.take(width * 4)] if width else []
        q, qs = pipeline_queues(core)
        ready = f"c{core}.ready"
        queues += qs + [Queue(ready, (core, "sfp"), (core, "ls"), depth=1)]
        if core < last:
            queues.append(Queue(f"ring{core}", (core, "ls"), (core + 1, "sfp"), depth=1))
        ls, sfp = Unit(), Unit()
        sfp.emit(Fill(sfp.tile(part, "fp32", 1, 1, STICK), 0.0))

        def load(u, t, b, rsize, size=size, bufs=bufs, start=start):
            cnt = rsize or size
            u.emit(Load(u.sp(bufs[b]), u.dev("x", start * 4 + t * (size * 4)), 1, cnt * 4, 0, sticks(cnt * 4)))

        def compute(u, t, b, rsize, size=size, bufs=bufs, part=part):
            cnt = rsize or size
            u.emit(Reduce("sum", u.tile(part, "fp32", 1, 1, STICK),
                          u.tile(bufs[b], "fp32", 1, cnt, sticks(cnt * 4)), accumulate=True))

        pipeline(ls, sfp, tiles, rem, q, load, compute, nothing)
        p_tile = sfp.tile(part, "fp32", 1, 1, STICK)
        if core > 0:
            sfp.emit(Pop(f"ring{core - 1}"), Binary("add", p_tile, p_tile, sfp.tile(incoming, "fp32", 1, 1, STICK)))
        sfp.emit(Push(ready))
        ls.emit(Pop(ready))
        if core < last:
            ls.emit(Send(core + 1, Addr(incoming), Addr(part), STICK), Push(f"ring{core}"))
        else:
            ls.emit(Store(DevAddr("out"), Addr(part), 1, 4, 0, STICK))
        programs[core] = {"ls": ls.instrs, "sfp": sfp.instrs}
    return assemble(
        f"ring_sum_{n}_on_{cores}",
        [_vector("x", "input", "fp32", n), _vector("out", "output", "fp32", 1)],
        queues, programs, notes=f"per-core partial sums, accumulated around the ring 0 -> {last}",
    )


# ---- tiled matmul -------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _matmul_bytes(tm: int, tk: int, tn: int, isz: int) -> int:
    """Scratchpad of one core: 2 x (a tile, b tile), fp32 accumulator, output tile."""
    return (2 * tm * sticks(tk * isz) + 2 * tk * sticks(tn * isz)
            + tm * sticks(tn * 4) + tm * sticks(tn * isz))


def _matmul_tiles(rows: int, k: int, n: int, isz: int, usable: int, tile_m, tile_k, tile_n):
    """Fewest steps (then fewest bytes loaded) among tilings that divide and fit."""
    best = None
    for tm in [tile_m] if tile_m else _divisors(rows):
        for tk in [tile_k] if tile_k else _divisors(k):
            for tn in [tile_n] if tile_n else _divisors(n):
                if _matmul_bytes(tm, tk, tn, isz) > usable:
                    continue
                steps = (rows // tm) * (n // tn) * (k // tk)
                key = (steps, steps * (tm * tk + tk * tn), -tn)
                if best is None or key < best[0]:
                    best = (key, (tm, tk, tn))
    if best is None:
        raise ValueError(f"no tiling of {rows}x{k} @ {k}x{n} fits {usable} B of scratchpad "
                         f"(tile_m={tile_m}, tile_k={tile_k}, tile_n={tile_n})")
    return best[1]


def tiled_matmul(m: int, k: int, n: int, dtype: str = "fp16", cores: int = 4, tile_m: int | None = None,
                 tile_k: int | None = None, tile_n: int | None = None) -> Program:
    """out[m, n] (dtype) = a[m, k] @ b[k, n], accumulated in fp32; all contiguous.

    Plan: the rows of `a` (and of out) are split into `cores` contiguous
    near-equal blocks; core c computes its block against all of b, so the
    cores never talk. Within a core the output block is cut into
    tile_m x tile_n output tiles (loops over m-tiles, then n-tiles) and the
    reduction into k-tiles; every tile size must divide its dimension
    (per core, for tile_m). Defaults: among the tilings that fit, the one with
    the fewest steps, then the fewest bytes loaded: for 1024^3 fp16 on 32
    cores that is 32 x 256 x 1024 (4 k-steps per core).

    Scratchpad per core: two buffers, each an a tile [tile_m, tile_k] and a
    b tile [tile_k, tile_n] (rows padded to whole sticks), one fp32
    accumulator [tile_m, tile_n] and one `dtype` output tile.

    Units and queues (per core):

    * ls: for each output tile, for each k-tile: pop free<b>, load the a and b
      tiles into buffer b, push full<b>; then pop out_full, store the output
      tile, push out_free.
    * pe: pop acc_free; for each k-tile: pop full<b>, MatMul (the first k-step
      with accumulate=False, which initializes the accumulator), push free<b>;
      then push acc_full.
    * sfp: pop acc_full, pop out_free, Unary "copy" fp32 accumulator -> dtype
      output tile (one rounding to nearest even), push acc_free and out_full.

    Buffers alternate over the k-tiles (or over n-tiles, then m-tiles, when
    there is a single k-tile), so ls loads step s + 1 while pe multiplies
    step s. pe primes free0/free1, sfp primes acc_free and ls primes out_free
    (one token each at the start, popped again at the end by the other side).
    """
    _check_dtype(dtype)
    if min(m, k, n) < 1 or not 1 <= cores <= HARDWARE.cores:
        raise ValueError("need m, k, n >= 1 and 1 <= cores <= %d" % HARDWARE.cores)
    isz = ITEMSIZE[dtype]
    usable = HARDWARE.scratchpad_usable_bytes
    for name, t, dim in (("tile_k", tile_k, k), ("tile_n", tile_n, n)):
        if t is not None and (t < 1 or dim % t):
            raise ValueError(f"{name}={t} must divide {dim}")
    queues, programs, chosen = [], {}, set()
    for core, (row0, rows) in enumerate(split_evenly(m, cores)):
        if rows == 0:
            continue
        if tile_m is not None and (tile_m < 1 or rows % tile_m):
            raise ValueError(f"tile_m={tile_m} must divide the {rows} rows of core {core}")
        tm, tk, tn = _matmul_tiles(rows, k, n, isz, usable, tile_m, tile_k, tile_n)
        chosen.add((tm, tk, tn))
        mt_n, nt_n, kt_n = rows // tm, n // tn, k // tk
        rot = "k" if kt_n > 1 else "n" if nt_n > 1 else "m" if mt_n > 1 else None
        a_row, b_row, acc_row, out_row = sticks(tk * isz), sticks(tn * isz), sticks(tn * 4), sticks(tn * isz)
        sp = Scratch(usable)
        a_buf = [sp.take(tm * a_row), sp.take(tm * a_row)]
        b_buf = [sp.take(tk * b_row), sp.take(tk * b_row)]
        acc, out = sp.take(tm * acc_row), sp.take(tm * out_row)

        def qn(name, core=core):
            return f"c{core}.{name}"

        queues += [Queue(qn(f"full{b}"), (core, "ls"), (core, "pe")) for b in (0, 1)]
        queues += [Queue(qn(f"free{b}"), (core, "pe"), (core, "ls")) for b in (0, 1)]
        queues += [Queue(qn("acc_full"), (core, "pe"), (core, "sfp"), depth=1),
                   Queue(qn("acc_free"), (core, "sfp"), (core, "pe"), depth=1),
                   Queue(qn("out_full"), (core, "sfp"), (core, "ls"), depth=1),
                   Queue(qn("out_free"), (core, "ls"), (core, "sfp"), depth=1)]

        def levels(u: Unit, count: int, rotating: bool):
            if rotating:
                yield from u.each(count)
            else:
                for i in u.range(count):
                    yield i, None

        a_base = row0 * k * isz
        out_base = row0 * n * isz

        # ls: loads of every step, stores of every output tile
        ls = Unit()
        ls.emit(Push(qn("out_free")))
        for mt, bm in levels(ls, mt_n, rot == "m"):
            for nt, bn in levels(ls, nt_n, rot == "n"):
                for kt, bk in levels(ls, kt_n, rot == "k"):
                    b = {"k": bk, "n": bn, "m": bm}.get(rot) or 0
                    ls.emit(
                        Pop(qn(f"free{b}")),
                        Load(ls.sp(a_buf[b]), ls.dev("a", a_base + mt * (tm * k * isz) + kt * (tk * isz)),
                             tm, tk * isz, k * isz, a_row),
                        Load(ls.sp(b_buf[b]), ls.dev("b", kt * (tk * n * isz) + nt * (tn * isz)),
                             tk, tn * isz, n * isz, b_row),
                        Push(qn(f"full{b}")),
                    )
                ls.emit(Pop(qn("out_full")),
                        Store(ls.dev("out", out_base + mt * (tm * n * isz) + nt * (tn * isz)), ls.sp(out),
                              tm, tn * isz, n * isz, out_row),
                        Push(qn("out_free")))
        ls.emit(Pop(qn("free0")), Pop(qn("free1")))

        # pe: the multiplications
        pe = Unit()
        pe.emit(Push(qn("free0")), Push(qn("free1")))

        def step(u, b, accumulate):
            u.emit(Pop(qn(f"full{b}")),
                   MatMul(u.tile(acc, "fp32", tm, tn, acc_row), u.tile(a_buf[b], dtype, tm, tk, a_row),
                          u.tile(b_buf[b], dtype, tk, tn, b_row), accumulate=accumulate),
                   Push(qn(f"free{b}")))

        for mt, bm in levels(pe, mt_n, rot == "m"):
            for nt, bn in levels(pe, nt_n, rot == "n"):
                pe.emit(Pop(qn("acc_free")))
                if rot == "k":
                    step(pe, 0, False)
                    for kt, bk in pe.each(kt_n - 1, offset=1):
                        step(pe, bk, True)
                else:
                    step(pe, {"n": bn, "m": bm}.get(rot) or 0, False)
                pe.emit(Push(qn("acc_full")))
        pe.emit(Pop(qn("acc_free")))

        # sfp: fp32 accumulator -> output dtype
        sfp = Unit()
        sfp.emit(Push(qn("acc_free")))
        for _ in sfp.range(mt_n):
            for _ in sfp.range(nt_n):
                sfp.emit(Pop(qn("acc_full")), Pop(qn("out_free")),
                         Unary("copy", sfp.tile(out, dtype, tm, tn, out_row), sfp.tile(acc, "fp32", tm, tn, acc_row)),
                         Push(qn("acc_free")), Push(qn("out_full")))
        sfp.emit(Pop(qn("out_free")))
        programs[core] = {"ls": ls.instrs, "pe": pe.instrs, "sfp": sfp.instrs}
    tiles = ", ".join(f"{tm}x{tk}x{tn}" for tm, tk, tn in sorted(chosen))
    return assemble(
        f"tiled_matmul_{dtype}_{m}x{k}x{n}_on_{cores}",
        [Symbol("a", "input", dtype, (m, k), (k, 1)), Symbol("b", "input", dtype, (k, n), (n, 1)),
         Symbol("out", "output", dtype, (m, n), (n, 1))],
        queues, programs,
        notes=f"rows of a split over {cores} core(s); tiles (m x k x n) {tiles}; a/b double-buffered",
    )
