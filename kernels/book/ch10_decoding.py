"""What only chapter 10 (decoding) needs: where unpinned SDPA sent its decode tokens on this
machine, its counts table in readable units, the reduce's share of a split-KV call, and the
graph replay that launched a serving engine's decode step (the SGLang trace borrowed from AMD's
TraceLens project). The step's shapes, bytes and roof are the library's
(``kernels.trace.attention.find_attention`` with the engine's capture trace)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels.attention import sdpa
from kernels.notebook import lesson
from kernels.trace.reader import Step

if TYPE_CHECKING:
    import pandas as pd


def decode_backend_here(chosen: str, chosen_gqa: str, device, dtype: torch.dtype, head_dim: int) -> None:
    """Where unpinned SDPA sent chapter 10's decode tokens (``chosen``: multi-head, ``chosen_gqa``:
    shared K/V heads) on this machine: on a GPU, the backend PyTorch's priority rules predict for
    it; on a CPU, PyTorch's CPU flash kernel for both, as for prefill."""
    device = torch.device(device)
    if device.type == "cuda":
        predicted = sdpa.predicted_backend_here(device, dtype, head_dim)
        lesson(chosen == predicted, "on this GPU the decode token goes to the backend the priority rules predict",
               f"chose {chosen}, rules predict {predicted}")
    else:
        lesson(chosen == chosen_gqa == "sdpa_flash", "on a CPU a decode token goes to PyTorch's CPU flash kernel, "
               "as prefill does", chosen)


def graph_replay(step: Step) -> dict:
    """The kernels a graph replayed in ``step`` (launched by ``hipGraphLaunch``/``cudaGraphLaunch``):
    how many, how many launch calls queued them, their GPU time summed, the span from the first's
    start to the last's end, and the median gap between one kernel's end and the next's start."""
    work = step.gpu_work
    replayed = work[work["launcher"].isin(["hipGraphLaunch", "cudaGraphLaunch"])].sort_values("start_us")
    ends = replayed["start_us"] + replayed["dur_us"]
    launches = step.runtime_calls
    return {"kernels": len(replayed),
            "launch_calls": int(launches["name"].isin(["hipGraphLaunch", "cudaGraphLaunch"]).sum()),
            "busy_us": float(replayed["dur_us"].sum()),
            "span_us": float(ends.max() - replayed["start_us"].min()),
            "median_gap_us": float((replayed["start_us"] - ends.shift(1)).median())}


def counts_in_units(counts: pd.DataFrame) -> pd.DataFrame:
    """``decoding.counts_table`` as a reader compares it: a row per S, decode's FLOPs in MFLOP and
    prefill's in GFLOP (each readable at its own scale), MiB to one decimal, one flat header (phase
    first), and the FLOP/byte the prose reads (decode's to two decimals: it sits just under 1)."""
    import pandas as pd

    byte_column = next(c for c in counts.columns.get_level_values(0) if c.startswith("bytes"))
    shown = {"decode MFLOP": [f"{x / 1e6:,.1f}" for x in counts[("FLOPs", "decode")]],
             "decode MiB": [f"{x / 2**20:,.1f}" for x in counts[(byte_column, "decode")]],
             "decode FLOP/byte": [f"{x:.2f}" for x in counts[("FLOP/byte", "decode")]],
             "prefill GFLOP": [f"{x / 1e9:,.1f}" for x in counts[("FLOPs", "prefill")]],
             "prefill MiB": [f"{x / 2**20:,.1f}" for x in counts[(byte_column, "prefill")]],
             "prefill FLOP/byte": [f"{x:,.0f}" for x in counts[("FLOP/byte", "prefill")]]}
    return pd.DataFrame(shown, index=counts.index).rename_axis(counts.index.name)


def sharing_shown(rows: pd.DataFrame) -> pd.DataFrame:
    """``decoding.sharing_table`` as the page shows it: a short header for the bytes a decode token
    reads (the long one widened the table past the column), MiB to one decimal, FLOP/byte to two."""
    shown = rows.rename(columns={"bytes per decode token, one layer (MiB)": "MiB read per token, one layer"})
    for name in shown.columns:
        if "MiB" in name:
            shown[name] = [f"{x:,.1f}" for x in shown[name]]
    if "FLOP/byte" in shown.columns:
        shown["FLOP/byte"] = [f"{x:.2f}" for x in shown["FLOP/byte"]]
    return shown


def copies_shown(copies: pd.DataFrame) -> pd.DataFrame:
    """``decoding.copies_table`` with its KiB to one decimal (6.5, not 6.547)."""
    shown = copies.copy()
    for name in shown.columns:
        if "KiB" in name:
            shown[name] = [f"{x:,.1f}" for x in shown[name]]
    return shown


def decode_gap(points: list, peaks) -> str:
    """The sentence under the roofline for the decode points drawn (``kernels.bench`` rows with
    ``mode``, ``intensity`` and ``tflops``) against ``peaks.attainable``: how far under their memory
    slope they sit, and why a CPU call that small is not limited by its bytes; when none is drawn,
    that the run's noise left none (their intensity is counted, not timed, so the ✔ lines still place them)."""
    gaps = [peaks.attainable(r.intensity) / (r.tflops * 1e12) for r in points if r.tflops > 0]
    if not gaps:
        return ("No decode point passed the spread check on this run, so the figure draws none; their intensity "
                "is counted from the shapes, not timed, and the ✔ lines above place them by it.")
    reach = sorted(1 / g for g in gaps)
    share = f"{reach[0]:.0%}" if len(reach) == 1 else f"{reach[0]:.0%} to {reach[-1]:.0%}"
    which = "The decode point drawn reaches" if len(reach) == 1 else "The decode points drawn reach"
    their = "its" if len(reach) == 1 else "their"
    if reach[0] >= 1 / 3:
        return (f"{which} {share} of {their} memory slope: on this run a decode call took about as long as moving "
                "its bytes. The SGLang trace below shows the same on a GPU.")
    return (f"{which} only {share} of {their} memory slope: a CPU call this small is dominated by its fixed "
            "cost per call (dispatch, threads), not its bytes, unlike SGLang's GPU calls below.")


def reduce_shares(pairs: pd.DataFrame) -> dict:
    """The reduce kernel's share of each split-KV call (``decoding.split_and_reduce``), of the
    call (main and reduce together) and of the main kernel alone: median and maximum of each,
    so a sentence and a check name which one they quote."""
    of_call, of_main = pairs["reduce share"], pairs["reduce µs"] / pairs["main µs"]
    return {"call_median": float(of_call.median()), "call_max": float(of_call.max()),
            "main_median": float(of_main.median()), "main_max": float(of_main.max())}


def phase_turns(impl: str, seq: int, *, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device,
                rounds: int = 15) -> dict[str, list[float]]:
    """A causal prefill of ``seq`` tokens and one decode token against a cache of ``seq``, timed
    in turns (``comparison.in_turns``: one call of each a round), on fresh inputs as the sweep
    times them: two phases measured apart can land on different spells of a busy machine."""
    from kernels import get
    from kernels.bench.comparison import in_turns
    from kernels.bench.results import DECODE, FORWARD
    from kernels.bench.sweep import InputPool, make_timed_call

    fn, shape = get(impl), (batch, heads, seq, head_dim)
    calls = {"prefill": make_timed_call(fn, InputPool(shape, dtype, device, False), True, FORWARD),
             "decode": make_timed_call(fn, InputPool(shape, dtype, device, False, seq_q=1), True, DECODE)}
    return in_turns(calls, device, rounds)


def phase_claims(times: dict[str, list[float]], prefill, decode) -> list[tuple[list, str, str]]:
    """The two claims the page makes of ``phase_turns``' rounds (``prefill``, ``decode``: the sweep's
    rows at that length, for their FLOPs), each held or not round by round, for ``timing_claims``:
    decode reaches fewer FLOP/s than prefill, and a decode token costs over five times a prefill
    token."""
    from kernels.bench.comparison import ratio_spread

    seq = prefill.seq
    rates = [(decode.flops / d) / (prefill.flops / p) for p, d in zip(times["prefill"], times["decode"])]
    per_token = [d / (p / seq) for p, d in zip(times["prefill"], times["decode"])]
    median, p10, p90 = ratio_spread(times, "decode", "prefill")
    return [
        ([r < 1 for r in rates], "decode reaches fewer FLOP/s than prefill",
         f"decode at {sorted(rates)[len(rates) // 2]:.2g}× prefill's FLOP/s, median of the rounds, S = {seq}"),
        ([t > 5 for t in per_token], "a token costs over five times as much to decode as to prefill",
         f"{median * seq:.0f}× ({p10 * seq:.0f}× to {p90 * seq:.0f}× from the 10th to the 90th percentile)"),
    ]
