"""The picture of a plan (`spyre-inspect plan KERNEL --svg FILE`): its scratchpad map over the
schedule, and its division's candidates with their simulated times.

The map is plan.json's scratchpad allocation, which every core of the division uses at the same
addresses: bytes up, steps of the tile kernel across. A tile live for the whole kernel (its
copies rotating through the loop) spans every step; a temporary spans the steps it is live.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

WIDTH, MAP_HEIGHT, LEFT, TOP, BAR = 960, 420, 90, 50, 18
COLOURS = {"input": "#8fb3de", "output": "#e6a57e", "temporary": "#b9d99a", "staging": "#d7b5e0"}


def _roles(plan: dict) -> dict:
    tiles = (plan.get("tile_kernel") or {}).get("tiles") or []
    return {t["name"]: t.get("role", "temporary") for t in tiles}


def chosen(division: dict) -> int | None:
    """The index of the candidate the planner kept: the one its reason starts with, else the one
    at the division's own time; None when neither tells."""
    candidates, reason = division.get("candidates") or [], str(division.get("reason", ""))
    for k, (label, _) in enumerate(candidates):
        if reason.startswith(label + ":"):
            return k
    ns = division.get("ns")
    for k, (_, t) in enumerate(candidates):
        if ns is not None and abs(t - ns) <= 1e-6 * max(abs(ns), 1.0):
            return k
    return None


def plan_svg(name: str, plan: dict) -> str:
    sp = plan.get("scratchpad") or {}
    allocs = sp.get("allocations") or []
    roles = _roles(plan)
    steps = max([a["live"][1] + 1 for a in allocs if a.get("live")] + [1])
    top_byte = max([a["offset"] + a["nbytes"] for a in allocs] + [1])
    division = plan.get("division") or {}
    candidates = division.get("candidates") or []
    height = TOP + MAP_HEIGHT + 70 + (len(candidates) * (BAR + 4) + 40 if candidates else 0)
    x_of = lambda s: LEFT + (WIDTH - LEFT - 20) * s / steps  # noqa: E731
    y_of = lambda b: TOP + MAP_HEIGHT - MAP_HEIGHT * b / top_byte  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" '
           f'font-size="11">',
           f'<title>{escape(name)}</title>',
           f'<text x="10" y="18" font-size="14">{escape(name)} ({escape(plan.get("family", "?"))}): scratchpad '
           f'map, {top_byte} of {sp.get("usable", "?")} B per core, on each of '
           f'{division.get("cores", "?")} core(s)</text>',
           f'<text x="10" y="36">{escape(str(division.get("split", "")))}</text>',
           f'<rect class="map" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - 20}" height="{MAP_HEIGHT}" '
           f'fill="none" stroke="#888"/>']
    for a in allocs:
        first, last = a["live"] if a.get("live") else (0, steps - 1)
        x0, x1 = x_of(first), x_of(last + 1)
        y0, y1 = y_of(a["offset"] + a["nbytes"]), y_of(a["offset"])
        label = a["tile"] + (f'[{a["copy"]}]' if a.get("copy") is not None else "")
        role = roles.get(a["tile"], "temporary")
        out.append(f'<g class="tile"><title>{escape(label)}: [{a["offset"]}, {a["offset"] + a["nbytes"]}) '
                   f'row stride {a["row_stride"]}, steps {first}..{last}, {escape(role)}</title>'
                   f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0, 1):.1f}" height="{max(y1 - y0, 1):.1f}" '
                   f'fill="{COLOURS.get(role, "#ccc")}" stroke="#333" stroke-width="0.5"/>'
                   + (f'<text x="{x0 + 3:.1f}" y="{y1 - 3:.1f}">{escape(label)}</text>' if y1 - y0 >= 12 else "")
                   + '</g>')
    out.append(f'<text x="{LEFT}" y="{TOP + MAP_HEIGHT + 16}">step 0</text>')
    out.append(f'<text x="{WIDTH - 80}" y="{TOP + MAP_HEIGHT + 16}">step {steps}</text>')
    out.append(f'<text x="4" y="{TOP + 10}">{top_byte} B</text><text x="4" y="{TOP + MAP_HEIGHT}">0 B</text>')
    if candidates:
        y = TOP + MAP_HEIGHT + 50
        slowest = max(ns for _, ns in candidates) or 1.0
        kept = chosen(division)
        out.append(f'<text x="10" y="{y}">division candidates (simulated ns): {escape(str(division.get("reason", "")))}'
                   f'</text>')
        for k, (label, ns) in enumerate(candidates):
            yy = y + 10 + k * (BAR + 4)
            w = (WIDTH - LEFT - 300) * ns / slowest
            out.append(f'<g class="candidate"><rect x="{LEFT + 200}" y="{yy}" width="{w:.1f}" height="{BAR}" '
                       f'fill="{"#5a8" if k == kept else "#bbb"}"/><text x="10" y="{yy + 13}">{escape(label[:40])}</text>'
                       f'<text x="{LEFT + 205 + w:.1f}" y="{yy + 13}">{ns:.0f}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
