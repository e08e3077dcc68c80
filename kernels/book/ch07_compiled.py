"""What only chapter 7 (compiled attention) needs: the reading of a GPU run's compiled and flex
forwards (the book's own recording branch), the sentence that says what timing the graph
break apart from the unbroken compile shows on this run, by the appendix's rule, and the words
and tables the page shows for Dynamo's counters, a guessed op list and the generated kernels."""
from __future__ import annotations

from typing import Callable

import pandas as pd
import torch

from kernels.bench import timing
from kernels.bench.plots import NOISY_SPREAD
from kernels.book.gpu_kernels import names_text
from kernels.notebook import lesson, readable
from kernels.trace import fingerprints


def compiled_forward(kernels: pd.DataFrame) -> pd.DataFrame:
    """The compiled naive forward runs Inductor's Triton kernels and no copy; returns the
    kernels' fingerprints."""
    styles = [fingerprints.inductor_style(n) for n in kernels["name"]]
    lesson(any(s is not None for s in styles) and (kernels["cat"] != "gpu_memcpy").all(),
           "on the GPU the compiled forward runs Inductor's Triton kernels and no copy", names_text(kernels))
    return fingerprints.classify_many(kernels["name"])


def flex_forward(kernels: pd.DataFrame) -> pd.DataFrame:
    """A compiled flex forward is one FlexAttention template kernel (Inductor's triton_tem_)."""
    templates = sum(fingerprints.inductor_style(n) == "tem" for n in kernels["name"])
    lesson(templates == 1, "on the GPU, a flex forward runs one FlexAttention template kernel", names_text(kernels))
    return fingerprints.classify_many(kernels["name"])[["name", "kind", "family", "note"]]


def timed(fn: Callable[[], object], device: torch.device, reps: int = 21) -> tuple[float, float, float]:
    """(median, p10, p90) in ms of ``reps`` calls of ``fn`` after a warm-up, as ``kernels.bench``
    times (the measuring appendix's rule)."""
    timing.warm_up(fn, device, calls=3, budget_ms=1000)
    return timing.spread(timing.time_calls(fn, device, reps=reps))


def break_timing(unbroken: tuple[float, float, float], broken: tuple[float, float, float]) -> str:
    """The one sentence the page says about the two timings (each (median, p10, p90) in ms): no
    number where either fails the spread check, no ranking where their spreads overlap."""
    def quoted(t):
        return f"{readable(t[0])} ms ({readable(t[1])} to {readable(t[2])})"

    noisy = [name for name, t in (("unbroken", unbroken), ("broken", broken)) if t[2] > NOISY_SPREAD * t[1]]
    if noisy:
        return (f"Timed apart, the {' and '.join(noisy)} forward's calls failed the spread check on this run "
                "(the 90th percentile beyond twice the 10th): the machine was too busy to time the break.")
    head = f"Timed apart (median and p10 to p90 of many calls), the unbroken forward took {quoted(unbroken)}, " \
           f"the broken one {quoted(broken)}"
    if unbroken[2] < broken[1]:
        return head + ": the break cost time as well as memory on this run."
    if broken[2] < unbroken[1]:
        return head + (": on this run the broken forward was the faster. What a break costs in time depends "
                       "on the machine and the size; what it costs in memory (above) does not.")
    return head + (": the spreads overlap, so on this CPU the break's time cost is lost in the noise, "
                   "while its memory cost (above) is not.")


def compiles_text(compiles) -> str:
    """What a ``torch_compile.Compiles`` count says, in words a reader reads: "1 graph compiled
    (found in Inductor's cache)", "0 graphs compiled", "1 graph compiled (generated)"."""
    graphs = f"{compiles.graphs} graph" + ("" if compiles.graphs == 1 else "s")
    if not compiles.graphs:
        return f"{graphs} compiled"
    where = [f"{compiles.cache_hits} from Inductor's cache"] * bool(compiles.cache_hits) \
        + [f"{compiles.cache_misses} generated"] * bool(compiles.cache_misses)
    return f"{graphs} compiled ({', '.join(where) or 'none through Inductor'})" \
        + (f", {compiles.gave_up} given up" if compiles.gave_up else "")


def first_call_text(first, later_first_s: float) -> str:
    """The sentence that says what a first call's time (``first``: a ``timed_compiles`` result)
    paid for, by Dynamo's counters: a cache load (nothing generated) or a compile. ``later_first_s``
    is the next module's first call, which pays no start-up of its own."""
    if first.first.graphs and not first.first.cache_misses:
        return (f"By the counters nothing was generated: the graph came from Inductor's on-disk cache, so "
                f"these {first.first_s:.2f} s are a cache load plus Dynamo and Inductor's start-up on "
                f"first use (the in-place module's first call, right after, took {later_first_s:.2f} s). "
                "A cold compile costs more: point `TORCHINDUCTOR_CACHE_DIR` at an empty folder to see one.")
    return (f"By the counters the graph was generated and compiled here, so these {first.first_s:.2f} s are "
            f"a cold compile, Dynamo and Inductor's start-up included (the in-place module's first call, "
            f"right after, took {later_first_s:.2f} s).")


def ops_present(guess: list[str], seen: list[str]) -> str:
    """A guessed list of op names answered as a multiset (which ops and how many times, never
    where): each guessed op with the count the trace has, and the trace's ops nobody guessed."""
    from collections import Counter

    guessed, there = Counter(guess), Counter(seen)
    said = [f"{op} ×{n}: " + ("✔" if there[op] == n else f"the trace has ×{there[op]}" if there[op] else "not there")
            for op, n in guessed.items()]
    missed = [f"{op} ×{n}" for op, n in there.items() if op not in guessed]
    return "; ".join(said) + (f". Not guessed: {', '.join(missed)}." if missed else ". Nothing unguessed.")


def kernels_table(generated: pd.DataFrame) -> pd.DataFrame:
    """``torch_compile.generated_kernels``'s rows as the page shows them: the kernel's name and the
    ops its name says it fused (as text), rows numbered by nothing (its time is the op table's)."""
    return pd.DataFrame({"kernel": list(generated["name"]),
                         "ops it fused": [", ".join(f) for f in generated["fused"]]})


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """A trace table with the book's column names (``dur_us`` -> "time (µs)") and no row numbers
    left by a filter."""
    return table.rename(columns={"dur_us": "time (µs)"}).reset_index(drop=True)


def memory_table(steps, scores_bytes: int) -> pd.DataFrame:
    """``torch_compile.memory_table`` with its counts as whole numbers."""
    from kernels.attention import torch_compile

    table = torch_compile.memory_table(steps, scores_bytes)
    return table.astype({"S×S buffers allocated": int, "copies of S×S": int})


def steady_text(first_s: float, steady: tuple[float, float, float]) -> str:
    """The clause that quotes the benchmarked steady call (``steady``: median, p10, p90 in ms) and
    how many of them the first call (``first_s`` seconds) cost; no number where the timed calls
    fail the spread check."""
    median, p10, p90 = steady
    if p90 > NOISY_SPREAD * p10:
        return ("the steady calls failed the spread check on this run (the machine was busy), so no count of "
                "steady calls is quoted; the first call is still seconds against milliseconds")
    return (f"a call takes {readable(median)} ms (median of many timed calls, {readable(p10)} to {readable(p90)} ms "
            f"from the 10th to the 90th percentile), so the first call cost as much as "
            f"{first_s / (1e-3 * median):,.0f} steady calls")
