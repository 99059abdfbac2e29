"""Whole models on spyre: `.venv/bin/python benchmarks/models.py [--quick] [--profile] [--repeats N] [--compile-only]`.

The reference models of spyre_inductor/testing/models.py (small configs, random weights, fp16),
compiled under SPYRE_STRICT=1 (no CPU fallback anywhere). Tables:

* compile time: the Llama-style decoder (2 layers, prefill of 128 tokens, fp16), the first call
  beyond a warm call with Inductor's caches off and dynamo reset before each compile, on spyre
  and with Inductor's CPU backend compiling the same model in the same run (the best of
  --repeats, 3 by default, the two alternating: the machine is shared); target: spyre at most
  half of Inductor CPU's.
  `--profile` adds where spyre's compile goes (cProfile, cumulative: inflated by the profiler,
  read the shares);
* programs per decoder layer: programs of 2 layers minus those of 1 layer, at prefill 128 and
  decode 1 (caches of 128 and 1024); per call of the 2-layer model: programs launched, simulated
  us, the sum of the kernels' rooflines (each kernel's minimum bytes at the pure-stream bandwidth,
  or its FLOPs at the matrix rate) and their ratio;
* per kernel, prefill 128 and decode 1 (cache 1024): the 2-layer model's programs (launches of one
  program summed), simulated us and share of the call, roofline, efficiency, refetch, and the
  aten ops it came from;
* whole models (not with --quick): Llama prefill and decode, GPT-2 and BERT at 128 tokens: programs,
  simulated us, roofline, max |spyre - cpu fp32| over the output's scale;
* transformers' own model classes (not with --quick; `--transformers [NAME ...]` for this table
  alone): a row per model, benchmarks/_transformers.py.

Host ms per step (both tables): the best of 5 warm calls of the 2-layer model, call to
synchronize: the launches and the simulator running them (the machine's time, not the card's).
"""

from __future__ import annotations

import argparse
import cProfile
import collections
import os
import pstats
import time
import warnings

import torch

from _bench import print_table
from _compiled import _warm_up, compile_seconds

from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.testing import models

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")
warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")

DTYPE = torch.float16


def _to(a, device):
    if isinstance(a, torch.Tensor):
        return a.to(device)
    return [t.to(device) for t in a] if isinstance(a, list) else a


def _dtype(a, dtype):
    if isinstance(a, torch.Tensor):
        return a.to(dtype) if a.is_floating_point() else a
    return [t.to(dtype) for t in a] if isinstance(a, list) else a


def llama(n_layers=2, seq=128, cache_len=128):
    model = models.build(models.llama_config(n_layers=n_layers), dtype=DTYPE)
    return model, models.llama_inputs(model, seq=seq, cache_len=cache_len)


def compile_and_run(model, inputs, host_repeats: int = 5):
    """(records, output, reports of one warm call, host ms per call) of `model` compiled on spyre,
    caches off. Host ms: the best of `host_repeats` warm calls, call to synchronize (the launches
    and the simulator running them; each kernel was prepared once)."""
    args = [_to(a, "spyre") for a in inputs]
    torch._dynamo.reset()
    with torch.no_grad(), record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(model.to("spyre"))
        compiled(*args)
        torch.spyre.synchronize()
        torch.spyre.reset_kernel_reports()
        out = compiled(*args)
        torch.spyre.synchronize()
        reports = torch.spyre.kernel_reports()
        host = float("inf")
        for _ in range(host_repeats):
            start = time.perf_counter()
            compiled(*args)
            torch.spyre.synchronize()
            host = min(host, time.perf_counter() - start)
    return records, out, reports, host * 1e3


# ---- compile time ------------------------------------------------------------------------------------

def compile_time(repeats: int) -> dict:
    rows, seconds = [], {"spyre": float("inf"), "cpu": float("inf")}
    for _ in range(repeats):  # the two backends alternate: a busy spell of the shared machine hits both
        for device in ("spyre", "cpu"):
            model, inputs = llama()
            with torch.no_grad():
                s, _ = compile_seconds(model.to(device), *[_to(a, device) for a in inputs])
            seconds[device] = min(seconds[device], s)
    rows.append(["Llama 2 layers, prefill 128, fp16", seconds["spyre"], seconds["cpu"],
                 seconds["spyre"] / seconds["cpu"]])
    print_table("Compile time (caches off, dynamo reset; first call beyond a warm call; target: spyre <= 0.5 x "
                "Inductor CPU)", ["model", "spyre s", "inductor cpu s", "spyre / cpu"], rows)
    return seconds


PHASES = [  # (label, (file suffix, function name)) of the functions whose cumulative time is shown
    ("capture (fusion decisions and codegen)", ("compiler/inductor/scheduling.py", "try_capture")),
    ("planning (plan_kernel: passes, candidate search)", ("compiler/backend.py", "plan_kernel")),
    ("  timing-model replays of candidates", ("program/timing.py", "estimate")),
    ("  validation of kept programs", ("program/validate.py", "validate")),
    ("emission (write_artifact)", ("compiler/core/emit.py", "write_artifact")),
    ("prepare_kernel (module load)", ("spyre_runtime/prepare.py", "prepare_kernel")),
]


def profile_compile() -> None:
    model, inputs = llama()
    args = [_to(a, "spyre") for a in inputs]
    profiler = cProfile.Profile()
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(model.to("spyre"))
        profiler.enable()
        compiled(*args)
        torch.spyre.synchronize()
        profiler.disable()
    stats = pstats.Stats(profiler).stats
    total = sum(v[2] for v in stats.values())  # every function's own time: the whole profile

    def cumulative(suffix, name):
        return sum(v[3] for (path, _, fn), v in stats.items() if fn == name and path.endswith(suffix))

    rows = [[label, cumulative(*key), cumulative(*key) / total] for label, key in PHASES]
    rows.append(["everything (dynamo, AOT, Inductor, ours, the first run)", total, 1.0])
    print_table("Where spyre's compile goes (cProfile cumulative s, profiler-inflated)", ["phase", "s", "share"],
                rows)


# ---- programs per layer and per kernel ------------------------------------------------------------

def _what(ops: str) -> str:
    names = [op.split(".")[1] for op in ops.split(", ") if op.count(".") >= 1]
    keep = [n for n in names if n not in ("permute", "reshape", "view", "expand", "unsqueeze", "clone",
                                          "convert_element_type", "slice")]
    text = ", ".join(keep or names)
    return text if len(text) <= 60 else text[:57] + "..."


def per_layer_table(cases) -> dict:
    rows, details = [], {}
    for label, seq, cache_len in cases:
        counts = {}
        for n_layers in (1, 2):
            records, _, reports, host = compile_and_run(*llama(n_layers, seq, cache_len))
            assert all(r.artifact is not None for r in records if r.kernel is not None), "a CPU fallback"
            counts[n_layers] = len(records)
        sim = sum(r.simulated_ns for r in reports) / 1e3
        roof = sum(r.roofline_ns for r in reports) / 1e3
        rows.append([label, counts[2] - counts[1], counts[2], len(reports), sim, roof, roof / sim, host])
        details[label] = (records, reports)
    print_table("Llama-style decoder (fp16, explicit attention): programs per decoder layer, and one call of "
                "2 layers", ["case", "programs/layer", "programs (2 layers)", "launches", "simulated us",
                             "sum of rooflines us", "roofline / simulated", "host ms per step"], rows)
    return details


def kernel_table(label, records, reports) -> None:
    what = {r.kernel.name: _what(r.ops) for r in records if r.kernel is not None}
    by_name = collections.OrderedDict()
    for r in reports:
        by_name.setdefault(r.name, []).append(r)
    total = sum(r.simulated_ns for r in reports)
    rows = []
    for name, rs in sorted(by_name.items(), key=lambda kv: -sum(r.simulated_ns for r in kv[1])):
        sim = sum(r.simulated_ns for r in rs)
        roof = sum(r.roofline_ns for r in rs)
        refetch = rs[0].refetch
        rows.append([name, what.get(name, "?"), len(rs), rs[0].cores_used, sim / 1e3, sim / total, roof / 1e3,
                     roof / sim if sim else 0.0, refetch if refetch is not None else "-"])
    rows.append(["total", "", len(reports), "", total / 1e3, 1.0, sum(r.roofline_ns for r in reports) / 1e3,
                 sum(r.roofline_ns for r in reports) / total, ""])
    print_table(f"Per kernel: Llama 2 layers, {label} (fp16)", ["kernel", "ops", "launches", "cores",
                "simulated us", "share", "roofline us", "efficiency", "refetch"], rows)


# ---- whole models ---------------------------------------------------------------------------------

def whole_models() -> None:
    rows = []
    gpt2, bert = models.gpt2_config(), models.bert_config()
    cases = [
        ("Llama prefill 128", lambda: llama(2, 128, 128)),
        ("Llama decode 1, cache 1024", lambda: llama(2, 1, 1024)),
        ("GPT-2 2x128", lambda: (models.build(gpt2, dtype=DTYPE), models.gpt2_inputs(gpt2))),
        ("BERT 2x128 (padded)", lambda: (models.build(bert, dtype=DTYPE), models.bert_inputs(bert))),
    ]
    for label, make in cases:
        model, inputs = make()
        reference = models.fp32_copy(model)
        with torch.no_grad():
            want = reference(*[_dtype(a, torch.float32) for a in inputs])
        records, out, reports, host = compile_and_run(model, [_dtype(a, DTYPE) for a in inputs])
        sim = sum(r.simulated_ns for r in reports) / 1e3
        roof = sum(r.roofline_ns for r in reports) / 1e3
        err = (out.cpu().float() - want).abs().max().item() / want.abs().max().item()
        rows.append([label, len(records), len(reports), sim, roof, roof / sim, err / 2 ** -11, host])
    print_table("Whole models under SPYRE_STRICT=1 (fp16, explicit attention)",
                ["model", "programs", "launches", "simulated us", "sum of rooflines us", "roofline / simulated",
                 "max err / (2^-11 scale)", "host ms per step"], rows)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--quick", action="store_true",
                        help="the Llama-style tables only, prefill 128 and decode with a cache of 1024")
    parser.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="compiles per backend for the compile-time table (the best is kept; default 3)")
    parser.add_argument("--profile", action="store_true", help="add where spyre's compile goes (cProfile)")
    parser.add_argument("--compile-only", action="store_true", help="stop after the compile-time table")
    parser.add_argument("--transformers", nargs="*", metavar="NAME",
                        help="only the table of transformers' own models (all, or the NAMEs given)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.transformers is not None:
        from _transformers import transformers_table
        transformers_table(args.transformers or None)
        return
    for device in ("spyre", "cpu"):
        _warm_up(device)  # (its throwaway function makes a spyre tensor eagerly: before strict mode)
    os.environ["SPYRE_STRICT"] = "1"
    try:
        compile_time(args.repeats)
        if args.profile:
            profile_compile()
        if args.compile_only:
            return
        cases = [("prefill 128, cache 128", 128, 128), ("decode 1, cache 128", 1, 128),
                 ("decode 1, cache 1024", 1, 1024)]
        details = per_layer_table(cases if not args.quick else [cases[0], cases[2]])
        for label in ("prefill 128, cache 128", "decode 1, cache 1024"):
            kernel_table(label, *details[label])
        if not args.quick:
            whole_models()
    finally:
        del os.environ["SPYRE_STRICT"]
    if not args.quick:
        from _transformers import transformers_table
        transformers_table()


if __name__ == "__main__":
    main()
