"""The training-step readers of chapter 9 (kernels/attention/backward.py) beyond what the chapter
asserts when it executes (its lessons read the backward's nodes, the kept and recompute tables
and the threads off real profiled steps): the step itself, a step without backward, the sizes."""
from __future__ import annotations

import pytest

from kernels.attention import backward
from kernels.trace import record

SHAPE = (1, 2, 128, 32)


def test_training_step_drops_the_last_gradients_and_runs_backward():
    q, k, v, g = backward.step_inputs(*SHAPE)
    step = backward.training_step("naive", g)
    step(q, k, v)
    first = q.grad.clone()
    step(q, k, v)
    assert (q.grad == first).all(), "the second step's gradient replaces the first, it is not added to it"


def test_a_step_without_backward_is_refused_in_words(tmp_path):
    q, k, v, _ = backward.step_inputs(*SHAPE)
    forward_only = record.profile(lambda q, k, v: q + k + v, q.detach(), k.detach(), v.detach(), label="fwd",
                                  wait=0, warmup=0, active=1, trace_dir=tmp_path).step()
    with pytest.raises(ValueError, match="no autograd engine op"):
        backward.backward_start(forward_only)


def test_square_sizes_adds_float32_for_the_upcast():
    assert backward.square_sizes((1, 2, 8, 4), 2) == {256}
    assert backward.square_sizes((1, 2, 8, 4), 2, upcast=True) == {256, 512}


def test_per_row_shapes_keeps_the_log_sum_exp_and_nothing_q_sized_or_square():
    q_shape = (1, 2, 128, 32)
    saved = [(1, 2, 128, 32), (1, 2, 128, 128), (1, 2, 128), (1, 2, 128, 1)]
    assert backward.per_row_shapes(saved, q_shape) == [(1, 2, 128), (1, 2, 128, 1)]
