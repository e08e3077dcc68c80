"""Chapter 9's own reading (kernels.book.ch09_backward) on Hopper-shaped fixture steps."""
from types import SimpleNamespace
from unittest.mock import patch

import pandas as pd
import pytest

from kernels.book import ch09_backward
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop

pytestmark = pytest.mark.book


def test_backward_kernels_come_from_the_engine_thread():
    steps = {name: hop.step(name, rows) for name, rows in hop.BACKWARD.items()}
    table = ch09_backward.backward_threads(steps, "fixture")
    assert table.loc["sdpa_flash", "backward kernels (engine's thread)"] == 1
    with pytest.raises(LessonFailed):
        ch09_backward.backward_threads({"naive": hop.step("naive", hop.NAIVE)}, "a forward only")


def test_step_table_leaves_out_bookkeeping_nodes_and_their_children():
    from kernels.trace.tables import NESTING

    ops = pd.DataFrame({
        "name": ["aten::matmul", "aten::bmm", "autograd::engine::evaluate_function: ViewBackward0", "ViewBackward0",
                 "aten::view", "autograd::engine::evaluate_function: BmmBackward0", "BmmBackward0", "aten::bmm"],
        "depth": [0, 1, 0, 1, 2, 0, 1, 2]})
    step = SimpleNamespace(ops=ops)
    table = pd.DataFrame({"op": [NESTING * d + n for d, n in zip(ops["depth"], ops["name"])]})
    with patch("kernels.trace.tables.op_table", return_value=table):
        kept = ch09_backward.step_table(step)["op"].str.replace(NESTING, "").tolist()
    assert kept == ["aten::matmul", "aten::bmm", "autograd::engine::evaluate_function: BmmBackward0", "BmmBackward0",
                    "aten::bmm"]


def test_step_table_puts_the_shapes_last():
    from kernels.trace.tables import NESTING

    ops = pd.DataFrame({"name": ["aten::mm"], "depth": [0]})
    table = pd.DataFrame({"op": ["aten::mm"], "input shapes": ["(2, 2) (2, 2)"]})
    with patch("kernels.trace.tables.op_table", return_value=table) as op_table:
        shown = ch09_backward.step_table(SimpleNamespace(ops=ops))
    assert op_table.call_args.kwargs["times"] is False, "one profile's CPU times are not shown"
    assert list(shown.columns) == ["op", "input shapes"] and NESTING not in shown.at[0, "op"]


def test_saved_storages_counts_one_buffer_saved_in_two_shapes():
    from kernels.attention import backward

    inputs = backward.step_inputs(1, 2, 16, 8)
    table = ch09_backward.saved_storages({"naive": inputs})
    probs = table[table["saved as"].str.contains(r"\(1, 2, 16, 16\)", regex=True)]
    assert len(probs) == 1 and "(2, 16, 16)" in probs["saved as"].iloc[0], table
    assert probs["KiB"].iloc[0] == f"{2 * 16 * 16 * 4 // 1024:,}" and probs["what"].iloc[0] == "probabilities"
    assert (table["type"] == "bool").sum() == 1, table  # the causal mask, one for all heads
    assert table.loc[table["type"] == "bool", "what"].tolist() == ["causal mask"]


def test_saved_storages_names_what_a_fused_forward_keeps():
    from kernels.attention import backward

    inputs = backward.step_inputs(1, 2, 16, 8)
    table = ch09_backward.saved_storages({"sdpa_flash": inputs})
    assert "log-sum-exp, one a row" in table["what"].tolist() and "output" in table["what"].tolist(), table
    assert "probabilities" not in table["what"].tolist(), table


def test_phase_table_and_launch_threads_on_the_borrowed_training_step():
    from kernels import borrowed
    from kernels.trace.phases import time_by_phase

    step = borrowed.TRAINING_STEP.step()
    launched = ch09_backward.launch_threads(step)
    assert launched["kernels"].sum() == len(step.gpu_work)
    assert launched["first launch (ms)"].min() == 0
    threads = set(launched.index.get_level_values("thread"))
    assert {"pt_main_thread", "pt_autograd_0"} <= threads, threads
    assert launched.loc[("pt_autograd_0", "backward"), "first launch (ms)"] > 0
    shown = ch09_backward.phase_table(time_by_phase(step))
    assert list(shown.data.columns) == ["GPU ms", "share", "kernels"]
    assert shown.data["kernels"].sum() == len(step.gpu_work)


def test_kept_view_hides_the_shapes_and_rounds_the_mib():
    kept = pd.DataFrame({"S×S kept (trace)": [1], "alive at backward (MiB)": [9.0], "shapes saved": [[(2, 2)]]},
                        index=["naive"])
    shown = ch09_backward.kept_view(kept)
    assert "shapes saved" not in shown.data.columns and "9.00" in shown.to_html()


def test_recompute_view_keeps_every_column_under_a_shorter_header():
    recompute = pd.DataFrame({"bmm in forward": [2], "bmm in backward": [4], "S×S allocations in backward": [4],
                              "largest backward allocation (KiB)": [8192.0]}, index=["naive"])
    shown = ch09_backward.recompute_view(recompute)
    assert shown.shape == recompute.shape and shown.to_numpy().tolist() == recompute.to_numpy().tolist()
    assert all(len(c) <= 25 for c in shown.columns), list(shown.columns)


def test_after_backward_finds_the_optimizer_of_the_borrowed_step():
    from kernels import borrowed

    late = ch09_backward.after_backward(borrowed.TRAINING_STEP.step())
    assert late and all(op.startswith("aten::_foreach_") for op in late), late
    assert ch09_backward.after_backward(borrowed.TRAINING_STEP.step(), thread="no such thread") == []


def test_main_thread_launches_nothing_while_the_engine_runs_the_backward():
    from kernels import borrowed

    main = ch09_backward.main_thread_during_backward(borrowed.TRAINING_STEP.step())
    assert main["during"] == 0 and main["before"] > 0 and main["after"] > 0, main
    assert len(main["communication"]) == 2 and all("Broadcast" in n for n in main["communication"]), main


def test_optimizer_apart_moves_the_updates_out_of_the_forward_row():
    from kernels import borrowed
    from kernels.trace.phases import time_by_phase

    step = borrowed.TRAINING_STEP.step()
    phases = time_by_phase(step)
    apart = ch09_backward.optimizer_apart(phases, step)
    late = ch09_backward.launched_after_backward(step)
    assert list(apart.index) == ["forward", "backward", "optimizer", "communication"]
    assert apart.at["optimizer", "work"] == len(late) > 0
    assert apart.at["forward", "work"] == phases.at["forward", "work"] - len(late)
    assert apart["GPU µs"].sum() == pytest.approx(phases["GPU µs"].sum())
    assert apart["share"].sum() == pytest.approx(phases["share"].sum())
    assert apart.loc[["backward", "communication"]].equals(phases.loc[["backward", "communication"]])
