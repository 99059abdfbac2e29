"""Cost of an allocation + free through PyTorch (torch.empty, then del).

Spyre vs CPU in one run, with an empty device and with 10,000 live blocks
(the allocator's free lists and region scan then hold many entries).
"""

from __future__ import annotations

import torch

from _bench import per_call_us, print_table

PAIRS = 20000


def pair_us(device: str, nbytes: int) -> float:
    def one():
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        del t

    return per_call_us(one, repeats=PAIRS, warmup=200)


def main() -> None:
    rows = []
    for nbytes in (256, 1 << 20):
        cpu = pair_us("cpu", nbytes)
        spyre = pair_us("spyre", nbytes)
        # 10,000 live blocks with every other one freed: a fragmented device.
        held = [torch.empty(512, dtype=torch.uint8, device="spyre") for _ in range(20000)]
        del held[::2]
        crowded = pair_us("spyre", nbytes)
        frag = torch.spyre.memory_stats()["fragmentation"]
        del held
        rows.append([f"{nbytes} B", cpu, spyre, spyre / cpu, crowded, crowded / cpu, f"{frag:.2f}"])
    print_table(
        "torch.empty + del, us per pair (median of 5 x %d)" % PAIRS,
        ["size", "cpu", "spyre", "x cpu", "spyre, 10k live", "x cpu", "fragmentation"],
        rows,
    )


if __name__ == "__main__":
    main()
