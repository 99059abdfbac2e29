"""A corpus of kernels covering every family, compiled under SPYRE_STRICT=1 into a fresh artifact
root, and the sha256 of what the launch layer reads from each artifact (program.json,
execution_plan.json, launch_spec.json).

The golden file (golden_programs.json) pins those bytes: a change to the compiler that is meant to
keep every program the same (a restructuring, a fold of repeated code) must keep it; one meant to
change programs bumps COMPILER_VERSION and rewrites the file:

    .venv/bin/python tests/compiler/golden_programs.py --update

Run as a script it prints the table of kernels and hashes (or, with --update, writes the file).
It runs in a fresh interpreter (test_golden_programs.py) so the artifact root holds only this
corpus and nothing is reused from another test's compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).with_name("golden_programs.json")
READ_BY_LAUNCH = ("program.json", "execution_plan.json", "launch_spec.json")


def _cases():
    """(name, run) pairs: each run compiles and launches its functions on spyre under strict."""
    import torch
    import torch.nn.functional as F

    dev = "spyre"

    def g(*shape, dtype=torch.float32, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(dev)

    def compiled(fn, *args, dynamic=None):
        torch._dynamo.reset()
        return torch.compile(fn, dynamic=dynamic)(*args).cpu()

    def pointwise():
        compiled(lambda a, b: torch.relu(a * b + 1), g(64, 96), g(64, 96, seed=1))
        compiled(lambda a, b: torch.sigmoid(a) * b.half().float(), g(5, 33), g(5, 33, seed=1))
        compiled(lambda a: (a.t() * 2).contiguous(), g(128, 64))  # a relayout
        compiled(lambda a, b: a + b, g(1024, 512), g(512, seed=1))  # over several cores

    def pieces():
        def rotate_half(x):
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
            return torch.cat((-x2, x1), dim=-1)

        compiled(lambda x, c, s: x * c + rotate_half(x) * s, g(2, 4, 16, 64), g(16, 64, seed=1), g(16, 64, seed=2))
        compiled(lambda x: F.pad(x, (1, 3)), g(8, 60))

    def gathers_scatters():
        ids = torch.tensor([[3, 1, 7, 0]], dtype=torch.int64).to(dev)
        compiled(lambda w, i: F.embedding(i, w), g(16, 64), ids)
        idx = torch.tensor([2, 5], dtype=torch.int64).to(dev)
        compiled(lambda c, i, v: c.index_copy(0, i, v), g(8, 64), idx, g(2, 64, seed=1))
        compiled(lambda c, i, v: c.index_add(0, i, v), g(8, 64), idx, g(2, 64, seed=1))
        compiled(lambda w, i: w[i].sum(1), g(16, 64), ids)

    def reductions_scans():
        compiled(lambda x: torch.softmax(x, -1), g(32, 200))
        compiled(lambda x, w: F.layer_norm(x, (256,), w), g(16, 256), g(256, seed=1))
        compiled(lambda x: x.float().pow(2).mean(-1, keepdim=True).rsqrt() * x, g(8, 128))
        compiled(lambda x: torch.cumsum(x, -1), g(16, 96))
        compiled(lambda x: x.argmax(-1), g(16, 96))
        compiled(lambda x: x.sum(0), g(96, 48))
        compiled(lambda x: torch.logsumexp(x, (0, 2)), g(8, 12, 40))

    def matmul():
        compiled(lambda x, w, b: F.silu(x @ w.t() + b), g(32, 128), g(256, 128, seed=1), g(256, seed=2))
        compiled(lambda x, w: x @ w, g(16, 64, dtype=torch.float16), g(64, 192, dtype=torch.float16, seed=1))
        compiled(lambda a, b: torch.bmm(a, b), g(2, 32, 64), g(2, 64, 32, seed=1))
        compiled(lambda x, w: torch.exp(x) @ w, g(8, 64), g(64, 16, seed=1))

    def attention():
        compiled(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 g(1, 4, 64, 32), g(1, 4, 64, 32, seed=1), g(1, 4, 64, 32, seed=2))
        compiled(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v,
                 g(1, 2, 32, 64, dtype=torch.float16), g(1, 2, 48, 64, dtype=torch.float16, seed=1),
                 g(1, 2, 48, 64, dtype=torch.float16, seed=2))

        def cache(q, k, v, pos):  # a decoder's mask over its cache: chunks skipped on chip (issue 31)
            keep = torch.arange(k.shape[2], device=q.device) <= pos[:, None]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)

        compiled(cache, g(1, 4, 40, 64), g(1, 2, 160, 64, seed=1), g(1, 2, 160, 64, seed=2),
                 torch.arange(120, 160).to(dev))

    def experts():  # a grouped matmul: offs read on chip, each expert's rows through its weights (issue 31)
        def grouped(a, w, offs):
            return torch.nn.functional.grouped_mm(a, w.transpose(1, 2), offs=offs)

        w = g(4, 128, 64, dtype=torch.bfloat16, seed=1)
        compiled(grouped, g(24, 64, dtype=torch.bfloat16), w, torch.tensor([5, 5, 17, 24], dtype=torch.int32).to(dev))
        compiled(grouped, g(2, 64, dtype=torch.bfloat16), w, torch.tensor([0, 1, 1, 2], dtype=torch.int32).to(dev))

    def random_numbers():
        torch.manual_seed(0)
        compiled(lambda x: x + torch.rand_like(x), g(16, 64))
        compiled(lambda x: F.dropout(x, 0.5, training=True), g(16, 64))

    def symbolic_sizes():
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w: torch.softmax(x * 2, -1) @ w, dynamic=True)
        for n in (5, 9, 40):
            fn(g(n, 64), g(64, 32, seed=1)).cpu()
        torch._dynamo.reset()
        attn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        for n in (16, 24, 40):  # the sequence dim marked dynamic: one bucketed plan serves them
            qkv = [g(1, 2, n, 32, seed=s) for s in range(3)]
            for t in qkv:
                torch._dynamo.mark_dynamic(t, 2)
            attn(*qkv).cpu()

    def eager():
        a, b = g(24, 40), g(24, 40, seed=1)
        (a * b + a).cpu()
        torch.tanh(a).cpu()
        a.sum(-1).cpu()

    return [("pointwise", pointwise), ("pieces", pieces), ("gathers_scatters", gathers_scatters),
            ("reductions_scans", reductions_scans), ("matmul", matmul), ("attention", attention),
            ("experts", experts), ("random_numbers", random_numbers), ("symbolic_sizes", symbolic_sizes), ("eager", eager)]


def _artifacts(root: Path) -> set[Path]:
    return {p.parent for p in root.rglob("launch_spec.json") if ".tmp-" not in str(p)}


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in READ_BY_LAUNCH:
        h.update(name.encode() + b"\0" + (directory / name).read_bytes())
    return h.hexdigest()


def collect() -> dict:
    """{case: {kernel name: sha256}} for the corpus, compiled in this (fresh) process."""
    cache = tempfile.mkdtemp(prefix="spyre-golden-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["SPYRE_STRICT"] = "1"
    import torch  # noqa: F401 - after the environment: the cache dir is read at import

    root = Path(cache)  # (artifacts live under <inductor cache>/spyre/<compiler version>/<key>/)
    out, seen = {}, set()
    for name, run in _cases():
        run()
        new = _artifacts(root) - seen
        seen |= new
        # (one kernel may have several artifacts: a symbolic one's buckets and exact sizes; the
        # directory's name is the artifact key, a hash of the kernel IR and the compile options)
        out[name] = {f'{json.loads((d / "launch_spec.json").read_text())["kernel"]}@{d.name[:12]}': _digest(d)
                     for d in sorted(new)}
    return out


def main(argv) -> int:
    got = collect()
    if "--update" in argv:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    for case, kernels in got.items():
        for kernel, digest in sorted(kernels.items()):
            print(f"{case:18} {digest[:16]}  {kernel}")
    print(f"{sum(map(len, got.values()))} programs in {len(got)} cases")
    if "--json" in argv:
        print("JSON:" + json.dumps(got, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
