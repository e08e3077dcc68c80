"""Checks for the exercise notebooks: run your code on fresh inputs, say in words what is wrong.

Every ``check_*`` function takes the function (or numbers) you wrote, runs it on inputs
it has never seen (random, odd sizes, non-contiguous views), and compares the result with
the course's judge, ``kernels.reference``. It either prints one ``✔`` line and returns
True, or raises :class:`ExerciseFailed` with a sentence about *what* is wrong.

How a check finds the words: for each task it knows the mistakes people make (the scale
left out, the mask off by one, causal FLOPs counted at full price...). It computes what
each mistake would have produced and compares your result with those too. If yours
matches one, the check names it. If it matches none, the check still tells you where
your answer differs (which case, which row, how far off), never just "failed".
"""
from __future__ import annotations

import math
import tempfile
from typing import Callable, Optional

import torch

from . import reference

__all__ = [
    "ExerciseFailed", "check_top_level_guess", "check_hottest_op", "check_attention",
    "check_hidden_copy", "check_inplace_mask", "check_lean_attention", "check_work_op_count",
    "check_sdpa_mask", "check_safe_softmax", "check_online_update", "check_causal_softmax",
    "check_occupancy", "check_tflops", "check_intensity", "work_op_count",
]

FP32_TOL = 1e-4  # your code is not judged on the last bits: every mistake below is far larger


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
    _SOLUTIONS_SHOWN = bool(shown)
    if shown:
        print("This copy runs the course's hidden solutions, so every check below passes with theirs. "
              "Download the notebook (it comes unsolved) to answer yourself.")


def _passed(message: str) -> Passed:
    print(f"✔ {'the course solution: ' if _SOLUTIONS_SHOWN else ''}{message}")
    return Passed(message)


def _fail(message: str):
    raise ExerciseFailed(message)


def _seed(seed: Optional[int] = None) -> int:
    """The seed of one check's random inputs: fresh each run unless given, and always printed,
    so a failure can be replayed exactly (pass the printed seed as ``seed=``)."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else int(seed)
    print(f"(seed {seed}: pass seed={seed} to replay these cases)")
    return seed


def _run(fn: Callable, *args, what: str = "your function", **kwargs):
    """Call the learner's code; turn its exceptions into a sentence instead of a traceback."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        _fail(f"{what} is not written yet (it raised NotImplementedError).")
    except ExerciseFailed:
        raise
    except Exception as err:  # any bug in learner code is a finding, not a crash of the check
        _fail(f"{what} raised {type(err).__name__}: {err}")


def _blank(value) -> bool:
    return value is None or value is Ellipsis or (isinstance(value, (list, tuple, dict, str)) and not value)


def _is_tensor(out, what: str, expected_shape, expected_dtype=None, expected_device=None) -> None:
    if out is None:
        _fail(f"{what} returned None: it has no `return` yet (or returns nothing).")
    if not isinstance(out, torch.Tensor):
        _fail(f"{what} returned a {type(out).__name__}, not a torch.Tensor.")
    if tuple(out.shape) != tuple(expected_shape):
        _fail(f"wrong shape: {what} returned {tuple(out.shape)}, expected {tuple(expected_shape)}.")
    if expected_dtype is not None and out.dtype != expected_dtype:
        _fail(f"wrong dtype: {what} returned {out.dtype}, expected {expected_dtype} (the input's dtype).")
    if expected_device is not None and out.device != torch.device(expected_device):
        _fail(f"wrong device: {what} returned a tensor on {out.device}, the inputs were on {expected_device}.")


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float = FP32_TOL, rows=None) -> bool:
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


def _which(out, candidates) -> Optional[str]:
    """The message of the first known mistake whose result ``out`` reproduces."""
    for message, expected, rows in candidates:
        if expected is not None and _close(out, expected, rows=rows):
            return message
    return None


def _not_finite(out: torch.Tensor, what: str) -> Optional[str]:
    bad = ~torch.isfinite(out.detach())
    if not bad.any():
        return None
    kind = "NaN" if torch.isnan(out.detach()).any() else "inf"
    if out.dim() >= 2:
        rows = bad.reshape(-1, *out.shape[-2:]).any(0).any(-1).nonzero().flatten().tolist()
        where = f" in rows (queries) {rows[:6]}{'...' if len(rows) > 6 else ''}"
    else:
        where = ""
    return f"{what} produced {kind}{where}."


# ============================================================================ chapter 0

def check_top_level_guess(guess, fn: Callable, *args) -> Passed:
    """Your guess of the ops at the top level of ``fn(*args)``'s trace, then the trace."""
    if _blank(guess):
        _fail("write your guess first: a list of op names such as [\"aten::matmul\", ...]. "
              "Guessing before looking is the habit; the trace is the answer key.")
    guess = list(guess)
    seen = _profile_step(fn, *args, label="guess").top_level()["name"].tolist()
    if guess == seen:
        return _passed(f"your guess matches the trace: {seen}")
    hint = []
    deeper = [g for g in guess if g not in seen]
    if sorted(guess) == sorted(seen):
        _fail(f"right ops, wrong order: the trace runs {seen}, you guessed {guess}.")
    for name in deeper:
        hint.append(f"{name} is not at the top level"
                    + (" (it is one level down: the top level shows what your code called, e.g. "
                       "aten::matmul, and the concrete kernel such as aten::mm runs under it)"
                       if name in ("aten::mm", "aten::bmm", "aten::addmm") else ""))
    missing = [s for s in seen if s not in guess]
    if missing:
        hint.append(f"missing from your guess: {missing}")
    _fail(f"the trace shows {seen}; you guessed {guess}. " + "; ".join(hint) + ".")


def hottest_op_reference(step) -> str:
    ops = step.ops
    return str(ops.loc[ops["self_us"].idxmax(), "name"])


def check_hottest_op(hottest_op: Callable, fn: Callable, *args) -> Passed:
    """``hottest_op(step)`` must name the op with the most *self* time in a profiled step."""
    run = _profile(fn, *args, label="hot", active=3)
    for step in run.steps():
        got = _run(hottest_op, step, what="hottest_op(step)")
        if _blank(got):
            _fail("hottest_op(step) returned nothing: return the name of an op, e.g. \"aten::mm\".")
        want = hottest_op_reference(step)
        if got == want:
            continue
        by_total = str(step.ops.loc[step.ops["dur_us"].idxmax(), "name"])
        if got == by_total:
            _fail(f"you picked {got}, the op with the longest *total* time (dur_us). That time "
                  f"includes its children, so a parent always wins. Self time (self_us) is the "
                  f"time spent in the op itself: here {want} has the most.")
        _fail(f"step {step.index}: the op with the most self time (self_us) is {want}, you said {got!r}.")
    return _passed(f"hottest_op finds where the time went in all {len(run.steps())} steps "
                   f"({hottest_op_reference(run.steps()[0])})")


# ============================================================================ chapter 1

def _attention64(q, k, v, causal=True, scale=None, diagonal=1, hide="future", fill=-math.inf,
                 dim=-1, keep_mask=None, add_mask=None):
    """Attention in float64, with the knobs that reproduce the usual mistakes."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
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


def _attention_mistakes(q, k, v, causal, scale):
    """(message, what that mistake returns, rows to compare or None) for each known mistake."""
    d = q.shape[-1]
    a = lambda **kw: _attention64(q, k, v, **{"causal": causal, "scale": scale, **kw})
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
               "(its row is NaN). A query may look at its own position: hide only keys j > i (triu(1)).",
               a(diagonal=0), None),
              ("the causal mask is off by one: each query also sees the next key. Hide every key j > i "
               "(triu(diagonal=1)).", a(diagonal=2), None),
              ("the mask points the wrong way: it hides the past instead of the future. Hide keys j > i "
               "(the upper triangle, triu(1)).", a(hide="past"), None),
              ("the causal mask is missing: with causal=True, hide every key after the query.",
               a(causal=False), None),
              ("the masked scores are set to 0 instead of -inf: exp(0) = 1, so the future still gets "
               "weight. Fill with float('-inf').", a(fill=0.0), None)]
    else:
        m.append(("you applied the causal mask although causal=False: mask only when asked.",
                  a(causal=True), None))
    m.append(("the softmax runs over the wrong dimension: normalize each query's row of scores, dim=-1 "
              "(over keys), not dim=-2.", a(dim=-2), None))
    return m


def _attention_cases(device, seed: int):
    """Random inputs: odd sizes, a non-contiguous layout, both causal modes, a given scale."""
    g = torch.Generator().manual_seed(seed)

    def qkv(b, h, s, d, bshd=False):
        shape = (3, b, s, h, d) if bshd else (3, b, h, s, d)
        t = torch.randn(*shape, generator=g).to(device)
        return tuple((x.transpose(1, 2) if bshd else x) for x in t.unbind(0))

    return [
        ("B=2, H=3, S=17, D=16, causal", qkv(2, 3, 17, 16), True, None),
        ("B=1, H=2, S=33, D=32, causal, non-contiguous [B,S,H,D] views", qkv(1, 2, 33, 32, bshd=True), True, None),
        ("B=1, H=2, S=9, D=8, causal=False", qkv(1, 2, 9, 8), False, None),
        ("B=1, H=1, S=12, D=16, causal, scale=0.3", qkv(1, 1, 12, 16), True, 0.3),
    ]


def _judge_attention(out, q, k, v, causal, scale, case, what, mistakes=None):
    _is_tensor(out, what, q.shape, q.dtype, q.device)
    ref = reference.attention(q, k, v, causal=causal, scale=scale)
    if _close(out, ref):
        return
    known = _which(out, mistakes if mistakes is not None else _attention_mistakes(q, k, v, causal, scale))
    if known:
        _fail(f"[{case}] {known}")
    bad = _not_finite(out, what)
    if bad:
        _fail(f"[{case}] {bad} Look for a row whose every score is -inf, or an overflow.")
    err = reference.max_rel_error(out, ref)
    _fail(f"[{case}] values differ from the float64 reference (max relative error {err:.2e}, "
          f"tolerance {FP32_TOL:g}), and not in a way the check recognizes: print your output next "
          f"to reference.attention(q, k, v) on a small input (S=4) and compare row by row.")


def check_attention(my_attention: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``my_attention(q, k, v, causal=True, scale=None)`` against the float64 reference."""
    seed = _seed(seed)
    cases = _attention_cases(device, seed)
    for case, (q, k, v), causal, scale in cases:
        out = _run(my_attention, q, k, v, causal=causal, scale=scale,
                   what="my_attention(q, k, v, causal, scale)")
        _judge_attention(out, q, k, v, causal, scale, case, "my_attention")
    return _passed(f"my_attention matches the float64 reference on {len(cases)} fresh cases "
                   "(odd lengths, a non-contiguous layout, causal on and off, a given scale)")


def _profile(fn, *args, label, active=1):
    from . import profiling

    with tempfile.TemporaryDirectory() as tmp:
        return profiling.profile(fn, *args, label=label, wait=0, warmup=1, active=active, trace_dir=tmp)


def _profile_step(fn, *args, label):
    return _profile(fn, *args, label=label).step(0)


def top_level_ancestor(step, index: int) -> str:
    """The name of the depth-0 op that (directly or not) called op ``index``."""
    ops = step.ops
    while ops.at[index, "parent"] >= 0:
        index = int(ops.at[index, "parent"])
    return str(ops.at[index, "name"])


def hidden_copy_reference(step, min_bytes: int) -> Optional[str]:
    copies = step.copies(min_bytes=min_bytes)
    if copies.empty:
        return None
    return top_level_ancestor(step, int(copies["bytes"].idxmax()))


def _upcast_attention(q, k, v):
    """Attention whose scores are upcast to float64 before the softmax (a mixed-precision habit)."""
    scores = (q @ k.transpose(-2, -1)).to(torch.float64) * q.shape[-1] ** -0.5
    return (scores.softmax(-1).to(q.dtype)) @ v


def check_hidden_copy(find_hidden_copy: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``find_hidden_copy(step, min_bytes)`` names the top-level op that made the largest copy."""
    seed = _seed(seed)
    from . import get

    g = torch.Generator().manual_seed(seed)
    b, h, s, d = 1, 2, 96 + int(torch.randint(0, 32, (), generator=g)), 16
    q, k, v = torch.randn(3, b, h, s, d, generator=g).to(device).unbind(0)
    scores_bytes = b * h * s * s * 4  # one float32 S×S buffer
    subjects = [("naive attention", get("naive")), ("in-place attention", get("inplace")),
                ("attention with a float64 upcast", _upcast_attention)]
    for name, fn in subjects:
        step = _profile_step(fn, q, k, v, label="subject")
        want = hidden_copy_reference(step, scores_bytes)
        got = _run(find_hidden_copy, step, scores_bytes, what="find_hidden_copy(step, min_bytes)")
        if got == want:
            continue
        if want is None:
            _fail(f"on the trace of {name}, no copy moves {scores_bytes:,} bytes or more, so the answer "
                  f"is None; you said {got!r}. Filter copies by what they move "
                  f"(step.copies(min_bytes=...)), and return None when none is left.")
        if got is None:
            _fail(f"you returned None, but the trace of {name} has a copy of at least {scores_bytes:,} "
                  "bytes (one S×S float32 buffer).")
        if got in ("aten::copy_", "aten::clone", "aten::_to_copy"):
            _fail(f"{got} does the copying, but your code never called it: walk up the `parent` "
                  f"column to the op at depth 0 (here {want}), the line of your code that caused it.")
        small = step.copies(min_bytes=1)
        small = small[small["bytes"] < scores_bytes]
        if any(top_level_ancestor(step, int(i)) == got for i in small.index):
            _fail(f"on the trace of {name}, you named {got}, which only made a small copy (a few bytes: "
                  f"the Python scalar turned into a tensor). Count copies by the bytes they move, not "
                  f"by their name; the big one is under {want}.")
        _fail(f"on the trace of {name}, the largest copy was made under {want}; you said {got!r}.")
    return _passed(f"find_hidden_copy names the op behind the S×S copy in all {len(subjects)} traces "
                   "(and says None where there is none)")


# ============================================================================ chapter 2

def _fresh_scores(b, h, s, device, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, s, s, generator=g).to(device)


def check_inplace_mask(my_mask_: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``my_mask_(scores, future)`` must write -inf where ``future`` is True, into ``scores`` itself."""
    seed = _seed(seed)
    from .naive import future_mask

    s = 19
    original = _fresh_scores(2, 3, s, device, seed)
    scores = original.clone()
    future = future_mask(s, device)
    ptr = scores.data_ptr()
    out = _run(my_mask_, scores, future, what="my_mask_(scores, future)")
    want = original.masked_fill(future, -math.inf)
    changed = not torch.equal(scores, original)
    if out is None and changed:
        _fail("scores were filled in place, but my_mask_ returned None: return the tensor "
              "(masked_fill_ returns it, so `return scores.masked_fill_(...)` does both).")
    _is_tensor(out, "my_mask_", original.shape, original.dtype, original.device)
    if out.data_ptr() != ptr or not changed:
        if _close(out, want):
            _fail("not in place: the result is right, but it is a new tensor and `scores` was left as it "
                  "was. That is masked_fill (a clone, then a fill); masked_fill_ writes into scores.")
        _fail("not in place: `scores` was left unchanged and a different tensor came back.")
    mistakes = [
        ("the mask is off by one: it hides the diagonal too. A query may see itself.",
         original.masked_fill(torch.ones_like(future).triu(0), -math.inf), None),
        ("the mask points the wrong way: it hides the past (keys before the query) instead of the future.",
         original.masked_fill(future.T, -math.inf), None),
        ("the hidden scores are 0, not -inf: after the softmax, exp(0) = 1 gives the future weight.",
         original.masked_fill(future, 0.0), None),
        ("the mask was not applied: the scores came back unchanged.", original, None),
    ]
    if not _close(scores, want):
        known = _which(scores, mistakes)
        hidden = scores[..., future]
        if not known and torch.isfinite(hidden).all() and (hidden < -1e3).all():
            known = ("the hidden scores are a large negative number, not -inf. It happens to work here, "
                     "but a fixed number breaks when dtype or score range change (-1e9 is -inf in "
                     "float16 anyway). Use float('-inf').")
        _fail(known or "the scores are not masked as expected: -inf exactly where `future` is True, "
                       "untouched elsewhere.")
    return _passed("my_mask_ fills -inf into the scores tensor itself: same storage, no copy")


def check_lean_attention(lean_attention: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """Causal attention, right, that allocates at most one S×S buffer's worth of memory per call."""
    seed = _seed(seed)
    cases = _attention_cases(device, seed)
    for case, (q, k, v), causal, scale in cases:
        if not causal or scale is not None:
            continue
        out = _run(lean_attention, q, k, v, what="lean_attention(q, k, v)")
        _judge_attention(out, q, k, v, True, None, case, "lean_attention",
                         _attention_mistakes(q, k, v, True, None))
    b, h, s, d = 1, 4, 256, 32
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, b, h, s, d, generator=g).to(device).unbind(0)
    step = _profile_step(lean_attention, q, k, v, label="lean")
    buffer = b * h * s * s * 4
    total = step.allocated_bytes
    budget = 1.5 * buffer  # one S×S float buffer, plus slack for the mask and row statistics
    if total > budget:
        ops = step.ops
        big = ops[ops["self_alloc_bytes"] >= buffer // 2]
        culprits = sorted({top_level_ancestor(step, int(i)) for i in big.index})
        _fail(f"right values, but one call allocated {total / buffer:.1f} S×S buffers in total "
              f"({total / 2**20:.1f} MiB; one buffer is {buffer / 2**20:.1f} MiB at B={b}, H={h}, S={s}). "
              f"The top-level ops that allocated a large buffer: {', '.join(culprits)}. Each out-of-place "
              "op (x * s, masked_fill, softmax) makes a new one; make all but the first matmul in place "
              "(mul_, masked_fill_, and a softmax from sub_, exp_, div_).")
    return _passed(f"lean_attention is right and allocated {total / buffer:.2f} S×S buffers per call "
                   f"(naive attention allocates 4)")


# ============================================================================ chapter 3

def work_op_count(step) -> int:
    """The course's one definition of ops doing work (``Step.work_ops``), counted."""
    return len(step.work_ops())


def check_work_op_count(count_work_ops: Callable, guesses: dict, device="cpu", seed: Optional[int] = None) -> Passed:
    """Your guesses of each backend's work-op count, then ``count_work_ops(step)`` on its trace."""
    seed = _seed(seed)
    from . import get

    if _blank(guesses) or any(_blank(v) for v in guesses.values()):
        _fail("write your guesses first, e.g. {\"sdpa_math\": 10, \"sdpa_flash\": 3}: a number per "
              "backend, made before profiling. A wrong guess is fine; no guess is not.")
    from . import available

    g = torch.Generator().manual_seed(seed)
    # Fused GPU backends take 16-bit inputs only; on a CPU every backend here takes float32.
    dtype = torch.float16 if torch.device(device).type == "cuda" else torch.float32
    q, k, v = torch.randn(3, 1, 2, 40 + int(torch.randint(0, 20, (), generator=g)), 16,
                          generator=g).to(device, dtype).unbind(0)
    lines = []
    for name, guess in guesses.items():
        reason = available(device).get(name, f"no backend named {name!r}")
        if reason:
            lines.append(f"{name}: not checked here ({reason})")
            continue
        try:
            step = _profile_step(get(name), q, k, v, label=name)
        except RuntimeError as err:  # this GPU or dtype is refused by the backend: say so, go on
            lines.append(f"{name}: not checked here ({err})")
            continue
        got = _run(count_work_ops, step, what="count_work_ops(step)")
        want = work_op_count(step)
        if got != want:
            ops = step.ops
            if got == len(ops):
                _fail(f"{name}: you counted every op ({got}), views and allocations included "
                      f"(aten::transpose, aten::expand, aten::empty...: they move no data). Leave out "
                      f"rows where `is_view` is True.")
            if got == int((~ops["is_view"]).sum()):
                _fail(f"{name}: you counted {got} ops that are not views, parents and children both: "
                      f"aten::matmul and the aten::bmm inside it are one piece of work. Count an op if no "
                      f"non-view op sits under it (its row index is nobody's `parent`), or if it allocated "
                      f"its own result (`self_alloc_bytes` > 0), as aten::mul does around its small copy_.")
            if got == len(step.top_level()):
                _fail(f"{name}: you counted the top level only ({got}); SDPA is one call at the top, "
                      "the work happens underneath.")
            _fail(f"{name}: the trace has {want} ops doing work; count_work_ops said {got!r}.")
        off = f" (off by {want - guess:+d})" if isinstance(guess, int) and guess != want else ""
        lines.append(f"{name}: guessed {guess}, trace {want}{off}")
    return _passed("count_work_ops counts the work in each backend's trace. " + "; ".join(lines))


# Calls to predict: (GPU, capability, dtype, head_dim, runtime cuDNN, deprioritized, deterministic).
BACKEND_SCENARIOS = {
    "A100, bf16, D=64": ((8, 0), torch.bfloat16, 64, 92000, False, False),
    "H200, bf16, D=64": ((9, 0), torch.bfloat16, 64, 92000, False, False),
    "H200, bf16, D=64, TORCH_CUDNN_SDPA_DEPRIORITIZED=1": ((9, 0), torch.bfloat16, 64, 92000, True, False),
    "H200, bf16, D=64, deterministic algorithms on": ((9, 0), torch.bfloat16, 64, 92000, False, True),
    "H200, fp32, D=64": ((9, 0), torch.float32, 64, 92000, False, False),
    "T4, fp16, D=64": ((7, 5), torch.float16, 64, 92000, False, False),
    "T4, fp16, D=60": ((7, 5), torch.float16, 60, 92000, False, False),
}


def check_backend_predictions(predictions: dict) -> Passed:
    """Your prediction of the backend an unpinned causal SDPA call picks, per scenario, against
    PyTorch's rules (``kernels.sdpa.predicted_backend``); a wrong one is told the rule that decides."""
    from . import sdpa

    missing = [name for name in BACKEND_SCENARIOS if _blank(predictions.get(name))]
    if missing:
        _fail(f"predict a backend for every scenario first (one of {', '.join(sdpa.BACKENDS)}); missing: "
              f"{'; '.join(missing)}")
    for name, (cap, dtype, d, cudnn, deprioritized, deterministic) in BACKEND_SCENARIOS.items():
        want = sdpa.predicted_backend(cap, dtype, d, cudnn_version=cudnn, deprioritized=deprioritized,
                                      deterministic=deterministic)
        got = predictions[name]
        if got == want:
            continue
        order = sdpa.priority(cap, cudnn, deprioritized=deprioritized, deterministic=deterministic)
        refused = [f"{b} ({sdpa.gpu_input_reason(b, cap, dtype, d, deterministic=deterministic, cudnn_version=cudnn)})"
                   for b in order[:order.index(want)]]
        _fail(f"{name}: SDPA tries {' -> '.join(order)} here and takes {want}"
              + (f", after refusing {'; '.join(refused)}" if refused else ", the first it tries")
              + f"; you predicted {got!r}.")
    return _passed(f"all {len(BACKEND_SCENARIOS)} predictions match PyTorch's rules")


def check_sdpa_mask(sdpa_with_mask: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``sdpa_with_mask(q, k, v, future)``: SDPA with an explicit boolean mask equals causal attention."""
    seed = _seed(seed)
    from .naive import future_mask

    cases = [c for c in _attention_cases(device, seed) if c[2] and c[3] is None]
    for case, (q, k, v), _, _ in cases:
        s = q.shape[-2]
        future = future_mask(s, device)
        out = _run(sdpa_with_mask, q, k, v, future, what="sdpa_with_mask(q, k, v, future)")
        some_key = future.any(-1).cpu()  # rows where keeping only `future` leaves something
        mistakes = [
            ("the mask is inverted: SDPA's boolean attn_mask marks what to KEEP (True = may attend), "
             "the opposite of masked_fill's. Pass ~future.", _attention64(q, k, v, causal=False, keep_mask=future), some_key),
            ("you passed the mask as numbers: a float attn_mask is ADDED to the scores (0 keeps, -inf "
             "hides), so adding 1.0 to the future hides nothing. Pass a bool mask (~future).",
             _attention64(q, k, v, causal=False, add_mask=future.double()), None),
            ("the mask was not applied: the result is non-causal attention.", _attention64(q, k, v, causal=False), None),
        ]
        _judge_attention(out, q, k, v, True, None, case, "sdpa_with_mask", mistakes)
    return _passed("sdpa_with_mask reproduces causal attention from an explicit boolean mask")


def _masked_scores(b, h, s, device, seed: int):
    """Scores with a causal mask, plus a few rows that are masked entirely (padding queries)."""
    x = _fresh_scores(b, h, s, device, seed)
    x = x.masked_fill(torch.ones(s, s, dtype=torch.bool, device=device).triu(1), -math.inf)
    dead = torch.zeros(s, dtype=torch.bool, device=device)
    dead[[1, s // 2, s - 1]] = True
    return x.masked_fill(dead[:, None], -math.inf), dead


def check_safe_softmax(safe_softmax: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``safe_softmax(x)``: softmax over the last dim, but a row of all -inf gives zeros, not NaN."""
    seed = _seed(seed)
    x, dead = _masked_scores(2, 2, 11, device, seed)
    before = x.clone()
    out = _run(safe_softmax, x, what="safe_softmax(x)")
    _is_tensor(out, "safe_softmax", x.shape, x.dtype, x.device)
    if not torch.equal(x, before):
        _fail("safe_softmax changed its input: SDPA may reuse the scores, so leave x as it was.")
    live = ~dead.cpu()
    want = torch.softmax(x.double(), -1).nan_to_num(0.0)
    if not _close(out, want, rows=live):
        _fail("rows with at least one finite score must be an ordinary softmax over the last dimension; "
              "yours differ there.")
    dead_out = out.detach().cpu()[..., dead.cpu(), :]
    if torch.isnan(dead_out).any():
        _fail("rows whose every score is -inf came out NaN (softmax computes 0/0 there). SDPA's "
              "_safe_softmax returns 0 for them: find those rows (x == -inf).all(-1) and zero them.")
    if not _close(out, want, rows=dead.cpu()):
        row = dead_out.flatten(0, -2)[0]
        _fail(f"rows whose every score is -inf must be all zeros; one came out {row[:4].tolist()}... "
              f"(sum {float(row.sum()):.2f}). A query that may see nothing attends to nothing.")
    return _passed("safe_softmax is a softmax on live rows and gives 0, not NaN, on fully masked rows")


# ============================================================================ chapter 4

def _online_reference(m, l, acc, s, v, rescale_l=True, rescale_acc=True, inverted=False, tile_max=False):
    """One online-softmax step (base e), with switches that reproduce the usual slips."""
    m_tile = s.amax(-1)
    m_new = m_tile if tile_max else torch.maximum(m, m_tile)
    alpha = torch.exp(m_new - m) if inverted else torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    l_new = (l * alpha if rescale_l else l) + p.sum(-1)
    acc_new = (acc * alpha[:, None] if rescale_acc else acc) + p @ v
    return m_new, l_new, acc_new


def _stream(update, s, v, block):
    rows, d = s.shape[0], v.shape[1]
    m = torch.full((rows,), -math.inf, dtype=s.dtype)
    l = torch.zeros(rows, dtype=s.dtype)
    acc = torch.zeros(rows, d, dtype=s.dtype)
    for start in range(0, s.shape[1], block):
        out = update(m, l, acc, s[:, start:start + block], v[start:start + block])
        if not (isinstance(out, tuple) and len(out) == 3):
            _fail(f"online_update must return a tuple (m_new, l_new, acc_new); it returned {type(out).__name__}"
                  + ("" if not isinstance(out, tuple) else f" of length {len(out)}") + ".")
        m, l, acc = out
    return m, l, acc


def check_online_update(online_update: Callable, seed: Optional[int] = None) -> Passed:
    """``online_update(m, l, acc, s, v)`` -> (m, l, acc) after one tile of scores ``s`` and values ``v``."""
    seed = _seed(seed)
    g = torch.Generator().manual_seed(seed)
    rows, n, d, block = 5, 13, 8, 4
    # Later tiles get larger scores, so the running maximum must move and rescaling matters.
    s = torch.randn(rows, n, generator=g, dtype=torch.float64) + torch.arange(n, dtype=torch.float64) / block
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    first = _run(online_update, torch.full((rows,), -math.inf, dtype=s.dtype), torch.zeros(rows, dtype=s.dtype),
                 torch.zeros(rows, d, dtype=s.dtype), s[:, :block], v[:block], what="online_update(m, l, acc, s, v)")
    if first is None:
        _fail("online_update returned None: return (m_new, l_new, acc_new).")
    m, l, acc = _stream(lambda *a: _run(online_update, *a, what="online_update(m, l, acc, s, v)"), s, v, block)
    want = torch.softmax(s, -1) @ v
    for name, t in (("m_new", m), ("l_new", l), ("acc_new", acc)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} is a {type(t).__name__}, not a tensor.")
    if not torch.isfinite(acc).all() or not torch.isfinite(l).all():
        _fail("NaN or inf after the first tile: with m = -inf at the start, exp(m - m_new) is exp(-inf) = 0, "
              "fine, but exp(m_new - m) or (-inf) - (-inf) is not. Compute alpha = exp(m_old - m_new).")
    out = acc / l[:, None]
    if _close(out, want) and _close(m, s.amax(-1)):
        return _passed(f"online_update streams {math.ceil(n / block)} tiles (the last one ragged) to the "
                       "exact softmax(s)·v")
    slips = [
        ("l (the running sum) is not rescaled: when the maximum rises, the old sum was taken relative to "
         "the old maximum. Multiply it by alpha = exp(m_old - m_new) before adding the new tile.",
         dict(rescale_l=False)),
        ("acc (the running output) is not rescaled: multiply it by alpha = exp(m_old - m_new), like l.",
         dict(rescale_acc=False)),
        ("neither l nor acc is rescaled when the maximum rises: multiply both by exp(m_old - m_new).",
         dict(rescale_l=False, rescale_acc=False)),
        ("alpha is upside down: use exp(m_old - m_new), which is <= 1, not exp(m_new - m_old).",
         dict(inverted=True)),
        ("m_new is the tile's maximum only; it must be the running maximum, max(m_old, max of the tile).",
         dict(tile_max=True)),
    ]
    for message, knobs in slips:
        with torch.no_grad():
            cm, cl, cacc = _stream(lambda *a: _online_reference(*a, **knobs), s, v, block)
        if torch.isfinite(cacc).all() and _close(out, cacc / cl[:, None]):
            _fail(message)
    if not _close(m, s.amax(-1)):
        _fail("after the last tile, m must be each row's maximum score; yours is not.")
    _fail("the streamed result acc / l differs from softmax(s)·v. Check one step on paper: "
          "m_new = max(m, rowmax(s)); p = exp(s - m_new); l = l·alpha + rowsum(p); acc = acc·alpha + p·v.")


def _causal_softmax64(x, diagonal=1, hide="future"):
    x = x.detach().to("cpu", torch.float64)
    n = x.shape[-1]
    ones = torch.ones(n, n, dtype=torch.bool)
    hidden = ones.triu(diagonal) if hide == "future" else ones.tril(-diagonal)
    return x.masked_fill(hidden, -math.inf).softmax(-1)


def check_causal_softmax(causal_softmax: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``causal_softmax(x)`` on an [S, S] float32 matrix: softmax of each row over keys j <= i."""
    seed = _seed(seed)
    g = torch.Generator().manual_seed(seed)
    for s in (13, 32, 1):
        x = torch.randn(s, s, generator=g).to(device)
        out = _run(causal_softmax, x, what="causal_softmax(x)")
        _is_tensor(out, "causal_softmax", x.shape, x.dtype, x.device)
        if _close(out, _causal_softmax64(x)):
            continue
        case = f"S={s}"
        known = _which(out, [
            ("the causal mask is off by one: `cols < row` hides the diagonal, so row 0 has no key left and "
             "comes out NaN. A query sees itself: keep cols <= row.", _causal_softmax64(x, diagonal=0), None),
            ("the causal mask is off by one the other way: each row also sees the next column. Keep cols <= row.",
             _causal_softmax64(x, diagonal=2), None),
            ("the mask points the wrong way: rows see later columns instead of earlier ones.",
             _causal_softmax64(x, hide="past"), None),
            ("no causal mask: every row sees every column.", torch.softmax(x.double().cpu(), -1), None),
        ])
        if known:
            _fail(f"[{case}] {known}")
        bad = _not_finite(out, "causal_softmax")
        _fail(f"[{case}] " + (bad or "rows differ from the causal softmax (keys j <= i only).")
              + " Check the load mask (cols < S) and the `other=` value of masked-out columns (-inf).")
    return _passed("causal_softmax masks exactly the future (S = 13, 32 and 1, padded to a power of two)")


def occupancy_mistakes(threads: int, registers: int, shared: int) -> dict:
    """What the sm_80 occupancy arithmetic gives when one of its rules is forgotten."""
    from .occupancy import ARCHES, occupancy

    lim = ARCHES["sm_80"]
    warps = math.ceil(threads / 32)
    right = occupancy(threads, registers, shared, arch="sm_80")
    plain_regs = lim.registers_per_sm // (threads * registers) if registers else None
    smem = shared
    by = dict(right.blocks_by)

    def result(**change):
        b = {**by, **change}
        blocks = min(x for x in b.values() if x is not None)
        return blocks, blocks * warps / lim.max_warps_per_sm

    out = {
        "registers are handed out per warp, in units of 256 registers, from each scheduler's quarter of the "
        "register file (16,384 on sm_80): registers × 32 rounded up to 256, then "
        "16,384 // that = warps per scheduler, × 4 schedulers": result(registers=plain_regs),
        "the driver reserves 1 KB of shared memory for every block on Ampere and later: add 1,024 bytes to "
        "the kernel's shared memory before dividing": result(
            shared_memory=(lim.shared_mem_per_sm // smem) if smem else None),
        "shared memory limits blocks too: 167,936 bytes per SM // (shared memory per block + 1 KB)":
            result(shared_memory=None),
        "warp slots limit blocks too: 64 warps per SM // warps per block": result(warps=None),
        "an SM holds at most 32 blocks on sm_80": result(blocks=None),
    }
    return out


OCCUPANCY_CASES = ((128, 255, 0), (128, 100, 0), (256, 32, 41 * 1024), (1024, 16, 0), (128, 16, 49152),
                   (64, 24, 0), (32, 40, 2048))


def check_occupancy(my_occupancy: Callable) -> Passed:
    """``my_occupancy(threads_per_block, registers_per_thread, shared_bytes)`` -> (blocks per SM,
    occupancy as a fraction 0..1) on an A100 (sm_80), checked against ``kernels.occupancy``."""
    from .occupancy import occupancy

    slips: dict = {}
    for threads, registers, shared in OCCUPANCY_CASES:
        case = f"{threads} threads, {registers} registers/thread, {shared:,} B shared memory"
        got = _run(my_occupancy, threads, registers, shared, what="my_occupancy(threads, registers, shared)")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"my_occupancy must return (blocks_per_sm, fraction); it returned {got!r}.")
        blocks, fraction = got
        right = occupancy(threads, registers, shared, arch="sm_80")
        if blocks == right.blocks_per_sm and fraction is not None and abs(fraction - right.fraction) < 1e-9:
            continue
        if blocks == right.blocks_per_sm and fraction is not None and abs(fraction - right.percent) < 1e-6:
            _fail(f"[{case}] you returned a percentage ({fraction}); return a fraction between 0 and 1 "
                  f"({right.fraction}).")
        for rule, (b, f) in occupancy_mistakes(threads, registers, shared).items():
            if blocks == b and b != right.blocks_per_sm:
                slips.setdefault(rule, case)
        hint = next(iter(slips), None)
        _fail(f"[{case}] the answer is {right.blocks_per_sm} blocks per SM, "
              f"{right.percent:g}% occupancy; you said {blocks} blocks, fraction {fraction}. "
              + (f"Forgotten rule: {hint}." if hint else "Work it through with occupancy(...).explain()."))
    return _passed(f"my_occupancy agrees with the CUDA occupancy calculator's rules on {len(OCCUPANCY_CASES)} "
                   "footprints (each limit gets its turn)")


# ============================================================================ chapter 6

def check_tflops(my_tflops: Callable, seed: Optional[int] = None) -> Passed:
    """``my_tflops(batch, heads, seq, head_dim, causal, backward, ms)`` -> TFLOP/s achieved."""
    seed = _seed(seed)
    g = torch.Generator().manual_seed(seed)
    cases = []
    for causal in (True, False):
        for backward in (False, True):
            b, h = int(torch.randint(1, 5, (), generator=g)), int(torch.randint(1, 17, (), generator=g))
            s, d = int(torch.randint(100, 4097, (), generator=g)), (64, 128)[int(torch.randint(0, 2, (), generator=g))]
            ms = float(torch.rand((), generator=g)) * 5 + 0.1
            cases.append((b, h, s, d, causal, backward, ms))
    ratios = []
    for b, h, s, d, causal, backward, ms in cases:
        got = _run(my_tflops, b, h, s, d, causal, backward, ms, what="my_tflops(...)")
        if _blank(got) or not isinstance(got, (int, float)):
            _fail(f"my_tflops returned {got!r}; return a number (TFLOP/s).")
        want = reference.flops(b, h, s, d, causal=causal, backward=backward) / (ms * 1e-3) / 1e12
        ratios.append((got / want, causal, backward))
    if all(abs(r - 1) < 1e-6 for r, _, _ in ratios):
        return _passed(f"my_tflops matches 4·B·H·S²·D (halved when causal, ×3.5 with backward) on {len(cases)} cases")

    def ratio_where(causal=None, backward=None):
        rs = {round(r, 6) for r, c, bw in ratios if (causal is None or c == causal) and (backward is None or bw == backward)}
        return rs.pop() if len(rs) == 1 else None

    causal_r, dense_r = ratio_where(causal=True), ratio_where(causal=False)
    fwd_r, bwd_r = ratio_where(backward=False), ratio_where(backward=True)
    if dense_r == 1 and causal_r == 2:
        _fail("causal attention is counted at full price: a causal kernel skips the masked half of the "
              "scores, so its FLOPs are halved. Your TFLOP/s is 2x too high for causal runs (the mistake "
              "of triton PR #1849).")
    if fwd_r == 1 and bwd_r is not None and abs(bwd_r - 1 / 3.5) < 1e-6:
        _fail("with backward=True the time covers forward AND backward: FLOPs are 3.5x the forward's "
              "(backward is 2.5x). You counted the forward only.")
    if fwd_r == 1 and bwd_r is not None and abs(bwd_r - 2.5 / 3.5) < 1e-6:
        _fail("with backward=True, count forward + backward = 1 + 2.5 = 3.5x the forward FLOPs; you used 2.5x.")
    everywhere = ratio_where()
    if everywhere is not None:
        words = {0.5: "each multiply-add is 2 FLOPs: a matmul of [S, D] by [D, S] is 2·S²·D, and attention "
                      "has two of them (4·B·H·S²·D). You are 2x low.",
                 2.0: "you are 2x high everywhere: 4·B·H·S²·D already counts both matmuls and the multiply-add as 2.",
                 1e3: "units: TFLOP/s is FLOPs / seconds / 1e12; you are 1000x high (ms taken as s, or GFLOP/s).",
                 1e-3: "units: ms must become seconds (× 1e-3) before dividing; you are 1000x low.",
                 1e6: "units: you are 1e6x high; divide FLOP/s by 1e12 for TFLOP/s, and ms by 1e3 for seconds.",
                 1e-6: "units: you are 1e6x low; TFLOP/s = FLOPs / (ms · 1e-3) / 1e12."}
        for factor, message in words.items():
            if abs(everywhere / factor - 1) < 1e-6:
                _fail(message)
    detail = ", ".join(f"{'causal' if c else 'dense'}{' fwd+bwd' if bw else ' fwd'}: {r:.3g}x" for r, c, bw in ratios)
    _fail(f"my_tflops is off by these factors (yours / right): {detail}. FLOPs = 4·B·H·S²·D, halved when "
          "causal, ×3.5 with backward; TFLOP/s = FLOPs / (ms · 1e-3) / 1e12.")


def check_intensity(my_intensity: Callable) -> Passed:
    """``my_intensity(batch, heads, seq, head_dim, causal, bytes_per_element)`` -> FLOP per byte of a
    fused forward that reads q, k, v and writes o once."""
    cases = [(1, 8, 1024, 64, True, 2), (2, 16, 4096, 128, False, 2), (1, 4, 333, 64, True, 4),
             (1, 2, 100, 32, False, 4)]
    ratios = []
    for b, h, s, d, causal, elem in cases:
        got = _run(my_intensity, b, h, s, d, causal, elem, what="my_intensity(...)")
        if _blank(got) or not isinstance(got, (int, float)):
            _fail(f"my_intensity returned {got!r}; return a number (FLOP per byte).")
        dtype = {2: torch.bfloat16, 4: torch.float32}[elem]
        want = reference.flops(b, h, s, d, causal=causal) / reference.io_bytes(b, h, s, d, dtype=dtype)
        ratios.append(got / want)
    if all(abs(r - 1) < 1e-6 for r in ratios):
        return _passed(f"my_intensity: FLOPs over the bytes of q, k, v and o, on {len(cases)} cases")

    def all_near(factors):
        return all(abs(r / f - 1) < 1e-6 for r, f in zip(ratios, factors))

    causal = [c[4] for c in cases]
    if all_near([c[5] for c in cases]):
        _fail("you divided by elements, not bytes: multiply the element count by bytes_per_element.")
    if all_near([4 / 3] * len(cases)):
        _fail("a fused kernel moves four tensors: it reads q, k, v AND writes o (4·B·H·S·D elements); "
              "you counted three.")
    if all_near([2.0 if c else 1.0 for c in causal]):
        _fail("causal FLOPs are halved (the kernel skips the masked half); you counted them at full price.")
    if all_near([0.5] * len(cases)):
        _fail("FLOPs are 4·B·H·S²·D (two matmuls, 2 FLOPs per multiply-add); you are 2x low.")
    detail = ", ".join(f"B={b} H={h} S={s} D={d} causal={c} {e} B/elem: {r:.3g}x"
                       for (b, h, s, d, c, e), r in zip(cases, ratios))
    _fail(f"my_intensity is off by these factors (yours / right): {detail}. Intensity = "
          "FLOPs / (4·B·H·S·D·bytes_per_element), FLOPs = 4·B·H·S²·D, halved when causal.")


# ============================================================================ chapter 5

def _ptxas_block(kernel: str, arch: str, registers: int, smem: int, stack: int, stores: int, loads: int,
                 barriers: int) -> list[str]:
    """One kernel's lines as ptxas -v prints them (sm_90's ptxas leaves out cmem)."""
    used = f"ptxas info    : Used {registers} registers, used {barriers} barriers"
    if stack:
        used += f", {stack} bytes cumulative stack size"
    if smem:
        used += f", {smem} bytes smem"
    if arch != "sm_90":
        used += ", 368 bytes cmem[0]"
    return [f"ptxas info    : Compiling entry function '{kernel}' for '{arch}'",
            f"ptxas info    : Function properties for {kernel}",
            f"    {stack} bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads", used]


def fresh_ptxas_report(seed: int) -> str:
    """A report in ptxas -v's format with random numbers: two kernels on sm_80 and sm_90, one that
    spills and one with static shared memory, and a device function that is not a kernel."""
    g = torch.Generator().manual_seed(seed)

    def pick(low, high):
        return int(torch.randint(low, high, (), generator=g))

    lines = []
    for more, arch in enumerate(("sm_80", "sm_90")):  # registers differ by arch, so a wrong arch shows
        lines.append("ptxas info    : 0 bytes gmem")
        spill_st, spill_ld = 8 * pick(20, 120), 8 * pick(20, 120)
        frame = spill_st + 8 * pick(1, 40)
        lines += _ptxas_block("_Z4manyILi64EEvPKfPfi", arch, 8 * pick(3 + 3 * more, 6 + 3 * more), 0, frame,
                              spill_st, spill_ld, 0)
        lines += _ptxas_block("_Z8tile_sumPKfPf", arch, pick(10 + 25 * more, 35 + 25 * more), 256 * pick(1, 64),
                              8 * pick(1, 8), 0, 0, 1)
        lines += ["ptxas info    : Function properties for _Z6helperPKfi",
                  f"    {8 * pick(1, 8)} bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"]
    return "\n".join(lines) + "\n"


def _ptxas_numbers(text: str) -> dict:
    """{(kernel, arch): (registers, static shared bytes, spilled bytes), plus the raw fields}."""
    from .ptxas import parse_ptxas

    return {(k.mangled, k.arch): k for k in parse_ptxas(text, demangle=False)}


def check_read_ptxas(read_ptxas: Callable, seed: Optional[int] = None) -> Passed:
    """``read_ptxas(text, kernel, arch)`` -> (registers, static shared memory bytes, spilled bytes)
    of one kernel on one architecture, judged by ``kernels.ptxas.parse_ptxas``."""
    seed = _seed(seed)
    asked = 0
    for text in (fresh_ptxas_report(seed), fresh_ptxas_report(seed + 1)):
        found = _ptxas_numbers(text)
        for (kernel, arch), k in found.items():
            case = f"kernel {kernel} on {arch}"
            got = _run(read_ptxas, text, kernel, arch, what="read_ptxas(text, kernel, arch)")
            asked += 1
            if got is None:
                _fail("read_ptxas returned None: return (registers, shared_bytes, spilled_bytes).")
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                _fail(f"read_ptxas must return three numbers (registers, shared_bytes, spilled_bytes); "
                      f"it returned {got!r}.")
            right = (k.registers, k.shared_bytes, k.spill_store_bytes + k.spill_load_bytes)
            if tuple(got) == right:
                continue
            _fail(f"[{case}] " + _ptxas_slip(tuple(got), right, k, found, kernel, arch))
    return _passed(f"read_ptxas reads registers, shared memory and spills right for {asked} kernel reports "
                   "(two architectures, a kernel that spills, a device function that is not a kernel)")


def _ptxas_slip(got, right, k, found, kernel, arch) -> str:
    """The sentence for a wrong (registers, shared, spilled)."""
    def numbers(other):
        return (other.registers, other.shared_bytes, other.spill_store_bytes + other.spill_load_bytes)

    for (name, other_arch), other in found.items():
        if name == kernel and other_arch != arch and got == numbers(other) != right:
            return (f"those are the numbers of the same kernel compiled for {other_arch}. ptxas reports every "
                    f"kernel once per architecture: read the lines after \"Compiling entry function "
                    f"'{kernel}' for '{arch}'\".")
        if name != kernel and other_arch == arch and got == numbers(other) != right:
            return (f"those are the numbers of another kernel, {name}: find the block that starts with "
                    f"\"Compiling entry function '{kernel}'\".")
    registers, shared, spilled = got
    if registers != right[0]:
        return f"registers: the \"Used N registers\" line says {right[0]}, you said {registers}."
    if shared != right[1]:
        if shared is None or shared == Ellipsis:
            return ("no \"bytes smem\" on the Used line means the kernel has no static shared memory: "
                    "return 0, not None.")
        if shared == k.stack_frame_bytes and k.stack_frame_bytes:
            return ("you read the stack size as shared memory: \"bytes cumulative stack size\" is local memory "
                    "per thread; shared memory is the number before \"bytes smem\".")
        return f"static shared memory is {right[1]} bytes (\"bytes smem\" on the Used line), you said {shared}."
    if spilled == k.spill_store_bytes or spilled == k.spill_load_bytes:
        return ("spilled bytes are both directions: spill stores plus spill loads "
                f"({k.spill_store_bytes} + {k.spill_load_bytes} = {right[2]}).")
    if spilled == k.stack_frame_bytes:
        return ("the stack frame is not the spill: it also holds local arrays. Spilled bytes are "
                "\"bytes spill stores\" plus \"bytes spill loads\".")
    return (f"spilled bytes: the \"Function properties for {kernel}\" line that follows the entry says "
            f"{k.spill_store_bytes} + {k.spill_load_bytes} = {right[2]}, you said {spilled}. (Skip the "
            "properties of device functions that are not kernels.)")


def occupancy_slips(threads: int, registers: int, shared: int, arch: str) -> dict:
    """What the occupancy arithmetic of ``arch`` gives when one of its rules is forgotten, or when
    the other architecture's limits are used."""
    from .occupancy import ARCHES, occupancy

    lim = ARCHES[arch]
    warps = math.ceil(threads / 32)
    right = occupancy(threads, registers, shared, arch=arch)

    def result(**change):
        b = {**right.blocks_by, **change}
        blocks = min(x for x in b.values() if x is not None)
        return blocks, blocks * warps / lim.max_warps_per_sm

    other = "sm_90" if arch == "sm_80" else "sm_80"
    theirs = occupancy(threads, registers, shared, arch=other)
    return {
        f"you used {other}'s limits for {arch}: {arch} has {lim.shared_mem_per_sm:,} bytes of shared memory "
        f"per SM ({ARCHES[other].shared_mem_per_sm:,} on {other}); take the numbers from ARCHES[arch]":
            (theirs.blocks_per_sm, theirs.fraction),
        "registers are handed out per warp, in units of 256 registers, from one scheduler's quarter of the "
        "register file (16,384): registers × 32 rounded up to 256, then 16,384 // that = warps per "
        "scheduler, × 4 schedulers":
            result(registers=lim.registers_per_sm // (threads * registers) if registers else None),
        f"the driver reserves 1 KB of shared memory for every block on {arch}: add 1,024 bytes to the "
        "kernel's shared memory before dividing":
            result(shared_memory=lim.shared_mem_per_sm // shared if shared else None),
        f"shared memory limits blocks too: {lim.shared_mem_per_sm:,} bytes per SM // (shared memory per "
        "block + 1 KB, rounded up to 128)": result(shared_memory=None),
    }


ARCH_OCCUPANCY_CASES = ((128, 190, 27648, "sm_80"), (128, 200, 27648, "sm_90"), (128, 64, 50 * 1024, "sm_80"),
                        (128, 64, 50 * 1024, "sm_90"), (256, 40, 70 * 1024, "sm_90"), (128, 100, 0, "sm_90"),
                        (128, 32, 16 * 1024, "sm_80"), (128, 32, 16 * 1024 - 1024, "sm_90"))


def check_arch_occupancy(my_occupancy: Callable) -> Passed:
    """``my_occupancy(threads, registers, shared_bytes, arch)`` -> (blocks per SM, fraction 0..1) on
    sm_80 and sm_90, checked against ``kernels.occupancy``."""
    from .occupancy import occupancy

    for threads, registers, shared, arch in ARCH_OCCUPANCY_CASES:
        case = f"{arch}: {threads} threads, {registers} registers/thread, {shared:,} B shared memory"
        got = _run(my_occupancy, threads, registers, shared, arch,
                   what="my_occupancy(threads, registers, shared_bytes, arch)")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"my_occupancy must return (blocks_per_sm, fraction); it returned {got!r}.")
        blocks, fraction = got
        right = occupancy(threads, registers, shared, arch=arch)
        if blocks == right.blocks_per_sm and fraction is not None and abs(fraction - right.fraction) < 1e-9:
            continue
        if blocks == right.blocks_per_sm and fraction is not None and abs(fraction - right.percent) < 1e-6:
            _fail(f"[{case}] you returned a percentage ({fraction}); return a fraction between 0 and 1 "
                  f"({right.fraction}).")
        slip = next((rule for rule, (b, _) in occupancy_slips(threads, registers, shared, arch).items()
                     if blocks == b != right.blocks_per_sm), None)
        _fail(f"[{case}] the answer is {right.blocks_per_sm} blocks per SM, {right.percent:g}% occupancy; "
              f"you said {blocks} blocks, fraction {fraction}. "
              + (f"Likely slip: {slip}." if slip else "Work it through with occupancy(...).explain()."))
    return _passed(f"my_occupancy agrees with kernels.occupancy on {len(ARCH_OCCUPANCY_CASES)} footprints, "
                   "on sm_80 and sm_90")


def check_v2_lane(lane_elements: Callable) -> Passed:
    """``lane_elements(tid)`` -> (rows, cols): the two query rows of v2's 64-row block whose
    accumulators thread ``tid`` holds, and its two columns in every 8-column tile, judged by
    ``kernels.cuda_report.owners_v2``."""
    import numpy as np

    from .cuda_report import owners_v2

    owner = owners_v2(8)  # one 8-column tile: every tile repeats its layout
    for tid in range(128):
        got = _run(lane_elements, tid, what=f"lane_elements({tid})")
        if got is None:
            _fail("lane_elements returned None: return (rows, cols), two query rows and two columns.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"lane_elements must return (rows, cols); lane_elements({tid}) returned {got!r}.")
        rows_right, cols_right = (sorted({int(x) for x in a}) for a in np.nonzero(owner == tid))
        try:
            rows, cols = sorted(int(r) for r in got[0]), sorted(int(c) for c in got[1])
        except (TypeError, ValueError):
            _fail(f"lane_elements({tid}) returned {got!r}: rows and cols must each be two integers.")
        if rows == rows_right and cols == cols_right:
            continue
        warp, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        where = f"thread {tid} (warp {warp}, lane {lane} = 4·{g} + {t})"
        if cols != cols_right:
            if cols == [2 * g, 2 * g + 1] and rows == [16 * warp + t, 16 * warp + t + 8]:
                _fail(f"{where}: g and t are swapped. lane = 4g + t, so g = lane // 4 picks the row pair "
                      "and t = lane % 4 the column pair.")
            if cols == [t, t + 1]:
                _fail(f"{where}: a lane holds two neighbouring columns, 2t and 2t+1 ({cols_right}), "
                      f"not t and t+1 ({cols}).")
            _fail(f"{where}: its columns in each 8-column tile are {cols_right}, you said {cols}.")
        if rows == [g, g + 8] and warp:
            _fail(f"{where}: those are warp 0's rows. Warp w owns rows 16w to 16w+15: add 16 × warp.")
        if rows == [tid // 4, tid // 4 + 8]:
            _fail(f"{where}: g is the lane's group, lane // 4 with lane = tid % 32, not tid // 4; and "
                  "the warp adds 16 × warp.")
        if rows == [16 * warp + g, 16 * warp + g + 1]:
            _fail(f"{where}: the second row is g + 8, not g + 1: a warp's 16 rows are two halves of 8, and "
                  "a lane holds the same row of each half.")
        _fail(f"{where}: its rows are {rows_right}, you said {rows}.")
    return _passed("lane_elements places all 128 threads of v2's block: warp w holds rows 16w..16w+15, "
                   "lane 4g + t rows g and g+8 of them, columns 2t and 2t+1 of every tile")


__all__ += ["check_read_ptxas", "check_arch_occupancy", "check_v2_lane", "fresh_ptxas_report", "occupancy_slips"]
