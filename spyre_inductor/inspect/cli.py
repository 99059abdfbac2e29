"""`spyre-inspect` (or `python -m spyre_inductor.inspect`): the compiled kernels, read and pictured.

    spyre-inspect list [DIR] [--all | --last N]   one row per kernel, newest first
    spyre-inspect show KERNEL [--core N] [--unit ls|pe|sfp]
    spyre-inspect plan KERNEL [--svg FILE]       why the program is what it is
    spyre-inspect diff A B                        what changed between two kernels
    spyre-inspect trace SCRIPT [ARGS] [-o FILE]  run a script, write its Chrome/Perfetto trace
    spyre-inspect report SCRIPT|TRACE [--html F] a per-kernel perf report of a run
    spyre-inspect clean [--all] [--dry-run]       remove artifacts nothing will load again

KERNEL is a kernel's name, a unique prefix of one, or its artifact directory; DIR (or --dir)
defaults to where this process's compiler writes its artifacts (Inductor's cache dir).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from pathlib import Path

from .catalog import KernelNotFound, find_kernel, kernels
from .cost import cost_of
from .svg import chosen, plan_svg
from .table import fmt, table

UNITS = ("ls", "pe", "sfp")


def cmd_list(args) -> int:
    found = kernels(args.dir)
    shown = found if args.all else found[:args.last]
    rows = []
    for k in shown:
        c = cost_of(k.program())
        ops = ", ".join(k.sources) or "-"
        rows.append([k.name, k.family, ops if len(ops) <= 48 else ops[:45] + "...", c.cores, c.simulated_us,
                     c.roofline_us, c.efficiency, c.bound, c.bytes_over_minimum])
    print(table(["kernel", "family", "aten ops", "cores", "simulated us", "roofline us", "efficiency",
                  "bound", "bytes/min"], rows))
    more = len(found) - len(shown)
    print(f"\n{len(shown)} of {len(found)} kernels in {args.dir or 'the artifact cache'}"
          + (f" ({more} older: --all or --last N)" if more else "")
          + "; timed by the timing model at stick-aligned addresses")
    return 0


def listing_part(listing: str, core: int | None, unit: str | None) -> str:
    """The listing's header (symbols, correction slots, queues) and the cores and units asked for."""
    head, _, body = listing.partition("\ncore ")
    if core is None and unit is None:
        return listing
    parts = re.split(r"\n(?=core \d+ )", "core " + body)
    out = [head.rstrip("\n")] if core is None else [head.split("\nqueues:")[0].rstrip("\n")]
    for part in parts:
        n = int(part.split()[1])
        if core is not None and n != core:
            continue
        if unit is None:
            out.append(part.rstrip("\n"))
            continue
        title, *units = re.split(r"\n(?=  \[)", part)
        keep = [u for u in units if u.startswith(f"  [{unit}]")]
        out.append("\n".join([title] + keep).rstrip("\n"))
    if len(out) == 1:
        raise SystemExit(f"spyre-inspect show: the program has no core {core}")
    return "\n\n".join(out)


def cmd_show(args) -> int:
    k = find_kernel(args.kernel, args.dir)
    print(listing_part(k.text("listing.txt"), args.core, args.unit))
    return 0


def cmd_plan(args) -> int:
    k = find_kernel(args.kernel, args.dir)
    print(k.text("summary.txt").rstrip("\n"))
    division = k.plan.get("division") or {}
    candidates = division.get("candidates") or []
    if candidates:
        kept = chosen(division)
        print(f"\ndivision candidates ({len(candidates)}, simulated by the timing model):")
        for i, (label, ns) in enumerate(candidates):
            print(f"  {'*' if i == kept else ' '} {ns:12.1f} ns  {label}")
        if division.get("reason"):
            print(f"  kept: {division['reason']}")
    c = cost_of(k.program())
    print(f"\ncost: {c.simulated_us:.3g} us simulated on {c.cores} core(s), roofline {c.roofline_us:.3g} us, "
          f"efficiency {c.efficiency:.3f}, {c.bound}-bound, bytes over minimum {fmt(c.bytes_over_minimum)}")
    print(f"artifact: {k.path}")
    if args.svg:
        Path(args.svg).write_text(plan_svg(k.name, k.plan))
        print(f"picture: {args.svg}")
    return 0


def cmd_diff(args) -> int:
    a, b = find_kernel(args.a, args.dir), find_kernel(args.b, args.dir)
    print(f"--- {a.name} ({a.family}, {a.path})\n+++ {b.name} ({b.family}, {b.path})")
    ca, cb = cost_of(a.program()), cost_of(b.program())
    print(f"cost: {ca.simulated_us:.3g} -> {cb.simulated_us:.3g} us simulated, efficiency {ca.efficiency:.3f} -> "
          f"{cb.efficiency:.3f}, cores {ca.cores} -> {cb.cores}, {ca.bound} -> {cb.bound}")
    for title, name in (("plan", "summary.txt"), ("program", "listing.txt")):
        lines = list(difflib.unified_diff(a.text(name).splitlines(), b.text(name).splitlines(), a.name, b.name,
                                          n=1, lineterm=""))[2:]
        changed = sum(1 for line in lines if line[:1] in "+-")
        print(f"\n{title}: {'the same' if not changed else f'{changed} line(s) differ'}")
        shown = lines if args.full else lines[:args.lines]
        print("\n".join(shown))
        if len(shown) < len(lines):
            print(f"... {len(lines) - len(shown)} more diff line(s): --full")
    return 0


def cmd_trace(args) -> int:
    from .trace import record, run_script, write

    trace = record(lambda: run_script(args.script, args.args))
    path = write(trace, args.output)
    print(f"trace: {path} ({len(trace['spyreKernels'])} launches, {len(trace['traceEvents'])} events; open it in "
          f"https://ui.perfetto.dev or chrome://tracing)")
    return 0


def _pictures(names, directory) -> dict:
    out = {}
    for name in names:
        try:
            k = find_kernel(name, directory)
        except (KernelNotFound, FileNotFoundError):
            continue
        out[name] = plan_svg(k.name, k.plan)
    return out


def cmd_report(args) -> int:
    from . import report
    from .trace import record, run_script, write

    if args.target.endswith(".json"):
        if args.args:  # (options after a trace file: nothing of it is a script's argument)
            parser().parse_args(["report", *args.args, args.target], namespace=args)
        trace = report.load(args.target)
    else:
        trace = record(lambda: run_script(args.target, args.args))
        if args.trace:
            write(trace, args.trace)
    rows = trace["spyreKernels"]
    kernels, summary = report.lines(rows)
    print(report.text(kernels, summary, top=args.top, steps=args.steps))
    if args.html:
        directory = args.dir or os.environ.get("SPYRE_ARTIFACTS")
        pictures = _pictures([k.name for k in kernels[:5]], directory)
        Path(args.html).write_text(report.html_page(kernels, summary, rows, pictures, f"spyre report: {args.target}"))
        print(f"html: {args.html}")
    return 0


def cmd_clean(args) -> int:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from spyre_inductor.compiler.inductor.version import compiler_version

    from .clean import candidates, remove

    found = candidates(Path(cache_dir()), compiler_version(), args.older_than * 3600, everything=args.all)
    total = sum(r.nbytes for r in found)
    for r in found:
        print(f"{'would remove' if args.dry_run else 'remove'} {r.path} ({r.nbytes / 1e6:.1f} MB): {r.why}")
    freed = total if args.dry_run else remove(found)
    print(f"{len(found)} director{'y' if len(found) == 1 else 'ies'}, {freed / 1e6:.1f} MB "
          f"{'would be ' if args.dry_run else ''}freed")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spyre-inspect", description="Read and picture the programs spyre compiled.")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the compiled kernels, newest first, with their cost")
    ls.add_argument("dir", nargs="?", default=None, help="an artifact directory (default: this compiler's cache)")
    ls.add_argument("--all", action="store_true", help="every kernel, not only the newest")
    ls.add_argument("--last", type=int, default=40, metavar="N", help="the N newest kernels (default 40)")
    show = sub.add_parser("show", help="a kernel's program: per core, per unit")
    show.add_argument("kernel")
    show.add_argument("--core", type=int, default=None)
    show.add_argument("--unit", choices=UNITS, default=None)
    plan = sub.add_parser("plan", help="why a kernel's program is what it is")
    plan.add_argument("kernel")
    plan.add_argument("--svg", metavar="FILE", help="write the scratchpad map and division as an SVG picture")
    diff = sub.add_parser("diff", help="what changed between two kernels' plans and programs")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--full", action="store_true", help="the whole diff")
    diff.add_argument("--lines", type=int, default=60, help="diff lines shown per part (default 60)")
    trace = sub.add_parser("trace", help="run a script and write its trace (Chrome trace / Perfetto JSON)")
    trace.add_argument("-o", "--output", default="spyre_trace.json")
    trace.add_argument("script")
    trace.add_argument("args", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report", help="a per-kernel perf report of a script's run or a trace")
    rep.add_argument("--html", metavar="FILE", help="also as one self-contained HTML page")
    rep.add_argument("--trace", metavar="FILE", help="keep the trace of the run too")
    rep.add_argument("--top", type=int, default=None, help="only the N kernels with the most device time")
    rep.add_argument("--steps", type=int, default=None, help="the run was N steps (of a model): per-step figures")
    rep.add_argument("target", help="a Python script to run (options go before it: what follows is its argv), "
                                    "or a trace written by `spyre-inspect trace`")
    rep.add_argument("args", nargs=argparse.REMAINDER)
    clean = sub.add_parser("clean", help="remove artifacts nothing will load again")
    clean.add_argument("--all", action="store_true", help="also this version's artifacts and Inductor's caches")
    clean.add_argument("--dry-run", action="store_true")
    clean.add_argument("--older-than", type=float, default=1.0, metavar="HOURS",
                       help="per-compile directories older than this (default 1 hour)")
    for s in (show, plan, diff, rep):
        s.add_argument("--dir", default=None, help="where to look for kernels (default: this compiler's cache)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"list": cmd_list, "show": cmd_show, "plan": cmd_plan, "diff": cmd_diff, "trace": cmd_trace,
                "report": cmd_report, "clean": cmd_clean}[args.command](args)
    except (KernelNotFound, FileNotFoundError, ValueError) as e:
        print(f"spyre-inspect {args.command}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # (piped into head: the reader has what it wanted)
        sys.stderr.close()
        return 0
