"""The simulated device's own cost per launch (issue 18): host time of one ProgramExecutable.run.

A compiled 64 x 64 fp32 add (16 cores, each: two loads, an add, a store) is
run again and again with the same bindings, as a loop over the same tensors
launches it: the program's schedule, its bound views and its timing report
are all cached, so this is what a warm launch costs the simulator. For the
general interpreter on the same program and bytes (with its timing replay,
as every launch paid before issue 18) see the second row. Target: <= ~40 us.
"""

from __future__ import annotations

import gc
import warnings

import torch

from _bench import per_call_us, print_table

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def main() -> None:
    import spyre_inductor  # noqa: F401
    from spyre_runtime.prepare import JobPlan
    from spyre_runtime.program.execute import Machine
    from spyre_runtime.program.timing import Timing

    a, b = torch.randn(64, 64).to("spyre"), torch.randn(64, 64).to("spyre")
    out = torch.compile(lambda a, b: a + b)(a, b)
    torch.spyre.synchronize()
    assert torch.equal(out.cpu(), a.cpu() + b.cpu())
    plan = next(o for o in gc.get_objects() if type(o) is JobPlan and "add" in o.name)
    ex = plan.executor.executable
    slots = ex._read_slots(plan.artifact)
    buffers = ex._buffers(plan.artifact, slots)

    def general():
        timing = Timing(ex.program, ex.hardware, phases=ex.phases(plan.artifact, slots))
        Machine(ex.program, buffers, ex.hardware.scratchpad_bytes, timing).run()
        timing.finish()

    fast = per_call_us(lambda: ex.run(plan.artifact))
    slow = per_call_us(general, repeats=100, warmup=5)
    print_table(f"one launch of {plan.name} (host us, median of 5 loops)", ["path", "us"], [
        ["ProgramExecutable.run (warm: same bindings)", fast],
        ["general interpreter + timing replay", slow],
    ])


if __name__ == "__main__":
    main()
