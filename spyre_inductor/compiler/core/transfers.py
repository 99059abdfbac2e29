"""Device transfers as several in flight: what a family's own codegen moves big operand tiles with.

The bus serves a core by the transfers it has in flight (the one-core figures in
spyre_runtime/hardware.py), so a big tile moved as one transfer leaves most of it idle: the
matmul, attention and grouped-matmul programs move their operand tiles in pieces of about
``PIECE_BYTES``.
"""

from __future__ import annotations

from spyre_runtime.program.isa import Load

PIECE_BYTES = 32 * 1024  # an operand tile moves as transfers of about this size


def rows_in_pieces(ls, sp: int, symbol: str, dev: int, rows: int, row_bytes: int, dev_stride: int,
                   sp_stride: int, piece_bytes: int = PIECE_BYTES) -> None:
    """Load `rows` rows as several transfers: a core keeps more of them in flight, and the bus
    serves a core by the transfers it has in flight."""
    per = max(1, piece_bytes // max(sp_stride, 1))
    for r0 in range(0, rows, per):
        n = min(per, rows - r0)
        ls.emit(Load(ls.sp(sp + r0 * sp_stride), ls.dev(symbol, dev + r0 * dev_stride), n, row_bytes,
                     dev_stride if n > 1 else 0, sp_stride))


__all__ = ["PIECE_BYTES", "rows_in_pieces"]
