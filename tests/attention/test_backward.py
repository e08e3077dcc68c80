"""The training-step readers of chapter 9 (kernels/attention/backward.py), on real profiled steps."""
from __future__ import annotations

import pytest

from kernels.attention import backward
from kernels.trace import record

SHAPE = (1, 2, 128, 32)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    inputs = {name: backward.step_inputs(*SHAPE) for name in ("naive", "sdpa_flash", "sdpa_math")}
    steps = {name: record.profile(backward.training_step(name, g), q, k, v, label=name, wait=0, warmup=1, active=1,
                                  trace_dir=out).step() for name, (q, k, v, g) in inputs.items()}
    return steps, inputs


def test_training_step_drops_the_last_gradients_and_runs_backward():
    q, k, v, g = backward.step_inputs(*SHAPE)
    step = backward.training_step("naive", g)
    step(q, k, v)
    first = q.grad.clone()
    step(q, k, v)
    assert (q.grad == first).all(), "the second step's gradient replaces the first, it is not added to it"


def test_naive_backward_is_the_forward_reversed(profiled):
    steps, _ = profiled
    nodes = backward.backward_nodes(steps["naive"])
    assert nodes == backward.forward_grad_fns(steps["naive"]) and nodes[0] == "BmmBackward0"
    assert backward.backward_nodes(steps["naive"], bookkeeping=True).count("torch::autograd::AccumulateGrad") == 3


def test_kept_table_agrees_with_the_hooks_and_tells_fused_from_unfused(profiled):
    steps, inputs = profiled
    kept = backward.kept_table(steps, inputs)
    assert (kept["S×S kept (trace)"] == kept["S×S saved (hooks)"]).all()
    assert kept.at["naive", "S×S kept (trace)"] == 1 and kept.at["sdpa_flash", "S×S kept (trace)"] == 0
    assert backward.per_row_shapes(kept.at["sdpa_flash", "shapes saved"], SHAPE), "flash saves a per-row tensor"
    assert not backward.per_row_shapes(kept.at["naive", "shapes saved"], SHAPE)


def test_recompute_table_counts_matmuls_and_square_allocations(profiled):
    steps, inputs = profiled
    table = backward.recompute_table(steps, inputs)
    assert table.at["naive", "bmm in forward"] == 2 and table.at["naive", "bmm in backward"] == 4
    assert table.at["naive", "S×S allocations in backward"] > 0 == table.at["sdpa_flash", "S×S allocations in backward"]


def test_threads_table_and_a_step_without_backward(profiled, tmp_path):
    steps, _ = profiled
    threads = backward.threads_table(steps)
    assert all(set(t) <= {threads.at[n, "label's thread"]} for n, t in threads["backward ops' threads"].items()), \
        "on a CPU the backward runs on the caller's thread"
    q, k, v, _ = backward.step_inputs(*SHAPE)
    forward_only = record.profile(lambda q, k, v: q + k + v, q.detach(), k.detach(), v.detach(), label="fwd",
                                  wait=0, warmup=0, active=1, trace_dir=tmp_path).step()
    with pytest.raises(ValueError, match="no autograd engine op"):
        backward.backward_start(forward_only)


def test_square_sizes_adds_float32_for_the_upcast():
    assert backward.square_sizes((1, 2, 8, 4), 2) == {256}
    assert backward.square_sizes((1, 2, 8, 4), 2, upcast=True) == {256, 512}
