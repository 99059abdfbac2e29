"""`spyre-inspect report SCRIPT|TRACE`: a per-kernel table of a run, in the style of a perf report
(device time, the gap before each kernel, host time per launch, cores, memory bandwidth and PE
use against the card's peaks, the bound), and a summary; `--html FILE` writes it as one
self-contained page with each top kernel's plan picture and the run's timeline embedded.

Device times are simulated (the card's); host times are the simulator's (this machine's).
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .table import fmt, table as text_table


@dataclass(frozen=True)
class KernelLine:
    name: str
    launches: int
    device_us: float        # summed over its launches
    share: float            # of all device time
    gap_us: float           # mean idle time on its device's compute pipeline before each launch
    host_us: float          # mean host time per launch (the simulator running it)
    cores: int
    memory_pct: float | None
    pe_pct: float | None
    efficiency: float
    bound: str


@dataclass(frozen=True)
class Summary:
    launches: int
    kernels: int
    device_us: float
    span_us: float          # first launch start to last launch end on the compute pipelines
    idle_fraction: float    # of the span, the compute pipeline idle
    host_ms: float


def lines(rows: list[dict]) -> tuple[list[KernelLine], Summary]:
    rows = sorted(rows, key=lambda r: (r["device"], r["sim_start_us"]))
    gaps, previous_end = [], {}
    for r in rows:
        end = previous_end.get(r["device"])
        gaps.append(max(r["sim_start_us"] - end, 0.0) if end is not None else 0.0)
        previous_end[r["device"]] = max(end or 0.0, r["sim_end_us"])
    groups: dict = defaultdict(list)
    for r, gap in zip(rows, gaps):
        groups[r["name"]].append((r, gap))
    total = sum(r["simulated_us"] for r in rows) or 1.0
    out = []
    for name, members in groups.items():
        n = len(members)
        first = members[0][0]
        mean = lambda key: (sum(m[0][key] for m in members) / n) if first[key] is not None else None  # noqa: E731
        device = sum(m[0]["simulated_us"] for m in members)
        out.append(KernelLine(name, n, device, device / total, sum(g for _, g in members) / n, mean("host_us"),
                              first["cores"], mean("memory_pct"), mean("pe_pct"), mean("efficiency"), first["bound"]))
    out.sort(key=lambda k: -k.device_us)
    span = sum(max(r["sim_end_us"] for r in rows if r["device"] == d) - min(r["sim_start_us"] for r in rows if r["device"] == d)
               for d in {r["device"] for r in rows}) if rows else 0.0
    busy = sum(r["simulated_us"] for r in rows)
    summary = Summary(len(rows), len(groups), busy, span, max(0.0, 1.0 - busy / span) if span else 0.0,
                      sum(r["host_us"] for r in rows) / 1e3)
    return out, summary


HEADER = ["kernel", "launches", "device us", "share", "gap us", "host us/launch", "cores", "mem BW %", "PE %",
          "efficiency", "bound"]


def _cells(k: KernelLine) -> list:
    return [k.name, k.launches, k.device_us, k.share, k.gap_us, k.host_us, k.cores, k.memory_pct, k.pe_pct,
            k.efficiency, k.bound]


def text(kernels: list[KernelLine], summary: Summary, top: int | None = None, steps: int | None = None) -> str:
    shown = kernels if top is None else kernels[:top]
    table = text_table(HEADER, [_cells(k) for k in shown])
    more = f" ({len(kernels) - len(shown)} more kernels)" if len(shown) < len(kernels) else ""
    per_step = (f"; per step of {steps}: {summary.launches / steps:.1f} launches, {summary.device_us / steps:.1f} us "
                f"device, {summary.host_ms / steps:.2f} ms host") if steps else ""
    return (f"{table}\n\n{summary.launches} launches of {summary.kernels} kernels{more}: {summary.device_us:.1f} us "
            f"of device time (simulated) over a span of {summary.span_us:.1f} us, compute pipeline idle "
            f"{summary.idle_fraction:.0%} of it; the simulator took {summary.host_ms:.1f} ms of host time to run "
            f"them{per_step}")


def load(path) -> dict:
    trace = json.loads(Path(path).read_text())
    if "spyreKernels" not in trace:
        raise ValueError(f"{path}: not a spyre-inspect trace (no 'spyreKernels'): write one with "
                         f"`spyre-inspect trace SCRIPT`")
    return trace


def timeline_svg(rows: list[dict], width: int = 960) -> str:
    """The compute pipeline of each device over simulated time, a box per launch."""
    if not rows:
        return "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>"
    start = min(r["sim_start_us"] for r in rows)
    end = max(r["sim_end_us"] for r in rows) or 1.0
    devices = sorted({r["device"] for r in rows})
    scale = (width - 120) / max(end - start, 1e-9)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{40 + 30 * len(devices)}" '
           f'font-family="monospace" font-size="11">',
           f'<text x="4" y="14">compute pipeline, simulated us {start:.1f} .. {end:.1f}</text>']
    palette = ["#8fb3de", "#e6a57e", "#b9d99a", "#d7b5e0", "#f0d58c", "#9fd6d0"]
    names = sorted({r["name"] for r in rows})
    for i, d in enumerate(devices):
        y = 24 + 30 * i
        out.append(f'<text x="4" y="{y + 16}">spyre:{d}</text>')
        for r in rows:
            if r["device"] != d:
                continue
            x = 110 + (r["sim_start_us"] - start) * scale
            w = max((r["sim_end_us"] - r["sim_start_us"]) * scale, 0.5)
            colour = palette[names.index(r["name"]) % len(palette)]
            out.append(f'<rect class="launch" x="{x:.2f}" y="{y}" width="{w:.2f}" height="22" fill="{colour}">'
                       f'<title>{html.escape(r["name"])}: {r["simulated_us"]:.2f} us</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(kernels: list[KernelLine], summary: Summary, rows: list[dict], pictures: dict[str, str],
              title: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in _cells(k)) + "</tr>" for k in kernels)
    plans = "".join(f"<h3>{html.escape(name)}</h3>\n{svg}" for name, svg in pictures.items())
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:24px}} table{{border-collapse:collapse;font-family:monospace;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} td:first-child{{text-align:left}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{summary.launches} launches of {summary.kernels} kernels: {summary.device_us:.1f} us of simulated device time over a
span of {summary.span_us:.1f} us (compute pipeline idle {summary.idle_fraction:.0%}); {summary.host_ms:.1f} ms of host time
in the simulator. Device times are the card's (simulated); host times are this machine's.</p>
<h2>Kernels</h2><table><tr>{head}</tr>{body}</table>
<h2>Timeline</h2>{timeline_svg(rows)}
<h2>Plans of the top kernels</h2>{plans or "<p>(no artifacts found for them)</p>"}
</body></html>
"""
