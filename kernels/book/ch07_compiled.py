"""What only chapter 7 (compiled attention) needs: the reading of a GPU run's compiled and flex
forwards (the book's own recording branch), and the sentence that says what timing the graph
break apart from the unbroken compile shows on this run, by the appendix's rule."""
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
        return head + ": on this run the broken forward was the faster, whatever the extra S×S buffers cost."
    return head + (": the spreads overlap, so on this CPU the break's time cost is lost in the noise, "
                   "while its memory cost (above) is not.")
