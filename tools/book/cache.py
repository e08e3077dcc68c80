"""The runner's execution cache: a notebook whose inputs are unchanged is restored, not executed.

``make book`` (and ``make test-book``) execute the book through ``tools.book.execute`` with
``--cache _build/cache``. Each executed notebook is kept there with the traces it wrote,
under a key of everything that decides its result:

* ``library_digest(root)``: one hash of the library, its CUDA sources, these build tools and the recorded GPU
  runs the chapters read;
* ``cache_key(...)``: that, the notebook's own source, its parameters, and the machine's
  torch, Triton and device.

``cache_store`` keeps a notebook's outputs (``notebook_outputs``: the executed notebook and
its trace folder) and its report row under its key; ``cache_restore`` puts them back into
the staged copy, or says it has none.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Optional

from tools.book import publish


def _library_folder() -> Path:
    """The ``kernels`` the notebooks will import (found, not imported: that would load torch)."""
    spec = importlib.util.find_spec("kernels")
    if spec is None or spec.origin is None:
        raise SystemExit("the runner needs the course's library: pip install -e . (make setup)")
    return Path(spec.origin).parent


def library_digest(root: Path, package: Optional[Path] = None) -> str:
    """One hash of everything a chapter's result depends on besides its own source: the
    library, its CUDA sources, and the recorded GPU runs chapters read."""
    h = hashlib.sha256()
    package = Path(package) if package else _library_folder()
    tools = Path(__file__).resolve().parent  # the runner itself: a change to how notebooks run re-runs them
    files = sorted([*package.rglob("*.py"), *package.rglob("csrc/*"), *tools.glob("*.py"),
                    *(Path(root) / "book" / "data").rglob("*.*")])
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(root: Path, path: Path, params: dict, library: str, env: dict) -> str:
    """What decides a notebook's executed result: its source, its parameters, the library,
    and the machine's torch, Triton and device."""
    h = hashlib.sha256((Path(root) / path).read_bytes())
    what = {"params": params, "library": library,
            "env": {k: env.get(k) for k in ("torch", "triton", "cuda", "device", "python")}}
    h.update(json.dumps(what, sort_keys=True, default=str).encode())
    return h.hexdigest()[:24]


def notebook_outputs(out: Path, path: Path) -> list[Path]:
    """The executed notebook and the folder of traces it wrote, relative to ``out``."""
    return [path, path.parent / publish.trace_dir_for(path)]


def cache_store(cache: Path, key: str, out: Path, path: Path, row: dict) -> None:
    entry = cache / key
    if entry.exists():
        shutil.rmtree(entry)
    for rel in notebook_outputs(out, path):
        src = out / rel
        if src.is_dir():
            shutil.copytree(src, entry / rel)
        elif src.exists():
            (entry / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, entry / rel)
    (entry / "row.json").write_text(json.dumps(row, indent=2))


def cache_restore(cache: Path, key: str, out: Path, path: Path) -> Optional[dict]:
    """Put a cached result back in ``out``; its report row, or None on a miss."""
    entry = cache / key
    if not (entry / "row.json").exists():
        return None
    for rel in notebook_outputs(out, path):
        src, dst = entry / rel, out / rel
        if src.is_dir():
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst)
        elif src.exists():
            shutil.copy2(src, dst)
    return {**json.loads((entry / "row.json").read_text()), "cached": True}
