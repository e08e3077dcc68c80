"""A training step's GPU time by phase: forward, backward and communication.

PyTorch's autograd engine runs a GPU backward on a thread of its own, which the trace names
``pt_autograd_N`` (the main thread is ``pt_main_thread``), so the GPU work launched from that
thread is the backward's. Communication kernels (NCCL's and RCCL's ``ncclKernel_*`` and
``ncclDevKernel_*``, by ``kernels.trace.fingerprints``' NCCL rule) are counted apart,
whichever thread launched them: in data-parallel training the backward launches the
gradients' all-reduce. The rest, launched from the main thread, is the forward (and the
optimizer, where the step holds one).

Times are sums of the GPU work's durations (busy time, streams added up), as
``Step.gpu_time_us`` counts them.
"""
from __future__ import annotations

import pandas as pd

from kernels.trace.fingerprints import fingerprint
from kernels.trace.reader import Step

PHASES = ("forward", "backward", "communication")
AUTOGRAD_THREAD = "pt_autograd"


def thread_names(step: Step) -> dict[str, str]:
    """Each thread's name as the trace's metadata gives it, by thread id."""
    return {str(e.get("tid")): str(e.get("args", {}).get("name", ""))
            for e in step.trace.raw.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "thread_name"}


def phase_of(kernel: str, thread_name: str) -> str:
    """The phase of one piece of GPU work, from its name and the name of the thread that launched it."""
    if fingerprint(kernel).family == "nccl":
        return "communication"
    return "backward" if AUTOGRAD_THREAD in thread_name else "forward"


def time_by_phase(step: Step) -> pd.DataFrame:
    """GPU time of the step by phase: rows ``PHASES`` (each present or not), columns ``GPU µs``,
    ``share`` (of the step's GPU time) and ``work`` (how many kernels, memcpys or memsets).
    A step with no thread named ``pt_autograd...`` has no backward row: it was no training step."""
    work = step.gpu_work
    if work.empty:
        raise ValueError(f"step {step.label} has no GPU work: a CPU-only step has no phases to split")
    names = thread_names(step)
    phase = [phase_of(k, names.get(str(t), "")) for k, t in zip(work["name"], work["thread"])]
    table = work.assign(phase=phase).groupby("phase")["dur_us"].agg(["sum", "count"])
    table = table.rename(columns={"sum": "GPU µs", "count": "work"}).reindex([p for p in PHASES if p in table.index])
    table["share"] = table["GPU µs"] / step.gpu_time_us
    return table[["GPU µs", "share", "work"]]
