"""Checks for the exercises of chapter 3, SDPA: count its work, mask it, guard its softmax, and
predict the backend it picks.

``check_work_op_count`` compares your guesses and your counter with each backend's trace;
``check_backend_predictions`` checks your predictions against PyTorch's rules
(``kernels.attention.sdpa``); ``check_sdpa_mask`` runs SDPA with your explicit mask;
``check_safe_softmax`` feeds your softmax rows that see no key.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from kernels.attention import sdpa
from kernels.attention.naive import grouped_future_mask
from kernels.registry import available, get
from kernels.exercises.judge import Passed, fail, is_blank, matches, passed, check_seed, profile_step, require_tensor, run_learner
from kernels.exercises.judge import attention64, attention_cases, judge_attention

__all__ = ["check_work_op_count", "check_sdpa_mask", "check_safe_softmax", "check_backend_predictions",
           "BACKEND_SCENARIOS"]


def check_work_op_count(count_work_ops: Callable, guesses: dict, device="cpu", seed: Optional[int] = None) -> Passed:
    """Your guesses of each backend's work-op count, then ``count_work_ops(step)`` on its trace."""
    g = torch.Generator().manual_seed(check_seed(seed))
    if is_blank(guesses) or any(is_blank(v) for v in guesses.values()):
        fail("write your guesses first, e.g. {\"sdpa_math\": 10, \"sdpa_flash\": 3}: a number per "
              "backend, made before profiling. A wrong guess is fine; no guess is not.")
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
            step = profile_step(get(name), q, k, v, label=name)
        except RuntimeError as err:  # this GPU or dtype is refused by the backend: say so, go on
            lines.append(f"{name}: not checked here ({err})")
            continue
        got = run_learner(count_work_ops, step, what="count_work_ops(step)")
        want = len(step.work_ops())  # the course's one definition of ops doing work
        if got != want:
            ops = step.ops
            if got == len(ops):
                fail(f"{name}: you counted every op ({got}), views and allocations included "
                      f"(aten::transpose, aten::expand, aten::empty...: they move no data). Leave out "
                      f"rows where `is_view` is True.")
            if got == int((~ops["is_view"]).sum()):
                fail(f"{name}: you counted {got} ops that are not views, parents and children both: "
                      f"aten::matmul and the aten::bmm inside it are one piece of work. Count an op if no "
                      f"non-view op sits under it (its row index is nobody's `parent`), or if it allocated "
                      f"its own result (`self_alloc_bytes` > 0), as aten::mul does around its small copy_.")
            if got == len(step.top_level()):
                fail(f"{name}: you counted the top level only ({got}); SDPA is one call at the top, "
                      "the work happens underneath.")
            if not isinstance(got, int) or isinstance(got, bool):
                fail(f"{name}: count_work_ops returned {got!r}; return an int.")
            fail(f"{name}: count_work_ops said {got}, {'more' if got > want else 'fewer'} than the ops doing work in "
                 "the trace. Print the rows you count beside `step.work_ops()`'s and compare.")
        off = f" (off by {want - guess:+d})" if isinstance(guess, int) and guess != want else ""
        lines.append(f"{name}: guessed {guess}, trace {want}{off}")
    return passed("count_work_ops counts the work in each backend's trace. " + "; ".join(lines))


# The calls to predict (the questions; PyTorch's rules give the answers):
# name -> (capability, dtype, head_dim, runtime cuDNN, deprioritized, deterministic).
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
    PyTorch's rules (``kernels.attention.sdpa.predicted_backend``); a wrong one is told the rule that decides."""
    missing = [name for name in BACKEND_SCENARIOS if is_blank(predictions.get(name))]
    if missing:
        fail(f"predict a backend for every scenario first (one of {', '.join(sdpa.BACKENDS)}); missing: "
              f"{'; '.join(missing)}")
    for name, (cap, dtype, d, cudnn, deprioritized, deterministic) in BACKEND_SCENARIOS.items():
        want = sdpa.predicted_backend(cap, dtype, d, cudnn_version=cudnn, deprioritized=deprioritized,
                                      deterministic=deterministic)
        got = predictions[name]
        if got == want:
            continue
        fail(f"{name}: you predicted {got!r}. " + _why_not(got, cap, dtype, d, cudnn, deterministic))
    return passed(f"all {len(BACKEND_SCENARIOS)} predictions match PyTorch's rules")


def _why_not(got, cap, dtype, d, cudnn, deterministic) -> str:
    """Why a wrong prediction is wrong, without naming the backend that does run: the backend's
    own refusal, or, when it accepts the call, that the priority order reaches another first."""
    if got not in sdpa.BACKENDS:
        return f"Name one of {', '.join(sdpa.BACKENDS)}."
    reason = None if got == "sdpa_math" else sdpa.gpu_input_reason(got, cap, dtype, d, deterministic=deterministic,
                                                                   cudnn_version=cudnn)
    if reason:
        return f"It refuses this call: {got} {reason}."
    return (f"{got} accepts this call, but SDPA tries another backend before it that accepts it too: "
            "walk the priority order for this GPU and these settings again.")


def check_sdpa_mask(sdpa_with_mask: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``sdpa_with_mask(q, k, v, future)``: SDPA with an explicit boolean mask equals causal attention."""
    cases = [c for c in attention_cases(device, check_seed(seed)) if c[2] and c[3] is None]
    for case, (q, k, v), _, _ in cases:
        s = q.shape[-2]
        future = grouped_future_mask(s, device)
        out = run_learner(sdpa_with_mask, q, k, v, future, what="sdpa_with_mask(q, k, v, future)")
        some_key = future.any(-1).cpu()  # rows where keeping only `future` leaves something
        mistakes = [
            ("the mask is inverted: SDPA's boolean attn_mask marks what to KEEP (True = may attend), "
             "the opposite of masked_fill's, so yours hid exactly the keys each query may see.",
             attention64(q, k, v, causal=False, keep_mask=future), some_key),
            ("you passed the mask as numbers: a float attn_mask is ADDED to the scores (0 keeps, -inf "
             "hides), so adding 1.0 to the future hides nothing. Pass a boolean mask.",
             attention64(q, k, v, causal=False, add_mask=future.double()), None),
            ("the mask was not applied: the result is non-causal attention.", attention64(q, k, v, causal=False), None),
        ]
        judge_attention(out, q, k, v, True, None, case, "sdpa_with_mask", mistakes)
    return passed("sdpa_with_mask reproduces causal attention from an explicit boolean mask")


def _masked_scores(b, h, s, device, seed: int):
    """[B, H, S, S] scores with a causal mask, plus a few rows that are masked entirely (padding
    queries), and the [S] bool of those dead rows."""
    x = torch.randn(b, h, s, s, generator=torch.Generator().manual_seed(seed)).to(device)
    x = x.masked_fill(torch.ones(s, s, dtype=torch.bool, device=device).triu(1), -math.inf)
    dead = torch.zeros(s, dtype=torch.bool, device=device)
    dead[[1, s // 2, s - 1]] = True
    return x.masked_fill(dead[:, None], -math.inf), dead


def check_safe_softmax(safe_softmax: Callable, device="cpu", seed: Optional[int] = None) -> Passed:
    """``safe_softmax(x)``: softmax over the last dim, but a row of all -inf gives zeros, not NaN."""
    x, dead = _masked_scores(2, 2, 11, device, check_seed(seed))
    before = x.clone()
    out = run_learner(safe_softmax, x, what="safe_softmax(x)")
    require_tensor(out, "safe_softmax", x.shape, x.dtype, x.device)
    if not torch.equal(x, before):
        fail("safe_softmax changed its input: SDPA may reuse the scores, so leave x as it was.")
    live = ~dead.cpu()
    want = torch.softmax(x.double(), -1).nan_to_num(0.0)
    if not matches(out, want, rows=live):
        fail("rows with at least one finite score must be an ordinary softmax over the last dimension; "
              "yours differ there.")
    dead_out = out.detach().cpu()[..., dead.cpu(), :]
    if torch.isnan(dead_out).any():
        fail("rows whose every score is -inf came out NaN (softmax computes 0/0 there). SDPA's "
              "_safe_softmax returns 0 for them: find those rows and zero them.")
    if not matches(out, want, rows=dead.cpu()):
        row = dead_out.flatten(0, -2)[0]
        fail(f"rows whose every score is -inf must be all zeros; one came out {row[:4].tolist()}... "
              f"(sum {float(row.sum()):.2f}). A query that may see nothing attends to nothing.")
    return passed("safe_softmax is a softmax on live rows and gives 0, not NaN, on fully masked rows")
