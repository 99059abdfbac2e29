"""Try transformers' own model classes on spyre as a new user would: eager and compiled, strict.

Prints one row per model: eager strict, compiled strict, max error vs the fp32 CPU model, and
the first refusal's message when a mode fails. Tiny configs, random weights, nothing downloaded.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from spyre_inductor.testing import hf_models  # noqa: E402


def generate(name, new_tokens=16):
    """Greedy generate() with the model's own cache, its forward compiled, under strict: the
    tokens against the CPU model's."""
    from spyre_inductor.device.fallback import strict_mode
    model, inputs = hf_models.build(name)
    ids = inputs["input_ids"][:, :8]
    kw = dict(max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        dev = model.to("spyre")
        dev.forward = torch.compile(dev.forward)
        t0 = time.perf_counter()
        with strict_mode(True):
            out = dev.generate(ids.to("spyre"), **kw).cpu()
        dt = time.perf_counter() - t0
    same = int((out == ref).all())
    if not same:
        raise AssertionError(f"tokens differ: {out.tolist()} vs {ref.tolist()}")
    return 0.0, dt


def run(name, mode):
    import spyre_inductor  # noqa: F401
    from spyre_inductor.device.fallback import strict_mode
    torch.manual_seed(0)
    if mode == "generate":
        return generate(name)
    model, inputs = hf_models.build(name)
    model.eval()
    with torch.no_grad():
        ref = hf_models.logits(model(**inputs))
        dev = model.to("spyre")
        dinputs = {k: v.to("spyre") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        fn = dev if mode == "eager" else torch.compile(dev)
        t0 = time.perf_counter()
        with strict_mode(True):
            out = hf_models.logits(fn(**dinputs)).cpu()
        dt = time.perf_counter() - t0
    err = (out.float() - ref.float()).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    return err, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--mode", default="eager,compiled")
    a = ap.parse_args()
    names = a.models or list(hf_models.MODELS)
    for name in names:
        for mode in a.mode.split(","):
            try:
                err, dt = run(name, mode)
                print(f"{name:12s} {mode:8s} OK   rel err {err:.2e}  {dt:.1f}s", flush=True)
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                msg = " | ".join(m for m in msg[:6] if m.strip())[:600]
                print(f"{name:12s} {mode:8s} FAIL {type(e).__name__}: {msg}", flush=True)
                if os.environ.get("TB"):
                    traceback.print_exc()
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
