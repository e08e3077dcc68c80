"""What only chapter 10 (decoding) needs: where unpinned SDPA sent its decode tokens on this
machine, and its reading of a serving engine's decode step (the SGLang trace borrowed from AMD's
TraceLens project): the engine's own step annotation, the split-KV calls' bytes and bandwidth,
and the graph replay that launched them."""
from __future__ import annotations

import re

import pandas as pd
import torch

from kernels.attention import sdpa
from kernels.hw.devices import Peaks
from kernels.notebook import lesson
from kernels.trace.reader import Step, Trace

# SGLang names its forward batch in a profiler annotation:
# execute_<n>_context_<n>(sq..sk..)_generation_<requests>(sq<queries>sk<cached tokens>...).
ENGINE_STEP = re.compile(r"_generation_(\d+)\(sq(\d+)sk(\d+)")


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


def engine_step(trace: Trace) -> dict:
    """The decode batch a serving engine wrote into its step annotation: ``requests``, ``queries``
    (new tokens, one a request when decoding) and ``cached_tokens`` (keys in every request's cache,
    summed). A trace without such an annotation is a ValueError."""
    names = trace.spans.loc[trace.spans["cat"] == "user_annotation", "name"]
    found = [m for m in map(ENGINE_STEP.search, names) if m]
    if len(found) != 1:
        raise ValueError(f"expected one engine step annotation (..._generation_N(sqQskK...)), found {len(found)}")
    requests, queries, cached = (int(g) for g in found[0].groups())
    return {"requests": requests, "queries": queries, "cached_tokens": cached}


def split_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """``kernels.attention.decoding.split_and_reduce``'s calls as a reader reads them: each kernel's
    GPU time and the reduce's share, both ways (of the call, of the main kernel), min/median/max."""
    rows = {"main kernel (µs)": pairs["main µs"],
            "reduce kernel (µs)": pairs["reduce µs"],
            "reduce, % of the call": 100 * pairs["reduce share"],
            "reduce, % of the main kernel": 100 * pairs["reduce µs"] / pairs["main µs"]}
    return pd.DataFrame({name: {"min": s.min(), "median": s.median(), "max": s.max()} for name, s in rows.items()}).T


def call_traffic(engine: dict, layer: dict, peaks: Peaks, call_us: float) -> dict:
    """One layer's attention call of the decode step, from the engine's annotation and the model's
    configuration (``layer``: ``heads``, ``kv_heads``, ``head_dim``, bfloat16): its FLOPs, the bytes
    it must move (every cached K and V once, the queries and outputs), its intensity and the
    bandwidth it reached in ``call_us``, against the GPU's datasheet ``peaks``."""
    h, hkv, d, elem = layer["heads"], layer["kv_heads"], layer["head_dim"], 2
    cache = 2 * engine["cached_tokens"] * hkv * d * elem
    moved = cache + 2 * engine["queries"] * h * d * elem
    flops = 4 * h * engine["cached_tokens"] * d          # q·k and p·v, one query a request
    return {"cache_bytes": cache, "bytes": moved, "flops": flops, "intensity": flops / moved,
            "bandwidth": moved / (call_us * 1e-6), "floor_us": moved / peaks.bandwidth * 1e6,
            "compute_us": flops / peaks.flops * 1e6}


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
