"""What only chapter 2's page (notebooks/02_inplace.py) needs: the in-place forward's GPU track
against the naive one's, on a GPU run or the book's recording."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

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
