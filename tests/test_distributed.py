"""torch.distributed on spyre: every collective against gloo's on the CPU, work and streams,
errors, a dead rank, compiled functional collectives and a tensor-parallel model under strict.

Each test spawns its ranks on localhost (spyre_inductor.testing.distributed.run_ranks: bounded
in time, each rank on its own card) and runs many checks per spawn: a rank starts in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spyre_inductor.testing.distributed import run_ranks

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)


# ---- the ranks' side ------------------------------------------------------------------------

def _inputs(rank, dtype, shape, transposed=False):
    g = torch.Generator().manual_seed(rank * 7 + 1)
    x = torch.randint(-4, 5, shape, generator=g) if dtype == torch.int32 else torch.randn(shape, generator=g)
    x = x.to(dtype)
    return x.t() if transposed else x


def _every_collective(rank, world):
    """Each collective on spyre tensors and on the same CPU tensors through gloo; mismatches by name."""
    import torch.distributed as dist

    d = torch.device("spyre", rank)
    bad = []

    def same(name, got, want):
        got = got.cpu() if isinstance(got, torch.Tensor) else [g.cpu() for g in got]
        if isinstance(got, list):
            ok = all(torch.equal(g, w) for g, w in zip(got, want))
        else:
            ok = torch.equal(got, want)
        if not ok:
            bad.append(name)

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "product": dist.ReduceOp.PRODUCT}
    for dtype in DTYPES:
        for transposed in (False, True):
            tag = f"{dtype} {'non-contiguous' if transposed else 'contiguous'}"
            for name, op in ops.items():
                cpu = _inputs(rank, dtype, (6, 4), transposed)
                dev = cpu.to(d) if not transposed else cpu.t().contiguous().to(d).t()
                dist.all_reduce(cpu, op=op)
                dist.all_reduce(dev, op=op)
                same(f"all_reduce {name} {tag}", dev, cpu)
            cpu = _inputs(rank, dtype, (6, 4), transposed)
            dev = cpu.to(d) if not transposed else cpu.t().contiguous().to(d).t()
            dist.broadcast(cpu, src=1)
            dist.broadcast(dev, src=1)
            same(f"broadcast {tag}", dev, cpu)
        x = _inputs(rank, dtype, (5,))
        # avg: gloo has none; sum then divide (truncating for integers, as NCCL's)
        dev = x.to(d)
        dist.all_reduce(dev, op=dist.ReduceOp.AVG)
        total = x.clone()
        dist.all_reduce(total)
        want = total / world if dtype.is_floating_point else torch.div(total, world, rounding_mode="trunc")
        same(f"all_reduce avg {dtype}", dev, want.to(dtype))
        cpu, dev = x.clone(), x.to(d)
        dist.reduce(cpu, dst=0)
        dist.reduce(dev, dst=0)
        same(f"reduce {dtype}", dev, cpu)
        if rank != 0:  # as NCCL: only the root's tensor changes
            same(f"reduce leaves rank {rank}'s tensor {dtype}", dev, x)
        outs_c = [torch.empty_like(x) for _ in range(world)]
        outs_d = [torch.empty_like(x, device=d) for _ in range(world)]
        dist.all_gather(outs_c, x)
        dist.all_gather(outs_d, x.to(d))
        same(f"all_gather {dtype}", outs_d, outs_c)
        whole_c, whole_d = torch.empty(world * 5, dtype=dtype), torch.empty(world * 5, dtype=dtype, device=d)
        dist.all_gather_into_tensor(whole_c, x)
        dist.all_gather_into_tensor(whole_d, x.to(d))
        same(f"all_gather_into_tensor {dtype}", whole_d, whole_c)
        big = _inputs(rank, dtype, (world * 3,))
        piece_c, piece_d = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype, device=d)
        dist.reduce_scatter_tensor(piece_c, big.clone())
        dist.reduce_scatter_tensor(piece_d, big.to(d))
        want = big.clone()
        dist.all_reduce(want)
        same(f"reduce_scatter_tensor {dtype}", piece_d, want[rank * 3:(rank + 1) * 3])
        dist.reduce_scatter(piece_d, [p.to(d) for p in big.chunk(world)])
        same(f"reduce_scatter (list) {dtype}", piece_d, want[rank * 3:(rank + 1) * 3])
        out_c, out_d = torch.empty_like(big), torch.empty_like(big, device=d)
        dist.all_to_all_single(out_c, big)
        dist.all_to_all_single(out_d, big.to(d))
        same(f"all_to_all_single {dtype}", out_d, out_c)
        splits_in = [1 + r for r in range(world)]  # rank r sends 1 + r to everyone... uneven
        splits_out = [1 + rank] * world
        src = _inputs(rank, dtype, (sum(splits_in),))
        uo_c = torch.empty(sum(splits_out), dtype=dtype)
        uo_d = torch.empty(sum(splits_out), dtype=dtype, device=d)
        dist.all_to_all_single(uo_c, src, splits_out, splits_in)
        dist.all_to_all_single(uo_d, src.to(d), splits_out, splits_in)
        same(f"all_to_all_single uneven {dtype}", uo_d, uo_c)
        lists_c = [torch.empty(3, dtype=dtype) for _ in range(world)]
        lists_d = [torch.empty(3, dtype=dtype, device=d) for _ in range(world)]
        dist.all_to_all(lists_c, list(big.chunk(world)))
        dist.all_to_all(lists_d, [p.to(d) for p in big.chunk(world)])
        same(f"all_to_all (list) {dtype}", lists_d, lists_c)
        gl_c = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        gl_d = [torch.empty_like(x, device=d) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gl_c, dst=0)
        dist.gather(x.to(d), gl_d, dst=0)
        if rank == 0:
            same(f"gather {dtype}", gl_d, gl_c)
        sc_c, sc_d = torch.empty_like(x), torch.empty_like(x, device=d)
        dist.scatter(sc_c, [x + i for i in range(world)] if rank == 0 else None, src=0)
        dist.scatter(sc_d, [(x + i).to(d) for i in range(world)] if rank == 0 else None, src=0)
        same(f"scatter {dtype}", sc_d, sc_c)
        # send/recv, and a batch of P2P ops in an order that would deadlock if sends waited
        peer = (rank + 1) % world
        prev = (rank - 1) % world
        got = torch.zeros_like(x, device=d)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prev), dist.P2POp(dist.isend, x.to(d), peer)])
        for r in reqs:
            r.wait()
        same(f"batch_isend_irecv {dtype}", got, _inputs(prev, dtype, (5,)))
        if rank == 0:
            dist.send(x.to(d), 1)
        elif rank == 1:
            got = torch.zeros_like(x, device=d)
            dist.recv(got, 0)
            same(f"send/recv {dtype}", got, _inputs(0, dtype, (5,)))
    dist.barrier()
    return bad


def _work_and_streams(rank, world):
    import torch.distributed as dist

    d = torch.device("spyre", rank)
    out = {}
    x = torch.ones(1 << 16, device=d)
    side = torch.spyre.Stream(d)
    with torch.spyre.stream(side):
        work = dist.all_reduce(x, async_op=True)
    # the collective went on the side stream; wait() orders the current stream after it
    work.wait()
    out["value after wait"] = x.sum().item()
    out["completed"] = work.is_completed()
    out["future"] = work.get_future().wait()[0].cpu()[:2].tolist()
    out["type"] = type(work).__name__
    # the link runs beside the compute pipeline: a collective on one stream overlaps a program on another
    a = torch.randn(256, 256, device=d)
    torch.spyre.synchronize()
    with torch.spyre.timeline() as tl:
        comm = torch.spyre.Stream(d)
        big = torch.ones(1 << 20, device=d)
        with torch.spyre.stream(comm):
            w = dist.all_reduce(big, async_op=True)
        for _ in range(3):
            a = a @ a.t() / 256
        w.wait()
    torch.spyre.synchronize()
    link = [t for dev, t in tl.tickets if t.pipeline == "link"]
    compute = [t for dev, t in tl.tickets if t.pipeline == "compute"]
    out["link ops"] = [t.name for t in link]
    out["link sim us"] = (link[0].sim_end - link[0].sim_start) / 1e3
    # wait() alone orders the current stream after the collective: an op that touches nothing the
    # collective does starts, in simulated time, after it ends
    other = torch.randn(64, 64, device=d)
    torch.spyre.synchronize()
    with torch.spyre.timeline() as tl2:
        with torch.spyre.stream(comm):
            w2 = dist.all_reduce(big, async_op=True)
        w2.wait()
        other = other * 3
    torch.spyre.synchronize()
    link2 = [t for _, t in tl2.tickets if t.pipeline == "link"][0]
    after = [t for _, t in tl2.tickets if t.pipeline in ("compute", "d2d", "host") and t.stream.id != comm.stream_id]
    out["after wait starts after the link"] = bool(after) and all(t.sim_start >= link2.sim_end for t in after)
    out["overlap"] = any(c.sim_start < link[0].sim_end and link[0].sim_start < c.sim_end for c in compute)
    out["tracks"] = {e["args"]["name"] for e in tl.trace()["traceEvents"] if e.get("ph") == "M"}
    return out


def _bad_input(rank, world):
    import torch.distributed as dist

    d = torch.device("spyre", rank)
    errors = {}
    try:
        dist.all_reduce(torch.ones(3 + rank, device=d))
        torch.spyre.synchronize()
    except Exception as e:  # noqa: BLE001
        errors["sizes"] = str(e)
    _clear(rank)
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4, device=d))
        else:
            dist.broadcast(torch.ones(4, device=d), src=0)
        torch.spyre.synchronize()
    except Exception as e:  # noqa: BLE001
        errors["collective"] = str(e)
    _clear(rank)
    try:
        dist.all_gather([torch.empty(2) for _ in range(world)], torch.ones(2, device=d))
    except Exception as e:  # noqa: BLE001
        errors["cpu tensor"] = str(e)
    try:
        dist.all_reduce(torch.ones(2, device=d), op=dist._make_nccl_premul_sum(2.0))
    except Exception as e:  # noqa: BLE001
        errors["premul"] = f"{type(e).__name__}: {e}"
    try:
        dist.recv(torch.ones(2, device=d))
    except Exception as e:  # noqa: BLE001
        errors["anysource"] = f"{type(e).__name__}: {e}"
    # the group and the device still work after all of that
    x = torch.ones(2, device=d)
    dist.all_reduce(x)
    errors["after"] = x.cpu().tolist()
    return errors


def _clear(rank):
    from spyre_inductor.device import queues

    queues.queue(rank).clear_error()


def _dead_rank(rank, world):
    import torch.distributed as dist

    d = torch.device("spyre", rank)
    x = torch.ones(4, device=d)
    dist.all_reduce(x)
    torch.spyre.synchronize()
    if rank == 1:
        os._exit(0)  # dies without a word
    return _how_an_all_reduce_fails(x)


def _how_an_all_reduce_fails(x):
    """The error an all_reduce of `x` ends in, and the seconds it took to come."""
    import time

    import torch.distributed as dist

    start = time.monotonic()
    try:
        dist.all_reduce(x)
        torch.spyre.synchronize()
        return "no error"
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - start}


def _hung_rank(rank, world):
    import time

    import torch.distributed as dist

    d = torch.device("spyre", rank)
    if rank == 1:
        time.sleep(12)  # alive, but never joins the collective
        return None
    return _how_an_all_reduce_fails(torch.ones(4, device=d))


def _two_groups_on_two_streams(rank, world):
    import time

    import torch.distributed as dist

    from spyre_inductor.device import queues
    from spyre_runtime.queue import HostCallback

    d = torch.device("spyre", rank)
    other = dist.new_group([0, 1])
    s1, s2 = torch.spyre.Stream(d), torch.spyre.Stream(d)
    x, y = torch.ones(4, device=d), torch.full((4,), 2.0, device=d)
    torch.spyre.synchronize()
    start = time.monotonic()
    with torch.spyre.stream(s1):
        if rank == 0:  # rank 0's first collective is held back: its second group's is ready first
            queues.queue(rank).enqueue(s1.stream_id, HostCallback(lambda: time.sleep(2), name="slow"))
        dist.all_reduce(x)
    with torch.spyre.stream(s2):
        dist.all_reduce(y, group=other)
    torch.spyre.synchronize()
    return x.cpu().tolist(), y.cpu().tolist(), time.monotonic() - start


def _compiled_functional(rank, world):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from spyre_inductor.device.fallback import strict_mode

    d = torch.device("spyre", rank)

    def f(x, w):
        y = funcol.all_reduce(x @ w, "sum", dist.group.WORLD)
        g = funcol.all_gather_tensor(torch.relu(y) * 2, 0, dist.group.WORLD)
        s = funcol.reduce_scatter_tensor(g, "sum", 0, dist.group.WORLD)
        return s + 1

    x = _inputs(rank, torch.float32, (4, 8))
    w = _inputs(rank + 10, torch.float32, (8, 16))
    want = f(x, w)
    with strict_mode(True), torch.spyre.timeline() as tl:
        got = torch.compile(f)(x.to(d), w.to(d)).cpu()
    kinds = [t.pipeline for _, t in tl.tickets if t.pipeline in ("compute", "link")]
    return {"err": (got - want).abs().max().item(), "order": kinds}


def _tensor_parallel(rank, world, steps):
    from torch.distributed.device_mesh import init_device_mesh

    from spyre_inductor.device.fallback import strict_mode
    from spyre_inductor.testing import models
    from spyre_inductor.testing.tensor_parallel import local_caches, parallelize_llama

    mesh = init_device_mesh("spyre", (world,))
    d = torch.device("spyre", rank)
    cfg = models.llama_config(n_layers=2, d=256, vocab=512, n_kv_heads=4)
    ref = models.build(cfg)
    ids, pos, k, v = models.llama_inputs(ref, seq=16, cache_len=32)
    kr, vr = [t.clone() for t in k], [t.clone() for t in v]
    model = parallelize_llama(models.build(cfg).to(d), mesh)
    kl, vl = local_caches(k, rank, world, d), local_caches(v, rank, world, d)
    tokens, ref_tokens = [], []
    with strict_mode(True), torch.no_grad():
        step = torch.compile(model)
        logits = step(ids.to(d), pos.to(d), kl, vl).cpu()
        want = ref(ids, pos, kr, vr)
        err = (logits - want).abs().max().item()
        nxt, ref_nxt = logits[:, -1].argmax(-1, keepdim=True), want[:, -1].argmax(-1, keepdim=True)
        for i in range(steps):
            p = torch.tensor([16 + i])
            tokens.append(nxt.item())
            ref_tokens.append(ref_nxt.item())
            nxt = step(nxt.to(d), p.to(d), kl, vl).cpu()[:, -1].argmax(-1, keepdim=True)
            ref_nxt = ref(ref_nxt, p, kr, vr)[:, -1].argmax(-1, keepdim=True)
    return {"err": err, "tokens": tokens, "ref tokens": ref_tokens}


# ---- the tests --------------------------------------------------------------------------------

def test_no_backend_named_picks_spyre_for_spyre_tensors():
    import torch.distributed as dist

    assert dist.Backend.default_device_backend_map["spyre"] == "spyre"
    assert "spyre" in dist.Backend.backend_list


def test_every_collective_matches_gloo_on_the_cpu():
    bad = run_ranks(_every_collective, 2, env={"SPYRE_STRICT": "1"})  # every op around them a spyre program
    assert bad == [[], []]


def test_work_waits_in_stream_order_and_the_link_overlaps_compute():
    out = run_ranks(_work_and_streams, 2, env={"SPYRE_STRICT": "1"})[0]
    assert out["type"] == "SpyreWork"
    assert out["value after wait"] == 2 * (1 << 16)
    assert out["future"] == [2.0, 2.0]
    assert out["completed"]
    assert out["after wait starts after the link"]
    assert out["link ops"] == ["all_reduce 4194304 B over 2 ranks"]
    # 4 MiB all_reduce over 2 cards on the default link: 2 steps of (5 us + 2 MiB / 25 GB/s)
    assert out["link sim us"] == pytest.approx(2 * (5 + 2 * 2**20 / 25e3), rel=1e-6)
    assert out["overlap"]
    assert "pipeline link" in out["tracks"]  # the timeline a person opens shows it


def test_bad_input_names_the_collective_the_rank_and_the_mismatch():
    e0, e1 = run_ranks(_bad_input, 2, env={"SPYRE_STRICT": "1"})
    assert "all_reduce on rank 0 of 2" in e0["sizes"] and "rank 1 has elements 4, rank 0 has 3" in e0["sizes"]
    assert "all_reduce on rank 1 of 2" in e1["sizes"]
    assert "rank 1 called broadcast instead" in e0["collective"]
    assert "spyre:0" in e0["cpu tensor"] and "cpu" in e0["cpu tensor"] and "all_gather on rank 0" in e0["cpu tensor"]
    assert e0["premul"].startswith("NotImplementedError") and "reduce op" in e0["premul"]
    assert e0["anysource"].startswith("NotImplementedError") and "any source" in e0["anysource"]
    assert e0["after"] == e1["after"] == [2.0, 2.0]


def test_two_groups_do_not_wait_behind_each_other_on_the_link():
    # each group's collectives have a link worker of their own: rank 1 runs the second group's
    # first, rank 0 the first group's, and neither blocks the other
    for x, y, seconds in run_ranks(_two_groups_on_two_streams, 2, group_timeout=20, timeout=120):
        assert x == [2.0] * 4 and y == [4.0] * 4
        assert seconds < 15


def test_a_dead_rank_makes_the_others_fail_not_hang():
    out = run_ranks(_dead_rank, 2, group_timeout=10, timeout=120)
    assert out[1] is None  # (it exited without a result)
    assert "DistBackendError" in out[0]["error"] and "all_reduce on rank 0 of 2" in out[0]["error"]
    assert out[0]["seconds"] < 30


def test_a_rank_that_never_joins_times_out_after_the_group_timeout():
    out = run_ranks(_hung_rank, 2, group_timeout=4, timeout=120)
    assert "all_reduce on rank 0 of 2" in out[0]["error"] and "Timed out" in out[0]["error"]
    assert 3 < out[0]["seconds"] < 12


def test_functional_collectives_compile_and_run_in_order_under_strict():
    for out in run_ranks(_compiled_functional, 2):
        assert out["err"] < 1e-4
        # matmul, then the all_reduce, relu*2, all_gather, reduce_scatter, +1: links between programs
        assert out["order"].count("link") == 3 and out["order"][0] == "compute" and out["order"][-1] == "compute"


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_llama_matches_one_card_and_decodes_the_same_tokens(world):
    for out in run_ranks(_tensor_parallel, world, 3, timeout=600):
        assert out["err"] < 2e-4
        assert out["tokens"] == out["ref tokens"]


def test_torchrun_gives_each_process_its_card(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        dist.init_process_group()  # makes spyre:LOCAL_RANK current
        rank = int(os.environ["LOCAL_RANK"])
        x = torch.full((4,), float(rank + 1), device="spyre")
        dist.all_reduce(x)
        print(f"rank {rank} on {x.device} {dist.get_backend_config()} {x.cpu().tolist()}")
        dist.destroy_process_group()
    """))
    env = {k: v for k, v in os.environ.items() if k != "SPYRE_NUM_DEVICES"}
    from spyre_inductor.testing.distributed import free_port

    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), str(script)],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 on spyre:0 spyre:spyre [3.0, 3.0, 3.0, 3.0]" in r.stdout
    assert "rank 1 on spyre:1 spyre:spyre [3.0, 3.0, 3.0, 3.0]" in r.stdout


def test_link_model_prices_each_pattern():
    from spyre_runtime.device.link import LinkCosts

    link = LinkCosts(25.0, 5.0)
    n = 8 << 20
    assert link.ns("ring_reduce", n, 4) == pytest.approx(6 * (5000 + n / 4 / 25))
    assert link.ns("ring_gather", n, 4) == pytest.approx(3 * (5000 + n / 4 / 25))
    assert link.ns("p2p", n, 2) == pytest.approx(5000 + n / 25)
    assert link.ns("ring_reduce", n, 1) == 0.0
    with pytest.raises(ValueError, match="unknown link pattern"):
        link.ns("tree", n, 2)


def test_link_figures_are_overridable_from_the_environment(monkeypatch):
    from spyre_runtime.hardware import link_from_env

    monkeypatch.setenv("SPYRE_LINK_GBPS", "50")
    monkeypatch.setenv("SPYRE_LINK_LATENCY_US", "2")
    hw = link_from_env()
    assert (hw.card_link_gbps, hw.card_link_latency_us) == (50.0, 2.0)


def test_the_readme_tensor_parallel_example_runs_under_torchrun():
    from spyre_inductor.testing.distributed import free_port

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "SPYRE_NUM_DEVICES"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(free_port()), os.path.join(root, "examples", "tensor_parallel_llama.py"), "--tokens", "3"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 ranks, tokens" in r.stdout and "the same as the unsplit model's" in r.stdout
    assert "communication" in r.stdout
