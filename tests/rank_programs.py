"""Rank programs the tests send to kernels.parallel.ranks (spawned processes import them by name)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from kernels.parallel import ring


def die_mid_step(rank: int, world: int) -> str:
    """Every rank posts its first ring exchange; the last rank then dies before waiting, so the
    others block on a message that will never come."""
    kv = torch.ones(2, 1, 1, 4, 8) * rank
    plan = ring.RingPlan(8 * world, world, rank, "contiguous", True, 1.0)
    recv, requests = ring.post_exchange(kv, kv.shape, plan, "kv")
    if rank == world - 1:
        os._exit(3)
    ring.wait_exchange(requests, plan, "kv")
    return "finished"


def hang(rank: int, world: int) -> str:
    if rank == 0:
        time.sleep(120)
    return "finished"


def raise_on_rank_one(rank: int, world: int) -> str:
    if rank == 1:
        raise ValueError("rank one refuses")
    return "finished"


def wrong_shard(rank: int, world: int) -> str:
    """ring_attention called with a shard of the wrong length: the error's words come back."""
    q = torch.randn(1, 2, 5, 8)
    try:
        ring.ring_attention(q, q, q, seq_len=16, layout="contiguous")
    except ValueError as err:
        return str(err)
    return "accepted"


def post_sleep_wait(rank: int, world: int, trace_dir: str, sleep_s: float, late_rank: int = -1) -> str:
    """One profiled ring exchange of 64 bytes per rank: post, sleep ``sleep_s``, wait. Given a
    ``late_rank``, that rank sleeps before it posts and the others post and wait at once, so
    their transfers wait on it."""
    from pathlib import Path

    from kernels.trace.record import quiet_kineto

    kv = torch.full((2, 1, 1, 2, 4), float(rank))  # 16 floats: 64 bytes
    plan = ring.RingPlan(2 * world, world, rank, "contiguous", True, 1.0, timeout_s=30)
    path = Path(trace_dir) / f"rank-{rank}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    with quiet_kineto(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("exchange"):
            if rank == late_rank:
                time.sleep(sleep_s)
            recv, exchange = ring.post_exchange(kv, kv.shape, plan, "kv")
            if late_rank < 0:
                time.sleep(sleep_s)
            ring.wait_exchange(exchange, plan, "kv")
    prof.export_chrome_trace(str(path))
    assert torch.equal(recv, torch.full_like(kv, float((rank - 1) % world))), "the previous rank's block arrived"
    return str(path)


def gloo_completion_before_wait(rank: int, world: int) -> tuple[bool, bool]:
    """Rank 0 sends, rank 1 receives; both sleep long enough for the bytes to arrive, then ask
    ``is_completed()`` before and after ``wait()``."""
    buf = torch.ones(1024) if rank == 0 else torch.zeros(1024)
    request = dist.isend(buf, 1) if rank == 0 else dist.irecv(buf, 0)
    time.sleep(0.5)
    before = request.is_completed()
    request.wait()
    return before, request.is_completed()
