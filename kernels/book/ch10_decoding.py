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
               "as prefill does", f"multi-head: {chosen}, GQA: {chosen_gqa}")


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
    """``decoding.counts_table`` as a reader compares it: a row per S, GFLOP and MiB instead of
    12-digit counts, one flat header (phase first), and the FLOP/byte the prose reads."""
    import pandas as pd

    byte_column = next(c for c in counts.columns.get_level_values(0) if c.startswith("bytes"))
    shown = {}
    for phase in ("decode", "prefill"):
        shown[f"{phase} GFLOP"] = counts[("FLOPs", phase)] / 1e9
        shown[f"{phase} MiB"] = counts[(byte_column, phase)] / 2**20
        shown[f"{phase} FLOP/byte"] = counts[("FLOP/byte", phase)]
    return pd.DataFrame(shown).rename_axis(counts.index.name)


def reduce_shares(pairs: pd.DataFrame) -> dict:
    """The reduce kernel's share of each split-KV call (``decoding.split_and_reduce``), of the
    call (main and reduce together) and of the main kernel alone: median and maximum of each,
    so a sentence and a check name which one they quote."""
    of_call, of_main = pairs["reduce share"], pairs["reduce µs"] / pairs["main µs"]
    return {"call_median": float(of_call.median()), "call_max": float(of_call.max()),
            "main_median": float(of_main.median()), "main_max": float(of_main.max())}
