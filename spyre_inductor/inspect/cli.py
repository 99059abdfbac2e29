"""`spyre-inspect` (or `python -m spyre_inductor.inspect`): the compiled kernels, read and pictured.

    spyre-inspect list [DIR] [--all | --last N]   one row per kernel, newest first
    spyre-inspect show KERNEL [--core N] [--unit ls|pe|sfp]
    spyre-inspect plan KERNEL [--svg FILE]       why the program is what it is

KERNEL is a kernel's name, a unique prefix of one, or its artifact directory; DIR (or --dir)
defaults to where this process's compiler writes its artifacts (Inductor's cache dir).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .catalog import KernelNotFound, find_kernel, kernels
from .cost import cost_of
from .svg import chosen, plan_svg

UNITS = ("ls", "pe", "sfp")


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def cmd_list(args) -> int:
    found = kernels(args.dir)
    shown = found if args.all else found[:args.last]
    rows = []
    for k in shown:
        c = cost_of(k.program())
        ops = ", ".join(k.sources) or "-"
        rows.append([k.name, k.family, ops if len(ops) <= 48 else ops[:45] + "...", c.cores, c.simulated_us,
                     c.roofline_us, c.efficiency, c.bound, c.bytes_over_minimum])
    print(_table(["kernel", "family", "aten ops", "cores", "simulated us", "roofline us", "efficiency",
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
          f"efficiency {c.efficiency:.3f}, {c.bound}-bound, bytes over minimum {_fmt(c.bytes_over_minimum)}")
    print(f"artifact: {k.path}")
    if args.svg:
        Path(args.svg).write_text(plan_svg(k.name, k.plan))
        print(f"picture: {args.svg}")
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
    for s in (show, plan):
        s.add_argument("--dir", default=None, help="where to look for KERNEL (default: this compiler's cache)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"list": cmd_list, "show": cmd_show, "plan": cmd_plan}[args.command](args)
    except (KernelNotFound, FileNotFoundError) as e:
        print(f"spyre-inspect {args.command}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # (piped into head: the reader has what it wanted)
        sys.stderr.close()
        return 0
