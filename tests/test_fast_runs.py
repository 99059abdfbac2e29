"""The simulator's fast path (issue 18): the same bits and the same reports as the general one.

A launched program runs its data instructions in their static order over views bound once
(spyre_runtime/program/schedule.py), batched across independent cores; its timing report is
computed once per (program, each buffer's stick phase) and copied per launch. Here each is
checked against the general interpreter (execute.Machine) and a freshly computed Timing.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from spyre_authoring import calibration
from spyre_authoring.handwritten import ring_sum, row_softmax, tiled_matmul, vector_add
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.direct import run_program
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import JobPlan
from spyre_runtime.program import isa
from spyre_runtime.program.execute import Machine, ScratchBank
from spyre_runtime.program.operands import Addr, DevAddr, RowIndex, Tile
from spyre_runtime.program.program import CoreProgram, Program, Queue, Symbol
from spyre_runtime.program.run import kernel_reports, reset_kernel_reports
from spyre_runtime.program.schedule import BoundRun, Schedule
from spyre_runtime.program.timing import Timing
from spyre_runtime.program.validate import ProgramError, ProgramIndexError

S = HARDWARE.scratchpad_bytes
GEN = torch.Generator().manual_seed(18)


def _gather_program(rows=4, table_rows=10, cores=2, bad=False):
    """Each core gathers `rows` rows of w[table_rows, 64] fp32 at indices loaded from `ids`."""
    syms = (Symbol("w", "input", "fp32", (table_rows, 64), (64, 1)),
            Symbol("ids", "input", "int64", (cores * 16,), (1,)),
            Symbol("out", "output", "fp32", (cores * rows, 64), (64, 1)))
    cps = []
    for c in range(cores):
        column = Tile(Addr(0), "int64", rows, 1, 128)
        ls = (isa.Load(Addr(0), DevAddr("ids", c * 128), rows, 8, 8, 128),
              isa.Gather(Addr(4096), DevAddr("w", 0), rows, 256, 0, 256, (RowIndex(column, 256, table_rows),),
                         "aten.embedding"),
              isa.Store(DevAddr("out", c * rows * 256), Addr(4096), rows, 256, 256, 256))
        cps.append(CoreProgram(c, (("ls", ls),)))
    return Program("gather", syms, tuple(cps))


def _pointwise_chain(cores=4, n=256):
    """out = exp(x) * y - max(x, y) on `cores` cores, one tile each: exact and inexact ops."""
    per = n // cores
    syms = (Symbol("x", "input", "fp32", (n,), (1,)), Symbol("y", "input", "fp32", (n,), (1,)),
            Symbol("out", "output", "fp32", (n,), (1,)))
    cps, queues = [], []
    for c in range(cores):
        t = lambda a: Tile(Addr(a), "fp32", 1, per, 1024)  # noqa: E731
        full, done = f"c{c}.full", f"c{c}.done"
        queues += [Queue(full, (c, "ls"), (c, "sfp"), 1), Queue(done, (c, "sfp"), (c, "ls"), 1)]
        ls = (isa.Load(Addr(0), DevAddr("x", c * per * 4), 1, per * 4, 0, 1024),
              isa.Load(Addr(1024), DevAddr("y", c * per * 4), 1, per * 4, 0, 1024),
              isa.Push(full), isa.Pop(done),
              isa.Store(DevAddr("out", c * per * 4), Addr(4096), 1, per * 4, 0, 1024))
        sfp = (isa.Pop(full), isa.Unary("exp", t(2048), t(0)), isa.Binary("mul", t(2048), t(2048), t(1024)),
               isa.Binary("max", t(3072), t(0), t(1024)), isa.Binary("sub", t(4096), t(2048), t(3072)),
               isa.Push(done))
        cps.append(CoreProgram(c, (("ls", ls), ("sfp", sfp))))
    return Program("chain", syms, tuple(cps), tuple(queues))


def _inputs(program, ids_bound=10):
    out = {}
    for sym in program.symbols:
        if sym.role != "input":
            continue
        n = sym.nbytes // {"fp32": 4, "fp16": 2, "int64": 8}[sym.dtype]
        if sym.dtype == "int64":
            out[sym.name] = torch.randint(0, ids_bound, (n,), generator=GEN)
        else:
            dtype = torch.float32 if sym.dtype == "fp32" else torch.float16
            out[sym.name] = torch.randn(n, generator=GEN).to(dtype)
    return out


def _buffers(program, inputs):
    bufs = {k: v.clone().view(torch.uint8) for k, v in inputs.items()}
    for sym in program.symbols:
        if sym.name not in bufs:
            bufs[sym.name] = torch.full((sym.nbytes,), 0xAB, dtype=torch.uint8)
    return bufs


def _bias_add(cores=4, n=64, reverse=False):
    """out[r] = x[r] + bias on `cores` cores: every core reads the one bias row (no conflict).
    Core c has row c, or with `reverse` row cores - 1 - c (addresses descending over the cores)."""
    syms = (Symbol("x", "input", "fp32", (cores, n), (n, 1)), Symbol("bias", "input", "fp32", (n,), (1,)),
            Symbol("out", "output", "fp32", (cores, n), (n, 1)))
    cps, queues = [], []
    for c in range(cores):
        t = lambda a: Tile(Addr(a), "fp32", 1, n, 1024)  # noqa: E731
        r = cores - 1 - c if reverse else c
        queues += [Queue(f"f{c}", (c, "ls"), (c, "sfp"), 1), Queue(f"d{c}", (c, "sfp"), (c, "ls"), 1)]
        ls = (isa.Load(Addr(0), DevAddr("x", r * n * 4), 1, n * 4, 0, 1024),
              isa.Load(Addr(1024), DevAddr("bias", 0), 1, n * 4, 0, 1024), isa.Push(f"f{c}"), isa.Pop(f"d{c}"),
              isa.Store(DevAddr("out", r * n * 4), Addr(2048), 1, n * 4, 0, 1024))
        sfp = (isa.Pop(f"f{c}"), isa.Binary("add", t(2048), t(0), t(1024)), isa.Push(f"d{c}"))
        cps.append(CoreProgram(c, (("ls", ls), ("sfp", sfp))))
    return Program("bias_add", syms, tuple(cps), tuple(queues))


PROGRAMS = {
    "bias_add": _bias_add,
    "bias_add_descending": lambda: _bias_add(reverse=True),  # (a flip's cores: as_strided has no negative strides)
    "vector_add": lambda: vector_add(1000),
    "vector_add_fp16_chunks": lambda: vector_add(1000, "fp16", chunk=128),
    "calibration_add_8_cores": lambda: calibration.add(64, 256, cores=8),
    "row_sum_4_cores": lambda: calibration.row_sum(32, 512, cores=4),
    "row_softmax": lambda: row_softmax(64, 128, "fp16", cores=4),
    "tiled_matmul": lambda: tiled_matmul(64, 96, 128, cores=2),
    "ring_sum": lambda: ring_sum(4096, 4),
    "gather": _gather_program,
    "pointwise_chain": _pointwise_chain,
    "late_send": lambda: _late_send(),
}


def _both(program):
    inputs = _inputs(program)
    general = _buffers(program, inputs)
    Machine(program, general, S).run()
    fast = _buffers(program, inputs)
    bank = ScratchBank(S, 32)
    bound = BoundRun(Schedule(program, S), program, fast, bank)
    bound.run()
    return general, fast, bound


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_fast_path_gives_the_general_interpreters_bits(name):
    program = PROGRAMS[name]()
    general, fast, _ = _both(program)
    for sym in program.symbols:
        assert torch.equal(general[sym.name], fast[sym.name]), sym.name


def test_independent_cores_run_as_one_operation_each():
    program = calibration.add(64, 256, cores=8)
    steps = Schedule(program, S).steps
    _, _, bound = _both(program)
    assert bound.batched and len(bound.ops) * 4 <= len(steps)
    # cores that only read the same bytes are independent
    general, fast, bound = _both(_bias_add())
    assert bound.batched and len(bound.ops) == 4 and torch.equal(general["out"], fast["out"])
    # cores that pass data around the ring run in rounds: a core waits only for what the ring brings it
    program = ring_sum(4096, 4)
    general, fast, bound = _both(program)
    assert bound.batched and len(bound.ops) < len(Schedule(program, S).steps)
    assert torch.equal(general["out"], fast["out"])


def _late_send(cores=3):
    """Core c > 0 adds what core c - 1 sent it to its own row and passes the sum on; core 0 sends
    after three steps of its own, core c > 0 reads the landing bytes at its second step: in the
    k-th-step-of-every-core order it would read them before they land."""
    syms = (Symbol("x", "input", "fp32", (cores, 32), (32, 1)), Symbol("out", "output", "fp32", (cores, 32), (32, 1)))
    t = lambda a: Tile(Addr(a), "fp32", 1, 32, 128)  # noqa: E731
    cps, queues = [], []
    for c in range(cores):
        queues += [Queue(f"f{c}", (c, "ls"), (c, "sfp"), 1), Queue(f"d{c}", (c, "sfp"), (c, "ls"), 1)]
        if c + 1 < cores:
            queues.append(Queue(f"ring{c}", (c, "ls"), (c + 1, "sfp"), 1))
        ls = [isa.Load(Addr(0), DevAddr("x", c * 128), 1, 128, 0, 128), isa.Push(f"f{c}"), isa.Pop(f"d{c}")]
        if c + 1 < cores:
            ls += [isa.Send(c + 1, Addr(1024), Addr(512), 128), isa.Push(f"ring{c}")]
        ls.append(isa.Store(DevAddr("out", c * 128), Addr(512), 1, 128, 0, 128))
        sfp = [isa.Pop(f"f{c}")]
        if c == 0:
            sfp += [isa.Unary("exp", t(256), t(0)), isa.Unary("neg", t(256), t(256)),
                    isa.Binary("add", t(512), t(256), t(0))]
        else:
            sfp += [isa.Pop(f"ring{c - 1}"), isa.Binary("add", t(512), t(0), t(1024))]
        sfp.append(isa.Push(f"d{c}"))
        cps.append(CoreProgram(c, (("ls", tuple(ls)), ("sfp", tuple(sfp)))))
    return Program("late_send", syms, tuple(cps), tuple(queues))


def test_a_core_waits_for_what_the_ring_brings_it():
    program = _late_send()
    schedule = Schedule(program, S)
    # what each receiving core's add must follow: the send that lands in its operand
    sends = {steps[0]: k for k, steps in enumerate(schedule.steps) if isinstance(steps[3], isa.Send)}
    adds = {s[0]: k for k, s in enumerate(schedule.steps) if isinstance(s[3], isa.Binary) and s[0] > 0}
    assert all(sends[c - 1] in schedule.after[adds[c]] for c in adds)
    general, fast, bound = _both(program)
    assert bound.batched and len(bound.ops) < len(schedule.steps)
    for sym in program.symbols:
        assert torch.equal(general[sym.name], fast[sym.name]), sym.name
    x = torch.stack([general["x"].view(torch.float32)[c * 32:(c + 1) * 32] for c in range(3)])
    want = x[0] - torch.exp(x[0])  # core 0: -exp(x) + x; then each core adds its row to it
    assert torch.equal(fast["out"].view(torch.float32).view(3, 32)[2], (want + x[1]) + x[2])


def test_a_core_writing_what_another_reads_is_not_batched():
    # core 1 reads the bytes core 0 writes (in the interpreter's order, after): not independent
    syms = (Symbol("y", "input", "fp32", (64,), (1,)), Symbol("x", "temp", "fp32", (64,), (1,), 0),
            Symbol("out", "output", "fp32", (64,), (1,)))
    cps = (CoreProgram(0, (("ls", (isa.Load(Addr(0), DevAddr("y", 0), 1, 256, 0, 256),
                                   isa.Store(DevAddr("x", 0), Addr(0), 1, 256, 0, 256))),)),
           CoreProgram(1, (("ls", (isa.Load(Addr(0), DevAddr("x", 0), 1, 256, 0, 256),
                                   isa.Store(DevAddr("out", 0), Addr(0), 1, 256, 0, 256))),)))
    program = Program("rw", syms, cps)
    general, fast, bound = _both(program)
    assert not bound.batched
    assert torch.equal(general["out"], fast["out"]) and torch.equal(fast["out"], fast["y"])


def test_an_out_of_range_gather_index_is_named_on_the_fast_path():
    program = _gather_program()
    inputs = _inputs(program)
    inputs["ids"][16 + 2] = 12  # core 1, row 2
    bound = BoundRun(Schedule(program, S), program, _buffers(program, inputs), ScratchBank(S, 32))
    with pytest.raises(ProgramIndexError, match=r"core 1 unit ls instruction 1 \(gather\): IndexError: "
                                                r"aten.embedding: index 12 is out of bounds for size 10") as e:
        bound.run()
    assert (e.value.op, e.value.value, e.value.bound) == ("aten.embedding", 12, 10)


def test_a_failing_fast_form_is_named_by_the_general_semantics():
    # integer division by zero on core 1 of 2: the error names core 1's instruction
    syms = (Symbol("x", "input", "int32", (64,), (1,)), Symbol("out", "output", "int32", (64,), (1,)))
    cps = []
    for c in range(2):
        t = lambda a: Tile(Addr(a), "int32", 1, 32, 128)  # noqa: E731
        ls = (isa.Load(Addr(0), DevAddr("x", c * 128), 1, 128, 0, 128), isa.Push(f"q{c}"), isa.Pop(f"r{c}"),
              isa.Store(DevAddr("out", c * 128), Addr(512), 1, 128, 0, 128))
        sfp = (isa.Pop(f"q{c}"), isa.Binary("floordiv", t(512), t(0), t(0)), isa.Push(f"r{c}"))
        cps.append(CoreProgram(c, (("ls", ls), ("sfp", sfp))))
    queues = tuple(q for c in range(2) for q in (Queue(f"q{c}", (c, "ls"), (c, "sfp"), 1),
                                                 Queue(f"r{c}", (c, "sfp"), (c, "ls"), 1)))
    program = Program("div", syms, tuple(cps), queues)
    x = torch.arange(1, 65, dtype=torch.int32)
    x[40] = 0
    bound = BoundRun(Schedule(program, S), program, {"x": x.view(torch.uint8), "out": torch.zeros(256, dtype=torch.uint8)},
                     ScratchBank(S, 32))
    with pytest.raises(ProgramError, match=r"core 1 unit sfp instruction 1 \(binary\) failed: ZeroDivisionError"):
        bound.run()


def _tile_copy(rows_of=(0, 1, 2, 5, 6, 7), pieces=4, row_bytes=128, bad_piece=None):
    """Core c copies fp16 block rows_of[c] (64 rows of `row_bytes`) of x to out, the block loaded
    as `pieces` back-to-back loads of 64 / pieces rows (a weight tile as the matmul plans load it)
    and stored in one. The cores' blocks are not evenly spaced (0, 1, 2, then 5, 6, 7). With
    `bad_piece`, that load of the last core reads past x."""
    blocks = max(rows_of) + 1
    syms = (Symbol("x", "input", "fp16", (blocks * 64, row_bytes // 2), (row_bytes // 2, 1)),
            Symbol("out", "output", "fp16", (blocks * 64, row_bytes // 2), (row_bytes // 2, 1)))
    cps = []
    step = 64 // pieces
    for c, r in enumerate(rows_of):
        ls = []
        for p in range(pieces):
            src = (r * 64 + p * step) * row_bytes
            if bad_piece == p and c == len(rows_of) - 1:
                src = blocks * 64 * row_bytes
            ls.append(isa.Load(Addr(p * step * 128), DevAddr("x", src), step, row_bytes, row_bytes, 128))
        ls.append(isa.Store(DevAddr("out", r * 64 * row_bytes), Addr(0), 64, row_bytes, row_bytes, 128))
        cps.append(CoreProgram(c, (("ls", tuple(ls)),)))
    return Program("tile_copy", syms, tuple(cps))


@pytest.mark.parametrize("row_bytes", [128, 96])  # (96: each scratchpad row's last 32 bytes masked)
def test_back_to_back_loads_join_and_unevenly_spaced_cores_run_in_evenly_spaced_runs(row_bytes):
    program = _tile_copy(row_bytes=row_bytes)
    general, fast, bound = _both(program)
    for sym in program.symbols:
        assert torch.equal(general[sym.name], fast[sym.name]), sym.name
    # each core's four loads are one load of 64 rows; the six cores' loads two operations (cores
    # 0-2 and 3-5: blocks 0, 1, 2 and 5, 6, 7), not one per core
    loads = [group for _, group in bound.ops if isinstance(group[0][3], isa.Load)]
    assert [len(group) for group in loads] == [3, 3]
    assert all(group[0][3].rows == 64 for group in loads)
    assert len(bound.ops) == 4  # and the stores, alike
    blocks = fast["out"].view(torch.float16).view(8, 64, row_bytes // 2)
    assert torch.equal(blocks[[0, 1, 2, 5, 6, 7]], fast["x"].view(torch.float16).view(8, 64, -1)[[0, 1, 2, 5, 6, 7]])


def test_transfers_of_one_row_join_whatever_their_strides():
    # (a one-row transfer's stride does nothing: attention's query rows come in as loads of one
    # row with stride 0, its output rows go out likewise)
    syms = (Symbol("q", "input", "fp16", (8, 64), (64, 1)), Symbol("out", "output", "fp16", (8, 64), (64, 1)))
    cps = []
    for c in range(2):
        ls = [isa.Load(Addr(r * 128), DevAddr("q", (c * 4 + r) * 128), 1, 128, 0, 128) for r in range(4)]
        ls += [isa.Store(DevAddr("out", (c * 4 + r) * 128), Addr(r * 128), 1, 128, 0, 128) for r in range(4)]
        cps.append(CoreProgram(c, (("ls", tuple(ls)),)))
    program = Program("rows", syms, tuple(cps))
    general, fast, bound = _both(program)
    assert torch.equal(general["out"], fast["out"]) and torch.equal(fast["out"], fast["q"])
    assert [(type(group[0][3]).__name__, len(group), group[0][3].rows) for _, group in bound.ops] == \
        [("Load", 2, 4), ("Store", 2, 4)]


def test_the_same_instruction_at_another_pc_joins_its_round():
    # core 2 runs the same transpose as the others inside a loop of one (a combining core's
    # program is laid out otherwise): its pc differs, its round is the same, and the four
    # transposes run as one operation
    syms = (Symbol("x", "input", "fp16", (4 * 64, 64), (64, 1)), Symbol("out", "output", "fp16", (4 * 64, 64), (64, 1)))
    cps = []
    for c in range(4):
        t = isa.Transpose(Tile(Addr(8192), "fp16", 64, 64, 128), Tile(Addr(0), "fp16", 64, 64, 128))
        body = (isa.Loop(1), t, isa.EndLoop()) if c == 2 else (t,)
        ls = (isa.Load(Addr(0), DevAddr("x", c * 8192), 64, 128, 128, 128), *body,
              isa.Store(DevAddr("out", c * 8192), Addr(8192), 64, 128, 128, 128))
        cps.append(CoreProgram(c, (("ls", ls),)))
    program = Program("transposes", syms, tuple(cps))
    general, fast, bound = _both(program)
    assert torch.equal(general["out"], fast["out"])
    x = fast["x"].view(torch.float16).view(4, 64, 64)
    assert torch.equal(fast["out"].view(torch.float16).view(4, 64, 64), x.transpose(1, 2))
    assert [(type(group[0][3]).__name__, len(group)) for _, group in bound.ops] == \
        [("Load", 4), ("Transpose", 4), ("Store", 4)]


def test_a_joined_load_that_fails_is_named_by_its_own_part():
    # the last core's third load reads past x: the joined load cannot bind, its parts run by the
    # general semantics, and the error names that part (instruction 2), as the interpreter does
    program = _tile_copy(bad_piece=2)
    inputs = _inputs(program)
    general = _buffers(program, inputs)
    with pytest.raises(ProgramError) as raised:
        Machine(program, general, S).run()
    fast = _buffers(program, inputs)
    bound = BoundRun(Schedule(program, S), program, fast, ScratchBank(S, 32))
    with pytest.raises(ProgramError, match=r"core 5 unit ls instruction 2 \(load\)") as e:
        bound.run()
    assert str(e.value) == str(raised.value)
    # core 5's store never ran (the other cores' may have: the run stops at the failure)
    assert (fast["out"].view(8, 64 * 128)[7] == 0xAB).all() and (general["out"].view(8, 64 * 128)[7] == 0xAB).all()


def _matmuls(cores=4, accumulate=True, spaced=(0, 1, 2, 3)):
    """Core c: acc = a[c] @ b[c] (+ a2[c] @ b2[c] with `accumulate`), fp16 tiles, fp32 result;
    its tiles at scratchpad offset 256 * spaced[c] (unevenly spaced over the cores if asked)."""
    M, K, N = 4, 64, 32
    syms = (Symbol("a", "input", "fp16", (cores * 2 * M, K), (K, 1)), Symbol("b", "input", "fp16", (cores * 2 * K, N), (N, 1)),
            Symbol("out", "output", "fp32", (cores * M, N), (N, 1)))
    cps, queues = [], []
    for c in range(cores):
        base = 256 * spaced[c]
        A = lambda k: Tile(Addr(base + k * 1024), "fp16", M, K, 128)  # noqa: E731
        B = lambda k: Tile(Addr(base + 4096 + k * 16384), "fp16", K, N, 128)  # noqa: E731
        acc = Tile(Addr(base + 40960), "fp32", M, N, 128)
        queues += [Queue(f"f{c}", (c, "ls"), (c, "pe"), 1), Queue(f"d{c}", (c, "pe"), (c, "ls"), 1)]
        ls = [isa.Load(Addr(base + k * 1024), DevAddr("a", ((2 * c + k) * M) * K * 2), M, K * 2, K * 2, 128)
              for k in range(2)]
        ls += [isa.Load(Addr(base + 4096 + k * 16384), DevAddr("b", ((2 * c + k) * K) * N * 2), K, N * 2, N * 2, 128)
               for k in range(2)]
        ls += [isa.Push(f"f{c}"), isa.Pop(f"d{c}"),
               isa.Store(DevAddr("out", c * M * N * 4), Addr(base + 40960), M, N * 4, N * 4, 128)]
        pe = [isa.Pop(f"f{c}"), isa.MatMul(acc, A(0), B(0), accumulate=False)]
        if accumulate:
            pe.append(isa.MatMul(acc, A(1), B(1), accumulate=True))
        pe.append(isa.Push(f"d{c}"))
        cps.append(CoreProgram(c, (("ls", tuple(ls)), ("pe", tuple(pe)))))
    return Program("matmuls", syms, tuple(cps), tuple(queues))


@pytest.mark.parametrize("spaced", [(0, 1, 2, 3), (0, 1, 2, 7)])
def test_the_matmuls_of_several_cores_run_as_one_operation_each_with_one_product_per_core(spaced):
    program = _matmuls(spaced=spaced)
    general, fast, bound = _both(program)
    assert torch.equal(general["out"], fast["out"])
    a = fast["a"].view(torch.float16).float().view(4, 2, 4, 64)
    b = fast["b"].view(torch.float16).float().view(4, 2, 64, 32)
    want = torch.stack([torch.mm(a[c, 0], b[c, 0]).add_(torch.mm(a[c, 1], b[c, 1])) for c in range(4)])
    assert torch.equal(fast["out"].view(torch.float32).view(4, 4, 32), want)
    sizes = [len(group) for _, group in bound.ops if isinstance(group[0][3], isa.MatMul)]
    assert sizes == ([4, 4] if spaced == (0, 1, 2, 3) else [3, 1, 3, 1])


def _row_reductions(op, dtype, cols, cores=4, rows=3, accumulate=False):
    """Core c reduces its rows x cols tile of x (op over each row) into a column, once, or twice
    into one accumulating column with `accumulate`; its results as fp32 (int64 for argmax/argmin)."""
    size = {"fp32": 4, "fp16": 2}[dtype]
    out_dtype = "int64" if op in isa.INDEX_REDUCE else "fp32"
    stride = -(-cols * size // 128) * 128 + 128  # (rows a stick apart beyond their bytes: strided views)
    syms = (Symbol("x", "input", dtype, (cores * 2 * rows, cols), (cols, 1)),
            Symbol("out", "output", out_dtype, (cores * rows, 2), (2, 1)))
    cps, queues = [], []
    for c in range(cores):
        src = lambda k: Tile(Addr(k * rows * stride), dtype, rows, cols, stride)  # noqa: E731
        dst = Tile(Addr(8192), out_dtype, rows, 1, 128)
        queues += [Queue(f"f{c}", (c, "ls"), (c, "sfp"), 1), Queue(f"d{c}", (c, "sfp"), (c, "ls"), 1)]
        ls = (isa.Load(Addr(0), DevAddr("x", c * 2 * rows * cols * size), 2 * rows, cols * size, cols * size, stride),
              isa.Push(f"f{c}"), isa.Pop(f"d{c}"),
              isa.Store(DevAddr("out", c * rows * 2 * 8 // (2 if out_dtype == "fp32" else 1)), Addr(8192), rows,
                        8 if out_dtype == "int64" else 4, 16 if out_dtype == "int64" else 8, 128))
        sfp = [isa.Pop(f"f{c}"), isa.Reduce(op, dst, src(0))]
        if accumulate:
            sfp.append(isa.Reduce(op, dst, src(1), accumulate=True))
        sfp.append(isa.Push(f"d{c}"))
        cps.append(CoreProgram(c, (("ls", ls), ("sfp", tuple(sfp)))))
    return Program(f"reduce_{op}", syms, tuple(cps), tuple(queues))


@pytest.mark.parametrize("op,accumulate", [("sum", False), ("sum", True), ("prod", False), ("max", False),
                                           ("max", True), ("argmax", False), ("argmin", False)])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("cols", [5, 64, 100])  # (below, at and past a vector's width, with a tail)
def test_the_row_reductions_of_several_cores_run_as_one_operation_with_each_cores_bits(op, accumulate, dtype, cols):
    program = _row_reductions(op, dtype, cols, accumulate=accumulate)
    inputs = _inputs(program)
    x = inputs["x"].view(-1)
    x[::7] = float("nan") if op != "prod" else 1.5  # NaNs propagate with the very bits one core's loop gives
    x[3::11] = float("inf")
    x[5::13] = -float("inf")
    if op != "prod":
        x[2::17] = -float("nan")  # (another NaN's bits: which one a row keeps must not change)
    general = _buffers(program, inputs)
    Machine(program, general, S).run()
    fast = _buffers(program, inputs)
    bound = BoundRun(Schedule(program, S), program, fast, ScratchBank(S, 32))
    bound.run()
    assert torch.equal(general["out"], fast["out"])
    sizes = [len(group) for _, group in bound.ops if isinstance(group[0][3], isa.Reduce)]
    # combining by elementwise max takes one core at a time (its NaN bits differ batched)
    assert sizes == ([4, 1, 1, 1, 1] if (op, accumulate) == ("max", True) else [4] * (1 + accumulate))


def test_the_schedule_walk_raises_the_interpreters_deadlock():
    syms = (Symbol("x", "input", "fp32", (32,), (1,)),)
    program = Program("dead", syms, (CoreProgram(0, (("ls", (isa.Pop("out"), isa.Push("in"))),
                                                     ("sfp", (isa.Pop("in"), isa.Push("out"))))),),
                      (Queue("in", (0, "ls"), (0, "sfp")), Queue("out", (0, "sfp"), (0, "ls"))))
    with pytest.raises(ProgramError, match=r"deadlocked: core 0 unit ls instruction 0 \(pop out\)"):
        Schedule(program, S)


# ---- timing reports ----------------------------------------------------------------------------


def _figures(report) -> dict:
    return {f.name: getattr(report, f.name) for f in dataclasses.fields(report) if f.name != "hardware"}


def _fresh(program, phases):
    timing = Timing(program, HARDWARE, phases=phases)
    inputs = _inputs(program)
    Machine(program, _buffers(program, inputs), S, timing).run()  # timed as the interpreter runs it
    return timing.finish()


def _launch_vector_add(program, offset_elems: int):
    x = torch.zeros(1100).to("spyre")[offset_elems:offset_elems + 1000]
    y = torch.randn(1000).to("spyre")
    reset_kernel_reports()
    out = run_program(program, x=x, y=y)["out"]
    torch.spyre.synchronize()
    assert torch.equal(out.cpu(), y.cpu())
    return kernel_reports()


@pytest.mark.parametrize("offset_elems", [0, 1, 25])
def test_a_cached_report_equals_a_fresh_one(offset_elems):
    program = vector_add(1000)
    first = _launch_vector_add(program, 0)  # aligned: the report computed and cached
    second = _launch_vector_add(program, offset_elems)  # x's phase is part of the key
    third = _launch_vector_add(program, offset_elems)  # the same key: the cached report, copied
    assert len(first) == len(second) == len(third) == 1
    fresh = _fresh(program, {"x": offset_elems * 4 % 128})
    assert _figures(second[0]) == _figures(third[0]) == _figures(fresh)
    assert _figures(first[0]) == _figures(_fresh(program, {}))
    assert len(program.__dict__["_run_states"]) == 1  # (the launches shared the program's state)


def test_an_unaligned_binding_moves_the_sticks_it_touches():
    program = vector_add(1000)
    aligned = _fresh(program, {})
    shifted = _fresh(program, {"x": 100})
    # 4000 bytes from 100 bytes into a stick reach into a 33rd stick; from its start, 32
    assert shifted.bytes_read == aligned.bytes_read + 128


def test_every_launch_gets_its_own_report_object():
    from spyre_runtime.prepare import prepare_kernel  # noqa: F401 - the device is set up by the import

    program = vector_add(1000)
    x, y = torch.randn(1000).to("spyre"), torch.randn(1000).to("spyre")
    reset_kernel_reports()
    for _ in range(3):
        run_program(program, x=x, y=y)
    torch.spyre.synchronize()
    reports = kernel_reports()
    assert len(reports) == 3 and len({id(r) for r in reports}) == 3
    reports[0].unit_busy_ns.clear()  # a caller writing into one launch's report touches no other
    reports[0].extra = 1
    assert reports[1].unit_busy_ns and not hasattr(reports[1], "extra")
    assert _figures(reports[1]) == _figures(reports[2])


# ---- compiled programs ---------------------------------------------------------------------------


def _plans_after(fn, *args):
    import spyre_inductor  # noqa: F401

    before = {id(o) for o in gc.get_objects() if type(o) is JobPlan}
    torch._dynamo.reset()
    out = torch.compile(fn)(*args)
    torch.spyre.synchronize()
    return out, [o for o in gc.get_objects() if type(o) is JobPlan and id(o) not in before]


@pytest.mark.parametrize("case", ["add", "matmul", "sum", "softmax", "embedding", "rand", "randn", "attention",
                                  "index_put", "index_put_accumulate", "decode_attention", "decode_projection"])
def test_compiled_programs_give_the_interpreters_bits(case):
    from spyre_runtime.program.schedule import BIND_ERRORS

    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    fn, args = {
        "add": (lambda a, b: a + b, (a, b)),
        "matmul": (lambda a, b: a @ b, (a, b)),
        "sum": (lambda a, b: (a * b).sum(-1), (a, b)),
        "softmax": (lambda a, b: torch.softmax(a, -1) + b, (a, b)),
        "embedding": (lambda a, i: a[i] * 2, (a, torch.randint(0, 64, (16,), generator=g))),
        # philox (issue 19): uniform binds across cores, normal runs one core at a time
        "rand": (lambda a, b: a + torch.rand_like(b), (a, b)),
        "randn": (lambda a, b: a * torch.randn_like(b), (a, b)),
        # fused attention: its tiles transposed in the scratchpad (Transpose's fast form)
        "attention": (lambda a, b: torch.nn.functional.scaled_dot_product_attention(
            a.view(1, 2, 32, 64), b.view(1, 2, 32, 64), b.view(1, 2, 32, 64), is_causal=True), (a, b)),
        # scatters (Scatter's fast form), duplicates summed in order when accumulating
        "index_put": (lambda a, i: a.index_put((i,), a[:4] * 2), (a, torch.tensor([3, 9, 3, 60]))),
        "index_put_accumulate": (lambda a, i: a.index_put((i,), a[:4] * 2, accumulate=True),
                                 (a, torch.tensor([3, 9, 3, 60]))),
        # one query row against a long cache: the cores' partial results combined over the ring
        # (Send's fast form, the rounds of schedule.ring_order)
        "decode_attention": (lambda q, k: torch.nn.functional.scaled_dot_product_attention(q, k, k),
                             (a[:4].reshape(1, 4, 1, 64).half(), torch.randn(1, 4, 1024, 64, generator=g).half())),
        # one row against a weight stored transposed, k split unevenly over the cores (joined
        # loads, unevenly spaced runs, the matmuls of a round as one operation)
        "decode_projection": (lambda x, w: x @ w.t(), (torch.randn(1, 768, generator=g).half(),
                                                        torch.randn(256, 768, generator=g).half())),
    }[case]
    errors = BIND_ERRORS.copy()
    dev = [t.to("spyre") for t in args]
    _, plans = _plans_after(fn, *dev)
    assert plans
    for plan in plans:
        ex = plan.executor.executable
        slots = ex._read_slots(plan.artifact)
        buffers = ex._buffers(plan.artifact, slots)
        outputs = [s.name for s in plan.program.symbols if s.role == "output"]
        for name in outputs:
            buffers[name].fill_(0xCD)
        Machine(plan.program, buffers, S).run()
        want = {name: buffers[name].clone() for name in outputs}
        for name in outputs:
            buffers[name].fill_(0xCD)
        ex.run(plan.artifact)
        for name in outputs:
            assert torch.equal(buffers[name], want[name]), (plan.name, name)
    assert BIND_ERRORS == errors  # every fast form bound without raising
    if case == "attention":  # (its causal mask's positions: Iota's fast form)
        names = {type(ins).__name__ for plan in plans for core in plan.program.cores
                 for _, instrs in core.units for ins in instrs}
        assert {"Transpose", "Iota"} <= names, names
    if case in ("index_put", "index_put_accumulate", "decode_attention"):
        kind = isa.Send if case == "decode_attention" else isa.Scatter
        bound = [b for plan in plans for b in plan.executor.executable._state.bound.values()
                 if any(isinstance(step[3], kind) for _, group in b.ops for step in group)]
        assert bound and all(b.batched for b in bound)
        for b in bound:  # by the fast form, not one instruction at a time by the general semantics
            assert all(fn.__qualname__.startswith(("_bind_indexed", "Send.bind")) for fn, group in b.ops
                       if isinstance(group[0][3], kind)), [fn.__qualname__ for fn, _ in b.ops]


def test_scratchpads_keep_what_the_previous_kernel_left():
    # One kernel loads x into core 3's scratchpad; the next stores those bytes without writing
    # them first: as on the card, scratchpads are not zeroed between kernels (same bank, same core).
    sym = lambda name, role: Symbol(name, role, "fp32", (32,), (1,))  # noqa: E731
    load = Program("leave", (sym("x", "input"),),
                   (CoreProgram(3, (("ls", (isa.Load(Addr(4096), DevAddr("x", 0), 1, 128, 0, 128),)),)),))
    store = Program("find", (sym("out", "output"),),
                    (CoreProgram(3, (("ls", (isa.Store(DevAddr("out", 0), Addr(4096), 1, 128, 0, 128),)),)),))
    x = torch.randn(32, generator=GEN)
    for _ in range(2):  # the second time through the bound (cached) runs
        run_program(load, x=x)
        out = run_program(store)["out"]
        torch.spyre.synchronize()
        assert torch.equal(out.cpu(), x)


def test_a_schedule_too_long_to_bind_runs_the_interpreter_with_the_cached_report(monkeypatch):
    from spyre_runtime.program import run as run_module

    monkeypatch.setattr(run_module, "MAX_BOUND_STEPS", 1)
    program = vector_add(1000, chunk=128)
    x, y = torch.randn(1000, generator=GEN), torch.randn(1000, generator=GEN)
    reset_kernel_reports()
    for _ in range(2):
        out = run_program(program, x=x, y=y)["out"]
        torch.spyre.synchronize()
        assert torch.equal(out.cpu(), x + y)
    reports = kernel_reports()
    assert len(reports) == 2 and _figures(reports[0]) == _figures(reports[1]) == _figures(_fresh(program, {}))
    state = next(iter(program.__dict__["_run_states"].values()))
    assert not state.bound  # nothing was bound


def test_a_binary_writes_its_tile_in_place_only_where_no_operand_is_partly_overwritten():
    # Bound over many cores' tiles, a binary op computes straight into its destination (out=)
    # when each operand is either the destination itself or has no element in common with it;
    # the views of many cores' tiles look overlapping to torch, but their per-core blocks are apart.
    bank = torch.zeros(5 * 1024, dtype=torch.float32)

    def tiles(start, rows=2, cols=8, row_stride=16):  # one tile per core, cores 1024 floats apart
        return torch.as_strided(bank, (4, rows, cols), (1024, row_stride, 1), start)

    dst = tiles(0)
    assert isa._writable_over(dst, tiles(0))            # the same elements: read before written
    assert isa._writable_over(dst, tiles(64))           # each core's tile apart from the other
    assert not isa._writable_over(dst, tiles(8))        # rows interleaved: taken as overlapping (safe)
    assert not isa._writable_over(dst, tiles(16))       # shifted by a row: a partial overlap
    assert not isa._writable_over(dst, tiles(1016))     # ends in the next core's destination
    assert not isa._writable_over(dst, torch.as_strided(bank, (4, 2, 8), (1024, 16, 1), 4))
    # one core's tile (a leading axis of one member, as a group of one binds)
    one = torch.as_strided(bank, (1, 2, 8), (0, 16, 1), 0)
    assert isa._writable_over(one, torch.as_strided(bank, (1, 2, 8), (0, 16, 1), 24))
    assert isa._writable_over(torch.as_strided(bank, (1, 2, 8), (0, 16, 1), 24), one)
    assert not isa._writable_over(one, torch.as_strided(bank, (1, 2, 8), (0, 16, 1), 16))
    assert not isa._writable_over(torch.as_strided(bank, (1, 2, 8), (0, 16, 1), 16), one)


def _threads() -> tuple[int, int]:
    """This thread's (torch's = OpenMP's, MKL's) intra-op thread counts."""
    import re

    mkl = re.search(r"mkl_get_max_threads\(\) : (\d+)", torch.__config__.parallel_info())
    return torch.get_num_threads(), int(mkl.group(1)) if mkl else torch.get_num_threads()


def test_a_program_of_small_tiles_runs_on_one_intra_op_thread_and_the_caller_keeps_its_count(monkeypatch):
    # Each simulated instruction is one small torch op: an OpenMP team per op (and one per
    # thread that runs programs) costs more than the op (spyre_runtime/device/programs.py).
    import threading

    from spyre_runtime.device import programs

    program = vector_add(1000)
    inputs = _inputs(program)
    seen = []
    real = programs.ProgramExecutor._run
    monkeypatch.setattr(programs.ProgramExecutor, "_run",
                        lambda self, artifact: (seen.append(_threads()), real(self, artifact)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = run_program(program, **inputs)
        torch.spyre.synchronize()
        assert seen[-1] == (1, 1) and _threads() == (2, 2)
        assert torch.equal(out["out"], inputs["x"] + inputs["y"])
        # a thread started afterwards has the process default, not the simulator's one
        later = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert later == [2]
        # programs of large tiles keep the caller's count: they gain from the threads
        monkeypatch.setattr(programs, "ONE_THREAD_STEP_BYTES", 0)
        run_program(program, **inputs)
        assert seen[-1] == (2, 2)
    finally:
        torch.set_num_threads(before)
    from spyre_runtime import _C
    with pytest.raises(RuntimeError, match="expected omp > 0 and mkl >= 0, got 0 and 1"):
        _C.set_intraop_threads(0, 1)


def test_a_binding_is_bound_once_whichever_correction_area_its_launch_patched():
    # Launches alternate between a plan's two correction areas; the buffers a run is bound to
    # are the same for both, so a loop on the same tensors binds once (per scratchpad bank).
    a, b = torch.randn(64, 64, generator=GEN), torch.randn(64, 64, generator=GEN)
    fn = lambda a, b: a * b + 1  # noqa: E731
    _, (plan,) = _plans_after(fn, a.to("spyre"), b.to("spyre"))
    bound = plan.executor.executable._state.bound
    before = set(bound)
    args = [a.to("spyre"), b.to("spyre"), torch.empty(64, 64, device="spyre")]
    for _ in range(6):
        launch_jobplan(plan, args)
    torch.spyre.synchronize()
    assert torch.equal(args[2].cpu(), a * b + 1)
    new = set(bound) - before
    assert new and len({key[:-1] for key in new}) == 1, new  # (a key's last item: the bank)


def test_a_batched_program_runs_on_one_intra_op_thread():
    # (the batched reductions' bits are each core's only on one thread: isa.Reduce.bind)
    from spyre_runtime.device.programs import ONE_THREAD_STEP_BYTES
    from spyre_runtime.program.schedule import BATCH_STEP_BYTES

    assert BATCH_STEP_BYTES <= ONE_THREAD_STEP_BYTES
