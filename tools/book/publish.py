"""Traces published with the book: each notebook's own trace folder, size budgets, and the copy
of every trace beside the pages, so the links ``kernels.trace.links`` writes resolve online.

The runner (``tools.book.execute``) gives each notebook ``trace_dir_for(notebook)``, fails a
notebook whose traces break a budget (``enforce_budget``), stages the recorded GPU runs
(``stage_recorded``); the HTML build copies every trace beside its page (``publish``).
A trace is at most ``PER_TRACE_BUDGET`` bytes (2 MiB), all of the book's together at most
``BOOK_BUDGET`` (25 MiB).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from kernels.trace.links import TRACES_FOLDER

PER_TRACE_BUDGET = 2 * 2**20
BOOK_BUDGET = 25 * 2**20
TRACE_PATTERN = "*.json.gz"
RECORDED_FOLDER = "book/data/recorded"  # recorded GPU runs (kernels.recorded), published as they are

HOW_TO_SHRINK = ("record fewer active steps (the chapter's `active_steps` parameter, or `active=` of "
                 "kernels.trace.record.profile), profile a smaller shape, or pass record_shapes=False / "
                 "profile_memory=False for that call")


def mib_text(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def trace_dir_for(notebook: Path) -> str:
    """The ``trace_dir`` parameter the runner gives a notebook: its own folder, so that two
    chapters that both profile "naive" never overwrite each other's trace."""
    return f"{TRACES_FOLDER}/{Path(notebook).stem}"


def trace_files(folder: Path) -> list[Path]:
    """Every trace file under ``folder`` (sorted)."""
    folder = Path(folder)
    return sorted(p for p in folder.rglob(TRACE_PATTERN) if p.is_file()) if folder.is_dir() else []


def budget_problems(paths: list[Path], root: Path, book_total: int,
                    per_trace: Optional[int] = None, book: Optional[int] = None) -> list[str]:
    """Messages for every trace over ``per_trace`` bytes, and for the book's total
    (``book_total``, these traces included) over ``book``; empty when all is well.
    The budgets default to ``PER_TRACE_BUDGET`` and ``BOOK_BUDGET`` as they are when called."""
    per_trace = PER_TRACE_BUDGET if per_trace is None else per_trace
    book = BOOK_BUDGET if book is None else book
    problems = []
    for p in paths:
        size = p.stat().st_size
        if size > per_trace:
            problems.append(f"trace {p.relative_to(root).as_posix()} is {mib_text(size)}, over the per-trace "
                            f"budget of {mib_text(per_trace)}: {HOW_TO_SHRINK}")
    if book_total > book:
        problems.append(f"the book's traces total {mib_text(book_total)} with "
                        f"{', '.join(p.relative_to(root).as_posix() for p in paths) or 'this notebook'}, "
                        f"over the book's budget of {mib_text(book)}: {HOW_TO_SHRINK}")
    return problems


def enforce_budget(row: dict, out: Path, notebook: Path) -> dict:
    """After a notebook ran: fail its report row if the traces it wrote break a budget.

    The notebook's traces are those in its own trace folder (``trace_dir_for``); the book's
    total counts every trace under ``out`` so far, recorded ones included.
    """
    out = Path(out)
    mine = trace_files(out / Path(notebook).parent / trace_dir_for(notebook))
    total = sum(p.stat().st_size for p in trace_files(out))
    row["traces"] = [{"path": p.relative_to(out).as_posix(), "bytes": p.stat().st_size} for p in mine]
    problems = budget_problems(mine, out, total)
    if problems and row.get("status") == "ok":
        row.update(status="failed", error="; ".join(problems))
    elif problems:
        row["error"] = f"{row.get('error')}; " + "; ".join(problems)
    return row


def stage_recorded(root: Path, out: Path) -> list[Path]:
    """Copy the repository's recorded traces (``book/data/recorded/``, if any) into the executed
    tree, so notebooks reach them as ``data/recorded/<gpu>/...`` and the build publishes them."""
    src, dst = Path(root) / RECORDED_FOLDER, Path(out) / RECORDED_FOLDER
    if dst.is_dir():
        shutil.rmtree(dst)
    if not src.is_dir():
        return []
    for p in trace_files(src):
        target = dst / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
    return trace_files(dst)


def publish(executed: Path, html_dir: Path) -> list[Path]:
    """Copy every trace of the executed tree into the HTML at the same relative path
    (``book/traces/01_naive/naive.json.gz`` beside ``book/01_naive.html``), so the links
    that ``links()`` wrote resolve on the published site. Returns the published files."""
    executed, html_dir = Path(executed), Path(html_dir)
    published = []
    for p in trace_files(executed):
        rel = p.relative_to(executed)
        if rel.parts[0] == "_build":  # a build folder inside the executed tree is not source
            continue
        target = html_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
        published.append(target)
    return published
