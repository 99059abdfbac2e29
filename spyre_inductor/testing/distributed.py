"""Running a function on several ranks on localhost, as tests and benchmarks do.

``run_ranks(fn, world, *args)`` spawns `world` processes (torch.multiprocessing, spawn start
method), each a rank of a default process group initialised with no backend named (so the
spyre backend is picked) on its own card spyre:rank, calls ``fn(rank, world, *args)`` there and
returns each rank's result. It is bounded in time: a rank still running after `timeout`
seconds is killed and the call raises, naming the ranks that did not finish.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn, world: int, args, results, group_timeout: float, init: bool) -> None:
    import torch
    import torch.distributed as dist

    try:
        if init:
            dist.init_process_group(rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=group_timeout))
            torch.spyre.set_device(rank)
        results.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as e:  # noqa: BLE001 - handed to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if init and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a failed group may not shut down cleanly
                pass


def run_ranks(fn, world: int, *args, timeout: float = 300.0, group_timeout: float = 60.0, init: bool = True,
              env: dict | None = None) -> list:
    """fn(rank, world, *args) on each rank; their results, by rank. Raises if a rank failed or
    did not finish within `timeout` seconds."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    saved = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), SPYRE_NUM_DEVICES=str(world),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **(env or {}))
    try:
        procs = []
        for rank in range(world):
            p = ctx.Process(target=_rank_main, args=(rank, fn, world, args, results, group_timeout, init),
                            daemon=True)
            p.start()
            procs.append(p)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    got: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            if not results.empty():
                rank, status, value = results.get()
                got[rank] = (status, value)
                continue
            if time.monotonic() > deadline:
                missing = sorted(set(range(world)) - set(got))
                raise TimeoutError(f"ranks {missing} of {world} did not finish within {timeout:g} s")
            gone = [r for r, p in enumerate(procs) if r not in got and not p.is_alive()]
            if gone:
                time.sleep(0.5)  # (a result may still be on its way)
                if results.empty():
                    failed = [r for r in gone if procs[r].exitcode]
                    if failed:
                        raise RuntimeError(f"ranks {failed} exited with {[procs[r].exitcode for r in failed]} "
                                           f"before reporting")
                    for r in gone:  # exited cleanly without a result (a test's rank that dies on purpose)
                        got[r] = ("ok", None)
            time.sleep(0.02)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    if errors:
        raise RuntimeError("\n".join(f"rank {r} failed: {v}" for r, v in sorted(errors.items())))
    return [got[r][1] for r in range(world)]
