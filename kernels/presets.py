"""Presets: the device settings the course starts from, one per kind of machine.

``kernels/presets.yml`` holds them (``cpu``, ``cuda``). A preset's top-level keys are the
parameters the book's runner (``python -m tools.book.execute --preset NAME``) injects into
every chapter's parameters cell: device, dtype, batch, heads, seq, head_dim, active_steps.
Its ``bench:`` block is the sweep ``python -m kernels.bench`` runs by default on that device
(sequence lengths and head dims), at the preset's dtype, batch and heads.

    presets = load_presets()
    name, preset = resolve_preset("auto", presets)     # "cuda" where a GPU is visible, else "cpu"
    chapter_parameters(preset), bench_defaults(preset)

The file ships in the wheel (package data), so the installed benchmark reads the same presets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

PRESETS_PATH = Path(__file__).with_name("presets.yml")
BENCH = "bench"   # the key of a preset's benchmark block; every other key is a chapter parameter


def load_presets(path: Path = PRESETS_PATH) -> dict[str, dict[str, Any]]:
    """Every preset of ``path`` by name (default: the library's own ``presets.yml``)."""
    return yaml.safe_load(Path(path).read_text())


def resolve_preset(name: str, presets: dict, cuda_available: Optional[bool] = None) -> tuple[str, dict]:
    """The preset's name and settings; ``auto`` means ``cuda`` where a GPU is visible, else ``cpu``."""
    if name == "auto":
        if cuda_available is None:
            import torch  # here, not at the top: only ``auto`` needs it, and loading it takes seconds
            cuda_available = torch.cuda.is_available()
        name = "cuda" if cuda_available else "cpu"
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; the presets are: {', '.join(presets)}, auto")
    return name, dict(presets[name])


def chapter_parameters(preset: dict) -> dict[str, Any]:
    """What the runner injects into each chapter's parameters cell: the preset without its bench block."""
    return {key: value for key, value in preset.items() if key != BENCH}


def bench_defaults(preset: dict) -> dict[str, Any]:
    """``python -m kernels.bench``'s defaults on the preset's device: its sweep's sequence lengths
    and head dims, and the preset's dtype (as a one-item list), batch and heads."""
    sweep = preset[BENCH]
    return {"seq": list(sweep["seq"]), "head_dim": list(sweep["head_dim"]), "dtype": [preset["dtype"]],
            "batch": preset["batch"], "heads": preset["heads"]}
