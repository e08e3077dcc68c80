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
    recv, requests = ring._exchange(kv, kv.shape, plan, "kv")
    if rank == world - 1:
        os._exit(3)
    ring._wait(requests, plan, "kv")
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


def whoami(rank: int, world: int) -> dict:
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid()}
