"""A trace beside its figure: "Download trace" and "Open in Perfetto" links, as a page shows them.

``links(run_or_step_or_path)`` is what a chapter shows (as a cell's last expression). The link
is the trace's path relative to the notebook's folder, which is also its URL relative to the
page: the build publishes the executed tree as it is (``tools/book/publish.py``). "Open in
Perfetto" uses Perfetto's deep-linking handshake (``window.open`` the UI, post ``"PING"`` until
it answers ``"PONG"``, then post the file's bytes); the browser side is
``book/_static/perfetto.js``.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kernels.trace.events import read_events

PERFETTO_UI = "https://ui.perfetto.dev"
TRACES_FOLDER = "traces"    # under each notebook's folder: traces/<notebook name>/<label>.json.gz


def readable_size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


# ------------------------------------------------------------------------ on the page

def _resolve(source) -> Path:
    """A trace path from a ProfiledRun, a Step, a Trace or a path."""
    for attr in ("trace_path", "path"):  # ProfiledRun.trace_path, Trace.path
        if hasattr(source, attr) and getattr(source, attr) is not None:
            return Path(getattr(source, attr))
    trace = getattr(source, "trace", None)  # a Step
    if trace is not None and getattr(trace, "path", None) is not None:
        return Path(trace.path)
    if isinstance(source, (str, os.PathLike)):
        return Path(source)
    raise TypeError(f"links() takes a ProfiledRun, a Step or a trace path, got {type(source).__name__}")


def _device_of(path: Path) -> str:
    """The device a trace was recorded on, from the trace itself: the GPU's name, or "CPU"."""
    try:
        props = read_events(path).get("deviceProperties") or []
    except (OSError, ValueError):
        return "unknown device"
    names = sorted({str(p["name"]) for p in props if isinstance(p, dict) and p.get("name")})
    return ", ".join(names) if names else "CPU"


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


def links(source, title: Optional[str] = None) -> TraceLinks:
    """The links to show beside a trace's figure or table, e.g. ``traces.links(run)``.

    ``source`` is what ``profiling.profile`` returned, one of its steps, or a trace path
    (a recorded trace: ``"data/recorded/nvidia-a100-sxm4-80gb/01_naive/naive.json.gz"``). The title Perfetto shows names
    the chapter (the trace's folder, which the runner names after the notebook),
    the variant (the file name) and the device the trace was recorded on.
    """
    path = _resolve(source)
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}: profile(..., trace_dir=trace_dir) writes it first")
    chapter = path.parent.name if path.parent.name not in (TRACES_FOLDER, "", ".") else ""
    variant = path.name.removesuffix(".json.gz").removesuffix(".json")
    title = title or " · ".join(p for p in (chapter, variant, _device_of(path)) if p)
    # The notebook runs in its own folder, and the page is published beside the same tree.
    url = Path(os.path.relpath(path.resolve(), Path.cwd().resolve())).as_posix()
    if url.startswith("../"):
        url = published_copy(path) or url
    return TraceLinks(path=path, url=url, title=title, size=path.stat().st_size)


def published_copy(path: Path, depth: int = 3) -> Optional[str]:
    """The copy of ``path`` in the tree beside the notebook, by the last ``depth`` parts of its
    path at most (``data/borrowed/<file>`` for a borrowed trace read from the checkout): a link
    above the notebook's folder would leave the published site. None where there is none."""
    for k in range(min(depth, len(path.parts)), 0, -1):
        beside = Path(*path.parts[-k:])
        if beside.is_file():
            return beside.as_posix()
    return None
