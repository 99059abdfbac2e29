"""Device transfers as several in flight: what a family's own codegen moves operand tiles with.

The bus serves a core by the transfers it has in flight (the one-core figures in
spyre_runtime/hardware.py), so a big tile moved as one transfer leaves most of it idle, and a plan
on few cores keeps the bus busy only if each core cuts its moves into pieces: the matmul, conv,
attention and grouped-matmul programs move their tiles through these.
"""

from __future__ import annotations

from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.isa import Load, Store

PIECE_BYTES = 32 * 1024  # an operand tile moves as transfers of about this size


# Transfers in flight at which the bus reaches its ceiling (hardware.py's bus_ceiling: 72% of it
# from 32 on): a plan on few cores keeps that many in flight only if each core moves its tiles in
# pieces (a 16 KiB tile as one transfer on each of 2 cores held the bus at 22%).
BUS_IN_FLIGHT = 32


def min_pieces(cores: int) -> int:
    """Transfers each tile's move is cut into at least, on a plan of `cores` cores."""
    return -(-BUS_IN_FLIGHT // max(1, cores))


def _count(rows: int, sp_stride: int, piece_bytes: int, pieces: int) -> int:
    """Transfers for `rows` rows: at least `pieces` (none under MIN_PIECE_BYTES, beyond which more
    only lengthen the program), at most about `piece_bytes` each."""
    nbytes = rows * max(sp_stride, 1)
    wanted = max(1, min(pieces, nbytes // MIN_PIECE_BYTES))
    return min(rows, max(wanted, -(-nbytes // piece_bytes)))


MIN_PIECE_BYTES = 2 * 1024


def rows_in_pieces(ls, sp: int, symbol: str, dev: int, rows: int, row_bytes: int, dev_stride: int,
                    sp_stride: int, piece_bytes: int = PIECE_BYTES, pieces: int = 1) -> None:
    """Load `rows` rows as several transfers (at least `pieces`, each at most about `piece_bytes`,
    even): a core keeps more of them in flight, and the bus serves a core by the transfers it has
    in flight (the one-core figures in hardware.py)."""
    n_pieces = _count(rows, sp_stride, piece_bytes, pieces)
    for r0, n in split_evenly(rows, max(1, n_pieces)):
        ls.emit(Load(ls.sp(sp + r0 * sp_stride), ls.dev(symbol, dev + r0 * dev_stride), n, row_bytes,
                     dev_stride if n > 1 else 0, sp_stride))


def rows_out_in_pieces(ls, symbol: str, dev: int, sp: int, rows: int, row_bytes: int, dev_stride: int,
                       sp_stride: int, piece_bytes: int = PIECE_BYTES, pieces: int = 1) -> None:
    """Store `rows` rows as several transfers (rows_in_pieces' counterpart)."""
    n_pieces = _count(rows, sp_stride, piece_bytes, pieces)
    for r0, n in split_evenly(rows, max(1, n_pieces)):
        ls.emit(Store(ls.dev(symbol, dev + r0 * dev_stride), ls.sp(sp + r0 * sp_stride), n, row_bytes,
                      dev_stride if n > 1 else 0, sp_stride))


__all__ = ["BUS_IN_FLIGHT", "MIN_PIECE_BYTES", "PIECE_BYTES", "min_pieces", "rows_in_pieces", "rows_out_in_pieces"]
