"""Recorded GPU runs: traces a real GPU produced, kept in the repository for CPU readers.

A chapter executed without a GPU cannot show a GPU lane of its own. What it can show,
clearly labelled, is the GPU lane of a run recorded earlier on real hardware. This module
is that record's format, its loader, and the step that makes one from an executed book.

Layout, one folder per recorded GPU::

    book/data/recorded/<gpu-slug>/
        meta.json                    GPU name and capability, torch/CUDA/Triton versions,
                                     date, the profile's parameters
        <notebook>/<variant>.json.gz the traces that notebook recorded, as it recorded them

``make gpu-check`` writes one under its output folder (``python -m kernels.recorded``);
a maintainer copies it into ``book/data/recorded/`` and commits it. The traces obey the
same size budgets as every published trace (``kernels.traces``), and are published with
the book. Nothing here is ever synthesised: no recording, no recorded lane.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import profiling, traces

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "book" / "data" / "recorded"
CHAPTERS = ("01_naive", "02_inplace", "03_sdpa")


def slug(gpu_name: str) -> str:
    """A folder name for a GPU: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


@dataclass(frozen=True)
class Recording:
    folder: Path
    meta: dict

    @property
    def label(self) -> str:
        m = self.meta
        return (f"recorded on {m['gpu']} on {m['date']} (torch {m['torch']}, CUDA {m['cuda']}, "
                f"Triton {m.get('triton') or 'none'})")

    def trace_path(self, notebook: str, variant: str) -> Path:
        return self.folder / notebook / f"{variant}.json.gz"

    def trace(self, notebook: str, variant: str) -> profiling.Trace:
        path = self.trace_path(notebook, variant)
        if not path.exists():
            have = sorted(p.relative_to(self.folder).as_posix() for p in traces.find(self.folder))
            raise FileNotFoundError(f"this recording ({self.label}) has no {notebook}/{variant}; it has: {have}")
        return profiling.load_trace(path)


def recordings(root: Path = RECORDED) -> list[Recording]:
    """Every recording under ``root``, newest first."""
    found = [Recording(m.parent, json.loads(m.read_text())) for m in Path(root).glob("*/meta.json")]
    return sorted(found, key=lambda r: r.meta.get("date", ""), reverse=True)


def latest(root: Path = RECORDED) -> Optional[Recording]:
    """The newest recording, or None while the repository holds none."""
    found = recordings(root)
    return found[0] if found else None


NO_RECORDING = ("This run is CPU-only, and the repository holds no recorded GPU run yet, so there is "
                "no GPU lane to show: run `make gpu-check` on a GPU machine to record one.")


def gpu_step(device, live: "profiling.Step", notebook: str, variant: str, root: Path = RECORDED):
    """The GPU step a chapter should read, and where it comes from, in words.

    On a GPU: this run's own ``live`` step. On a CPU: the median step of the newest recorded
    GPU run, labelled as recorded; or ``(None, why)`` when there is nothing to show.
    """
    if str(device).startswith("cuda"):
        return live, "this run"
    rec = latest(root)
    if rec is None:
        return None, NO_RECORDING
    try:
        trace = rec.trace(notebook, variant)
    except FileNotFoundError as err:
        return None, str(err)
    return profiling.median_step(trace.steps(variant)), rec.label


def record(executed: Path, dest_root: Path, chapters=CHAPTERS) -> Path:
    """Make a recording from a book executed on a GPU (``python -m kernels.execute --profile cuda``)."""
    executed = Path(executed)
    report = json.loads((executed / "report.json").read_text())
    env = report["environment"]
    if not env.get("cuda") or env["device"].startswith("CPU"):
        raise ValueError(f"{executed} was executed on {env['device']}, not on a GPU: nothing to record")
    folder = Path(dest_root) / slug(env["device"])
    if folder.exists():
        shutil.rmtree(folder)
    for chapter in chapters:
        for trace in traces.find(executed / "book" / traces.trace_dir_for(chapter)):
            target = folder / chapter / trace.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(trace, target)
    meta = {"gpu": env["device"], "capability": env.get("capability"), "torch": env["torch"],
            "cuda": env["cuda"], "triton": env.get("triton"), "date": env["date"],
            "profile": report["profile"], "parameters": report["parameters"], "source": "make gpu-check"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.recorded", description=record.__doc__)
    ap.add_argument("--from", dest="executed", type=Path, default=ROOT / "_build" / "executed")
    ap.add_argument("--to", dest="dest", type=Path, required=True, help="folder to write <gpu-slug>/ into")
    args = ap.parse_args(argv)
    folder = record(args.executed, args.dest)
    print(f"recorded {len(traces.find(folder))} trace(s) in {folder}; copy it into book/data/recorded/ to publish it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
