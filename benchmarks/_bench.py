"""Shared by the benchmarks: timing a call, printing a table."""

import statistics
import time


def per_call_us(fn, repeats: int = 2000, warmup: int = 50) -> float:
    """Host microseconds per call of `fn`: the median of 5 timed loops."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        runs.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(runs)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


TRAFFIC_HEADER = ["bytes moved", "minimum", "bytes/min", "refetch"]


def traffic_columns(reports, read_once: int | None = None, written_once: int | None = None) -> list:
    """The TRAFFIC_HEADER cells of one table row: the bytes the reports' programs moved, their minimum
    (what their kernels need at least: each input element read once, each output element written
    once), bytes moved over it, and the refetch (bytes read over the minimum read bytes).

    The minimum is the reports' own (Program.minimum_bytes, from the compiler) when every report
    has one; otherwise the caller's `read_once` + `written_once` (e.g. the nbytes of the function's
    inputs and outputs), marked "*"; "-" when neither is known.
    """
    moved = sum(r.bytes_moved for r in reports)
    read = sum(r.bytes_read for r in reports)
    if reports and all(r.minimum_bytes is not None for r in reports):
        minimum, mark = sum(r.minimum_bytes for r in reports), ""
        separated = all(r.minimum_read_bytes is not None for r in reports)
        minimum_read = sum(r.minimum_read_bytes for r in reports) if separated else None
    elif read_once is not None:
        minimum, mark, minimum_read = read_once + (written_once or 0), "*", read_once
    else:
        return [moved, "-", "-", "-"]
    over = _ratio(moved, minimum)
    refetch = _ratio(read, minimum_read) if minimum_read is not None else over
    return [moved, f"{minimum}{mark}", over, refetch]


def _ratio(num: int, den: int) -> float:
    if den:
        return num / den
    return 1.0 if num == 0 else float("inf")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
