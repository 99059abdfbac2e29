"""`make demo`: what the spyre device can do today.

Until the compiler lands this shows the device itself: tensors moved to
spyre and back, a small model run through the CPU fallback and checked against
CPU, streams and events, and the device's memory statistics.
"""

import os
import warnings

import torch
import torch.nn as nn

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    section("device")
    props = torch.spyre.get_device_properties()
    print(f"torch {torch.__version__}; accelerator: {torch.accelerator.current_accelerator()}; "
          f"{torch.spyre.device_count()} x {props.name}")
    print(f"  {props.cores} cores, {props.scratchpad_bytes // 1024} KiB scratchpad per core, "
          f"{props.stick_bytes}-byte sticks, {props.total_memory / 2**30:.0f} GiB device memory")

    section("tensors to the device and back")
    x = torch.randn(4, 6)
    d = x.to("spyre")
    print(f"  {tuple(d.shape)} {d.dtype} on {d.device}; round trip exact: {torch.equal(d.cpu(), x)}")
    print(f"  transposed view shares storage: {d.t().untyped_storage().data_ptr() == d.untyped_storage().data_ptr()}")
    print(f"  {d[:2, :3]}")

    section("a small model on spyre vs CPU (ops run through the CPU fallback for now)")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    batch = torch.randn(32, 64)
    expected = model(batch)
    model_s = model.to("spyre")
    got = model_s(batch.to("spyre"))
    got.sum().backward()
    err = (got.detach().cpu() - expected.detach()).abs().max().item()
    print(f"  output {tuple(got.shape)} on {got.device}; max |spyre - cpu| = {err:.2e}")
    print(f"  gradients on device: {all(p.grad.device.type == 'spyre' for p in model_s.parameters())}")

    section("streams, events and the simulated timeline")
    side = torch.spyre.Stream(priority=-1)
    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    chunks = [torch.randn(512, 512).pin_memory() for _ in range(4)]
    os.makedirs("artifacts", exist_ok=True)
    with torch.spyre.timeline("artifacts/timeline.json") as tl:
        start.record()
        outs = []
        for i, chunk in enumerate(chunks):
            stream = side if i % 2 else torch.spyre.current_stream()
            with torch.spyre.stream(stream):
                outs.append((chunk.to("spyre", non_blocking=True) * 2).sum())
        torch.spyre.current_stream().wait_stream(side)
        end.record()
    total = sum(o.item() for o in outs)
    expected = sum((c * 2).sum().item() for c in chunks)
    print(f"  4 chunks over 2 streams: sum {total:.3f} vs CPU {expected:.3f}; "
          f"{start.elapsed_time(end):.3f} ms simulated device time")
    busy = {p: tl.busy_ns(p) / 1e3 for p in ("h2d", "host")}
    print(f"  simulated busy: h2d {busy['h2d']:.1f} us, host (fallback ops) {busy['host']:.1f} us; "
          f"trace with {len(tl.tickets)} operations in artifacts/timeline.json (open in Perfetto)")

    section("a hand-written dataflow program on the simulated cores")
    from spyre_runtime.program import run_program
    from spyre_runtime.program.handwritten import tiled_matmul

    program = tiled_matmul(256, 512, 256, "fp16", cores=4, tile_k=128)
    a, b = torch.randn(256, 512).half(), torch.randn(512, 256).half()
    torch.spyre.reset_kernel_reports()
    out = run_program(program, a=a, b=b)["out"]
    (report,) = torch.spyre.kernel_reports()
    ref = (a.float() @ b.float()).half()
    ulp = (out.cpu().float() - ref.float()).abs().max().item()
    instrs = sum(len(i) for c in program.cores for _, i in c.units)
    print(f"  {program.name}: {program.notes}")
    print(f"  {len(program.cores)} cores, {instrs} instructions; max |spyre - cpu fp32->fp16| = {ulp:.3g} "
          "(fp32 sums in another order, one fp16 rounding; the tests pin the bound)")
    print(f"  kernel report: {report.simulated_us:.1f} us simulated, "
          f"roofline {report.roofline_us:.1f} us, efficiency {report.efficiency:.2f}, "
          f"bottleneck {report.bottleneck}, {report.bytes_moved:,} bytes moved, {report.flops:,} flops")
    listing = program.listing().splitlines()
    start = next(i for i, line in enumerate(listing) if line.startswith("core 0"))
    print("  listing (core 0, first lines):")
    for line in listing[start:start + 14]:
        print("    " + line)

    section("device memory")
    stats = torch.spyre.memory_stats()
    free, total = torch.spyre.mem_get_info()
    print(f"  allocated {torch.spyre.memory_allocated():,} B (peak {torch.spyre.max_memory_allocated():,} B), "
          f"{stats['allocation.all.current']} live blocks, "
          f"{stats['allocation.all.allocated']} allocations so far")
    print(f"  free {free / 2**30:.2f} GiB of {total / 2**30:.0f} GiB; "
          f"{stats['regions.current']} of {stats['regions.budget']} region handles in use ({stats['mode']} mode)")
    print(f"  the model's first weight lives at {torch.spyre.describe(model_s[0].weight)}")
    try:
        torch.empty(2**60, dtype=torch.uint8, device="spyre")
    except torch.OutOfMemoryError as e:
        print(f"  an impossible request fails cleanly: {e}".splitlines()[0])
    print(f"  and the device still works: {torch.ones(3, device='spyre').sum().item()}")


if __name__ == "__main__":
    main()
