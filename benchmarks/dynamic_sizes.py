"""Sizes a bucket cannot serve (issue 29): one graph, a kernel per new value at launch.

One table, one run, under SPYRE_STRICT=1, in a fresh Inductor cache: for each case (softmax
over a varying last dim and a matmul over a varying K, both with dynamic=True; a matmul and
SDPA whose sizes Dynamo's automatic dynamic shapes make symbolic), the graphs Dynamo made over
all the sizes, the median host time of a call at a new size (its kernels compiled and prepared
at first launch) and of a call at a size seen before, and the same function compiled with
dynamic=False, which recompiles the graph at each new size (before issue 29 the dynamic runs did
that too, by a guard per size, until Dynamo's limit of 8 graphs, and then ran eagerly).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="spyre-dynamic-bench-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from _bench import print_table  # noqa: E402
from spyre_inductor.device.fallback import strict_mode  # noqa: E402

warnings.filterwarnings("ignore")
torch._dynamo.config.cache_size_limit = 64  # (the static runs may recompile past 8 here)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


CASES = [
    ("softmax, last dim varies (dynamic=True)", lambda x: torch.softmax(x, -1), True,
     [[(8, n)] for n in (64, 100, 128, 200, 256, 300, 320, 400, 500, 600)]),
    ("matmul, K varies (dynamic=True)", lambda a, b: a @ b, True,
     [[(48, k), (k, 24)] for k in (100, 128, 200, 256, 300, 320, 400, 500)]),
    ("matmul, M K N vary (automatic dynamic)", lambda a, b: a @ b, None,
     [[(m, k), (k, n)] for m, k, n in ((8, 64, 32), (16, 128, 64), (4, 256, 96), (2, 512, 200), (12, 96, 40))]),
    ("SDPA, batch heads length vary (automatic)", _sdpa, None,
     [[(b, h, n, 64)] * 3 for b, h, n in ((1, 4, 32), (2, 8, 64), (4, 12, 128), (3, 6, 100), (2, 4, 40))]),
]


def _run(fn, dynamic, shapes):
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, dynamic=dynamic)
    new, again = [], []
    for k, shape in enumerate(shapes):
        args = [torch.randn(*s).to("spyre") for s in shape]
        for times in (new, again):
            start = time.perf_counter()
            compiled(*args)
            torch.spyre.synchronize()
            if k >= 2:  # (the first two calls: Dynamo's own static and dynamic compiles)
                times.append(time.perf_counter() - start)
    return counters["stats"]["unique_graphs"], statistics.median(new), statistics.median(again)


def main(argv=None) -> None:
    rows = []
    for name, fn, dynamic, shapes in CASES:
        with strict_mode(True):
            graphs, new, again = _run(fn, dynamic, shapes)
            static_graphs, static_new, _ = _run(fn, False, shapes)
        rows.append([name, len(shapes), graphs, f"{new * 1e3:.0f}", f"{again * 1e3:.1f}", static_graphs,
                     f"{static_new * 1e3:.0f}"])
    print_table("sizes specialized per value at launch (SPYRE_STRICT=1; ms are host time per call, median)",
                ["case", "sizes", "graphs", "new size ms", "seen size ms", "graphs (dynamic=False)",
                 "new size ms (dynamic=False)"], rows)


if __name__ == "__main__":
    main()
