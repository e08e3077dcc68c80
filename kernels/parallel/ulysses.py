"""Ulysses: context parallelism by an all-to-all over heads (DeepSpeed-Ulysses, arXiv 2309.14509).

A sibling of ``kernels.parallel.ring`` with the same call shape, forward only:
``ulysses_attention(q, k, v, seq_len=S, causal=True, scale=None, group=None)`` on every rank of
the group, each holding a contiguous shard of the sequence (``kernels.parallel.ring.shard(x, rank, world,
"contiguous")``). Instead of moving K/V around a ring, one all-to-all gives each rank the whole
sequence for ``H / world`` of the heads; each rank runs ordinary attention on those heads (SDPA,
causal over the whole sequence), and a second all-to-all sends every rank its rows back.

The rule: query heads and key/value heads must both divide by the world size (a rank owns
whole heads, and its query heads' K/V heads with them); shards follow the contiguous split of
``kernels.parallel.ring.check_split`` (any S >= world, odd ones included). No backward here: the
chapter uses it to compare communication, and ``torch.no_grad`` is not required but autograd
through the all-to-all is not offered (a ``RuntimeError`` says so when asked for).
Each rank records ``ulysses:all_to_all in``, ``ulysses:attend`` and ``ulysses:all_to_all out``,
and around each all-to-all call ``ulysses:wait all_to_all``, where it blocked for it (exposed
communication; gloo's own ``gloo:all_to_all`` range runs on gloo's worker thread, while it works).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from kernels.parallel import ring
from kernels.parallel.ring import check_shards, check_split, chunk_bounds


def check_heads(heads: int, kv_heads: int, world: int) -> None:
    """Refuse, in words, heads the ranks cannot share out whole."""
    if heads % world or kv_heads % world:
        raise ValueError(f"Ulysses gives each of the {world} ranks whole heads: query heads ({heads}) and key/value "
                         f"heads ({kv_heads}) must both be multiples of the world size {world} (use the ring instead)")


def _all_to_all(recv: torch.Tensor, send: torch.Tensor, out_sizes: list[int], in_sizes: list[int], group) -> None:
    """``all_to_all_single``, recorded as where the rank waits: nothing of its own can run until the
    exchange is done (under gloo even ``async_op=True`` returns only then: its ``c10d::alltoall_base_``
    op spanned the whole collective in the chapter's traces, torch 2.13), so the whole call is exposed."""
    import torch.distributed as dist

    with record_function("ulysses:wait all_to_all"):
        dist.all_to_all_single(recv, send, output_split_sizes=out_sizes, input_split_sizes=in_sizes, group=group)


def to_heads(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """[B, H, S_r, D] sequence shard -> [B, H/W, S, D]: this rank's heads over the whole sequence."""
    world = len(sizes)
    b, h, s_r, d = x.shape
    send = x.permute(1, 0, 2, 3).reshape(world, -1).contiguous()          # head group j first, for rank j
    per = h // world * b * d
    recv = x.new_empty(sum(per * s for s in sizes))
    _all_to_all(recv, send.flatten(), [per * s for s in sizes], [per * s_r] * world, group)
    parts = [p.view(h // world, b, s, d) for p, s in zip(recv.split([per * s for s in sizes]), sizes)]
    return torch.cat(parts, dim=2).permute(1, 0, 2, 3)                     # [B, H/W, S, D]


def to_rows(x: torch.Tensor, sizes: list[int], rank: int, group) -> torch.Tensor:
    """[B, H/W, S, D] -> [B, H, S_r, D]: every rank's rows back to it, all heads."""
    world = len(sizes)
    b, hw, _, d = x.shape
    send = torch.cat([p.permute(1, 0, 2, 3).flatten() for p in x.split(sizes, dim=2)])  # rows of rank i, for rank i
    per = hw * b * d
    recv = x.new_empty(per * sizes[rank] * world)
    _all_to_all(recv, send, [per * sizes[rank]] * world, [per * s for s in sizes], group)
    heads = recv.view(world, hw, b, sizes[rank], d).reshape(world * hw, b, sizes[rank], d)
    return heads.permute(1, 0, 2, 3).contiguous()                           # [B, H, S_r, D]


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seq_len: int, causal: bool = True,
                      scale: Optional[float] = None, group=None) -> torch.Tensor:
    """This rank's output shard, [B, Hq, S_r, D] (see the module docstring for the rule)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ulysses_attention runs on every rank of a torch.distributed process group: call "
                           "torch.distributed.init_process_group first (kernels.parallel.ranks.Ranks does it for you)")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("ulysses_attention is forward only in this course: call it under torch.no_grad() "
                           "(kernels.parallel.ring.ring_attention has a backward)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    check_split(seq_len, world, "contiguous")
    sizes = [b - a for a, b in chunk_bounds(seq_len, world)]
    check_shards(q, k, v, sizes[rank], rank)
    check_heads(q.shape[1], k.shape[1], world)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    with record_function("ulysses:all_to_all in"):
        qh, kh, vh = (to_heads(t.contiguous(), sizes, group) for t in (q, k, v))  # [B, H/W, S, D] each
    with record_function("ulysses:attend"):
        # Sq = Sk = S here, so SDPA's top-left is_causal is the course's bottom-right causal.
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale,
                                             enable_gqa=qh.shape[1] != kh.shape[1])
    with record_function("ulysses:all_to_all out"):
        return to_rows(out, sizes, rank, group)


def ulysses_bytes_per_rank(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, world: int,
                  element_size: int) -> int:
    """Bytes one rank sends in one forward: (world-1)/world of its q, k, v and output shards."""
    shard = batch * (seq_len // world) * head_dim * element_size
    return shard * (2 * heads + 2 * kv_heads) * (world - 1) // world


def volume_table(worlds=(2, 4, 8, 16, 64), heads: int = 32, kv_heads=(32, 8), seq_len: int = 131072,
                 head_dim: int = 128, element_size: int = 2):
    """Bytes per rank and forward of the ring (``ring.ring_bytes_per_rank``) and of Ulysses
    (``ulysses_bytes_per_rank``) for each world size and K/V head count, in MiB, with their ratio."""
    import pandas as pd

    rows = [{"world": w, "Hq:Hkv": f"{heads}:{hkv}",
             "ring (MiB)": ring.ring_bytes_per_rank(1, hkv, seq_len, head_dim, w, element_size) / 2**20,
             "ulysses (MiB)": ulysses_bytes_per_rank(1, heads, hkv, seq_len, head_dim, w, element_size) / 2**20}
            for w in worlds for hkv in kv_heads]
    table = pd.DataFrame(rows).set_index(["world", "Hq:Hkv"])
    table["ring / ulysses"] = table["ring (MiB)"] / table["ulysses (MiB)"]
    return table

