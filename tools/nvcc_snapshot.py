"""Write chapter 5's nvcc snapshot: the CUDA kernels' resources as this machine's nvcc compiles them.

    python -m tools.nvcc_snapshot            # compile, write kernels/cuda/nvcc_snapshot.json

The snapshot is data the library reads on machines without nvcc (Colab, laptops): ptxas'
registers, shared memory and spills of every kernel instantiation, and of every revision of
cuda_v2's design with its PTX's instruction counts (``kernels.cuda.resources.load_snapshot``,
``kernels.cuda.design.snapshot_revisions``). Compiling needs the CUDA compiler nvcc, not a GPU.
Run it after changing a kernel in kernels/cuda/csrc; tests/cuda compare the file with what nvcc
compiles and fail until it matches.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from kernels.cuda import flash as cuda_flash
from kernels.cuda.design import design_revisions, revision_rows
from kernels.cuda.ptxas import nvcc_path, nvcc_version
from kernels.cuda.resources import SNAPSHOT_PATH, kernel_rows

ARCHS = ("sm_80", "sm_90")
ABOUT = ("ptxas -v of kernels/cuda/csrc, compiled under the extension build's flags (no GPU needed); "
         "written by python -m tools.nvcc_snapshot, read where nvcc is missing")


def take_snapshot(archs: Iterable[str] = ARCHS) -> dict[str, Any]:
    """Compile every kernel and every design revision now; the snapshot as JSON will hold it."""
    archs = list(archs)
    revisions = [r for d in cuda_flash.HEAD_DIMS for r in design_revisions(d, archs, live=True)]
    return {"about": ABOUT, "nvcc": nvcc_version(), "date": datetime.date.today().isoformat(),
            "kernels": kernel_rows(cuda_flash.kernel_resources(archs)),
            "design_revisions": revision_rows(revisions)}


def snapshot_json(snapshot: dict[str, Any]) -> str:
    """One row per line, so that a changed kernel is a readable diff."""
    lines = ["{"]
    for key, value in snapshot.items():
        if isinstance(value, list):
            rows = ",\n".join(f"  {json.dumps(row)}" for row in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ],")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)},")
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines) + "\n}\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=SNAPSHOT_PATH, help="the JSON file (default: %(default)s)")
    args = parser.parse_args(argv)
    if nvcc_path() is None:
        print("nvcc_snapshot needs the CUDA compiler nvcc (the CUDA toolkit; no GPU needed): none is on PATH "
              "or under CUDA_HOME/CUDA_PATH. The checked-in snapshot is left as it is.", file=sys.stderr)
        return 2
    fresh = take_snapshot()
    args.output.write_text(snapshot_json(fresh))
    print(f"wrote {args.output} ({len(fresh['kernels'])} kernels, {len(fresh['design_revisions'])} design revisions, "
          f"nvcc {fresh['nvcc']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
