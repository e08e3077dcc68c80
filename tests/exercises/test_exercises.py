"""Exercise notebooks: blank stubs fail with the intended words, solutions pass, and each check
recognizes at least one realistic wrong answer per task.

The tests run the notebooks' own cells (book/exercises/*.ipynb, by tag): "setup", "stub" and
"solution" cells become one module (written to a file, so Triton can read a kernel's source),
then each "check" cell runs in that module with ``solutions`` off and on.
"""
from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.exercises import ExerciseFailed, judge
from kernels.exercises import cuda as ex5
from kernels.exercises import inplace as ex2
from kernels.exercises import naive as ex1
from kernels.exercises import occupancy as occ
from kernels.exercises import primer as ex0
from kernels.exercises import sdpa as ex3
from kernels.exercises import showdown as ex6
from kernels.exercises import triton as ex4
from kernels.hw.occupancy import ARCHES
from tests.helpers import ROOT

BOOK = ROOT / "book" / "exercises"
SMALL = "seq = 64\nheads = 2\nhead_dim = 16\nsteps = 2\n"  # cheap shapes for the notebook's own inputs

# What each notebook's checks say, in order, when run on the blank stubs.
STUB_MESSAGES = {
    "00_profiler_primer": [r"write your guess first", r"hottest_op\(step\) returned nothing"],
    "01_naive": [r"my_attention returned None", r"you returned None, but the trace of naive attention has a copy"],
    "02_inplace": [r"my_mask_ returned None", r"lean_attention returned None"],
    "03_sdpa": [r"write your guesses first", r"sdpa_with_mask returned None", r"safe_softmax returned None",
                r"predict a backend for every scenario first"],
    "04_triton": [r"online_update returned None",
                  r"mask is off by one: row 0 has no key left and comes out NaN",
                  r"my_occupancy must return \(blocks_per_sm, fraction\); it returned None"],
    "05_cuda": [r"read_ptxas returned None", r"my_occupancy must return \(blocks_per_sm, fraction\); it returned None",
                r"lane_elements returned None"],
    "06_showdown": [r"my_tflops returned None; return a number", r"my_intensity returned None",
                    r"my_waves\(\.\.\.\) must return three numbers"],
    "07_compiled": [r"sliding_window\(\d+\) must return a function mask_mod", r"skipped_tiles\(\d+, \d+\) returned None",
                    r"softcap\([\d.]+\) must return a function score_mod"],
    "08_block": [r"block_flops must return a dict", r"crossover returned None", r"scores_buffers returned None; return a count"],
    "09_backward": [r"kept_for_backward returned None; return a count", r"training_flops returned None; return a number"],
    "10_decoding": [r"decode_token returned None", r"decode_intensity returned None; return a number"],
    "11_context_parallel": [r"merge must return two tensors, \(out, lse\)", r"slow_rank must return a rank \(an int\)"],
    "12_real_models": [r"write your answers first: `calls` \(a number\) and `kernel`",
                       r"write your answer first: `share` is still empty",
                       r"write your answer first: kernel is still empty"],
}


def _cells(name: str) -> list:
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    return nbformat.read(BOOK / f"{name}.ipynb", as_version=4).cells


def _tagged(cells, tag):
    return [c.source for c in cells if tag in c.metadata.get("tags", [])]


_modules: dict = {}


def notebook_module(name: str, tmp_dir: Path):
    """The notebook's parameters, setup, stubs and solutions as an imported module (cached)."""
    if name in _modules:
        return _modules[name]
    cells = _cells(name)
    source = "\n\n".join(_tagged(cells, "parameters") + [SMALL] + _tagged(cells, "setup")
                         + _tagged(cells, "stub") + _tagged(cells, "solution"))
    path = tmp_dir / f"exercise_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"exercise_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    _modules[name] = module
    return module


@pytest.fixture(scope="module")
def nb_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exercise_modules")


def checks_with_switches(cells) -> list[tuple[str, str]]:
    """(check cell, the hidden cell before it that switches to the course's solution, or "")."""
    out = []
    for i, cell in enumerate(cells):
        if "check" in cell.metadata.get("tags", []):
            before = cells[i - 1] if i else None
            switch = before.source if before is not None and "solution-switch" in before.metadata.get("tags", []) else ""
            out.append((cell.source, switch))
    return out


def run_check(module, cell: str, solutions: bool, switch: str = ""):
    """Run a check cell as the notebook does; with ``solutions``, after its switch cell, in a copy
    of the module's names (the stubs stay for the other tests)."""
    names = dict(module.__dict__) if solutions else module.__dict__
    names["solutions"] = solutions
    for code in (switch, cell):
        exec(compile(code, f"<check of {module.__name__}>", "exec"), names)


def test_every_notebook_has_the_parts(nb_dir):
    for name in STUB_MESSAGES:
        cells = _cells(name)
        params = _tagged(cells, "parameters")
        assert len(params) == 1 and re.search(r"^solutions = False$", params[0], flags=re.M), name
        checks, solutions, stubs = (_tagged(cells, t) for t in ("check", "solution", "stub"))
        assert len(checks) == len(STUB_MESSAGES[name]) == len(solutions), name
        assert 2 <= len(checks) <= 4 and stubs, name
        for c in cells:
            if "solution" in c.metadata.get("tags", []):
                assert "hide-input" in c.metadata["tags"], f"{name}: solutions are hidden in the book"


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the planted NaN bug
@pytest.mark.parametrize("name", list(STUB_MESSAGES))
def test_stubs_fail_with_their_message_and_solutions_pass(name, nb_dir, capsys):
    module = notebook_module(name, nb_dir)
    for (cell, switch), message in zip(checks_with_switches(_cells(name)), STUB_MESSAGES[name]):
        with pytest.raises(ExerciseFailed, match=message):
            run_check(module, cell, solutions=False)
        run_check(module, cell, solutions=True, switch=switch)
    printed = capsys.readouterr().out
    assert printed.count("✔") >= len(STUB_MESSAGES[name]), printed


# ------------------------------------------------------------------ realistic wrong answers

def _fails(message, check, *args, **kwargs):
    with pytest.raises(ExerciseFailed, match=message):
        check(*args, **kwargs)


def _attention_with(scale_fn=lambda d: d ** -0.5, diagonal=1, dim=-1):
    def attention(q, k, v, causal=True, scale=None):
        scale = scale_fn(q.shape[-1]) if scale is None else scale
        s = (q @ k.transpose(-2, -1)) * scale
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(diagonal), -math.inf)
        return torch.softmax(s, dim=dim) @ v
    return attention


def layer(x, w, b):
    return F.gelu(x @ w + b)


def test_chapter0_wrong_answers():
    # Large enough that the matmul dominates: its total time then beats every self time.
    x, w, b = torch.randn(1024, 256), torch.randn(256, 256), torch.randn(256)
    _fails(r"aten::mm is not at the top level \(it is one level down", ex0.check_top_level_guess,
           ["aten::mm", "aten::add", "aten::gelu"], layer, x, w, b)
    _fails(r"right ops, wrong order", ex0.check_top_level_guess, ["aten::add", "aten::matmul", "aten::gelu"],
           layer, x, w, b)
    # A bare matmul, so the answer cannot depend on load: aten::matmul's total holds aten::mm's
    # time (the parent wins by total), and only mm does the work (it wins by self time).
    by_total = lambda step: step.ops.loc[step.ops["dur_us"].idxmax(), "name"]
    _fails(r"longest \*total\* time \(dur_us\)", ex0.check_hottest_op, by_total, torch.matmul, x, w)


def test_chapter1_wrong_answers():
    right = _attention_with()
    assert ex1.check_attention(right)
    _fails(r"the scale is missing", ex1.check_attention, _attention_with(scale_fn=lambda d: 1.0))
    _fails(r"off by one: it hides the diagonal too", ex1.check_attention, _attention_with(diagonal=0))
    _fails(r"each query also sees the next key", ex1.check_attention, _attention_with(diagonal=2))
    _fails(r"softmax runs over the wrong dimension", ex1.check_attention, _attention_with(dim=-2))
    _fails(r"wrong shape", ex1.check_attention, lambda q, k, v, causal=True, scale=None: right(q, k, v, causal, scale)[..., 0])

    def first_copy_by_name(step, min_bytes):
        c = step.copies()
        return None if c.empty else judge.top_level_ancestor(step, int(c.index[0]))

    _fails(r"only made a small copy .* by the bytes they move", ex1.check_hidden_copy, first_copy_by_name)
    _fails(r"aten::clone does the copying", ex1.check_hidden_copy, lambda step, n: "aten::clone")
    _fails(r"no copy moves .* the answer is None", ex1.check_hidden_copy, lambda step, n: "aten::masked_fill")

    def two_parents_up(step, min_bytes):  # right on naive's trace only: its copy sits two levels down
        c = step.copies(min_bytes=min_bytes)
        if c.empty:
            return None
        row = step.ops.at[step.ops.at[c["bytes"].idxmax(), "parent"], "parent"]
        return step.ops.at[row, "name"]

    _fails(r"the unseen attention", ex1.check_hidden_copy, two_parents_up)


def test_chapter2_wrong_answers():
    _fails(r"not in place: the result is right, but it is a new tensor", ex2.check_inplace_mask,
           lambda scores, future: scores.masked_fill(future, -math.inf))
    _fails(r"hidden scores are 0, not -inf", ex2.check_inplace_mask,
           lambda scores, future: scores.masked_fill_(future, 0.0))

    def forgot_return(scores, future):
        scores.masked_fill_(future, -math.inf)

    _fails(r"filled in place, but my_mask_ returned None", ex2.check_inplace_mask, forgot_return)
    inplace = kernels.get("inplace")
    _fails(r"right values, but one call allocated [\d.]+ S×S buffers .*aten::mul.*aten::softmax",
           ex2.check_lean_attention, lambda q, k, v: inplace(q, k, v))


def test_chapter3_wrong_answers():
    guesses = {"sdpa_math": 10, "sdpa_flash": 2}
    _fails(r"you counted every op .* views and allocations included", ex3.check_work_op_count,
           lambda step: len(step.ops), guesses)
    _fails(r"parents and children both", ex3.check_work_op_count,
           lambda step: int((~step.ops["is_view"]).sum()), guesses)
    _fails(r"the mask is inverted: SDPA's boolean attn_mask marks what to KEEP", ex3.check_sdpa_mask,
           lambda q, k, v, future: F.scaled_dot_product_attention(q, k, v, attn_mask=future))
    _fails(r"a float attn_mask is ADDED", ex3.check_sdpa_mask,
           lambda q, k, v, future: F.scaled_dot_product_attention(q, k, v, attn_mask=future.float()))
    _fails(r"every score is -inf came out NaN", ex3.check_safe_softmax, lambda x: torch.softmax(x, -1))
    _fails(r"changed its input", ex3.check_safe_softmax,
           lambda x: torch.softmax(x.nan_to_num_(neginf=-1e30), -1))


def _online(rescale_l=True, tile_max=False):
    def update(m, l, acc, s, v):
        m_new = s.amax(-1) if tile_max else torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[:, None])
        return m_new, (l * alpha if rescale_l else l) + p.sum(-1), acc * alpha[:, None] + p @ v
    return update


def _occupancy(reserve=1024, round_registers=True, arch_limits=None):
    """Occupancy as a learner writes it, shared memory per SM from ARCHES (chapter 4 asks for sm_80
    only); the switches reproduce the usual slips, arch_limits pins one architecture's limits."""
    def occ(threads, registers, shared, arch="sm_80"):
        warps = -(-threads // 32)
        if round_registers:
            by_regs = (16384 // (-(-registers * 32 // 256) * 256)) * 4 // warps
        else:
            by_regs = 65536 // (threads * registers)
        shared_per_sm = ARCHES[arch_limits or arch].shared_mem_per_sm
        by_smem = shared_per_sm // (-(-(shared + reserve) // 128) * 128) if shared + reserve else 32
        blocks = min(by_regs, by_smem, 64 // warps, 32)
        return blocks, blocks * warps / 64
    return occ


def test_chapter4_wrong_answers():
    assert ex4.check_online_update(_online())
    _fails(r"l \(the running sum\) is not rescaled", ex4.check_online_update, _online(rescale_l=False))
    _fails(r"m_new is the tile's maximum only", ex4.check_online_update, _online(tile_max=True))
    assert occ.check_occupancy(_occupancy())
    _fails(r"reserves 1 KB of shared memory", occ.check_occupancy, _occupancy(reserve=0))
    _fails(r"registers are handed out per warp", occ.check_occupancy, _occupancy(round_registers=False))
    _fails(r"you returned a percentage", occ.check_occupancy,
           lambda *a: (_occupancy()(*a)[0], 100 * _occupancy()(*a)[1]))
    # The Triton kernel's planted bug (the notebook's stub) is covered by the stub test.


def _tflops(causal_halved=True, unit=1e12):
    def tflops(b, h, s, d, causal, backward, ms):
        f = 4 * b * h * s * s * d / (2 if causal and causal_halved else 1) * (3.5 if backward else 1)
        return f / (ms * 1e-3) / unit
    return tflops


def test_chapter6_wrong_answers():
    assert ex6.check_tflops(_tflops())
    _fails(r"causal attention is counted at full price", ex6.check_tflops, _tflops(causal_halved=False))
    _fails(r"1000x high", ex6.check_tflops, _tflops(unit=1e9))

    def intensity(b, h, s, d, causal, elem, tensors=4, per_element=False):
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        return flops / (tensors * b * h * s * d * (1 if per_element else elem))

    assert ex6.check_intensity(intensity)
    _fails(r"elements, not bytes", ex6.check_intensity, lambda *a: intensity(*a, per_element=True))
    _fails(r"four tensors", ex6.check_intensity, lambda *a: intensity(*a, tensors=3))


def test_chapter6_unknown_slips_say_where_and_which_way_never_a_factor():
    # A constant answer must not let the learner read the expected values back from the message.
    _fails(r"causal cases too low, by a factor that changes with the shape", ex6.check_intensity, lambda *a: 1.0)
    _fails(r"dense fwd too low", ex6.check_tflops, lambda *a: 1.0)
    for check in (ex6.check_intensity, ex6.check_tflops):
        with pytest.raises(ExerciseFailed) as failed:
            check(lambda *a: 1.0)
        assert not re.search(r"\d+(\.\d+)?(e-?\d+)?x", str(failed.value).split("(seed")[0])
    assert ex6.off_where({"a": [1.0, 2.0, 0.5], "b": [3.0, 3.0]}, shapes=True) == (
        "a right in some, too high in some, too low in others, by a factor that changes with the shape; "
        "b too high, by one factor for every shape")


def test_learner_exceptions_become_sentences():
    def broken(q, k, v, causal=True, scale=None):
        return q @ k  # forgot the transpose: a shape error
    _fails(r"my_attention\(q, k, v, causal, scale\) raised RuntimeError", ex1.check_attention, broken)


def _read_ptxas(first_match=False, stores_only=False):
    """read_ptxas as a learner might write it: first_match ignores the arch."""
    def read(text, kernel, arch):
        start = text.index(f"Compiling entry function '{kernel}'" + ("" if first_match else f" for '{arch}'"))
        used = re.compile(r"Used (\d+) registers.*").search(text, start)
        block = text[start:used.end()]
        stores, loads = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block).groups()
        smem = re.search(r"(\d+) bytes smem", used.group(0))
        return int(used.group(1)), int(smem.group(1)) if smem else 0, int(stores) + (0 if stores_only else int(loads))
    return read


def test_chapter5_wrong_answers():
    assert ex5.check_read_ptxas(_read_ptxas())
    _fails(r"numbers of the same kernel compiled for sm_80", ex5.check_read_ptxas, _read_ptxas(first_match=True))
    _fails(r"spill stores plus spill loads", ex5.check_read_ptxas, _read_ptxas(stores_only=True))
    assert occ.check_occupancy(_occupancy(), takes_arch=True)
    _fails(r"you used sm_80's limits for sm_90", occ.check_occupancy, _occupancy(arch_limits="sm_80"), takes_arch=True)

    def lane(tid, warp_offset=True, second=8):
        warp, ln = divmod(tid, 32)
        g, t = divmod(ln, 4)
        base = 16 * warp if warp_offset else 0
        return [base + g, base + g + second], [2 * t, 2 * t + 1]

    assert ex5.check_v2_lane(lane)
    _fails(r"those are warp 0's rows", ex5.check_v2_lane, lambda tid: lane(tid, warp_offset=False))
    _fails(r"the second row is g \+ 8, not g \+ 1", ex5.check_v2_lane, lambda tid: lane(tid, second=1))
    swapped = lambda tid: ([16 * (tid // 32) + tid % 4, 16 * (tid // 32) + tid % 4 + 8],
                           [2 * (tid % 32 // 4), 2 * (tid % 32 // 4) + 1])
    _fails(r"g and t are swapped", ex5.check_v2_lane, swapped)


def test_a_passed_check_is_true_and_shows_nothing_more_as_a_cells_last_value(capsys):
    result = judge.passed("right")
    assert result and repr(result) == "Passed('right')" and result._ipython_display_() is None
    capsys.readouterr()
    judge.showing_solutions(True)
    try:
        judge.passed("right")
        out = capsys.readouterr().out
        assert out == "✔ the course solution: right\n", \
            "a built page's ✔ says it is the course's solution that passed, not the learner's empty cell"
    finally:
        judge.showing_solutions(False)
    judge.passed("right")
    assert capsys.readouterr().out == "✔ right\n"


def test_a_failure_names_its_seed_and_a_pass_prints_none(capsys):
    seed = judge.check_seed(1234)
    with pytest.raises(judge.ExerciseFailed, match=r"wrong \(seed 1234: pass seed=1234 to the check to replay"):
        judge.fail("wrong")
    assert seed == 1234 and judge.check_seed() != judge.check_seed(7) == 7
    judge.passed("right")
    assert capsys.readouterr().out == "✔ right\n", "a pass prints its ✔ line only"
    with pytest.raises(judge.ExerciseFailed) as failed:
        judge.fail("no cases drawn")
    assert "seed" not in str(failed.value), "after a pass, a failure with no cases of its own names no seed"


def test_backend_predictions_name_the_rule_that_decides(nb_dir):
    solution = notebook_module("03_sdpa", nb_dir).solution_predictions
    wrong = {**solution, "H200, bf16, D=64": "sdpa_flash"}  # the usual guess: flash everywhere
    with pytest.raises(ExerciseFailed, match=r"H200, bf16, D=64: you predicted 'sdpa_flash'\. sdpa_flash accepts "
                                             r"this call, but SDPA tries another backend before it") as refused:
        ex3.check_backend_predictions(wrong)
    assert "sdpa_cudnn" not in str(refused.value), "the refusal names the rule, never the answer"
    wrong = {**solution, "T4, fp16, D=60": "sdpa_efficient"}
    with pytest.raises(ExerciseFailed, match="multiple of 8"):
        ex3.check_backend_predictions(wrong)
