"""Chapter 1: attention written by hand, the way most people first write it.

Five steps, each one PyTorch op: scores = q kᵀ, scale, mask the future, softmax, times v.
The causal mask is built once per shape and cached, so the profiler shows the attention,
not mask construction. The same five steps take grouped-query attention (a group's query
heads stacked as extra rows, K and V never copied) and Sq != Sk, masked bottom-right.
One trap is kept on purpose, as the source article has it: the scale comes *after* the
16-bit ``q @ kᵀ``, so large float16 scores overflow to inf and the softmax gives NaN.
"""
from __future__ import annotations

import torch
from torch import nn

from kernels.reference import future_mask
from kernels.registry import LRU, register

MASKS_PER_MODULE = 8   # distinct (Sq, Sk, device) masks a module keeps
MODULES = 16           # distinct (class, causal, scale, device) modules the functions keep


def grouped_future_mask(seq: int, device=None, keys: int | None = None, groups: int = 1) -> torch.Tensor:
    """[groups·seq, keys] bool (keys defaults to seq), True where a query would look at a later key.

    Bottom-right aligned (query i may see keys j <= i + keys - seq); ``groups`` stacks the
    mask that many times, for the stacked query rows of grouped-query attention.

    Built outside inference mode even when called inside it: a mask made under
    ``torch.inference_mode()`` is an inference tensor, and a later training call that saves
    it for backward (``masked_fill`` does) would fail.
    """
    with torch.inference_mode(False):
        mask = future_mask(seq, seq if keys is None else keys, device)
        return mask if groups == 1 else mask.repeat(groups, 1)


class NaiveAttention(nn.Module):
    """softmax(mask(q kᵀ · scale)) v, one op per step."""

    def __init__(self, causal: bool = True, scale: float | None = None):
        super().__init__()
        self.causal = causal
        self.scale = scale
        self.masks = LRU(MASKS_PER_MODULE)   # bounded: one mask per recent (Sq, Sk, device)

    def forward(self, q, k, v):
        b, hq, sq, d = q.shape   # q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]
        hkv = k.shape[1]
        if hq != hkv:  # grouped-query: the G query heads sharing a K/V head become G·Sq rows
            out = self.attend(q.reshape(b, hkv, hq // hkv * sq, d), k, v, sq)   # [B, Hkv, G·Sq, D]
            return out.reshape(b, hq, sq, d)
        return self.attend(q, k, v, sq)

    def attend(self, q, k, v, sq: int):
        """The five steps; q holds sq query rows per head (or G·sq, stacked, for GQA)."""
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        scores = q @ k.transpose(-2, -1)        # [B, H, Sq, D] @ [B, H, D, Sk] -> [B, H, Sq, Sk]
        scores = scores * scale
        if self.causal:
            scores = self.mask_scores(scores, self.mask_for(sq, q.device, k.shape[-2], q.shape[-2] // sq))
        probs = torch.softmax(scores, dim=-1)   # [B, H, Sq, Sk], each row sums to 1
        if self.causal and sq > k.shape[-2]:
            probs = self.no_key_rows(probs, self.mask_for(sq, q.device, k.shape[-2], q.shape[-2] // sq))
        return probs @ v                        # [B, H, Sq, Sk] @ [B, H, Sk, D] -> [B, H, Sq, D]

    def mask_scores(self, scores, future):
        # Out of place: masked_fill returns a new tensor, so PyTorch first copies
        # all of `scores` (an S×S clone per head) and then fills the copy.
        return scores.masked_fill(future, float("-inf"))

    def no_key_rows(self, probs, future):
        """Zero the rows of queries that see no key (causal with Sq > Sk): their softmax is 0/0.

        Only that case pays for it, so the article's traces (Sq == Sk) keep their five ops.
        """
        return probs.masked_fill(future.all(-1, keepdim=True), 0.0)

    def mask_for(self, seq: int, device, keys: int | None = None, groups: int = 1) -> torch.Tensor:
        """The [groups·seq, keys] mask, built on the first call at this shape and device, then reused.

        One mask per shape (rather than slicing one big mask) keeps every forward's trace
        identical whatever lengths ran before it. The cache keeps the most recent few.

        Under ``torch.compile`` the mask is built in the graph and the cache is left alone:
        a cache written inside the compiled call makes Dynamo guard on its length, so every
        new length would compile twice and, after ``recompile_limit`` (8) compiles, run
        eagerly with only a logged warning (chapter 7).
        """
        keys = seq if keys is None else keys
        if torch.compiler.is_compiling():
            mask = future_mask(seq, keys, device)                        # [Sq, Sk]
            return mask if groups == 1 else mask.repeat(groups, 1)        # [G·Sq, Sk]
        return self.masks.get_or_make((seq, keys, groups, str(device)),
                                      lambda: grouped_future_mask(seq, device, keys, groups))


module_cache = LRU(MODULES)


def cached_module(cls, causal: bool, scale: float, device) -> nn.Module:
    """One module per configuration, so the function form also reuses its mask (bounded)."""
    return module_cache.get_or_make((cls, causal, scale, str(device)), lambda: cls(causal=causal, scale=scale))


@register("naive", order=10, materializes_scores=True)
def naive(q, k, v, causal=True, scale=None):
    """Hand-written attention with an out-of-place masked_fill (chapter 1).

    Mirrors the article, overflow included: float16 scores past 65504 become inf before the
    scale is applied, and such rows come out NaN (see the module docstring).
    """
    return cached_module(NaiveAttention, causal, scale, q.device)(q, k, v)
