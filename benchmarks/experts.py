"""The grouped matmul of mixture-of-experts routing on spyre: `.venv/bin/python benchmarks/experts.py`.

Each row compiles a grouped matmul over a routing like
transformers' experts forward makes (each token's top-k of E experts by random logits, the
(token, slot) pairs sorted by expert, offs their cumulative counts), and runs it warm once: the tiny rows in fp32 through ``transformers::grouped_mm_fallback`` (what
the fp32 models call under torch.compile), the scaled ones in bf16 through ``aten._grouped_mm``
(torch.compile takes it in bf16 only).
Columns: the spyre programs of the call, their simulated us, the sum of their rooflines (FLOPs
at the matrix rate and minimum bytes at the stream bandwidth, as each kernel records them),
efficiency = roofline / simulated, bytes moved, and max |err| against the CPU's grouped matmul.

The shapes: Mixtral's and gpt-oss's tiny test configs (benchmarks/_transformers.py: hidden 64,
intermediate 128, 4 experts, top 2; prefill 16 tokens, decode 1) and a scaled one (8 experts,
top 2, hidden 1024, intermediate 2048, 256 tokens / 1 token). Mixtral's weights are
``weight.transpose(-2, -1)`` views (k contiguous), as transformers passes them.
"""

from __future__ import annotations

import time

import torch

from _bench import print_table

F32, B16 = torch.float32, torch.bfloat16
CASES = [  # (label, tokens, K, N, E, top k, dtype)
    ("tiny gate_up prefill", 16, 64, 256, 4, 2, F32),
    ("tiny down prefill", 16, 128, 64, 4, 2, F32),
    ("tiny gate_up decode", 1, 64, 256, 4, 2, F32),
    ("tiny down decode", 1, 128, 64, 4, 2, F32),
    ("scaled gate_up prefill", 256, 1024, 4096, 8, 2, B16),
    ("scaled down prefill", 256, 2048, 1024, 8, 2, B16),
    ("scaled gate_up decode", 1, 1024, 4096, 8, 2, B16),
    ("scaled down decode", 1, 2048, 1024, 8, 2, B16),
]


def routing(tokens: int, E: int, top: int, g) -> torch.Tensor:
    ids = torch.randn(tokens, E, generator=g).topk(top, dim=-1).indices.reshape(-1).sort().values
    return torch.bincount(ids, minlength=E).cumsum(0).to(torch.int32)


def row(label, tokens, K, N, E, top, dtype) -> list:
    g = torch.Generator().manual_seed(0)
    S = tokens * top
    a = (torch.randn(S, K, generator=g) / K ** 0.5).to(dtype)
    w = torch.randn(E, N, K, generator=g).to(dtype).transpose(1, 2)  # Mixtral's layout
    offs = routing(tokens, E, top, g)
    want = torch.nn.functional.grouped_mm(a, w, offs=offs).float()
    if dtype == torch.float32:
        from transformers.integrations import moe  # noqa: F401  (registers torch.ops.transformers)

        op = torch.ops.transformers.grouped_mm_fallback
    else:
        op = torch.nn.functional.grouped_mm
    torch._dynamo.reset()  # (static shapes per row: a second shape would recompile over a symbolic S)
    fn = torch.compile(lambda a, w, o: op(a, w, offs=o), dynamic=False)
    args = [a.to("spyre"), w.to("spyre"), offs.to("spyre")]
    start = time.perf_counter()
    fn(*args)
    torch.spyre.synchronize()
    compile_s = time.perf_counter() - start
    torch.spyre.reset_kernel_reports()
    out = fn(*args)
    torch.spyre.synchronize()
    reports = torch.spyre.kernel_reports()
    sim = sum(r.simulated_us for r in reports)
    roof = sum(r.roofline_us for r in reports)
    moved = sum(r.bytes_moved for r in reports)
    err = (out.cpu().float() - want).abs().max().item()
    return [label, f"{S}x{K}x{N} E{E} {str(dtype)[6:]}", len(reports), sim, roof, roof / sim if sim else 0.0, moved / 1e6, err,
            compile_s]


def main() -> None:
    rows = [row(*case) for case in CASES]
    print_table("grouped matmul (one warm call)",
                ["case", "S x K x N", "programs", "simulated us", "roofline us", "efficiency", "MB moved",
                 "max |err|", "compile s"], rows)


if __name__ == "__main__":
    main()
