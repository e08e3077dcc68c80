"""What only chapter 2's page (notebooks/02_inplace.py) needs: the in-place forward's GPU track
against the naive one's, on a GPU run or the book's recording, and the Qwen step's copy groups
written for reading."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import pandas as pd

from kernels.notebook import lesson

if TYPE_CHECKING:   # for annotations only
    from kernels.trace.reader import Step


def inplace_drops_the_copy_on_gpu(steps_of: Mapping[str, Step], source: str = "") -> None:
    """Chapter 2 on a GPU run (``source`` names it in the evidence): the naive forward's six GPU
    activities become five in place, and the one that went is the copy."""
    counts = {n: (len(steps_of[n].gpu_work), int((steps_of[n].gpu_work["cat"] == "gpu_memcpy").sum()))
              for n in ("naive", "inplace")}
    lesson(counts == {"naive": (6, 1), "inplace": (5, 0)}, "the GPU track goes from 6 activities to 5, as on the "
           "article's A100, and the one that went is the copy", f"(activities, copies): {counts}" + (f", {source}" if source else ""))


# How the profiler's recorded input types name the two dtypes the Qwen step copies to.
DTYPE_NAMES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64"}


def copies_for_reading(groups: pd.DataFrame):
    """``tables.copy_groups`` as the page shows it: each call as Python writes it, a cast with the
    type it casts to (it tells the cast to float32 from the cast back), and totals written as a
    reader reads them ("< 0.1" MiB for a group ``copy_groups`` rounded to 0, never a bare 0 for
    bytes that moved). Returns a Styler without the row numbers (``.data`` is the table)."""
    def mib_text(x: float) -> str:
        return "< 0.1" if x < 0.05 else f"{x:,.0f}" if x >= 10 else f"{x:.1f}"

    def call_text(call: str, dtype: str) -> str:   # ".to(float32)": the cast to float32 and the cast back differ
        method = call.removeprefix("Tensor")
        return f"{method}({DTYPE_NAMES.get(dtype, dtype)})" if method == ".to" else f"{method}()"

    # The answer (MiB) first; module and call share the last column, which the book's table style
    # keeps wide anyway, so that the table fits the page at 1280 px.
    return pd.DataFrame({
        "MiB total": groups["MiB total"].map(mib_text),
        "GPU µs": groups["GPU µs"].map(lambda us: f"{us:,.0f}" if us >= 100 else f"{us:.1f}"),
        "count": groups["count"].astype(int), "shape": groups["shape"],
        "module: call": [f"{m}: {call_text(c, t)}" for m, c, t in zip(groups["module"], groups["call"], groups["dtype"])],
    }).style.hide(axis="index").set_table_attributes('class="dataframe"')   # the row number says nothing
    # here and the table needs the width; the class gives it the book's table style
