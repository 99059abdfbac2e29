"""``python -m spyre_inductor.eager.coverage``: the OpInfo coverage summary of the eager path.

Grades every claimed op x dtype (spyre_inductor/testing/eager_opinfo.py) the way
tests/eager/test_opinfo.py does, prints one row per op (``ok``: every run in spyre programs
and equal to the CPU; ``cpu``: correct but some run needed the CPU fallback; ``FAIL``: a
mismatch or an error; ``x``: in the XFAIL list and still failing as listed, ``XPASS``: in the list but
passing now; ``-``: not claimed), then the totals: op x dtype pairs passing, and how many runs
(samples, in-place and out= forms) ran in spyre programs against through the CPU fallback.

Options: ``--samples N`` (sample inputs per op x dtype; default the test suite's slow tier),
``--dtypes float32,int64``, ``--ops add,mm`` (OpInfo names).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch


def main(argv=None) -> int:
    from spyre_inductor.testing import eager_opinfo as E

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=E.SLOW_SAMPLES)
    parser.add_argument("--dtypes", default=",".join(str(d).removeprefix("torch.") for d in E.ALL))
    parser.add_argument("--ops", default="")
    args = parser.parse_args(argv)
    try:
        dtypes = tuple(getattr(torch, d.strip()) for d in args.dtypes.split(",") if d.strip())
    except AttributeError as e:
        parser.error(f"unknown dtype in --dtypes: {e}")
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    opinfos = E.opinfos()
    wanted = [n for n in args.ops.split(",") if n] or sorted(opinfos)
    unknown = [n for n in wanted if n not in opinfos]
    if unknown:
        parser.error(f"not claimed OpInfo names: {unknown}")
    names = {d: str(d).removeprefix("torch.") for d in dtypes}
    width = max(len(n) for n in wanted)
    print(f"{'op':{width}}  " + "  ".join(f"{names[d]:>8}" for d in dtypes))
    pairs = passing = xfails = spyre_runs = cpu_runs = 0
    failures = []
    for name in wanted:
        op = opinfos[name]
        claimed = E.dtypes_of(op, name)
        cells = []
        for dtype in dtypes:
            if dtype not in claimed:
                cells.append("-")
                continue
            outcome = E.check(op, dtype, args.samples)
            pairs += 1
            spyre_runs += outcome.spyre
            cpu_runs += outcome.cpu
            xfail = E.expected_failure(name, dtype, args.samples)
            if outcome.passed:
                passing += 1
                cells.append("XPASS" if xfail is not None else "ok")
            elif xfail is not None and xfail.fails_as_listed(outcome):
                xfails += 1
                cells.append("x")
            else:
                cells.append("FAIL" if outcome.failures else "cpu")
                failures.append(f"{name} {names[dtype]}: " + "; ".join(outcome.failures or ["CPU fallback"]))
        print(f"{name:{width}}  " + "  ".join(f"{c:>8}" for c in cells), flush=True)
    runs = spyre_runs + cpu_runs
    print()
    print(f"op x dtype pairs passing (every run in spyre programs, equal to the CPU): {passing}/{pairs}"
          f" ({len(wanted)} ops; {xfails} expected failures in eager_opinfo.XFAIL)")
    print(f"runs (samples, in-place, out=; up to {args.samples} samples each): {runs}: {spyre_runs} in spyre "
          f"programs, {cpu_runs} through the CPU fallback")
    stats = torch.spyre.eager_cache_stats()
    print(f"eager cache: {stats.compiles} compiles ({stats.compile_seconds:.1f} s), {stats.cpu_routes} CPU "
          f"routes, {stats.hits} hits, {stats.evictions} evictions; {time.perf_counter() - start:.0f} s in all")
    for line in failures:
        print("  " + line[:400])
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
