"""The compiler's layers (docs/compiler_layers.md), pinned over every import, module-level and
function-level alike (read from the source: tests/import_graph.py).

Bottom to top: the kernel IR (compiler/ir); what generated code calls at run time
(spyre_inductor/launcher: it knows the kernel IR an artifact keeps, never the compiler); symbolic
sizes at planning and the planner core (compiler/symbolic/planning.py and reduce.py,
compiler/core); the kernel families (compiler/families/<name>); the planner's entry
(compiler/backend.py); and the Inductor-facing glue (compiler/inductor, compiler/config.py,
symbolic sizes at capture). A module may import its own layer and the ones below, never one
above, and no import cycle closes anywhere in the compiler or the launcher.
"""

from __future__ import annotations

import subprocess
import sys

import import_graph

C = "spyre_inductor.compiler"
LAYERS = [  # (rank, module prefixes), bottom first
    (0, [f"{C}.ir"]),
    (1, ["spyre_inductor.launcher"]),
    (2, [f"{C}.symbolic.planning", f"{C}.symbolic.reduce", f"{C}.core"]),
    (3, [f"{C}.families"]),
    (4, [f"{C}.backend"]),
    (5, [f"{C}.inductor", f"{C}.config", f"{C}.symbolic.capture", f"{C}.symbolic.exact"]),
]
PACKAGES = {C, f"{C}.symbolic"}  # (empty package modules: no layer of their own)


def rank(module: str) -> int | None:
    best = None
    for r, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (r, p)
    return None if best is None else best[0]


def _graph():
    g = import_graph.graph(C, "spyre_inductor")
    g.update(import_graph.graph("spyre_inductor.launcher", "spyre_inductor"))
    return g


def test_every_compiler_and_launcher_module_has_a_layer():
    assert [m for m in _graph() if rank(m) is None and m not in PACKAGES] == []


def test_no_module_imports_a_layer_above_its_own():
    g = _graph()
    upward = sorted(f"{m} (layer {rank(m)}) imports {d} (layer {rank(d)})" for m, deps in g.items() for d in deps
                    if rank(m) is not None and rank(d) is not None and rank(d) > rank(m))
    assert upward == [], "\n".join(upward)


def test_no_import_cycle_closes_in_the_compiler_or_the_launcher():
    assert import_graph.cycles(_graph()) == []


def test_the_launcher_knows_the_kernel_ir_of_the_compiler_and_nothing_else():
    g = import_graph.graph("spyre_inductor.launcher", "spyre_inductor")
    reach = {d for deps in g.values() for d in deps if d.startswith(C)}
    assert {d for d in reach if not d.startswith(f"{C}.ir")} == set()


def test_the_compiler_reads_the_artifact_format_without_the_launch_layer():
    g = import_graph.graph(C, "spyre_runtime")
    launch = sorted(f"{m} imports {d}" for m, deps in g.items() for d in deps
                    if d in ("spyre_runtime.launch", "spyre_runtime.prepare"))
    assert launch == [], launch


def test_the_family_registry_lists_every_family_in_dispatch_order():
    from spyre_inductor.compiler import backend  # noqa: F401 - registers the families
    from spyre_inductor.compiler.core.family import FAMILIES

    assert [f.name for f in FAMILIES] == ["attention", "sort", "experts", "indirect", "conv", "matmul", "reduction",
                                         "pointwise"]


def test_importing_the_planner_entry_does_not_load_inductors_glue():
    """Importing the planner entry loads the core and the families (every family: a kernel goes to
    the first that claims it), not Inductor's glue."""
    code = ("import sys; import spyre_inductor.compiler.backend; "
            "print(sorted(m for m in sys.modules if m.startswith('spyre_inductor.compiler.inductor')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_below_the_glue_nothing_imports_inductor_or_dynamo():
    """The kernel IR, the planner core, the families and the planner entry plan from kernel IR
    alone: Inductor's scheduler nodes and sympy indexing stay in the glue (capture)."""
    import ast

    found = []
    for module, path in import_graph.modules(C).items():
        if rank(module) is None or rank(module) >= 5:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{module} imports {n}" for n in names if n.startswith(("torch._inductor", "torch._dynamo"))]
    assert found == []


def test_a_family_imports_no_other_familys_modules():
    """What two families share lives in the core (the transfers in pieces every family's codegen
    moves its tiles with: core/transfers.py). The one exception, named here: conv2d is the matmul
    family's PE plan with its A tiles gathered from the image (an implicit GEMM)."""
    M = f"{C}.families.matmul"
    allowed = {(f"{C}.families.convolution.lowering", f"{M}.lowering"),
               (f"{C}.families.convolution.codegen", f"{M}.codegen"),
               (f"{C}.families.convolution.plan", f"{M}.codegen"),
               (f"{C}.families.convolution.plan", f"{M}.plan"),
               (f"{C}.families.convolution.plan", f"{M}.planner")}

    def family(module):  # (a family's package itself too: `from .. import matmul`)
        parts = module.split(".")
        return parts[3] if len(parts) > 3 and parts[2] == "families" else None

    g = import_graph.graph(f"{C}.families", "spyre_inductor")
    across = sorted((m, d) for m, deps in g.items() for d in deps
                    if family(m) and family(d) and family(m) != family(d) and (m, d) not in allowed)
    assert across == []


def test_the_runtime_queue_and_launch_layer_close_no_import_cycle():
    """The queue layer is one concept per module (tickets, poison, the stream graph, submission,
    workers, delivery) and the launch layer four (artifact, prepare, launch, direct): none imports
    back a module that imports it."""
    g = import_graph.graph("spyre_runtime", "spyre_runtime")
    layer = {m: deps for m, deps in g.items()
             if m.startswith("spyre_runtime.queue") or m.rpartition(".")[2] in ("artifact", "prepare", "launch", "direct")}
    assert import_graph.cycles(layer) == []
