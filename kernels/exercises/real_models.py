"""Checks for the exercises of chapter 12, attention in a real model's trace: find the attention
calls in borrowed traces that the chapter does not show, and read what they cost.

The answers are read from the traces (``kernels.borrowed``) with ``kernels.trace.attention``
here, never typed: each check reads the trace it names, compares, and when the answer is wrong
says which common mistake it matches (ops counted instead of calls, a percentage for a
fraction, the CPU's time for the GPU's, another GPU's kernel...). Nothing is random, so no
seed is named.
"""
from __future__ import annotations

from functools import lru_cache

from kernels.borrowed import TRACELENS
from kernels.exercises.judge import Passed, as_number, fail, is_blank, passed
from kernels.trace.attention import AttentionCall, AttentionReport, find_attention, short_kernel_name
from kernels.trace.fingerprints import ATTENTION_OPS, attention_kernel

__all__ = ["check_calls_and_kernel", "check_attention_share", "check_longest_kernel",
           "CALLS_TRACE", "HAND_WRITTEN_TRACE", "SHARE_TOLERANCE"]

CALLS_TRACE = "mi300x_bert"               # BERT-small on the MI300X: the chapter shows it on the H100 only
HAND_WRITTEN_TRACE = "mi300x_timesformer"  # the chapter lists the kernels of its H100 twin only
SHARE_TOLERANCE = 0.005                   # half a percentage point: the command prints one decimal of %
SHORT_NAMES = {CALLS_TRACE: "MI300X BERT", HAND_WRITTEN_TRACE: "MI300X TimeSformer"}   # as the page's traces box names them


def short_name(key: str) -> str:
    """How the exercise page names the trace ``key`` (its key where the page does not show it)."""
    return SHORT_NAMES.get(key, key)


@lru_cache(maxsize=None)
def report_of(key: str) -> AttentionReport:
    """``find_attention`` on the profiler step of ``TRACELENS[key]`` (read once per process)."""
    if key not in TRACELENS:
        raise KeyError(f"no borrowed trace {key!r}; they are {', '.join(TRACELENS)}")
    return find_attention(TRACELENS[key].step())


def _name_of(answer, what: str) -> str:
    if is_blank(answer):
        fail(f"write your answer first: {what} is still empty.")
    if not isinstance(answer, str):
        fail(f"{what} is a kernel's name, a str such as \"some_kernel\"; you gave a {type(answer).__name__}.")
    return short_kernel_name(answer.strip()).lower()


def bare(name: str) -> str:
    """A kernel's name without ``void``, templates, parameters and namespaces, in lower case: what
    two spellings of one kernel (``at::native::cunn_SoftMaxForward<...>(...)``, ``cunn_SoftMaxForward``)
    have in common."""
    return short_kernel_name(name).split("::")[-1].lower()


def _shown(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[:limit] + "…"


def _kernel_words(given: str, report: AttentionReport, key: str) -> str:
    """Why a kernel name is not the one asked for, in words."""
    answer = short_kernel_name(given.strip())
    step_kernels = {bare(n) for n in report.step.gpu_work["name"]}
    if answer in ATTENTION_OPS or answer.startswith("aten::"):
        return (f"{answer} is an op on the CPU track. The kernel is the GPU row that op launched: the "
                "`main kernel` column of find_attention(step).table(), or the kernel under the op in the trace")
    if attention_kernel(answer) is not None or "flash" in answer.lower():
        return (f"{answer} is an attention kernel, but not one that ran in this trace: it was recorded on an "
                f"{report.device}, whose attention kernel has a name of its own. Read the trace, not the chapter's")
    if bare(answer) in step_kernels:
        return f"{_shown(answer)} ran in this step, but it is not the one asked for"
    return f"no kernel called {_shown(answer)} ran in the {short_name(key)} step"


# ============================================================================ task 1

def check_calls_and_kernel(calls, kernel, key: str = CALLS_TRACE) -> Passed:
    """``calls``: how many attention calls one step of ``TRACELENS[key]`` makes; ``kernel``: the
    name of the attention kernel they run (its short name is enough)."""
    if is_blank(calls) or is_blank(kernel):
        fail("write your answers first: `calls` (a number) and `kernel` (a name) are still empty.")
    if isinstance(calls, bool) or not isinstance(calls, int):
        fail(f"calls is a count, an int; you gave {calls!r}.")
    report = report_of(key)
    want = len(report.calls)
    if calls != want:
        ops = sum(name in ATTENTION_OPS for name in report.step.ops["name"])
        kernels = sum(len(c.kernels) for c in report.calls)
        if calls == ops:
            fail(f"{calls} is how many attention ops the step has: each call shows as "
                 "aten::scaled_dot_product_attention with its backend's ops nested inside it. Count the "
                 "outermost ones only (find_attention does).")
        if calls == kernels:
            fail(f"{calls} is how many kernels the attention calls launched, not how many calls there are.")
        if calls == len(report.step.gpu_work):
            fail(f"{calls} is every piece of GPU work in the step, not its attention calls.")
        fail(f"the {short_name(key)} step does not have {calls} attention calls. find_attention(step).calls lists them; "
             "in the trace, count the aten::scaled_dot_product_attention ops that no other attention op contains.")
    answer = _name_of(kernel, "kernel")
    mains = {bare(m["name"]) for m in (c.main_kernel() for c in report.calls) if m is not None}
    if bare(answer) not in mains:
        fail(f"{_kernel_words(kernel, report, key)}.")
    return passed(f"{want} attention calls in the {short_name(key)} step, each running {kernel.strip()}, on the {report.device}")


# ============================================================================ task 2

def check_attention_share(share, key: str = CALLS_TRACE) -> Passed:
    """``share``: attention's share of the step's GPU time, a fraction from 0 to 1, within
    ``SHARE_TOLERANCE``."""
    if is_blank(share):
        fail("write your answer first: `share` is still empty.")
    got = as_number(share, "share")
    report = report_of(key)
    want = report.attention_share
    if want is None:
        raise ValueError(f"the {short_name(key)} step has no GPU time: no share to check")
    if abs(got - want) <= SHARE_TOLERANCE:
        return passed(f"attention is {100 * want:.1f}% of the {short_name(key)} step's GPU time; you said {100 * got:.1f}%")
    step = report.step
    work = step.gpu_work
    span = float((work["start_us"] + work["dur_us"]).max() - work["start_us"].min())
    one_call = report.calls[0].gpu_us / step.gpu_time_us if report.calls else None
    mistakes = [
        (want * 100, "that is a percentage: give a fraction from 0 to 1"),
        (1 - want, "that is the share of everything but attention"),
        (one_call, "that is one call's share; the step has several: add them all up"),
        (report.attention_gpu_us / step.cpu_time_us if step.cpu_time_us else None,
         "you divided by the step's CPU time; the share is of the GPU's time (every kernel, memcpy and memset, "
         "summed: Step.gpu_time_us)"),
        (report.attention_gpu_us / span if span else None,
         "you divided by the span from the first kernel's start to the last one's end, idle gaps included; "
         "divide by the GPU's busy time, summed over its work (Step.gpu_time_us)"),
    ]
    close = [(abs(got - value), words) for value, words in mistakes
             if value is not None and abs(got - value) <= SHARE_TOLERANCE and abs(value - want) > SHARE_TOLERANCE]
    if close:
        fail(f"{got:g}: {min(close)[1]}.")
    fail(f"{got:g} is not attention's share of the {short_name(key)} step's GPU time: add up the GPU time of its attention "
         "calls' kernels and divide by the step's GPU time (the command prints it, as a percentage).")


# ============================================================================ task 3

def _longest_call(report: AttentionReport) -> AttentionCall:
    if not report.calls:
        raise ValueError("the step has no attention call")
    return max(report.calls, key=lambda c: c.gpu_us)


def _longest_kernel(call: AttentionCall) -> str:
    kernels = call.kernels
    return short_kernel_name(kernels.loc[kernels["dur_us"].idxmax(), "name"])


def check_longest_kernel(kernel, key: str = HAND_WRITTEN_TRACE) -> Passed:
    """``kernel``: the name of the kernel that takes longest inside the longest attention call of
    ``TRACELENS[key]``'s step."""
    answer = _name_of(kernel, "kernel")
    report = report_of(key)
    call = _longest_call(report)
    want = _longest_kernel(call)
    if bare(answer) == bare(want):
        return passed(f"{want} is the longest kernel of the longest attention call ({call.gpu_us / 1e3:.1f} ms) "
                      f"in the {short_name(key)} step, on the {report.device}")
    inside = {bare(n): (short_kernel_name(n), d, op)
              for n, d, op in zip(call.kernels["name"], call.kernels["dur_us"], call.kernels["op"])}
    twin = key.replace("mi300x_", "h100_") if key.startswith("mi300x_") else key.replace("h100_", "mi300x_")
    if twin in TRACELENS and twin != key and bare(answer) == bare(_longest_kernel(_longest_call(report_of(twin)))):
        fail(f"{kernel.strip()} is the longest kernel on the {report_of(twin).device} (the chapter's table); this "
             f"trace was recorded on an {report.device}, whose library has a kernel of its own for it.")
    if answer.startswith("aten::"):
        fail(f"{answer} is an op on the CPU track; the answer is the GPU kernel it launched.")
    if bare(answer) in inside:
        name, dur, op = inside[bare(answer)]
        fail(f"{_shown(name)} (launched by {op}) runs inside that call for {dur:.0f} µs; another of its kernels runs longer.")
    fail(f"no kernel called {_shown(kernel.strip())} runs inside the longest attention call of the {short_name(key)} step: list the "
         "call's kernels (call.kernels, with their dur_us) and take the longest.")
