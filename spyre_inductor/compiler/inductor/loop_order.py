"""Loop orders that let a reduction over a non-innermost dim fuse with its pointwise epilogue.

Why this exists. Inductor decides a pointwise node's loop order from the
strides of what it stores and loads (``ComputedBuffer.simplify_and_reorder``):
``exp(x - max) / sum`` over a (512, 1024) tensor walks (rows, columns), the
memory order. A reduction node always walks (outer dims, reduced dims): the
softmax over dim 0 walks (columns, rows). Before the scheduler asks a backend
whether two nodes may fuse (``BaseScheduling.can_fuse_vertical``), it wants
the two to share a memory access with the same index over the same loops
(``score_fusion_memory`` > 0, checked by ``InductorChoices.can_fuse``: "no
shared data"), and every read of the producer's output to match its write
(``Scheduler.can_fuse_vertical``: "memory deps did not match"). In the two
orders neither holds, so a dim-0 softmax became two programs and its input
was read from device memory twice. (The last-dim softmax has one order for
both nodes, so it was always one program.)

Inductor has the machinery to agree the orders, loop ordering after fusion
(``Scheduler.shared_data_after_reordering_loop`` ->
``SchedulerNode.reorder_loops_by_dep_pair``), but only for GPU devices: for
any other device the nodes' dependencies are normalized (loops merged) when
they are extracted, and the reordering then refuses dependencies whose
numbers of loop variables differ. ``is_gpu`` is a fixed list; there is no
hook for a device to opt in.

What we do instead: a scheduler pass that runs right before fusion
(``torch._inductor.config._pre_fusion_custom_pass``: Inductor's config hook
for passes over scheduler nodes; its name has a leading underscore and
Inductor calls scheduler IR passes a prototype, so a torch upgrade may move
it, and tests/compiler/test_dim0_fusion.py would say so). For each spyre
pointwise node that reads the output of a spyre reduction with which it
shares no data, it matches the two nodes' unnormalized accesses of a buffer
both read (the softmax's input) with Inductor's own
``MemoryDep.decide_loop_order_to_match`` and applies the order with
``SchedulerNode.apply_new_loop_order`` -- the same two calls loop ordering
after fusion makes on GPUs -- then extracts the dependencies again,
normalized as the scheduler extracted them for every other spyre node. The node now walks (columns, rows): it shares the input
access with the reduction and reads the reduction's output at the index it
was written, so both of the scheduler's checks pass and our
``can_fuse_vertical`` (a capture into one kernel) decides.

A new order is kept only if our backend then fuses the two nodes and no
fusion the node had with its consumers is lost; otherwise the node gets its
old loops back. Nodes of other devices are never touched.

The hook is global Inductor config, so ``install()`` chains a pass that
was already set (ours runs after it) and is idempotent; the uuid names both.
A pass set after ours replaces it: dim-0 epilogues are then two programs
again (correct, slower).
"""

from __future__ import annotations

from torch._inductor import config as inductor_config
from torch._inductor import dependencies
from torch._inductor.custom_graph_pass import CustomSchedulerPass
from torch._inductor.dependencies import MemoryDep
from torch._inductor.scheduler import SchedulerNode

from .version import compiler_version


def _is_spyre(node) -> bool:
    device = node.get_device()
    return device is not None and device.type == "spyre"


def _candidate(node) -> bool:
    return (isinstance(node, SchedulerNode) and not node.is_reduction() and not node.is_template()
            and getattr(node, "_body", None) is not None and _is_spyre(node))


def _producers(node) -> list[SchedulerNode]:
    """The spyre reduction nodes whose outputs `node` reads, in node order, each once."""
    scheduler = node.scheduler
    out = []
    for dep in node.read_writes.reads:
        buf = scheduler.name_to_buf.get(scheduler.mutation_renames.get(dep.name, dep.name))
        if buf is None:
            continue
        producer = scheduler.name_to_node.get(buf.defining_op_name())
        if (isinstance(producer, SchedulerNode) and producer.is_reduction() and _is_spyre(producer)
                and producer not in out):
            out.append(producer)
    return out


def _users(node) -> list:
    out = []
    for buf in node.get_outputs():
        for use in buf.users:
            user = use.node
            if isinstance(user, SchedulerNode) and user is not node and user not in out:
                out.append(user)
    return out


def _raw_reads(node) -> dict[str, MemoryDep]:
    """The node's reads, unnormalized (one loop variable per loop), by buffer name."""
    rw = dependencies.extract_read_writes(node._body, *node._sizes, normalize=False)
    return {d.name: d for d in rw.reads if isinstance(d, MemoryDep)}


def _order_to_match(pointwise: SchedulerNode, reduction: SchedulerNode) -> list[int] | None:
    """The loop order of `pointwise` that walks a buffer both nodes read as `reduction` does."""
    n = len(pointwise._sizes[0])
    mine, theirs = _raw_reads(pointwise), _raw_reads(reduction)
    for name, dep in mine.items():
        other = theirs.get(name)
        if other is None or dep.num_vars != n or other.num_vars != n:
            continue
        order = dep.decide_loop_order_to_match(other)
        if order is not None and list(order) != list(range(n)):
            return list(order)
    return None


class _Loops:
    """A node's loop state, to put back when a new order does not pay."""

    def __init__(self, node: SchedulerNode):
        self.node, self.body, self.sizes, self.read_writes = node, node._body, node._sizes, node.read_writes

    def restore(self) -> None:
        n = self.node
        n._body, n._sizes = self.body, self.sizes
        n.set_read_writes(self.read_writes)
        n.clear_loop_body_dependent_caches(True)


def _shares(scheduler, a, b) -> bool:
    return scheduler.score_fusion_memory(a, b) > 0


def align(node: SchedulerNode) -> bool:
    """Give `node` the loop order of a reduction it consumes, if that makes them fuse (module docstring)."""
    scheduler = node.scheduler
    backend = scheduler.get_backend(node.get_device())
    for reduction in _producers(node):
        if _shares(scheduler, reduction, node):
            return False  # the orders already agree (a last-dim softmax)
        if node._sizes[1] or len(reduction._sizes[0]) + len(reduction._sizes[1]) != len(node._sizes[0]):
            continue
        order = _order_to_match(node, reduction)
        if order is None:
            continue
        users = [u for u in _users(node) if _shares(scheduler, node, u)]
        before = _Loops(node)
        node.apply_new_loop_order(order)
        # as the scheduler extracted them for every non-GPU node: loops merged where they can be
        node.refresh_dependencies(normalize=True, need_clear_tiling_cache=True)
        if (_shares(scheduler, reduction, node) and scheduler.can_fuse_vertical(reduction, node)
                and backend.can_fuse_vertical(reduction, node)
                and all(_shares(scheduler, node, u) for u in users)):
            return True
        before.restore()
    return False


class AlignLoopOrders(CustomSchedulerPass):
    """The pre-fusion pass (module docstring); `previous` is a pass that was set before ours."""

    def __init__(self, previous=None):
        self.previous = previous

    def __call__(self, nodes):
        if self.previous is not None:
            nodes = self.previous(nodes)
        for node in nodes:
            if _candidate(node):
                align(node)
        return nodes

    def uuid(self):
        inner = None
        if self.previous is not None:
            inner = self.previous.uuid() if hasattr(self.previous, "uuid") else repr(self.previous)
        return f"spyre-align-loop-orders {compiler_version()} then-after {inner}"


def install() -> None:
    """Set our pass as Inductor's pre-fusion pass, after any pass already set (idempotent)."""
    current = inductor_config._pre_fusion_custom_pass
    if isinstance(current, AlignLoopOrders):
        return
    inductor_config._pre_fusion_custom_pass = AlignLoopOrders(current)


__all__ = ["AlignLoopOrders", "align", "install"]
