"""Chapter 10: decoding with a KV cache, and what decoding one token costs.

**Prefill** runs the prompt through attention once (Sq = Sk) and keeps every layer's keys
and values, the *KV cache*; **decode** then makes one token per call: one new query (Sq = 1)
against every key kept so far. ``KVCache`` is one layer's cache (preallocated, ``append``,
the filled part as views); ``call_flops`` / ``call_bytes`` / ``intensity`` are one attention
call's FLOPs, bytes and their ratio; ``cache_bytes`` what a cache holds; ``counts_table`` and
``sharing_table`` tabulate them; ``ConcatCache`` is the torch.cat version a KVCache replaces and
``decode_step`` one token through either (``prefill_then_decode``, ``filled_caches`` and
``profile_cache_steps`` are the chapter's runs of them). Timing both phases is ``kernels.bench.sweep``'s job
(modes ``forward`` and ``decode``), on inputs rotated through more memory than the caches hold.
"""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd
import torch

from kernels import reference
from kernels.dtypes import dtype_name
from kernels.trace.attention import AttentionReport, short_kernel_name
from kernels.trace.fingerprints import attention_kernel


class KVCache:
    """One attention layer's key/value cache, preallocated for ``max_seq`` tokens.

    >>> cache = KVCache(batch=1, kv_heads=2, max_seq=16, head_dim=8)
    >>> k, v = cache.append(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))   # prefill: 5 tokens
    >>> k.shape, cache.length
    (torch.Size([1, 2, 5, 8]), 5)
    >>> k, v = cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))   # decode: 1 more
    >>> k.shape
    torch.Size([1, 2, 6, 8])
    """

    def __init__(self, batch: int, kv_heads: int, max_seq: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("max_seq", max_seq), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        shape = (batch, kv_heads, max_seq, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [B, Hkv, max_seq, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [B, Hkv, max_seq, D]
        self.length = 0                                           # tokens filled so far

    @property
    def max_seq(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``n`` new tokens' keys and values ([B, Hkv, n, D] each) after the filled part,
        and return the keys and values of every token so far ([B, Hkv, length, D] views)."""
        want = (self.k.shape[0], self.k.shape[1], self.k.shape[3])
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"KVCache.append: {name} must be a 4-d tensor [B, Hkv, n, D], got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if (t.shape[0], t.shape[1], t.shape[3]) != want:
                raise ValueError(f"KVCache.append: {name} has shape {tuple(t.shape)}; this cache holds "
                                 f"[B={want[0]}, Hkv={want[1]}, n, D={want[2]}]")
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"KVCache.append: k has {k.shape[2]} tokens and v {v.shape[2]}; they must agree")
        n = k.shape[2]
        if self.length + n > self.max_seq:
            raise ValueError(f"KVCache.append: {n} more tokens would make {self.length + n}, past the "
                             f"cache's max_seq of {self.max_seq}")
        self.k[:, :, self.length:self.length + n] = k
        self.v[:, :, self.length:self.length + n] = v
        self.length += n
        return self.keys(), self.values()

    def keys(self) -> torch.Tensor:
        return self.k[:, :, :self.length]      # [B, Hkv, length, D], a view: nothing is copied

    def values(self) -> torch.Tensor:
        return self.v[:, :, :self.length]      # [B, Hkv, length, D]

    @property
    def nbytes(self) -> int:
        """Bytes the two buffers hold (allocated for max_seq tokens, filled or not)."""
        return self.k.nbytes + self.v.nbytes


# --------------------------------------------------------------------------- counts

def call_flops(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, causal: bool = True) -> float:
    """FLOPs of one attention call with Sq queries against Sk keys (``reference.flops``).

    Decode (Sq = 1) sees every key, so a causal decode costs the full 4·B·H·Sk·D.
    """
    return reference.flops(batch, heads, seq_q, head_dim, causal=causal, seq_k=seq_k)


def call_bytes(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int,
               kv_heads: Optional[int] = None, dtype: torch.dtype = torch.bfloat16) -> float:
    """Bytes a fused kernel must move: read q, the cached K and V (each shared head once), write o."""
    return reference.io_bytes(batch, heads, seq_q, head_dim, dtype=dtype, seq_k=seq_k, kv_heads=kv_heads)


def intensity(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int,
              kv_heads: Optional[int] = None, dtype: torch.dtype = torch.bfloat16, causal: bool = True) -> float:
    """Arithmetic intensity of one call: FLOPs per byte moved.

    For decode it tends to 2·(Hq/Hkv)/bytes_per_element as Sk grows: each cached element is
    read once and used in one multiply-add per query head of its group.
    """
    return (call_flops(batch, heads, seq_q, seq_k, head_dim, causal)
            / call_bytes(batch, heads, seq_q, seq_k, head_dim, kv_heads, dtype))


def cache_bytes(seq: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                batch: int = 1, layers: int = 1) -> int:
    """Bytes of a KV cache holding ``seq`` tokens: K and V, per layer, per K/V head."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * batch * kv_heads * seq * head_dim * elem


# --------------------------------------------------------------------------- tables

def counts_table(seqs: Sequence[int], heads: int = 32, head_dim: int = 128,
                 dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """FLOPs, bytes and FLOP/byte of a prefill (Sq = Sk = S) and a decode token (Sq = 1,
    Sk = S), batch 1, causal, one row per S in ``seqs`` and one column group per phase."""
    rows = [{"S (keys)": s, "phase": phase, "FLOPs": call_flops(1, heads, s_q, s, head_dim),
             f"bytes ({dtype_name(dtype)})": call_bytes(1, heads, s_q, s, head_dim, dtype=dtype),
             "FLOP/byte": intensity(1, heads, s_q, s, head_dim, dtype=dtype)}
            for s in seqs for phase, s_q in (("prefill", s), ("decode", 1))]
    return pd.DataFrame(rows).pivot(index="S (keys)", columns="phase")


def sharing_table(layers: int, heads: int, kv_options: dict, head_dim: int, context: int,
                  dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """What sharing K/V heads saves for one sequence of ``context`` tokens: the whole cache over
    ``layers``, the bytes one layer's decode token moves, and its FLOP/byte, one row per entry
    of ``kv_options`` (name -> K/V heads, each dividing ``heads``)."""
    for name, kv in kv_options.items():
        if kv < 1 or heads % kv:
            raise ValueError(f"sharing_table: {name} has {kv} K/V heads, which must divide the {heads} query heads")
    return pd.DataFrame([
        {"attention": name, "K/V heads": kv,
         "KV cache (MiB)": cache_bytes(context, kv, head_dim, dtype, layers=layers) / 2**20,
         "bytes per decode token, one layer (MiB)": call_bytes(1, heads, 1, context, head_dim, kv, dtype) / 2**20,
         "FLOP/byte": intensity(1, heads, 1, context, head_dim, kv, dtype)}
        for name, kv in kv_options.items()]).set_index("attention")


# --------------------------------------------------------------------------- growing K and V

class ConcatCache:
    """K and V kept as plain tensors and grown with ``torch.cat``: the common first version of
    a cache, with ``KVCache``'s ``append``. Every append allocates tensors for the whole history
    and copies it into them, so a decode token's cost grows with the cache before attention
    even reads it.

    >>> cache = ConcatCache(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))
    >>> k, v = cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    >>> k.shape, cache.length
    (torch.Size([1, 2, 6, 8]), 6)
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"ConcatCache: k and v must be 4-d [B, Hkv, S, D] of one shape, got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        self.k, self.v = k, v

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New tensors holding every token so far: the history is copied on every call."""
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v


def decode_step(cache, attend):
    """One decode token as a callable ``step(q, k, v)``: append the new token's ``k``, ``v``
    to ``cache`` (a ``KVCache`` or a ``ConcatCache``), then ``attend(q, keys, values,
    causal=True)`` over everything cached, as a profiler or a timer calls it."""
    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = cache.append(k, v)
        return attend(q, keys, values, causal=True)
    return step


def prefill_then_decode(attend, q, k, v, prompt: int):
    """Prefill the first ``prompt`` tokens of ``q``, ``k``, ``v`` through a ``KVCache``, then
    decode the rest one token at a time against it; returns (the output rows, the cache)."""
    batch, heads, total, head_dim = k.shape
    cache = KVCache(batch, heads, total, head_dim, dtype=k.dtype, device=k.device)
    keys, values = cache.append(k[:, :, :prompt], v[:, :, :prompt])
    rows = [attend(q[:, :, :prompt], keys, values, causal=True)]     # prefill: Sq = Sk = prompt
    for t in range(prompt, total):                                    # decode: Sq = 1, Sk = t + 1
        keys, values = cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        rows.append(attend(q[:, :, t:t + 1], keys, values, causal=True))
    return torch.cat(rows, dim=2), cache


def filled_caches(k: torch.Tensor, v: torch.Tensor, room: int) -> tuple:
    """A ``KVCache`` holding ``k`` and ``v`` with ``room`` more tokens free, and a
    ``ConcatCache`` holding copies of them: the two caches a decode step is compared on."""
    batch, heads, seq, head_dim = k.shape
    cache = KVCache(batch, heads, seq + room, head_dim, dtype=k.dtype, device=k.device)
    cache.append(k, v)
    return cache, ConcatCache(k.clone(), v.clone())


def copies_table(steps: dict) -> pd.DataFrame:
    """What each profiled decode step (name -> ``kernels.trace.reader.Step``) copied and allocated:
    its largest ``aten::copy_`` and the bytes it allocated, in KiB, and its ``aten::cat`` calls."""
    return pd.DataFrame([{"decode token": name,
                          "largest copy_ (KiB)": float(step.copies()["bytes"].max()) / 1024 if len(step.copies()) else 0.0,
                          "allocated (KiB)": step.allocated_bytes / 1024,
                          "aten::cat calls": len(step.find("aten::cat"))}
                         for name, step in steps.items()]).set_index("decode token")


def split_and_reduce(report: AttentionReport) -> pd.DataFrame:
    """The attention calls of a decode step found by kernel name (``kernels.trace.attention``:
    a "main" kernel, then the "combine" kernel that reduces its partial results over the split KV
    cache), one row per call: each kernel's short name and GPU time, the reduce's share of the
    call, and the API call that launched them (``hipGraphLaunch``/``cudaGraphLaunch`` for a
    graph replay). A report without such calls is a ValueError."""
    rows = []
    for i, call in enumerate(c for c in report.calls if c.how == "kernels"):
        stages = [(attention_kernel(name) or ("", "?"))[1] for name in call.kernels["name"]]
        k = call.kernels.assign(stage=stages)
        main, reduce = k[k["stage"] == "main"], k[k["stage"] == "combine"]
        rows.append({"call": i, "kernels": len(k),
                     "main kernel": short_kernel_name(main["name"].iloc[0]) if len(main) else None,
                     "main µs": float(main["dur_us"].sum()),
                     "reduce kernel": short_kernel_name(reduce["name"].iloc[0]) if len(reduce) else None,
                     "reduce µs": float(reduce["dur_us"].sum()),
                     "launched by": ", ".join(sorted(set(k["launcher"].dropna())))})
    if not rows:
        raise ValueError("no attention call found by kernel name in this report (no split-KV decode kernels)")
    table = pd.DataFrame(rows).set_index("call")
    table["reduce share"] = table["reduce µs"] / (table["main µs"] + table["reduce µs"])
    return table


def split_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """``split_and_reduce``'s calls summed up: how many, and the min, median and max of the main
    kernel's and the reduce's GPU time and of the reduce's share of the call."""
    return (pairs[["main µs", "reduce µs", "reduce share"]].describe().loc[["count", "min", "50%", "max"]]
            .rename(index={"count": "calls", "50%": "median"}))


def decode_backends(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype, device,
                    group: int = 4) -> tuple[str, str]:
    """The backend unpinned SDPA picks here for a decode token (one query against ``seq`` cached
    tokens): (with every query head its own K/V head, with K/V heads shared by ``group``). The
    priority rules know nothing of shared heads, so a GPU's rules are checked on the first."""
    from kernels.attention import sdpa
    from kernels.notebook import inputs

    kv_heads = max(1, heads // group)
    if heads % kv_heads:
        raise ValueError(f"decode_backends: {heads} query heads cannot share {kv_heads} K/V heads evenly")
    q = inputs(batch, heads, 1, head_dim, dtype=dtype, device=device)[0]
    _, k, v = inputs(batch, kv_heads, seq, head_dim, dtype=dtype, device=device, seed=2)
    repeated = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    return sdpa.default_backend_name(q, *repeated), sdpa.default_backend_name(q, k, v)


def profile_cache_steps(cached: Sequence[torch.Tensor], attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        trace_dir) -> tuple:
    """Profile one decode token (``decode_step``: append ``k``, ``v``, attend with ``q``) on a
    ``KVCache`` and on a ``ConcatCache`` that both hold ``cached`` (its keys, its values) first;
    returns their steps (``kernels.trace.reader.Step``): (KVCache's, torch.cat's), traces saved
    under ``trace_dir``."""
    from kernels.trace import record  # here: the profiler is heavy, the counts are not

    if len(cached) != 2:
        raise ValueError(f"profile_cache_steps: cached must be (keys, values), got {len(cached)} tensors")

    # the profiler calls the step wait + warmup + active = 3 times, so the cache keeps room for 3
    caches = dict(zip(("decode_kvcache", "decode_cat"), filled_caches(cached[0], cached[1], room=3)))
    return tuple(record.profile(decode_step(cache, attend), q, k, v, label=label, wait=0, warmup=2, active=1,
                                trace_dir=trace_dir).step() for label, cache in caches.items())
