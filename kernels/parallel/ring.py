"""Ring attention: causal attention with the sequence sharded over the ranks of a process group.

``ring_attention(q, k, v, seq_len=S, causal=True, scale=None, layout="zigzag", group=None)``
is called by every rank of ``group`` at once, each with its shard (``shard`` cuts one out of
a whole ``[B, H, S, D]`` tensor, ``unshard`` puts outputs back in order), and returns this
rank's output shard; it is differentiable. ``check_split`` states the split rule
(``contiguous``: world chunks; ``zigzag``: 2·world, rank r holding r and 2·world-1-r).
Each step a rank attends to the K/V block it holds while that block moves to the next rank
(``batch_isend_irecv``, gloo or NCCL), and partial results merge by their log-sum-exp
(``merge``). Ranges ``ring:post``, ``ring:attend`` and ``ring:wait`` mark the trace; ``ring:wait``
is where the rank blocked for its data (exposed communication), its name ending ``(arrived)``
when the transfer had completed before the rank came to wait. Under gloo a helper thread
waits on each exchange as soon as it is posted (``Exchange``), so gloo's own ``gloo:send`` /
``gloo:recv`` ranges, which end when ``wait()`` returns, end when the transfer completed.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
from torch.profiler import record_function

LAYOUTS = ("contiguous", "zigzag")


# ----------------------------------------------------------------------------- the split

def check_split(seq_len: int, world: int, layout: str) -> None:
    """Refuse, in words, a split the ranks cannot hold (the rule in the module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    chunks = world if layout == "contiguous" else 2 * world
    if not isinstance(seq_len, int) or seq_len < chunks:
        raise ValueError(f"the {layout} layout cuts the sequence into {chunks} chunks ({'world' if chunks == world else '2 x world'}"
                         f" = {chunks} for {world} ranks) and every chunk needs a token: seq_len must be >= {chunks}, "
                         f"got {seq_len!r}")


def chunk_bounds(seq_len: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``parts`` chunks, sized as ``torch.tensor_split`` sizes them."""
    base, extra = divmod(seq_len, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def rank_chunks(seq_len: int, world: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of the sequence rank ``rank`` holds, in the order it stores them."""
    check_split(seq_len, world, layout)
    if layout == "contiguous":
        return [chunk_bounds(seq_len, world)[rank]]
    bounds = chunk_bounds(seq_len, 2 * world)
    return [bounds[rank], bounds[2 * world - 1 - rank]]


def shard_len(seq_len: int, world: int, rank: int, layout: str) -> int:
    return sum(end - start for start, end in rank_chunks(seq_len, world, rank, layout))


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s part of a whole tensor (sequence along ``dim``), contiguous."""
    parts = [x.narrow(dim, a, b - a) for a, b in rank_chunks(x.shape[dim], world, rank, layout)]
    return torch.cat(parts, dim=dim).contiguous()


def unshard(shards: list[torch.Tensor], layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The whole tensor from every rank's shard (``shards[r]`` from rank r), in sequence order."""
    world = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    whole = shards[0].new_empty(*shards[0].shape[:dim], seq_len, *shards[0].shape[dim + 1:])
    for rank, part in enumerate(shards):
        for (a, b), lo in _local_slices(rank_chunks(seq_len, world, rank, layout)):
            whole.narrow(dim, a, b - a).copy_(part.narrow(dim, lo, b - a))
    return whole


def _local_slices(chunks):
    """Each chunk with where it starts in the rank's own storage."""
    lo = 0
    for a, b in chunks:
        yield (a, b), lo
        lo += b - a


# ----------------------------------------------------------------------------- the merge

def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Two partial attentions of the same queries over disjoint sets of keys, made one.

    ``out_x`` [..., S, D] is softmax-weighted over its own keys only; ``lse_x`` [..., S] is the
    log of its softmax denominator, log Σ exp(score). The whole denominator is the sum of the
    two, so each part is rescaled by its share of it. A row that saw no key has lse -inf (and
    weighs nothing); a row where neither part saw a key stays zero.
    """
    lse = torch.logaddexp(lse_a, lse_b)                             # log(Σ_a e^s + Σ_b e^s)
    seen = torch.isfinite(lse)
    weight_a = torch.where(seen, torch.exp(lse_a - lse), 0.0)       # a's share of the softmax
    weight_b = torch.where(seen, torch.exp(lse_b - lse), 0.0)
    return out_a * weight_a[..., None] + out_b * weight_b[..., None], lse


# ----------------------------------------------------------------------------- one block

def _visible(q_range, k_range, causal: bool) -> str:
    """'all', 'part' or 'none' of a key range is visible to a query range."""
    (qa, qb), (ka, kb) = q_range, k_range
    if not causal or kb - 1 <= qa:
        return "all"
    return "none" if ka > qb - 1 else "part"


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: slice, scale: Optional[float] = None):
    """Attention of every query over the keys ``keys`` only, in float64, with its log-sum-exp:
    one part for ``merge`` (no mask: the parts of a check of the merge on one process)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.double() @ k[..., keys, :].double().transpose(-1, -2)) * scale
    return torch.softmax(scores, -1) @ v[..., keys, :].double(), torch.logsumexp(scores, -1)


def _pairs(q_chunks, k_chunks, causal: bool):
    """For each local query chunk: its local slice, and the key chunks it sees (local slices,
    and whether a mask is needed). Key chunks no query of the chunk sees are never computed."""
    for q_range, q_lo in _local_slices(q_chunks):
        seen = [(k_range, k_lo, _visible(q_range, k_range, causal)) for k_range, k_lo in _local_slices(k_chunks)]
        seen = [(k_range, k_lo, how) for k_range, k_lo, how in seen if how != "none"]
        if seen:
            yield q_range, q_lo, seen


def _gather_keys(t: torch.Tensor, seen) -> torch.Tensor:
    parts = [t.narrow(2, lo, b - a) for (a, b), lo, _ in seen]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _mask(q_range, seen, groups: int, device) -> Optional[torch.Tensor]:
    """True where a query may not see a key, [G·Sq_c, Sk_c], or None when every key is visible."""
    if all(how == "all" for _, _, how in seen):
        return None
    pos_q = torch.arange(*q_range, device=device)
    pos_k = torch.cat([torch.arange(a, b, device=device) for (a, b), _, _ in seen])
    return (pos_k[None, :] > pos_q[:, None]).repeat(groups, 1)


def _grouped(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, Hq, S, D] -> [B, Hkv, G·S, D] float32: each K/V head meets its G query heads in one matmul."""
    b, h, s, d = t.shape
    return t.float().reshape(b, kv_heads, (h // kv_heads) * s, d)


def _attend_block(q, k, v, q_range, seen, scale):
    """Attention of one query chunk over the key chunks it sees: (out [B, Hq, Sc, D], lse [B, Hq, Sc]), fp32."""
    b, hq, sc, d = q.shape
    hkv = k.shape[1]
    kk, vv = _gather_keys(k, seen).float(), _gather_keys(v, seen).float()
    scores = _grouped(q, hkv) @ kk.transpose(-1, -2) * scale                # [B, Hkv, G·Sc, Sk_c]
    mask = _mask(q_range, seen, hq // hkv, q.device)
    if mask is not None:
        scores.masked_fill_(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                  # [B, Hkv, G·Sc]
    out = torch.exp(scores - lse[..., None]) @ vv                          # [B, Hkv, G·Sc, D]
    return out.reshape(b, hq, sc, d), lse.reshape(b, hq, sc)


def attend_chunks(q, k, v, q_chunks, k_chunks, causal: bool, scale: float, out, lse) -> None:
    """Merge into ``out``/``lse`` (fp32, q's rows) the attention of q's chunks over the key
    chunks k holds, computing only the chunk pairs where some query sees some key."""
    for q_range, q_lo, seen in _pairs(q_chunks, k_chunks, causal):
        rows = slice(q_lo, q_lo + q_range[1] - q_range[0])
        part, part_lse = _attend_block(q[:, :, rows], k, v, q_range, seen, scale)
        out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], part, part_lse)


def _backward_block(q, k, v, do, lse, delta, q_range, seen, scale):
    """Gradients of one query chunk's attention over the key chunks it sees, fp32:
    dq [B, Hq, Sc, D] and dk, dv [B, Hkv, Sk_c, D] (summed over each K/V head's query heads)."""
    b, hq, sc, d = q.shape
    hkv = k.shape[1]
    kk, vv = _gather_keys(k, seen).float(), _gather_keys(v, seen).float()
    qg, dog = _grouped(q, hkv), _grouped(do, hkv)                          # [B, Hkv, G·Sc, D]
    scores = qg @ kk.transpose(-1, -2) * scale                             # [B, Hkv, G·Sc, Sk_c]
    mask = _mask(q_range, seen, hq // hkv, q.device)
    if mask is not None:
        scores.masked_fill_(mask, float("-inf"))
    p = torch.exp(scores - lse.reshape(b, hkv, -1)[..., None])             # the forward's softmax, rebuilt
    dv = p.transpose(-1, -2) @ dog                                         # [B, Hkv, Sk_c, D]
    ds = p * (dog @ vv.transpose(-1, -2) - delta.reshape(b, hkv, -1)[..., None])
    dq = (ds @ kk * scale).reshape(b, hq, sc, d)
    dk = ds.transpose(-1, -2) @ qg * scale                                 # [B, Hkv, Sk_c, D]
    return dq, dk, dv


def _scatter_keys(acc: torch.Tensor, grad: torch.Tensor, seen) -> None:
    """Add a gradient over gathered key chunks back into their places in ``acc``."""
    at = 0
    for (a, b), lo, _ in seen:
        acc.narrow(2, lo, b - a).add_(grad.narrow(2, at, b - a))
        at += b - a


# ----------------------------------------------------------------------------- the ring

@dataclass(frozen=True)
class RingPlan:
    """What every rank agrees on: the sequence, the split, the mask, the group."""

    seq_len: int
    world: int
    rank: int
    layout: str
    causal: bool
    scale: float
    group: Optional["torch.distributed.ProcessGroup"] = None
    timeout_s: Optional[float] = None

    def chunks(self, rank: int) -> list[tuple[int, int]]:
        return rank_chunks(self.seq_len, self.world, rank, self.layout)

    def owner(self, step: int) -> int:
        """Whose K/V block this rank holds at ``step`` (it moves one rank on per step)."""
        return (self.rank - step) % self.world


def post_exchange(send: torch.Tensor, recv_shape, plan: RingPlan, what: str):
    """Post the send of ``send`` to the next rank and a receive from the previous one; return
    the receive buffer and the posted :class:`Exchange` (wait on it later: the transfer overlaps
    what runs between)."""
    import torch.distributed as dist

    recv = send.new_empty(recv_shape)
    nxt, prev = (plan.rank + 1) % plan.world, (plan.rank - 1) % plan.world
    with record_function(f"ring:post {what}"):
        ops = [dist.P2POp(dist.isend, send, dist.get_global_rank(plan.group, nxt) if plan.group else nxt, plan.group),
               dist.P2POp(dist.irecv, recv, dist.get_global_rank(plan.group, prev) if plan.group else prev, plan.group)]
        requests = dist.batch_isend_irecv(ops)
    return recv, Exchange(requests, plan.timeout_s, watch=dist.get_backend(plan.group) == "gloo")


def wait_exchange(exchange: "Exchange", plan: RingPlan, what: str) -> None:
    """Block until the exchange completed, in a range that says whether it already had:
    ``ring:wait kv (arrived)`` (the transfer hid behind what ran since the post) or ``(in flight)``."""
    with record_function(f"ring:wait {what} ({'arrived' if exchange.arrived else 'in flight'})"):
        exchange.wait()


def _wait_requests(requests, timeout_s: Optional[float]) -> None:
    for r in requests:
        if timeout_s is None:
            r.wait()
        else:
            r.wait(timeout=timedelta(seconds=timeout_s))


class Exchange:
    """Posted point-to-point requests, and when they completed.

    gloo marks a send or receive completed only inside ``wait()`` (``is_completed()`` stays False
    until then, however long ago the bytes moved), and its profiler range, started when the
    request was created, ends when ``wait()`` returns. So under gloo (``watch=True``) a helper
    thread waits at once: the ``gloo:*`` ranges then end when the transfer completes, and
    ``arrived`` says whether it had when the rank came to wait. NCCL's requests answer
    ``is_completed()`` themselves and are waited on by the rank (a stream dependency)."""

    def __init__(self, requests, timeout_s: Optional[float] = None, watch: bool = False):
        self.requests, self.timeout_s = requests, timeout_s
        self.error: Optional[BaseException] = None
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="ring exchange") if watch else None
        if self._watcher is not None:
            self._watcher.start()

    def _watch(self) -> None:
        try:
            _wait_requests(self.requests, self.timeout_s)
        except BaseException as err:  # handed to the rank, which raises it in wait()
            self.error = err
        finally:
            self._done.set()

    @property
    def arrived(self) -> bool:
        """Whether every request had completed (without blocking to find out)."""
        if self._watcher is None:
            return all(r.is_completed() for r in self.requests)
        return self._done.is_set()

    def wait(self) -> None:
        if self._watcher is None:
            _wait_requests(self.requests, self.timeout_s)
            return
        self._watcher.join()
        if self.error is not None:
            raise self.error


def _kv_shape(kv: torch.Tensor, plan: RingPlan, owner: int):
    rows = sum(b - a for a, b in plan.chunks(owner))
    return (*kv.shape[:3], rows, kv.shape[-1])


def ring_forward(q, k, v, plan: RingPlan):
    """The forward on one rank: (out fp32 [B, Hq, S_r, D], lse fp32 [B, Hq, S_r])."""
    kv = torch.stack([k, v])                                               # [2, B, Hkv, S_r, D]: one message
    out = q.new_zeros(q.shape, dtype=torch.float32)
    lse = q.new_full(q.shape[:-1], float("-inf"), dtype=torch.float32)
    mine = plan.chunks(plan.rank)
    for step in range(plan.world):
        owner = plan.owner(step)
        moving = step < plan.world - 1
        if moving:
            recv, exchange = post_exchange(kv, _kv_shape(kv, plan, plan.owner(step + 1)), plan, "kv")
        with record_function("ring:attend"):
            attend_chunks(q, kv[0], kv[1], mine, plan.chunks(owner), plan.causal, plan.scale, out, lse)
        if moving:
            wait_exchange(exchange, plan, "kv")
            kv = recv
    return out, lse


def ring_backward(q, k, v, out, lse, grad_out, plan: RingPlan):
    """The backward on one rank: (dq, dk, dv) of its own shard, fp32.

    The K/V blocks go round the ring once more; each block's gradient accumulator travels one
    step behind it, collecting every rank's contribution, and arrives home after ``world`` hops.
    """
    kv = torch.stack([k, v])
    delta = (grad_out.float() * out.float()).sum(-1)                       # [B, Hq, S_r]: rowsum(dO·O)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)     # for the block held now
    mine = plan.chunks(plan.rank)
    for step in range(plan.world):
        owner = plan.owner(step)
        moving = step < plan.world - 1
        if moving:
            recv, exchange = post_exchange(kv, _kv_shape(kv, plan, plan.owner(step + 1)), plan, "kv")
        with record_function("ring:attend backward"):
            for q_range, q_lo, seen in _pairs(mine, plan.chunks(owner), plan.causal):
                rows = slice(q_lo, q_lo + q_range[1] - q_range[0])
                g_q, g_k, g_v = _backward_block(q[:, :, rows], kv[0], kv[1], grad_out[:, :, rows], lse[:, :, rows],
                                                delta[:, :, rows], q_range, seen, plan.scale)
                dq[:, :, rows] += g_q
                _scatter_keys(dkv[0], g_k, seen)
                _scatter_keys(dkv[1], g_v, seen)
        if moving:
            wait_exchange(exchange, plan, "kv")
            kv = recv
        if plan.world == 1:
            break  # one rank: its accumulator is already home
        # The accumulator follows its block: after the last step it lands on the block's owner.
        dkv_recv, exchange = post_exchange(dkv, _kv_shape(dkv, plan, plan.owner(step + 1)), plan, "dkv")
        wait_exchange(exchange, plan, "dkv")
        dkv = dkv_recv
    return dq, dkv[0], dkv[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: RingPlan):
        out, lse = ring_forward(q, k, v, plan)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, grad_out, ctx.plan)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seq_len: int, causal: bool = True,
                   scale: Optional[float] = None, layout: str = "zigzag", group=None,
                   timeout_s: Optional[float] = None) -> torch.Tensor:
    """This rank's output shard of attention over the sharded sequence (see the module docstring)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention runs on every rank of a torch.distributed process group: call "
                           "torch.distributed.init_process_group first (kernels.parallel.ranks.Ranks does it for you)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    check_split(seq_len, world, layout)
    check_shards(q, k, v, shard_len(seq_len, world, rank, layout), rank)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    plan = RingPlan(seq_len, world, rank, layout, bool(causal), scale, group, timeout_s)
    return _RingAttention.apply(q, k, v, plan)


def check_shards(q, k, v, rows: int, rank: int) -> None:
    """Refuse, naming the problem, a rank's q, k, v shards unless they are 4-D tensors of one
    dtype and device holding ``rows`` positions each (ring and Ulysses share this check)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq_shard, head_dim], got {t.dim()} dims {tuple(t.shape)}")
        if t.shape[2] != rows:
            raise ValueError(f"rank {rank} must hold {rows} positions of the sequence (its shard under the split "
                             f"rule), but {name} has {t.shape[2]}: cut shards with kernels.parallel.ring.shard")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"k and v must be [B, Hkv, S_r, D] with q's B and D: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")


# ----------------------------------------------------------------------------- the work, counted

def work_per_rank(seq_len: int, world: int, layout: str, causal: bool = True) -> list[int]:
    """Query-key pairs each rank computes in one forward (a masked pair inside a computed block
    counts: it costs the same), from the split alone. The causal imbalance in one list."""
    counts = []
    for rank in range(world):
        mine = rank_chunks(seq_len, world, rank, layout)
        total = 0
        for owner in range(world):
            for (qa, qb), _, seen in _pairs(mine, rank_chunks(seq_len, world, owner, layout), causal):
                total += (qb - qa) * sum(b - a for (a, b), _, _ in seen)
        counts.append(total)
    return counts


def ring_bytes_per_rank(batch: int, kv_heads: int, seq_len: int, head_dim: int, world: int, element_size: int) -> int:
    """Bytes one rank sends in one forward: its K and V block, world - 1 times (a shard of S/world rows)."""
    return 2 * batch * kv_heads * (seq_len // world) * head_dim * element_size * (world - 1)


# ----------------------------------------------------------------------------- the scaling model

def step_times(world: int, bandwidth: float, flops_per_s: float, seq_len: int, heads: int, kv_heads: int,
               head_dim: int, element_size: int = 2) -> tuple[float, float]:
    """One ring step of a causal, zigzag-balanced forward on one rank (batch 1), modelled:
    (compute, communication) in seconds. With c = S / world rows per rank, compute is
    2·H·c²·D FLOPs at ``flops_per_s`` (a ceiling, so the time is a lower bound) and
    communication one K/V block, 2·H_kv·c·D elements of ``element_size`` bytes, over
    ``bandwidth`` bytes/s one way."""
    if world < 1 or bandwidth <= 0 or flops_per_s <= 0:
        raise ValueError(f"world >= 1 and positive rates needed, got world={world}, "
                         f"bandwidth={bandwidth}, flops_per_s={flops_per_s}")
    c = seq_len / world
    return 2 * heads * c * c * head_dim / flops_per_s, 2 * kv_heads * c * head_dim * element_size / bandwidth


def crossover_world(bandwidth: float, flops_per_s: float, seq_len: int, heads: int, kv_heads: int,
                    element_size: int = 2) -> float:
    """The world size past which ``step_times``' transfer outlasts its compute: compute grows as c²
    and communication as c, so they meet at c* = H_kv·e·F / (H·BW), that is at S / c* ranks."""
    return seq_len * heads * bandwidth / (kv_heads * element_size * flops_per_s)


def scaling_figure(links: dict, flops_per_s: float, gpu: str, seq_len: int, heads: int, kv_heads: int,
                   head_dim: int, worlds=(2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)):
    """``step_times`` per forward and per rank (world steps) against the world size, log-log: the
    compute line and one transfer line per link of ``links`` ({name: bytes/s one way}), with each
    link's ``crossover_world`` marked. Returns the figure and {link: crossover}."""
    from matplotlib.figure import Figure

    from kernels.figures import apply_font_floor

    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    shape = (seq_len, heads, kv_heads, head_dim)
    ax.plot(worlds, [w * step_times(w, 1, flops_per_s, *shape)[0] * 1e3 for w in worlds], "k-", lw=2,
            label="compute per rank")
    crossovers = {}
    for (name, bw), colour in zip(links.items(), ("C0", "C1", "C2", "C3")):
        ax.plot(worlds, [w * step_times(w, bw, flops_per_s, *shape)[1] * 1e3 for w in worlds], f"{colour}--",
                label=f"K/V transfers, {name}")
        crossovers[name] = crossover_world(bw, flops_per_s, seq_len, heads, kv_heads)
        ax.axvline(crossovers[name], color=colour, alpha=0.4)
        ax.annotate(f"crossover: {crossovers[name]:.0f} ranks", (crossovers[name], 0.02), rotation=90,
                    va="bottom", ha="right", color=colour)
    ax.set(yscale="log", xlabel="ranks (world size)", ylabel="ms per forward, per rank",
           # three short lines: the title stays within the figure on a phone's copy too
           title=f"Ring attention model: S={seq_len:,},\nH={heads}, Hkv={kv_heads}, D={head_dim}, bf16,\n"
                 f"{gpu} at {flops_per_s / 1e12:.0f} TFLOP/s")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    apply_font_floor(fig)
    return fig, crossovers


# Two links' one-way bandwidths for the scaling model, with where their makers state them.
LINKS = {"NVLink 4 (450 GB/s each way)": 450e9, "InfiniBand NDR (50 GB/s each way)": 50e9}
LINK_SOURCES = {"NVLink 4 (450 GB/s each way)": "NVIDIA H100 Tensor Core GPU page, www.nvidia.com/en-us/data-center/h100/",
                "InfiniBand NDR (50 GB/s each way)":
                    "NVIDIA ConnectX-7 VPI adapter manual, docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"}


def links_table(crossovers: dict):
    """``LINKS`` as the page shows them: bandwidth, the crossover world ``scaling_figure`` found for
    each (``crossovers``, {link: ranks}), and the source of each bandwidth."""
    import pandas as pd

    if set(crossovers) != set(LINKS):
        raise ValueError(f"crossovers must name exactly the links {list(LINKS)}, got {list(crossovers)}")
    return pd.DataFrame({"bandwidth (GB/s each way)": {n: b / 1e9 for n, b in LINKS.items()},
                         "crossover (ranks)": crossovers, "source": LINK_SOURCES})


def pairs_per_rank(seq_len: int, world: int):
    """``work_per_rank`` for each layout of ``LAYOUTS``: query-key pairs per rank (causal), one column a layout."""
    import pandas as pd

    work = {layout: work_per_rank(seq_len, world, layout) for layout in LAYOUTS}
    return pd.DataFrame(work, index=[f"rank {r}" for r in range(world)]).rename_axis("query-key pairs computed")


def chunks_table(seq_len: int, world: int, layout: str):
    """The positions of the sequence each rank holds under ``layout``, one column a rank."""
    import pandas as pd

    chunks = {f"rank {r}": [f"positions {a} to {b - 1}" for a, b in rank_chunks(seq_len, world, r, layout)]
              for r in range(world)}
    return pd.DataFrame(chunks, index=[f"chunk {i + 1}" for i in range(len(chunks["rank 0"]))])
