"""Traces as reader artifacts: every trace a chapter records is published with the book.

A figure drawn from a trace is a summary; the trace itself is the evidence. So the book keeps
every trace its chapters record, next to the pages, and each figure can carry two links:

- **Download trace**: the compressed Chrome/Perfetto JSON file itself (``*.json.gz``).
- **Open in Perfetto**: opens https://ui.perfetto.dev in a new window and hands it the file's
  bytes. This uses Perfetto's documented deep-linking handshake: ``window.open`` the UI, post
  ``"PING"`` to it until it answers ``"PONG"`` (its message channel drops anything sent before
  its listener exists), then post ``{perfetto: {buffer, title, fileName}}``. Perfetto accepts
  gzip-compressed traces as they are, so the bytes posted are exactly the published file.
  Where the book is served over HTTPS, a third link uses Perfetto's ``?url=`` deep link, which
  lets Perfetto fetch the file itself (that needs a public HTTPS URL and CORS, which static
  hosting such as GitHub Pages provides).

The browser side lives in ``book/_static/perfetto.js``; this module is the Python side:

- ``links(profile_or_path)``: the HTML a notebook shows beside a figure (call it as a cell's
  last expression). The link is the trace's path relative to the notebook's folder, which is
  also its URL relative to the page, because the build publishes the executed tree as it is.
- ``enforce_budget(...)``, ``publish(...)``, ``stage_recorded(...)``: what the runner
  (``kernels.execute``) calls to keep traces small, and to ship them with the HTML.

Budgets: a trace is at most ``PER_TRACE_BUDGET`` bytes (2 MiB) and all traces of the book
together at most ``BOOK_BUDGET`` (25 MiB). The profiler already exports only the *active*
steps of its schedule, compressed; a trace over budget fails the notebook that wrote it with
a message saying how to shrink it.
"""
from __future__ import annotations

import html
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PER_TRACE_BUDGET = 2 * 2**20
BOOK_BUDGET = 25 * 2**20
PERFETTO_UI = "https://ui.perfetto.dev"
TRACE_PATTERN = "*.json.gz"
TRACES_FOLDER = "traces"    # under each notebook's folder: traces/<notebook name>/<label>.json.gz
RECORDED_FOLDER = "book/data/recorded"  # recorded GPU runs (kernels.recorded), published as they are

HOW_TO_SHRINK = ("record fewer active steps (the chapter's `active_steps` parameter, or `active=` of "
                 "kernels.profiling.profile), profile a smaller shape, or pass record_shapes=False / "
                 "profile_memory=False for that call")


def mib_text(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def readable_size(nbytes: float) -> str:
    return mib_text(nbytes) if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


# ------------------------------------------------------------------------ on the page

def _resolve(source) -> Path:
    """A trace path from a Profile, a Step, a Trace or a path."""
    for attr in ("trace_path", "path"):  # Profile.trace_path, Trace.path
        if hasattr(source, attr) and getattr(source, attr) is not None:
            return Path(getattr(source, attr))
    trace = getattr(source, "trace", None)  # a Step
    if trace is not None and getattr(trace, "path", None) is not None:
        return Path(trace.path)
    if isinstance(source, (str, os.PathLike)):
        return Path(source)
    raise TypeError(f"links() takes a Profile, a Step or a trace path, got {type(source).__name__}")


def _device_of(path: Path) -> str:
    """The device a trace was recorded on, from the trace itself: the GPU's name, or "CPU"."""
    from .profiling import read_events

    try:
        props = read_events(path).get("deviceProperties") or []
    except (OSError, ValueError):
        return "unknown device"
    names = sorted({p.get("name") for p in props if isinstance(p, dict) and p.get("name")})
    return ", ".join(names) if names else "CPU"


def relative_url(path: Path, start: Optional[Path] = None) -> str:
    """``path`` relative to ``start`` (default: the working directory) as a URL path."""
    start = Path(start or os.getcwd()).resolve()
    rel = os.path.relpath(Path(path).resolve(), start)
    return Path(rel).as_posix()


@dataclass
class TraceLinks:
    """The "Download trace" / "Open in Perfetto" links of one trace; shows as HTML."""

    path: Path
    url: str
    title: str
    size: int

    def __repr__(self) -> str:
        return f"trace: {self.url} ({readable_size(self.size)}), {self.title}"

    def _repr_html_(self) -> str:
        e = lambda s: html.escape(str(s), quote=True)  # noqa: E731 (one-line escaper)
        name = self.path.name
        return (
            f'<div class="ap-trace" data-trace-url="{e(self.url)}" data-trace-title="{e(self.title)}" '
            f'data-trace-file="{e(name)}">'
            f'<a class="ap-trace-download" href="{e(self.url)}" download="{e(name)}">Download trace</a> '
            f'<a class="ap-trace-perfetto" href="{e(PERFETTO_UI)}" target="_blank" rel="noopener" '
            f'title="Opens the Perfetto UI in a new window and loads this trace into it">Open in Perfetto</a> '
            f'<span class="ap-trace-info">{e(name)}, {e(readable_size(self.size))}: {e(self.title)}</span>'
            f'</div>'
        )


def links(source, title: Optional[str] = None, chapter: Optional[str] = None,
          start: Optional[Path] = None) -> TraceLinks:
    """The links to show beside a trace's figure or table, e.g. ``traces.links(run)``.

    ``source`` is what ``profiling.profile`` returned, one of its steps, or a trace path
    (a recorded trace: ``"data/recorded/nvidia-a100-sxm4-80gb/01_naive/naive.json.gz"``). The title Perfetto shows names
    the chapter (by default the trace's folder, which the runner names after the notebook),
    the variant (the file name) and the device the trace was recorded on.
    """
    path = _resolve(source)
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}: profile(..., trace_dir=trace_dir) writes it first")
    if chapter is None:
        chapter = path.parent.name if path.parent.name not in (TRACES_FOLDER, "", ".") else ""
    variant = path.name.removesuffix(".json.gz").removesuffix(".json")
    title = title or " · ".join(p for p in (chapter, variant, _device_of(path)) if p)
    return TraceLinks(path=path, url=relative_url(path, start), title=title, size=path.stat().st_size)


# ------------------------------------------------------------------------- the runner

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
