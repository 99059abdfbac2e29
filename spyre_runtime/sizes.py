"""Symbolic sizes at launch (issue 18): the bounds an artifact serves and the words that carry sizes.

A launch spec may declare ``sizes`` (name, min, max) and give an argument's
dim as a size's name or as ``{"size", "coef", "const"}``. A launch binds the
size values (each in its bounds, else a LaunchError naming the size and the
bounds, before anything is enqueued); they are written after the
address slots, so the same transfer carries them into the correction area
and the program's fetch reads them with the addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

from .binding import LaunchError
from .program.operands import SizeExpr
from .program.program import Program


@dataclass(frozen=True)
class SizeSpec:
    """A size symbol of the kernel (issue 18) and the bounds its artifact serves: a launch with a
    size outside [min, max] is refused before anything is enqueued."""

    name: str
    min: int
    max: int


# ---- symbolic sizes (issue 18) ----------------------------------------------------------


def dim_at(dim, sizes: dict[str, int]) -> int:
    """A launch-spec dim at the bound sizes: an int, a size's name, or a SizeExpr (unclamped:
    the tensor's dim must be exactly coef * size + const)."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, str):
        return sizes[dim]
    return dim.coef * sizes[dim.symbol] + dim.const


def dim_symbol(dim) -> str:
    return dim if isinstance(dim, str) else dim.symbol


def dim_max(dim, bounds: dict[str, SizeSpec]) -> int:
    if isinstance(dim, int):
        return dim
    return dim_at(dim, {dim_symbol(dim): bounds[dim_symbol(dim)].max})


def parse_dim(d):
    """A launch spec's dim: an int, a size's name, or {"size": name, "coef": c, "const": k}."""
    if isinstance(d, (int, str)) and not isinstance(d, bool):
        return d
    if isinstance(d, dict) and isinstance(d.get("size"), str):
        return SizeExpr(d["size"], hi=0, coef=int(d.get("coef", 1)), const=int(d.get("const", 0)))
    raise ValueError(f"dim {d!r} is neither an int, a size's name nor {{'size', 'coef', 'const'}}")


def parse_sizes(spec: dict) -> tuple[SizeSpec, ...]:
    out = []
    for s in spec.get("sizes", ()):
        lo, hi = s["min"], s["max"]
        if not (isinstance(s["name"], str) and isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
            raise ValueError(f"size {s!r}: a name and bounds 0 <= min <= max")
        out.append(SizeSpec(s["name"], lo, hi))
    return tuple(out)


def bind_sizes(plan, sizes) -> dict[str, int]:
    """The launch's size values by name, each checked against the artifact's bounds (LaunchError,
    naming the size and the bounds: nothing is enqueued). `sizes`: in the launch spec's order, or
    a dict by name; a kernel without sizes takes none."""
    specs = plan.sizes
    if isinstance(sizes, dict):
        unknown = set(sizes) - {s.name for s in specs}
        if unknown:
            raise LaunchError(f"kernel {plan.name!r} has no size(s) {sorted(unknown)}; its sizes are "
                              f"{[s.name for s in specs]}")
        values = [sizes.get(s.name) for s in specs]
    else:
        values = list(sizes or ())
        if len(values) != len(specs):
            raise LaunchError(f"kernel {plan.name!r} takes {len(specs)} size(s) ({', '.join(s.name for s in specs)}), "
                              f"got {len(values)}")
    bound = {}
    for spec, v in zip(specs, values):
        if v is None:
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name} is missing")
        if isinstance(v, (bool, float)):
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name} must be an integer, got {v!r}")
        try:
            n = int(v)  # a SymInt's hint, a NumPy integer
        except (TypeError, ValueError):
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name} must be an integer, got {v!r}") from None
        if not spec.min <= n <= spec.max:
            raise LaunchError(f"kernel {plan.name!r}: size {spec.name}={n} is outside the artifact's bounds "
                              f"[{spec.min}, {spec.max}] (compile it for a bucket that holds {n})")
        bound[spec.name] = n
    return bound


def size_words(program: Program, sizes: dict[str, int]) -> tuple[int, ...]:
    """The size words of the correction area, in order: they follow the address slots."""
    return tuple(sizes[e["size"]] for e in program.size_layout)  # (Program lays them out in order)
