"""Checks for the exercises of chapter 4, Triton: the online-softmax update and a causal softmax
kernel.

``check_online_update`` feeds your update rule fresh tiles and compares with the softmax;
``check_causal_softmax`` runs your Triton kernel (in the interpreter without a GPU) on fresh
rows. The chapter's occupancy task is checked by ``kernels.exercises.occupancy``.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kernels.exercises.judge import Passed, fail, matches, mistake_matched, not_finite, passed, check_seed, require_tensor, run_learner

__all__ = ["check_online_update", "check_causal_softmax"]


def _online_reference(m, l, acc, s, v, rescale_l=True, rescale_acc=True, inverted=False, tile_max=False):
    """One online-softmax step (base e), with switches that reproduce the usual slips."""
    m_tile = s.amax(-1)
    m_new = m_tile if tile_max else torch.maximum(m, m_tile)
    alpha = torch.exp(m_new - m) if inverted else torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    l_new = (l * alpha if rescale_l else l) + p.sum(-1)
    acc_new = (acc * alpha[:, None] if rescale_acc else acc) + p @ v  # [rows, tile] @ [tile, D] -> [rows, D]
    return m_new, l_new, acc_new


def _stream(update, s, v, block):
    """Run ``update`` over the key tiles of ``s`` [rows, n] and ``v`` [n, D]; the last tile is ragged."""
    rows, d = s.shape[0], v.shape[1]
    m = torch.full((rows,), -math.inf, dtype=s.dtype)
    l = torch.zeros(rows, dtype=s.dtype)
    acc = torch.zeros(rows, d, dtype=s.dtype)
    for start in range(0, s.shape[1], block):
        out = update(m, l, acc, s[:, start:start + block], v[start:start + block])
        if out is None:
            fail("online_update returned None: return (m_new, l_new, acc_new).")
        if not (isinstance(out, tuple) and len(out) == 3):
            fail(f"online_update must return a tuple (m_new, l_new, acc_new); it returned {type(out).__name__}"
                  + ("" if not isinstance(out, tuple) else f" of length {len(out)}") + ".")
        m, l, acc = out
    return m, l, acc


_ONLINE_SLIPS = [
    ("l (the running sum) is not rescaled: when the maximum rises, the old sum is still relative to "
     "the old maximum and must be brought to the new one before the new tile is added.",
     dict(rescale_l=False)),
    ("acc (the running output) is not rescaled: it was summed relative to the old maximum, as l was.",
     dict(rescale_acc=False)),
    ("neither l nor acc is rescaled when the maximum rises: both are still relative to the old maximum.",
     dict(rescale_l=False, rescale_acc=False)),
    ("the rescaling factor is upside down: when the maximum rises, what was summed must shrink, never grow.",
     dict(inverted=True)),
    ("m_new is the tile's maximum only; it must remember the earlier tiles too.",
     dict(tile_max=True)),
]


def check_online_update(online_update: Callable, seed: Optional[int] = None) -> Passed:
    """``online_update(m, l, acc, s, v)`` -> (m, l, acc) after one tile of scores ``s`` and values ``v``."""
    g = torch.Generator().manual_seed(check_seed(seed))
    rows, n, d, block = 5, 13, 8, 4
    # Later tiles get larger scores, so the running maximum must move and rescaling matters.
    s = torch.randn(rows, n, generator=g, dtype=torch.float64) + torch.arange(n, dtype=torch.float64) / block
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    m, l, acc = _stream(lambda *a: run_learner(online_update, *a, what="online_update(m, l, acc, s, v)"), s, v, block)
    want = torch.softmax(s, -1) @ v
    for name, t in (("m_new", m), ("l_new", l), ("acc_new", acc)):
        if not isinstance(t, torch.Tensor):
            fail(f"{name} is a {type(t).__name__}, not a tensor.")
    if not torch.isfinite(acc).all() or not torch.isfinite(l).all():
        fail("NaN or inf after the first tile: m starts at -inf, so look at what your rescaling factor gives "
              "when the old maximum is -inf (inf - inf and -inf - -inf are NaN).")
    out = acc / l[:, None]
    if matches(out, want) and matches(m, s.amax(-1)):
        return passed(f"online_update streams {math.ceil(n / block)} tiles (the last one ragged) to the "
                       "exact softmax(s)·v")
    for message, knobs in _ONLINE_SLIPS:
        with torch.no_grad():
            cm, cl, cacc = _stream(lambda *a: _online_reference(*a, **knobs), s, v, block)
        if torch.isfinite(cacc).all() and matches(out, cacc / cl[:, None]):
            fail(message)
    if not matches(m, s.amax(-1)):
        fail("after the last tile, m must be each row's maximum score; yours is not.")
    fail("the streamed result acc / l differs from softmax(s)·v. Work one step on paper, as chapter 4 does "
          "for the row [1, 2, 5, 0]: the new maximum, the tile's weights, then l and acc brought to the new "
          "maximum before the tile is added.")


def _causal_softmax64(x, diagonal=1, hide="future"):
    x = x.detach().to("cpu", torch.float64)
    n = x.shape[-1]
    ones = torch.ones(n, n, dtype=torch.bool)
    hidden = ones.triu(diagonal) if hide == "future" else ones.tril(-diagonal)
    return x.masked_fill(hidden, -math.inf).softmax(-1)


def check_causal_softmax(causal_softmax: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``causal_softmax(x)`` on an [S, S] float32 matrix: softmax of each row over keys j <= i."""
    g = torch.Generator().manual_seed(check_seed(seed))
    for s in (13, 32, 1):
        x = torch.randn(s, s, generator=g).to(device)
        out = run_learner(causal_softmax, x, what="causal_softmax(x)")
        require_tensor(out, "causal_softmax", x.shape, x.dtype, x.device)
        if matches(out, _causal_softmax64(x)):
            continue
        case = f"S={s}"
        known = mistake_matched(out, [
            ("the causal mask is off by one: row 0 has no key left and comes out NaN; which key should "
             "a query always see?", _causal_softmax64(x, diagonal=0), None),
            ("the causal mask is off by one the other way: each row also sees the next column.",
             _causal_softmax64(x, diagonal=2), None),
            ("the mask points the wrong way: rows see later columns instead of earlier ones.",
             _causal_softmax64(x, hide="past"), None),
            ("no causal mask: every row sees every column.", torch.softmax(x.double().cpu(), -1), None),
        ])
        if known:
            fail(f"[{case}] {known}")
        bad = not_finite(out, "causal_softmax")
        fail(f"[{case}] " + (bad or "rows differ from the causal softmax (keys j <= i only).")
              + " Check the load mask (cols < S) and the `other=` value of masked-out columns (-inf).")
    return passed("causal_softmax masks exactly the future (S = 13, 32 and 1, padded to a power of two)")
