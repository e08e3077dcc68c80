"""Recorded GPU runs: traces a real GPU produced, kept for readers without one.

A chapter executed without a GPU cannot show a GPU lane of its own. What it can show,
clearly labelled, is the GPU lane of a run recorded earlier on real hardware. This module
reads those recordings; ``.ci/device-run`` makes the run and ``make gpu-import`` (in
``tools/gpu_run.py``) writes it here. Nothing here is ever synthesised: no recording, no
recorded lane.

Layout, one folder per recorded GPU::

    <recordings>/<gpu-slug>/
        meta.json                      GPU, capability, torch / CUDA / cuDNN / Triton, date, commit
        <notebook>/<variant>.json.gz   the traces that notebook recorded (its labelled steps)

Where ``<recordings>`` is, first match wins:

1. the folder named by the environment variable ``ATTENTION_PROFILED_RECORDINGS``;
2. ``book/data/recorded`` of the checkout this package was imported from;
3. ``kernels/data/recorded`` inside an installed package (the wheel carries book/data).
"""
from __future__ import annotations

from kernels.trace import reader
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


ENV_VAR = "ATTENTION_PROFILED_RECORDINGS"
PACKAGE = Path(__file__).resolve().parent


def default_root() -> Path:
    """Where recordings are read from (see the module's docstring for the order)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    if (PACKAGE.parent / "_toc.yml").exists():  # imported from a checkout of the course
        return PACKAGE.parent / "book" / "data" / "recorded"
    return PACKAGE / "data" / "recorded"


@dataclass(frozen=True)
class Recording:
    folder: Path
    meta: dict

    @property
    def label(self) -> str:
        m = self.meta
        return (f"recorded on {m['gpu']} on {m['date']} (torch {m['torch']}, CUDA {m['cuda']}, "
                f"Triton {m.get('triton') or 'none'}, commit {str(m.get('commit', 'unknown'))[:10]})")

    @property
    def capability(self) -> Optional[tuple]:
        return tuple(self.meta["capability"]) if self.meta.get("capability") else None

    def trace_path(self, notebook: str, variant: str) -> Path:
        return self.folder / notebook / f"{variant}.json.gz"

    def has(self, notebook: str, variant: str) -> bool:
        return self.trace_path(notebook, variant).exists()

    def trace(self, notebook: str, variant: str) -> reader.Trace:
        path = self.trace_path(notebook, variant)
        if not path.exists():
            have = sorted(p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*.json.gz"))
            raise FileNotFoundError(f"this recording ({self.label}) has no {notebook}/{variant}; it has: {have}")
        return reader.load_trace(path)


def recordings(root: Optional[Path] = None) -> list[Recording]:
    """Every recording under ``root`` (default: ``default_root()``), newest first."""
    root = Path(root) if root is not None else default_root()
    found = [Recording(m.parent, json.loads(m.read_text())) for m in root.glob("*/meta.json")]
    return sorted(found, key=lambda r: r.meta.get("date", ""), reverse=True)


def latest(root: Optional[Path] = None) -> Optional[Recording]:
    """The newest recording, or None while there is none."""
    found = recordings(root)
    return found[0] if found else None


LABELS = ("gpu", "capability", "torch", "cuda", "date", "commit")  # what a recorded lane is labelled with


def problems(root: Optional[Path] = None) -> list[str]:
    """What is wrong with the recordings under ``root``, one sentence each (empty: all well).

    A recording is a folder with a meta.json holding every one of ``LABELS`` and at least one
    trace; any other folder there is a recording that lost its meta.json.
    """
    root = Path(root) if root is not None else default_root()
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        meta = folder / "meta.json"
        if not meta.exists():
            found.append(f"{folder.name}: no meta.json, so nothing says which GPU recorded it")
            continue
        missing = [k for k in LABELS if k not in json.loads(meta.read_text())]
        if missing:
            found.append(f"{folder.name}: meta.json lacks {', '.join(missing)}")
        if not list(folder.rglob("*.json.gz")):
            found.append(f"{folder.name}: holds no traces")
    return found


# A sentence for the reader; how a maintainer records a GPU run is in the README and in the
# book's appendix on GPU runs (book/appendix/gpu_runs.md).
NO_RECORDING = ("This build of the book ran on a CPU and no GPU run has been recorded for it yet, so "
                "there is no GPU lane here: on a GPU, the lane would show each kernel these ops launch, "
                "on its stream, with the CPU-side launch that queued it.")


def gpu_lanes(device, live: dict, notebook: str, variants, root: Optional[Path] = None):
    """The GPU steps a chapter should read: ``({variant: Step}, source, capability)``.

    On a GPU: this run's own steps (``live``). On a CPU: the median step of each variant in
    the newest recording. Variants with no lane (not recorded, or not run) are left out;
    ``source`` says where the lanes come from, or why there are none; ``capability`` is
    the GPU's (major, minor).
    """
    if str(device).startswith("cuda"):
        import torch
        lanes = {v: live[v] for v in variants if live.get(v) is not None}
        return lanes, "this run", tuple(torch.cuda.get_device_capability(device))
    rec = latest(root)
    if rec is None:
        return {}, NO_RECORDING, None
    lanes = {v: reader.median_step(rec.trace(notebook, v).steps(v)) for v in variants if rec.has(notebook, v)}
    if not lanes:
        return {}, f"the recording ({rec.label}) has no trace of {', '.join(variants)} from {notebook}", None
    return lanes, rec.label, rec.capability
