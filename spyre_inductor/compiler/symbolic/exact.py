"""Sizes a kernel is specialized to, one artifact per value, made at launch (issue 29).

A size that cannot be served by a bucket (planning.py: the clipped transfers need it to be the
outermost dim of every buffer it walks) is a stick dim (softmax over a varying last dim), a
matmul's K or N, a second size beside the rows (automatic dynamic shapes make M, K and N of a
matmul symbolic). Dynamo would recompile the whole graph for each value of such a size, if the
compiler put a guard on it, until its limit of 8 graphs, then run the function eagerly. Here
the graph stays one: the kernel is planned at the sizes of the call it was compiled for, and
the wrapper hands every call's values to its launcher.bucketed.BucketedPlan, which compiles and prepares
the artifact of a new value on its first launch (a kernel compile: no trace, no guard).

The artifact of a value is made without Inductor's graph, from a template: the kernel IR (its
JSON, with buffers and sizes named by position) captured at the base values and at the corners
one step away, each integer of it fitted as a multilinear function of the sizes (the Moebius
inversion over the corners: exact for every quantity affine in each size with the others fixed,
such as a batch stride M * K). That is why capture admits such sizes only where every term is
(indexing.non_affine_term), and the template is checked at one far point before it is used: a
kernel whose structure or numbers follow the sizes any other way is refused, naming the size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable

import sympy
from torch.utils._sympy.functions import Max, Min

from ..inductor import indexing
from ..ir.errors import NotCapturable, OutOfRange

MAX_SIZES = 3  # sizes specialized per value in one kernel: 2 ** 3 corner captures (twice with a bucket)


def far_values(base: int, limits, near: tuple = ()) -> list[int]:
    """Sizes away from `base` inside Dynamo's `limits` (the least, a quarter, and 4x, 64x and
    2^24 past it), none of them in `near`: where a capture is compared with what a fit predicts.
    A fit from neighbouring sizes hides what changes only further away: Inductor simplifies an
    index i % 16 to i while the loop over i is at most 16 long."""
    least, most = max(limits[0], 2), limits[1]
    out = []
    for v in (least, base // 4, 4 * base + 3, 64 * base + 3, (1 << 24) + 3):
        if v >= least and (most is None or v <= most) and v not in near and v not in out:
            out.append(v)
    return out


@dataclasses.dataclass(frozen=True)
class Template:
    """How a kernel's IR (JSON) follows the sizes it is specialized to."""

    base: tuple[int, ...]  # the values the kernel was captured at (the artifact compiled with the graph)
    step: tuple[int, ...]  # +1 or -1 per size: the corner captured beside base
    # (JSON path, ((subset of the sizes as a bit mask, coefficient), ...)) per integer that moves
    terms: tuple[tuple[tuple, tuple[tuple[int, int], ...]], ...]

    def kernel_json(self, text: str, values) -> str:
        """The kernel IR `text` (captured at base) at `values`."""
        values = tuple(int(v) for v in values)
        if len(values) != len(self.base):
            raise ValueError(f"a kernel specialized to {len(self.base)} sizes was given {len(values)}")
        doc = json.loads(text)
        t = [(v - b) * s for v, b, s in zip(values, self.base, self.step)]
        for path, coefs in self.terms:
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] += sum(c * _product(t, mask) for mask, c in coefs)
        return json.dumps(doc, indent=1)

    def to_doc(self) -> dict:
        return {"base": list(self.base), "step": list(self.step),
                "terms": [[list(p), [list(c) for c in cs]] for p, cs in self.terms]}

    @classmethod
    def from_doc(cls, d: dict) -> "Template":
        return cls(tuple(d["base"]), tuple(d["step"]),
                   tuple((tuple(p), tuple(tuple(c) for c in cs)) for p, cs in d["terms"]))


def _product(t, mask: int) -> int:
    out = 1
    for j, x in enumerate(t):
        if mask >> j & 1:
            out *= x
    return out


def capture_exact(at: Callable, symbols, hints, limits, kernel_doc: Callable):
    """(the Capture at the hints, its Template): `at(values)` captures the group with the sizes
    `symbols` at `values` (a dict), `kernel_doc(kernel)` is the JSON document of a kernel as
    its artifact records it (positional names, no name). NotCapturable when the kernel does not
    follow the sizes multilinearly, or a size has no neighbour inside Dynamo's limits."""
    k = len(symbols)
    if k > MAX_SIZES:
        raise NotCapturable(f"{k} sizes to specialize per value ({', '.join(map(str, symbols))}); at most "
                            f"{MAX_SIZES} are")
    base = tuple(int(h) for h in hints)
    step = tuple(_step(s, b, lim) for s, b, lim in zip(symbols, base, limits))
    corners = {}
    for mask in range(1 << k):
        values = {s: b + (st if mask >> j & 1 else 0) for j, (s, b, st) in enumerate(zip(symbols, base, step))}
        found = at(values)
        if found.kernel is None:
            raise NotCapturable(f"at {_say(values)} the kernel has nothing to run")
        corners[mask] = found
    first = corners[0]
    docs = {m: kernel_doc(c.kernel) for m, c in corners.items()}
    for m, c in corners.items():
        if c.removed != first.removed:
            raise NotCapturable(f"the buffers kept on chip depend on {_say_sizes(symbols, m)}")
    leaves = {}
    for m, doc in docs.items():
        for path, value in _diff(docs[0], doc, (), symbols, m):
            leaves.setdefault(path, {})[m] = value
    terms = []
    for path, moved in sorted(leaves.items(), key=lambda x: str(x[0])):
        f = {m: int(moved.get(m, _at_path(docs[0], path))) for m in range(1 << k)}
        coefs = []
        for mask in range(1, 1 << k):
            subs = [t for t in range(1 << k) if t & ~mask == 0]
            c = sum((-1) ** (bin(mask).count("1") - bin(t).count("1")) * f[t] for t in subs)
            if c:
                coefs.append((mask, c))
        if coefs:
            terms.append((path, tuple(coefs)))
    template = Template(base, step, tuple(terms))
    _check_far(at, template, symbols, limits, kernel_doc, docs[0])
    return first, template


def _step(sym, base: int, limits) -> int:
    least, most = limits
    if most is None or base + 1 <= most:
        return 1
    if base - 1 >= max(least, 2):
        return -1
    raise NotCapturable(f"size {sym} has only the value {base} inside Dynamo's limits [{least}, {most}]")


def _check_far(at, template: Template, symbols, limits, kernel_doc, base_doc) -> None:
    """The template against captures at sizes away from every corner (symbolic.far_values: the
    least, below and far above the base): an integer the corners fitted wrongly (a product
    computed inside capture, an index Inductor simplified because its loop was short at the
    corners) shows there, or the kernel cannot be captured there. A point past a static table's
    range (OutOfRange) is skipped: the kernel is never launched there."""

    for far in _far_points(template, symbols, limits):
        values = dict(zip(symbols, far))
        try:
            found = at(values)
        except OutOfRange:
            continue
        except NotCapturable as e:
            if all(v <= b for v, b, s in zip(far, template.base, symbols) if isinstance(s, sympy.Symbol)):
                continue  # (sizes too small to make sense of: an empty reduction)
            raise NotCapturable(f"the kernel over sizes {', '.join(map(str, symbols))} cannot be captured at "
                                f"{_say(values)} ({e.reason}), which its template would serve") from None
        want = json.loads(template.kernel_json(json.dumps(base_doc), far))
        if found.kernel is None or kernel_doc(found.kernel) != want:
            raise NotCapturable(f"the kernel does not follow sizes {', '.join(map(str, symbols))} affinely (its "
                                f"capture at {_say(values)} differs from the one its corners predict)")


def _far_points(template: Template, symbols, limits) -> list[list[int]]:
    """The points _check_far captures at: the sizes at far_values (together), and each size on
    both sides of where a size term's arguments cross (the others at base); a size term
    (symbolic/capture.size_terms: a Min/Max of the sizes) takes its value at the sizes there."""
    sized = [isinstance(s, sympy.Symbol) for s in symbols]
    corners = [(b, b + st) for b, st in zip(template.base, template.step)]
    columns = [far_values(b, lim, near) if real else []
               for b, lim, near, real in zip(template.base, limits, corners, sized)]
    points = [[c[k] if k < len(c) else b for c, b in zip(columns, template.base)]
              for k in range(max((len(c) for c in columns), default=0))]
    terms = [s for s, real in zip(symbols, sized) if not real]
    for j, sym in enumerate(symbols):
        if not sized[j]:
            continue
        others = {s: b for s, b, real in zip(symbols, template.base, sized) if real and s != sym}
        least, most = max(limits[j][0], 2), limits[j][1]
        for v in sorted({v for t in terms for v in _bends(t, sym, others)}):
            if v >= least and (most is None or v <= most) and v not in corners[j]:
                far = list(template.base)
                far[j] = v
                points.append(far)
    out = []
    for far in points:
        sizes = {s: v for s, v, real in zip(symbols, far, sized) if real}
        far = [v if real else int(s.subs(sizes)) for s, v, real in zip(symbols, far, sized)]
        if far not in out:
            out.append(far)
    return out


def _bends(term, sym, others) -> set[int]:
    """Values of size `sym` around each point where two arguments of a Min/Max in `term` cross
    (the other sizes at `others`): the pieces a multilinear fit from one side would miss."""
    out = set()
    for node in term.atoms(sympy.Min, sympy.Max, Min, Max):
        args = [sympy.expand(a.subs(others)) for a in node.args]
        for a, b in ((a, b) for i, a in enumerate(args) for b in args[i + 1:]):
            d = sympy.expand(a - b)
            slope = d.coeff(sym, 1)
            rest = sympy.expand(d - slope * sym)
            if slope.is_number and slope != 0 and rest.is_number:
                at = -rest / slope
                out |= {int(sympy.floor(at)) + k for k in (-1, 0, 1, 2)}
    return out


def _diff(a, b, path, symbols, mask):
    """(path, b's value) of each integer where `b` differs from `a`; NotCapturable when they differ
    in anything else (structure, names, floats)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for key in a:
            yield from _diff(a[key], b[key], (*path, key), symbols, mask)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, (*path, i), symbols, mask)
    elif type(a) is int and type(b) is int or type(a) is float and type(b) is float and a.is_integer() \
            and b.is_integer():  # (a size read as a float value: a mean's count, exact in fp32 below 2 ** 24)
        if a != b:
            yield path, int(b)
    elif a != b or type(a) is not type(b):
        where = "/".join(map(str, path)) or "the kernel"
        raise NotCapturable(f"{where} of the kernel changes with {_say_sizes(symbols, mask)} other than as a number "
                            f"({a!r} -> {b!r})")


def _at_path(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _say(values) -> str:
    return ", ".join(f"{s}={v}" for s, v in values.items())


def _say_sizes(symbols, mask: int) -> str:
    return "size " + ", ".join(str(s) for j, s in enumerate(symbols) if mask >> j & 1)


@contextlib.contextmanager
def exact_values(values):
    """Capture with `values` put in for the sizes it specializes (indexing.EXACT_VALUES)."""
    token = indexing.EXACT_VALUES.set(values)
    try:
        yield
    finally:
        indexing.EXACT_VALUES.reset(token)


__all__ = ["MAX_SIZES", "Template", "capture_exact", "exact_values"]
