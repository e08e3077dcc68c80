"""Exercise 12 (kernels.exercises.real_models): each check refuses the typical wrong answers, read
from the borrowed traces; nothing typed here is an expected number: the wrong answers are computed
from the traces the way a learner would get them wrong. (The notebook's blank answers and its
solutions run in test_exercises.py with the other exercises.)
"""
from __future__ import annotations

import pytest

from kernels.exercises import ExerciseFailed
from kernels.exercises import real_models as ex12
from kernels.trace.attention import short_kernel_name
from tests.helpers import ROOT

NAME = "12_real_models"


def _fails(message, check, *args, **kwargs):
    with pytest.raises(ExerciseFailed, match=message):
        check(*args, **kwargs)


def test_the_tasks_read_a_trace_the_chapter_does_not_show():
    # The chapter draws HAND_WRITTEN_TRACE's share in its figure but lists the kernels of its H100
    # twin only; CALLS_TRACE it does not read at all, so its answers are not on the page.
    assert ex12.CALLS_TRACE not in (ROOT / "notebooks" / f"{NAME}.py").read_text()


def test_calls_and_kernel_refuse_the_usual_mistakes():
    report = ex12.report_of(ex12.CALLS_TRACE)
    calls, kernel = len(report.calls), report.summary()["main kernel"]
    assert ex12.check_calls_and_kernel(calls, kernel)
    full_name = report.calls[0].main_kernel()["name"]
    assert ex12.check_calls_and_kernel(calls, full_name), "the kernel's full name from the trace is right too"
    ops = sum(name.startswith("aten::") and "attention" in name for name in report.step.ops["name"])
    assert ops > calls, "each call is an op with its backend's ops inside it"
    _fails(r"how many attention ops the step has", ex12.check_calls_and_kernel, ops, kernel)
    _fails(r"every piece of GPU work in the step", ex12.check_calls_and_kernel, len(report.step.gpu_work), kernel)
    _fails(r"does not have \d+ attention calls", ex12.check_calls_and_kernel, calls + 1, kernel)
    _fails(r"calls is a count", ex12.check_calls_and_kernel, float(calls), kernel)
    op = report.calls[0].op
    _fails(r"is an op on the CPU track", ex12.check_calls_and_kernel, calls, op)
    h100_kernel = ex12.report_of(ex12.CALLS_TRACE.replace("mi300x_", "h100_")).summary()["main kernel"]
    _fails(r"is an attention kernel, but not one that ran in this trace: it was recorded on an AMD",
           ex12.check_calls_and_kernel, calls, h100_kernel)
    gemm = next(n for n in report.step.gpu_work["name"] if n.startswith("Cijk_"))
    _fails(r"ran in this step, but it is not the one asked for", ex12.check_calls_and_kernel, calls, gemm)
    _fails(r"no kernel called nothing_like_it ran", ex12.check_calls_and_kernel, calls, "nothing_like_it")


def test_the_share_refuses_the_usual_mistakes():
    report = ex12.report_of(ex12.CALLS_TRACE)
    step, share = report.step, report.attention_share
    assert ex12.check_attention_share(share)
    assert ex12.check_attention_share(round(share, 3)), "three decimals, as a reader copies it, pass"
    _fails(r"that is a percentage", ex12.check_attention_share, 100 * share)
    _fails(r"everything but attention", ex12.check_attention_share, 1 - share)
    _fails(r"one call's share; the step has several", ex12.check_attention_share,
           report.calls[0].gpu_us / step.gpu_time_us)
    _fails(r"divided by the step's CPU time", ex12.check_attention_share, report.attention_gpu_us / step.cpu_time_us)
    work = step.gpu_work
    span = (work["start_us"] + work["dur_us"]).max() - work["start_us"].min()
    _fails(r"span from the first kernel's start to the last one's end", ex12.check_attention_share,
           report.attention_gpu_us / span)
    _fails(r"is not attention's share", ex12.check_attention_share, min(share + 0.1, 0.99))
    _fails(r"returned 'a lot'; return a number", ex12.check_attention_share, "a lot")


def test_the_longest_kernel_refuses_the_usual_mistakes():
    report = ex12.report_of(ex12.HAND_WRITTEN_TRACE)
    longest = max(report.calls, key=lambda c: c.gpu_us)
    by_time = longest.kernels.sort_values("dur_us", ascending=False)
    right = by_time["name"].iloc[0]
    assert ex12.check_longest_kernel(right) and ex12.check_longest_kernel(short_kernel_name(right).split("::")[-1])
    _fails(r"runs inside that call for \d+ µs; another of its kernels runs longer", ex12.check_longest_kernel,
           by_time["name"].iloc[1])
    twin = ex12.report_of(ex12.HAND_WRITTEN_TRACE.replace("mi300x_", "h100_"))
    twin_longest = max(twin.calls, key=lambda c: c.gpu_us)
    twin_name = twin_longest.kernels.loc[twin_longest.kernels["dur_us"].idxmax(), "name"]
    assert short_kernel_name(twin_name) != short_kernel_name(right), "the two vendors name their softmax apart"
    _fails(r"is the longest kernel on the NVIDIA H100.*recorded on an AMD", ex12.check_longest_kernel, twin_name)
    _fails(r"is an op on the CPU track", ex12.check_longest_kernel, "aten::_softmax")
    _fails(r"a kernel's name, a str", ex12.check_longest_kernel, 3)


def test_an_unknown_trace_is_named_in_the_error():
    with pytest.raises(KeyError, match="no borrowed trace 'a100_gpt'; they are h100_bert"):
        ex12.report_of("a100_gpt")
