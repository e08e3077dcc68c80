"""What only chapter 11 (context parallelism) needs: its tables as the page shows them (the
ring's judged cases, one rank table per step), the sentence its timing reading glues, and the
credit of the borrowed rank pair for the page's "Traces on this page" box."""
from __future__ import annotations

import pandas as pd

from kernels import borrowed
from kernels.parallel import programs, rank_traces


class RankPair:
    """The borrowed two ranks of a 128-rank job, as ``borrowed.traces_box`` takes a trace: its credit."""

    def credit(self) -> str:
        text = borrowed.HTA_RANK_PAIR_CREDIT
        return text[0].upper() + text[1:] + "."


def ring_cases(group, cases: list, device: str, dtype: str) -> pd.DataFrame:
    """``programs.check_cases``, one row a case in seven columns: its shape, the tensor (output or
    gradient) closest to its bound, that tensor's error over its bound (under 1 passes), and
    whether every tensor passed."""
    rows = []
    for case in cases:
        judged = programs.judge_ring(group.run(programs.ring_check, case.with_(device=device, dtype=dtype)),
                                     case.with_(dtype=dtype))
        worst = max(judged, key=lambda name: judged[name].error / judged[name].bound)
        rows.append({"layout": case.layout, "causal": case.causal, "S": case.seq, "Hq:Hkv": f"{case.heads}:{case.kv_heads}",
                     "closest to its bound": worst, "error / bound": judged[worst].error / judged[worst].bound,
                     "ok": judged.ok})
    return pd.DataFrame(rows)


def per_step_ms(totals: pd.DataFrame, steps: int) -> pd.DataFrame:
    """``rank_traces.step_totals`` over ``steps`` profiled steps as the mean of one step, in ms
    (the scale of a timeline that draws one step); the header says so, the columns stay short."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    table = totals[rank_traces.TIME_COLUMNS] / steps / 1e3
    table = table.rename(columns=lambda c: c.removesuffix("_us").removesuffix("_communication").replace("_", " "))
    return table.rename_axis(columns=f"ms per step (mean of {steps})")


def held(outcomes: list) -> bool:
    """Whether a timing claim checked in each profiled step is asserted by ``notebook.timing_claims``'s
    rule (held in at least 80% of the steps): the prose states it only then."""
    if not outcomes:
        raise ValueError("held needs the claim checked in at least one step")
    return sum(bool(o) for o in outcomes) / len(outcomes) >= 0.8


def time_reading(compute_held: bool, wait_held: bool, imbalance: float) -> str:
    """The sentence the page glues after the FLOP count: what the ranks' times showed, saying only
    what the timing claims asserted (``held``) on this run."""
    if compute_held and wait_held:
        return (f"its compute took {imbalance:.2f} times rank 0's (a diagonal block, computed whole and then masked, "
                "costs more than its share of pairs), and rank 0 spent the difference waiting at the step's end")
    if compute_held:
        return (f"its compute took {imbalance:.2f} times rank 0's, but where rank 0 spent the difference was too noisy "
                "to assert on this run (a machine shared with other work moves the waits)")
    waited = ", though rank 0 did spend longer waiting at the step's end" if wait_held else ""
    return ("the ranks' compute times on this run were too noisy to assert that the last rank computed longer "
            f"(a machine shared with other work moves them){waited}, so the FLOP count is the statement")
