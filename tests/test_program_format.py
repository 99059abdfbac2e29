"""The program format: validator rules, serialized form, placeholders, program distribution."""

import dataclasses
import json
import time

import pytest
import torch

from spyre_inductor.device import queues
from spyre_runtime.program import (
    Addr, Binary, CoreProgram, DevAddr, EndLoop, Load, Loop, Pop, Program, ProgramError, ProgramExecutable, ProgramFormatError, Push, Queue, Send, Store, Symbol, Tile, Unary, validate,
)
from spyre_runtime.direct import prepare_artifact, run_program, write_correction_area
from spyre_runtime.device import ProgramExecutor
from spyre_runtime.queue import Barrier, Compute, Executor, HostAddress, Transfer, TransferKind

N = 1000  # fp32 elements: 4000 bytes, not a whole number of 128-byte sticks
NB = N * 4
ROW = 4096  # scratchpad bytes per row (whole sticks)


def scale_program(n=N, *, extra_ls=(), extra_sfp=(), queues_=None, ls=None, sfp=None, symbols=None):
    """out = 2 * x on one core: ls loads, sfp doubles, ls stores."""
    nb = n * 4
    tile_in = Tile(Addr(0), "fp32", 1, n, ROW)
    tile_out = Tile(Addr(ROW), "fp32", 1, n, ROW)
    ls = ls if ls is not None else (
        Load(Addr(0), DevAddr("x"), 1, nb, 0, ROW), Push("in"), Pop("out"),
        Store(DevAddr("y"), Addr(ROW), 1, nb, 0, ROW), *extra_ls)
    sfp = sfp if sfp is not None else (Pop("in"), Binary("add", tile_out, tile_in, tile_in), Push("out"), *extra_sfp)
    return Program(
        "scale",
        symbols=symbols or (Symbol("x", "input", "fp32", (n,), (1,)), Symbol("y", "output", "fp32", (n,), (1,))),
        queues=queues_ if queues_ is not None else (Queue("in", (0, "ls"), (0, "sfp")), Queue("out", (0, "sfp"), (0, "ls"))),
        cores=(CoreProgram(0, (("ls", ls), ("sfp", sfp))),),
    )


def test_a_valid_program_runs_and_matches_cpu():
    x = torch.randn(N)
    y = run_program(scale_program(), x=x)["y"]
    assert y.device.type == "spyre" and torch.equal(y.cpu(), x * 2)


def test_serialized_form_round_trips_and_has_its_header():
    p = scale_program()
    doc = json.loads(p.to_json())
    header = doc["header"]
    assert header["version"] == 1 and len(header["checksum"]) == 64
    assert [s["name"] for s in header["symbols"]] == ["x", "y"]
    assert header["correction_area"]["layout"][1] == {"slot": 1, "symbol": "y", "kind": "address", "offset": 16}
    assert header["scratchpad_high_water"] == {"0": 2 * ROW}
    assert Program.from_json(p.to_json()) == p


def test_a_program_saved_by_this_process_loads_back_as_itself(tmp_path):
    """The compiler saves an artifact's program and the wrapper loads it moments later: the same
    bytes come back as the very program (validated once, encoded once), not decoded again, once.
    Other bytes are decoded as ever: an altered file still fails its checksum."""
    p = scale_program()
    path = p.save(tmp_path / "program.json")
    assert Program.load(path) is p
    again = Program.load(path)  # handed over once: loaded again, it is decoded
    assert again == p and again is not p
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc, indent=1))  # the same program, other bytes: decoded, equal
    again = Program.load(path)
    assert again == p and again is not p
    doc["body"]["cores"][0]["units"]["sfp"][1]["op"] = "sub"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProgramFormatError, match="checksum mismatch"):
        Program.load(path)


def test_listing_shows_every_core_and_unit():
    text = scale_program().listing()
    assert "core 0" in text and "[ls]" in text and "[sfp]" in text
    assert "load     dst=sp[0] src=x[0]" in text
    assert "slot 1 (+16): address of y" in text


def test_bad_checksum_is_rejected():
    doc = json.loads(scale_program().to_json())
    doc["body"]["cores"][0]["units"]["sfp"][1]["op"] = "sub"
    with pytest.raises(ProgramFormatError, match="checksum mismatch"):
        Program.from_json(json.dumps(doc))


def test_other_format_version_is_rejected():
    doc = json.loads(scale_program().to_json())
    doc["header"]["version"] = 99
    with pytest.raises(ProgramFormatError, match="format version 99"):
        Program.from_json(json.dumps(doc))


def rejects(program, pattern):
    with pytest.raises(ProgramError, match=pattern):
        validate(program)


def test_rejects_scratchpad_access_outside_the_usable_scratchpad():
    far = Tile(Addr(2 * 1024 * 1024 - 128), "fp32", 1, N, ROW)
    sfp = (Pop("in"), Binary("add", far, far, far), Push("out"))
    rejects(scale_program(sfp=sfp), r"core 0 unit sfp instruction 1 \(binary\): tile touches scratchpad bytes")


def test_rejects_a_loop_that_walks_out_of_the_scratchpad():
    ls = (Loop(1000), Load(Addr(0, (ROW,)), DevAddr("x"), 1, 128, 0, ROW), EndLoop(), Push("in"), Pop("out"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    rejects(scale_program(ls=ls), r"core 0 unit ls instruction 1 \(load\): transfer touches scratchpad bytes")


def test_rejects_device_access_outside_a_buffer():
    ls = (Load(Addr(0), DevAddr("x", 128), 1, NB, 0, ROW), Push("in"), Pop("out"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    rejects(scale_program(ls=ls), r"instruction 0 \(load\): touches bytes \[128, 4128\) of 'x', which has 4000 bytes")


def test_rejects_device_rows_walked_backwards():
    # rows 1 and 0 of x at stride -128: the planner must not emit it, and validation says so
    ls = (Load(Addr(0), DevAddr("x", 128), 2, 128, -128, ROW), Push("in"), Pop("out"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    rejects(scale_program(ls=ls), r"instruction 0 \(load\): 2 rows of 128 bytes at stride -128 of 'x'")


def test_rejects_movement_that_is_not_in_aligned_whole_sticks():
    ls = (Load(Addr(64), DevAddr("x"), 1, NB, 0, ROW), Push("in"), Pop("out"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    rejects(scale_program(ls=ls), r"instruction 0 \(load\): scratchpad address 64 .* not on a 128-byte stick")
    ls = (Load(Addr(0), DevAddr("x"), 2, 128, 128, 200), Push("in"), Pop("out"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    rejects(scale_program(ls=ls), r"scratchpad row stride 200 is not a whole number of sticks")


def test_rejects_a_send_that_is_not_whole_sticks_or_not_to_a_neighbour():
    base = scale_program()
    ls = base.cores[0].unit("ls") + (Send(1, Addr(0), Addr(ROW), 100),)
    rejects(scale_program(ls=ls), r"instruction 4 \(send\): moves 100 bytes, not a whole number")
    ls = base.cores[0].unit("ls") + (Send(5, Addr(0), Addr(ROW), 128),)
    rejects(scale_program(ls=ls), r"core 5 is not a ring neighbour of core 0")


def test_rejects_an_instruction_on_the_wrong_unit():
    sfp = (Pop("in"), Load(Addr(0), DevAddr("x"), 1, NB, 0, ROW), Push("out"))
    rejects(scale_program(sfp=sfp), r"unit sfp instruction 1 \(load\): runs on ls, not on sfp")


def test_rejects_queues_whose_pushes_and_pops_cannot_match():
    sfp = (Pop("in"), Push("out"), Push("out"))
    rejects(scale_program(sfp=sfp), r"queue 'out' gets 2 pushes \(core 0 unit sfp\) but 1 pops \(core 0 unit ls\)")


def test_rejects_queues_that_deadlock():
    # Both units wait for the other first: counts match, order cannot.
    ls = (Pop("out"), Load(Addr(0), DevAddr("x"), 1, NB, 0, ROW), Push("in"),
          Store(DevAddr("y"), Addr(ROW), 1, NB, 0, ROW))
    sfp = (Pop("in"), Push("out"))
    rejects(scale_program(ls=ls, sfp=sfp), r"queues deadlock: core 0 unit ls at pop 'out'; core 0 unit sfp at pop 'in'")


def test_rejects_a_queue_used_by_the_wrong_unit_or_unknown():
    sfp = (Pop("in"), Push("in"), Push("out"))
    rejects(scale_program(sfp=sfp), r"queue 'in' is pushed by core 0 unit ls")
    sfp = (Pop("nope"),)
    rejects(scale_program(sfp=sfp), r"unknown queue 'nope'")


def test_rejects_unbalanced_loops_and_missing_cores():
    sfp = (Loop(2), Pop("in"), Push("out"))
    rejects(scale_program(sfp=sfp), r"unit sfp: 1 loop\(s\) not closed")
    p = dataclasses.replace(scale_program(), cores=(CoreProgram(40, ()),))
    rejects(p, r"core 40 does not exist")


def test_an_unresolved_placeholder_is_refused_at_run_time():
    p = scale_program()
    alloc, artifact = prepare_artifact(p, 0)  # correction area never written
    with pytest.raises(ProgramError, match="placeholder 'x' is unresolved"):
        ProgramExecutable(p).run(artifact)


def test_the_same_program_runs_with_other_placeholder_bindings():
    p = scale_program()
    a, b = torch.randn(N), torch.randn(N)
    ya, yb = run_program(p, x=a)["y"], run_program(p, x=b)["y"]
    assert torch.equal(ya.cpu(), a * 2) and torch.equal(yb.cpu(), b * 2)


def test_arithmetic_rounds_to_nearest_even_on_store():
    # fp32 -> fp16 "copy" is a cast: ties go to the even neighbour, as torch's.
    x = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 1e-8] + [0.0] * 28)
    p = Program(
        "cast", symbols=(Symbol("x", "input", "fp32", (32,), (1,)), Symbol("y", "output", "fp16", (32,), (1,))),
        queues=(Queue("in", (0, "ls"), (0, "sfp")), Queue("out", (0, "sfp"), (0, "ls"))),
        cores=(CoreProgram(0, (
            ("ls", (Load(Addr(0), DevAddr("x"), 1, 128, 0, 128), Push("in"), Pop("out"),
                    Store(DevAddr("y"), Addr(128), 1, 64, 0, 128))),
            ("sfp", (Pop("in"), Unary("copy", Tile(Addr(128), "fp16", 1, 32, 128), Tile(Addr(0), "fp32", 1, 32, 128)),
                     Push("out"))),
        )),),
    )
    assert torch.equal(run_program(p, x=x)["y"].cpu(), x.half())


class Hold(Executor):
    """A compute that keeps the compute pipeline busy while the test enqueues."""

    def __init__(self, seconds):
        self.seconds = seconds

    def run(self, bindings):
        time.sleep(self.seconds)


def launch(program, artifact, alloc, new_out, x, barrier):
    """A second launch that re-patches the correction area, as the launch layer will."""
    q = queues.queue(0)
    stream = torch.spyre.Stream()
    staging = torch.zeros(program.correction_bytes, dtype=torch.uint8).pin_memory()
    slots = staging.view(torch.int64)
    for i, t in enumerate((x, new_out)):
        piece = queues.ranges(t)[0]
        slots[2 * i], slots[2 * i + 1] = piece.region, piece.offset
    q.enqueue(stream.stream_id, Compute(Hold(0.2), None, name="earlier kernel"))
    q.enqueue(stream.stream_id, Transfer(TransferKind.H2D, HostAddress(staging.data_ptr()),
                                          queues.address(alloc), program.correction_bytes, keepalive=staging))
    if barrier:
        q.enqueue(stream.stream_id, Barrier())
    exe = ProgramExecutor(ProgramExecutable(program))  # its prefetch is program distribution's fetch
    q.enqueue(stream.stream_id, Compute(exe, artifact, queues.footprint(reads=(x, alloc), writes=(new_out,))))
    stream.synchronize()


@pytest.mark.parametrize("barrier", [False, True])
def test_program_distribution_fetches_ahead_unless_a_barrier_holds_it(barrier):
    p = scale_program()
    x = torch.randn(N).to("spyre")
    first_out = torch.zeros(N, device="spyre")
    second_out = torch.zeros(N, device="spyre")
    alloc, artifact = prepare_artifact(p, 0)
    write_correction_area(p, alloc, {"x": x, "y": first_out})  # the first launch's patch
    launch(p, artifact, alloc, second_out, x, barrier)
    if barrier:
        # The fetch waited for the patch: the result lands where it should.
        assert torch.equal(second_out.cpu(), x.cpu() * 2)
        assert torch.equal(first_out.cpu(), torch.zeros(N))
    else:
        # The fetch ran ahead of the patch: stale addresses, the old output is written.
        assert torch.equal(first_out.cpu(), x.cpu() * 2)
        assert torch.equal(second_out.cpu(), torch.zeros(N))


def test_a_runtime_deadlock_raises_naming_the_units():
    # Beyond the validator's dry-run budget the machine's own check stands.
    from spyre_runtime.program import Machine

    p = scale_program(ls=(Pop("out"), Push("in")), sfp=(Pop("in"), Push("out")))
    buffers = {"x": torch.zeros(NB, dtype=torch.uint8), "y": torch.zeros(NB, dtype=torch.uint8)}
    with pytest.raises(ProgramError, match="deadlocked: core 0 unit ls instruction 0 \\(pop out\\)"):
        Machine(p, buffers, 2 << 20).run()


def one_core_binary(op, in_dtype, out_dtype, n=64):
    """out = a (op) b elementwise, one core, dtypes as given."""
    from spyre_runtime.program.operands import ITEMSIZE

    ib, ob = n * ITEMSIZE[in_dtype], n * ITEMSIZE[out_dtype]
    a, b, o = (Tile(Addr(k * ROW), dt, 1, n, ROW) for k, dt in enumerate((in_dtype, in_dtype, out_dtype)))
    return Program(
        f"{op}-{in_dtype}", symbols=(Symbol("a", "input", in_dtype, (n,), (1,)), Symbol("b", "input", in_dtype, (n,), (1,)),
                                     Symbol("y", "output", out_dtype, (n,), (1,))),
        queues=(Queue("in", (0, "ls"), (0, "sfp")), Queue("out", (0, "sfp"), (0, "ls"))),
        cores=(CoreProgram(0, (
            ("ls", (Load(Addr(0), DevAddr("a"), 1, ib, 0, ROW), Load(Addr(ROW), DevAddr("b"), 1, ib, 0, ROW),
                    Push("in"), Pop("out"), Store(DevAddr("y"), Addr(2 * ROW), 1, ob, 0, ROW))),
            ("sfp", (Pop("in"), Binary(op, o, a, b), Push("out"))),
        )),),
    )


def test_integer_arithmetic_is_int32_and_wraps_on_an_int8_store():
    a = torch.tensor([100, -100, 127, 5] * 16, dtype=torch.int8)
    b = torch.tensor([100, -100, 1, 5] * 16, dtype=torch.int8)
    y = run_program(one_core_binary("add", "int8", "int8"), a=a, b=b)["y"].cpu()
    assert torch.equal(y, (a.int() + b.int()).to(torch.int8))  # 200 -> -56, -200 -> 56, 128 -> -128
    y32 = run_program(one_core_binary("mul", "int32", "int32"),
                      a=torch.arange(64, dtype=torch.int32), b=torch.full((64,), -3, dtype=torch.int32))["y"]
    assert torch.equal(y32.cpu(), torch.arange(64, dtype=torch.int32) * -3)


def test_compares_produce_bool_and_bf16_computes_in_fp32():
    a, b = torch.randn(64), torch.randn(64)
    lt = run_program(one_core_binary("lt", "fp32", "bool"), a=a, b=b)["y"].cpu()
    assert lt.dtype == torch.bool and torch.equal(lt, a < b)
    a16, b16 = a.bfloat16(), b.bfloat16()
    y = run_program(one_core_binary("mul", "bf16", "bf16"), a=a16, b=b16)["y"].cpu()
    # One rounding of the fp32 product, as stated: exactly torch's fp32 math then a bf16 store.
    assert torch.equal(y, (a16.float() * b16.float()).bfloat16())


def test_rejects_a_result_that_partly_overlaps_its_operand():
    src = Tile(Addr(0), "fp32", 1, N, ROW)
    shifted = Tile(Addr(128), "fp32", 1, N, ROW)
    sfp = (Pop("in"), Unary("copy", shifted, src), Push("out"))
    rejects(scale_program(sfp=sfp), r"instruction 1 \(unary\): destination bytes .* partly overlap")
    in_place = (Pop("in"), Unary("neg", src, src), Push("out"))  # the same tile: allowed
    validate(scale_program(sfp=in_place))


def test_temporaries_live_at_fixed_offsets_in_the_artifacts_own_allocation():
    """y = 2x through a device temporary: store 2x to `t`, load it back, store it to y."""
    t_off = 128  # after the 2-slot correction area (32 B, rounded to a stick)
    sym = (Symbol("x", "input", "fp32", (N,), (1,)), Symbol("y", "output", "fp32", (N,), (1,)),
           Symbol("t", "temp", "fp32", (N,), (1,), offset=t_off))
    ls = (Load(Addr(0), DevAddr("x"), 1, NB, 0, ROW), Push("in"), Pop("out"),
          Store(DevAddr("t"), Addr(ROW), 1, NB, 0, ROW),
          Load(Addr(2 * ROW), DevAddr("t"), 1, NB, 0, ROW),
          Store(DevAddr("y"), Addr(2 * ROW), 1, NB, 0, ROW))
    p = scale_program(ls=ls, symbols=sym)
    assert p.allocation_bytes == t_off + 4096  # correction area, then the temporary (whole sticks)
    x = torch.randn(N)
    assert torch.equal(run_program(p, x=x)["y"].cpu(), x * 2)
    bad = scale_program(ls=ls, symbols=sym[:2] + (dataclasses.replace(sym[2], offset=0),))
    rejects(bad, r"temporary 't' needs a stick-aligned offset after the correction area")


def test_rejects_unknown_operations_broadcasts_and_queue_depths():
    t = Tile(Addr(0), "fp32", 1, N, ROW)
    rejects(scale_program(sfp=(Pop("in"), Unary("cube", t, t), Push("out"))),
            r"instruction 1 \(unary\): unknown operation 'cube'; unary knows abs, bitwise_not, ceil")
    odd = Tile(Addr(0), "fp32", 1, N, ROW, broadcast="diagonal")
    rejects(scale_program(sfp=(Pop("in"), Unary("neg", odd, odd), Push("out"))),
            r"tile broadcast 'diagonal' is not one of none, rows, cols, scalar")
    shallow = (Queue("in", (0, "ls"), (0, "sfp"), 0), Queue("out", (0, "sfp"), (0, "ls")))
    rejects(scale_program(queues_=shallow), r"queue 'in' has depth 0; it must be at least 1")
