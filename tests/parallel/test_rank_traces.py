"""The rank-folder reader (kernels.parallel.rank_traces) on real multi-rank traces recorded by others (two
ranks of a 128-rank A100 job, and rank 0 of a 2-rank NCCL job, from HolisticTraceAnalysis' test
data), on synthetic folders whose every number is known, and the slow-rank exercise check."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest

from kernels.parallel import rank_traces
from kernels.exercises import ExerciseFailed
from kernels.exercises.context_parallel import check_slow_rank, write_rank_folder
from tests.helpers import ROOT

REAL = ROOT / "tests" / "data" / "real_traces"
PAIR = [REAL / f"hta_trace_filter_sampled_rank-{r}.json.gz" for r in (0, 1)]
NCCL = REAL / "hta_nccl_parser_config_nccl_data.json.gz"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    for path in PAIR:
        shutil.copy(path, folder / path.name)
    return rank_traces.load_ranks(folder)


def _raw(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _union_length(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _nccl_in_step(raw, step_name):
    """An independent count, from the raw JSON: the NCCL kernels whose launch (matched by
    correlation id) starts inside the named ProfilerStep."""
    events = raw["traceEvents"]
    step = next(e for e in events if e.get("name") == step_name)
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    return [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"
            and e["name"].startswith("nccl") and t0 <= launches.get(e["args"].get("correlation"), -1) <= t1]


def test_the_real_pair_matches_its_steps_by_name_and_finds_nccl_communication(pair):
    step = pair.step()
    assert step.label == "ProfilerStep#551" and [s.label for s in step.steps] == ["ProfilerStep#551"] * 2
    summary = step.summary()
    assert (summary["compute_us"] > 0).all() and (summary["communication_us"] > 0).all()
    assert (summary["overlap_us"] <= summary[["compute_us", "communication_us"]].min(axis=1) + 1e-6).all()
    assert (summary["exposed_communication_us"] >= 0).all()
    accounted = summary["compute_us"] + summary["exposed_communication_us"] + summary["idle_us"]
    assert accounted.tolist() == pytest.approx(summary["step_us"].tolist(), rel=1e-9)
    assert summary["behind_slowest_us"].min() == 0


def test_the_real_pairs_communication_is_what_the_raw_json_says(pair):
    step = pair.step()
    summary = step.summary()
    for rank, path in zip((0, 1), PAIR):
        want = _union_length(_nccl_in_step(_raw(path), "ProfilerStep#551"))
        assert want > 0
        assert summary.loc[rank, "communication_us"] == pytest.approx(want, rel=1e-12)


def test_the_real_pairs_critical_path_has_a_round_per_communication_round(pair):
    step = pair.step()
    path = step.critical_path()
    rounds = [len(step.rounds(i)) for i in range(2)]
    assert len(path) == min(rounds) + 1
    assert set(path["rank"]) <= {0, 1} and (path["compute_us"] >= 0).all() and (path["slack_us"] >= 0).all()
    assert path["matched"].all() == (rounds[0] == rounds[1])


def test_the_nccl_trace_alone_is_rank_0_of_2_with_its_collectives_bytes(tmp_path):
    shutil.copy(NCCL, tmp_path / NCCL.name)
    folder = rank_traces.load_ranks(tmp_path)
    assert [r.rank for r in folder.ranks] == [0] and folder.world == 2 and folder.missing == [1]
    step = folder.step()
    summary = step.summary()
    raw = _raw(NCCL)
    assert summary.loc[0, "communication_us"] == pytest.approx(_union_length(_nccl_in_step(raw, step.label)), rel=1e-12)
    # An independent sum of the all-reduces' and broadcasts' payloads (In msg nelems x dtype).
    events = raw["traceEvents"]
    t = next(e for e in events if e.get("name") == step.label)
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    size = {"Float": 4, "Byte": 1, "Int8": 1, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4}
    want = sum(e["args"]["In msg nelems"] * size[e["args"]["dtype"]] for e in events
               if e.get("cat") == "kernel" and e["name"].startswith("nccl") and "In msg nelems" in e["args"]
               and t["ts"] <= launches.get(e["args"]["correlation"], -1) <= t["ts"] + t["dur"])
    assert want > 0 and summary.loc[0, "sent_bytes"] == want


def test_a_synthetic_folder_gives_back_every_number_it_was_built_with(tmp_path):
    compute_ms, step_ms = [12.0, 30.0, 7.0], 40.0
    folder = rank_traces.load_ranks(write_rank_folder(tmp_path, compute_ms, step_ms))
    summary = folder.step().summary()
    assert summary["compute_us"].tolist() == [c * 1e3 for c in compute_ms]
    assert summary["step_us"].tolist() == [step_ms * 1e3] * 3
    assert summary["behind_slowest_us"].tolist() == [(30.0 - c) * 1e3 for c in compute_ms]
    assert (summary["overlap_us"] == 0).all()  # the receive starts after the compute ends
    assert folder.step().slowest_rank() == 1
    assert summary["matmul_flop"].tolist() == [2 * 512 * 64 * 512] * 3
    assert summary["sent_bytes"].tolist() == [1024 * 64 * 4] * 3  # the send, not the receive


def test_ranks_come_from_the_file_name_without_distributed_info_and_duplicates_are_refused(tmp_path):
    raw = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}
    for name in ("job_rank_3.json", "job_rank-1.json"):
        (tmp_path / name).write_text(json.dumps(raw))
    assert [r.rank for r in rank_traces.load_ranks(tmp_path).ranks] == [1, 3]
    (tmp_path / "other-rank1.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="both rank 1"):
        rank_traces.load_ranks(tmp_path)
    unnamed = tmp_path / "x"
    unnamed.mkdir()
    (unnamed / "trace.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="rank is unknown"):
        rank_traces.load_ranks(unnamed)
    with pytest.raises(ValueError, match="not a folder"):
        rank_traces.load_ranks(tmp_path / "x" / "missing")
    (unnamed / "trace.json").unlink()
    with pytest.raises(ValueError, match="holds no trace"):
        rank_traces.load_ranks(unnamed)


def test_the_slow_rank_check_passes_the_solution_and_names_the_waiting_rank():
    assert check_slow_rank(lambda folder: rank_traces.load_ranks(folder).step().slowest_rank(), seed=2)
    with pytest.raises(ExerciseFailed, match="waited longest"):
        check_slow_rank(lambda f: int(rank_traces.load_ranks(f).step().summary()["exposed_communication_us"].idxmax()),
                        seed=2)
    with pytest.raises(ExerciseFailed, match="must return a rank \\(an int\\), got None"):
        check_slow_rank(lambda f: None, seed=2)  # the notebook's blank stub
    with pytest.raises(ExerciseFailed, match="not written yet"):
        check_slow_rank(lambda f: (_ for _ in ()).throw(NotImplementedError), seed=2)


def _marked_rank(folder, rank, wait_name, wait_ms, barrier="step:wait barrier"):
    """One rank's trace: 30 ms of matmul, a K/V exchange posted before it whose gloo ranges run to
    a wait after it (the old reading: 31 ms "in flight during compute"), the rank's own marked wait
    of ``wait_ms``, and a closing barrier wait of 4 ms, in a 40 ms step."""
    pid = tid = 10 + rank
    t0 = 1_000_000.0

    def event(name, cat, at_ms, dur_ms, args=None):
        return {"ph": "X", "cat": cat, "name": name, "ts": t0 + at_ms * 1e3, "dur": dur_ms * 1e3, "pid": pid,
                "tid": tid, "args": args or {}}

    shapes = {"Input Dims": [[256, 64]], "Input type": ["float"]}
    matmul = {"Input Dims": [[512, 64], [64, 512]], "Input type": ["float", "float"]}
    events = [event("ring forward", "user_annotation", 0, 40),
              event("gloo:send", "user_annotation", 0.5, 31.5, shapes),
              event("gloo:recv", "user_annotation", 0.5, 31.5, shapes),
              event("aten::mm", "cpu_op", 1, 30, matmul),
              event(wait_name, "user_annotation", 31.5, wait_ms),
              event(barrier, "user_annotation", 35, 4)]
    raw = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, "traceEvents": events}
    (folder / f"rank-{rank}.json").write_text(json.dumps(raw))


def test_marked_waits_are_the_exposed_communication_and_say_whether_the_block_had_arrived(tmp_path):
    _marked_rank(tmp_path, 0, "ring:wait kv (arrived)", 0.5)
    _marked_rank(tmp_path, 1, "ring:wait kv (in flight)", 3)
    step = rank_traces.load_ranks(tmp_path).step("ring forward")
    summary = step.summary()
    assert summary["waited_us"].tolist() == [4500.0, 7000.0]  # the kv wait and the barrier's 4 ms
    assert summary["exposed_communication_us"].tolist() == summary["waited_us"].tolist()
    assert summary["exchanges"].tolist() == [1, 1] and summary["arrived_before_wait"].tolist() == [1, 0]
    assert summary["compute_us"].tolist() == [30000.0] * 2
    assert step.marks_waits(0) and step.marks_waits(1)
    assert len(step.timeline().axes[0].collections) == 6  # compute, communication and waits, per rank


def test_without_marked_waits_exposed_communication_is_what_compute_did_not_overlap(tmp_path):
    for rank in (0, 1):  # no <name>:wait range in the trace
        _marked_rank(tmp_path, rank, "ring:kv", 0.5, barrier="step:barrier")
    summary = rank_traces.load_ranks(tmp_path).step("ring forward").summary()
    assert summary["waited_us"].isna().all() and (summary["exchanges"] == 0).all()
    assert summary["exposed_communication_us"].tolist() == [1500.0, 1500.0]  # 31.5 ms of gloo, 30 of it under compute


def test_several_steps_give_their_median_their_totals_and_their_time_in_named_ranges(tmp_path):
    # Three one-step folders whose steps take 40, 90 and 60 ms: the median is the 60 ms one.
    steps = [rank_traces.load_ranks(write_rank_folder(tmp_path / str(ms), [12.0, 30.0], ms)).step()
             for ms in (40.0, 90.0, 60.0)]
    assert rank_traces.median_rank_step(steps) is steps[2]
    totals = rank_traces.step_totals(steps)
    assert totals["step_us"].tolist() == [190.0e3, 190.0e3]
    assert totals["compute_us"].tolist() == [36.0e3, 90.0e3]
    assert (totals["hidden_fraction"] == totals["overlap_us"] / totals["communication_us"]).all()
    assert rank_traces.in_ranges(steps, "no such range").tolist() == [0.0, 0.0]
    table = rank_traces.times_ms(totals)
    assert table.loc[0, "step (ms)"] == 190.0 and "step_us" not in table
    for fn in (rank_traces.median_rank_step, rank_traces.step_totals):
        with pytest.raises(ValueError, match="at least one step"):
            fn([])


def test_the_borrowed_rank_pair_loads_from_a_list_of_files_as_from_its_folder(pair):
    from kernels import borrowed

    listed = rank_traces.load_ranks(borrowed.rank_pair())
    assert [r.rank for r in listed.ranks] == [0, 1] and listed.world == pair.world == 128
    assert {r.backend for r in pair.ranks} == {"nccl"} and len(pair.missing) == 126
    assert listed.step().summary().equals(pair.step().summary())
    with pytest.raises(ValueError, match="no such rank trace"):
        rank_traces.load_ranks([ROOT / "no-such-rank-0.json.gz"])
    with pytest.raises(ValueError, match="empty list"):
        rank_traces.load_ranks([])
