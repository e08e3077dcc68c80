"""Chapter 2's own check (kernels/book/ch02_inplace.py) on the synthetic A100 forwards of
tests/gpu_trace.py: it holds on the article's six and five activities, and fails on an
"in-place" forward that still copies (tests/trace/test_recorded.py runs the chapter on such a
recording too)."""
import pytest

from kernels.book.ch02_inplace import inplace_drops_the_copy_on_gpu
from kernels.notebook import LessonFailed
from kernels.trace import reader
from tests.gpu_trace import forward_trace


def a100_step(label: str, rows=None):
    return reader.load_trace(forward_trace(label, rows=rows)).steps(label)[0]


def test_six_activities_become_five_and_the_copy_is_the_one_that_went(capsys):
    inplace_drops_the_copy_on_gpu({"naive": a100_step("naive"), "inplace": a100_step("inplace")}, "fixture A100")
    assert "✔ the GPU track goes from 6 activities to 5" in capsys.readouterr().out


def test_an_inplace_forward_that_still_copies_fails():
    from tests.gpu_trace import NAIVE_A100
    with pytest.raises(LessonFailed, match="6 activities to 5"):
        inplace_drops_the_copy_on_gpu({"naive": a100_step("naive"), "inplace": a100_step("inplace", rows=NAIVE_A100)})


def test_copy_groups_read_with_their_target_type_and_no_bare_zero():
    import pandas as pd
    from kernels.book.ch02_inplace import copies_for_reading
    groups = pd.DataFrame({"module": ["Norm", "Norm", "Rotary"], "call": ["Tensor.to"] * 3,
                           "dtype": ["float", "c10::BFloat16", "float"], "shape": ["4×8", "4×8", "1×9"],
                           "count": [49, 49, 1], "MiB total": [1712.0, 856.0, 0.0], "GPU µs": [1432.0, 898.4, 2.6]})
    shown = copies_for_reading(groups).data
    assert shown["module: call"].tolist() == ["Norm: .to(float32)", "Norm: .to(bfloat16)", "Rotary: .to(float32)"]
    assert shown["MiB total"].tolist() == ["1,712", "856", "< 0.1"]
    assert shown["GPU µs"].tolist() == ["1,432", "898", "2.6"]
