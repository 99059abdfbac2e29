"""Attention fusion: a post-grad graph pass that turns softmax(q k^T * scale + mask) @ v into ONE op.

Both ways attention reaches us end in the same post-grad graph shape: ``F.scaled_dot_product_attention``
on spyre takes PyTorch's math path (its decomposition: q and k scaled by sqrt(scale), a bmm, the
causal mask built from iotas and added, a softmax that gives zeros for rows with no finite score,
a bmm with v), and model code writes the same thing by hand (``q @ k.transpose(-2, -1) * scale``,
a mask added or filled in, ``softmax(scores.float()).to(q.dtype) @ v``). Left alone that is five
programs with the score matrix written to device memory and read back three times. This pass
finds every ``bmm(P, V)`` whose P is a softmax over the last dim of scores that come from a
``bmm(Q, K^T)``, and replaces it with ``spyre::attention`` (attention_op.py), which Inductor lowers
to one flash-style program (attention_node.py, families/attention/).

How the operands are found: from each bmm operand the pass walks up through view-like ops,
scalings by a number and lossless casts to the tensor they come from, and pushes an index tensor
(every element its own storage index) through the same ops. The result says exactly which
source element each operand element is, so the pass checks (never assumes) that the operand is an
affine view [B, H, rows, features] of its source, and for K and V finds the largest group of
query heads that read one kv head (the expand + reshape of ``repeat_kv``, SDPA's
``enable_gqa``): the op then reads K and V per kv head, and the copies die with the old nodes.

Masks: an additive term and a ``where(keep, scores, -inf)`` fill along the score chain become the
op's bias and keep inputs. A mask computed from constants only (``is_causal``'s iotas, a
``tril`` of ones) is evaluated here; when it is a lower triangle it becomes the op's causal
diagonal and no mask is read at all. A pattern the pass does not recognise is left as it is
(its matmuls and softmax still compile, apart).

Symbolic sizes (issue 18): a graph over a dynamic sequence length has SymInt shapes, and the index
maps and constant masks above need numbers. The pass then matches twice, with the size at its
bucket's maximum and at one less (as symbolic/capture.py captures kernels): every shape, view argument
and constant mask is evaluated at that value (``_SIZES``), and the two matches must find the same
attention (scale, causal diagonal, kv groups, dtypes). Under symbolic sizes the op reads q, k and
v where they are, so each must be the very tensor its operand views ([B, H, rows, features] in
its own layout, at both values: no as_strided with symbolic strides is made), and masks read
from data (bias, keep, positions) are not fused yet.
"""

from __future__ import annotations

import contextvars
import math
import operator

import sympy

import torch
import torch.fx as fx

from .attention_op import OP
from .indexing import non_affine_term

aten = torch.ops.aten
prims = torch.ops.prims

VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
         aten.clone.default, aten.permute.default, aten.transpose.int, aten.unsqueeze.default,
         aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor, aten.select.int,
         aten.alias.default, aten.t.default}
SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.chunk.default}
SCALES = {aten.mul.Tensor: False, aten.mul.Scalar: False, aten.div.Tensor: True, aten.div.Scalar: True}
CAST = prims.convert_element_type.default
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
MAX_INDEX_ELEMENTS = 1 << 26  # an operand bigger than this is not analysed (the index map would be too big)
MAX_CONSTANT_ELEMENTS = 1 << 24
CONSTANT_OPS = {prims.iota.default, aten.arange.default, aten.arange.start,
                aten.arange.start_step, aten.full.default, aten.ones.default, aten.zeros.default,
                aten.scalar_tensor.default}


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


# ---- sizes: the numbers a symbolic shape has while a match is evaluated -----------------------

_SIZES: contextvars.ContextVar[dict] = contextvars.ContextVar("attention_fusion_sizes", default={})


class _NotConcrete(Exception):
    """A shape or argument depends on a size the match is not evaluated at (not fused)."""


def _int(x) -> int:
    """x (an int, a SymInt, or a node holding one) at the sizes of the match in progress."""
    if isinstance(x, fx.Node):
        x = _val(x)
    if isinstance(x, bool):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        x = x.node.expr
    if isinstance(x, sympy.Expr):
        if non_affine_term(x) is not None:  # (fitted from two values: only an affine size is determined by them)
            raise _NotConcrete(x)
        v = x.subs(_SIZES.get())
        if v.is_Integer:
            return int(v)
    raise _NotConcrete(x)


def _shape(values) -> tuple[int, ...]:
    return tuple(_int(v) for v in values)


def _is_size(a) -> bool:
    """An argument that is a size (a SymInt, or a node computing one), not a tensor."""
    return isinstance(a, torch.SymInt) or (isinstance(a, fx.Node) and isinstance(_val(a), (int, torch.SymInt)))


def _concrete_args(args):
    """`args` with every size in them a number (a tensor node stays a node)."""
    return fx.node.map_aggregate(args, lambda a: _int(a) if _is_size(a) else a)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _lossless(node) -> bool:
    src, dst = _val(node.args[0]), node.args[1]
    return src is not None and (src.dtype == dst or (dst == torch.float32 and src.dtype in FLOATS))


# ---- operands: view chains and their index maps ----------------------------------------------

def _chain(node):
    """(source, the view ops from source to node, the product of the scalings on the way)."""
    ops, scale = [], 1.0
    while isinstance(node, fx.Node) and node.op == "call_function":
        t = node.target
        if t in VIEWS:
            ops.append(node)
        elif (t is operator.getitem and isinstance(node.args[0], fx.Node)
              and node.args[0].op == "call_function" and node.args[0].target in SPLITS):
            ops.append(node)  # one piece of a split (q, k, v of a fused projection): a view too
            node = node.args[0]
        elif t in SCALES and isinstance(node.args[0], fx.Node) and _number(node.args[1]) is not None:
            s = _number(node.args[1])
            scale = scale / s if SCALES[t] else scale * s
        elif t is CAST and _lossless(node):
            pass
        else:
            break
        node = node.args[0]
    return node, ops[::-1], scale


def _layout(meta) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, storage offset) of a tensor's meta at the match's sizes."""
    return _shape(meta.shape), _shape(meta.stride()), _int(meta.storage_offset())


def _storage_index(meta) -> torch.Tensor | None:
    if not isinstance(meta, torch.Tensor):
        return None
    shape, stride, offset = _layout(meta)
    extent = offset + sum((n - 1) * s for n, s in zip(shape, stride) if n) + 1
    if math.prod(shape) == 0 or extent > MAX_INDEX_ELEMENTS:
        return None
    return torch.arange(extent).as_strided(shape, stride, offset)


def _index_map(source, ops) -> torch.Tensor | None:
    """The storage index (in `source`'s storage) of every element at the end of `ops`."""
    # (Inductor gives the input of an as_strided exactly its fake tensor's strides, so the
    # source's meta layout is the one the op will read)
    meta = _val(source)
    if meta is None or (source.op != "placeholder" and meta._is_view()):
        return None  # (a view Inductor may materialize: its storage is not the one the map is of)
    x = _storage_index(meta)
    if x is None:
        return None
    for op in ops:
        flat = []
        fx.node.map_aggregate(op.args[1:], lambda a: flat.append(a))
        if any(isinstance(a, fx.Node) and not _is_size(a) for a in flat):
            return None  # (a tensor argument: not a view)
        args = _concrete_args(op.args[1:])
        if op.target is operator.getitem:
            split = op.args[0]
            x = split.target(x, *_concrete_args(split.args[1:]), **split.kwargs)[op.args[1]]
        else:
            x = x.clone() if op.target is aten.clone.default else op.target(x, *args)
        if x.numel() > MAX_INDEX_ELEMENTS:
            return None
    return x


def _affine(x: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) if x[i0, i1, ...] == offset + sum(strides[k] * i_k), else None."""
    offset = int(x.flatten()[0])
    strides = []
    for d, n in enumerate(x.shape):
        strides.append(int(x.select(d, 1).flatten()[0]) - offset if n > 1 else 0)
    expect = torch.full((), offset, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(x.shape, strides)):
        shape = [1] * x.dim()
        shape[d] = n
        expect = expect + (torch.arange(n) * s).view(shape)
    return (offset, tuple(strides)) if torch.equal(expect.expand(x.shape), x) else None


def _operand(node, B, H, transpose=False):
    """The operand `node` ([B*H, rows, cols]) as (source, index map [B, H, rows, features], scale), or None."""
    source, ops, scale = _chain(node)
    x = _index_map(source, ops)
    if x is None or x.dim() != 3 or x.shape[0] != B * H:
        return None
    x = x.reshape(B, H, *x.shape[1:])
    return source, (x.transpose(2, 3) if transpose else x), scale


def _largest_group(x, H) -> int:
    """The most consecutive query heads that read the same elements (a kv head's group)."""
    for group in sorted((g for g in range(2, H + 1) if H % g == 0), reverse=True):
        x5 = x.reshape(x.shape[0], H // group, group, *x.shape[2:])
        if torch.equal(x5, x5[:, :, :1].expand(x5.shape)):
            return group
    return 1


def _view_at(x, H, group):
    """(offset, strides) of the 4-D view [B, H // group, rows, features] the map is, or None."""
    return _affine(x.reshape(x.shape[0], H // group, group, *x.shape[2:])[:, :, 0])


# ---- masks evaluated at compile time ----------------------------------------------------------

def _constant(node, memo):
    """The value of a node computed from constants only (iotas, fills, their arithmetic), else None."""
    if not isinstance(node, fx.Node):
        return node
    if node in memo:
        return memo[node]
    memo[node] = None
    meta = _val(node)
    if node.op != "call_function" or not isinstance(meta, torch.Tensor) or \
            math.prod(_shape(meta.shape)) > MAX_CONSTANT_ELEMENTS:
        return None
    if node.target not in CONSTANT_OPS and not any(isinstance(a, fx.Node) and not _is_size(a) for a in node.args):
        return None
    args = []
    for a in node.args:
        if isinstance(a, fx.Node) and not _is_size(a):
            v = _constant(a, memo)
            if v is None:
                return None
            args.append(v)
        else:
            args.append(_concrete_args(a))  # (a size, or a list of them: at the match's sizes)
    kwargs = {k: (torch.device("cpu") if k == "device" else _concrete_args(v)) for k, v in node.kwargs.items()}
    try:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            value = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an op we cannot evaluate here just means "not a constant"
        return None
    memo[node] = value
    return value


def _causal_diagonal(allowed: torch.Tensor) -> int | None:
    """d if `allowed` (broadcast to [..., L, S]) is the lower triangle j <= i + d everywhere."""
    L, S = allowed.shape[-2:]
    first = allowed.reshape(-1, L, S)[0]
    counts = first.sum(-1)
    rows = torch.nonzero(counts).flatten()
    if len(rows) == 0:
        return None
    i = int(rows[0])
    d = int(counts[i]) - 1 - i
    tri = torch.ones(L, S, dtype=torch.bool).tril(d)
    return d if torch.equal(allowed.to(torch.bool), tri.expand(allowed.shape)) else None


# ---- the score chain and the softmax --------------------------------------------------------

def _fill_value(x):
    """A fill's value, without evaluating the (maybe score-sized) fill."""
    if isinstance(x, fx.Node) and x.op == "call_function" and x.target in (aten.full.default, aten.scalar_tensor.default):
        return x.args[1] if x.target is aten.full.default else x.args[0]
    return x


def _fill_of(x, memo) -> float | None:
    """The one value a scalar or a fill holds, else None."""
    x = _fill_value(x)
    v = _constant(x, memo) if isinstance(x, fx.Node) else x
    if isinstance(v, torch.Tensor):
        if v.numel() == 0 or not v.is_floating_point():
            return None
        first = v.flatten()[0]
        return float(first) if bool(torch.all(v == first)) else None
    return _number(v)


def _is_ninf(x, memo) -> bool:
    x = _fill_value(x)
    v = _constant(x, memo) if isinstance(x, fx.Node) else x
    if isinstance(v, torch.Tensor):
        return v.numel() >= 1 and bool(torch.all(v == float("-inf")))
    return _number(v) == float("-inf")


def _is_zero(x, memo) -> bool:
    x = _fill_value(x)
    v = _constant(x, memo) if isinstance(x, fx.Node) else x
    if isinstance(v, torch.Tensor):
        return v.numel() >= 1 and bool(torch.all(v == 0))
    return _number(v) == 0.0


def _softmax_input(p, memo):
    """(X, empty_zero) if p is softmax(X, -1) (or SDPA's safe softmax of it), else None."""
    empty_zero = False
    if p.op == "call_function" and p.target is aten.where.self:
        cond, zero, p = p.args
        if not (_is_zero(zero, memo) and isinstance(p, fx.Node)):
            return None
        empty_zero = cond
    if not (p.op == "call_function" and p.target in (aten.div.Tensor,) and len(p.args) == 2):
        return None
    e, total = p.args
    if not (isinstance(total, fx.Node) and total.target is aten.sum.dim_IntList and total.args[0] is e):
        return None
    if not (e.op == "call_function" and e.target is aten.exp.default):
        return None
    sub = e.args[0]
    if not (sub.op == "call_function" and sub.target is aten.sub.Tensor):
        return None
    x, top = sub.args
    if not (isinstance(top, fx.Node) and top.target is aten.amax.default and top.args[0] is x):
        return None
    rank = _val(x).dim()
    for reduction in (total, top):
        dims = reduction.args[1]
        keep = reduction.args[2] if len(reduction.args) > 2 else reduction.kwargs.get("keepdim", False)
        if [d % rank for d in dims] != [rank - 1] or not keep:
            return None
    if empty_zero is not False:
        # SDPA's safe softmax: where(~any(~(X == -inf), -1, keepdim), 0, softmax(X))
        c = empty_zero
        ok = (c.target is aten.logical_not.default and c.args[0].target is aten.any.dim
              and c.args[0].args[0].target is aten.logical_not.default
              and c.args[0].args[0].args[0].target is aten.eq.Scalar
              and c.args[0].args[0].args[0].args[0] is x and _is_ninf(c.args[0].args[0].args[0].args[1], memo))
        if not ok:
            return None
        empty_zero = True
    return x, empty_zero


def _scores(x, memo):
    """Walk from the softmax input X down to bmm(Q, K^T): (bmm, scale, biases, keeps, 4-D shape or None).

    The walk meets the ops outermost first: a scaling met before (outside) a bias or a finite
    fill scales them too, which the op does not do, so that is not matched."""
    scale, biases, keeps, shape4, scaled = 1.0, [], [], None, False
    node = x
    while True:
        meta = _val(node)
        if meta is not None and meta.dim() == 4 and shape4 is None:
            shape4 = _shape(meta.shape)
        if node.op != "call_function":
            return None
        t = node.target
        if t is aten.bmm.default:
            return node, scale, biases, keeps, shape4
        if t in (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.clone.default):
            node = node.args[0]
        elif t is CAST and _lossless(node):
            node = node.args[0]
        elif t in SCALES and _number(node.args[1]) is not None:
            if _number(node.args[1]) <= 0:
                return None  # (a negative scale would turn the max into the min)
            scaled = True
            s = _number(node.args[1])
            scale = scale / s if SCALES[t] else scale * s
            node = node.args[0]
        elif t is aten.add.Tensor and all(isinstance(a, fx.Node) for a in node.args):
            a, b = node.args
            ours = a if _reaches_bmm(a) else b
            other = b if ours is a else a
            if scaled:
                return None
            biases.append((other, _val(node).dim()))
            node = ours
        elif t is aten.where.self and len(node.args) == 3:
            # where(keep, scores, fill) / where(drop, fill, scores): fill -inf, or a finite fill
            # (model code's torch.finfo(dtype).min), which the kernel writes as it is
            cond, a, b = node.args
            rank = _val(node).dim()
            if _fill_of(b, memo) is not None and _reaches_bmm(a):
                keeps.append((cond, True, _fill_of(b, memo), rank))
                node = a
            elif _fill_of(a, memo) is not None and _reaches_bmm(b):
                keeps.append((cond, False, _fill_of(a, memo), rank))
                node = b
            else:
                return None
            if keeps[-1][2] != float("-inf") and scaled:
                return None
        else:
            return None


def _reaches_bmm(node, depth=12) -> bool:
    """Whether the score chain continues through `node` (the side of an add that holds q k^T)."""
    while depth and isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is aten.bmm.default:
            return True
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        depth -= 1
    return False


# ---- the pass ---------------------------------------------------------------------------------

DEAD = object()  # _match's result when the replacement took over the users of a node after the bmm


class _Builder:
    """Makes the nodes of a match before `before`. Under symbolic sizes a `dry` match only says
    what it found (its signature) and `expect` is the signature the real match must find."""

    def __init__(self, graph, before, fake_mode, symbolic=False, dry=False, expect=None):
        self.graph, self.before, self.fake_mode = graph, before, fake_mode
        self.symbolic, self.dry, self.expect = symbolic, dry, expect
        self.made: list[fx.Node] = []
        self.views: list = []  # (source, shape, strides, offset) of each operand, at this match's sizes
        self.probes = None  # [(size, its value here, the dry match's builder at one less)...]

    def call(self, target, *args):
        with self.graph.inserting_before(self.before):
            node = self.graph.call_function(target, args)
        self.made.append(node)
        vals = fx.node.map_arg(args, lambda a: _val(a))
        with self.fake_mode:
            node.meta["val"] = target(*vals)
        return node


def fuse_attention(gm: fx.GraphModule) -> int:
    """Replace every recognised attention in `gm` with spyre::attention; returns how many."""
    from torch._guards import detect_fake_mode

    graph = gm.graph
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        meta = _val(node)
        if meta is None or meta.device.type != "spyre" or meta.dtype not in FLOATS:
            continue
        fake_mode = detect_fake_mode([meta])
        if fake_mode is None:
            continue
        replacement, build = _matched(graph, node, fake_mode)
        if replacement is None:
            continue
        if replacement is not DEAD:
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
        fused += 1
    if fused:
        graph.eliminate_dead_code()
        gm.recompile()
    return fused


def _matched(graph, node, fake_mode):
    """(replacement, builder) of bmm `node`, or (None, None) leaving the graph as it was."""
    symbols = set()
    for x in (node, *node.args):
        for n in (*_val(x).shape,) if isinstance(_val(x), torch.Tensor) else ():
            if isinstance(n, torch.SymInt):
                symbols |= n.node.expr.free_symbols
    runs = [(_Builder(graph, node, fake_mode), {})]
    if symbols:
        values = _probe_values(symbols, fake_mode)
        if values is None:
            return None, None
        base, probes = values
        real = _Builder(graph, node, fake_mode, symbolic=True)
        real.probes = []
        runs = []
        for sym, probe in probes:
            dry = _Builder(graph, node, fake_mode, symbolic=True, dry=True)
            real.probes.append((sym, base[sym], dry))
            runs.append((dry, probe))
        runs.append((real, base))
    found, expect = None, None
    for build, sizes in runs:
        build.expect = expect
        token = _SIZES.set(sizes)
        try:
            found = _match(node, build)
        except _NotConcrete:
            found = None
        finally:
            _SIZES.reset(token)
        if build.dry or found is None:
            for made in reversed(build.made):  # (a match that failed half way leaves nothing behind)
                graph.erase_node(made)
        if found is None:
            return None, None
        if build.dry:
            if expect is not None and _unsized(found) != _unsized(expect):
                return None, None  # (the sizes disagree: something depends on a size we cannot fold)
            expect = found
    return found, build


def _unsized(found):
    """A match's signature without its sizes (B, H, KVH, D, Dv vary with a symbolic size; the
    kv group H // KVH must not)."""
    B, H, KVH, D, Dv = found[7:12]
    return (*found[:7], H // KVH, *found[12:])


def _probe_values(symbols, fake_mode):
    """(the sizes at the bucket's maximum, [(size, the same with it one less)...]) for a graph over
    symbolic sizes (symbolic/planning.py's buckets, inside Dynamo's guards), or None."""
    from ..ir.errors import NotCapturable
    from ..symbolic.capture import planned_bucket

    env = getattr(fake_mode, "shape_env", None)
    if env is None:
        return None
    base = {}
    for sym in sorted(symbols, key=str):
        try:
            _, base[sym], _ = planned_bucket(sym, int(_hint(env, sym)), env)
        except (KeyError, TypeError, ValueError, AttributeError, NotCapturable):
            return None
    return base, [(sym, {**base, sym: base[sym] - 1}) for sym in base]


def _hint(env, sym):
    values = getattr(env, "backed_var_to_val", None)  # (2.13's name; var_to_val is deprecated)
    return (values if values is not None else env.var_to_val)[sym]


def _source_view(build, source, shape, strides, offset):
    """The 4-D operand: an as_strided view of its source, or (symbolic sizes) the source itself
    when it is that view, else an as_strided whose sizes, strides and offset are affine in the
    size (from this match's numbers and the probe's); None when they are not."""
    k = len(build.views)
    build.views.append((source, tuple(shape), tuple(strides), offset))
    if not build.symbolic:
        return build.call(aten.as_strided.default, source, list(shape), list(strides), offset)
    have_shape, have_strides, have_offset = _layout(_val(source))
    agree = all(a == b for a, b, n in zip(have_strides, strides, shape) if n > 1)
    if have_shape == tuple(shape) and agree and have_offset == offset:
        return source
    if build.dry:
        return source  # (the probe only records the view)
    if not build.probes or any(len(p.views) <= k or p.views[k][0] is not source for _, _, p in build.probes):
        return None
    here = (*shape, *strides, offset)
    there = [(sym, hi, (*p.views[k][1], *p.views[k][2], p.views[k][3])) for sym, hi, p in build.probes]
    flat = []
    for j, a in enumerate(here):
        moved = [(sym, hi, other[j]) for sym, hi, other in there if other[j] != a]
        if len(moved) > 1:
            return None  # (an argument over two sizes: not made)
        flat.append(_affine_size(build, *moved[0][:2], a, moved[0][2]) if moved else a)
    if any(x is None for x in flat):
        return None
    n = len(shape)
    return build.call(aten.as_strided.default, source, flat[:n], flat[n:2 * n], flat[-1])


def _affine_size(build, sym, hi: int, a: int, b: int):
    """The size argument that is `a` at sym = hi and `b` at hi - 1: a number, or coef * sym + const
    computed from the graph's node holding sym; None if there is none or it shrinks."""
    coef, const = a - b, a - (a - b) * hi
    if coef == 0:
        return a
    if coef < 0:
        return None
    holder = next((n for n in build.graph.nodes if n.op == "placeholder" and isinstance(_val(n), torch.SymInt)
                   and _val(n).node.expr == sym), None)
    if holder is None:
        return None
    x = holder if coef == 1 else build.call(operator.mul, holder, coef)
    return x if const == 0 else build.call(operator.add, x, const)


def _size_dims(build, out4, shape):
    """`shape` (values of a meta) as a view's size argument under symbolic sizes: a dim equal to
    one of out4's symbolic dims is that dim of out4 (sym_size), a number stays; None otherwise."""
    dims = list(_val(out4).shape)
    out = []
    for n in shape:
        if not isinstance(n, torch.SymInt):
            out.append(int(n))
            continue
        same = [d for d, m in enumerate(dims) if isinstance(m, torch.SymInt) and m.node.expr == n.node.expr]
        if same:
            out.append(build.call(aten.sym_size.int, out4, same[0]))
        elif n.node.expr == sympy.sympify(dims[0]) * sympy.sympify(dims[1]):  # (batch x heads, flattened)
            out.append(build.call(operator.mul, *(_dim(build, out4, dims, d) for d in (0, 1))))
        else:
            return None
    return out


def _dim(build, out4, dims, d):
    return build.call(aten.sym_size.int, out4, d) if isinstance(dims[d], torch.SymInt) else int(dims[d])


def _match(bmm2, build: _Builder):
    memo: dict = {}
    p, v3 = bmm2.args
    node = p
    while node.op == "call_function" and (node.target in (aten.view.default, aten.reshape.default,
                                                          aten._unsafe_view.default, aten.expand.default,
                                                          aten.clone.default) or node.target is CAST):
        node = node.args[0]
    found = _softmax_input(node, memo)
    if found is None:
        return None
    x, empty_zero = found
    scored = _scores(x, memo)
    if scored is None:
        return None
    bmm1, scale, biases, keeps, shape4 = scored
    q3, kt3 = bmm1.args
    BH, L, D = _shape(_val(q3).shape)
    S, Dv = _shape(_val(v3).shape)[1:]
    # the softmax must be over the kv positions of each query row, on scores of the bmm's shape
    if (_shape(_val(kt3).shape)[2] != S or _shape(_val(bmm1).shape) != (BH, L, S) or _shape(_val(x).shape)[-1] != S
            or math.prod(_shape(_val(x).shape)) != BH * L * S or _shape(_val(p).shape) != (BH, L, S)):
        return None
    if shape4 is not None and (shape4[0] * shape4[1] != BH or shape4[2:] != (L, S)):
        return None
    B, H = (shape4[0], shape4[1]) if shape4 is not None else (1, BH)
    ops = [_operand(q3, B, H), _operand(kt3, B, H, transpose=True), _operand(v3, B, H)]
    if any(o is None for o in ops):
        return None
    (qs, qx, qscale), (ks, kx, kscale), (vs, vx, vscale) = ops
    if vscale != 1.0:
        return None
    group = math.gcd(_largest_group(kx, H), _largest_group(vx, H))
    KVH = H // group
    fits = [_view_at(qx, H, 1), _view_at(kx, H, group), _view_at(vx, H, group)]
    if any(f is None for f in fits):
        return None
    (qoff, qstr), (koff, k_strides), (voff, v_strides) = fits
    dtypes = {_val(s).dtype for s in (qs, ks, vs)}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS):
        return None
    q4 = _source_view(build, qs, (B, H, L, D), qstr, qoff)
    k4 = _source_view(build, ks, (B, KVH, S, D), k_strides, koff)
    v4 = _source_view(build, vs, (B, KVH, S, Dv), v_strides, voff)
    if q4 is None or k4 is None or v4 is None:
        return None

    causal, bias, keep = None, None, None
    fills = {fill for _, _, fill, _ in keeps}
    if len(fills) > 1:
        return None  # (two fills: which wins depends on their order)
    masked_score = fills.pop() if fills else float("-inf")
    keep_terms = [(cond if positive else _negated(build, cond), rank) for cond, positive, _, rank in keeps]
    bias_terms = []
    for m, rank in biases:
        # an additive 0/-inf mask is a keep mask (where(c, 0, -inf) or where(c, -inf, 0)), when the
        # keep masks drop positions to -inf too
        if m.op == "call_function" and m.target is aten.where.self and masked_score == float("-inf"):
            c, a, b = m.args
            if _is_zero(a, memo) and _is_ninf(b, memo):
                keep_terms.append((c, rank))
                continue
            if _is_ninf(a, memo) and _is_zero(b, memo):
                keep_terms.append((_negated(build, c), rank))
                continue
        bias_terms.append((m, rank))
    # constant keep masks: a lower triangle is the causal diagonal (no mask read at all)
    remaining = []
    for c, rank in keep_terms:
        value = _constant(c, memo) if masked_score == float("-inf") else None
        if value is not None and causal is None:
            d = _causal_diagonal(torch.broadcast_to(value, value.shape))
            if d is not None:
                causal = d
                continue
            if bool(value.all()):
                continue
        remaining.append((c, rank))
    # arange(S) <= pos[:, None] (a KV cache's causal mask): the rows' positions, compared on chip
    positions = None
    if causal is None:
        for k_, (c, rank) in enumerate(remaining):
            found = _position_mask(c, L, S, memo)
            if found is not None:
                positions, causal = build.call(aten.reshape.default, found[0], [L]), found[1]
                del remaining[k_]
                break
    if build.symbolic and (remaining or bias_terms or positions is not None):
        return None  # (a mask read from data over a symbolic length: not fused yet)
    full = [B, H, L, S]
    for c, rank in remaining:
        c4 = _to_frame(build, c, rank, B, H)
        if c4 is None:
            return None
        keep = c4 if keep is None else build.call(aten.logical_and.default, keep, c4)
    for m, rank in bias_terms:
        m4 = _to_frame(build, m, rank, B, H)
        if m4 is None or _val(m4).dtype not in FLOATS:
            return None
        bias = m4 if bias is None else build.call(aten.add.Tensor, bias, m4)
    if bias is not None:
        bias = build.call(aten.expand.default, bias, full)
    if keep is not None:
        keep = build.call(aten.expand.default, keep, full)
    # The probabilities' dtype in PV: the bmm's, except that SDPA's math path on 16-bit inputs
    # computes in fp32 only to cast the result back to them at the end: a fused kernel then
    # rounds them to the inputs' dtype, as PyTorch's flash backends do (half the scratchpad and
    # bytes on chip per chunk). Without that cast back (inputs upcast by the user) they stay fp32.
    p_dtype = _val(bmm2).dtype
    (source_dtype,) = dtypes
    cast, last, heads_last = _tail(bmm2, (B, H, L, Dv))
    if p_dtype == torch.float32 and cast == source_dtype:
        p_dtype = source_dtype
    out_dtype = cast if cast is not None else _val(bmm2).dtype
    if masked_score != float("-inf") and bias_terms:
        return None  # (a bias added after a finite fill would shift the fill too)
    found = (scale * qscale * kscale, causal, bool(empty_zero), p_dtype, out_dtype, heads_last, masked_score,
             B, H, KVH, D, Dv, last is None, dtypes)
    if build.dry:
        return found  # (the probe's match: what the real one must find)
    if build.expect is not None and _unsized(found) != _unsized(build.expect):
        return None  # (the sizes disagree: something depends on a size we cannot fold)
    out4 = build.call(OP, q4, k4, v4, bias, keep, positions, scale * qscale * kscale, causal, bool(empty_zero), p_dtype,
                      out_dtype, heads_last, masked_score)
    if last is None:
        shape = _size_dims(build, out4, _val(bmm2).shape) if build.symbolic else [BH, L, Dv]
        return None if shape is None else build.call(aten.view.default, out4, shape)
    # the tail after the bmm (a narrowing cast: the op's own rounding; a transpose of the heads
    # back next to the features and its copy: the op's output layout) is the op's now
    with build.graph.inserting_before(last):
        if heads_last:
            tail = build.graph.call_function(aten.permute.default, (out4, [0, 2, 1, 3]))
            with build.fake_mode:
                tail.meta["val"] = aten.permute.default(_val(out4), [0, 2, 1, 3])
        else:
            shape = _size_dims(build, out4, _val(last).shape) if build.symbolic else list(_val(last).shape)
            if shape is None:
                return None
            tail = build.graph.call_function(aten.view.default, (out4, shape))
            with build.fake_mode:
                tail.meta["val"] = aten.view.default(_val(out4), list(_val(last).shape))
    last.replace_all_uses_with(tail)
    return DEAD  # (the bmm and the chain to `last` are dead now)


def _tail(bmm2, shape4):
    """What follows the bmm through single-user views: (a narrowing cast's dtype or None, the last
    node the op takes over or None, whether that ends with permute(0, 2, 1, 3) and its contiguous
    copy: the heads moved back next to the features, which the op then writes in place)."""
    node, cast, last, heads_last = bmm2, None, None, False
    while len(node.users) == 1:
        (user,) = node.users
        if user.op != "call_function":
            break
        t = user.target
        if t in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
            node = user
        elif (t is CAST and cast is None and user.args[1] in (torch.float16, torch.bfloat16)
              and _val(bmm2).dtype == torch.float32):  # (bf16 -> fp16 rounds twice in eager: not ours)
            cast, last, node = user.args[1], user, user
        elif (t is aten.permute.default and list(user.args[1]) == [0, 2, 1, 3] and _shape(_val(node).shape) == shape4
              and len(user.users) == 1):
            (copy,) = user.users
            if copy.op != "call_function" or copy.target is not aten.clone.default:
                break
            last, heads_last, node = copy, True, copy
            break
        else:
            break
    return cast, last, heads_last


COMPARES = {aten.le.Tensor: (0, False), aten.lt.Tensor: (-1, False), aten.ge.Tensor: (0, True),
            aten.gt.Tensor: (-1, True)}  # (offset, whether the positions come first)


def _position_mask(c, L, S, memo):
    """(the positions node, d) if keep mask c is j <= positions[i] + d: ``arange(S) <= pos[:, None]``
    and its mirror images, the positions an integer per query row that does not vary over batch
    or heads."""
    if c.op != "call_function" or c.target not in COMPARES:
        return None
    d, flipped = COMPARES[c.target]
    index, pos = (c.args[1], c.args[0]) if flipped else c.args
    value = _constant(index, memo)
    if value is None or not isinstance(pos, fx.Node) or _val(pos) is None:
        return None
    if value.dim() == 0 or value.shape[-1] != S or not torch.equal(
            value.reshape(-1, S), torch.arange(S, dtype=value.dtype).expand(value.reshape(-1, S).shape)):
        return None
    meta = _val(pos)
    if meta.dtype not in (torch.int64, torch.int32) or meta.dim() < 2 or _int(meta.shape[-1]) != 1:
        return None
    if any(n != 1 for n in _shape(meta.shape)[:-2]) or _int(meta.shape[-2]) != L:
        return None
    return pos, d


def _negated(build, cond):
    """~cond, peeling a negation rather than adding one (masked_fill(~keep, -inf) keeps `keep`)."""
    if cond.op == "call_function" and cond.target in (aten.logical_not.default, aten.bitwise_not.default):
        return cond.args[0]
    return build.call(aten.logical_not.default, cond)


def _to_frame(build, m, rank, B, H):
    """A mask term applied to the scores at `rank` (4: [B, H, L, S], 3: [B*H, L, S]) as a 4-D
    [B|1, H|1, L|1, S|1] node, or None."""
    if _val(m) is None or _val(m).dim() > rank:
        return None
    while _val(m).dim() < rank:
        m = build.call(aten.unsqueeze.default, m, 0)
    if rank == 4:
        return m
    first = _val(m).shape[0]
    if first == 1:
        return build.call(aten.unsqueeze.default, m, 0)
    if first == B * H:
        return build.call(aten.reshape.default, m, [B, H, *_val(m).shape[1:]])
    return None


__all__ = ["fuse_attention"]
