"""The transformer block of chapter 8 (kernels/attention/block.py), its FLOP counts, and the exercise checks
of chapters 7 and 8 (kernels/exercises/compiled.py, kernels/exercises/block.py): each check names at
least one realistic mistake (tests/exercises/test_exercises.py runs their blank answers and solutions)."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.trace import record
from kernels.attention import block as blocks
from kernels.exercises import ExerciseFailed
from kernels.exercises import block as exb
from kernels.exercises import compiled as exc


def _block(attention="naive", width=64, heads=4):
    torch.manual_seed(0)
    return blocks.Block(width, heads, attention).eval()


def test_block_is_causal():
    # Changing a later token must not change an earlier token's output.
    x = torch.randn(1, 12, 64)
    y = x.clone()
    y[0, 7:] += 1.0
    with torch.no_grad():
        a, b = _block()(x), _block()(y)
    assert torch.allclose(a[0, :7], b[0, :7], atol=1e-6), "tokens before the change must be unaffected"
    assert not torch.allclose(a[0, 7:], b[0, 7:]), "tokens from the change on must move"


def test_block_refuses_in_words():
    with pytest.raises(ValueError, match="multiple of heads"):
        blocks.Block(50, 4)
    with pytest.raises(KeyError, match="registered"):
        blocks.Block(64, 4, "flash9")


def test_attention_share_grows_and_crosses_half_at_6w():
    w = 256
    shares = [blocks.attention_share(s, w) for s in (64, 256, 1024, 4096)]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    assert math.isclose(blocks.attention_share(6 * w, w), 0.5)
    assert math.isclose(blocks.attention_share(12 * w, w, causal_skip=True), 0.5)


def test_record_function_labels_split_the_forward(tmp_path):

    run = record.profile(_block(), torch.randn(1, 32, 64), label="block", wait=0, warmup=1, active=1,
                            trace_dir=tmp_path)
    assert {f"block.{p}" for p in blocks.PARTS} <= set(run.trace.labels()), "every part is labelled"


# ------------------------------------------------------------------ exercise checks, chapter 8

def test_block_checks():
    with pytest.raises(ExerciseFailed, match="a multiply-add is 2 FLOPs"):
        exb.check_block_flops(lambda s, w, b, r: {k: v / 2 for k, v in blocks.flops_by_part(s, w, b, r).items()}, seed=1)
    with pytest.raises(ExerciseFailed, match="computes all S×S scores"):
        exb.check_block_flops(lambda s, w, b, r: blocks.flops_by_part(s, w, b, r, causal_skip=True), seed=1)
    with pytest.raises(ExerciseFailed, match="6·W is the chapter's crossover for one MLP ratio"):
        exb.check_crossover(lambda w, r, c: 6 * w, seed=2)


# ------------------------------------------------------------------ exercise checks, chapter 7

def test_compiled_checks(capsys):
    with pytest.raises(ExerciseFailed, match="one key too many"):
        exc.check_window_mask(lambda w: (lambda b, h, q, kv: (kv <= q) & (kv >= q - w)), seed=4)
    with pytest.raises(ExerciseFailed, match="causal bound is missing"):
        exc.check_window_mask(lambda w: (lambda b, h, q, kv: (kv > q - w)), seed=4)
    with pytest.raises(ExerciseFailed, match="diagonal as skipped"):
        exc.check_skipped_tiles(lambda s, b: math.ceil(s / b) * (math.ceil(s / b) + 1) // 2, seed=5)
    with pytest.raises(ExerciseFailed, match=r"multiply it by cap again.*\(seed 6: pass seed=6"):
        exc.check_softcap(lambda cap: (lambda s, b, h, q, kv: torch.tanh(s / cap)), seed=6)
    assert "seed" not in capsys.readouterr().out, "a failure names its seed in its message, nothing is printed"


def test_block_input_is_seeded_by_its_length_and_seeded_block_by_seed_zero():
    from kernels.attention.block import block_input, seeded_block
    a, b = block_input(2, 16, 8), block_input(2, 16, 8)
    assert a.shape == (2, 16, 8) and torch.equal(a, b) and not torch.equal(block_input(2, 17, 8)[:, :16], a)
    one, two = seeded_block(8, 2, "naive"), seeded_block(8, 2, "sdpa_math", labels=False)
    assert not one.training and all(torch.equal(p, q) for p, q in zip(one.parameters(), two.parameters()))
    assert torch.allclose(one(a), two(a), atol=1e-5)


def test_pluggable_leaves_out_compiled_entries_and_the_cpu_interpreter():
    names = blocks.pluggable("cpu")
    assert "naive" in names and "sdpa_flash" in names
    assert not {"compiled_naive", "flex", "triton"} & set(names)


def test_largest_difference_is_relative_to_the_first_output():
    a = torch.tensor([1.0, -4.0])
    assert blocks.largest_difference({"a": a, "b": a.clone()}) == 0
    assert blocks.largest_difference({"a": a, "b": a + torch.tensor([0.0, 0.4])}) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least one"):
        blocks.largest_difference({})


@pytest.mark.parametrize("attention", ["sdpa_flash", blocks.sdpa_causal])
def test_a_block_with_sdpa_traces_into_one_graph(attention):
    # The pinned SDPA entry captures warnings eagerly; under torch.compile it must skip that
    # capture, which would otherwise break the block's graph in two.
    import torch._dynamo

    with torch.no_grad():
        explained = torch._dynamo.explain(blocks.seeded_block(64, 4, attention, labels=False))(torch.randn(1, 32, 64))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_forward_parts_reads_the_borrowed_qwen_forward():
    from kernels.borrowed import COMPILED_POINTWISE, TRACELENS

    qwen = blocks.forward_parts(TRACELENS["h100_qwen"])
    assert qwen.layers == 24 and qwen.part("attention")["kernels"] == qwen.layers
    assert "H100" in qwen.device and "not this book's run" in qwen.credit
    with pytest.raises(ValueError, match="no attention call"):
        blocks.forward_parts(COMPILED_POINTWISE)


def test_profile_blocks_returns_a_run_and_a_step_per_block(tmp_path):
    x = blocks.block_input(1, 16, 64)
    runs, steps = blocks.profile_blocks({"a": _block(), "b": _block("inplace")}, x, active=1, trace_dir=tmp_path)
    assert set(runs) == set(steps) == {"a", "b"} and all(s.allocated_bytes > 0 for s in steps.values())
    with pytest.raises(ValueError, match="at least one block"):
        blocks.profile_blocks({}, x, active=1, trace_dir=tmp_path)


def test_formula_gap_is_zero_for_the_count_and_sees_a_wrong_formula():
    fl = blocks.flop_shares(_block(), 1, 64, [16, 32])
    assert blocks.formula_gap(fl) < 1e-9
    assert blocks.formula_gap(fl.assign(**{"formula attention": fl["formula attention"] * 2})) > 0
