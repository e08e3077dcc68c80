"""Chapter 11's own page helpers (kernels.book.ch11_context_parallel): its per-step rank tables,
the critical path and the real step as the page shows them, the rules that decide what its timing
sentences may say, the timelines' legend, and the borrowed rank pair's credit."""
import pandas as pd
import pytest

from kernels import borrowed
from kernels.book import ch11_context_parallel as page
from kernels.parallel import rank_traces

pytestmark = pytest.mark.book


def totals(step_ms: float) -> pd.DataFrame:
    row = {c: 0.0 for c in rank_traces.TIME_COLUMNS} | {"step_us": step_ms * 1e3, "compute_us": step_ms * 500,
                                                        "exchanges": 6, "matmul_flop": 6e9, "idle_us": 0.0}
    return pd.DataFrame([row, row]).rename_axis("rank")


def test_per_step_is_the_mean_of_one_step_a_row_per_split_and_rank():
    table = page.per_step({"contiguous": totals(600.0), "zigzag": totals(60.0)}, 6)
    assert len(table.columns) <= 7 and list(table.columns[:2]) == ["split", "rank"]
    assert table["step (ms)"].tolist() == [100.0, 100.0, 10.0, 10.0]
    assert table["compute (ms)"].tolist() == [50.0, 50.0, 5.0, 5.0]
    assert table["matmul (GFLOP)"].tolist() == [1.0] * 4
    assert table["rank"].tolist() == [0, 1, 0, 1]
    assert table["idle (ms)"].tolist() == [0.0] * 4
    with pytest.raises(ValueError):
        page.per_step({"contiguous": totals(600.0)}, 0)


class FakeStep:
    """What the readings take of a ``rank_traces.RankStep``: its summary."""

    def __init__(self, compute_ms, exposed_ms, idle_ms=(0.0, 0.0)):
        self.table = pd.DataFrame({"compute_us": [c * 1e3 for c in compute_ms],
                                   "exposed_communication_us": [e * 1e3 for e in exposed_ms],
                                   "idle_us": [i * 1e3 for i in idle_ms]}).rename_axis("rank")
        self.table["step_us"] = self.table.sum(axis=1)

    def summary(self):
        return self.table.copy()


def test_the_waits_and_the_speed_are_read_per_step():
    contiguous = [FakeStep([10, 20], [9, 1]), FakeStep([10, 20], [8, 1]), FakeStep([10, 20], [7, 1])]
    zigzag = [FakeStep([12, 15], [4, 1]), FakeStep([12, 15], [9, 1]), FakeStep([16, 15], [3, 1])]
    assert page.longest_wait_ms(contiguous) == [9.0, 8.0, 7.0]
    assert page.shorter_waits(contiguous, zigzag) == [True, False, True]  # against the median, 8 ms
    slow, outcomes, ratio = page.unequal_speed(zigzag)
    assert slow == 1 and outcomes == [True, True, False] and ratio == pytest.approx(45 / 40)


def test_readings_say_only_what_held():
    both = page.time_reading(True, True, 1.234)
    assert "1.23 times" in both and "noisy" not in both and "diagonal" not in both
    # the time ratio is not offered as the FLOP ratio, nor the difference as spent waiting
    assert "does not measure" in both and "difference" not in both and "sat blocked longer" in both
    compute_only = page.time_reading(True, False, 1.234)
    assert "1.23 times" in compute_only and "too noisy" in compute_only and "difference" not in compute_only
    waits_only = page.time_reading(False, True, 1.234)
    assert "1.23" not in waits_only and "too noisy" in waits_only and "did sit blocked longer" in waits_only
    neither = page.time_reading(False, False, 1.234)
    assert "too noisy" in neither and "waiting" not in neither
    fell = page.zigzag_reading(True, True, 1, 1.28, (8.7, 5.7), (6.7, 13.8))
    assert "8.7 ms contiguous and 5.7 ms zigzag" in fell and "rank 1" in fell and "1.28 times" in fell
    assert "not zero" in fell and "separate runs" in fell and "6.7 and 13.8 GFLOP/s" in fell
    flat = page.zigzag_reading(False, False, 1, 1.02, (8.7, 8.1), (6.7, 6.9))
    assert "did not clearly fall" in flat and "1.02" not in flat and "noise" in flat
    assert "8.7 ms contiguous, then 8.1 ms zigzag" in flat
    assert "did not fall" in page.zigzag_reading(False, True, 0, 1.3, (8.7, 9.5), (6.7, 6.9))


def test_held_follows_timing_claims_rule():
    assert page.held([True] * 5 + [False])        # 5 of 6: asserted
    assert not page.held([True] * 4 + [False] * 2)  # 4 of 6: not asserted
    with pytest.raises(ValueError):
        page.held([])


def test_the_critical_path_and_the_real_step_in_ms_with_named_columns():
    path = pd.DataFrame({"round": [0, 1], "rank": [1, 1], "compute_us": [1000.0, 2000.0], "exposed_us": [0.0, 500.0],
                         "slack_us": [250.0, 1000.0], "matched": [True, True]})
    shown = page.critical_path_ms(path)
    assert shown["its compute (ms)"].tolist() == [1.0, 2.0] and "matched" not in shown.columns
    with pytest.raises(ValueError):
        page.critical_path_ms(path.assign(matched=False))
    summary = pd.DataFrame({"step_us": [600e3], "compute_us": [100e3], "communication_us": [200e3],
                            "exposed_communication_us": [170e3], "idle_us": [320e3], "overlap_us": [30e3]}).rename_axis("rank")
    real = page.real_step_ms(summary)
    assert list(real.columns) == ["step (ms)", "compute (ms)", "communication (ms)", "exposed (ms)", "idle (ms)"]
    assert real.loc[0, "idle (ms)"] == 320.0


def test_the_timeline_legend_moves_above_the_tracks():
    from kernels.parallel.rank_traces import COLOURS
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    for i, kind in enumerate(COLOURS):
        ax.broken_barh([(0, 1)], (i, 0.5), color=COLOURS[kind], label=kind)
    ax.set_title("a step")
    ax.legend(loc="upper right")
    page.legend_above(fig)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legend = ax.get_legend()
    assert legend.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1 - 1
    assert [t.get_text() for t in legend.get_texts()] == list(COLOURS)


def test_rank_pair_goes_in_the_traces_box():
    html = borrowed.traces_box_html({"HTA ranks 0 and 1": page.RankPair()})
    assert "Traces on this page" in html and "128-rank training job" in html
    assert page.RankPair().credit()[0].isupper() and page.RankPair().credit().endswith(".")


def test_the_step_drawn_is_typical_among_those_the_claims_describe():
    steps = [FakeStep([10, 20], [9, 1]), FakeStep([30, 10], [1, 20]), FakeStep([11, 19], [8, 1]),
             FakeStep([12, 22], [9, 2]), FakeStep([9, 21], [8, 1])]
    # rank medians 11 and 20: the step (11, 19) is nearest; the outlier (30, 10) is never drawn
    assert page.typical_step(steps) is steps[2]
    assert page.typical_step(steps, [True, False, False, True, True]) is steps[0]
    assert page.typical_step(steps, [False] * 5) is steps[2]  # none agreed: the nearest of all
    with pytest.raises(ValueError):
        page.typical_step(steps, [True])
    with pytest.raises(ValueError):
        page.typical_step([])
    drawn = FakeStep([30, 10], [1, 20], [4, 5]).summary()
    drawn["step_us"] += [2e3, 0.0]  # rank 0 also spent 2 ms in communication ranges only
    reading = page.step_reading(drawn)
    assert reading.startswith("In the step drawn")
    assert "rank 0's 37.0 ms: compute 30.0, blocked 1.0, in gloo's ranges only 2.0, idle 4.0" in reading
    assert "rank 1's 35.0 ms: compute 10.0, blocked 20.0, in gloo's ranges only 0.0, idle 5.0" in reading
    assert page.drawn_rule([True, False, True]).startswith("of the 2 of 3 steps")
    assert "none of the 3 steps" in page.drawn_rule([False] * 3)


def test_byte_counts_read_at_a_glance():
    sent = pd.DataFrame({"from the shapes (bytes)": [1048576, 3 * 2**19]}, index=["ring", "ulysses"])
    shown = page.in_mib(sent)
    assert list(shown.columns) == ["from the shapes (MiB)"] and shown.iloc[:, 0].tolist() == [1.0, 1.5]


def test_the_largest_single_range_is_a_maximum_not_a_mean():
    class Ranged:
        ranks = [0, 1]

        def __init__(self, waits_ms):
            self.activity = [pd.DataFrame({"name": ["ring:wait kv (arrived)", "gloo:send"], "ts": [0.0, 0.0],
                                           "end": [w * 1e3, 1e3]}) for w in waits_ms]

    steps = [Ranged([2, 1]), Ranged([36, 1]), Ranged([1, 3])]
    assert page.largest_single_ms(steps, ("ring:wait kv",)) == 36.0  # the mean of rank 0's would be 13
    assert page.largest_single_ms(steps, ("gloo:send", "gloo:recv")) == 1.0


def test_a_claim_the_steps_contradict_is_said_not_asserted():
    assert page.contradicted([True] + [False] * 4) and not page.contradicted([True, True] + [False] * 3)
    with pytest.raises(ValueError):
        page.contradicted([])
    claims = [([True] * 5, "held", ""), ([False] * 4 + [True], "rank 0 waits longer", "x")]
    note = page.contradicted_note(claims)
    assert "rank 0 waits longer (held in 1 of 5 profiled steps)" in note and "held (" not in note
    assert page.contradicted_note(claims[:1]) == ""


def test_only_asserted_claims_pick_the_step_drawn():
    asserted = [True, True, True, True, False]       # 4 of 5: a ✔ line
    undecided = [True, False, True, False, False]    # 2 of 5: "not asserted"
    contradicted = [False, False, False, False, True]  # 1 of 5: the steps contradict it
    assert page.asserted_agreement([asserted, undecided, contradicted]) == asserted
    assert page.asserted_agreement([undecided, contradicted]) is None
    assert page.asserted_agreement([asserted, [True, False, True, True, True]]) == [True, False, True, True, False]
    with pytest.raises(ValueError):
        page.asserted_agreement([asserted, [True] * 4])
    rule = page.drawn_rule(None)
    assert "closest to their medians" in rule and "✔" not in rule and "held" not in rule
    assert page.drawn_rule(asserted).startswith("of the 4 of 5 steps in which the ✔ timing lines below all held")


def test_the_overlap_reading_names_the_helper_thread_only_under_a_wait_it_shows():
    zero = page.overlap_reading(3.21, 0.04, True)
    assert "3.2 ms" in zero and "helper thread" not in zero and "0.0 ms" not in zero and "0.05 ms" in zero
    waited = page.overlap_reading(3.21, 1.26, True)
    assert "at most 1.3 ms" in waited and "helper thread" in waited and "too noisy" not in waited
    noisy = page.overlap_reading(3.21, 1.26, False)
    assert "helper thread" not in noisy and "too noisy" in noisy
