"""What only chapter 11 (context parallelism) needs: its tables as the page shows them (the
ring's judged cases, the ranks' times per step, the critical path, the real job's step), the
readings of its timing claims, its timelines' legend out of the bars' way, and the credit of
the borrowed rank pair for the page's "Traces on this page" box."""
from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kernels import borrowed
from kernels.parallel import rank_traces


class RankPair:
    """The borrowed two ranks of a 128-rank job, as ``borrowed.traces_box`` takes a trace: its credit."""

    def credit(self) -> str:
        text = borrowed.HTA_RANK_PAIR_CREDIT
        return text[0].upper() + text[1:] + "."


def ring_cases(cases: list, judged: list) -> pd.DataFrame:
    """The ring's judged cases (``programs.judge_ring`` of each), one row a case in seven columns
    (``programs.check_cases`` shows every tensor, in nine): its shape, the tensor (output or
    gradient) closest to its bound, that tensor's error over its bound (under 1 passes), and
    whether every tensor passed."""
    rows = []
    for case, verdicts in zip(cases, judged, strict=True):
        worst = max(verdicts, key=lambda name: verdicts[name].error / verdicts[name].bound)
        rows.append({"layout": case.layout, "causal": case.causal, "S": case.seq, "Hq:Hkv": f"{case.heads}:{case.kv_heads}",
                     "closest to its bound": worst, "error / bound": verdicts[worst].error / verdicts[worst].bound,
                     "ok": verdicts.ok})
    return pd.DataFrame(rows)


def per_step(totals_by_split: dict[str, pd.DataFrame], steps: int) -> pd.DataFrame:
    """``rank_traces.step_totals`` of each split over ``steps`` profiled steps, as the mean of one
    step (the scale of a timeline that draws one step): a row per split and rank, with the
    matrix products' GFLOP (from the recorded shapes) beside the times the prose reads (the
    communication ranges themselves are on the timeline: gloo's bound a transfer, never time it),
    and the idle time (``idle_us``: neither computing, communicating nor waiting) that completes the
    step. GFLOP to 2 decimals, times to 0.1 ms: the step-to-step noise is far larger."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    rows = [{"split": split, "rank": int(rank), "matmul (GFLOP)": round(row["matmul_flop"] / steps / 1e9, 2),
             "compute (ms)": round(row["compute_us"] / steps / 1e3, 1),
             "exposed (ms)": round(row["exposed_communication_us"] / steps / 1e3, 1),
             "idle (ms)": round(row["idle_us"] / steps / 1e3, 1),
             "step (ms)": round(row["step_us"] / steps / 1e3, 1)}
            for split, totals in totals_by_split.items() for rank, row in totals.iterrows()]
    return pd.DataFrame(rows)


def real_step_ms(summary: pd.DataFrame) -> pd.DataFrame:
    """One step's ``RankStep.summary`` of a GPU job in ms, a row per rank: the step, its compute,
    communication, exposed communication, and idle time (no kernel of either kind running)."""
    names = {"step_us": "step (ms)", "compute_us": "compute (ms)", "communication_us": "communication (ms)",
             "exposed_communication_us": "exposed (ms)", "idle_us": "idle (ms)"}
    return (summary[list(names)] / 1e3).rename(columns=names).rename_axis("rank")


def critical_path_ms(path: pd.DataFrame) -> pd.DataFrame:
    """``RankStep.critical_path`` as the page shows it: per round, the rank on the path, its
    compute and exposed communication there, and how much more it computed than the least busy
    rank, in ms. ``matched`` (every rank recorded the same rounds) must hold for the path to be
    the whole story, so it is checked here rather than shown as a column."""
    if not path["matched"].all():
        raise ValueError("the ranks recorded different numbers of communication rounds: the path is a lower bound")
    return pd.DataFrame({"round": path["round"], "rank on the path": path["rank"],
                         "its compute (ms)": (path["compute_us"] / 1e3).round(1),
                         "its exposed (ms)": (path["exposed_us"] / 1e3).round(1),
                         "computed more than the other (ms)": (path["slack_us"] / 1e3).round(1)}).set_index("round")


def legend_above(fig: Figure) -> Figure:
    """A ``RankStep.timeline`` with its legend in a row above the tracks, right-aligned, where it
    covers no bar (inside the axes it hid the end of rank 0's bars), the title left-aligned
    above it, and a little less height (the page is long; two tracks still read clearly)."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    old = ax.get_legend()
    if old is not None:
        old.remove()
    size = float(ax.title.get_fontsize())
    ax.legend(handles, labels, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(labels), frameon=False,
              fontsize="small", borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)
    title = ax.get_title()
    ax.set_title("")
    ax.set_title(title, loc="left", pad=2.2 * size)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height * 0.88)  # two tracks need less height than the library's default
    return fig


def held(outcomes: list) -> bool:
    """Whether a timing claim checked in each profiled step is asserted by ``notebook.timing_claims``'s
    rule (held in at least 80% of the steps): the prose states it only then."""
    if not outcomes:
        raise ValueError("held needs the claim checked in at least one step")
    return sum(bool(o) for o in outcomes) / len(outcomes) >= 0.8


def time_reading(compute_held: bool, wait_held: bool, imbalance: float) -> str:
    """The sentence the page glues after the FLOP count: what the ranks' times showed, saying only
    what the timing claims asserted (``held``) on this run. The time ratio is not the FLOP ratio:
    a rank's compute holds work besides its matrix products, and the two processes need not run
    at the same speed (the zigzag run measures that), so the sentence neither offers it as
    confirming the FLOP ratio nor says where the difference went (idle time takes part of it)."""
    if compute_held and wait_held:
        return (f"its compute took {imbalance:.2f} times rank 0's, a time that on two shared cores also holds how fast "
                "each process ran, so it does not measure that ratio; and rank 0 sat blocked longer")
    if compute_held:
        return (f"its compute took {imbalance:.2f} times rank 0's (a time, not that ratio), but whether rank 0 sat "
                "blocked longer was too noisy to assert on this run (a machine shared with other work moves the waits)")
    waited = ", though rank 0 did sit blocked longer" if wait_held else ""
    return ("the ranks' compute times on this run were too noisy to assert that the last rank computed longer "
            f"(a machine shared with other work moves them){waited}, so the FLOP count is the statement")


def longest_wait_ms(steps: list) -> list[float]:
    """Per step (``rank_traces.RankStep``), the longest exposed communication of any rank, in ms:
    the waiting that step paid for its imbalance."""
    return [float(s.summary()["exposed_communication_us"].max()) / 1e3 for s in steps]


def shorter_waits(contiguous: list, zigzag: list) -> list[bool]:
    """Per zigzag step, whether its longest wait was shorter than the contiguous steps' median one
    (the steps of two runs are not pairs, so each is held against the other run's median)."""
    bar = statistics.median(longest_wait_ms(contiguous))
    return [w < bar for w in longest_wait_ms(zigzag)]


def unequal_speed(steps: list) -> tuple[int, list[bool], float]:
    """For steps whose ranks did the same arithmetic: the rank with the most compute over all the
    steps, per step whether it computed longer than every other rank, and its compute over the
    least's (totals): how far the ranks' speed differs at equal work."""
    tables = [s.summary() for s in steps]
    total = pd.concat(tables).groupby(level=0)["compute_us"].sum()
    slow = int(total.idxmax())
    outcomes = [bool((t["compute_us"].drop(slow) < t.loc[slow, "compute_us"]).all()) for t in tables]
    return slow, outcomes, float(total.max() / total.min())


def zigzag_reading(wait_held: bool, speed_held: bool, slow: int, speed_ratio: float, waits_ms: tuple[float, float],
                   rank0_gflops: tuple[float, float]) -> str:
    """The clause the page glues after the zigzag run: what happened to the waiting, and whether
    the ranks ran at different speeds at equal work, saying only what the timing claims asserted
    (``held``) on this run. ``waits_ms``: the most exposed rank's mean time blocked per step,
    contiguous and zigzag (the largest of the per-step table's "exposed" column for each split, so
    the sentence quotes numbers the reader sees there). ``rank0_gflops``: rank 0's matrix-product FLOPs
    over its compute time in each run, GFLOP/s: the two splits are separate runs, and how fast
    each ran is part of any comparison of their times."""
    before, after = waits_ms
    where = "the most exposed rank's time blocked per step"
    runs = f"separate runs, in which rank 0 computed at {rank0_gflops[0]:.1f} and {rank0_gflops[1]:.1f} GFLOP/s"
    if wait_held:
        waits = f"{where} was {before:.1f} ms contiguous and {after:.1f} ms zigzag ({runs}), not zero"
    else:
        change = "did not fall" if after >= before else "did not clearly fall"
        waits = f"{where} {change} ({before:.1f} ms contiguous, then {after:.1f} ms zigzag; {runs})"
    if speed_held:
        return waits + f", and at equal FLOPs rank {slow}'s compute took {speed_ratio:.2f} times the other's"
    return waits + ", and at equal FLOPs the ranks' compute times differed by no more than the step-to-step noise"


def typical_step(steps: list, agrees: list | None = None):
    """The step to draw: the one whose ranks' compute times lie closest to each rank's median over
    the steps (summed distance in log time), among the steps where ``agrees`` (the page's per-step
    claims held in it) when any did. On a loaded machine one rank can run several times slower in
    a single step; picking by the slowest rank's time (``rank_traces.median_rank_step``) can then
    draw exactly that outlier, the step the per-step claims describe the opposite of."""
    if not steps:
        raise ValueError("typical_step needs at least one step")
    if agrees is not None and len(agrees) != len(steps):
        raise ValueError(f"agrees has {len(agrees)} entries for {len(steps)} steps")
    candidates = [i for i in range(len(steps)) if agrees is None or agrees[i]] or list(range(len(steps)))
    tables = [s.summary()["compute_us"] for s in steps]
    medians = pd.concat(tables, axis=1).median(axis=1)

    def distance(compute: pd.Series) -> float:
        ratio = (compute.clip(lower=1.0) / medians.clip(lower=1.0)).astype(float)
        return float(abs(np.log(ratio)).sum())

    return steps[min(candidates, key=lambda i: distance(tables[i]))]


def step_reading(summary: pd.DataFrame) -> str:
    """What one drawn step shows, from its ``RankStep.summary``: of each rank's step, its compute, the
    time it sat blocked, the time inside communication ranges only (the rest of its busy time) and
    the time it was idle (neither computing, communicating nor waiting; on two shared cores a rank's
    process is not always running): the four make up the step."""
    def part(row) -> str:
        only_comm = max(0.0, row.step_us - row.idle_us - row.compute_us - row.exposed_communication_us)
        return (f"compute {row.compute_us / 1e3:.1f}, blocked {row.exposed_communication_us / 1e3:.1f}, "
                f"in gloo's ranges only {only_comm / 1e3:.1f}, idle {row.idle_us / 1e3:.1f}")

    parts = "; ".join(f"rank {int(r)}'s {row.step_us / 1e3:.1f} ms: {part(row)}" for r, row in summary.iterrows())
    return f"In the step drawn (ms), {parts}. A process sharing two cores is not always running."


def largest_single_ms(steps: list, prefixes: tuple[str, ...]) -> float:
    """The longest time any one rank spent in ranges named by ``prefixes`` within a single step, in
    ms (``rank_traces.in_ranges`` of each step alone): a maximum, not a mean over the steps."""
    return max(float(rank_traces.in_ranges([s], p).max()) for s in steps for p in prefixes) / 1e3


def in_mib(table: pd.DataFrame) -> pd.DataFrame:
    """A table of byte counts (columns named "... (bytes)") as the page shows it: in MiB, to two
    decimals, a byte count of a million digits being unreadable at a glance."""
    return pd.DataFrame({name.replace("(bytes)", "(MiB)"): (table[name] / 2**20).round(2) for name in table.columns},
                        index=table.index)


def asserted_agreement(claims: list[list]) -> list[bool] | None:
    """Per step, whether every claim the page asserts on this run (``held``: the ✔ lines) held in
    it, from each claim's outcomes per step; None when the run asserted none of them. A claim the
    run could not assert (a note says "not asserted", or the steps contradict it) must not pick
    the step the page draws: the prose would lean on a claim the page did not make."""
    asserted = [outcomes for outcomes in claims if held(outcomes)]
    if not asserted:
        return None
    if len({len(outcomes) for outcomes in asserted}) != 1:
        raise ValueError("every claim must be checked in the same steps")
    return [all(bool(o) for o in step) for step in zip(*asserted)]


def drawn_rule(agrees: list | None) -> str:
    """How ``typical_step`` chose the step the page draws, given per step whether the ✔ timing
    claims held in it (``asserted_agreement``; None when the run asserted none): the clause the
    prose glues, true whichever way the run went."""
    closest = "the one whose ranks' compute times lie closest to their medians"
    if agrees is None:
        return f"{closest}, over all the steps"
    held_in = sum(bool(a) for a in agrees)
    if held_in:
        return f"of the {held_in} of {len(agrees)} steps in which the ✔ timing lines below all held, {closest}"
    return f"{closest} (the ✔ timing lines below held together in none of the {len(agrees)} steps)"


def overlap_reading(transfer_ms: float, kv_wait_ms: float, hid: bool) -> str:
    """The clause the page glues about the ring's overlap on CPU ranks: the longest span of gloo's
    ranges around one K/V exchange and the longest wait for the block after the local attention,
    each the largest of any one rank in any one step (``largest_single_ms``). What the wait was
    spent on (the helper thread, the block having arrived) is said only when the wait prints as
    more than zero and the ✔ line that the block had arrived was asserted (``hid``)."""
    spans = f"the gloo ranges around one K/V exchange spanned at most {transfer_ms:.1f} ms"
    if f"{kv_wait_ms:.1f}" == "0.0":
        return spans + ", and no rank's wait for the block after its local attention reached 0.05 ms"
    waited = f"{spans}, and a rank's wait for the block after its local attention at most {kv_wait_ms:.1f} ms"
    if hid:
        return waited + ("; where the block had arrived (the ✔ line above), such a wait is for the rank's helper "
                         "thread, scheduled on this machine's two shared cores, not for the transfer")
    return waited + " (whether the block had always arrived by then was too noisy to assert on this run)"


def contradicted(outcomes: list) -> bool:
    """Whether the profiled steps contradict a timing claim (it held in at most 20% of them, the
    share at which ``notebook.timing_claims`` fails): the page then says so instead of asserting it."""
    if not outcomes:
        raise ValueError("contradicted needs the claim checked in at least one step")
    return sum(bool(o) for o in outcomes) / len(outcomes) <= 0.2


def contradicted_note(claims: list) -> str:
    """The note a page shows for the (held per step, claim, evidence) claims this run contradicted,
    or "" when none was."""
    against = [f"{claim} (held in {sum(bool(h) for h in held)} of {len(held)} profiled steps)"
               for held, claim, _ in claims if contradicted(held)]
    if not against:
        return ""
    return ("Contradicted on this run (two processes sharing two cores need not run at the same speed; the "
            "zigzag run measures it): " + "; ".join(against))
