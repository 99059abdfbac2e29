"""transformers' own model classes under SPYRE_STRICT=1: the per-model table of benchmarks/models.py.

One row per model of spyre_inductor/testing/hf_models.py (tiny configs, random weights, fp32):
whether eager, compiled and generate() run strict, the compiled forward's max error over the
output's scale, its compile seconds, programs per layer (2 layers minus 1 layer), and for causal LMs
one prefill of 16 tokens and one warm decode step with the model's own cache: simulated us, the sum
of the kernels' rooflines over simulated (efficiency), host ms, and host ms over CPU eager's.
"""

from __future__ import annotations

import time

import torch

from _bench import print_table
from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.device.fallback import strict_mode
from spyre_inductor.testing import hf_models


def _spyre(inputs):
    return {k: v.to("spyre") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _ok(fn) -> str:
    try:
        fn()
        return "yes"
    except Exception as e:  # noqa: BLE001 (the table says what refused)
        return "no: " + str(e).split("(", 2)[-1][:40].replace("\n", " ")


def _eager(name):
    model, inputs = hf_models.build(name)
    with torch.no_grad(), strict_mode(True):
        model.to("spyre")(**_spyre(inputs))


def _generate(name):
    model, inputs = hf_models.build(name)
    ids, kw = inputs["input_ids"][:, :8], dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.to("spyre").forward = torch.compile(model.forward)
        with strict_mode(True):
            out = model.generate(ids.to("spyre"), **kw)
    if out.cpu().tolist() != ref.tolist():
        raise AssertionError("(tokens differ")


def _programs(name, layers):
    model, inputs = hf_models.build(name, layers=layers)
    torch._dynamo.reset()
    with torch.no_grad(), strict_mode(True), record_kernels() as records, \
            torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(model.to("spyre"))(**_spyre(inputs))
    return len(records)


def _step(fn):
    """(simulated us, sum of rooflines us, host ms) of one warm call."""
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    start = time.perf_counter()
    out = fn()
    torch.spyre.synchronize()
    host = (time.perf_counter() - start) * 1e3
    reports = torch.spyre.kernel_reports()
    return sum(r.simulated_ns for r in reports) / 1e3, sum(r.roofline_ns for r in reports) / 1e3, host, out


def _compiled(name, row):
    model, inputs = hf_models.build(name)
    with torch.no_grad():
        ref = hf_models.logits(model(**inputs))
        cpu_model = model
        torch._dynamo.reset()
        compiled = torch.compile(model.to("spyre"))
        args = _spyre(inputs)
        with strict_mode(True):
            start = time.perf_counter()
            out = compiled(**args)
            torch.spyre.synchronize()
            row["compile s"] = time.perf_counter() - start
            sim, roof, _, out = _step(lambda: compiled(**args))
        row["max err / scale"] = ((hf_models.logits(out).cpu() - ref).abs().max() / ref.abs().max()).item()
        row["prefill sim us"], row["prefill eff"] = sim, roof / sim if sim else 0.0
        if "decoder_input_ids" in inputs or "pixel_values" in inputs or not hasattr(out, "past_key_values") \
                or out.past_key_values is None:
            return
        nxt = hf_models.logits(out)[:, -1:].argmax(-1)
        with strict_mode(True):
            cache = out.past_key_values
            compiled(input_ids=nxt, past_key_values=cache)  # compiles the decode graph
            step = compiled(input_ids=nxt, past_key_values=cache)  # and, with a symbolic length, this one
            sim, roof, host, _ = _step(lambda: compiled(input_ids=nxt, past_key_values=step.past_key_values))
        row["decode sim us"], row["decode eff"], row["decode host ms"] = sim, roof / sim if sim else 0.0, host
        cpu_model = cpu_model.to("cpu")
        cpu_out = cpu_model(**inputs)
        start = time.perf_counter()
        for _ in range(5):
            cpu_model(input_ids=nxt.cpu(), past_key_values=cpu_out.past_key_values)
        row["x cpu eager"] = host / ((time.perf_counter() - start) * 1e3 / 5)


COLUMNS = ["model", "eager", "compiled", "generate", "max err / scale", "compile s", "programs/layer",
           "prefill sim us", "prefill eff", "decode sim us", "decode eff", "decode host ms", "x cpu eager"]


def transformers_table(names=None) -> list[dict]:
    rows = []
    for name in names or list(hf_models.MODELS):
        row = {"model": name, "eager": _ok(lambda: _eager(name))}
        torch._dynamo.reset()
        row["compiled"] = _ok(lambda: _compiled(name, row))
        causal = name in hf_models.CAUSAL
        torch._dynamo.reset()
        row["generate"] = _ok(lambda: _generate(name)) if causal else "-"
        if row["compiled"] == "yes":
            try:
                row["programs/layer"] = _programs(name, 2) - _programs(name, 1)
            except Exception:  # noqa: BLE001
                row["programs/layer"] = "?"
        rows.append(row)
        torch._dynamo.reset()
    print_table("transformers' model classes under SPYRE_STRICT=1 (tiny configs, fp32; prefill 16 tokens, "
                "decode 1 with the model's own cache)", COLUMNS,
                [[r.get(c, "-") for c in COLUMNS] for r in rows])
    return rows
