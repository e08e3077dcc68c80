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
