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

from ..queue.operations import Executor

if TYPE_CHECKING:
    from ..program.run import Artifact, ProgramExecutable


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
