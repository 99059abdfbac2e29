"""Compiled conv2d on spyre (issue 31): `.venv/bin/python benchmarks/conv.py`.

Rows (fp16, one run, forward): ViT's patch embedding (1x3x224x224 -> 768, kernel 16 stride 16,
bias) with an NCHW image as the model hands it over, and a ResNet-style 64 -> 64 3x3 stride 1
padding 1 on 56x56, NCHW and channels-last. Columns (_compiled.kernel_row): the programs one
call runs, the most cores one used, the timing model's time summed over them, the sum of their
rooflines (FLOPs at the sustained matrix rate or minimum bytes at the stream bandwidth, per
program), efficiency = roofline / simulated, bytes moved and their minimum, what each program's
plan chose (the conv family's `conv` plans, or the patch-copy lowering's pointwise + matmul), max
|err| against the CPU in fp32, compile seconds.

Measured (issue 31), before the conv family (pad, patch copy, matmul) -> with it:

  row                                  simulated us     bytes moved            efficiency
  ViT patch embed 3x224x224 -> 768     50.6 -> 42.1     4886016 -> 3380736     0.394 -> 0.377
  3x3 s1 64->64 56x56 NCHW              122 -> 34.2    16708096 -> 4077824     0.586 -> 0.525
  3x3 s1 64->64 56x56 channels-last     115 -> 31.0    15905280 -> 3676416     0.575 -> 0.577
  3x3 s2 64->128 56x56 channels-last   PlanError -> 32.4 (the matmul's ring plan, see the report)

ViT-B's patch embedding in its model (conv, flatten(2).transpose(1, 2), + positions, layer
norm): 79.7 us in 4 programs -> 42.9 us in 2 (the conv's channels-last output is what the
transpose reads: no copy, and the layer norm reads contiguous rows).

A compiled training step's backward (grad input, weight, bias) of the 3x3 s1 64->64 channels-last
conv: 2507 us (346 MB moved) -> 154 us (19.8 MB): grad_input the family's conv of the flipped
weight, grad_weight's patch copy in the forward's (kh, kw, c) column order.

(the stride-1 rows through the shifted window, the weight laid out [KH, KW, C, OC] and shared
over the ring: the conv program 13 us; with gathered runs they were 64.5 / 61.4 us. The rest is
Inductor's pointwise copies around it: the padded channels-last image, the weight, and the
output made contiguous, as the graph's output promises.
Efficiency falls where time drops: the roofline is summed per program, and the patch copy's
programs were each near their own roofline while moving far more than the conv needs.)
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from _bench import TRAFFIC_HEADER, print_table
from _compiled import KERNEL_HEADER, kernel_row, plan_labels

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def conv(stride, padding):
    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding)
    return fn


ROWS = [
    # name, image shape, weight shape, stride, padding, channels-last image
    ("ViT patch embed 3x224x224 -> 768 k16 s16", (1, 3, 224, 224), (768, 3, 16, 16), 16, 0, False),
    ("3x3 s1 64->64 56x56 NCHW", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, False),
    ("3x3 s1 64->64 56x56 channels-last", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, True),
    ("3x3 s2 64->128 56x56 channels-last", (1, 64, 56, 56), (128, 64, 3, 3), 2, 1, True),
]


def inputs(shape, wshape, channels_last):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(*wshape, generator=g) / (wshape[1] * wshape[2] * wshape[3]) ** 0.5
    b = torch.randn(wshape[0], generator=g)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x, w, b


def label(plan) -> str:
    return plan["family"]


def main() -> None:
    rows = []
    for name, shape, wshape, stride, padding, cl in ROWS:
        fn = conv(stride, padding)
        x, w, b = inputs(shape, wshape, cl)
        half = [t.half() for t in (x, w, b)]
        if cl:
            half[0] = half[0].contiguous(memory_format=torch.channels_last)
        want = fn(*[t.float() for t in half])
        dev = [t.to("spyre") for t in half]
        if cl:
            dev[0] = half[0].to("spyre")  # (keeps the channels-last strides)
        torch._dynamo.reset()
        try:
            rows.append(kernel_row(name, fn, dev, half, want,
                                   lambda records: plan_labels([r for r in records if r.kernel is not None], label)))
        except Exception as e:  # (a row that does not compile says why, the others still print)
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "-", "-",
                         f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][-140:]}", "-", "-"])
    print_table("Compiled conv2d forward, fp16", KERNEL_HEADER + TRAFFIC_HEADER + ["plans", "max |err|",
                                                                                  "compile s"], rows)


def training_step(stride, padding):
    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding).square().sum()
    return fn


BACKWARD_ROWS = [ROWS[2]]


def backward_table() -> None:
    """A compiled training step's forward and backward (grad input, weight, bias), fp16: the
    programs of the backward call, summed."""
    from _compiled import compile_seconds, reports_of_one_call

    rows = []
    for name, shape, wshape, stride, padding, cl in BACKWARD_ROWS:
        x, w, b = inputs(shape, wshape, cl)
        dev = [t.half().to("spyre") for t in (x, w, b)]
        if cl:
            dev[0] = x.half().contiguous(memory_format=torch.channels_last).to("spyre")
        for t in dev:
            t.requires_grad_()
        torch._dynamo.reset()
        fn = training_step(stride, padding)
        _, compiled = compile_seconds(fn, *dev)
        loss = compiled(*dev)
        torch.spyre.synchronize()
        torch.spyre.reset_kernel_reports()
        loss.backward()
        torch.spyre.synchronize()
        reports = torch.spyre.kernel_reports()
        sim = sum(r.simulated_ns for r in reports)
        roof = sum(r.roofline_ns for r in reports)
        rows.append([name + " backward", len(reports), max(r.cores_used for r in reports), sim / 1e3, roof / 1e3,
                     roof / sim if sim else 0.0, sum(r.bytes_moved for r in reports)])
    print_table("Compiled conv2d backward (grad input, weight, bias), fp16",
                KERNEL_HEADER + ["bytes moved"], rows)


class VitEmbedding(torch.nn.Module):
    """ViT-B's patch embedding as the model uses it: the conv, flatten(2).transpose(1, 2), the
    position embeddings added, a layer norm."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 768, 16, 16)
        self.pos = torch.nn.Parameter(torch.randn(1, 196, 768))
        self.norm = torch.nn.LayerNorm(768)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2) + self.pos)


def model_table() -> None:
    torch.manual_seed(0)
    model, x = VitEmbedding().half(), torch.randn(1, 3, 224, 224).half()
    with torch.no_grad():
        want = model.float()(x.float())
        model.half().to("spyre")
        torch._dynamo.reset()
        compiled = torch.compile(model)
        dev = x.to("spyre")
        compiled(dev)
        torch.spyre.synchronize()
        torch.spyre.reset_kernel_reports()
        out = compiled(dev)
        torch.spyre.synchronize()
        reports = torch.spyre.kernel_reports()
    sim = sum(r.simulated_ns for r in reports)
    roof = sum(r.roofline_ns for r in reports)
    print_table("Compiled ViT-B patch embedding in its model (conv, flatten, transpose, + positions, layer norm), "
                "fp16", KERNEL_HEADER + ["max |err|"],
                [["ViT-B embedding 1x3x224x224", len(reports), max(r.cores_used for r in reports), sim / 1e3,
                  roof / 1e3, roof / sim if sim else 0.0, (out.cpu().float() - want).abs().max().item()]])


if __name__ == "__main__":
    main()
    backward_table()
    model_table()
