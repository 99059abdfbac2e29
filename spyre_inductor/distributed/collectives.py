"""Every collective on spyre tensors: what it does with the bytes and what it costs, side by side.

A collective is a ``Call``: the spyre tensors it reads and writes (its footprint on the
stream), the link pattern and bytes the timing model prices it by
(spyre_runtime.device.link), the figures every rank must agree on (checked before any
byte moves, so a mismatch is an error naming the rank and the figure, not a hang), and
``host``: the work itself, done through gloo on host views of the card's bytes.
``host(gloo, h)`` gets ``h(tensor)``: the host tensor standing for a spyre tensor
(its bytes in place, or a contiguous copy written back afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

NAMES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
         "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "gather", "scatter", "barrier")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool)
_REDUCE_OPS = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
               ReduceOp.PRODUCT: "product", ReduceOp.BAND: "band", ReduceOp.BOR: "bor", ReduceOp.BXOR: "bxor"}


@dataclass(frozen=True)
class Call:
    collective: str
    pattern: str  # the link pattern it is priced by
    nbytes: int
    reads: tuple = ()
    writes: tuple = ()
    # (figure, value) pairs every rank must agree on
    agree: tuple = ()
    host: Callable = field(default=lambda gloo, h: None, compare=False)
    # all_to_all_single: (input splits, output splits), checked against the other ranks'
    splits: tuple | None = None


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _dtype_code(t: torch.Tensor) -> int:
    return DTYPES.index(t.dtype) if t.dtype in DTYPES else len(DTYPES)


def reduce_op_name(op) -> str:
    for k, v in _REDUCE_OPS.items():
        if op == k:
            return v
    raise NotImplementedError(f"spyre: reduce op {op} is not supported (sum, avg, max, min, product, band, bor, "
                              f"bxor are)")


def _gloo_op(name: str):
    return ReduceOp.SUM if name == "avg" else {v: k for k, v in _REDUCE_OPS.items()}[name]


def _check_average(collective: str, op: str, t: torch.Tensor) -> None:
    if op == "avg" and t.dtype == torch.bool:  # refused at the call, not when the link runs it
        raise NotImplementedError(f"spyre: {collective} with ReduceOp.AVG is not defined for bool tensors")


def _average(t: torch.Tensor, size: int) -> None:
    # gloo has no average: a sum, then a division (truncating for integers, as NCCL's average)
    if t.is_floating_point():
        t.div_(size)
    else:
        t.copy_(torch.div(t, size, rounding_mode="trunc"))


def _opts(kind, **values):
    opts = kind()
    for k, v in values.items():
        setattr(opts, k, v)
    return opts


def _done(work) -> None:
    work.wait()


def all_reduce(t: torch.Tensor, op: str, size: int) -> Call:
    _check_average("all_reduce", op, t)
    def host(gloo, h):
        x = h(t)
        _done(gloo.allreduce([x], _opts(dist.AllreduceOptions, reduceOp=_gloo_op(op))))
        if op == "avg":
            _average(x, size)
    return Call("all_reduce", "ring_reduce", _nbytes([t]), (t,), (t,),
                (("elements", t.numel()), ("dtype", _dtype_code(t)), ("reduce op", _op_code(op))), host)


def broadcast(t: torch.Tensor, root: int) -> Call:
    def host(gloo, h):
        _done(gloo.broadcast([h(t)], _opts(dist.BroadcastOptions, rootRank=root)))
    return Call("broadcast", "pipeline", _nbytes([t]), (t,), (t,),
                (("elements", t.numel()), ("dtype", _dtype_code(t)), ("root", root)), host)


def reduce(t: torch.Tensor, op: str, root: int, rank: int, size: int) -> Call:
    _check_average("reduce", op, t)
    def host(gloo, h):
        # gloo uses the other ranks' buffers as scratch: they reduce a copy, their tensor keeps its values
        x = h(t) if rank == root else h(t).clone()
        _done(gloo.reduce([x], _opts(dist.ReduceOptions, reduceOp=_gloo_op(op), rootRank=root)))
        if op == "avg" and rank == root:
            _average(x, size)
    return Call("reduce", "pipeline", _nbytes([t]), (t,), (t,) if rank == root else (),
                (("elements", t.numel()), ("dtype", _dtype_code(t)), ("reduce op", _op_code(op)), ("root", root)),
                host)


def all_gather(outputs: list, t: torch.Tensor) -> Call:
    def host(gloo, h):
        _done(gloo.allgather([[h(o) for o in outputs]], [h(t)]))
    return Call("all_gather", "ring_gather", _nbytes(outputs), (t,), tuple(outputs),
                (("elements", t.numel()), ("dtype", _dtype_code(t))), host)


def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor) -> Call:
    def host(gloo, h):
        _done(gloo._allgather_base(h(out), h(t)))
    return Call("all_gather_into_tensor", "ring_gather", _nbytes([out]), (t,), (out,),
                (("elements", t.numel()), ("dtype", _dtype_code(t))), host)


def reduce_scatter(out: torch.Tensor, inputs: list, op: str, size: int) -> Call:
    _check_average("reduce_scatter", op, out)
    def host(gloo, h):
        # gloo has no reduce_scatter of a list: the whole reduction, then this rank's piece
        whole = torch.cat([h(i).reshape(-1) for i in inputs])
        _done(gloo.allreduce([whole], _opts(dist.AllreduceOptions, reduceOp=_gloo_op(op))))
        if op == "avg":
            _average(whole, size)
        rank = gloo.rank()
        offset = sum(i.numel() for i in inputs[:rank])
        h(out).copy_(whole[offset: offset + out.numel()].view(out.shape))
    return Call("reduce_scatter", "ring_gather", _nbytes(inputs), tuple(inputs), (out,),
                (("elements", out.numel()), ("dtype", _dtype_code(out)), ("reduce op", _op_code(op))), host)


def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor, op: str, size: int) -> Call:
    _check_average("reduce_scatter_tensor", op, t)
    def host(gloo, h):
        x = h(t).clone()  # reduced in place, the input keeps its values
        _done(gloo.allreduce([x], _opts(dist.AllreduceOptions, reduceOp=_gloo_op(op))))
        if op == "avg":
            _average(x, size)
        piece = out.numel()
        h(out).copy_(x.reshape(-1)[gloo.rank() * piece: (gloo.rank() + 1) * piece].view(out.shape))
    return Call("reduce_scatter_tensor", "ring_gather", _nbytes([t]), (t,), (out,),
                (("elements", t.numel()), ("dtype", _dtype_code(t)), ("reduce op", _op_code(op))), host)


def all_to_all_single(out: torch.Tensor, t: torch.Tensor, out_splits: list, in_splits: list, size: int) -> Call:
    def host(gloo, h):
        _done(gloo.alltoall_base(h(out), h(t), list(out_splits), list(in_splits), dist.AllToAllOptions()))
    rows_in = t.shape[0] if t.dim() else 1
    rows_out = out.shape[0] if out.dim() else 1
    ins = list(in_splits) or [rows_in // size] * size
    outs = list(out_splits) or [rows_out // size] * size
    row = t[0].numel() if t.dim() and t.shape[0] else t.numel()
    return Call("all_to_all_single", "ring_gather", max(_nbytes([t]), _nbytes([out])), (t,), (out,),
                (("dtype", _dtype_code(t)), ("elements per row", row)), host, splits=(tuple(ins), tuple(outs)))


def all_to_all(outputs: list, inputs: list) -> Call:
    def host(gloo, h):
        # gloo has no all_to_all of lists: one all_to_all_single over the concatenations
        flat_in = torch.cat([h(i).reshape(-1) for i in inputs])
        flat_out = torch.empty(sum(o.numel() for o in outputs), dtype=flat_in.dtype)
        _done(gloo.alltoall_base(flat_out, flat_in, [o.numel() for o in outputs], [i.numel() for i in inputs],
                                 dist.AllToAllOptions()))
        for o, piece in zip(outputs, flat_out.split([o.numel() for o in outputs])):
            h(o).copy_(piece.view(o.shape))
    return Call("all_to_all", "ring_gather", max(_nbytes(inputs), _nbytes(outputs)), tuple(inputs), tuple(outputs),
                (("dtype", _dtype_code(inputs[0])),), host,
                splits=(tuple(i.numel() for i in inputs), tuple(o.numel() for o in outputs)))


def gather(outputs: list, t: torch.Tensor, root: int, size: int) -> Call:
    def host(gloo, h):
        _done(gloo.gather([[h(o) for o in outputs]] if outputs else [], [h(t)],
                          _opts(dist.GatherOptions, rootRank=root)))
    return Call("gather", "root", _nbytes([t]) * size, (t,), tuple(outputs),
                (("elements", t.numel()), ("dtype", _dtype_code(t)), ("root", root)), host)


def scatter(out: torch.Tensor, inputs: list, root: int, size: int) -> Call:
    def host(gloo, h):
        _done(gloo.scatter([h(out)], [[h(i) for i in inputs]] if inputs else [],
                           _opts(dist.ScatterOptions, rootRank=root)))
    return Call("scatter", "root", _nbytes([out]) * size, tuple(inputs), (out,),
                (("elements", out.numel()), ("dtype", _dtype_code(out)), ("root", root)), host)


def barrier() -> Call:
    return Call("barrier", "barrier", 0, host=lambda gloo, h: _done(gloo.barrier()))


def _op_code(op: str) -> int:
    return list(_REDUCE_OPS.values()).index(op)


def describe(figure: str, value: int) -> str:
    if figure == "dtype":
        return str(DTYPES[value]).replace("torch.", "") if value < len(DTYPES) else "another dtype"
    if figure == "reduce op":
        return list(_REDUCE_OPS.values())[value]
    if figure == "collective":
        return NAMES[value]
    return str(value)
