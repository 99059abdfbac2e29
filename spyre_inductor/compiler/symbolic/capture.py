"""Symbolic sizes at capture (issue 18): which sizes a group's kernel varies over, found by capturing
it at several sizes, fitted, and checked at the tops of other buckets; and the sizes a kernel is
specialized to instead (exact.py). What a bucket is and what makes clipping right: planning.py.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json

import sympy
import torch
from torch.utils._sympy.functions import Max, Min

from ..inductor import indexing
from ..ir.errors import NotCapturable, OutOfRange
from ..ir.kernel_ir import Kernel, SymbolicSizes
from . import reduce as symbolic_reduce
from .exact import far_values
from .planning import bucket_of, buffers_at, check, fit_affine, shapes_at

_MIN_MAX = (sympy.Min, sympy.Max, Min, Max)

GUARDS: contextvars.ContextVar[bool] = contextvars.ContextVar("spyre_size_guards", default=False)


_WARNED: set = set()

def planned_bucket(sym, hint: int | None = None, env=None) -> tuple[int, int, tuple[int, int | None]]:
    """(lo, hi, Dynamo's limits) of the bucket a kernel over size `sym` is captured for: the
    bucket of its hint (Inductor's, unless given) inside the limits of shape env `env` (the
    graph's, unless given). NotCapturable without a hint, or when the bucket is too small to
    capture at hi and hi - 1, or outside Dynamo's range for it."""
    if hint is None:
        hint = hint_of(sym)  # (no guard: other sizes re-bucket at run time)
    limits = dynamo_limits(sym, env)
    try:
        lo, hi = bucket_of(hint, limits)
    except ValueError as e:  # (a hint outside Dynamo's range for it)
        raise NotCapturable(f"symbolic size {sym}: {e}") from None
    if hi < 2:
        raise NotCapturable(f"size {sym}'s bucket [{lo}, {hi}] is too small to tell what depends on it")
    return lo, hi, limits


def dynamo_limits(sym, env=None) -> tuple[int, int | None]:
    """The [min, max] Dynamo's guards (0/1 specialization, mark_dynamic's bounds, checks in
    the code) put on `sym`, from shape env `env` (the graph's, unless given)."""
    try:
        if env is None:
            from torch._inductor.virtualized import V

            env = V.graph.sizevars.shape_env
        r = env.var_to_range[sym]
    except (AttributeError, KeyError):
        return 0, None
    return max(_finite(r.lower) or 0, 0), _finite(r.upper)


def _finite(x) -> int | None:
    try:
        return int(x) if isinstance(x, (int, sympy.Integer)) else None  # (int_oo, -int_oo: None)
    except (TypeError, ValueError, AttributeError):
        return None


def size_symbols(nodes) -> list[sympy.Symbol]:
    """The size symbols in the nodes' loop ranges and in the layouts of the buffers they read and
    write (empty: a static group)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    from ..inductor.nodes import loop_body

    found: set = set()
    for n in nodes:
        try:
            (sizes, rsizes), body = loop_body(n)
        except Exception:  # noqa: BLE001 - capture says why
            continue
        for e in (*sizes, *rsizes):
            found |= _simplified(e).free_symbols
        for e in getattr(body, "indexing_exprs", {}).values():  # (a size read as a value: a mean's count)
            found |= {x for x in _simplified(e).free_symbols if symbol_is_type(x, SymT.SIZE)}
        rw = getattr(n, "read_writes", None)
        for dep in (*getattr(rw, "reads", ()), *getattr(rw, "writes", ())):
            try:
                exprs = (dep.index, *dep.size)
            except (AttributeError, NotImplementedError):  # (a StarDep, a WeakDep: no index)
                continue
            for e in exprs:
                found |= {x for x in _simplified(e).free_symbols if symbol_is_type(x, SymT.SIZE)}
    return sorted(found, key=str)


def size_terms(nodes, symbols) -> list:
    """The outermost Min/Max terms of sizes alone (no loop variable) in the nodes' loop ranges,
    indices and buffer layouts, all of whose sizes are among `symbols`, sorted by name.

    A sliding window's kv offset Max(0, n - window + 1) is affine on each side of n = window but
    not across it, so no multilinear template in n fits it (exact.py). Specialized per value
    as a size of its own instead, its value computed by the generated code at each call and
    handed to the launch beside the sizes', every quantity of the kernel is affine in the sizes
    and the terms together; the template is checked at sizes on both sides of each term's bends."""
    from torch._inductor.virtualized import V

    from ..inductor.nodes import loop_body

    allowed = set(symbols)
    found: set = set()

    def walk(e):
        if isinstance(e, _MIN_MAX):
            if e.free_symbols and e.free_symbols <= allowed:
                found.add(e)
            return  # (a bend in a loop variable: capture's, not a size's)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 1 and e.free_symbols <= allowed:
            found.add(e)  # a stride s**2 (scores of shape (heads, s, s)): a size of its own too
            return
        for a in getattr(e, "args", ()):
            walk(a)

    def visit(e):
        for form in {sympy.sympify(e), _simplified(e)}:
            walk(form)

    names = set()
    for n in nodes:
        try:
            (sizes, rsizes), body = loop_body(n)
        except Exception:  # noqa: BLE001 - capture says why
            continue
        for e in (*sizes, *rsizes, *getattr(body, "indexing_exprs", {}).values()):
            visit(e)
        rw = getattr(n, "read_writes", None)
        for dep in (*getattr(rw, "reads", ()), *getattr(rw, "writes", ())):
            names.add(getattr(dep, "name", None))
            try:
                for e in (dep.index, *dep.size):
                    visit(e)
            except (AttributeError, NotImplementedError):  # (a StarDep, a WeakDep: no index)
                continue
    for name in sorted(x for x in names if x):
        try:
            layout = V.graph.get_buffer(name).get_output_spec()
            for e in (*layout.size, *layout.stride, layout.offset):
                visit(e)
        except Exception:  # noqa: BLE001 - not a buffer with a layout: capture says why
            continue
    return sorted(found, key=str)


def _simplified(e):
    from torch._inductor.virtualized import V

    try:
        return V.graph.sizevars.simplify(sympy.sympify(e))  # (a specialized size is a number)
    except Exception:  # noqa: BLE001 - outside a graph
        return sympy.sympify(e)


def capture_symbolic(nodes, capture_fn, symbols):
    """Capture `nodes` over symbolic sizes, or NotCapturable saying why none of the ways can.

    In order: one size served by a bucket (the rows, or a masked reduced range); the rows by a
    bucket and the other sizes specialized per value at launch (exact.py); every size
    specialized per value; and last the sizes beside the rows specialized by a guard (Dynamo
    recompiles the graph for each new value: said once, with why the others could not)."""
    rows = _rows_symbol(nodes, symbols)
    attempts = [(symbols[0], [])] if len(symbols) == 1 else []
    if rows is not None and len(symbols) > 1:
        attempts.append((rows, [x for x in symbols if x != rows]))
    attempts.append((None, list(symbols)))
    reasons = []
    for bucket, exact in attempts:
        try:
            return _capture_exact(nodes, capture_fn, bucket, exact) if exact else _bucketed(nodes, capture_fn, bucket)
        except NotCapturable as e:
            reasons.append(e.reason)
    why = reasons[0] if len(reasons) == 1 else f"{reasons[0]}; specialized per value: {reasons[-1]}"
    if rows is None or len(symbols) == 1:
        raise NotCapturable(why)
    if not GUARDS.get():
        # (a guard changes the whole graph: never for a group the scheduler only considers fusing)
        e = NotCapturable(why)
        e.guardable = True
        raise e
    kept = _specialize_all_but_one(nodes, symbols, rows, reasons[-1])
    return _bucketed(nodes, capture_fn, kept)


# Whether capture may specialize sizes by a guard (the last resort above): only for the groups
# codegen emits (inductor/scheduling.py), never for one the scheduler is deciding whether to fuse.
def _bucketed(nodes, capture_fn, sym, beyond: bool = True):
    """The Capture of `nodes` with size `sym` served by a bucket (and any size specialized per
    value at the values of indexing.EXACT_VALUES); with `beyond`, checked against captures at
    the tops of other buckets."""
    lo, hi, limits = planned_bucket(sym)
    planned = _at(nodes, capture_fn, {sym: hi})
    probe = _at(nodes, capture_fn, {sym: hi - 1})
    if planned.kernel is None and probe.kernel is None:
        return planned
    if planned.kernel is None or probe.kernel is None:
        raise NotCapturable(f"at size {sym}={hi if planned.kernel is None else hi - 1} the kernel has nothing to run")
    kernel = replace_symbolic(planned.kernel, probe.kernel, str(sym), lo, hi)
    kernel = dataclasses.replace(kernel, symbolic=dataclasses.replace(kernel.symbolic,
                                                                      limits=((str(sym), *limits),)))
    check(kernel)
    if beyond:
        _check_other_buckets(nodes, capture_fn, sym, planned.kernel, kernel, limits)
    return dataclasses.replace(planned, kernel=kernel)


def _steps_only(kernel):
    """`kernel` with the strides of its buffers' extent-1 dims zeroed (never stepped along: a
    keepdim's or a batch of one's stride follows the other sizes, and says nothing)."""
    return dataclasses.replace(kernel, buffers=tuple(
        dataclasses.replace(b, strides=tuple(st if n != 1 else 0 for st, n in zip(b.strides, b.shape)))
        for b in kernel.buffers))


def _check_other_buckets(nodes, capture_fn, sym, raw, kernel, limits) -> None:
    """NotCapturable when the kernel captured at the top of another bucket differs from what its
    fit predicts there (what rebucket will plan), or cannot be captured above it. A size past a
    static table's range (OutOfRange: an embedding's positions past its table) is skipped: the
    kernel is never launched there (a launch would fail, naming it); so is a smaller one that
    cannot be captured (x[32:].sum(0) at 16 reduces nothing)."""
    (_, _, hi), = kernel.symbolic.sizes
    fitted = dataclasses.replace(raw, symbolic=kernel.symbolic)
    n = len(raw.ranges)
    for v in far_values(hi, limits):
        top = bucket_of(v, limits)[1]
        if top in (hi, hi - 1):
            continue
        try:
            found = _at(nodes, capture_fn, {sym: top})
        except OutOfRange:
            continue
        except NotCapturable as e:
            if top < hi:
                continue  # (a size too small to make sense of: an empty reduction, x[32:] at 16)
            raise NotCapturable(f"the kernel over size {sym} cannot be captured at {sym}={top} ({e.reason}), which "
                                f"its fit from {sym}={hi} would serve") from None
        full, _ = shapes_at(fitted, top)
        want = dataclasses.replace(raw, ranges=full[:n], reduction_ranges=full[n:], buffers=buffers_at(fitted, top))
        if found.kernel is None or _steps_only(found.kernel) != _steps_only(want):
            raise NotCapturable(f"the kernel over size {sym} captured at {sym}={top} is not what its fit from "
                                f"{sym}={hi} predicts (an index that bends past the sizes it was captured at)")


def _capture_exact(nodes, capture_fn, bucket, exact):
    """The Capture with sizes `exact` specialized per value (exact.py), the rows'
    `bucket` (if any) served by a bucket; the Capture says which sizes, and carries the template."""
    from .exact import capture_exact, exact_values

    exact = [*exact, *size_terms(nodes, exact)]
    hints = [hint_of(s) for s in exact]

    def at(values):
        with exact_values(values):
            if bucket is None:
                return capture_fn(nodes)
            return _bucketed(nodes, capture_fn, bucket, beyond=list(values.values()) == hints)

    limits = [dynamo_limits(s) for s in exact]
    found, template = capture_exact(at, exact, hints, limits, artifact_doc)
    return dataclasses.replace(found, exact=tuple(launch_expr(s) for s in exact), template=template)


def launch_expr(size) -> str:
    """Python for the value of `size` (a size symbol, or a size term: size_terms) in the generated
    call, where Inductor binds the size symbols."""
    from torch._inductor.codegen.wrapper import pexpr

    return str(size) if isinstance(size, sympy.Symbol) else pexpr(size)


def artifact_doc(kernel) -> dict:
    """The kernel's JSON as its artifact records it (buffers and sizes named by position), no name."""
    from ..ir.naming import positional_names

    doc = json.loads(positional_names(kernel).to_json())
    doc.pop("name", None)
    return doc


def hint_of(sym) -> int:
    """Inductor's hint for size `sym` (the call being compiled), without a guard."""
    from torch._inductor.virtualized import V

    try:
        return int(V.graph.sizevars.optimization_hint(sym))
    except Exception as e:  # noqa: BLE001
        raise NotCapturable(f"symbolic size {sym} without a hint ({type(e).__name__}: {e})") from None


def _rows_symbol(nodes, symbols):
    """The one size symbol of the group's output's outermost dim, if it has exactly one."""
    from torch._inductor.virtualized import V

    from ..inductor.nodes import real_name

    try:
        out = nodes[-1].get_outputs()[0].node
        size = V.graph.get_buffer(real_name(out.get_name())).get_output_spec().size
        keep = sympy.sympify(size[0]).free_symbols if size else set()
    except Exception:  # noqa: BLE001 - no output layout: no rows
        return None
    return next(iter(keep)) if len(keep) == 1 and keep <= set(symbols) else None


def _specialize_all_but_one(nodes, symbols, kept, why: str):
    """The rows stay symbolic; the sizes beside them are specialized to their hints through
    Inductor's guards (Dynamo recompiles the graph if one changes): the last resort, said once
    per group of sizes, with why they could not be specialized per value instead."""
    import warnings

    from torch._inductor.virtualized import V

    others = [x for x in symbols if x != kept]
    pinned = _user_dynamic()
    if pinned is None or any(x in pinned for x in others):
        # (mark_dynamic says the user wants it dynamic: a guard would fail the whole compile)
        raise NotCapturable(f"sizes {', '.join(map(str, symbols))}: {', '.join(map(str, others))} marked dynamic "
                            f"besides the rows, and not served per value ({why})")
    from ...launcher.fallback_policy import origin_ops

    key = (origin_ops(nodes), tuple(str(x) for x in others))
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"spyre: sizes {', '.join(key[1])} of {key[0]} are specialized by a guard (each new value "
                      f"recompiles the graph): the kernel cannot be compiled per value of them ({why})", RuntimeWarning,
                      stacklevel=2)
    for other in others:
        V.graph.sizevars.guard_int(other)  # a guard: another value recompiles
    return kept


def _user_dynamic() -> set | None:
    """The size symbols the user marked dynamic (mark_dynamic and friends: a constraint Dynamo
    checks when it makes its guards), from the shape env's record of the traced inputs; None
    when that record cannot be read (nothing may then be specialized)."""
    from torch._inductor.virtualized import V

    try:
        fakes = V.graph.sizevars.shape_env.tracked_fakes
        pinned = set()
        for tf in fakes or ():
            ctx = getattr(tf, "symbolic_context", None)
            constraints = getattr(ctx, "constraint_sizes", None) or ()
            sizes = tf.fake.size() if isinstance(tf.fake, torch.Tensor) else ()
            for d, c in enumerate(constraints):
                if c is not None and not getattr(c, "warn_only", False) and d < len(sizes) \
                        and isinstance(sizes[d], torch.SymInt):  # (warn_only: automatic dynamic, may specialize)
                    pinned |= sizes[d].node.expr.free_symbols
        return pinned if fakes is not None else None
    except Exception:  # noqa: BLE001 - Dynamo's internals moved: specialize nothing
        return None


def _at(nodes, capture_fn, values):
    token = indexing.SIZE_VALUES.set(values)
    try:
        return capture_fn(nodes)
    finally:
        indexing.SIZE_VALUES.reset(token)


def replace_symbolic(planned: Kernel, probe: Kernel, name: str, lo: int, hi: int) -> Kernel:
    """`planned` (captured at hi) with the SymbolicSizes that its difference from `probe`
    (captured at hi - 1) shows; NotCapturable if they differ in anything but ranges and dims."""
    if (type(planned), planned.values, planned.stores, len(planned.ranges), len(planned.buffers),
            len(planned.reduction_ranges)) != (type(probe), probe.values, probe.stores, len(probe.ranges),
                                               len(probe.buffers), len(probe.reduction_ranges)):
        raise NotCapturable(f"symbolic size {name} reaches the kernel's indices or values")
    ranges = []  # (a range of ranges + reduction_ranges: a symbolic reduced range is masked, below)
    for d, (a, b) in enumerate(zip(planned.ranges + planned.reduction_ranges, probe.ranges + probe.reduction_ranges)):
        if a != b:
            ranges.append((d, name, *fit_affine(a, b, hi, f"loop range {d}")))
    buffers = []
    for x, y in zip(planned.buffers, probe.buffers):
        # (a dim of extent 1 is never stepped along: its stride, e.g. keepdim's, does not matter)
        xs = tuple(st if n != 1 else 0 for st, n in zip(x.strides, x.shape))
        ys = tuple(st if n != 1 else 0 for st, n in zip(y.strides, y.shape))
        if (x.name, x.dtype, xs, x.offset, len(x.shape)) != (y.name, y.dtype, ys, y.offset, len(y.shape)):
            raise NotCapturable(f"buffer {x.name} has strides or an offset that depend on size {name}")
        for d, (a, b) in enumerate(zip(x.shape, y.shape)):
            if a != b:
                buffers.append((x.name, d, name, *fit_affine(a, b, hi, f"dim {d} of {x.name}")))
    if not ranges:
        raise NotCapturable(f"symbolic size {name} changes no loop range of the kernel")
    kernel = dataclasses.replace(planned, symbolic=SymbolicSizes(((name, lo, hi),), tuple(ranges), tuple(buffers)))
    if len(ranges) == 1 and ranges[0][0] >= len(planned.ranges):
        kernel = symbolic_reduce.mask(kernel, *ranges[0])
    return kernel
