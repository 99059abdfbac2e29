"""A program on the simulated device, as the queue layer runs it: an Executor.

The launch layer puts a ProgramExecutor in each program's Compute; the queue
calls the three Executor methods and knows nothing of programs:

* ``prefetch`` is the program-distribution unit's fetch: the device reads
  a program's instruction buffers and its correction area ahead of
  execution (when the Compute is enqueued, or, behind a Barrier, when it is
  ready). A correction area patched after the fetch is not seen: the program
  runs with the addresses it fetched -- the hazard the launch's Barrier
  exists for, reproduced so that the runtime's guarantee is testable;
* ``run``: the cores execute it (functional simulation and the timing model,
  program.run.ProgramExecutable);
* ``cost_ns``: the timing model's simulated time of that run, its length on
  the compute pipeline's timeline.

The bindings are the program's Artifact (where its allocation lives).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils import _python_dispatch

from .. import _C
from ..queue.operations import Executor

if TYPE_CHECKING:
    from ..program.run import Artifact, ProgramExecutable

# The simulated cores run one torch op after another, from whichever thread runs the program
# (a queue worker, or a caller that synchronizes and runs ready work itself). On small tiles
# more than one intra-op thread only costs: each op wakes an OpenMP team, and the teams of
# several such threads contend for the same cores. A 1 x 256 @ 256 x 64 tile product measured
# 22-90 us that way against 2-4 us on one thread, and the Llama decode step took twice as long
# (benchmarks/launch.py). Programs of large tiles (benchmarks/simulator.py: 300 KB and more per
# step) gain from the threads, and keep the caller's count. The count is the calling thread's
# own (OpenMP's and MKL's) and is set back after the run; the process default
# (torch.set_num_threads) is untouched.
ONE_THREAD_STEP_BYTES = 128 * 1024


class ProgramExecutor(Executor):
    __slots__ = ("executable",)

    def __init__(self, executable: ProgramExecutable):
        self.executable = executable

    @property
    def program(self):
        return self.executable.program

    def prefetch(self, artifact: Artifact) -> None:
        self.executable.fetch(artifact)

    def run(self, artifact: Artifact) -> None:
        if self.executable.mean_step_bytes() > ONE_THREAD_STEP_BYTES:
            self._run(artifact)
            return
        before = None
        try:
            before = _C.set_intraop_threads(1, 1)
            self._run(artifact)
        finally:
            if before is not None:
                _C.set_intraop_threads(*before)

    def _run(self, artifact: Artifact) -> None:
        # Whichever thread runs it (a queue worker, or a thread that synchronizes and runs ready
        # work itself), the simulated cores compute on plain CPU tensors: not under that thread's
        # torch function or dispatch modes (a default device of spyre would turn the scratchpad
        # into device memory and its copies into device copies waiting behind this very run), nor
        # in inference mode (the scratchpad bank outlives the run and is written in place).
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack() or \
                torch.is_inference_mode_enabled():  # (the check is cheap; leaving them is not)
            with torch._C.DisableTorchFunction(), _python_dispatch._disable_current_modes(), \
                    torch.inference_mode(False):
                self.executable.run(artifact)
        else:
            self.executable.run(artifact)

    def cost_ns(self, artifact: Artifact) -> float:
        return self.executable.simulated_ns(artifact)

    def __repr__(self) -> str:
        return f"ProgramExecutor({self.executable.program.name!r})"
