"""What every exercise check shares: the verdicts, the seed, and the comparisons.

A ``check_*`` function runs what you wrote on inputs it has never seen (random, odd sizes,
non-contiguous views) and compares it with a judge (mostly ``kernels.reference``): one ``✔``
line and a :class:`Passed`, or :class:`ExerciseFailed` with a sentence about what is wrong.
A check that draws random inputs prints its seed; pass it back as ``seed=`` to replay them.
Each check also computes what the known mistakes would give (the scale left out, the mask
off by one...) and names the one yours matches, else where yours differs. Learners need only
``__all__``; the helpers below it are what the chapter modules build their checks from.
"""
from __future__ import annotations

import math
import tempfile
from typing import Callable, NoReturn, Optional

import torch

from kernels import reference
from kernels.trace import record
from kernels.notebook import say

__all__ = ["ExerciseFailed", "Passed", "showing_solutions", "FP32_TOL"]

FP32_TOL = 1e-4  # your code is not judged on the last bits: every mistake a check names is far larger


class ExerciseFailed(AssertionError):
    """Your answer is not right yet; the message says how."""


class Passed:
    """What a check returns when the answer is right: true, and silent as a cell's last value.

    The check has already printed its verdict; a bare ``True`` under it would only be noise.
    """

    def __init__(self, message: str):
        self.message = message

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Passed({self.message!r})"

    def _ipython_display_(self) -> None:
        pass


_SOLUTIONS_SHOWN = False


def showing_solutions(shown: bool) -> None:
    """Say whether this copy runs the course's hidden solutions (the built book does): each ✔
    then names them, so an empty answer cell above a ✔ cannot read as the learner's success."""
    global _SOLUTIONS_SHOWN
    _SOLUTIONS_SHOWN = bool(shown)   # the page says so above its first task (tools/book/convert.py)


def passed(message: str) -> Passed:
    global _SEED
    _SEED = None
    say(f"✔ {'the course solution: ' if _SOLUTIONS_SHOWN else ''}{message}", kind="lesson")
    return Passed(message)


def fail(message: str) -> NoReturn:
    """The check failed: say what, and the seed of its random cases where it drew some."""
    replay = f" (seed {_SEED}: pass seed={_SEED} to the check to replay these cases)" if _SEED is not None else ""
    raise ExerciseFailed(message + replay)


# ------------------------------------------------------------------------------- seeding

_SEED: Optional[int] = None   # the seed of the running check's random cases, for its failure message


def check_seed(seed: Optional[int] = None) -> int:
    """The seed of one check's random inputs: fresh each run unless given. A failure names it
    (``fail``), so it can be replayed exactly (pass it as ``seed=``); a pass does not print it."""
    global _SEED
    _SEED = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else int(seed)
    return _SEED


def seeded_generator(seed: Optional[int] = None) -> torch.Generator:
    """A generator for one check's random inputs, from :func:`check_seed`."""
    return torch.Generator().manual_seed(check_seed(seed))


def draw_int(g: torch.Generator, low: int, high: int) -> int:
    """An int in [low, high), drawn from ``g``."""
    return int(torch.randint(low, high, (), generator=g))


# ------------------------------------------------------------------------------- the learner's code

def run_learner(fn: Callable, *args, what: str = "your function", **kwargs):
    """Call the learner's code; turn its exceptions into a sentence instead of a traceback."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        fail(f"{what} is not written yet (it raised NotImplementedError).")
    except ExerciseFailed:
        raise
    except Exception as err:  # any bug in learner code is a finding, not a crash of the check
        fail(f"{what} raised {type(err).__name__}: {err}")


def is_blank(value) -> bool:
    return value is None or value is Ellipsis or (isinstance(value, (list, tuple, dict, str)) and not value)


def as_number(got, what: str) -> float:
    if is_blank(got) or isinstance(got, bool) or not isinstance(got, (int, float)):
        fail(f"{what} returned {got!r}; return a number.")
    return float(got)


def require_tensor(out, what: str, expected_shape, expected_dtype=None, expected_device=None) -> None:
    if out is None:
        fail(f"{what} returned None: it has no `return` yet (or returns nothing).")
    if not isinstance(out, torch.Tensor):
        fail(f"{what} returned a {type(out).__name__}, not a torch.Tensor.")
    if tuple(out.shape) != tuple(expected_shape):
        fail(f"wrong shape: {what} returned {tuple(out.shape)}, expected {tuple(expected_shape)}.")
    if expected_dtype is not None and out.dtype != expected_dtype:
        fail(f"wrong dtype: {what} returned {out.dtype}, expected {expected_dtype} (the input's dtype).")
    if expected_device is not None and out.device != torch.device(expected_device):
        fail(f"wrong device: {what} returned a tensor on {out.device}, the inputs were on {expected_device}.")


# ------------------------------------------------------------------------------- comparisons

def matches(out: torch.Tensor, ref: torch.Tensor, tol: float = FP32_TOL, rows=None) -> bool:
    """True if ``out`` matches ``ref`` (NaN where ref is NaN), optionally only on ``rows``
    (a bool mask over the second-to-last dimension)."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if rows is not None:
        out, ref = out[..., rows, :], ref[..., rows, :]
    if not torch.equal(torch.isnan(out), torch.isnan(ref)):
        return False
    infinite = torch.isinf(ref)  # -inf in masked scores must be exactly -inf
    if not torch.equal(out[infinite], ref[infinite]) or torch.isinf(out[~infinite]).any():
        return False
    ok = torch.isfinite(ref)
    if not ok.any():
        return True
    scale = ref[ok].abs().max().clamp_min(1e-30)
    return bool(((out[ok] - ref[ok]).abs().max() / scale) <= tol)


def mistake_matched(out, candidates) -> Optional[str]:
    """The message of the first known mistake whose result ``out`` reproduces; ``candidates``
    are (message, what that mistake returns or None, rows to compare or None)."""
    for message, expected, rows in candidates:
        if expected is not None and matches(out, expected, rows=rows):
            return message
    return None


def not_finite(out: torch.Tensor, what: str) -> Optional[str]:
    bad = ~torch.isfinite(out.detach())
    if not bad.any():
        return None
    kind = "NaN" if torch.isnan(out.detach()).any() else "inf"
    if out.dim() >= 2:
        # [..., S, D] -> which of the S rows hold a bad value anywhere
        rows = bad.reshape(-1, *out.shape[-2:]).any(0).any(-1).nonzero().flatten().tolist()
        where = f" in rows (queries) {rows[:6]}{'...' if len(rows) > 6 else ''}"
    else:
        where = ""
    return f"{what} produced {kind}{where}."


# ------------------------------------------------------------------------------- traces

def profile_trace(fn, *args, label, active=1):

    with tempfile.TemporaryDirectory() as tmp:
        return record.profile(fn, *args, label=label, wait=0, warmup=1, active=active, trace_dir=tmp)


def profile_step(fn, *args, label):
    return profile_trace(fn, *args, label=label).step(0)


def top_level_ancestor(step, index: int) -> str:
    """The name of the depth-0 op that (directly or not) called op ``index``."""
    ops = step.ops
    while ops.at[index, "parent"] >= 0:
        index = int(ops.at[index, "parent"])
    return str(ops.at[index, "name"])


# ------------------------------------------- attention, judged in float64 (exercises 1, 2, 3, 7)

def attention64(q, k, v, causal=True, scale=None, diagonal=1, hide="future", fill=-math.inf,
                 dim=-1, keep_mask=None, add_mask=None, cap=None):
    """Attention in float64, with the knobs that reproduce the usual mistakes (and ``cap``, the
    soft-capping cap · tanh(score / cap) of chapter 7's score_mod)."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale  # [B, H, Sq, D] @ [B, H, D, Sk] -> [B, H, Sq, Sk]
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    n_q, n_k = s.shape[-2:]
    if causal:
        ones = torch.ones(n_q, n_k, dtype=torch.bool)
        hidden = ones.triu(diagonal) if hide == "future" else ones.tril(-diagonal)
        s = s.masked_fill(hidden, fill)
    if keep_mask is not None:
        s = s.masked_fill(~keep_mask.cpu(), -math.inf)
    if add_mask is not None:
        s = s + add_mask.cpu().to(torch.float64)
    return s.softmax(dim=dim) @ v


def attention_mistakes(q, k, v, causal, scale):
    """(message, what that mistake returns, rows to compare or None) for each known mistake."""
    d = q.shape[-1]
    a = lambda **kw: attention64(q, k, v, **{"causal": causal, "scale": scale, **kw})  # noqa: E731
    default = 1.0 / math.sqrt(d)
    m = []
    if scale is not None:
        m.append(("you ignored the `scale` argument: when it is given, use it instead of 1/sqrt(head_dim).",
                  a(scale=default), None))
    else:
        m += [("the scale is missing: multiply the scores q·kᵀ by 1/sqrt(head_dim) before the softmax.",
               a(scale=1.0), None),
              ("the scale is upside down: you multiplied by sqrt(head_dim); divide by it instead.",
               a(scale=math.sqrt(d)), None),
              ("the scale is 1/head_dim; it should be 1/sqrt(head_dim).", a(scale=1.0 / d), None)]
    if causal:
        m += [("the causal mask is off by one: it hides the diagonal too, so query 0 sees no key at all "
               "(its row is NaN). A query may look at its own position: hide only keys j > i. Which diagonal "
               "of triu starts there?",
               a(diagonal=0), None),
              ("the causal mask is off by one: each query also sees the next key. Hide every key j > i: "
               "which diagonal of triu starts there?", a(diagonal=2), None),
              ("the mask points the wrong way: it hides the past instead of the future. Which triangle "
               "holds the keys j > i?", a(hide="past"), None),
              ("the causal mask is missing: with causal=True, hide every key after the query.",
               a(causal=False), None),
              ("the masked scores are set to 0: exp(0) = 1, so the future still gets weight. Which score "
               "does exp turn into exactly 0?", a(fill=0.0), None)]
    else:
        m.append(("you applied the causal mask although causal=False: mask only when asked.",
                  a(causal=True), None))
    m.append(("the softmax runs over the wrong dimension: it is each query's row of scores (one per "
              "key) that must sum to 1, not each column.", a(dim=-2), None))
    return m


def attention_cases(device, seed: int):
    """Random inputs: odd sizes, a non-contiguous layout, both causal modes, a given scale."""
    g = torch.Generator().manual_seed(seed)

    def qkv(b, h, s, d, bshd=False):
        shape = (3, b, s, h, d) if bshd else (3, b, h, s, d)
        t = torch.randn(*shape, generator=g).to(device)
        # [B, S, H, D] -> a [B, H, S, D] view whose strides are not contiguous
        return tuple((x.transpose(1, 2) if bshd else x) for x in t.unbind(0))

    return [
        ("B=2, H=3, S=17, D=16, causal", qkv(2, 3, 17, 16), True, None),
        ("B=1, H=2, S=33, D=32, causal, non-contiguous [B,S,H,D] views", qkv(1, 2, 33, 32, bshd=True), True, None),
        ("B=1, H=2, S=9, D=8, causal=False", qkv(1, 2, 9, 8), False, None),
        ("B=1, H=1, S=12, D=16, causal, scale=0.3", qkv(1, 1, 12, 16), True, 0.3),
    ]


def judge_attention(out, q, k, v, causal, scale, case, what, mistakes=None):
    require_tensor(out, what, q.shape, q.dtype, q.device)
    ref = reference.attention(q, k, v, causal=causal, scale=scale)
    if matches(out, ref):
        return
    known = mistake_matched(out, mistakes if mistakes is not None else attention_mistakes(q, k, v, causal, scale))
    if known:
        fail(f"[{case}] {known}")
    bad = not_finite(out, what)
    if bad:
        fail(f"[{case}] {bad} Look for a row whose every score is -inf, or an overflow.")
    err = reference.max_rel_error(out, ref)
    fail(f"[{case}] values differ from the float64 reference (max relative error {err:.2e}, "
          f"tolerance {FP32_TOL:g}), and not in a way the check recognizes: print your output next "
          f"to reference.attention(q, k, v) on a small input (S=4) and compare row by row.")
