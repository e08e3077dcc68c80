"""What only chapter 0's page (notebooks/00_profiler_primer.py) needs: where each
synchronisation of a borrowed model step comes from."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:   # for annotations only
    from kernels.trace.reader import Step


def frames_around(step: Step, call: pd.Series) -> list[str]:
    """The Python frames that enclose a runtime call of ``step`` (a row of ``step.runtime_calls``),
    outermost first, as a trace recorded ``with_stack=True`` holds them; [] where it recorded none.
    (``Step.python_stack`` does the same for an op; a runtime call outside every op has none.)"""
    spans = step.trace.spans
    start = float(step.range["ts"]) + float(call["start_us"])
    end = start + float(call["dur_us"])
    around = spans[(spans["cat"] == "python_function") & (spans["pid"] == call["pid"]) & (spans["tid"] == call["tid"])
                   & (spans["ts"] <= start) & (spans["end"] >= end)]
    return around.sort_values(["ts", "dur"], ascending=[True, False], kind="stable")["name"].tolist()


def synchronisations(step: Step) -> pd.DataFrame:
    """Every call of ``step`` that waits for the GPU (``cudaDeviceSynchronize``,
    ``cudaStreamSynchronize``, ``cudaEventSynchronize``), in order: when it began (µs into the
    step), how long it waited, the op it was made in (missing: outside every op), the innermost
    Python function around it (built-ins skipped), whether it was made inside a model's
    ``nn.Module`` call, and whether any of the step's GPU work had been launched before it."""
    calls = step.runtime_calls
    waits = calls[calls["name"].isin(["cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"])]
    first_launch = float(step.gpu_work["launch_start_us"].min()) if not step.gpu_work.empty else float("inf")
    rows = []
    for _, call in waits.sort_values("start_us").iterrows():
        frames = frames_around(step, call)
        python = [f for f in frames if not f.startswith("<built-in")]
        rows.append({"call": call["name"], "start_us": float(call["start_us"]), "dur_us": float(call["dur_us"]),
                     "op": call["op"] if isinstance(call["op"], str) else None,
                     "python": python[-1] if python else None,
                     "in_module": any(f.startswith("nn.Module:") for f in frames),
                     "after_first_launch": float(call["start_us"]) > first_launch})
    return pd.DataFrame(rows, columns=["call", "start_us", "dur_us", "op", "python", "in_module", "after_first_launch"])


def runtime_table_whole(step: Step) -> pd.DataFrame:
    """``kernels.trace.tables.runtime_table(step)`` with its "made in" column whole: every op
    the calls of each name were made in, most calls first (the library's table stops at three
    and ends the cell with "...")."""
    from kernels.trace.tables import runtime_table

    table = runtime_table(step)
    ops = step.runtime_calls.dropna(subset=["op"]).groupby("name")["op"]
    made_in = ops.apply(lambda o: ", ".join(name.removeprefix("aten::") for name in o.value_counts().index))
    return table.assign(**{"made in": table["call"].map(made_in).fillna("")})


def summary_columns(averages, rows: int = 8) -> pd.DataFrame:
    """The columns of ``prof.key_averages().table()`` that chapter 0 reads, as a table narrow
    enough for the page: per op (most CPU total first, ``rows`` of them) its Self CPU and CPU
    total in µs (whole microseconds, as the page's checks quote them), its Self Mem and Mem in MiB (CPU memory on a CPU run; the GPU's ``device_*``
    memory where the run recorded any) and # of Calls. Times and bytes are sums over every call,
    as in PyTorch's table."""
    on_gpu = any(e.self_device_memory_usage or e.device_memory_usage for e in averages)
    where = "device" if on_gpu else "cpu"
    events = sorted(averages, key=lambda e: e.cpu_time_total, reverse=True)[:rows]
    return pd.DataFrame([{"op": e.key, "Self CPU (µs)": float(round(e.self_cpu_time_total)), "CPU total (µs)": float(round(e.cpu_time_total)),
                          f"Self {'CUDA' if on_gpu else 'CPU'} Mem (MiB)": getattr(e, f"self_{where}_memory_usage") / 2**20,
                          f"{'CUDA' if on_gpu else 'CPU'} Mem (MiB)": getattr(e, f"{where}_memory_usage") / 2**20,
                          "# of Calls": e.count} for e in events])
