"""`make demo`: what the spyre device can do today.

A Llama-style decoder compiled under SPYRE_STRICT=1 (a prefill and greedy decode steps, every op
in spyre programs, fused attention included, checked against the fp32 CPU model, with per-kernel
tables); the same model split over two processes by tensor parallelism; a transformer MLP and a model piece (one fused dataflow program, its kernel report and
listing) and a small model (what compiles, what still runs on the CPU inside the graph); the
device itself: tensors, a model in eager mode, streams and events with the simulated timeline, a
hand-written program, and the device's memory statistics.
"""

import argparse
import dataclasses
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from spyre_inductor.device.fallback import strict_mode  # (imports the spyre device)

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")
warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")


OPTIONS = argparse.Namespace(layers=2, d=256, prefill=128, steps=4, out="spyre-demo", quick=False)


def section(title: str) -> None:
    print(f"\n== {title}")


class Progress:
    """A progress bar on stderr for the steps of anything that takes more than a few seconds."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.start = label, total, 0, time.perf_counter()
        self._draw()

    def step(self, note: str = "") -> None:
        self.done += 1
        self._draw(note)
        if self.done == self.total:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, note: str = "") -> None:
        width = 24
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.label} "
                         f"{time.perf_counter() - self.start:5.1f} s {note[:40]:40s}")
        sys.stderr.flush()


def swiglu_residual(x, gate, up):
    return x + torch.nn.functional.silu(gate) * up


def compiled_model_piece() -> None:
    from pathlib import Path

    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    section("torch.compile on spyre: a transformer MLP's SwiGLU + residual, (1024, 4096) fp16")
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(1024, 4096, generator=g).half() for _ in range(3)]
    compiled = torch.compile(swiglu_residual)
    # Caches off: the demo shows a compile (a graph served from the FX graph cache compiles nothing).
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        compiled(*(a.to("spyre") for a in args))  # compile (planned against the timing model) and run
    torch.spyre.synchronize()  # launches are asynchronous: let the first one finish before resetting
    torch.spyre.reset_kernel_reports()
    out = compiled(*(a.to("spyre") for a in args)).cpu()
    torch.spyre.synchronize()
    ref = swiglu_residual(*(a.float() for a in args))
    err = (out.float() - ref).abs().max().item()
    print(f"  max |spyre - cpu fp32| = {err:.3g} (fp16 output: one rounding of the fp32 result)")
    for r in torch.spyre.kernel_reports():
        line = r.describe()  # bytes moved vs the kernel's minimum, roofline and efficiency against it
        if r.minimum_bytes is None:  # a program that does not record its minimum: three inputs and the output once
            minimum = 4 * args[0].numel() * args[0].element_size()
            line += f"; {r.bytes_moved / minimum:.2f}x the {minimum:,} bytes of the inputs and the output"
        print(f"  {line}")
    artifact = next(rec.artifact for rec in records if rec.artifact is not None)
    print(f"  artifact: {artifact}")
    print("  " + Path(artifact, "summary.txt").read_text().strip().replace("\n", "\n  "))


class MLP(nn.Module):
    """A transformer block's MLP: Linear, GELU (tanh), Linear, residual."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x), approximate="tanh"))


def compiled_mlp_strict() -> None:
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    section("torch.compile under SPYRE_STRICT=1: a transformer MLP (512 tokens, 1024 -> 4096 -> 1024, fp16), "
            "every op in spyre programs, matmuls on the PE arrays")
    torch.manual_seed(0)
    model = MLP(1024, 4096).half().eval()
    x = torch.randn(512, 1024).half()
    with torch.no_grad():
        ref = MLP(1024, 4096).eval()
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        expected = ref(x.float())
        with strict_mode(True):  # a CPU fallback anywhere in the graph would raise
            compiled = torch.compile(model.to("spyre"))
            with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
                compiled(x.to("spyre"))
            torch.spyre.synchronize()
            torch.spyre.reset_kernel_reports()
            got = compiled(x.to("spyre")).cpu()
            torch.spyre.synchronize()
    err = (got.float() - expected).abs().max().item()
    print(f"  {len(records)} program(s), no CPU fallback; max |spyre - cpu fp32| = {err:.3g} (fp16 outputs)")
    total = 0.0
    for r in torch.spyre.kernel_reports():
        total += r.simulated_us
        print(f"  {r.describe()}")
    print(f"  MLP forward: {total:.1f} us simulated")


def random_and_autocast_strict() -> None:
    section("random numbers on the device generator and torch.autocast, under SPYRE_STRICT=1")
    with strict_mode(True):  # every fill below runs as a spyre program, or raises
        torch.spyre.manual_seed(0)
        a = torch.randn(2, 4, device="spyre").cpu()
        state = torch.spyre.get_rng_state()
        b = torch.rand(3, device="spyre").cpu()
        torch.spyre.set_rng_state(state)
        again = torch.equal(torch.rand(3, device="spyre").cpu(), b)
        first = ", ".join(f"{v:.4f}" for v in a.flatten().tolist()[:4])
        print(f"  torch.randn(2, 4) (Philox, seed 0): {first}, ...; rng state restored, same draw: {again}")
        torch.spyre.reset_kernel_reports()
        x = torch.ones(256, 256).to("spyre")
        kept = (torch.compile(lambda x: torch.nn.functional.dropout(x, 0.25))(x).cpu() != 0).float().mean().item()
        reports = [r for r in torch.spyre.kernel_reports() if "rand" in r.name]
        print(f"  compiled dropout(p=0.25) kept {kept:.3f}; mask drawn and applied in one program:")
        print(f"    {reports[-1].describe()}")
        lin = torch.nn.Linear(64, 64).to("spyre")
        with torch.autocast("spyre", dtype=torch.float16):
            y, s = torch.compile(lambda t: (lin(t), torch.softmax(lin(t), -1)))(torch.randn(8, 64).to("spyre"))
        print(f"  under torch.autocast('spyre'): linear -> {y.dtype}, softmax -> {s.dtype} (compiled)")


def _kernel_table(reports, indent="    ") -> float:
    """Per-kernel lines (simulated time and share) of one call; returns its total us."""
    total = sum(r.simulated_us for r in reports)
    for r in reports:
        print(f"{indent}{r.simulated_us:8.1f} us {100 * r.simulated_us / total:5.1f}%  {r.cores_used:2d} cores  "
              f"eff {r.efficiency:.2f}  {r.name}")
    return total


def compiled_llama_strict() -> None:
    from spyre_inductor.compiler.inductor.scheduling import record_kernels
    from spyre_inductor.testing.models import build, fp32_copy, llama_config

    prefill_len, steps = OPTIONS.prefill, OPTIONS.steps
    cache_len = max(256, prefill_len + steps)
    cfg = llama_config(attention="sdpa", n_layers=OPTIONS.layers, d=OPTIONS.d)
    section(f"torch.compile under SPYRE_STRICT=1: a Llama-style decoder ({cfg.n_layers} layers, d {cfg.d}, "
            f"{cfg.n_heads} heads over {cfg.n_kv_heads} KV heads, RMSNorm, rotary, fused SDPA, SwiGLU, LM head "
            f"over {cfg.vocab} tokens), fp16: a prefill of {OPTIONS.prefill} tokens, then {OPTIONS.steps} greedy decode "
            f"steps into a KV cache of {cache_len} updated in place, every op in spyre programs")
    model = build(cfg, dtype=torch.float16)
    ref = fp32_copy(model)  # the same (fp16-rounded) weights, in fp32
    ids = torch.randint(0, cfg.vocab, (1, prefill_len), generator=torch.Generator().manual_seed(0))
    caches = model.new_caches(1, cache_len, device="spyre")
    ref_caches = ref.new_caches(1, cache_len)
    tokens, ref_tokens, errors = [], [], []
    bar = Progress("prefill and decode (the first two compile)", steps + 1)
    with strict_mode(True):  # a CPU fallback anywhere in the graph would raise
        compiled = torch.compile(model.to("spyre"), dynamic=False)  # prefill and decode: one graph each
        with torch.no_grad(), record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            x, pos = ids, torch.arange(prefill_len)
            for step in range(steps + 1):
                torch.spyre.synchronize()
                torch.spyre.reset_kernel_reports()
                logits = compiled(x.to("spyre"), pos.to("spyre"), *caches).cpu()
                torch.spyre.synchronize()
                reports = torch.spyre.kernel_reports()
                want = ref(x, pos, *ref_caches)
                errors.append((logits.float() - want).abs().max().item())
                tokens.append(int(logits[0, -1].float().argmax()))
                ref_tokens.append(int(want[0, -1].argmax()))
                if step == 0:
                    prefill = reports
                elif step == 1:
                    decode = reports
                x, pos = torch.tensor([[tokens[-1]]]), torch.tensor([prefill_len + step])
                bar.step("prefill" if step == 0 else f"decode {step}")
    compiled_programs = len([r for r in records if r.artifact is not None])
    print(f"  {compiled_programs} kernels compiled for the two graphs, no CPU fallback; greedy tokens {tokens} "
          f"({'the same as' if tokens == ref_tokens else 'NOT the same as'} the fp32 CPU model's {ref_tokens})")
    print(f"  max |logits spyre fp16 - cpu fp32| per call: {', '.join(f'{e:.3g}' for e in errors)}")
    print(f"  prefill ({prefill_len} tokens): {len(prefill)} programs per call of the {cfg.n_layers} layers (programs per "
          f"decoder layer: benchmarks/models.py)")
    total = _kernel_table(prefill)
    print(f"    prefill: {total:.1f} us simulated")
    print(f"  decode step (1 token against the cache of {cache_len}): {len(decode)} programs")
    total = _kernel_table(decode)
    print(f"    decode step: {total:.1f} us simulated")
    # Host time: each kernel was prepared once; a step only launches (benchmarks/launch.py has the rest).
    args = (x.to("spyre"), pos.to("spyre"), *caches)
    ref_args = (x, pos, *ref_caches)
    with torch.no_grad():
        host = _best_ms(lambda: (compiled(*args), torch.spyre.synchronize()))
        cpu = _best_ms(lambda: ref(*ref_args))
    print(f"    host time per decode step, call to synchronize: {host:.1f} ms on spyre ({len(decode)} launches and "
          f"the simulator running them), {cpu:.1f} ms for the fp32 model in CPU eager ({host / cpu:.1f}x)")
    inspect_run(lambda: _prefill_and_decode(compiled, ids, caches, prefill_len, steps, tokens), records)


def _prefill_and_decode(compiled, ids, caches, prefill_len, steps, tokens) -> None:
    with torch.no_grad():
        compiled(ids.to("spyre"), torch.arange(prefill_len).to("spyre"), *caches)
        for step in range(steps):
            compiled(torch.tensor([[tokens[step]]]).to("spyre"), torch.tensor([prefill_len + step]).to("spyre"),
                     *caches)
        torch.spyre.synchronize()


def inspect_run(run, records) -> None:
    """The run again, traced: the perf report's table, and the trace and HTML report written out
    (spyre-inspect trace/report do the same for any script)."""
    from spyre_inductor.inspect import report as perf
    from spyre_inductor.inspect.catalog import find_kernel
    from spyre_inductor.inspect.svg import plan_svg
    from spyre_inductor.inspect.trace import record, write

    section("what was generated, and where the time goes: the prefill and decode steps traced "
            "(spyre-inspect report)")
    with strict_mode(True):
        trace = record(run)
    rows = trace["spyreKernels"]
    kernels, summary = perf.lines(rows)
    print("  " + perf.text(kernels, summary, top=12, steps=1 + OPTIONS.steps).replace("\n", "\n  "))
    out = Path(OPTIONS.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_path = write(trace, out / "trace.json")
    artifacts = {r.kernel.name: r.artifact for r in records if r.artifact is not None and r.kernel is not None}
    pictures = {}
    for k in kernels[:5]:
        if k.name in artifacts:
            artifact = find_kernel(str(artifacts[k.name]))
            pictures[k.name] = plan_svg(artifact.name, artifact.plan)
            (out / f"{k.name}.svg").write_text(pictures[k.name])
    html_path = out / "report.html"
    html_path.write_text(perf.html_page(kernels, summary, rows, pictures, "spyre demo: Llama-style prefill and decode"))
    attention = next((k.name for k in kernels if k.name.startswith("spyre_attn")), kernels[0].name)
    print(f"  written to {out.resolve()}/: trace.json (open in https://ui.perfetto.dev), report.html, and the "
          f"plans of the top kernels as SVG")
    print(f"  next: spyre-inspect show {attention} --core 0 --unit pe; spyre-inspect plan {attention} --svg "
          f"plan.svg; spyre-inspect list")


def transformers_models_strict() -> None:
    """transformers' own classes, unmodified: what users bring (README: the per-model table)."""
    try:
        from spyre_inductor.testing import hf_models
    except ImportError:  # pragma: no cover - transformers is installed by make
        return
    section("transformers' own model classes under SPYRE_STRICT=1 (tiny configs, random weights): "
            "model.to('spyre'), torch.compile(forward), generate() with the model's own cache")
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    names = ("llama", "qwen3", "mixtral")
    bar = Progress("transformers models (compile and generate)", len(names))
    for name in names:
        model, inputs = hf_models.build(name)
        ids = inputs["input_ids"][:, :8]
        with torch.no_grad():
            ref = model.generate(ids, **kw)
            model.to("spyre").forward = torch.compile(model.forward)
            start = time.perf_counter()
            with strict_mode(True):
                out = model.generate(ids.to("spyre"), **kw).cpu()
            seconds = time.perf_counter() - start
        bar.step(name)
        same = "the same as" if torch.equal(out, ref) else "NOT the same as"
        print(f"  {type(model).__name__}: 16 greedy tokens {out[0, 8:].tolist()}, {same} the CPU model's "
              f"({seconds:.1f} s with its compiles)")
        torch._dynamo.reset()
    print("  every model of the README's table: .venv/bin/python benchmarks/models.py --transformers")


def _best_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def dynamic_sizes_strict() -> None:
    section("torch.compile(dynamic=True) under SPYRE_STRICT=1: one compile serves five sequence lengths "
            "(a size bucket; the size travels to the program with the addresses)")
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    def f(x, w):
        return torch.softmax((x @ w.t()) * 0.125, dim=-1)

    w = torch.randn(256, 128)
    with strict_mode(True):
        torch._dynamo.reset()
        compiled = torch.compile(f, dynamic=True)
        errors = []
        with record_kernels() as records:
            for n in (33, 40, 47, 55, 64):
                x = torch.randn(n, 128)
                errors.append((compiled(x.to("spyre"), w.to("spyre")).cpu() - f(x, w)).abs().max().item())
    artifacts = {r.artifact for r in records if r.artifact is not None}
    print(f"  rows 33, 40, 47, 55, 64: {len(records)} kernel(s) compiled once, {len(artifacts)} artifact(s) "
          f"serving rows 33..64; max |spyre - cpu| {max(errors):.2e}")

    # The decoder's attention over a growing sequence: one fused attention artifact per bucket,
    # each head clipped to the launch's length (its rows past it are the next head's bytes).
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with strict_mode(True):
        torch._dynamo.reset()
        attend = torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True))
        errors = []
        with record_kernels() as records:
            for k, n in enumerate((33, 40, 47, 55, 64)):
                q = torch.randn(1, 4, n, 64)
                qs = q.to("spyre")
                if k == 0:
                    torch._dynamo.mark_dynamic(qs, 2)
                errors.append((attend(qs, qs, qs).cpu() - sdpa(q, q, q, is_causal=True)).abs().max().item())
    kinds = ", ".join(type(r.kernel).__name__ for r in records)
    print(f"  causal attention, 4 heads, sequence 33, 40, 47, 55, 64: {len(records)} kernel(s) compiled once "
          f"({kinds}); max |spyre - cpu| {max(errors):.2e}")

    # No mark at all: Dynamo's automatic dynamic shapes make batch, heads and length symbolic on
    # the second call; the kv length is served by a bucket, the others per value at launch
    # (symbolic_exact.py), so the graph stays one and the attention stays fused, on the card.
    with strict_mode(True):
        torch._dynamo.reset()
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        attend = torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True))
        errors, shapes = [], ((1, 4, 32), (2, 8, 64), (4, 12, 128), (3, 6, 100))
        with record_kernels() as records:
            for b, h, n in shapes:
                q, k_, v = (torch.randn(b, h, n, 64) for _ in range(3))
                got = attend(q.to("spyre"), k_.to("spyre"), v.to("spyre")).cpu()
                errors.append((got - sdpa(q, k_, v, is_causal=True)).abs().max().item())
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    kinds = sorted({type(r.kernel).__name__ for r in records if r.kernel is not None})
    print(f"  attention at (batch, heads, length) {', '.join(map(str, shapes))}, no mark: {graphs} graph(s) "
          f"(the first static), kernels {', '.join(kinds)}, each new batch/heads/length compiled at its first "
          f"launch; max |spyre - cpu| {max(errors):.2e}")

    # A whole model: embeddings (a gather over the dynamic ids), layer norms, SDPA, MLP, LM head.
    from spyre_inductor.testing.models import build, gpt2_config

    config = gpt2_config(attention="sdpa")
    reference, model = build(config), build(config).to("spyre")
    with strict_mode(True), torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=True)
        errors, scale = [], 0.0
        with record_kernels() as records:
            for n in (33, 40, 47, 55, 64):
                ids = torch.randint(0, config.vocab, (1, n), generator=torch.Generator().manual_seed(n))
                want = reference(ids)
                errors.append((compiled(ids.to("spyre")).cpu() - want).abs().max().item())
                scale = max(scale, want.abs().max().item())
    print(f"  a GPT-2-style model ({config.n_layers} layers, d {config.d}, SDPA), sequence 33..64: "
          f"{len(records)} kernel(s) compiled once for the five lengths, no CPU fallback; "
          f"max |spyre - cpu| {max(errors):.2e} (logits up to {scale:.2f})")


def compiled_small_model() -> None:
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    section("torch.compile of a small model: what compiles, what runs on the CPU inside the graph")
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64)).eval()
    batch = torch.randn(32, 64)
    expected = model(batch)
    compiled = torch.compile(model.to("spyre"))
    with record_kernels() as records, warnings.catch_warnings(), \
            torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("ignore")  # the fallback's once-per-op warning: listed below instead
        got = compiled(batch.to("spyre"))
    err = (got.detach().cpu() - expected).abs().max().item()
    print(f"  output {tuple(got.shape)}; max |spyre - cpu| = {err:.2e}")
    torch.spyre.synchronize()
    reports = {r.name: r for r in torch.spyre.kernel_reports()}
    for rec in records:
        if rec.artifact is not None:
            r = reports.get(rec.kernel.name)
            cost = f", {r.simulated_us:.2f} us simulated on {r.cores_used} core(s)" if r else ""
            where = f"one spyre program {rec.kernel.name}{cost}"
        else:
            where = f"CPU inside the graph ({rec.fallback_reason})"
        print(f"  {rec.ops or ', '.join(rec.nodes)}: {where}")

    mask = (torch.arange(64) < torch.tensor([[64], [40], [17], [1]])).float()
    hidden = torch.randn(4, 64, 32)
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        got = torch.compile(positions_and_pooling)(hidden.to("spyre"), mask.to("spyre"))
    want = positions_and_pooling(hidden, mask)
    exact = torch.equal(got[0].cpu(), want[0])
    err = (got[1].cpu() - want[1]).abs().max().item()
    names = ", ".join(r.kernel.name for r in records if r.artifact is not None)
    print(f"  position ids from a mask (an int64 cumsum) exact: {exact}; masked mean pooling max |err| = "
          f"{err:.2e}; programs: {names}")


def positions_and_pooling(hidden, mask):
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # HF-style position ids: an integer scan
    pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    return positions, pooled


def tensor_parallel_across_processes() -> None:
    section("beyond one card: the Llama split over 2 processes (torchrun, DTensor tensor parallelism, the spyre "
            "c10d backend), compiled under SPYRE_STRICT=1")
    import subprocess

    from spyre_inductor.testing.distributed import free_port

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "SPYRE_NUM_DEVICES"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), str(root / "examples" / "tensor_parallel_llama.py"), "--tokens", "4"]
    print("  .venv/bin/torchrun --nproc-per-node 2 examples/tensor_parallel_llama.py --tokens 4")
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=600)
    for line in done.stdout.splitlines():
        print(f"  {line}")
    if done.returncode != 0:
        raise SystemExit(f"demo: the tensor-parallel run failed:\n{done.stderr[-3000:]}")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="What the spyre device does today: a Llama-style model compiled "
                                "under SPYRE_STRICT=1, traced and reported, then the rest of the device.")
    p.add_argument("--layers", type=int, default=OPTIONS.layers, help="decoder layers (default 2)")
    p.add_argument("--d", type=int, default=OPTIONS.d, help="model width, a multiple of 64 (default 256)")
    p.add_argument("--prefill", type=int, default=OPTIONS.prefill, help="prefill tokens (default 128)")
    p.add_argument("--steps", type=int, default=OPTIONS.steps, help="greedy decode steps (default 4)")
    p.add_argument("--out", default=OPTIONS.out, help="where the trace, report and plans go (default spyre-demo/)")
    p.add_argument("--quick", action="store_true", help="the Llama-style model and its report only")
    return p.parse_args(argv)


def main(argv=None) -> None:
    global OPTIONS
    OPTIONS = parse(argv)
    if OPTIONS.d % 64 or OPTIONS.d < 64:
        raise SystemExit(f"demo: --d must be a positive multiple of 64 (the head size), got {OPTIONS.d}")
    if OPTIONS.steps < 1 or OPTIONS.prefill < 1 or OPTIONS.layers < 1:
        raise SystemExit("demo: --layers, --prefill and --steps must be at least 1")
    if OPTIONS.prefill + OPTIONS.steps > 1024:
        raise SystemExit(f"demo: --prefill + --steps must fit the model's 1024 positions, got "
                         f"{OPTIONS.prefill + OPTIONS.steps}")
    section("device")
    props = torch.spyre.get_device_properties()
    print(f"torch {torch.__version__}; accelerator: {torch.accelerator.current_accelerator()}; "
          f"{torch.spyre.device_count()} x {props.name}")
    print(f"  {props.cores} cores, {props.scratchpad_bytes // 1024} KiB scratchpad per core, "
          f"{props.stick_bytes}-byte sticks, {props.total_memory / 2**30:.0f} GiB device memory")

    compiled_llama_strict()
    if OPTIONS.quick:
        return
    transformers_models_strict()
    tensor_parallel_across_processes()
    with torch._inductor.config.patch(fx_graph_cache=False):  # (its counts are of kernels compiled: on every run)
        dynamic_sizes_strict()
    compiled_mlp_strict()
    compiled_model_piece()
    compiled_small_model()
    random_and_autocast_strict()

    section("tensors to the device and back")
    x = torch.randn(4, 6)
    d = x.to("spyre")
    print(f"  {tuple(d.shape)} {d.dtype} on {d.device}; round trip exact: {torch.equal(d.cpu(), x)}")
    print(f"  transposed view shares storage: {d.t().untyped_storage().data_ptr() == d.untyped_storage().data_ptr()}")
    print(f"  {d[:2, :3]}")

    section("a small model in eager mode on spyre vs CPU, under SPYRE_STRICT=1: every eager op, forward "
            "and backward, is compiled once into a spyre program and then only launched")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    batch = torch.randn(32, 64)
    expected = model(batch)
    model_s = model.to("spyre")
    before = torch.spyre.eager_cache_stats()
    with strict_mode(True):  # an eager op on the CPU fallback would raise
        got = model_s(batch.to("spyre"))
        got.sum().backward()
        first = torch.spyre.eager_cache_stats()
        start = time.perf_counter()
        again = model_s(batch.to("spyre"))
        again.sum().backward()
        torch.spyre.synchronize()
        warm_ms = (time.perf_counter() - start) * 1e3
    err = (got.detach().cpu() - expected.detach()).abs().max().item()
    stats = torch.spyre.eager_cache_stats()
    print(f"  output {tuple(got.shape)} on {got.device}; max |spyre - cpu| = {err:.2e}")
    print(f"  gradients on device: {all(p.grad.device.type == 'spyre' for p in model_s.parameters())}")
    print(f"  first step: {first.compiles - before.compiles} eager programs compiled "
          f"({first.compile_seconds - before.compile_seconds:.1f} s), {first.cpu_routes - before.cpu_routes} "
          f"CPU routes; second step (its gradients now accumulate): {stats.hits - first.hits} cache hits, "
          f"{stats.compiles - first.compiles} compiles, {warm_ms:.1f} ms")

    section("streams, events and the simulated timeline")
    side = torch.spyre.Stream(priority=-1)
    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    chunks = [torch.randn(512, 512).pin_memory() for _ in range(4)]
    os.makedirs(OPTIONS.out, exist_ok=True)
    with torch.spyre.timeline(os.path.join(OPTIONS.out, "timeline.json")) as tl:
        start.record()
        outs = []
        for i, chunk in enumerate(chunks):
            stream = side if i % 2 else torch.spyre.current_stream()
            with torch.spyre.stream(stream):
                outs.append((chunk.to("spyre", non_blocking=True) * 2).sum())
        torch.spyre.current_stream().wait_stream(side)
        end.record()
    total = sum(o.item() for o in outs)
    expected = sum((c * 2).sum().item() for c in chunks)
    print(f"  4 chunks over 2 streams: sum {total:.3f} vs CPU {expected:.3f}; "
          f"{start.elapsed_time(end):.3f} ms simulated device time")
    busy = {p: tl.busy_ns(p) / 1e3 for p in ("h2d", "host")}
    print(f"  simulated busy: h2d {busy['h2d']:.1f} us, host (fallback ops) {busy['host']:.1f} us; "
          f"trace with {len(tl.tickets)} operations in {OPTIONS.out}/timeline.json (open in Perfetto)")

    section("a hand-written dataflow program on the simulated cores")
    from spyre_runtime.direct import run_program
    from spyre_authoring.handwritten import tiled_matmul

    program = tiled_matmul(256, 512, 256, "fp16", cores=4, tile_k=128)
    # The author knows the kernel's minimum traffic: a and b read once, out written once (fp16).
    program = dataclasses.replace(program, minimum_bytes=(256 * 512 + 512 * 256 + 256 * 256) * 2,
                                  minimum_read_bytes=(256 * 512 + 512 * 256) * 2)
    a, b = torch.randn(256, 512).half(), torch.randn(512, 256).half()
    torch.spyre.reset_kernel_reports()
    out = run_program(program, a=a, b=b)["out"]
    (report,) = torch.spyre.kernel_reports()
    ref = (a.float() @ b.float()).half()
    ulp = (out.cpu().float() - ref.float()).abs().max().item()
    instrs = sum(len(i) for c in program.cores for _, i in c.units)
    print(f"  {program.name}: {program.notes}")
    print(f"  {len(program.cores)} cores, {instrs} instructions; max |spyre - cpu fp32->fp16| = {ulp:.3g} "
          "(fp32 sums in another order, one fp16 rounding; the tests pin the bound)")
    print(f"  kernel report: {report.describe()}, {report.flops:,} flops")
    listing = program.listing().splitlines()
    start = next(i for i, line in enumerate(listing) if line.startswith("core 0"))
    print("  listing (core 0, first lines):")
    for line in listing[start:start + 14]:
        print("    " + line)

    section("device memory")
    stats = torch.spyre.memory_stats()
    free, total = torch.spyre.mem_get_info()
    print(f"  allocated {torch.spyre.memory_allocated():,} B (peak {torch.spyre.max_memory_allocated():,} B), "
          f"{stats['allocation.all.current']} live blocks, "
          f"{stats['allocation.all.allocated']} allocations so far")
    print(f"  free {free / 2**30:.2f} GiB of {total / 2**30:.0f} GiB; "
          f"{stats['regions.current']} of {stats['regions.budget']} region handles in use ({stats['mode']} mode)")
    print(f"  the model's first weight lives at {torch.spyre.describe(model_s[0].weight)}")
    print("  " + torch.spyre.memory_summary(abbreviated=True).splitlines()[5])
    try:
        torch.empty(2**60, dtype=torch.uint8, device="spyre")
    except torch.OutOfMemoryError as e:
        print(f"  an impossible request fails cleanly: {e}".splitlines()[0])
    print(f"  and the device still works: {torch.ones(3, device='spyre').sum().item()}")


if __name__ == "__main__":
    main()
