"""Where the book is: the checkout, its table of contents, and the notebooks in reading order.

``ROOT`` is the checkout these tools sit in; ``find_root`` finds the one a command runs in
(the tools are not installed with the library: they build from a checkout). ``toc_files``
reads ``_toc.yml``, ``notebooks`` lists the book's notebooks in its order, and ``select`` is
the runner's ``--only``. ``COPIED`` is what the runner stages, ``UNSOLVED`` the folder of the
exercises' learner copies. The runner, its cache, the HTML build and the converter share it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]  # tools/book/layout.py -> the checkout
COPIED = ("_config.yml", "_toc.yml", "book")
# Exercise notebooks as a learner should download them: unsolved (solutions = False), no outputs.
UNSOLVED = "unsolved"


def find_root(start: Optional[Path] = None) -> Path:
    """The course checkout to build: the first folder holding ``_toc.yml`` from ``start``
    (default: the working directory) upwards, else the checkout this package sits in.

    The runner is not installed with the package: it builds from a checkout (or ``--root``),
    and says so when there is none.
    """
    start = Path(start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "_toc.yml").exists():
            return folder
    if (ROOT / "_toc.yml").exists():
        return ROOT
    raise SystemExit(f"no course checkout here: no _toc.yml in {start} or above it. The runner builds the book "
                     "from a checkout of the repository; run it there, or pass --root PATH")


# ---------------------------------------------------------------------- the table of contents

def toc_files(toc_path: Path) -> list[str]:
    """Every ``file:`` entry of a Jupyter Book ``_toc.yml``, in reading order."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    walk(toc.get("chapters"))
    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return files


def notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks of the book, relative to ``root``, in the order of ``_toc.yml``."""
    return [Path(f).with_suffix(".ipynb") for f in toc_files(root / "_toc.yml")
            if (root / f).with_suffix(".ipynb").exists()]


def select(paths: list[Path], only: list[str] | None) -> list[Path]:
    """Keep notebooks whose path contains any of ``only`` (``01``, ``naive``, ``exercises/01``)."""
    if not only:
        return paths
    chosen = [p for p in paths if any(o in p.as_posix() for o in only)]
    if not chosen:
        raise SystemExit(f"--only {' '.join(only)} matches none of: {', '.join(p.as_posix() for p in paths)}")
    return chosen
