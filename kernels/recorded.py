"""Recordings: traces of the course's own GPU run, kept for readers without a GPU.

A chapter executed without a GPU has no GPU track of its own; what it can show, clearly
labelled, is a *recording*, the steps of a run made earlier on real hardware (``make gpu-run``
makes it, ``make gpu-import`` writes it here). Nothing is ever synthesised: no recording, no
recorded steps. ``gpu_steps(device, live, notebook, variants)`` hands a chapter this run's own
steps on a GPU, else the newest recording's.

One folder per recorded GPU, ``<gpu-slug>/meta.json`` (GPU, capability, versions, date, commit)
and ``<gpu-slug>/<notebook>/<variant>.json.gz``, under (first match wins): the folder named by
``ATTENTION_PROFILED_RECORDINGS``; ``book/data/recorded`` of the checkout this package was
imported from; ``kernels/data/recorded`` inside an installed package.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from kernels.trace import reader


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


# A sentence for the reader; how a maintainer records a GPU run is in MAINTAINING.md.
NO_RECORDING = ("this book's own GPU run is not recorded (the GPU sections read a borrowed trace "
                "instead: kernels.borrowed)")


def gpu_steps(device, live: dict, notebook: str, variants, root: Optional[Path] = None):
    """The GPU steps a chapter should read: ``({variant: Step}, source, capability)``.

    On a GPU: this run's own steps (``live``). On a CPU: the median step of each variant in
    the newest recording. Variants with no GPU step (not recorded, or not run) are left out;
    ``source`` says where the steps come from, or why there are none; ``capability`` is
    the GPU's (major, minor).
    """
    if str(device).startswith("cuda"):
        steps = {v: live[v] for v in variants if live.get(v) is not None}
        return steps, "this run", tuple(torch.cuda.get_device_capability(device))
    rec = latest(root)
    if rec is None:
        return {}, NO_RECORDING, None
    steps = {v: reader.median_step(rec.trace(notebook, v).steps(v)) for v in variants if rec.has(notebook, v)}
    if not steps:
        return {}, f"the recording ({rec.label}) has no trace of {', '.join(variants)} from {notebook}", None
    return steps, rec.label, rec.capability
