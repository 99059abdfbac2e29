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


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
