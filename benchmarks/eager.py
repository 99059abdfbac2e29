"""Compile-backed eager ops (issue 19): first-call compile time and warm per-call host time.

Tables, one run (the machines are shared and noisy: compare rows of one run, not runs):

* first call: each op of a supported set (pointwise, reductions, scans, matmuls, data movement,
  fills and casting copies) called once on fresh 64 x 64 shapes, with Inductor's caches in a
  fresh directory (nothing reused from disk): median, 90th percentile and maximum of the first
  call (trace + Inductor compile + plan + prepare + launch) and of the Inductor compile alone;
* warm per call, 64 x 64 fp32 (CPU eager in one intra-op thread): `add`, `mm`, `softmax` and a fused `linear` (x @ W.t() + b: one
  addmm program) on spyre through the compiled path, against CPU eager and against the CPU
  fallback (SPYRE_EAGER_COMPILE=0's path, the one before issue 19). Each figure is the median
  host time of one call with the device held behind a gate (launches queue and are run after
  the timed calls: the simulator shares this process's GIL, a card would not), and the same
  call's wall time with the device idle before it. Beside it the split
  of the compiled call: the eager layer (bind, key, cache lookup), Inductor's wrapper (the
  generated `call`: size asserts, output allocation) and `launch_jobplan` itself, the launch
  layer's (another branch is rewriting it). Target: <= 100 us per small op.
  The scalar rows (`x + 2.0`, `x * 0.5`, and `x + v` with a new v per call) time a Python scalar
  that travels at launch (issue 19: one compile, the value carried in the correction area).

`--repeats N` (default 300). `--scalars-by-value`: key scalars on their value, as before issue 19
(the row with a new value per call is left out then: each call would compile).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings

# Inductor's caches (FX graph cache, our artifacts under its cache dir) in a fresh directory, so
# first calls compile for real. Set before torch (and Inductor's config) is imported.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="spyre-eager-bench-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _bench import print_table  # noqa: E402

warnings.filterwarnings("ignore")


def _first_call_cases(spyre):
    """(name, fn) over fresh 64 x 64 inputs: each a first call of its op."""
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype).to(spyre)

    x, y, ids = t(64, 64), t(64, 64), torch.randint(0, 64, (64,), generator=g).to(spyre)
    mask = (torch.randn(64, 64, generator=g) > 0).to(spyre)
    return [
        ("add", lambda: x + y), ("mul", lambda: x * y), ("div", lambda: x / y), ("neg", lambda: -x),
        ("exp", lambda: torch.exp(x)), ("sigmoid", lambda: torch.sigmoid(x)), ("tanh", lambda: torch.tanh(x)),
        ("relu", lambda: torch.relu(x)), ("gelu", lambda: F.gelu(x)), ("silu", lambda: F.silu(x)),
        ("maximum", lambda: torch.maximum(x, y)), ("where", lambda: torch.where(mask, x, y)),
        ("lt", lambda: x < y), ("clamp", lambda: x.clamp(-1, 1)), ("addcmul", lambda: torch.addcmul(x, x, y)),
        ("sum", lambda: x.sum(-1)), ("mean", lambda: x.mean(0)), ("amax", lambda: x.amax(-1)),
        ("argmax", lambda: x.argmax(-1)), ("any", lambda: mask.any(-1)), ("var", lambda: x.var(-1)),
        ("softmax", lambda: torch.softmax(x, -1)), ("log_softmax", lambda: torch.log_softmax(x, -1)),
        ("cumsum", lambda: x.cumsum(-1)), ("layer_norm", lambda: F.layer_norm(x, (64,))),
        ("mm", lambda: x @ y), ("bmm", lambda: torch.bmm(x.view(4, 16, 64), y.view(4, 64, 16))),
        ("linear", lambda: F.linear(x, y, x[0])),
        ("cat", lambda: torch.cat([x, y])), ("index_select", lambda: x.index_select(0, ids)),
        ("embedding", lambda: F.embedding(ids, x)), ("gather", lambda: x.gather(1, ids.view(64, 1).expand(64, 4))),
        ("tril", lambda: x.tril()), ("fill (zeros)", lambda: torch.zeros(64, 64, device=spyre)),
        ("copy (to fp16)", lambda: x.half()), ("copy (transpose)", lambda: x.t().contiguous()),
        ("add_ (in place)", lambda: x.clone().add_(y)),
    ]


def first_call_table(spyre) -> dict:
    from spyre_inductor.eager.cache import CACHE

    rows, firsts, compiles = [], [], []
    start = time.perf_counter()
    torch.ones(1, device=spyre) * 1.5  # the process's first compiled op: imports and registers Inductor
    torch.spyre.synchronize()
    print(f"\nthe process's first eager op (imports Inductor, registers the backend): "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    for name, fn in _first_call_cases(spyre):
        torch.spyre.synchronize()
        before = CACHE.stats()
        start = time.perf_counter()
        fn()
        torch.spyre.synchronize()
        first = time.perf_counter() - start
        after = CACHE.stats()
        compiled = after.compiles - before.compiles
        compile_s = after.compile_seconds - before.compile_seconds
        firsts.append(first)
        if compiled:
            compiles.append(compile_s)
        rows.append([name, first * 1e3, compile_s * 1e3, compiled, after.cpu_routes - before.cpu_routes])

    def q(values, p):
        values = sorted(values)
        return values[min(len(values) - 1, int(p * len(values)))] * 1e3

    print_table("first call per op, 64 x 64 fp32, fresh caches (ms)",
                ["op", "first call", "Inductor compile", "compiles", "cpu routes"], rows)
    print_table("first call over the set (ms)", ["", "median", "p90", "max", "ops"],
                [["first call (trace + compile + prepare + launch)", statistics.median(firsts) * 1e3, q(firsts, 0.9),
                  max(firsts) * 1e3, len(firsts)],
                 ["  of which Inductor compile", statistics.median(compiles) * 1e3, q(compiles, 0.9),
                  max(compiles) * 1e3, len(compiles)]])
    return {"first_call_median_ms": statistics.median(firsts) * 1e3}


def _median_us(fn, repeats: int, sync, clock=time.perf_counter_ns) -> float:
    for _ in range(20):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        start = clock()
        fn()
        samples.append(clock() - start)
    sync()
    return statistics.median(samples) / 1e3


class _Gate:
    """Holds the current stream behind a host callback until released: launches made meanwhile
    only enqueue, and the simulated device (worker threads of this process, sharing the GIL)
    does not run them during the timed calls, as a card would not take the host's CPU."""

    def __enter__(self):
        from spyre_inductor.device import queues
        from spyre_runtime.queue import HostCallback

        self.open = threading.Event()
        queues.queue(0).enqueue(queues.current_stream(0),
                                HostCallback(lambda: self.open.wait(60), name="benchmark gate"))
        return self

    def __exit__(self, *exc):
        self.open.set()
        torch.spyre.synchronize()
        return False


def _gated_median_us(fn, repeats: int, batch: int = 25) -> float:
    """Median host us of fn() with the device held (its launches queued, not run)."""
    for _ in range(10):
        fn()
    torch.spyre.synchronize()
    samples = []
    while len(samples) < repeats:
        with _Gate():
            for _ in range(batch):
                start = time.perf_counter_ns()
                fn()
                samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e3


def _timed_split(fn, entry, repeats: int, sync) -> tuple[float, float, float]:
    """Medians (us) of one compiled call's parts: the eager layer (the whole call less the compiled
    graph's call), Inductor's wrapper (the graph's call less its launches) and launch_jobplan,
    measured with timers around entry.fn and the module's launch_jobplan (for this loop only)."""
    call = entry.fn.current_callable
    module = sys.modules[type(call.__self__).__module__]
    inner = {"launch": 0, "fn": 0}
    real_launch, real_fn = module.launch_jobplan, entry.fn

    def launch(*args):
        start = time.perf_counter_ns()
        try:
            return real_launch(*args)
        finally:
            inner["launch"] += time.perf_counter_ns() - start

    def graph(tensors):
        start = time.perf_counter_ns()
        try:
            return real_fn(tensors)
        finally:
            inner["fn"] += time.perf_counter_ns() - start

    module.launch_jobplan, entry.fn = launch, graph
    layer, wrapper, launches = [], [], []
    try:
        while len(layer) < repeats:
            with _Gate():
                for _ in range(25):
                    inner["launch"] = inner["fn"] = 0
                    start = time.perf_counter_ns()
                    fn()
                    total = time.perf_counter_ns() - start
                    layer.append(total - inner["fn"])
                    wrapper.append(inner["fn"] - inner["launch"])
                    launches.append(inner["launch"])
    finally:
        module.launch_jobplan, entry.fn = real_launch, real_fn
        sync()
    return tuple(statistics.median(v) / 1e3 for v in (layer, wrapper, launches))


def warm_table(spyre, repeats: int, scalars_by_value: bool = False) -> dict:
    from spyre_inductor import eager
    from spyre_inductor.eager.cache import CACHE
    from spyre_inductor.eager.launch import CompiledEntry

    g = torch.Generator().manual_seed(1)
    a, b, bias = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g), torch.randn(64, generator=g)
    x, y, sb = a.to(spyre), b.to(spyre), bias.to(spyre)
    cases = [
        ("add", lambda p, q, c: p + q),
        ("mm", lambda p, q, c: p @ q),
        ("softmax", lambda p, q, c: torch.softmax(p, -1)),
        ("linear (x @ W.t() + b: one addmm program)", lambda p, q, c: F.linear(p, q, c)),
        ("add scalar (x + 2.0)", lambda p, q, c: p + 2.0),
        ("mul scalar (x * 0.5)", lambda p, q, c: p * 0.5),
    ]
    if not scalars_by_value:
        values = iter(range(1 << 30))
        cases.append(("add scalar, a new value per call (x + v)", lambda p, q, c: p + float(next(values))))
    sync = torch.spyre.synchronize
    nothing = lambda: None  # noqa: E731
    rows, out = [], {}
    for name, fn in cases:
        CACHE.clear()
        idle_us = _median_us(lambda: fn(x, y, sb), repeats, sync)
        spyre_us = _gated_median_us(lambda: fn(x, y, sb), repeats)
        (entry,) = [e for _, e in CACHE.entries() if isinstance(e, CompiledEntry)]
        layer_us, wrapper_us, launch_us = _timed_split(lambda: fn(x, y, sb), entry, repeats, sync)
        cpu_us = _median_us(lambda: fn(a, b, bias), repeats, nothing)
        eager.set_enabled(False)
        try:
            fallback_us = _median_us(lambda: fn(x, y, sb), repeats, sync)
        finally:
            eager.set_enabled(True)
        rows.append([name, spyre_us, layer_us, wrapper_us, launch_us, idle_us, cpu_us, fallback_us, "<= 100"])
        out[name.split()[0]] = spyre_us
    print_table("warm per-call host time, 64 x 64 fp32 (median us)",
                ["op", "spyre eager", "eager layer", "Inductor wrapper", "launch_jobplan",
                 "(device idle)", "CPU eager", "CPU fallback (before)", "target"], rows)
    print("  spyre eager: host time of the call with the device held (launches queue; the simulator, threads of\n"
          "  this process sharing the GIL, does not run meanwhile, as a card would not take the host's CPU), split\n"
          "  into its parts. (device idle): the same call's wall time with the device idle before it: the\n"
          "  simulator starts the program during the call and takes the GIL (mm: milliseconds of simulation).\n"
          "  CPU fallback (before): the path before issue 19, a synchronous CPU kernel over the device bytes.")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="compile-backed eager ops: compile and per-call figures")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--scalars-by-value", action="store_true",
                        help="key Python scalars on their value (before issue 19's travel)")
    args = parser.parse_args(argv)
    if args.scalars_by_value:
        from spyre_inductor.eager import key

        key.TRAVEL[0] = False
    spyre = torch.device("spyre", 0)
    # CPU eager in one intra-op thread: two OpenMP threads contend with the simulator's workers on
    # these 2 cores (a 64 x 64 mm then takes milliseconds); at 64 x 64 one thread is as fast.
    torch.set_num_threads(1)
    print(f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; caches in "
          f"{os.environ['TORCHINDUCTOR_CACHE_DIR']})")
    first_call_table(spyre)
    warm_table(spyre, args.repeats, args.scalars_by_value)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main()
