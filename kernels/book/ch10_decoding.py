"""What only chapter 10 (decoding) needs: where unpinned SDPA sent its decode tokens on this
machine, and the graph replay that launched a serving engine's decode step (the SGLang trace
borrowed from AMD's TraceLens project). The step's shapes, bytes and roof are the library's
(``kernels.trace.attention.find_attention`` with the engine's capture trace)."""
from __future__ import annotations

import torch

from kernels.attention import sdpa
from kernels.notebook import lesson
from kernels.trace.reader import Step


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
