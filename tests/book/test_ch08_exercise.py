"""Exercise 8's trace-reading check (kernels.exercises.block.check_scores_buffers): the course's
answer passes, the usual misreadings of the trace fail in words, and no message gives the count."""
import re

import pytest

from kernels.exercises import ExerciseFailed
from kernels.exercises import block as exb

pytestmark = pytest.mark.book


def _size(q_shape, element_size):
    b, h, s, _ = q_shape
    return b * h * s * s * element_size


def _in_range(trace, q_shape, element_size):
    return int((trace.steps("block.attention")[0].memory["bytes"] == _size(q_shape, element_size)).sum())


def _whole_trace(trace, q_shape, element_size):
    return int((trace.memory["bytes"] == _size(q_shape, element_size)).sum())


def _frees_too(trace, q_shape, element_size):
    return int((trace.steps("block.attention")[0].memory["bytes"].abs() == _size(q_shape, element_size)).sum())


def _every_size(trace, q_shape, element_size):
    return int((trace.steps("block.attention")[0].memory["bytes"] > 0).sum())


def test_the_course_answer_passes(tmp_path):
    exb.check_scores_buffers(_in_range, seed=5, trace_dir=tmp_path)


@pytest.mark.parametrize("wrong, words", [(_whole_trace, "outside block.attention"), (_frees_too, "frees too"),
                                          (_every_size, "every size"), (lambda *a: None, "return a count")])
def test_misreadings_fail_in_words_without_the_count(wrong, words, tmp_path):
    with pytest.raises(ExerciseFailed, match=words) as failed:
        exb.check_scores_buffers(wrong, seed=5, trace_dir=tmp_path)
    assert not re.search(r"\b(want|expected|should be|the answer is)\b", str(failed.value)), failed.value
