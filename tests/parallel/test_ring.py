"""Ring attention and Ulysses on real gloo process groups (2 and 4 CPU processes), judged against
the float64 reference on every rank's gathered shard, gradients too; the launcher's promises
(a dead or stuck rank ends the run with a clear error within the timeout, no process left);
the split rule; the LSE merge; the exercise checks."""
from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from kernels.parallel import programs as cp
from kernels.parallel import rank_traces
from kernels.parallel import ranks
from kernels.parallel import ring
from kernels.parallel import ulysses
from kernels.exercises import ExerciseFailed
from kernels.exercises.context_parallel import check_merge
from tests import rank_programs


@pytest.fixture(scope="module")
def two():
    with ranks.Ranks(2, timeout_s=60) as group:
        yield group


@pytest.fixture(scope="module")
def four():
    with ranks.Ranks(4, timeout_s=60) as group:
        yield group


def test_gloo_marks_a_transfer_completed_only_inside_wait(two):
    """Why the ring waits from a helper thread (ring.Exchange, chapter 11's prose): without a
    wait, gloo never reports a finished send or receive as completed."""
    assert two.run(rank_programs.gloo_completion_before_wait) == [(False, True), (False, True)], \
        "gloo's is_completed() is False before wait() even after the bytes arrived, True after"


# ------------------------------------------------------------------ pure: split, merge, counts

@pytest.mark.parametrize("seq,world,layout", [(7, 2, "contiguous"), (9, 2, "zigzag"), (29, 4, "zigzag"), (8, 8, "contiguous")])
def test_shard_then_unshard_is_the_identity(seq, world, layout):
    x = torch.randn(2, 3, seq, 5)
    shards = [ring.shard(x, r, world, layout) for r in range(world)]
    assert [s.shape[2] for s in shards] == [ring.shard_len(seq, world, r, layout) for r in range(world)]
    assert sum(s.shape[2] for s in shards) == seq
    assert torch.equal(ring.unshard(shards, layout), x)


@pytest.mark.parametrize("seq,world,layout", [(3, 4, "contiguous"), (7, 4, "zigzag"), (0, 1, "contiguous")])
def test_a_split_the_ranks_cannot_hold_is_refused_with_the_rule(seq, world, layout):
    with pytest.raises(ValueError, match=r"seq_len must be >= \d+"):
        ring.check_split(seq, world, layout)


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="layout must be one of"):
        ring.check_split(16, 2, "striped")


def test_work_per_rank_contiguous_is_triangular_and_zigzag_is_flat():
    assert ring.work_per_rank(64, 2, "contiguous") == [32 * 32, 2 * 32 * 32]
    zig = ring.work_per_rank(64, 4, "zigzag")
    assert len(set(zig)) == 1
    assert ring.work_per_rank(64, 2, "contiguous", causal=False) == [64 * 32] * 2


def test_the_exercise_check_passes_the_library_merge_and_names_an_average():
    assert check_merge(ring.merge, seed=1)
    with pytest.raises(ExerciseFailed, match="averaged"):
        check_merge(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)), seed=1)
    with pytest.raises(ExerciseFailed, match="NaN|overflows"):
        check_merge(lambda oa, la, ob, lb: ((oa * torch.exp(la)[..., None] + ob * torch.exp(lb)[..., None])
                                            / (torch.exp(la) + torch.exp(lb))[..., None], torch.logaddexp(la, lb)), seed=1)


def test_ring_attention_outside_a_process_group_says_what_to_do():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring.ring_attention(q, q, q, seq_len=4)


# ------------------------------------------------------------------ the judge, on real ranks

CASES = [dict(seq=37, heads=4, kv_heads=4, head_dim=16), dict(seq=45, heads=6, kv_heads=2, head_dim=24),
         dict(seq=33, heads=2, kv_heads=1, head_dim=8, batch=2)]


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", CASES, ids=["mha-odd", "gqa3", "mqa-b2"])
def test_ring_on_two_ranks_passes_the_judge_forward_and_backward(two, layout, causal, shape):
    case = cp.Case(layout=layout, causal=causal, seed=7, **shape)
    judged = cp.judge_ring(two.run(cp.ring_check, case), case)
    assert set(judged) == {"out", "dq", "dk", "dv"}
    assert judged.ok, str(judged)


def test_ring_on_one_rank_is_plain_attention():
    case = cp.Case(seq=19, heads=2, kv_heads=1, head_dim=8, seed=2)
    with ranks.Ranks(1, timeout_s=30) as one:
        judged = cp.judge_ring(one.run(cp.ring_check, case), case)
    assert judged.ok, str(judged)


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_ring_on_four_ranks_passes_the_judge_forward_and_backward(four, layout, causal):
    case = cp.Case(seq=43, heads=4, kv_heads=2, head_dim=16, layout=layout, causal=causal, seed=11)
    judged = cp.judge_ring(four.run(cp.ring_check, case), case)
    assert judged.ok, str(judged)


def test_ring_bfloat16_passes_flash_attentions_rule(two):
    case = cp.Case(seq=41, heads=4, kv_heads=2, head_dim=32, dtype="bfloat16", seed=5)
    results = two.run(cp.ring_check, case)
    assert results[0]["out"].dtype == torch.bfloat16 and results[0]["dq"].dtype == torch.bfloat16
    judged = cp.judge_ring(results, case)
    assert "plain bfloat16" in judged["out"].rule and judged.ok, str(judged)


def test_a_wrong_output_fails_the_same_judge(two):
    """The judge the tests trust can fail: a ring answer with one rank's shard perturbed."""
    case = cp.Case(seq=37, heads=2, kv_heads=2, head_dim=8, seed=9)
    results = two.run(cp.ring_check, case, False)
    results[1]["out"] = results[1]["out"] + 1e-3
    assert not cp.judge_ring(results, case).ok


@pytest.mark.parametrize("causal", [True, False])
def test_ulysses_on_two_and_four_ranks_passes_the_judge(two, four, causal):
    for group, heads, kv in ((two, 4, 2), (four, 8, 4)):
        case = cp.Case(seq=39, heads=heads, kv_heads=kv, head_dim=16, causal=causal, seed=3)
        judged = cp.judge_ulysses(group.run(cp.ulysses_check, case), case)
        assert judged.ok, str(judged)


def test_ulysses_refuses_heads_the_ranks_cannot_share():
    with pytest.raises(ValueError, match="multiples of the world size 4"):
        ulysses.check_heads(8, 2, 4)


def test_a_shard_of_the_wrong_length_is_refused_in_words(two):
    messages = two.run(rank_programs.wrong_shard)
    assert all("must hold 8 positions" in m for m in messages), messages


# ------------------------------------------------------------------ the chapter's own traces

def test_the_ring_traces_read_side_by_side_show_the_waits(two, tmp_path):
    """The chapter's traces on a small run (its bytes and FLOP claims are the chapter's own
    lessons): the rank's marked waits, the transfer in flight during the local attention, one
    track per rank."""
    case = cp.Case(batch=1, heads=2, kv_heads=2, seq=128, head_dim=16, layout="contiguous")
    folder = cp.profiled(two, case, "ring", str(tmp_path / "ring"), 2)  # profile every rank, load its traces
    assert [r.rank for r in folder.ranks] == [0, 1] and folder.world == 2 and not folder.missing
    summary = folder.step("ring forward", 1).summary()
    assert (summary["overlap_us"] <= summary["communication_us"]).all()
    # Exposed communication is the time blocked in the marked waits (the K/V exchange, the step's
    # closing barrier), and each rank said whether its one exchange had arrived before it waited.
    assert (summary["waited_us"] > 0).all() and (summary["exposed_communication_us"] == summary["waited_us"]).all()
    assert (summary["exchanges"] == 1).all() and (summary["arrived_before_wait"] <= 1).all()
    fig = folder.step("ring forward", 0).timeline()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]
    assert len(fig.axes[0].collections) == 6  # compute, communication and waits, per rank


SLEEP_S = 0.2


def test_a_transfer_that_completed_during_a_sleep_is_measured_as_short_and_hidden(two, tmp_path):
    """gloo's ranges start when a request is created and end when wait() returns: posting 64
    bytes, sleeping, then waiting gave ranges as long as the sleep, whatever the transfer took.
    The ring's helper thread waits at once, so the ranges end when the bytes arrived, and the
    rank's own wait, where it blocked, is short and says the block had arrived."""
    two.run(rank_programs.post_sleep_wait, str(tmp_path), SLEEP_S)
    summary = rank_traces.load_ranks(tmp_path).step("exchange").summary()
    assert (summary["step_us"] >= SLEEP_S * 1e6).all()
    assert (summary["communication_us"] < 0.25 * SLEEP_S * 1e6).all(), summary["communication_us"]
    assert (summary["exposed_communication_us"] < 0.25 * SLEEP_S * 1e6).all(), summary["exposed_communication_us"]
    assert (summary["exchanges"] == 1).all() and (summary["arrived_before_wait"] == 1).all()


def test_a_transfer_held_up_by_a_late_peer_is_measured_as_exposed(two, tmp_path):
    """The same exchange with rank 1 posting only after its sleep: rank 0's block is still in
    flight when it comes to wait, and it blocks for most of the sleep."""
    two.run(rank_programs.post_sleep_wait, str(tmp_path), SLEEP_S, 1)
    summary = rank_traces.load_ranks(tmp_path).step("exchange").summary()
    assert summary.loc[0, "arrived_before_wait"] == 0 and summary.loc[0, "exchanges"] == 1
    assert summary.loc[0, "exposed_communication_us"] > 0.5 * SLEEP_S * 1e6
    assert summary.loc[0, "communication_us"] > 0.5 * SLEEP_S * 1e6


def test_ulysses_traces_count_the_bytes_the_shapes_predict(two, tmp_path):
    case = cp.Case(batch=1, heads=4, kv_heads=2, seq=64, head_dim=8, layout="contiguous")
    two.run(cp.profile_scheme, case, "ulysses", str(tmp_path / "u"), 2)
    summary = rank_traces.load_ranks(tmp_path / "u").step("ulysses forward", 0).summary()
    assert (summary["sent_bytes"] == ulysses.ulysses_bytes_per_rank(1, 4, 2, 64, 8, 2, 4)).all()
    # Each rank blocked in its waits on the all-to-alls (and the closing barrier): that is its
    # exposed communication; no exchange there claims to have arrived before the wait.
    assert (summary["waited_us"] > 0).all() and (summary["exposed_communication_us"] == summary["waited_us"]).all()
    assert (summary["exchanges"] == 0).all()


# ------------------------------------------------------------------ the launcher's promises

def _no_children_left(before: set) -> bool:
    """No process started since ``before`` (the pids of the children alive then: the module's
    own groups) is still alive."""
    deadline = time.monotonic() + 10
    while {p.pid for p in multiprocessing.active_children()} - before and time.monotonic() < deadline:
        time.sleep(0.1)
    return not ({p.pid for p in multiprocessing.active_children()} - before)


def _children() -> set:
    return {p.pid for p in multiprocessing.active_children()}


def test_a_rank_killed_mid_step_ends_the_run_with_a_clear_error_within_the_timeout():
    timeout, before = 30, _children()
    with ranks.Ranks(2, timeout_s=timeout) as group:
        start = time.monotonic()
        with pytest.raises(ranks.RankFailed, match=r"rank 1 died \(exit code 3\)"):
            group.run(rank_programs.die_mid_step)
        assert time.monotonic() - start < timeout
        assert group.closed
        with pytest.raises(ranks.RankFailed, match="closed"):
            group.run(rank_programs.raise_on_rank_one)
    assert _no_children_left(before) and group.alive() == []


def test_a_stuck_rank_ends_the_run_at_its_timeout():
    before = _children()
    with ranks.Ranks(2, timeout_s=60) as group:
        start = time.monotonic()
        with pytest.raises(ranks.RankTimeout, match=r"ranks \[0\]"):
            group.run(rank_programs.hang, timeout_s=3)
        assert 3 <= time.monotonic() - start < 20
    assert _no_children_left(before)


def test_a_rank_that_raises_is_named_with_its_error():
    before = _children()
    with pytest.raises(ranks.RankFailed, match="rank 1 raised ValueError: rank one refuses"):
        with ranks.Ranks(2, timeout_s=30) as group:
            group.run(rank_programs.raise_on_rank_one)
    assert _no_children_left(before)


def test_a_function_a_child_cannot_import_is_refused_before_it_is_sent(two):
    with pytest.raises(ValueError, match="module-level function"):
        two.run(lambda rank, world: rank)
    assert not two.closed
    with pytest.raises(ValueError, match="positive int"):
        ranks.Ranks(0)


# ------------------------------------------------------------------ PyTorch's own

def test_torch_context_parallel_is_refused_on_the_cpu_with_the_reason():
    reason = cp.torch_context_parallel_reason("cpu")
    assert reason is not None and "sharding strategy" in reason
    with pytest.raises(RuntimeError, match="sharding strategy"):
        cp.torch_context_parallel(0, 1, cp.Case())


def test_the_scaling_model_crosses_where_compute_equals_transfer():
    flops, bw, shape = 989e12, 450e9, (131072, 32, 8, 128)
    w = ring.crossover_world(bw, flops, 131072, 32, 8)
    compute, comm = ring.step_times(w, bw, flops, *shape)
    assert compute == pytest.approx(comm)
    small, large = ring.step_times(w / 2, bw, flops, *shape), ring.step_times(w * 2, bw, flops, *shape)
    assert small[0] > small[1] and large[0] < large[1], "compute hides the transfer below the crossover only"
    assert ring.crossover_world(50e9, flops, 131072, 32, 8) < w, "a slower link crosses at fewer ranks"
    fig, crossovers = ring.scaling_figure({"fast": bw, "slow": 50e9}, flops, "a GPU", *shape)
    assert crossovers == {"fast": pytest.approx(w), "slow": pytest.approx(ring.crossover_world(50e9, flops, 131072, 32, 8))}
    with pytest.raises(ValueError, match="positive rates"):
        ring.step_times(2, 0, flops, *shape)


def test_the_chunks_table_gives_each_rank_an_early_and_a_late_chunk_under_zigzag():
    chunks = ring.chunks_table(64, 2, "zigzag")
    assert chunks["rank 0"].tolist() == ["positions 0 to 15", "positions 48 to 63"]


def test_links_table_names_each_link_and_refuses_others():
    table = ring.links_table({name: 10.0 * i for i, name in enumerate(ring.LINKS, 1)})
    assert table.loc["NVLink 4 (450 GB/s each way)", "bandwidth (GB/s each way)"] == 450
    assert table["source"].str.contains("NVIDIA").all()
    with pytest.raises(ValueError, match="exactly the links"):
        ring.links_table({"NVLink 4 (450 GB/s each way)": 1.0})


def test_sent_bytes_refuses_totals_without_both_schemes():
    import pandas as pd

    case = cp.Case(batch=1, heads=4, kv_heads=2, seq=64, head_dim=16, dtype="bfloat16")
    with pytest.raises(ValueError, match="'ring' and 'ulysses'"):
        cp.sent_bytes(case, 2, {"ring": pd.DataFrame({"sent_bytes": [1, 1]})}, active=3)
