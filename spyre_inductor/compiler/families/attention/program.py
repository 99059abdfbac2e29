"""An attention kernel's program: each core's units emitted by the codegen of its plan, the
unshared one (codegen.py) or, when the cores of one kv head share its K/V chunks, the ring
group's (ring.py, built on the unshared one's pieces)."""

from __future__ import annotations

from spyre_runtime.program.emitter import assemble
from spyre_runtime.program.program import Program, Symbol

from ...core.allocate import Placement
from ...core.tiles import TileKernel
from .codegen import _Core
from .plan import AttentionShape, AttentionTiling, CoreWork
from .ring import RingCore, roles


def build_attention_program(name: str, symbols: tuple[Symbol, ...], shape: AttentionShape, tk: TileKernel,
                            tiling: AttentionTiling, placement: Placement, work: tuple[CoreWork, ...],
                            notes: str = "") -> Program:
    """The program of `work`; the tiles `tk` (planner.tile_kernel) declares are read in its dtypes."""
    cores, queues = {}, []
    if tiling.share > 1:  # K/V chunks shared over the ring
        role = roles(work, tiling.share)
        makers = {w.core: (lambda w=w: RingCore(shape, tk, tiling, placement, w, role[w.core])) for w in work}
    else:
        makers = {w.core: (lambda w=w: _Core(shape, tk, tiling, placement, w)) for w in work}
    for w in work:
        cores[w.core], qs = makers[w.core]().emit()
        queues += qs
    return assemble(name, symbols, queues, cores, notes, check=False)


__all__ = ["build_attention_program"]
