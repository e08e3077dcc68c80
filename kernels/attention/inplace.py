"""Chapter 2: the same attention, with the mask applied in place.

One character changes (``masked_fill`` -> ``masked_fill_``), and with it one S×S copy
per forward disappears from the trace. Everything else is chapter 1's naive attention
(``kernels.attention.naive``): the same five steps, the same cached masks, grouped-query
attention and Sq != Sk alike.
"""
from __future__ import annotations

from kernels.attention.naive import NaiveAttention, cached_module
from kernels.registry import register


class InplaceAttention(NaiveAttention):
    """NaiveAttention whose mask step writes into the scores it was given."""

    def mask_scores(self, scores, future):
        # In place: fill the scores tensor itself; no clone, no extra S×S buffer.
        # Safe here because nothing else holds `scores` (autograd saved nothing of it).
        return scores.masked_fill_(future, float("-inf"))


@register("inplace", order=20, materializes_scores=True)
def inplace(q, k, v, causal=True, scale=None):
    """Hand-written attention with an in-place masked_fill_ (chapter 2)."""
    return cached_module(InplaceAttention, causal, scale, q.device)(q, k, v)


def attention_with_inplace_dropout(q, k, v, p: float = 0.1):
    """Where in place is NOT allowed (chapter 2): attention that drops probabilities in place.

    Softmax saves its output for the backward pass, and ``mul_`` then writes into that saved
    tensor, so ``backward()`` raises autograd's "modified by an inplace operation" error. The
    forward itself runs fine; only differentiating through it fails.
    """
    import torch

    probs = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    probs.mul_(torch.rand_like(probs) > p)  # in-place dropout on what softmax saved
    return probs @ v


def backward_error(fn, *inputs) -> str | None:
    """The message of the ``RuntimeError`` autograd raises on ``fn(*inputs).sum().backward()``,
    or None when the backward pass goes through (chapter 2's in-place dropout does not)."""
    try:
        fn(*inputs).sum().backward()
    except RuntimeError as err:
        return str(err)
    return None
