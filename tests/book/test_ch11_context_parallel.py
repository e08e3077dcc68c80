"""Chapter 11's own page helpers (kernels.book.ch11_context_parallel): its per-step rank table, the
rule that decides what its timing sentence may say, and the borrowed rank pair's credit."""
import pandas as pd
import pytest

from kernels import borrowed
from kernels.book import ch11_context_parallel as page
from kernels.parallel import rank_traces

pytestmark = pytest.mark.book


def totals(step_ms: float) -> pd.DataFrame:
    row = {c: 0.0 for c in rank_traces.TIME_COLUMNS} | {"step_us": step_ms * 1e3, "compute_us": step_ms * 500,
                                                        "exchanges": 6}
    return pd.DataFrame([row, row]).rename_axis("rank")


def test_per_step_ms_is_the_mean_of_one_step_and_says_so():
    table = page.per_step_ms(totals(600.0), 6)
    assert list(table.columns)[:2] == ["step", "compute"] and "exposed" in table.columns
    assert table.columns.name == "ms per step (mean of 6)"
    assert len(table.columns) == len(rank_traces.TIME_COLUMNS) <= 7  # counts like exchanges stay out
    assert table["step"].tolist() == [100.0, 100.0]
    with pytest.raises(ValueError):
        page.per_step_ms(totals(600.0), 0)


def test_held_follows_timing_claims_rule():
    assert page.held([True] * 5 + [False])        # 5 of 6: asserted
    assert not page.held([True] * 4 + [False] * 2)  # 4 of 6: not asserted
    with pytest.raises(ValueError):
        page.held([])


def test_time_reading_says_only_what_held():
    both = page.time_reading(True, True, 1.234)
    assert "1.23 times" in both and "noisy" not in both
    compute_only = page.time_reading(True, False, 1.234)
    assert "1.23 times" in compute_only and "too noisy" in compute_only
    waits_only = page.time_reading(False, True, 1.234)
    assert "1.23" not in waits_only and "too noisy" in waits_only and "did spend longer waiting" in waits_only
    neither = page.time_reading(False, False, 1.234)
    assert "too noisy" in neither and "waiting" not in neither


def test_rank_pair_goes_in_the_traces_box():
    html = borrowed.traces_box_html({"HTA ranks 0 and 1": page.RankPair()})
    assert "Traces on this page" in html and "128-rank training job" in html
    assert page.RankPair().credit()[0].isupper() and page.RankPair().credit().endswith(".")
