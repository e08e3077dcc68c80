"""What only chapter 7 (compiled attention) needs: the reading of a GPU run's compiled and flex
forwards (the book's own recording branch), timing eager, compiled and broken forwards in turns on
rotated inputs and the sentences that say what that shows on this run (a ranking only where the
round-by-round ratio stays on one side of 1, never an absolute time), and the words and tables the
page shows for Dynamo's counters, a guessed op list and a borrowed compiled call."""
from __future__ import annotations

import pandas as pd

from kernels.bench import timing
from kernels.bench.comparison import ratio_spread
from kernels.book.gpu_kernels import names_text
from kernels.notebook import lesson
from kernels.reference import number
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


def ratio_text(times: dict[str, list[float]], over: str, under: str) -> str:
    """The clause that says what the round-by-round ratio of ``over`` to ``under`` shows: a ranking
    only when the ratio stays on one side of 1 from its 10th to its 90th percentile."""
    r = ratio_spread(times, over, under)
    said = f"the {over} call took {r[0]:.2f}× the {under} call's time ({r[1]:.2f}× to {r[2]:.2f}×, p10 to p90)"
    if r[2] < 1:
        return said + f": the {over} forward is the faster here, in 9 rounds of 10 or more"
    if r[1] > 1:
        return said + f": the {under} forward is the faster here, in 9 rounds of 10 or more"
    return said + ": the ratio straddles 1, so this run does not rank them"


def break_timing(times: dict[str, list[float]]) -> str:
    """The sentence the page says about the graph break's time (``times``: ``comparison.in_turns``
    of "unbroken" and "broken"): a ranking only where the round-by-round ratio allows one."""
    return (f"Timed apart from the profiler in {len(times['broken'])} rounds, "
            + ratio_text(times, "broken", "unbroken") + ".")


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
        return ("By the counters nothing was generated: a cache load from Inductor's on-disk cache plus the "
                f"compilers' start-up (the in-place module's first call, right after, took {later_first_s:.2f} s). "
                "A cold compile costs more: point `TORCHINDUCTOR_CACHE_DIR` at an empty folder to see one.")
    return ("By the counters the graph was generated here: a cold compile, the compilers' start-up included "
            f"(the in-place module's first call, right after, took {later_first_s:.2f} s).")


def ops_present(guess: list[str], seen: list[str]) -> str:
    """A guessed list of op names answered as a multiset (which ops and how many times, never
    where): each guessed op with the count the trace has (those it lacks named together), and the
    trace's ops nobody guessed."""
    from collections import Counter

    guessed, there = Counter(guess), Counter(seen)
    said = [f"{op} ×{n} " + ("✔" if there[op] == n else f"(the trace has ×{there[op]})")
            for op, n in guessed.items() if there[op]]
    absent = [f"{op} ×{n}" for op, n in guessed.items() if not there[op]]
    missed = [f"{op} ×{n}" for op, n in there.items() if op not in guessed]
    return "; ".join(said + [f"not there: {', '.join(absent)}"] * bool(absent)) \
        + (f". Not guessed: {', '.join(missed)}." if missed else ". Nothing unguessed.")


def error_text(judgement) -> str:
    """A ``reference.judge`` result as a ✔ line quotes it: each tensor's error against its bound
    ("out error 7.78e-07 <= 3.28e-05"); the rule that set the bound is chapter 1's."""
    return "; ".join(f"{v.tensor} error {number(v.error)} <= {number(v.bound)}" for v in judgement.values())


def call_table(call) -> pd.DataFrame:
    """A borrowed compiled call (``torch_compile.compiled_call``) as one table: its CPU ops, nested
    by depth, then the GPU kernels they launched, each with the API call that launched it."""
    ops = pd.DataFrame({"event": ["· " * int(d) + n for n, d in zip(call.ops["name"], call.ops["depth"])],
                        "on": "CPU", "time (µs)": call.ops["dur_us"].to_numpy(), "launched by": ""})
    gpu = pd.DataFrame({"event": call.kernels["name"].to_numpy(), "on": "GPU",
                        "time (µs)": call.kernels["dur_us"].to_numpy(), "launched by": call.kernels["launcher"].to_numpy()})
    return pd.concat([ops, gpu], ignore_index=True)


def memory_table(steps, scores_bytes: int) -> pd.DataFrame:
    """``torch_compile.memory_table`` with its counts as whole numbers."""
    from kernels.attention import torch_compile

    table = torch_compile.memory_table(steps, scores_bytes)
    return table.astype({"S×S buffers allocated": int, "copies of S×S": int})


def rotated_turns(modules: dict, shape, dtype, device, rounds: int = 21) -> dict[str, list[float]]:
    """``modules`` (name -> a module called as ``m(q, k, v)``) timed in turns
    (``comparison.in_turns``), each call on the next of the sweep's rotated input sets
    (``sweep.InputPool``), as the sweep times a forward: round by round, load from elsewhere hits
    every module alike, and no time rests on one input set staying in cache."""
    from kernels.bench.comparison import in_turns
    from kernels.bench.results import FORWARD
    from kernels.bench.sweep import InputPool, make_timed_call

    pool = InputPool(shape, dtype, device, False)
    calls = {name: make_timed_call(lambda q, k, v, causal, m=m: m(q, k, v), pool, True, FORWARD)
             for name, m in modules.items()}
    return in_turns(calls, device, rounds, warmup=3)


def steady_text(first_s: float, times: dict[str, list[float]]) -> str:
    """The sentences that quote the compiled steady calls (``times``: ``rotated_turns`` of "compiled"
    and "eager") against the first call (``first_s`` seconds) and against the eager call. No steady
    time is quoted: on a shared machine an absolute time moves with the load, while the round-by-round
    ratio does not (both calls of a round take the same load). The count of steady calls the first one
    cost is taken over the steady calls' 90th percentile, a bound that load can only lower."""
    p90 = timing.spread(times["compiled"])[2]
    return (f"timed in turns with eager on rotated inputs ({len(times['compiled'])} rounds), the first call "
            f"cost at least {first_s / (1e-3 * p90):,.0f} steady calls. Round by round, "
            + ratio_text(times, "compiled", "eager"))
