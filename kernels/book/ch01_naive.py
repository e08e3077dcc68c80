"""What only chapter 1's page (notebooks/01_naive.py) needs: the naive forward's copy on a GPU
run, and a folded note for a detour (TimeSformer's input is kernels/book/timesformer.py, which
chapter 12 reads too)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kernels.notebook import TICK, in_notebook, lesson, say_html
from kernels.trace.tables import kernel_table

if TYPE_CHECKING:   # for annotations only
    from kernels.trace.reader import Step


def naive_copy_on_gpu(step: Step) -> pd.DataFrame:
    """Chapter 1 on a GPU run: the naive forward runs the article's six GPU activities, one of
    them a copy launched inside ``masked_fill`` (its clone). Returns the step's kernel table."""
    gpu = step.gpu_work
    copies = gpu[gpu["cat"] == "gpu_memcpy"]
    lesson(len(gpu) == 6, "the naive forward runs six GPU activities, as on the article's A100", f"{len(gpu)} on the GPU track")
    fill = step.find("aten::masked_fill").iloc[0]
    lesson(len(copies) == 1 and fill["start_us"] <= copies["launch_start_us"].iloc[0] <= fill["start_us"] + fill["dur_us"],
           "exactly one of them is a copy, launched inside masked_fill (its clone)")
    return kernel_table(step)


def folded_note(summary: str, paragraphs: list[str], checked: bool, claim: str, evidence: str) -> None:
    """A detour the page's main line can skip, folded under ``summary``: its ``paragraphs`` (HTML)
    and the ✔ line of the lesson they rest on. The lesson is checked here and fails as ``lesson``
    does; only its line moves into the fold."""
    if not checked:
        lesson(checked, claim, evidence)            # raises LessonFailed
    line = f"{TICK} {claim} ({evidence})"
    if not in_notebook():
        print(summary, *paragraphs, line, sep="\n")
        return
    from IPython.display import display

    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    html = (f'<details class="ap-hint"><summary>{summary}</summary>{body}'
            f'{say_html(line, kind="lesson")}</details>')
    display({"text/plain": "\n".join([summary, *paragraphs, line]), "text/html": html}, raw=True)
