"""What only chapter 9 (the backward pass) needs: its reading of the book's own GPU recording,
where the backward's kernels come from the autograd engine's device thread."""
from __future__ import annotations

from typing import Mapping

import pandas as pd

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

    table = op_table(step, max_depth=max_depth)
    keep, skip_below = [], None
    for op in table["op"]:
        name = op.lstrip(NESTING)  # a set of characters: the marker repeated once per level
        depth = (len(op) - len(name)) // len(NESTING)
        if skip_below is not None and depth > skip_below:
            keep.append(False)
            continue
        skip_below = depth if any(word in name for word in BOOKKEEPING_NODES) else None
        keep.append(skip_below is None)
    return table[keep].reset_index(drop=True)
