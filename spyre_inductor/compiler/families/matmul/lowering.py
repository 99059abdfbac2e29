"""Matmul lowering: a MatmulKernel -> the shape of the problem and its tile kernel.

A MatmulKernel (kernel_ir) is ``out[batch..., m, n] = epilogue(sum_k
A[batch..., m, k] * B[batch..., k, n], ...)``: one "dot" reduction of a
product of two operands, each a load, possibly behind casts that cannot
change its value (the PE reads every float operand exactly and accumulates
in fp32), followed by pointwise work on the sum (bias, activation, residual,
scaling, the cast to the output dtype) and stores.

The outer dims are sorted by which operand walks them: A but not B is the
m dim, B but not A the n dim, both (or neither: a broadcast) a batch dim.
At most one m and one n dim (a missing one is an extent of 1, e.g. a
matrix-vector product); batch dims become loops.

The tile axes are ``m`` (tile rows), ``n`` (tile sticks) and ``k``: an A
tile is [m, k], a B tile [k, n], the fp32 accumulator and every epilogue
value [m, n], a bias [n] (a broadcast row), a per-row scale [m] (a column).
Where an operand's stick axis is not its contiguous dim (``x @ W.t()``: W
is [n, k] with k contiguous), its tile is moved in its own layout into a
STAGING tile and transposed on chip (Relayout.TRANSPOSED): every byte still
moves once, whole sticks, and nothing goes back through device memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir.errors import Unsupported
from ...ir.kernel_ir import Cast, Constant, IndexValue, Load, MatmulKernel, Op, Reduction, SizeValue
from ...symbolic.reduce import fill_of
from ...core._dump import Describable
from ...core.fusion import ValueTiles, aliases
from ...core.layout import FLOATS, value_dtype
from ...core.tiles import Combine, Phase, PhaseKind, Relayout, Role, Step, Tile, TileKernel, space

AXES = ("m", "n", "k")


@dataclass(frozen=True)
class MAccess:
    """A load or store: element = offset + sum(batch_strides * b) + m_stride * i + n_stride * j + k_stride * kk."""

    buffer: str
    dtype: str
    batch_strides: tuple[int, ...]
    m_stride: int
    n_stride: int
    k_stride: int
    offset: int


@dataclass(frozen=True)
class MatmulShape(Describable):
    batch: tuple[int, ...]        # extents of the batch dims (loops), outermost first
    M: int
    N: int
    K: int
    a: MAccess                     # the A operand (varies over m and k)
    b: MAccess                     # the B operand (varies over k and n)
    a_transposed: bool             # A moved as [k, m] rows and transposed on chip
    b_transposed: bool             # B moved as [n, k] rows (x @ W.t()) and transposed on chip
    epilogue_loads: tuple[tuple[str, MAccess], ...]   # (tile, access) per output tile
    stores: tuple[tuple[str, MAccess], ...]           # (tile, access) per output tile
    out_dtype: str                 # the narrowest stored dtype (sets the n granule)

    @property
    def batches(self) -> int:
        n = 1
        for b in self.batch:
            n *= b
        return n

    @property
    def macs(self) -> int:
        return self.batches * self.M * self.N * self.K


def _operand(kernel, pos: int, where: str) -> int:
    """The Load behind operand value `pos` (through casts that cannot change its value)."""
    v = kernel.values[pos]
    while isinstance(v, Cast):
        src = kernel.values[v.arg]
        src_dtype = src.dtype
        if not aliases(v.dtype, src_dtype):
            raise Unsupported(f"{where}: a matmul operand cast {src_dtype} -> {v.dtype} changes its value "
                              f"(a prologue the matmul family does not fuse yet)")
        pos, v = v.arg, src
    if not isinstance(v, Load):
        raise Unsupported(f"{where}: a matmul operand computed on chip ({type(v).__name__}) is a prologue the "
                          f"matmul family does not fuse yet")
    if v.dtype not in FLOATS:
        raise Unsupported(f"{where}: a matmul of {v.dtype} operands (the PE arrays multiply floats)")
    return pos


def analyse(kernel: MatmulKernel) -> tuple[MatmulShape, TileKernel]:
    where = f"kernel {kernel.name!r}"
    kernel.check()
    if any(isinstance(v, IndexValue) for v in kernel.values):
        raise Unsupported(f"{where}: a matmul with values computed from the loop indices is not planned yet")
    if len(kernel.reduction_ranges) != 1:
        raise Unsupported(f"{where}: a matmul over reduced dims {kernel.reduction_ranges} (one k dim expected)")
    dots = [i for i, v in enumerate(kernel.values) if isinstance(v, Reduction)]
    if len(dots) != 1:
        raise Unsupported(f"{where}: a matmul fused with another reduction")
    dot = dots[0]
    product = kernel.values[kernel.values[dot].arg]
    if not (isinstance(product, Op) and product.name == "mul"):
        raise Unsupported(f"{where}: a dot of something other than a product")
    la = kernel.values[_operand(kernel, product.args[0], where)]
    lb = kernel.values[_operand(kernel, product.args[1], where)]
    n_outer = len(kernel.ranges)
    K = kernel.reduction_ranges[0]
    sa, sb = la.index.strides, lb.index.strides
    m_dims, n_dims, batch_dims = [], [], []
    for d, r in enumerate(kernel.ranges):
        if r == 1:
            continue
        if sa[d] and not sb[d]:
            m_dims.append(d)
        elif sb[d] and not sa[d]:
            n_dims.append(d)
        else:
            batch_dims.append(d)
    if len(m_dims) > 1 or len(n_dims) > 1:
        raise Unsupported(f"{where}: a matmul whose operands walk {len(m_dims)} m dims and {len(n_dims)} n dims "
                          f"(one of each expected)")
    md = m_dims[0] if m_dims else None
    nd = n_dims[0] if n_dims else None
    M = kernel.ranges[md] if md is not None else 1
    N = kernel.ranges[nd] if nd is not None else 1

    def access(buffer, dtype, index) -> MAccess:
        s = index.strides
        return MAccess(buffer, dtype, tuple(s[d] for d in batch_dims), s[md] if md is not None else 0,
                       s[nd] if nd is not None else 0, s[n_outer], index.offset)

    a = access(la.buffer, la.dtype, la.index)
    b = access(lb.buffer, lb.dtype, lb.index)
    a_tr = _transposed(where, "A", a.k_stride, a.m_stride, M, K)
    b_tr = _transposed(where, "B", b.n_stride, b.k_stride, N, K)
    if a.n_stride or b.m_stride:
        raise Unsupported(f"{where}: a matmul operand walks the other operand's dim")

    # the epilogue's values, every one over (m, n), as a pointwise kernel's (fusion.ValueTiles)
    values = ValueTiles(kernel, None, ("m", "n"), lambda i: value_dtype(where, i, kernel.values[i]))
    tiles, value_tile, new = values.tiles, values.value_tile, values.new
    chunk_steps, epi_loads, stores = [], [], []

    ta = new("a", la.dtype, Role.INPUT, space("m", "k"))
    tb = new("b", lb.dtype, Role.INPUT, space("k", "n"))
    if a_tr:
        new("a_rows", la.dtype, Role.STAGING, space("m", "k"), of=ta, relayout=Relayout.TRANSPOSED)
    if b_tr:
        new("b_rows", lb.dtype, Role.STAGING, space("k", "n"), of=tb, relayout=Relayout.TRANSPOSED)
    acc = new("acc", "fp32", Role.ACCUMULATOR, space("m", "n"))
    chunk_steps.append(Step("matmul", "matmul", acc, (ta, tb), accumulate=True))
    value_tile[dot] = acc
    prologue = _chain(kernel, product.args[0]) | _chain(kernel, product.args[1]) | {kernel.values[dot].arg}
    loads_seen: dict[tuple, str] = {}

    def outside_product(i, args):
        if any(a in prologue for a in args):
            raise Unsupported(f"{where}: value {i} reads a matmul operand outside the product (a value over "
                              f"(m, n, k) fused next to the matmul: a reduction, not a PE plan)")

    for i, v in enumerate(kernel.values):
        if i in prologue or i == dot:
            continue
        if isinstance(v, (Op, Cast)):
            outside_product(i, v.args if isinstance(v, Op) else (v.arg,))
        if isinstance(v, Load):
            acc_ = access(v.buffer, v.dtype, v.index)
            if acc_.k_stride:
                raise Unsupported(f"{where}: value {i} loads {v.buffer!r} along k outside the product")
            key = (acc_.buffer, acc_.batch_strides, acc_.m_stride, acc_.n_stride, acc_.offset)
            if key not in loads_seen:
                sp = space(*(ax for ax, s in (("m", acc_.m_stride), ("n", acc_.n_stride)) if s))
                if "n" in sp and acc_.n_stride != 1:
                    raise Unsupported(f"{where}: the epilogue operand {v.buffer!r} is not contiguous along n")
                loads_seen[key] = new("e", v.dtype, Role.INPUT, sp)
                epi_loads.append((loads_seen[key], acc_))
            value_tile[i] = loads_seen[key]
        elif isinstance(v, SizeValue):
            # a size known only at launch (issue 18): filled from the size words, named and keyed
            # as the matmul's other constants
            dtype = value_dtype(where, i, v)
            fill = fill_of(kernel, v)
            value_tile[i] = values.constant((repr(fill), dtype), "k", dtype, fill)
        elif isinstance(v, (Constant, Cast, Op)):
            values.compute(i, v)
        else:
            raise Unsupported(f"{where}: value {i} ({type(v).__name__}) in a matmul epilogue")
    out_dtypes = []
    for s in kernel.stores:
        outside_product(f"stored to {s.buffer!r}", (s.value,))
        acc_ = access(s.buffer, kernel.buffer(s.buffer).dtype, s.index)
        if acc_.k_stride:
            raise Unsupported(f"{where}: the store to {s.buffer!r} walks k")
        if N > 1 and acc_.n_stride != 1:
            raise Unsupported(f"{where}: the store to {s.buffer!r} is not contiguous along n")
        if (M > 1 and acc_.m_stride == 0) or (N > 1 and acc_.n_stride == 0):
            raise Unsupported(f"{where}: the store to {s.buffer!r} writes one element from several iterations")
        out = new("o", acc_.dtype, Role.OUTPUT, space("m", "n"))
        values.steps.append(Step("unary", "copy", out, (value_tile[s.value],)))
        stores.append((out, acc_))
        out_dtypes.append(acc_.dtype)
    shape = MatmulShape(tuple(kernel.ranges[d] for d in batch_dims), M, N, K, a, b, a_tr, b_tr,
                        tuple(epi_loads), tuple(stores), min(out_dtypes, key=lambda d: {"fp32": 4}.get(d, 2)))
    notes = [f"C[{M}, {N}] = A[{M}, {K}] @ B[{K}, {N}]" + (f" x {shape.batches} batch(es)" if shape.batch else ""),
             f"A {'moved as [k, m] rows and transposed on chip' if a_tr else 'moved as [m, k] rows'}",
             f"B {'moved as [n, k] rows and transposed on chip (x @ W.t())' if b_tr else 'moved as [k, n] rows'}"]
    tk = TileKernel(
        "matmul", AXES, tuple(tiles.values()), tuple(values.constants),
        (Phase(PhaseKind.CHUNK, tuple(chunk_steps), ((ta, a), (tb, b)), (), "one k chunk: A and B tiles into the PE"),
         Phase(PhaseKind.EPILOGUE, tuple(values.steps), tuple(epi_loads), tuple(stores),
               "once per output tile: the epilogue on the fp32 accumulator, then the stores")),
        None, tuple(notes))
    tk.check()
    return shape, tk


def with_k_split(tk: TileKernel) -> TileKernel:
    """The tile kernel of a plan that splits k over a chain of cores: the accumulator is a
    partial sum, the previous core's lands beside it (a RING_LANDING tile, fp32) and the
    combine adds it in, in fp32; only the chain's last core runs the epilogue, on the whole sum."""
    [acc] = tk.with_role(Role.ACCUMULATOR)
    landing = Tile(f"{acc.name}_in", acc.dtype, acc.space, Role.RING_LANDING, of=acc.name)
    combine = Combine("ring", (acc.name,), (Step("binary", "add", acc.name, (landing.name, acc.name)),))
    out = dataclasses.replace(tk, tiles=tk.tiles + (landing,), combine=combine,
                              notes=tk.notes + ("k split over a chain of cores: fp32 partials added along the ring",))
    out.check()
    return out


def _transposed(where, name, stick_stride, row_stride, rows, K) -> bool:
    """Whether an operand's stick axis is strided: moved in its own layout and transposed on chip."""
    if stick_stride == 1 or (K == 1 and name == "A") or (rows == 1 and name == "B"):
        return False
    if row_stride == 1 or rows == 1 or K == 1:
        return True
    raise Unsupported(f"{where}: matmul operand {name} is contiguous in neither of its dims (strides "
                      f"{stick_stride}, {row_stride})")


def _chain(kernel, pos: int) -> set[int]:
    out = set()
    while True:
        out.add(pos)
        v = kernel.values[pos]
        if isinstance(v, Cast):
            pos = v.arg
        else:
            return out


__all__ = ["AXES", "MAccess", "MatmulShape", "analyse", "with_k_split"]
