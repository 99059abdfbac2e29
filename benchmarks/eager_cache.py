"""The eager cache under pressure (issue 29): what recompiles keep, and what the policy keeps.

Tables, one run:

* leak: `x * 2.0` over 3 shapes cycled 150 times with capacity 2 (every call a miss under plain
  LRU): device memory, live blocks and the modules Inductor holds before and after, RSS growth,
  hits; then what `eager_cache_clear()` + `empty_cache()` give back. Target: no growth.
* policy: 20 shapes cycled 4 times over capacity 8: hits per cycle (plain LRU: 0 every cycle),
  and whether a hot key survives a scan of 40 shapes used once.

`--calls N` (default 150).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="spyre-eager-cache-bench-"))

import torch  # noqa: E402
from torch._inductor.codecache import PyCodeCache  # noqa: E402

from _bench import print_table  # noqa: E402

warnings.filterwarnings("ignore")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _state():
    torch.spyre.synchronize()
    stats = torch.spyre.memory_stats()
    return (torch.spyre.memory_allocated(), stats.get("allocation.all.current", 0), len(PyCodeCache.modules), _rss())


def leak(calls: int) -> None:
    spyre = torch.device("spyre")
    xs = [torch.randn(8 + k, 64, device=spyre) for k in range(3)]
    torch.spyre.set_eager_cache_capacity(2)
    torch.spyre.eager_cache_clear()
    for x in xs:  # (one warm round: Inductor's own first-compile state is not the cache's)
        x * 2.0
    before, hits0 = _state(), torch.spyre.eager_cache_stats().hits
    for i in range(calls):
        xs[i % 3] * 2.0
    after, hits = _state(), torch.spyre.eager_cache_stats().hits - hits0
    torch.spyre.eager_cache_clear()
    torch.spyre.empty_cache()
    cleared = _state()
    rows = [["device memory (B)", before[0], after[0], after[0] - before[0], cleared[0] - after[0]],
            ["live blocks", before[1], after[1], after[1] - before[1], cleared[1] - after[1]],
            ["Inductor modules", before[2], after[2], after[2] - before[2], cleared[2] - after[2]],
            ["RSS (MB)", f"{before[3] / 2**20:.1f}", f"{after[3] / 2**20:.1f}", f"{(after[3] - before[3]) / 2**20:+.1f}",
             f"{(cleared[3] - after[3]) / 2**20:+.1f}"]]
    print_table(f"eager cache: x * 2.0 over 3 shapes, capacity 2, {calls} calls ({hits} hits)",
                ["what", "before", "after", "growth", "clear + empty_cache"], rows)


def policy() -> None:
    spyre = torch.device("spyre")
    xs = [torch.randn(4, 16 + k, device=spyre) for k in range(20)]
    torch.spyre.set_eager_cache_capacity(8)
    torch.spyre.eager_cache_clear()
    per_cycle = []
    for _ in range(4):
        hits = torch.spyre.eager_cache_stats().hits
        for x in xs:
            x + 1.0
        per_cycle.append(torch.spyre.eager_cache_stats().hits - hits)
    hot = torch.randn(4, 100, device=spyre)
    torch.spyre.eager_cache_clear()
    for _ in range(20):
        hot - 1.0
    for k in range(40):
        torch.randn(2, 200 + k, device=spyre) - 1.0
    hits = torch.spyre.eager_cache_stats().hits
    hot - 1.0
    survived = torch.spyre.eager_cache_stats().hits > hits
    print_table("eager cache policy: 20 shapes cycled over capacity 8; a hot key and a scan of 40",
                ["hits per cycle (of 20)", "hot key survives the scan"],
                [[", ".join(map(str, per_cycle)), "yes" if survived else "no"]])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args(argv)
    capacity = torch.spyre.eager_cache_stats().capacity
    try:
        leak(args.calls)
        policy()
    finally:
        torch.spyre.set_eager_cache_capacity(capacity)


if __name__ == "__main__":
    main()
