"""Dataflow programs for Spyre: the format, its validator and the functional simulator.

Running a program on spyre tensors is the launch layer's job (spyre_runtime.direct.run_program
for a hand-written program, prepare.prepare_kernel / launch.launch_jobplan for compiled ones).
Programs written by hand (reference and calibration programs) are program authoring,
not part of the simulator: they live in spyre_authoring.
"""

from . import isa
from .execute import Machine
from .isa import (
    Binary, Copy, EndLoop, Fence, Fill, Load, Loop, MatMul, Pop, Push, Reduce, Scan, Select, Send, Store, Transpose,
    Unary,
)
from .operands import STICK, Addr, DevAddr, Tile
from .program import CoreProgram, Program, ProgramFormatError, Queue, Symbol
from .run import Artifact, ProgramExecutable
from .validate import ProgramError, validate

__all__ = [
    "Addr", "Artifact", "Binary", "Copy", "CoreProgram", "DevAddr", "EndLoop", "Fill", "Load", "Loop",
    "Machine", "MatMul", "Pop", "Program", "ProgramError", "ProgramExecutable", "ProgramFormatError",
    "Fence", "Push", "Queue", "Reduce", "STICK", "Scan", "Select", "Send", "Store", "Symbol", "Tile", "Transpose",
    "Unary", "isa",
    "validate",
]
