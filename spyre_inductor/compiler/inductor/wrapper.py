"""The Python wrapper Inductor generates for graphs that touch spyre.

Inductor's own wrapper already allocates buffers, calls extern kernels and
frees; what it does not know is how to launch a spyre kernel. Two kinds of
kernel reach it from SpyreScheduling, each defined once at module level and
called where the schedule puts it:

- a compiled dataflow program: ``name = prepare_kernel(<artifact dir>)``
  (parse, validate, allocate and transfer the program, once per loaded
  module) and per call ``launch_jobplan(name, [buffers])`` on the current
  stream, buffers in the kernel IR's buffer order;
- a CPU fallback (see host_kernel.py): a plain Python function over the
  buffers, called like any other function.

Both go through the wrapper's line machinery (``define_kernel``, ``writeline``,
custom ``WrapperLine``s); the generated code is never edited as text.

Extern kernels and fallback ops (``extern_kernels.convolution``, an aten op
Inductor cannot lower, a custom op) return a tensor the op computed itself:
on spyre through the device's eager kernels or its CPU fallback, which keep
whatever layout the CPU kernel chose. The graph was traced with the layout
the op's meta promised, and everything after it (``assert_size_stride``, the
programs reading the buffer with those strides) relies on it; the two differ,
e.g. a CPU convolution keeps a channels-last input's layout where the meta
for an unknown device says contiguous. So every such result is put into the
traced layout right where it is produced (launcher/host.with_traced_layout:
the tensor itself when its strides already agree, else a copy).
"""

from __future__ import annotations

import dataclasses
import json

from torch._inductor import config, ir
from torch._inductor.codegen.wrapper import (
    PythonWrapperCodegen,
    SubgraphPythonWrapperCodegen,
    WrapperLine,
)
from torch._inductor.utils import IndentedBuffer
from torch._inductor.virtualized import V

from ..core.emit import brief

LAUNCH_IMPORT = "from spyre_runtime.launch import launch_jobplan"
PREPARE_IMPORT = "from spyre_runtime.prepare import prepare_kernel"
BUCKETED_IMPORT = "from spyre_inductor.launcher.bucketed import launch_bucketed, prepare_bucketed"
BUCKETS_IMPORT = "from spyre_inductor.compiler.inductor.buckets import BUCKETS"  # (the launcher asks it)
HOST_IMPORT = "from spyre_inductor.launcher import host as spyre_host"
# Layouts that describe another buffer's memory (a view into it, a mutation of it).
_NOT_OWN_LAYOUT = (ir.NonOwningLayout, ir.MutationLayoutSHOULDREMOVE)


@dataclasses.dataclass
class HostKernelDefinitionLine(WrapperLine):
    """Puts a fallback kernel's ``def`` in the module header when lines are generated."""

    wrapper: PythonWrapperCodegen
    source: str

    def codegen(self, code: IndentedBuffer) -> None:
        self.wrapper.header.splice("\n\n" + self.source)


class SpyreWrapperMixin:
    """What SpyreScheduling asks of the wrapper; shared by the graph and subgraph wrappers."""

    def _definitions(self) -> PythonWrapperCodegen:
        # Kernels live in the root module's header, even when a subgraph (cond,
        # while_loop) calls them: one prepare per artifact per module.
        root = self.get_root_graph() if isinstance(self, SubgraphPythonWrapperCodegen) else self
        if not hasattr(root, "spyre_plans"):
            root.spyre_plans = {}
        return root

    def define_spyre_kernel(self, artifact_dir: str, device_index: int, comment: str, bucketed: bool = False,
                            exact=None) -> str:
        """The module-level name of the plan for `artifact_dir` on spyre:`device_index` (defined once).

        prepare_kernel places the program on one device, so a graph on
        spyre:1 gets its own plan there (and launch_jobplan checks the buffers
        are on it). A kernel over symbolic sizes (`bucketed`, issue 18) gets a
        launcher.bucketed.BucketedPlan: the artifact of its bucket, and of any other bucket a call needs; one
        specialized per value of some sizes (`exact`, a symbolic.exact.Template, issue 29) carries
        the template that makes the kernel of another value."""
        root = self._definitions()
        doc = json.dumps(exact.to_doc(), separators=(",", ":")) if exact is not None else None
        key = (artifact_dir, device_index, doc)
        name = root.spyre_plans.get(key)
        if name is None:
            name = f"spyre_plan_{root.next_kernel_suffix()}"
            root.spyre_plans[key] = name
            for line in (BUCKETED_IMPORT, BUCKETS_IMPORT) if bucketed else (LAUNCH_IMPORT, PREPARE_IMPORT):
                root.add_import_once(line)
            prepare = "prepare_bucketed" if bucketed else "prepare_kernel"
            hooks = ", hooks=BUCKETS" if bucketed else ""
            template = f", exact={doc!r}" if doc is not None else ""
            # (the plan's brief and its program's head, as Inductor shows a Triton kernel's source:
            # TORCH_LOGS=output_code prints them with the wrapper)
            comment = "\n".join([comment] + [f"#   {line}" for line in brief(artifact_dir)])
            root.define_kernel(name, f"{prepare}({artifact_dir!r}, device={device_index}{hooks}{template})",
                               metadata=comment, gpu=False)
        return name

    def call_spyre_kernel(self, plan_name: str, args: list[str], sizes=()) -> None:
        if sizes:  # the size symbols are in scope in the generated call (Inductor binds them)
            self.writeline(f"launch_bucketed({plan_name}, [{', '.join(args)}], ({', '.join(sizes)},))")
        else:
            self.writeline(f"launch_jobplan({plan_name}, [{', '.join(args)}])")

    def new_kernel_name(self, hint: str) -> str:
        return f"{hint}_{self._definitions().next_kernel_suffix()}"

    def define_host_kernel(self, source: str) -> None:
        """Define a CPU fallback kernel (its ``def`` source) at module level."""
        root = self._definitions()
        root.add_import_once(HOST_IMPORT)
        root.writeline(HostKernelDefinitionLine(root, source))

    def call_host_kernel(self, name: str, args: list[str]) -> None:
        self.writeline(f"{name}({', '.join(args)})")

    # ---- results that extern kernels and fallback ops allocate themselves ---------------

    def _generate_extern_kernel_alloc_helper(self, extern_kernel, args):
        # ExternKernelAlloc (convolution...) and FallbackKernel: ``buf = kernel(args)``.
        super()._generate_extern_kernel_alloc_helper(extern_kernel, args)
        self.codegen_traced_layout(extern_kernel)

    def codegen_multi_output(self, node):
        # ``buf = fallback_result[i]``: one output of a multi-output fallback (max_pool2d_with_indices...).
        super().codegen_multi_output(node)
        self.codegen_traced_layout(node)

    def generate_fallback_kernel_with_runtime_lookup(self, buf_name, python_kernel_name, get_args, op_overload,
                                                     raw_args, outputs):
        super().generate_fallback_kernel_with_runtime_lookup(buf_name, python_kernel_name, get_args, op_overload,
                                                             raw_args, outputs)
        node = V.graph.try_get_buffer(buf_name)
        if node is not None:
            self.codegen_traced_layout(node)

    def codegen_traced_layout(self, node) -> None:
        """After the line that binds `node`'s result: rebind it in the layout the graph was traced with
        (a spyre tensor with a fixed layout only; a mutation or a view into another buffer is
        the other buffer's layout, and CPU results are Inductor's own business)."""
        layout = node.get_output_spec()
        if not isinstance(layout, ir.Layout) or isinstance(layout, _NOT_OWN_LAYOUT):
            return
        if layout.device is None or layout.device.type != "spyre":
            return
        name = node.get_name()
        size = self.codegen_python_shape_tuple(layout.size)
        stride = self.codegen_python_shape_tuple(layout.stride)
        self._definitions().add_import_once(HOST_IMPORT)
        self.writeline(f"{name} = spyre_host.with_traced_layout({name}, {size}, {stride})")

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        # Inductor allocates on "other" devices by type only (device='spyre'),
        # relying on a device guard that non-GPU devices do not get: a graph on
        # spyre:1 would allocate its buffers on spyre:0. Name the index.
        if device.type != "spyre" or device.index is None or config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        allocation_shape = shape if allocation_shape is None else allocation_shape
        size, strides = self.codegen_python_shape_tuple(allocation_shape), self.codegen_python_shape_tuple(stride)
        line = f"{name} = empty_strided({size}, {strides}, device='spyre:{device.index}', dtype={dtype})"
        view = self.codegen_python_shape_tuple(shape)
        if view != size:
            line += f".as_strided({view}, {strides})"
        return line


class SpyrePythonWrapperCodegen(SpyreWrapperMixin, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        # Inductor calls create() on the registered class; without this
        # override the base class would be instantiated instead.
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return SpyreSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return SpyrePythonWrapperCodegen()


class SpyreSubgraphWrapperCodegen(SpyreWrapperMixin, SubgraphPythonWrapperCodegen):
    pass


class NoWrapper:
    """Fills the C++ and FX wrapper slots: spyre has neither. Using one
    (``cpp_wrapper=True`` / ``fx_wrapper=True`` on a spyre graph) says why.

    It is falsy on purpose. Inductor's lazy registration reads the four
    ``torch.spyre`` names and, when the Python and C++ wrappers are truthy,
    registers them itself WITHOUT a custom pass, overwriting ours (the one
    that puts our version into the FX graph cache key). Reading the first
    name has already run registration.register(), which registered
    everything with that pass; a falsy C++ wrapper makes Inductor leave it be.
    """

    supports_caching = False

    def __init__(self, kind: str):
        self.kind = kind

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<spyre has no {self.kind} wrapper>"

    def create(self, *args, **kwargs):
        raise NotImplementedError(
            f"spyre: the {self.kind} wrapper is not supported; compile spyre graphs with the "
            f"default Python wrapper (torch._inductor.config.{self.kind}_wrapper=False)"
        )

    __call__ = create


SpyreCppWrapperCodegen = NoWrapper("cpp")
SpyreWrapperFxCodegen = NoWrapper("fx")
