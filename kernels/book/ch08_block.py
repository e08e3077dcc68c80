"""What only chapter 8 (one transformer block) needs: its reading of where the compiled
block's GELU ran, on a GPU run's kernels or, without one, the CPU ops."""
from __future__ import annotations

import pandas as pd

from kernels.notebook import lesson
from kernels.trace import fingerprints


def gelu_between_matmuls(work: pd.DataFrame) -> list[str]:
    """GELU is a pass of its own between two library matmuls (fc_in's and fc_out's).

    ``work`` is a step's GPU kernels, or its CPU ops where there is no GPU track; matmuls are
    what ``fingerprints.is_gemm`` says (cuBLAS's nvjet_* on Hopper included). Returns the
    matmul and GELU rows' names in launch order."""
    keep = [fingerprints.is_gemm(n) or fingerprints.mentions_op(n, "gelu") for n in work["name"]]
    names = work[keep].sort_values("start_us")["name"].tolist()
    gelu = [fingerprints.mentions_op(n, "gelu") for n in names]
    at = gelu.index(True) if any(gelu) else None
    lesson(at is not None and 0 < at < len(names) - 1 and not gelu[at - 1] and not gelu[at + 1],
           "but GELU is still a pass of its own between two library matmuls (fc_in's and fc_out's)",
           " -> ".join(n.removeprefix("aten::")[:40] for n in names))
    return names
