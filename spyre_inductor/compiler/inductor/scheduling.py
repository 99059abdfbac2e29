"""SpyreScheduling: Inductor's per-device code generator for spyre.

Inductor's scheduler decides the order of nodes and asks us which pairs may
fuse; for each (fused) node it then asks us for code. Our answers:

- Fusion: scheduler nodes fuse (vertically or horizontally) when the merged
  group still captures into ONE kernel (capture.py: common ranges, affine
  indices, intermediates forwarded on chip). That covers pointwise chains,
  a pointwise prologue into a reduction, several reductions with the same
  (outer, reduced) sizes, and pointwise epilogues after them over the whole
  space or the outer space: softmax, layer_norm, var... become one kernel.
  Extern kernels and templates never fuse here.
- Code: a group that captures and compiles becomes a dataflow program
  (backend.compile_kernel -> artifact directory) that the wrapper prepares
  once and launches per call. Anything else becomes a CPU fallback kernel
  inside the graph (host_kernel.py), which warns when it first runs in a process
  (launcher/fallback_policy.py; an error at compile time under SPYRE_STRICT=1).

Extern kernels (``extern_kernels.mm``...) and Inductor's FallbackKernels are
emitted by Inductor itself; on spyre tensors they run through the eager
device's kernels or its CPU fallback.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch._inductor import ir
from torch._inductor.codegen.common import BackendFeature
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.scheduler import BaseScheduling, SchedulerNode
from torch._inductor.utils import sympy_product
from torch._inductor.virtualized import V
from torch.utils._ordered_set import OrderedSet

from spyre_runtime.artifact import collect

from .. import families  # noqa: F401 - registers every kernel family: fusion asks them all
from ..core.emit import brief, note_source
from ..core.family import fusion_vetoed
from ..symbolic import capture as symbolic_capture
from .capture import Capture, capture
from ..ir.errors import Unsupported
from ...launcher.fallback_policy import origin_ops, refuse_in_strict_mode
from .host_kernel import HostUnsupported, write_host_kernel
from ..ir.errors import NotCapturable
from ..ir.kernel_ir import Kernel
from .version import compiler_version
from ..ir.naming import content_name, positional_names

log = logging.getLogger(__name__)  # TORCH_LOGS="spyre": each kernel planned; "+spyre": more


@dataclass(frozen=True)
class KernelRecord:
    """What became of one scheduled (fused) node: its kernel IR if it captured (with Inductor's
    buffer names; its artifact was compiled from the same kernel with the buffers named by
    position, positional_names), its artifact if it compiled, else why it runs on the CPU."""

    nodes: tuple[str, ...]
    ops: str
    kernel: Kernel | None
    artifact: Path | None
    fallback_reason: str | None


_recorders: list[list[KernelRecord]] = []


@contextlib.contextmanager
def record_kernels():
    """``with record_kernels() as records:`` lists every node generated meanwhile
    (for tests and debugging; a compile served from the FX graph cache generates nothing)."""
    records: list[KernelRecord] = []
    _recorders.append(records)
    try:
        yield records
    finally:
        _recorders.remove(records)


def _record(nodes, kernel, artifact, reason) -> None:
    if _recorders or artifact is not None:
        record(tuple(n.get_name() for n in nodes), origin_ops(nodes), kernel, artifact, reason)


def record(names: tuple[str, ...], ops: str, kernel, artifact, reason) -> None:
    """One KernelRecord for every active recorder (a kernel that is not a scheduler node's:
    the fused attention, attention_node.py)."""
    if artifact is not None:
        note_source(artifact, ops)  # (what `spyre-inspect list` shows it came from)
        if log.isEnabledFor(logging.INFO):
            log.info("planned for %s: %s", ops, "\n  ".join(brief(artifact)[:3]))
        if torch._inductor.config.trace.enabled and getattr(V.debug, "_path", None):
            collect(artifact, V.debug.filename("spyre"))  # TORCH_COMPILE_DEBUG: beside Inductor's own
    entry = KernelRecord(tuple(names), ops, kernel, artifact, reason)
    for records in _recorders:
        records.append(entry)


def artifact_root() -> Path:
    """Where artifacts go: Inductor's cache dir, per compiler version (so a new
    compiler never picks up an old compiler's programs)."""
    return Path(cache_dir()) / "spyre" / compiler_version()


def _written_spans(node) -> list[tuple[str, object]]:
    """(the buffer whose memory it is, its element span or None) of each buffer a scheduler node
    writes: a cat's input computed into its slice of the cat (NonOwningLayout) is a span of the
    cat's buffer; None when the span is symbolic (or the node writes a buffer of its own)."""
    out = []
    for n in node.get_nodes():
        layout = n.node.get_layout()
        if not isinstance(layout, ir.NonOwningLayout):
            out.append((n.get_name(), None))
            continue
        view = layout.view.get_layout()
        try:
            lo = int(view.offset)
            hi = lo + sum((int(size) - 1) * int(stride) for size, stride in zip(view.size, view.stride))
            span = (lo, hi)
        except (TypeError, ValueError):  # symbolic sizes: assume the spans meet
            span = None
        out.append((layout.view.get_name(), span))
    return out


def _write_into_one_buffer(node1, node2) -> bool:
    """Two nodes computing slices of one buffer whose element spans interleave (a cat made by
    ConcatKernel along an inner dim: gpt-oss's rotary ``cat((first_, second_), -1)``) stay two
    programs: fused, one launch would write two outputs over the same bytes, which the launch
    refuses (partial sticks of one buffer from two outputs race on the card). Slices one after
    the other (a cat along the outermost dim) may fuse."""
    for base, span in _written_spans(node1):
        for other, other_span in _written_spans(node2):
            if base != other:
                continue
            if span is None or other_span is None or (span[0] <= other_span[1] and other_span[0] <= span[1]):
                return True
    return False


def compile_kernel(kernel: Kernel) -> tuple[Path | None, str | None]:
    """(artifact dir, None), or (None, why the backend cannot compile it)."""
    from .. import backend, config

    try:

        max_cores = None if config.max_cores == config.MAX_CORES else config.max_cores
        return Path(backend.compile_kernel(kernel, artifact_root(), max_cores=max_cores)), None
    except Unsupported as e:
        return None, f"backend: {e}"


def _sizes_key(node) -> tuple:
    return tuple(tuple(s) for s in node.get_ranges()) if isinstance(node, SchedulerNode) else ()


class SpyreScheduling(BaseScheduling):
    def __init__(self, scheduler):
        super().__init__(scheduler)
        # Fusion asks about the same groups many times; capture each once.
        self._captures: dict[tuple[str, ...], Capture | NotCapturable] = {}

    def get_backend_features(self, device) -> OrderedSet[BackendFeature]:
        # A reduction stays one node (one kernel, or one CPU fallback) instead
        # of Inductor's split into two. SCAN: cumsum/cumprod/logcumsumexp become
        # Scan nodes we capture or run as in-graph CPU kernels, not aten
        # fallbacks (multi-output scans, cummax/cummin, still fall back to aten:
        # no TUPLE_REDUCTION).
        return OrderedSet([BackendFeature.REDUCE_TO_SINGLE_ELEMENT, BackendFeature.SCAN])

    def group_fn(self, sizes):
        # SIMD-style (numel, rnumel): the scheduler's other heuristics expect it.
        return tuple(V.graph.sizevars.simplify(sympy_product(s)) for s in sizes)

    # ---- fusion --------------------------------------------------------------------

    def try_capture(self, nodes) -> Capture | NotCapturable:
        # By node and loop sizes: the scheduler (and loop_order.py) may reorder a node's loops
        # while it asks, and a group captures over the loops its nodes have.
        key = tuple((n.get_name(), _sizes_key(n)) for n in nodes)
        found = self._captures.get(key)
        if found is None:
            try:
                found = capture(nodes)
            except NotCapturable as e:
                found = e
            # Anything else is a capture bug: it raises (DESIGN: a compiler bug must surface,
            # not turn into a quiet CPU fallback that no test notices).
            self._captures[key] = found
        return found

    def _can_fuse(self, node1, node2) -> bool:
        # The scheduler has already checked dependencies and order; what is left
        # is whether the merged group is still ONE kernel of our IR.
        nodes = [*node1.get_nodes(), *node2.get_nodes()]
        if not all(isinstance(n, SchedulerNode) for n in nodes):
            return False
        if _write_into_one_buffer(node1, node2):
            return False
        found = self.try_capture(nodes)
        if not isinstance(found, Capture):
            return False

        def alone():  # (each part's own kernel, captured only when a family asks)
            for part in (node1, node2):
                captured = self.try_capture(list(part.get_nodes()))
                yield captured.kernel if isinstance(captured, Capture) else None

        # each family vetoes what it would refuse or plan far worse fused (core/family.py)
        return not fusion_vetoed(found.kernel, alone)

    def can_fuse_vertical(self, node1, node2) -> bool:
        return self._can_fuse(node1, node2)

    def can_fuse_horizontal(self, node1, node2) -> bool:
        return self._can_fuse(node1, node2)

    # ---- code ----------------------------------------------------------------------

    def codegen_node(self, node) -> None:
        nodes = list(node.get_nodes())
        result = self.try_capture(nodes)
        if getattr(result, "guardable", False):  # (symbolic_capture.GUARDS: sizes specialized by a guard, last)
            token = symbolic_capture.GUARDS.set(True)
            try:
                result = capture(nodes)
            except NotCapturable as e:
                result = e
            finally:
                symbolic_capture.GUARDS.reset(token)
        kernel = None
        if isinstance(result, Capture):
            if result.kernel is None:  # no elements, or nothing leaves the kernel
                _record(nodes, None, None, None)
                self._finish(nodes, result.removed)
                return
            program = content_name(positional_names(result.kernel))  # what the artifact is compiled from
            kernel = replace(result.kernel, name=program.name)  # (Inductor's buffer names: the record's)
            artifact, reason = compile_kernel(program)
            if artifact is not None:
                _record(nodes, kernel, artifact, None)
                self._emit_program(nodes, kernel, artifact, result)
                return
        else:
            reason = result.reason
        _record(nodes, kernel, None, reason)
        self._emit_cpu_fallback(nodes, reason)

    def _emit_program(self, nodes, kernel: Kernel, artifact: Path, captured: Capture) -> None:
        wrapper = V.graph.wrapper_code
        args = [b.name for b in kernel.buffers]  # the artifact's b0, b1, ... (positional_names)
        comment = f"# {kernel.name}: {origin_ops(nodes)} over {kernel.ranges}"
        device = nodes[0].get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        # (the bucket's size, then those specialized per value: launcher.bucketed.launch_bucketed's order)
        sizes = [n for n, _, _ in kernel.symbolic.sizes] if kernel.symbolic is not None else []
        sizes += list(captured.exact)
        plan = wrapper.define_spyre_kernel(str(artifact), index, comment, bucketed=bool(sizes),
                                           exact=captured.template)
        V.graph.removed_buffers |= captured.removed  # before mark_run: never allocated
        for n in nodes:
            n.mark_run()  # allocates outputs; FusedSchedulerNode.mark_run itself crashes
        wrapper.call_spyre_kernel(plan, args, sizes)
        self.free_buffers_in_scheduler()

    def _emit_cpu_fallback(self, nodes, reason: str) -> None:
        label = origin_ops(nodes)
        refuse_in_strict_mode(label, reason)
        wrapper = V.graph.wrapper_code
        name = wrapper.new_kernel_name("spyre_cpu_kernel")
        try:
            source, args = write_host_kernel(nodes, name, label, reason)
        except HostUnsupported as e:
            raise NotImplementedError(
                f"spyre: {label} can neither be compiled for spyre ({reason}) nor run by the "
                f"CPU fallback ({e})"
            ) from e
        wrapper.define_host_kernel(source)
        for n in nodes:
            n.mark_run()
        wrapper.call_host_kernel(name, args)
        self.free_buffers_in_scheduler()

    def _finish(self, nodes, removed) -> None:
        V.graph.removed_buffers |= removed
        for n in nodes:
            n.mark_run()
        self.free_buffers_in_scheduler()

    # ---- the rest of BaseScheduling's contract -------------------------------------------

    def codegen_template(self, template_node, epilogue_nodes, prologue_nodes):
        raise NotImplementedError("spyre has no kernel templates")

    def codegen_sync(self) -> None:
        # Kernels are ordered on the current stream; a debug sync waits for them.
        V.graph.wrapper_code.writeline("torch.spyre.synchronize()")

    def flush(self) -> None:
        # Each kernel is written out as soon as it is generated; nothing is pending.
        pass

    def ready_to_flush(self) -> bool:
        return False

    def benchmark_fused_nodes(self, nodes):
        # Asked only when benchmark_fusion is on; we have no timing to offer here.
        return 0.0, ""
