"""The functional simulator on hand-written programs: host wall time vs torch on the CPU.

Two programs of spyre_authoring/handwritten.py at full size:

* tiled_matmul 1024 x 1024 x 1024 fp16 on 32 cores (rows of `a` split over
  the cores, so every core streams all of `b`);
* row_softmax 4096 x 4096 fp16 on 32 cores.

Columns: `run_program` is a whole launch (inputs already on the spyre
device, output allocated by the call): artifact preparation (the program
image is serialized once per program and cached), correction area, and the
Compute on the device's current stream, run on the calling thread. `Machine.run` is the functional
simulator alone, on the calling thread, with plain CPU tensors' bytes as the
device buffers. Both are compared with torch on the CPU doing the same op in
fp32 (`a.float() @ b.float()`, `torch.softmax(x.float(), -1)`); the target
is run_program <= 10x torch.
"""

from __future__ import annotations

import warnings

import torch

from _bench import per_call_us, print_table
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.direct import run_program
from spyre_runtime.program import Machine
from spyre_authoring.handwritten import row_softmax, tiled_matmul

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _ms(fn, repeats: int = 1) -> float:
    return per_call_us(fn, repeats=repeats, warmup=1) / 1e3


class _Case:
    def __init__(self, label, program, inputs, output_like, reference, cpu_op, cpu_repeats):
        self.label, self.program, self.inputs = label, program, inputs
        self.reference, self.cpu_op, self.cpu_repeats = reference, cpu_op, cpu_repeats
        self.out_cpu = torch.empty_like(output_like)
        self.buffers = {**{k: _bytes(v) for k, v in inputs.items()}, "out": _bytes(self.out_cpu)}

    def on_this_thread(self) -> None:
        """torch fp32 and Machine.run, both on the calling thread."""
        self.cpu = _ms(self.cpu_op, repeats=self.cpu_repeats)
        machine = Machine(self.program, self.buffers, HARDWARE.scratchpad_bytes)
        machine.run()
        self.executed = machine.executed
        self.sim = _ms(lambda: Machine(self.program, self.buffers, HARDWARE.scratchpad_bytes).run())

    def launched(self) -> None:
        """run_program: the Compute runs on the device queue's worker thread."""
        spyre_inputs = {k: v.to("spyre") for k, v in self.inputs.items()}
        out = run_program(self.program, **spyre_inputs)["out"].cpu()
        assert torch.equal(out, self.out_cpu), "Machine.run and run_program disagree"
        self.err = (out.float() - self.reference.float()).abs().max().item()
        self.launch = _ms(lambda: run_program(self.program, **spyre_inputs))

    def row(self) -> list:
        static = sum(len(instrs) for cp in self.program.cores for _, instrs in cp.units)
        return [self.label, static, self.executed, self.err, self.launch, self.sim, self.cpu,
                self.launch / self.cpu, self.sim / self.cpu]


def main() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 1024, generator=g).half()
    b = torch.randn(1024, 1024, generator=g).half()
    af, bf = a.float(), b.float()
    x = torch.randn(4096, 4096, generator=g).half()
    xf = x.float()
    mm = tiled_matmul(1024, 1024, 1024, "fp16", cores=32)
    sm = row_softmax(4096, 4096, "fp16", cores=32)
    cases = [
        _Case("matmul 1024^3 fp16, 32 cores", mm, {"a": a, "b": b}, torch.empty(1024, 1024, dtype=torch.half),
              (af @ bf).half(), lambda: af @ bf, cpu_repeats=5),
        _Case("softmax 4096x4096 fp16, 32 cores", sm, {"x": x}, x,
              torch.softmax(xf, -1).half(), lambda: torch.softmax(xf, -1), cpu_repeats=2),
    ]
    # Everything on this thread first: once torch has run ops on a second thread (the device
    # queue's worker), torch ops on this one get slower on a small machine (two OpenMP pools).
    for case in cases:
        case.on_this_thread()
    for case in cases:
        case.launched()
    rows = [case.row() for case in cases]
    print_table(
        "simulator vs torch CPU fp32 (ms, median of 5; run_program = full launch through the device queue, "
        "Machine.run = simulator alone over CPU tensor bytes)",
        ["program", "instrs", "executed", "max |err|", "run_program", "Machine.run",
         "torch fp32", "run_program/torch", "Machine/torch"],
        rows,
    )
    print(f"  tiles: matmul {mm.notes.split('; ')[1]}; softmax {sm.notes}; torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
