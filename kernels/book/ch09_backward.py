"""What only chapter 9 (the backward pass) needs: its reading of the book's own GPU recording,
where the backward's kernels come from the autograd engine's device thread."""
from __future__ import annotations

from typing import Mapping

import pandas as pd
import torch

from kernels.notebook import lesson
from kernels.trace.reader import Step


def backward_threads(steps: Mapping[str, Step], source: str) -> pd.DataFrame:
    """Every variant's backward kernels are launched from a thread other than the caller's."""
    rows = []
    for name, s in steps.items():
        ks = s.gpu_work
        own = ks["thread"] == s.thread[1]
        rows.append({"variant": name, "forward kernels (caller's thread)": int(own.sum()),
                     "backward kernels (engine's thread)": int((~own).sum()),
                     "backward kernels": ", ".join(sorted(set(ks.loc[~own, "name"].str.slice(0, 50))))[:200]})
    table = pd.DataFrame(rows).set_index("variant")
    lesson(bool((table["backward kernels (engine's thread)"] > 0).all()),
           "every variant's backward kernels are launched from a thread other than the caller's", source)
    return table


# Autograd nodes that only reshape a gradient or hand it to a leaf: no arithmetic of their own.
BOOKKEEPING_NODES = ("View", "Expand", "Alias", "Transpose", "Permute", "AccumulateGrad")


def step_table(step: Step, max_depth: int = 2) -> pd.DataFrame:
    """``tables.op_table`` of a training step without the bookkeeping nodes (``BOOKKEEPING_NODES``)
    and whatever ran under them: the forward's ops, then the backward nodes that do arithmetic."""
    from kernels.trace.tables import NESTING, op_table

    table = op_table(step, max_depth=max_depth, times=False)
    keep, skip_below = [], None
    for op in table["op"]:
        name = op.lstrip(NESTING)  # a set of characters: the marker repeated once per level
        depth = (len(op) - len(name)) // len(NESTING)
        if skip_below is not None and depth > skip_below:
            keep.append(False)
            continue
        skip_below = depth if any(word in name for word in BOOKKEEPING_NODES) else None
        keep.append(skip_below is None)
    # One profile's CPU times are noise (ops of equal work differ many times over): left out.
    table = table[keep].reset_index(drop=True)
    # Memory first: the shapes column is the widest, and is read last.
    table = table.rename(columns={"allocated (KiB, incl. children)": "allocated (KiB)"})
    return table[[c for c in table.columns if c != "input shapes"] + [c for c in table.columns if c == "input shapes"]]


def kept_view(kept: pd.DataFrame):
    """``backward.kept_table`` as the page shows it: the counts and the MiB alive, without the
    list of shapes (``saved_storages`` shows what they are)."""
    return kept.drop(columns="shapes saved").style.format({"alive at backward (MiB)": "{:.2f}"})


def recompute_view(recompute: pd.DataFrame) -> pd.DataFrame:
    """``backward.recompute_table`` with headers short enough for its five columns to fit the page."""
    return recompute.rename(columns={"bmm in forward": "bmm, forward", "bmm in backward": "bmm, backward",
                                      "S×S allocations in backward": "S×S allocations, backward",
                                      "largest backward allocation (KiB)": "largest, backward (KiB)"})


def buffer_role(shape: tuple, dtype: str, nbytes: int, q: torch.Tensor) -> str:
    """What a saved buffer of an attention forward is, from its shape, type and size against q's."""
    q_bytes = q.numel() * q.element_size()
    if "bool" in dtype:
        return "causal mask"
    if tuple(shape[-2:]) == (q.shape[-2], q.shape[-2]):
        return "probabilities"
    if nbytes == 3 * q_bytes:
        return "q, k and v (one buffer)"
    if tuple(shape) == tuple(q.shape):
        return "output" if nbytes == q_bytes else "q, k or v"
    if tuple(shape) == tuple(q.shape[:-1]):
        return "log-sum-exp, one a row"
    return "other"


def saved_storages(inputs_by_name: Mapping[str, tuple]) -> pd.DataFrame:
    """What one forward of each variant (``inputs_by_name[name]``: its q, k, v, ...) hands
    autograd to keep, one row per buffer (storage): what it is (``buffer_role``), its size,
    element type and the shapes of the views of it that were saved. Two saved shapes of one
    buffer are one buffer kept."""
    from kernels import get
    from kernels.attention.backward import saved_by_autograd

    rows: dict = {}
    for name, (q, k, v, *_) in inputs_by_name.items():
        for shape, dtype, ptr, nbytes in saved_by_autograd(get(name), q, k, v):
            row = rows.setdefault((name, ptr, nbytes), {"variant": name, "what": buffer_role(shape, str(dtype), nbytes, q),
                                                        "KiB": round(nbytes / 1024), "type": dtype, "saved as": []})
            if shape not in row["saved as"]:
                row["saved as"].append(shape)
    table = pd.DataFrame(rows.values()).sort_values(["variant", "KiB"], ascending=[True, False], kind="stable")
    table["saved as"] = [" and ".join(str(s) for s in shapes) for shapes in table["saved as"]]
    table["KiB"] = [f"{n:,}" for n in table["KiB"]]
    return table.set_index("variant")


def phase_table(phases: pd.DataFrame):
    """``phases.time_by_phase``' table as the page shows it: GPU ms, share, kernels."""
    shown = phases.assign(**{"GPU ms": phases["GPU µs"] / 1e3}).rename(columns={"work": "kernels"})
    return shown[["GPU ms", "share", "kernels"]].style.format({"GPU ms": "{:,.1f}", "share": "{:.1%}"})


def launch_threads(step: Step) -> pd.DataFrame:
    """Per CPU thread (by the name the trace gives it) and phase: how many pieces of GPU work
    it launched and when its first and last launch came (ms from the step's first launch)."""
    from kernels.trace.phases import phase_of, thread_names

    work, names = step.gpu_work, thread_names(step)
    named = work.assign(thread=[names.get(str(t), str(t)).split("(")[-1].rstrip(")") for t in work["thread"]],
                        phase=[phase_of(k, names.get(str(t), "")) for k, t in zip(work["name"], work["thread"])])
    start = named["launch_start_us"].min()
    table = named.groupby(["thread", "phase"]).agg(kernels=("name", "size"), first=("launch_start_us", "min"),
                                                   last=("launch_start_us", "max"))
    table[["first", "last"]] = (table[["first", "last"]] - start) / 1e3
    return table.rename(columns={"first": "first launch (ms)", "last": "last launch (ms)"})


def after_backward(step: Step, thread: str = "pt_main_thread") -> list[str]:
    """The ATen ops that launched ``thread``'s GPU work after the backward's last launch (from
    ``launch_threads``' engine thread): in a training step, the optimizer's."""
    return sorted(set(launched_after_backward(step, thread)["op"].dropna()))


def launched_after_backward(step: Step, thread: str = "pt_main_thread") -> pd.DataFrame:
    """The GPU work ``thread`` launched after the engine thread's last launch (rows of ``gpu_work``)."""
    from kernels.trace.phases import AUTOGRAD_THREAD, thread_names

    work, names = step.gpu_work, thread_names(step)
    named = work["thread"].astype(str).map(lambda t: names.get(t, ""))
    engine_last = work.loc[named.str.contains(AUTOGRAD_THREAD), "launch_start_us"].max()
    return work[named.str.contains(thread) & (work["launch_start_us"] > engine_last)]


def optimizer_apart(phases: pd.DataFrame, step: Step) -> pd.DataFrame:
    """``phases.time_by_phase``' table with the main thread's work after the backward (the
    optimizer's updates, which ``phase_of`` counts with the forward) moved to an "optimizer" row
    after the backward's, so the forward row is the forward alone."""
    from kernels.trace.phases import phase_of, thread_names

    late, names = launched_after_backward(step), thread_names(step)
    late = late[[phase_of(k, names.get(str(t), "")) == "forward" for k, t in zip(late["name"], late["thread"])]]
    if late.empty:
        return phases
    table = phases.copy()
    table.loc["forward", ["GPU µs", "work"]] -= [late["dur_us"].sum(), len(late)]
    optimizer = pd.DataFrame({"GPU µs": [late["dur_us"].sum()], "work": [len(late)]}, index=["optimizer"])
    at = list(table.index).index("backward") + 1 if "backward" in table.index else len(table)
    table = pd.concat([table.iloc[:at], optimizer, table.iloc[at:]]).rename_axis(phases.index.name)
    table["share"] = table["GPU µs"] / step.gpu_time_us
    table["work"] = table["work"].astype(int)
    return table[["GPU µs", "share", "work"]]


def main_thread_during_backward(step: Step) -> dict:
    """What the main thread launched before, during and after the engine thread's backward
    launches (counts), and the names of its communication kernels."""
    from kernels.trace.phases import AUTOGRAD_THREAD, thread_names

    work, names = step.gpu_work, thread_names(step)
    named = work["thread"].astype(str).map(lambda t: names.get(t, ""))
    engine = work.loc[named.str.contains(AUTOGRAD_THREAD), "launch_start_us"]
    main = work[named.str.contains("pt_main_thread")]
    at = main["launch_start_us"]
    comm = main.loc[main["name"].str.contains("nccl", case=False), "name"]
    return {"before": int((at < engine.min()).sum()), "during": int(((at >= engine.min()) & (at <= engine.max())).sum()),
            "after": int((at > engine.max()).sum()), "communication": [n.split("(")[0] for n in comm]}
