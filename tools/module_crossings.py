"""How many module boundaries one compile crosses: `python tools/module_crossings.py`.

Compiles relu(a * b + 1) on spyre with Inductor's caches off (a warm-up compile of another shape
first, so imports are done) and follows every Python call made by this project's code: the
modules of spyre_inductor and spyre_runtime it ran in, the distinct caller -> callee module pairs
(the boundaries crossed), and how often each module was entered from another one.
"""

from __future__ import annotations

import collections
import os
import sys

os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
os.environ["SPYRE_STRICT"] = "1"

import torch  # noqa: E402

OURS = ("spyre_inductor", "spyre_runtime")


def main() -> int:
    fn = lambda a, b: torch.relu(a * b + 1)  # noqa: E731
    torch.compile(fn)(torch.randn(8, 64).to("spyre"), torch.randn(8, 64).to("spyre")).cpu()
    torch._dynamo.reset()
    a, b = torch.randn(64, 96).to("spyre"), torch.randn(64, 96).to("spyre")
    compiled = torch.compile(fn)
    pairs, entered = collections.Counter(), collections.Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith(OURS):
            return
        back = frame.f_back
        caller = back.f_globals.get("__name__", "") if back is not None else ""
        if caller != callee:
            entered[callee] += 1
            if caller.startswith(OURS):
                pairs[(caller, callee)] += 1

    sys.setprofile(profile)
    try:
        compiled(a, b)
    finally:
        sys.setprofile(None)
    mods = {m for p in pairs for m in p} | set(entered)
    print(f"modules run: {len(mods)}; distinct module boundaries crossed (caller -> callee): {len(pairs)}; "
          f"calls across a boundary: {sum(pairs.values())}")
    inner = {p: n for p, n in pairs.items() if all(m.startswith("spyre_inductor") for m in p)}
    print(f"within the compiler (spyre_inductor): modules run: {len({m for p in inner for m in p})}; "
          f"distinct boundaries crossed: {len(inner)}")
    print("entered from another module, most often:")
    for m, n in entered.most_common(8) + [(m, n) for m, n in entered.items() if m.endswith(".backend")]:
        print(f"  {n:6}  {m}")
    if "-v" in sys.argv:
        for (x, y), n in sorted(pairs.items()):
            print(f"  {n:6}  {x} -> {y}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
