"""tools/gpu_branch_coverage.py: every line of the chapters' GPU branches that does not launch
device work is run by a CPU test (issue #29), by rules a reader can check on a small chapter."""
from __future__ import annotations

import textwrap

import pytest

from tools import gpu_branch_coverage as coverage

CHAPTER = '''\
import kernels
from kernels import gpu_lessons
from kernels.bench import plots, sweep
from kernels.bench.results import points_table
from kernels.notebook import inputs
from kernels.trace import reader, record

impl = kernels.get("naive")
if on_gpu:
    q, k, v = inputs(1, 2, 64, 16, device=device)
    seqs = sorted({512, seq})
    step = reader.median_step(record.profile(impl, q, k, v).steps())
    results = sweep.sweep(["naive"], seqs=seqs, device=device)
    display(points_table(results, ["impl", "median_ms"]))
    gpu_lessons.ran_at_every_point(results, "naive", "it ran")
    print("a fixed sentence")
    budget = dict(reps=30)
    frame = results.to_frame()
    display(frame[["impl"]].round(3))
    for name in ("a", "b"):
        print(f"{name}: {results[0].median_ms:.1f} ms")
'''


@pytest.fixture
def verdicts(tmp_path):
    path = tmp_path / "04_fake.py"
    path.write_text(textwrap.dedent(CHAPTER))
    return {v.line: v for v in coverage.Chapter(path).verdicts()}


def test_each_rule_on_a_small_chapter(verdicts):
    kinds = {line: v.kind for line, v in verdicts.items()}
    assert kinds == {10: "launch", 11: "launch", 12: "launch", 13: "launch",   # inputs, seqs (read by the sweep only),
                     14: "library", 15: "library",                           # profile, sweep; a table, a lesson
                     16: "plain", 17: "plain",                               # a fixed sentence, plain values
                     18: "chapter", 19: "chapter", 20: "chapter", 21: "chapter"}, kinds
    assert verdicts[11].reason == "binds what only launches read"
    assert verdicts[12].reason.startswith("record.profile") and verdicts[14].functions == (
        ("kernels.bench.results", "points_table"),)


def test_the_report_fails_on_chapter_code_and_on_a_library_call_no_test_runs(verdicts):
    every = list(verdicts.values())
    lines, complete = coverage.report(every, executed={})
    assert not complete and "lines that read or show results, executed by CPU tests: 0 of 6 (0%)" in lines
    assert any("not run by the tests: kernels.bench.results.points_table" in line for line in lines)
    launches_and_library = [v for v in every if v.kind in ("launch", "library", "plain")]
    ran_all = {m: coverage.function_lines(m, f) for v in launches_and_library for m, f in v.functions}
    lines, complete = coverage.report(launches_and_library, executed=ran_all)
    assert complete and "lines that read or show results, executed by CPU tests: 2 of 2 (100%)" in lines


def test_no_chapter_keeps_code_that_reads_or_shows_results_in_a_gpu_branch():
    left = [f"{v.chapter}:{v.line}: {v.text}" for v in coverage.all_verdicts() if v.kind == "chapter"]
    assert left == [], "move these into kernels.gpu_lessons or kernels.bench, tested on fixture data:\n" + "\n".join(left)


@pytest.mark.book  # runs tests/trace/test_gpu_lessons.py (a book test) under coverage.py: `make test-book`
def test_every_library_call_of_a_gpu_branch_is_run_by_the_cpu_tests(capsys):
    assert coverage.main() == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "read or show results in the chapter: 0 lines" in out and "(100%)" in out, out
