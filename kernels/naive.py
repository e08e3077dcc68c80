"""Chapter 1: attention written by hand, the way most people first write it.

Five steps, each one PyTorch op: scores = q kᵀ, scale, mask the future, softmax, times v.
The causal mask is built once and reused (as in the source article), so what the
profiler shows per forward is the attention itself, not mask construction.
"""
from __future__ import annotations

import torch
from torch import nn

from .registry import register


def future_mask(seq: int, device=None) -> torch.Tensor:
    """[seq, seq] bool, True where a query would look at a later key (to be hidden)."""
    return torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)


class NaiveAttention(nn.Module):
    """softmax(mask(q kᵀ · scale)) v, one op per step."""

    def __init__(self, causal: bool = True, scale: float | None = None):
        super().__init__()
        self.causal = causal
        self.scale = scale
        self.masks: dict[tuple, torch.Tensor] = {}

    def forward(self, q, k, v):
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        scores = q @ k.transpose(-2, -1)
        scores = scores * scale
        if self.causal:
            scores = self.mask_scores(scores, self.mask_for(q.shape[-2], q.device))
        probs = torch.softmax(scores, dim=-1)
        return probs @ v

    def mask_scores(self, scores, future):
        # Out of place: masked_fill returns a new tensor, so PyTorch first copies
        # all of `scores` (an S×S clone per head) and then fills the copy.
        return scores.masked_fill(future, float("-inf"))

    def mask_for(self, seq: int, device) -> torch.Tensor:
        """The [seq, seq] mask, built on the first call at this length and device, then reused.

        One mask per length (rather than slicing one big mask) keeps every forward's trace
        identical whatever lengths ran before it.
        """
        key = (seq, str(device))
        if key not in self.masks:
            self.masks[key] = future_mask(seq, device)
        return self.masks[key]


_modules: dict[tuple, NaiveAttention] = {}


def cached_module(cls, causal: bool, scale: float, device) -> nn.Module:
    """One module per configuration, so the function form also reuses its mask."""
    key = (cls, causal, scale, str(device))
    if key not in _modules:
        _modules[key] = cls(causal=causal, scale=scale)
    return _modules[key]


@register("naive", order=10)
def naive(q, k, v, causal=True, scale=None):
    """Hand-written attention with an out-of-place masked_fill (chapter 1)."""
    return cached_module(NaiveAttention, causal, scale, q.device)(q, k, v)
