"""Symbolic sizes (issue 18): one artifact serves a bucket of sizes.

A kernel whose loop ranges or buffer shapes contain size symbols (``dynamic=True``, dims marked
dynamic, Dynamo's automatic dynamic shapes) is captured at its bucket's maximum and planned for
it: the scratchpad plan, the tiles, the loop structure and the core division are those of the
maximum. At launch the sizes travel through the correction area (program.py): every transfer
of a buffer with a symbolic dim is clipped to the bytes it has at those sizes (the validator
proved the maximum in bounds), so a kernel never runs past a buffer, and the rows past the
size compute nothing that lands anywhere.

Which kernels: the symbolic dim is one range of the kernel, the outermost dim of every buffer
it walks (so a buffer's bytes past the size are a suffix, which clipping removes). An OUTER
range: every output row depends only on the same row of its inputs (pointwise work, reductions
over static dims, a matmul's M or N). A REDUCED range (a softmax over a KV length, a matmul's
K): each reduction is masked past the size or is a dot of operands that are zero there
(symbolic_reduce.py). ``check`` proves, per load and store, from the kernel IR alone, that at
every size of the bucket the iterations inside the size read only bytes the inputs have, the
iterations past it store only past the outputs' bytes (so clipping drops exactly them), and the
reductions ignore what lies past it. A gather (an embedding over a dynamic number of ids)
along an OUTER range reads a static table at indices that are clipped loads: past the size
they land as zeros, so those rows gather row 0, which exists, and their stores are clipped.
Anything else (a symbolic stride, a size inside an index or a value, welford over a symbolic
range, a scatter, whose rows past the size would scatter too) stays visibly on the CPU:
NotCapturable with the reason, an error under SPYRE_STRICT=1. (Fused attention is the exception to the
strides: its heads' stride is seq * dim, and each head becomes its own placeholder,
symbolic_attention.py.)

How the symbolic parts are found: the group is captured twice, with each size symbol at the
bucket's maximum and at one less (odd: a power of two does not hide a divisibility that another
size lacks); the two kernels must agree on everything but ranges and buffer dims, which then
are ``coef * size + const``. Indices, strides and values that depend on a size differ and are
refused.

Bucket policy: the bucket of a size n is (hi / 2, hi] with hi the next power of two of n, at
least FLOOR; [1, FLOOR] below it. A size outside an artifact's bucket is served by the
artifact of its own bucket, compiled on first use from the kernel IR the artifact keeps
(BucketedPlan): Dynamo's guards (one graph for every size) and our bounds meet there.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import threading
from pathlib import Path

import sympy
import torch

from . import indexing, symbolic_reduce
from .indexing import NotCapturable, OutOfRange
from .kernel_ir import AttentionKernel, Buffer, Cast, Kernel, Load, Store, SymbolicSizes

FLOOR = 16


def bucket_of(n: int, limits: tuple[int, int | None] = (0, None)) -> tuple[int, int]:
    """The sizes one artifact serves with `n` among them: (lo, hi), inside `limits` (what
    Dynamo's guards admit: a bucket is planned at most at their maximum)."""
    n = int(n)
    hi = FLOOR
    while hi < n:
        hi *= 2
    lo = 1 if hi == FLOOR else hi // 2 + 1
    least, most = limits
    lo = max(lo, least)
    if most is not None:
        hi = min(hi, most)
    if not lo <= n <= hi:
        raise ValueError(f"size {n} is outside the sizes Dynamo admits [{least}, {most}]")
    return lo, hi


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


# ---- capture ---------------------------------------------------------------------------


def size_symbols(nodes) -> list[sympy.Symbol]:
    """The size symbols in the nodes' loop ranges and in the layouts of the buffers they read and
    write (empty: a static group)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    from .capture import loop_body

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


def _simplified(e):
    from torch._inductor.virtualized import V

    try:
        return V.graph.sizevars.simplify(sympy.sympify(e))  # (a specialized size is a number)
    except Exception:  # noqa: BLE001 - outside a graph
        return sympy.sympify(e)


def capture_symbolic(nodes, capture_fn, symbols):
    """Capture `nodes` over symbolic sizes, or NotCapturable saying why none of the ways can.

    In order: one size served by a bucket (the rows, or a masked reduced range); the rows by a
    bucket and the other sizes specialized per value at launch (symbolic_exact.py); every size
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
# codegen emits (scheduling.py), never for one the scheduler is deciding whether to fuse.
GUARDS: contextvars.ContextVar[bool] = contextvars.ContextVar("spyre_size_guards", default=False)


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
    """The Capture with sizes `exact` specialized per value (symbolic_exact.py), the rows'
    `bucket` (if any) served by a bucket; the Capture says which sizes, and carries the template."""
    from .symbolic_exact import capture_exact, exact_values

    hints = [hint_of(s) for s in exact]

    def at(values):
        with exact_values(values):
            if bucket is None:
                return capture_fn(nodes)
            return _bucketed(nodes, capture_fn, bucket, beyond=list(values.values()) == hints)

    limits = [dynamo_limits(s) for s in exact]
    found, template = capture_exact(at, exact, hints, limits, artifact_doc)
    return dataclasses.replace(found, exact=tuple(str(s) for s in exact), template=template)


def artifact_doc(kernel) -> dict:
    """The kernel's JSON as its artifact records it (buffers and sizes named by position), no name."""
    from .scheduling import positional_names

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

    from .capture import real_name

    try:
        out = nodes[-1].get_outputs()[0].node
        size = V.graph.get_buffer(real_name(out.get_name())).get_output_spec().size
        keep = sympy.sympify(size[0]).free_symbols if size else set()
    except Exception:  # noqa: BLE001 - no output layout: no rows
        return None
    return next(iter(keep)) if len(keep) == 1 and keep <= set(symbols) else None


_WARNED: set = set()


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
    from .fallback_policy import origin_ops

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


def fit_affine(a: int, b: int, hi: int, what: str):
    """(coef, const) of a quantity that is `a` at size hi and `b` at hi - 1."""
    coef = a - b
    if coef < 0:
        raise NotCapturable(f"{what} shrinks as the size grows")
    return coef, a - coef * hi


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


# ---- what makes clipping right ------------------------------------------------------------


def _affine_at(coef: int, const: int, s: int) -> int:
    return coef * s + const


def shapes_at(kernel: Kernel, s: int) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]]]:
    """The kernel's (ranges + reduction_ranges, buffer shapes by name) at size s of its one symbol."""
    ranges = list(kernel.ranges + kernel.reduction_ranges)
    for d, _, c, k in kernel.symbolic.ranges:
        ranges[d] = _affine_at(c, k, s)
    return tuple(ranges), {b.name: b.shape for b in buffers_at(kernel, s)}


def buffers_at(kernel, s: int) -> tuple[Buffer, ...]:
    """The kernel's buffers with their shapes and strides at size s of its one symbol (any
    family: only an AttentionKernel has symbolic strides)."""
    sym = kernel.symbolic
    shapes = {b.name: list(b.shape) for b in kernel.buffers}
    strides = {b.name: list(b.strides) for b in kernel.buffers}
    for b, d, _, c, k in sym.buffers:
        shapes[b][d] = _affine_at(c, k, s)
    for b, d, _, c, k in sym.strides:
        strides[b][d] = _affine_at(c, k, s)
    return tuple(dataclasses.replace(b, shape=tuple(shapes[b.name]), strides=tuple(strides[b.name]))
                 for b in kernel.buffers)


def check(kernel: Kernel, error=NotCapturable) -> None:
    """Raise `error` unless clipping every transfer to the buffers' bytes at the launch's size
    computes the kernel exactly, at every size of its bucket (the module docstring; a symbolic
    reduced range: symbolic_reduce.py)."""
    sym = kernel.symbolic
    (name, lo, hi), = sym.sizes
    if any(st.index.indirect for st in kernel.stores):
        # (the rows past the size would scatter too: their indices are the clipped loads' zeros)
        raise error(f"a scatter over symbolic size {name}")
    if len(sym.ranges) != 1:
        raise error(f"{len(sym.ranges)} loop ranges depend on size {name}; one may")
    d, _, rc, rk = sym.ranges[0]
    reduced = d >= len(kernel.ranges)
    gathers = [v for v in kernel.values if isinstance(v, Load) and v.index.indirect]
    if gathers and reduced:
        raise error(f"a gather inside a reduction over symbolic size {name}")
    sized = {}
    for b, dim, _, c, k in sym.buffers:
        buf = kernel.buffer(b)
        inner = 1 + sum((n - 1) * st for j, (n, st) in enumerate(zip(buf.shape, buf.strides)) if j != dim)
        if buf.strides[dim] < inner or b in sized:
            raise error(f"buffer {b}'s symbolic dim {dim} is not its outermost (its bytes past the size are "
                        f"not a suffix)")
        sized[b] = dim
    outer = kernel.outer()
    accesses = [(v.buffer, v.index, None) for v in kernel.values if isinstance(v, Load)] + \
        [(st.buffer, st.index, st.value) for st in kernel.stores]
    for s in sorted({lo, hi}):
        full, shapes = shapes_at(kernel, s)

        def span_of(bname):
            shape = shapes[bname]
            return 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, kernel.buffer(bname).strides))

        def past_of(bname, index):
            """The lowest element an iteration past the size (along d) reaches."""
            others = [(st, n) for j, (st, n) in enumerate(zip(index.strides, full)) if j != d]
            return index.offset + index.strides[d] * full[d] + sum(min(0, st * (n - 1)) for st, n in others)

        for bname, index, stored in accesses:
            span = span_of(bname)
            a = index.strides[d]
            if a < 0:
                raise error(f"{bname} is walked backwards along the symbolic dim")
            others = [(st, n) for j, (st, n) in enumerate(zip(index.strides, full)) if j != d]
            top = index.offset + a * (full[d] - 1) + sum(max(0, st * (n - 1)) for st, n in others)
            if full[d] > 0 and top >= span:
                what = "reads" if stored is None else "stores to"
                raise error(f"at size {name}={s} the kernel {what} element {top} of {bname}, which has {span}")
            if stored is None or (reduced and a == 0 and outer[stored]):
                continue  # (a reduction's result: one per row, whatever the size)
            if bname not in sized:
                raise error(f"{bname} has static size but is stored along symbolic size {name} (rows past "
                            f"the size would land in it)")
            if a == 0 or past_of(bname, index) < span:
                raise error(f"at size {name}={s} rows past the size would store into {bname}'s bytes")
        for v in gathers:
            why = _gather_problem(kernel, v, d, sized, span_of, past_of)
            if why is not None:
                raise error(f"at size {name}={s}: {why}")
        if reduced:
            why = symbolic_reduce.problem(kernel, d, name, rc, rk, span_of, past_of)
            if why is not None:
                raise error(f"at size {name}={s}: {why}")


def _gather_problem(kernel: Kernel, gather: Load, d: int, sized, span_of, past_of) -> str | None:
    """Why a gather along outer symbolic range `d` could read what it must not (None: it cannot).
    Its table is static, and each of its indices a load that is clipped past the size: the rows
    past it land as zeros, so they gather the table's row 0, which exists, and store nowhere."""
    if gather.buffer in sized:
        return f"the gather from {gather.buffer} has a symbolic dim (rows past the size would be read)"
    for p, _ in gather.index.indirect:
        pos = kernel.values[p].arg
        while isinstance(kernel.values[pos], Cast):
            pos = kernel.values[pos].arg
        index = kernel.values[pos]
        if not (isinstance(index, Load) and index.buffer in sized
                and symbolic_reduce.zero_past(kernel, pos, d, span_of, past_of)):
            return (f"an index of the gather from {gather.buffer} is not a load of a buffer that ends where the "
                    f"size does (rows past the size would gather at indices that may not exist)")
    return None


def rebucket(kernel: Kernel, n: int) -> Kernel:
    """The kernel for the bucket of size n (from an artifact's kernel IR)."""
    from .errors import Unsupported

    sizes = rebucketed_sizes(kernel, n)
    (_, _, hi), = sizes.sizes
    full, _ = shapes_at(kernel, hi)
    outer = len(kernel.ranges)
    out = dataclasses.replace(kernel, ranges=full[:outer], reduction_ranges=full[outer:],
                              buffers=buffers_at(kernel, hi), symbolic=sizes)
    check(out, Unsupported)
    return out


def rebucketed_sizes(kernel, n: int) -> SymbolicSizes:
    """The kernel's SymbolicSizes for the bucket of size n, inside the limits it was captured
    with (any family); Unsupported outside them."""
    from .errors import Unsupported

    sym = kernel.symbolic
    (name, _, _), = sym.sizes
    limits = {x: (a, b) for x, a, b in sym.limits}.get(name, (0, None))
    try:
        lo, hi = bucket_of(n, limits)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    return dataclasses.replace(sym, sizes=((name, lo, hi),))


# ---- the artifact ------------------------------------------------------------------------


def program_with_sizes(program, kernel: Kernel):
    """The planned program with the kernel's size symbol declared and its buffers' symbolic dims."""
    from spyre_runtime.program.operands import SizeExpr

    sym = kernel.symbolic
    if isinstance(kernel, AttentionKernel):  # (its per-head placeholders carry their dims: symbolic_attention.py)
        return dataclasses.replace(program, sizes=tuple(n for n, _, _ in sym.sizes))
    dims: dict[str, list] = {}
    for b, d, s, c, k in sym.buffers:
        buf = kernel.buffer(b)
        dims.setdefault(b, [None] * len(buf.shape))[d] = SizeExpr(s, hi=buf.shape[d], coef=c, const=k)
    symbols = tuple(dataclasses.replace(x, dims=tuple(dims[x.name])) if x.name in dims and x.role != "temp" else x
                    for x in program.symbols)
    return dataclasses.replace(program, symbols=symbols, sizes=tuple(n for n, _, _ in sym.sizes))


def launch_shape(kernel: Kernel, name: str, shape) -> list:
    """A buffer's launch-spec shape: a symbolic dim as its size's name (or coef/const)."""
    if isinstance(kernel, AttentionKernel):
        from .symbolic_attention import launch_shape as attention_shape

        return attention_shape(kernel, name, shape)
    out = list(shape)
    symbolic = getattr(kernel, "symbolic", None)
    for b, d, s, c, k in symbolic.buffers if symbolic else ():
        if b == name:
            out[d] = s if (c, k) == (1, 0) else {"size": s, "coef": c, "const": k}
    return out


def launch_sizes(kernel: Kernel) -> list[dict]:
    symbolic = getattr(kernel, "symbolic", None)
    return [{"name": n, "min": lo, "max": hi} for n, lo, hi in symbolic.sizes] if symbolic else []


# ---- run time: the artifact of each bucket -------------------------------------------------


class BucketedPlan:
    """The prepared artifacts of one symbolic kernel, one per bucket of its bucketed size and per
    value of the sizes it is specialized to (symbolic_exact.py), on one device: the wrapper
    launches through it (launch_bucketed) with the size values of the call."""

    def __init__(self, artifact_dir: str, device: int, exact: str | None = None):
        from spyre_runtime.prepare import prepare_kernel

        from .symbolic_exact import Template

        self.device = device
        self.text = (Path(artifact_dir) / "kernel.json").read_text()
        self.kernel = _kernel_of(self.text)
        self.template = Template.from_doc(json.loads(exact)) if exact is not None else None
        base = self.template.base if self.template is not None else ()
        # values of the specialized sizes -> [(prepared plan, its kernel)], one per bucket
        self.plans = {base: [(prepare_kernel(artifact_dir, device=device), self.kernel)]}
        self.compiled = 0  # artifacts compiled at run time
        self._failed: dict = {}  # (bucket, values) -> the error its compile raised
        self._lock = threading.Lock()

    @property
    def bucketed(self) -> bool:
        return self.kernel.symbolic is not None

    def plan_for(self, n: int | None, values: tuple = ()):
        """(prepared plan, kernel) for bucketed size n (None: the kernel has none) at `values`."""
        found = self._find(n, values)
        if found is not None:
            return found
        with self._lock:
            found = self._find(n, values)
            if found is None:
                failed = self._failed.get((self._bucket(n), values))
                if failed is not None:
                    raise RuntimeError(str(failed)) from failed.__cause__  # (not compiled again per launch)
                try:
                    found = self._compile(n, values)
                except RuntimeError as e:
                    self._failed[(self._bucket(n), values)] = e
                    raise
                self.plans.setdefault(values, []).append(found)
            return found

    def _bucket(self, n):
        if n is None:
            return None
        (name, _, _), = self.kernel.symbolic.sizes
        limits = {x: (a, b) for x, a, b in self.kernel.symbolic.limits}.get(name, (0, None))
        try:
            return bucket_of(n, limits)
        except ValueError:
            return n

    def _find(self, n, values):
        for plan, kernel in self.plans.get(values, ()):
            if n is None or plan.sizes[0].min <= n <= plan.sizes[0].max:
                return plan, kernel
        return None

    def release(self) -> None:
        """Release every prepared plan, each bucket's and each value's (its graph will not be called
        again: loaded.py)."""
        from spyre_runtime.launch import release_plan

        with self._lock:
            for plans in self.plans.values():
                for plan, _ in plans:
                    release_plan(plan)

    def _compile(self, n: int | None, values: tuple):
        from spyre_runtime.prepare import prepare_kernel

        from . import backend
        from .errors import PlanError
        from .scheduling import artifact_root, content_name

        kernel = self.kernel
        try:
            if self.template is not None and values != self.template.base:
                kernel = content_name(_kernel_of(self.template.kernel_json(self.text, values)))
            if n is not None:
                if isinstance(kernel, AttentionKernel):
                    from .symbolic_attention import rebucket as rebucket_attention

                    kernel = rebucket_attention(kernel, n)
                else:
                    kernel = rebucket(kernel, n)
            artifact = backend.compile_kernel(kernel, artifact_root())
        except (backend.Unsupported, NotCapturable, ValueError, PlanError) as e:
            raise RuntimeError(f"spyre: kernel {self.kernel.name!r} cannot be compiled for {_say_sizes(self, n, values)}: "
                               f"{e}") from e
        self.compiled += 1
        return prepare_kernel(artifact, device=self.device), kernel


def _kernel_of(text: str):
    return AttentionKernel.from_json(text) if json.loads(text).get("kind") == "AttentionKernel" else Kernel.from_json(text)


def _say_sizes(plan: BucketedPlan, n, values) -> str:
    parts = []
    if n is not None:
        (name, lo, hi), = plan.kernel.symbolic.sizes
        parts.append(f"{name}={n} (compiled for [{lo}, {hi}])")
    if values:
        parts.append(f"the specialized sizes at {list(values)} (compiled at {list(plan.template.base)})")
    return " and ".join(parts)


def prepare_bucketed(artifact_dir: str, device: int, exact: str | None = None) -> BucketedPlan:
    return BucketedPlan(artifact_dir, device, exact)


def launch_bucketed(plan: BucketedPlan, args, sizes) -> None:
    """Launch `plan` with the call's size values: the bucketed size first (if the kernel has one),
    then the values of the sizes it is specialized to."""
    from spyre_runtime.launch import launch_jobplan

    sizes = tuple(int(v) for v in sizes)
    n, values = (sizes[0], sizes[1:]) if plan.bucketed else (None, sizes)
    bucket, kernel = plan.plan_for(n, values)
    if n is None:
        launch_jobplan(bucket, args)
        return
    if isinstance(kernel, AttentionKernel):  # (each head of a buffer over the sequence: its own argument)
        from .symbolic_attention import head_args

        args = head_args(kernel, args, n)
    launch_jobplan(bucket, args, sizes=(n,))
