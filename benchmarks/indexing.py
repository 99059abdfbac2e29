"""Compiled gathers and scatters on spyre (issue 16): `.venv/bin/python benchmarks/indexing.py`.

Rows (fp16, one call after a warm one):

* embedding: a 32000 x 4096 table, 512 int64 ids (a prefill's token lookup);
* index_copy_: one position written into a (1, 8, 1024, 128) KV cache in
  place (a decode step's cache update).

Columns: simulated us (the timing model's time of the compiled program(s)),
roofline us (the kernels' minimum bytes at the pure-stream bandwidth: a
gather counts the rows it must read, each once; a scatter the rows it
writes), efficiency = roofline / simulated, then the traffic columns
(bytes moved over the minimum: whole sticks, the index columns one element
per stick). Target: efficiency >= 0.85. `--quick` runs a smaller table
(4096 x 1024, 64 ids) instead of the 32000 x 4096 one.
"""

from __future__ import annotations

import sys
import warnings

import torch

from _bench import TRAFFIC_HEADER, print_table, traffic_columns
from _compiled import reports_of_one_call

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def embedding(w, ids):
    return torch.nn.functional.embedding(ids, w)


def kv_update(cache, pos, new):
    cache.index_copy_(2, pos, new)
    return cache


def rows(quick: bool):
    g = torch.Generator().manual_seed(0)
    vocab, dim, tokens = (4096, 1024, 64) if quick else (32000, 4096, 512)
    table = torch.randn(vocab, dim, generator=g).half()
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    cache = torch.randn(1, 8, 1024, 128, generator=g).half()
    pos = torch.tensor([517])
    new = torch.randn(1, 8, 1, 128, generator=g).half()
    return [
        (f"embedding {vocab}x{dim} fp16, {tokens} int64 ids", embedding, (table, ids)),
        ("index_copy_ 1 position into (1, 8, 1024, 128) fp16", kv_update, (cache, pos, new)),
    ]


def main() -> None:
    quick = "--quick" in sys.argv
    out = []
    for name, fn, args in rows(quick):
        dev = [a.to("spyre") for a in args]
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        compiled(*dev)  # compile and warm
        _, reports = reports_of_one_call(compiled, *dev)
        sim = sum(r.simulated_ns for r in reports)
        roof = sum(r.roofline_ns for r in reports)
        out.append([name, len(reports), max(r.cores_used for r in reports), sim / 1e3, roof / 1e3,
                    roof / sim if sim else 0.0, *traffic_columns(reports)])
    print_table("Compiled gathers and scatters (target: efficiency >= 0.85 of the roofline)",
                ["kernel", "programs", "cores", "simulated us", "roofline us", "efficiency", *TRAFFIC_HEADER], out)


if __name__ == "__main__":
    main()
