"""Checks for the exercises of chapter 7 (compiled attention, FlexAttention).

The contract of ``kernels.exercises.judge``: each ``check_*`` runs your function on inputs it has
never seen (a failure names their seed, so it can be replayed with ``seed=``), compares with
a judge computed here, and either prints one ``✔`` line or raises ``ExerciseFailed`` with a
sentence saying what is wrong: the known mistake your answer reproduces, or where it differs.

None of these checks compiles anything: masks are evaluated with ``create_mask`` and
``create_block_mask``, and score_mods run through FlexAttention's eager path (slow, exact).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable, Optional

import torch

from kernels.attention.torch_compile import block_counts, causal_mod
from kernels.reference import max_rel_error
from kernels.exercises.judge import Passed, as_number, draw_int, fail, is_blank, matches, passed, run_learner, seeded_generator
from kernels.exercises.judge import attention64

__all__ = ["check_window_mask", "check_skipped_tiles", "check_softcap"]


# ============================================================================ task 1: a mask_mod

def _window(seq: int, window: int) -> torch.Tensor:
    """[seq, seq] bool: query i sees key j when i - window < j <= i (causal, the last ``window`` keys)."""
    i = torch.arange(seq).view(-1, 1)
    j = torch.arange(seq).view(1, -1)
    return (j <= i) & (j > i - window)


def _dense(mask_mod: Callable, seq: int) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_mask

    return create_mask(mask_mod, None, None, seq, seq, device="cpu")[0, 0].bool()  # [1, 1, S, S] -> [S, S]


def check_window_mask(sliding_window: Callable, seed: Optional[int] = None) -> Passed:
    """``sliding_window(window)`` must return a mask_mod: query i sees keys j with i - window < j <= i."""
    g = seeded_generator(seed)
    cases = [(draw_int(g, 20, 90), draw_int(g, 2, 12)) for _ in range(3)]
    cases.append((9, 1))   # a window of one: each query sees only itself
    for seq, window in cases:
        mod = run_learner(sliding_window, window, what=f"sliding_window({window})")
        if is_blank(mod) or not callable(mod):
            fail(f"sliding_window({window}) must return a function mask_mod(b, h, q_idx, kv_idx); "
                  f"it returned {mod!r}.")
        got = run_learner(_dense, mod, seq, what="your mask_mod (evaluated by create_mask)")
        want = _window(seq, window)
        if torch.equal(got, want):
            continue
        case = f"[S={seq}, window={window}]"
        mistakes = [
            (_window(seq, window + 1), "each query sees one key too many: with window w it sees "
             "itself and the w - 1 keys before it (j > i - w, not j >= i - w)."),
            (_window(seq, window - 1) if window > 1 else None, "each query sees one key too few: "
             "it should see itself and the w - 1 keys before it (j > i - w)."),
            (_window(seq, seq), "the window is missing: this is plain causal attention; also "
             "require j > i - window."),
            (_window(seq, window) | ~torch.ones(seq, seq, dtype=torch.bool).tril(),
             "the causal bound is missing: queries see future keys. Require kv_idx <= q_idx too."),
            (_window(seq, window).T, "the mask points the wrong way (keys after the query): "
             "compare kv_idx <= q_idx, not q_idx <= kv_idx."),
        ]
        for mask, words in mistakes:
            if mask is not None and torch.equal(got, mask):
                fail(f"{case} {words}")
        bad = (got != want).nonzero()[0].tolist()
        fail(f"{case} the mask differs from the sliding window at query {bad[0]}, key {bad[1]}: you say "
              f"{'visible' if got[bad[0], bad[1]] else 'hidden'}, it should be "
              f"{'visible' if want[bad[0], bad[1]] else 'hidden'}.")
    return passed(f"sliding_window gives the right mask on {len(cases)} fresh (length, window) pairs")


# ============================================================================ task 2: tiles

def check_skipped_tiles(skipped_tiles: Callable, seed: Optional[int] = None) -> Passed:
    """``skipped_tiles(seq, block)``: how many tiles a causal block mask skips (checked against
    ``create_block_mask`` itself)."""
    from torch.nn.attention.flex_attention import create_block_mask

    g = seeded_generator(seed)
    cases = [(128 * draw_int(g, 2, 6), 128),
             (draw_int(g, 130, 700), 128),
             (draw_int(g, 40, 200), 32), (100, 128)]
    for seq, block in cases:
        want = block_counts(create_block_mask(causal_mod(0), None, None, seq, seq, device="cpu",
                                              BLOCK_SIZE=block)).skipped
        got = as_number(run_learner(skipped_tiles, seq, block, what=f"skipped_tiles({seq}, {block})"),
                        f"skipped_tiles({seq}, {block})")
        if got == want:
            continue
        n_ceil, n_floor = math.ceil(seq / block), seq // block
        case = f"[S={seq}, block={block}: {n_ceil} tiles per row]"
        if got == n_ceil * (n_ceil + 1) // 2:
            fail(f"{case} you counted the tiles on the diagonal as skipped: they hold visible scores "
                  "(the query sees itself), so they are computed, with a mask.")
        if got == n_ceil * n_ceil / 2 or got == n_ceil * n_ceil // 2:
            fail(f"{case} half of all tiles is the area above the diagonal, but tiles are whole: the "
                  "tiles on the diagonal are computed (with a mask), so they are not among the skipped.")
        if got == n_floor * (n_floor - 1) // 2 and n_floor != n_ceil:
            fail(f"{case} the last, shorter tile row counts too: use ceil(S / block) tiles, not S // block.")
        fail(f"{case} create_block_mask skips {'more' if want > got else 'fewer'} tiles than the {got:g} you said.")
    return passed(f"skipped_tiles matches create_block_mask on {len(cases)} fresh lengths and tile sizes")


# ============================================================================ task 3: a score_mod

def _floats_specialised():
    """Dynamo burns the Python floats a function captures into its graph as constants.

    FlexAttention's eager path traces its score_mod with Dynamo. The checks call it with
    score_mods that capture different floats (each cap, and each known mistake); from torch
    2.15 on, Dynamo's automatic dynamic makes a float that changed between two calls a
    ``SymFloat`` input, which the flex_attention operator refuses ("can only be of (Tensor,
    int, SymInt) but got (SymFloat,)"). Specialising floats traces each cap as a constant.
    """
    import torch._dynamo

    if not hasattr(torch._dynamo.config, "specialize_float"):
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(specialize_float=True)


def _eager_flex(q, k, v, score_mod, causal: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(causal_mod(0), None, None, q.shape[-2], k.shape[-2], device="cpu") if causal else None
    with warnings.catch_warnings(), _floats_specialised():
        warnings.simplefilter("ignore")   # "called without torch.compile": on purpose, exact and slow
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)


def check_softcap(softcap: Callable, seed: Optional[int] = None) -> Passed:
    """``softcap(cap)`` must return a score_mod that maps each score to cap · tanh(score / cap)."""
    g = seeded_generator(seed)
    s = draw_int(g, 9, 40)
    q, k, v = (t * 3 for t in torch.randn(3, 1, 2, s, 16, generator=g).unbind(0))   # large scores: the cap bites
    for cap, causal in ((float(draw_int(g, 2, 6)), True), (1.5, False)):
        mod = run_learner(softcap, cap, what=f"softcap({cap})")
        if is_blank(mod) or not callable(mod):
            fail(f"softcap({cap}) must return a function score_mod(score, b, h, q_idx, kv_idx); it returned {mod!r}.")
        out = run_learner(_eager_flex, q, k, v, mod, causal, what="flex_attention with your score_mod")
        want = attention64(q, k, v, causal=causal, cap=cap)
        if matches(out, want):
            continue
        case = f"[S={s}, cap={cap}, causal={causal}]"
        tries = {
            "the scores are not capped at all: your score_mod returns each score unchanged.": lambda sc, *a: sc,
            "tanh(score / cap) lies in (-1, 1): multiply it by cap again.": lambda sc, *a: torch.tanh(sc / cap),
            "divide the score by cap inside the tanh: cap * tanh(score) saturates far too early.":
                lambda sc, *a: cap * torch.tanh(sc),
            "clamping is a hard cap; soft-capping is smooth (the task's formula, not a clamp).":
                lambda sc, *a: sc.clamp(-cap, cap),
        }
        for words, wrong in tries.items():
            if matches(out, _eager_flex(q, k, v, wrong, causal)):
                fail(f"{case} {words}")
        fail(f"{case} the output differs from soft-capped attention by {max_rel_error(out, want):.2e} (relative): print "
              "your score_mod(torch.tensor([0.5, 5.0, 50.0]), 0, 0, 0, 0) and compare with cap·tanh(x/cap).")
    return passed("softcap's score_mod gives soft-capped attention (checked against float64, causal and not)")
