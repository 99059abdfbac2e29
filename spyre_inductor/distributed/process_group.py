"""The spyre process group: c10d's collectives on spyre tensors, over gloo, in stream order.

Each collective becomes one Exchange (spyre_runtime.queue) on the tensors' device's current
stream, with its footprint: it runs after what that stream enqueued before it and after
other streams' work on the same bytes, on the card's link pipeline, and what follows it
runs after it. Its run agrees with the other ranks on what is being done (a mismatch is
an error naming the rank and the figure that differs, not a hang), then moves the card's
bytes through gloo (TCP) in place; its simulated duration is the link model's
(spyre_runtime.device.link). Collectives of one group reach gloo in the order they were
called, whichever streams they went on (each waits for the group's previous one), as the
ranks must call them in one order.

Sends and receives stand apart from that order (gloo pairs them by peer and tag): a send
takes a copy of its bytes in stream order and hands it to gloo without waiting for the
receiver; a receive is posted when called and lands its bytes on the stream when its work
is waited for, so a batch of isend/irecv in any order completes.

CPU tensors in the group go to its gloo group directly (so the default group serves both).
One card per rank: a collective's tensors are on one spyre device.
"""

from __future__ import annotations

import datetime
import queue as _queue
import threading

import torch
import torch.distributed as dist

from spyre_runtime import _C
from spyre_runtime.device.link import LinkCosts
from spyre_runtime.hardware import link_from_env
from spyre_runtime.queue import Exchange, Executor, Signal, SoftSignal, Wait

from ..device import queues
from . import collectives as C
from .work import DoneWork, SpyreWork

_AGREE_WIDTH = 6  # collective, then up to five figures


class _Run(Executor):
    __slots__ = ("group", "calls", "nbytes")

    def __init__(self, group, calls):
        self.group, self.calls = group, calls

    def run(self, bindings) -> None:
        for call in self.calls:
            self.group._execute(call)

    def cost_ns(self, bindings) -> float:
        return sum(self.group.link.ns(c.pattern, c.nbytes, self.group.size()) for c in self.calls)


class _Step(Executor):
    """A send's or a receive's part on the stream: `fn()` then the link's price of `nbytes`."""

    __slots__ = ("fn", "nbytes", "link")

    def __init__(self, fn, nbytes, link):
        self.fn, self.nbytes, self.link = fn, nbytes, link

    def run(self, bindings) -> None:
        self.fn()

    def cost_ns(self, bindings) -> float:
        return self.link.ns("p2p", self.nbytes, 2)


class SpyreProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, name: str = ""):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._label = name or "?"
        self._name, self._desc = name, ""
        self.timeout = timeout
        self.link = LinkCosts.of(link_from_env())
        self._order = threading.Lock()
        self._last = None  # (device, stream, signal, ticket) of the group's latest collective on a card
        # Each group's collectives block a link worker of their own: another group's, which the
        # other cards may take part in first, never waits behind them (the default group's lane
        # is the link itself). Receives wait for their sender on one more.
        self.lane = "link" if name in ("0", "") else f"link:{name}"
        self.receive_lane = f"link:{name or '0'} receives"
        self._sends_in_order: dict = {}  # (peer, tag) -> (device, stream, signal, ticket) of the last send
        self._sends: _queue.Queue = _queue.Queue()
        self._send_error: BaseException | None = None
        self._reaper: threading.Thread | None = None

    # ---- what c10d asks of a process group --------------------------------------

    def getBackendName(self) -> str:
        return "spyre"

    # c10d's ProcessGroup reads its name and description from its backends, and a Python
    # process group has none: they are kept here.
    def _set_group_name(self, name: str) -> None:
        self._name = name
        super()._set_group_name(name)

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        super()._set_group_desc(desc)

    @property
    def group_desc(self) -> str:
        return self._desc

    def _where(self, collective: str) -> str:
        return f"spyre: {collective} on rank {self.rank()} of {self.size()} (group {self._label})"

    def allreduce(self, tensors, opts=None):
        op = C.reduce_op_name(_reduce_op(opts))
        return self._submit("all_reduce", [C.all_reduce(t, op, self.size()) for t in _list(tensors)])

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._submit("broadcast", [C.broadcast(t, root) for t in _list(tensors)])

    def reduce(self, tensors, opts=None):
        op, root = C.reduce_op_name(_reduce_op(opts)), opts.rootRank if opts is not None else 0
        return self._submit("reduce", [C.reduce(t, op, root, self.rank(), self.size()) for t in _list(tensors)])

    def allgather(self, output_lists, inputs, opts=None):
        self._check_count("all_gather", output_lists, inputs)
        for outs in output_lists:
            self._check_len("all_gather", "output_tensor_list", outs, self.size())
        return self._submit("all_gather", [C.all_gather(o, t) for o, t in zip(output_lists, inputs)])

    def _allgather_base(self, output, input, opts=None):
        self._check_split("all_gather_into_tensor", output, input, "output", "input")
        return self._submit("all_gather_into_tensor", [C.all_gather_into_tensor(output, input)])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        self._check_count("all_gather_into_tensor", outputs, inputs)
        for o, i in zip(outputs, inputs):
            self._check_split("all_gather_into_tensor", o, i, "output", "input")
        return self._submit("all_gather_into_tensor", [C.all_gather_into_tensor(o, i) for o, i in zip(outputs, inputs)])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = C.reduce_op_name(_reduce_op(opts))
        self._check_count("reduce_scatter", outputs, input_lists)
        for out, ins in zip(outputs, input_lists):
            self._check_len("reduce_scatter", "input_list", ins, self.size())
            for i in ins:
                if i.numel() != out.numel() or i.dtype != out.dtype:
                    raise ValueError(f"{self._where('reduce_scatter')}: every input must be the output's size and "
                                     f"dtype ({out.numel()} {out.dtype}), got {i.numel()} {i.dtype}")
        return self._submit("reduce_scatter", [C.reduce_scatter(o, i, op, self.size())
                                               for o, i in zip(outputs, input_lists)])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = C.reduce_op_name(_reduce_op(opts))
        self._check_split("reduce_scatter_tensor", input, output, "input", "output")
        return self._submit("reduce_scatter_tensor", [C.reduce_scatter_tensor(output, input, op, self.size())])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = C.reduce_op_name(_reduce_op(opts))
        self._check_count("reduce_scatter_tensor", outputs, inputs)
        for o, i in zip(outputs, inputs):
            self._check_split("reduce_scatter_tensor", i, o, "input", "output")
        return self._submit("reduce_scatter_tensor", [C.reduce_scatter_tensor(o, i, op, self.size())
                                                      for o, i in zip(outputs, inputs)])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        for what, t, splits in (("output", output, output_split_sizes), ("input", input, input_split_sizes)):
            rows = t.shape[0] if t.dim() else 1
            if splits and (len(splits) != self.size() or sum(splits) != rows):
                raise ValueError(f"{self._where('all_to_all_single')}: {what}_split_sizes {list(splits)} must have "
                                 f"{self.size()} entries summing to the {what}'s {rows} rows")
            if not splits and rows % self.size():
                raise ValueError(f"{self._where('all_to_all_single')}: the {what}'s {rows} rows do not divide "
                                 f"evenly over {self.size()} ranks; pass split sizes")
        return self._submit("all_to_all_single", [C.all_to_all_single(output, input, output_split_sizes,
                                                                      input_split_sizes, self.size())])

    # PyTorch 2.13's names for them (the old ones above stay: c10d and the trampoline try both)
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        self._check_len("all_to_all", "input_tensor_list", inputs, self.size())
        self._check_len("all_to_all", "output_tensor_list", outputs, self.size())
        return self._submit("all_to_all", [C.all_to_all(outputs, inputs)])

    def gather(self, output_lists, inputs, opts=None):
        root = opts.rootRank if opts is not None else 0
        outs = output_lists[0] if output_lists else []
        if self.rank() == root:
            self._check_len("gather", "gather_list", outs, self.size())
        return self._submit("gather", [C.gather(list(outs), inputs[0], root, self.size())])

    def scatter(self, outputs, input_lists, opts=None):
        root = opts.rootRank if opts is not None else 0
        ins = input_lists[0] if input_lists else []
        if self.rank() == root:
            self._check_len("scatter", "scatter_list", ins, self.size())
        return self._submit("scatter", [C.scatter(outputs[0], list(ins), root, self.size())])

    def barrier(self, opts=None):
        device = torch.spyre.current_device() if torch.spyre.is_initialized() else None
        work = self._submit("barrier", [C.barrier()], device=device)
        work.wait(datetime.timedelta(seconds=self.timeout.total_seconds()))  # a barrier holds the host
        return work

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self._after_queued()
        return self._gloo.monitored_barrier(timeout or self.timeout, wait_all_ranks)

    def send(self, tensors, dst: int, tag: int = 0):
        (t,) = _list(tensors)
        if t.device.type == "cpu":
            return self._gloo.send([t], dst, tag)
        self._raise_send_error()
        device = self._device("send", [t])
        nbytes = t.numel() * t.element_size()

        def hand_over():  # the receiver need not have posted yet: gloo gets a copy of the bytes
            self._sends.put((self._gloo.send([_C.host_alias(t).contiguous().clone()], dst, tag), dst))
            self._start_reaper()

        step = Exchange(_Step(hand_over, nbytes, self.link), None, queues.footprint(reads=(t,)),
                        name=f"send {nbytes} B to rank {dst}", pipeline=self.lane)
        sid = queues.current_stream(device)
        sig = SoftSignal()
        with self._order:  # sends to one peer with one tag reach gloo in call order (it pairs them so)
            ops = [step, Signal(sig)]
            last = self._sends_in_order.get((dst, tag))
            if last is not None and last[:2] != (device, sid) and not last[3].done:
                ops.insert(0, Wait(last[2]))
            tickets = queues.queue(device).enqueue_many(sid, ops)
            self._sends_in_order[(dst, tag)] = (device, sid, sig, tickets[-2])
        return SpyreWork(device, sid, tickets[-2], sig, [t])

    def recv(self, tensors, src: int, tag: int = 0):
        (t,) = _list(tensors)
        if t.device.type == "cpu":
            return self._gloo.recv([t], src, tag)
        device = self._device("recv", [t])
        landed = torch.empty(t.shape, dtype=t.dtype)
        posted = self._gloo.recv([landed], src, tag)  # posted now: a send of the peer's may come first
        nbytes = t.numel() * t.element_size()
        where = self._where(f"recv of {nbytes} B from rank {src} (tag {tag})")

        def land():
            try:
                posted.wait()
            except Exception as e:
                raise dist.DistBackendError(f"{where} failed: {e}") from e
            _C.host_alias(t).copy_(landed)

        def enqueue_landing():
            sid = queues.current_stream(device)
            sig = SoftSignal()
            step = Exchange(_Step(land, nbytes, self.link), None, queues.footprint(writes=(t,)),
                            name=f"recv {nbytes} B from rank {src}", pipeline=self.receive_lane)
            tickets = queues.queue(device).enqueue_many(sid, [step, Signal(sig)])
            return tickets[0], sig

        return SpyreWork(device, queues.current_stream(device), None, None, [t], landing=enqueue_landing)

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("spyre: recv from any source (dist.recv without src) is not supported on spyre "
                                  "tensors; name the sending rank")

    # ---- submitting -----------------------------------------------------------

    def _submit(self, collective: str, calls: list, device: int | None = -1):
        tensors = [t for c in calls for t in c.reads + c.writes]
        if device == -1:
            device = self._device(collective, tensors)
        if device is None:  # CPU tensors (or a barrier before any spyre work): gloo, here and now,
            self._after_queued()  # once the group's collectives queued on a card have reached gloo
            for call in calls:
                self._execute(call, on_host=True)
            return DoneWork([t for c in calls for t in c.writes])
        self._raise_send_error()
        q, sid = queues.queue(device), queues.current_stream(device)
        reads = [t for c in calls for t in c.reads]
        writes = [t for c in calls for t in c.writes]
        nbytes = sum(c.nbytes for c in calls)
        exchange = Exchange(_Run(self, calls), None, queues.footprint(reads=reads, writes=writes),
                            name=f"{collective} {nbytes} B over {self.size()} ranks", pipeline=self.lane)
        signal = SoftSignal()
        with self._order:  # the group's collectives reach gloo in the order they were called
            ops = [exchange, Signal(signal)]
            if self._last is not None and self._last[:2] != (device, sid) and not self._last[3].done:
                ops.insert(0, Wait(self._last[2]))
            tickets = q.enqueue_many(sid, ops)
            self._last = (device, sid, signal, tickets[-2])
        return SpyreWork(device, sid, tickets[-2], signal, writes)

    def _after_queued(self) -> None:
        last = self._last
        if last is not None and not last[3].done:
            queues.queue(last[0]).wait(last[3], outcome=False)

    def _execute(self, call, on_host: bool = False) -> None:
        """Run `call` (on the link pipeline, or on this thread for CPU tensors)."""
        held = {}

        def host(t):
            if on_host:
                return t
            entry = held.get(id(t))
            if entry is None:
                alias = _C.host_alias(t)
                entry = held[id(t)] = (alias, alias if alias.is_contiguous() else alias.contiguous())
            return entry[1]

        try:
            self._agree(call)
            call.host(self._gloo, host)
        except ValueError:
            raise
        except Exception as e:
            raise dist.DistBackendError(f"{self._where(call.collective)} failed: {e}") from e
        for t in call.writes:  # what was copied to be dense goes back; what was only read does not
            entry = held.pop(id(t), None)
            if entry is not None and entry[1] is not entry[0]:
                entry[0].copy_(entry[1])

    # ---- checks -----------------------------------------------------------------

    def _agree(self, call) -> None:
        """Every rank runs the same collective over the same figures, or every rank raises."""
        n = self.size()
        if n == 1:
            return
        row = [C.NAMES.index(call.collective)] + [v for _, v in call.agree]
        row += [-1] * (_AGREE_WIDTH - len(row))
        if call.splits is not None:
            row += list(call.splits[0]) + list(call.splits[1])
        row += [-1] * (_AGREE_WIDTH + 2 * n - len(row))
        mine = torch.tensor(row, dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(n)]
        self._gloo.allgather([rows], [mine]).wait()
        me = self.rank()
        for r, other in enumerate(rows):
            other = other.tolist()
            if other[0] != row[0]:
                raise ValueError(f"{self._where(call.collective)}: rank {r} called "
                                 f"{C.describe('collective', other[0])} instead")
            for k, (figure, value) in enumerate(call.agree):
                if other[1 + k] != value:
                    raise ValueError(f"{self._where(call.collective)}: rank {r} has {figure} "
                                     f"{C.describe(figure, other[1 + k])}, rank {me} has {C.describe(figure, value)}")
            if call.splits is not None:
                sends_me = other[_AGREE_WIDTH + me]  # what rank r sends to this rank
                expect = row[_AGREE_WIDTH + n + r]  # what this rank expects from rank r
                if sends_me != expect:
                    raise ValueError(f"{self._where(call.collective)}: rank {r} sends {sends_me} to rank {me}, "
                                     f"which expects {expect} from it (input and output splits disagree)")

    def _device(self, collective: str, tensors) -> int | None:
        devices = {(t.device.type, t.device.index) for t in tensors}
        for t in tensors:
            if t.layout != torch.strided:
                raise ValueError(f"{self._where(collective)}: only dense (strided) tensors are supported, got {t.layout}")
        if len(devices) > 1:
            names = ", ".join(sorted(f"{d}:{i}" if i is not None else d for d, i in devices))
            raise ValueError(f"{self._where(collective)}: its tensors are on {names}; a collective's tensors are on "
                             f"one device (a CPU tensor cannot take part in a spyre collective: copy it to spyre)")
        if not devices:
            return None
        kind, index = devices.pop()
        if kind == "cpu":
            return None
        if kind != "spyre":
            raise ValueError(f"{self._where(collective)}: tensors on {kind} are not supported (spyre or cpu)")
        return index

    def _check_count(self, collective: str, a, b) -> None:
        if len(a) != len(b):
            raise ValueError(f"{self._where(collective)}: {len(a)} outputs for {len(b)} inputs")

    def _check_len(self, collective: str, what: str, tensors, want: int) -> None:
        if len(tensors) != want:
            raise ValueError(f"{self._where(collective)}: {what} has {len(tensors)} tensors, the group has {want} ranks")

    def _check_split(self, collective: str, whole, piece, whole_name: str, piece_name: str) -> None:
        if whole.numel() != piece.numel() * self.size():
            raise ValueError(f"{self._where(collective)}: the {whole_name} has {whole.numel()} elements, not "
                             f"{self.size()} x the {piece_name}'s {piece.numel()}")
        if whole.dtype != piece.dtype:
            raise ValueError(f"{self._where(collective)}: the {whole_name} is {whole.dtype}, the {piece_name} "
                             f"{piece.dtype}")

    # ---- sends in flight ---------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="spyre-sends", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            work, dst = self._sends.get()
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - reported by the group's next operation
                self._send_error = dist.DistBackendError(f"{self._where(f'send to rank {dst}')} failed: {e}")

    def _raise_send_error(self) -> None:
        error, self._send_error = self._send_error, None
        if error is not None:
            raise error


def _list(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _reduce_op(opts):
    if opts is None:
        return dist.ReduceOp.SUM
    if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return opts
    return opts.reduceOp
