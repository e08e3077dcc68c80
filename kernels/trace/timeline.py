"""The timeline figure: one step drawn as Perfetto draws it, one row per *track*.

``tracks(step)`` lists the rows from top to bottom: the label itself; the CPU ops of each
thread that ran in the step, one track per nesting depth (the label's own thread first, then
e.g. the autograd thread of a training step); then one track per GPU stream, so kernels that
overlap on different streams are seen overlapping. ``timeline(step)`` draws them, with grey
lines for Perfetto's flow arrows from each launch to its GPU work.

Drawn on matplotlib ``Figure``/``Axes`` objects, never through pyplot's global state: pass
``ax`` to draw into a figure of your own, or get a new ``Figure`` back. Text keeps the book's
font floor (``kernels.figures``), a bar is labelled only where its name fits inside it, and
axes that share their x axis all span the longest step drawn on them.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

from kernels.figures import apply_font_floor, font_floor
from kernels.trace.reader import Step

LEGEND = [("matmul / GEMM", "#1f77b4"), ("copy", "#d62728"), ("mask / fill", "#ff7f0e"),
          ("softmax", "#2ca02c"), ("fused attention", "#9467bd"), ("other", "#8c8c8c")]


def color(name: str) -> str:
    """The colour a bar gets from what its name says it does."""
    n = name.lower()
    if "copy" in n or "clone" in n or "memcpy" in n:
        return "#d62728"  # copies in red: they are what chapter 1 hunts
    if "mm" in n or "gemm" in n or "matmul" in n or "linear" in n:
        return "#1f77b4"
    if "softmax" in n:
        return "#2ca02c"
    if "attention" in n or "flash" in n or "fmha" in n or "attn" in n:
        return "#9467bd"
    if "fill" in n or "where" in n or "tril" in n or "triu" in n or "mask" in n:
        return "#ff7f0e"
    return "#8c8c8c"


def tracks(step: Step, views: bool = False) -> list[tuple]:
    """The figure's rows in order: ``("label",)``, ``("cpu", pid, tid, depth)`` and
    ``("gpu", device, stream)``."""
    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    rows: list[tuple] = [("label",)]
    own = step.thread
    threads = sorted({(p, t) for p, t in zip(ops["pid"], ops["tid"])} | {own},
                     key=lambda th: (th != own, _first_ts(ops, th)))
    for pid, tid in threads:
        mine = ops[(ops["pid"] == pid) & (ops["tid"] == tid)]
        depth = int(mine["depth"].max()) + 1 if not mine.empty else (1 if (pid, tid) == own else 0)
        rows += [("cpu", pid, tid, d) for d in range(depth)]
    k = step.gpu_work
    streams = sorted({(str(d), str(s)) for d, s in zip(k["device"], k["stream"])}, key=_natural)
    return rows + [("gpu", d, s) for d, s in streams]


def _first_ts(ops, thread) -> float:
    mine = ops[(ops["pid"] == thread[0]) & (ops["tid"] == thread[1])]
    return float(mine["ts"].min()) if not mine.empty else 0.0


def _natural(key):
    return tuple((0, int(x)) if str(x).lstrip("-").isdigit() else (1, str(x)) for x in key)


# What a bar's name says before the part that tells bars apart: dropped from the drawn label,
# so a backward's bars read "MmBackward0", not "autogra…" (the trace keeps the full names).
NAME_PREFIXES = ("autograd::engine::evaluate_function: ", "aten::")
TRACK_NAME_CHARS = 40  # a longer label (a benchmark's "[param|...]" range) would squeeze the tracks


def without_shared_prefix(name: str) -> str:
    """A bar's name without the prefix many bars share."""
    for prefix in NAME_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def track_name(track: tuple, step: Step, several_devices: bool) -> str:
    """A track's y-axis label: ``label: ...``, ``CPU depth 1``, ``thread 7 depth 0`` or ``GPU stream 7``."""
    if track[0] == "label":
        label = step.label if len(step.label) <= TRACK_NAME_CHARS else step.label[:TRACK_NAME_CHARS - 1] + "…"
        return f"label: {label}"
    if track[0] == "cpu":
        _, pid, tid, depth = track
        return f"CPU depth {depth}" if (pid, tid) == step.thread else f"thread {tid} depth {depth}"
    _, device, stream = track
    return f"GPU {device} stream {stream}" if several_devices else f"GPU stream {stream}"


def timeline(step: Step, ax=None, title: Optional[str] = None, min_label_frac: float = 0.06,
             views: bool = False, window_ms: Optional[tuple[float, float]] = None) -> Figure:
    """Draw one step; returns the Figure (a new one unless ``ax`` is given).

    Time is in milliseconds from the start of the label. Bars of one track and colour are
    drawn as one collection, so a training step's thousands of ops draw quickly. ``window_ms``
    (start, end) zooms into part of the step: bars are labelled and sized for that window.
    """
    if window_ms is not None and not (0 <= window_ms[0] < window_ms[1]):
        raise ValueError(f"window_ms must be (start, end) with 0 <= start < end, not {window_ms}")
    rows = tracks(step, views)
    owns_figure = ax is None
    if owns_figure:
        ax = Figure(figsize=(8.5, 0.45 * len(rows) + 1.4)).add_subplot()
    fig = ax.figure
    size = font_floor(fig)
    ops = step.ops if views else step.ops[~step.ops["is_view"]]
    k = step.gpu_work
    ends = (k["start_us"] + k["dur_us"]).tolist() + (ops["start_us"] + ops["dur_us"]).tolist()
    span_ms = max([step.cpu_time_us] + ends) / 1e3 or 1.0
    bars = _Bars(ax, span_ms if window_ms is None else window_ms[1] - window_ms[0], min_label_frac, size)
    bars.draw(step, ops, rows)
    several = len({track[1] for track in rows if track[0] == "gpu"}) > 1
    ax.set_yticks(range(len(rows)), [track_name(track, step, several) for track in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # top track first, as in Perfetto
    ax.set_xlabel("time since the labelled call began (ms)")
    if window_ms is None:
        _span_shared_x(ax, span_ms)
    else:
        ax.set_xlim(*window_ms)
    drawn = [(label, c) for label, c in LEGEND if c in bars.colours()]
    # The legend in a row of its own right above the tracks, the title above that row (its pad
    # leaves the room), so a long title never runs under the legend; outside the data.
    ax.set_title(title or f"{step.label}: one step ({'CPU + GPU' if not k.empty else 'CPU only'})",
                 pad=2.4 * size)
    ax.legend(handles=[Patch(color=c, label=label) for label, c in drawn], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncol=len(drawn), fontsize=size, frameon=False,
              borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)
    ax.title.set_horizontalalignment("left")
    ax.title.set_position((0.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    apply_font_floor(fig)
    if owns_figure:
        fig.tight_layout()
    return fig


def _span_shared_x(ax, span_ms: float) -> None:
    """Set the x limit to this step's span, or to the longest span drawn on any axes sharing
    this x axis: one shared axis, every step shown whole."""
    ax._timeline_span_ms = span_ms
    siblings = ax.get_shared_x_axes().get_siblings(ax)
    longest = max(getattr(a, "_timeline_span_ms", 0.0) for a in siblings)
    ax.set_xlim(0, longest * 1.02)


class _Bars:
    """Collects bars by (track, colour) and labels for the wide ones, then draws them at once."""

    def __init__(self, ax, span_ms: float, min_label_frac: float, fontsize: float):
        self.ax, self.span_ms, self.min_label_frac, self.fontsize = ax, span_ms, min_label_frac, fontsize
        self.bars: defaultdict[tuple, list[tuple[float, float]]] = defaultdict(list)  # (y, colour) -> [(start, width)]
        self.texts: list = []

    def colours(self) -> set:
        """The colours of the bars drawn: the legend's categories."""
        return {c for _, c in self.bars}

    def add(self, y, start_us, dur_us, name):
        self.bars[(y, color(name))].append((start_us / 1e3, max(dur_us / 1e3, self.span_ms * 0.002)))
        if dur_us / 1e3 >= self.min_label_frac * self.span_ms:
            self.texts.append((start_us / 1e3, (start_us + dur_us) / 1e3, y, without_shared_prefix(name)))

    def draw(self, step: Step, ops, rows: list) -> None:
        y_of = {track: i for i, track in enumerate(rows)}
        self.add(0, 0, step.cpu_time_us, step.label)
        for name, pid, tid, depth, start, dur in zip(ops["name"], ops["pid"], ops["tid"], ops["depth"],
                                                     ops["start_us"], ops["dur_us"]):
            self.add(y_of[("cpu", pid, tid, depth)], start, dur, name)
        k, launch_y, arrows = step.gpu_work, _launch_rows(rows, y_of), []
        for name, dev, stream, start, dur, launched, thread in zip(
                k["name"], k["device"], k["stream"], k["start_us"], k["dur_us"], k["launch_start_us"], k["thread"]):
            gy = y_of[("gpu", str(dev), str(stream))]
            self.add(gy, start, dur, name)
            # The flow arrow Perfetto draws: from the CPU launch call to the GPU work it queued.
            ly = launch_y.get(str(thread), launch_y.get(None, 0))
            arrows.append([(launched / 1e3, ly + 0.4), (start / 1e3, gy - 0.4)])
        for (y, c), spans in self.bars.items():
            self.ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=c, edgecolors="white", linewidth=0.5)
        for x0, x1, y, text in self.texts:
            self.ax.add_artist(BarLabel(x0, x1, y, text, fontsize=self.fontsize))
        if arrows:
            self.ax.add_collection(LineCollection(arrows, colors="#bbbbbb", linewidths=0.6, zorder=0))


class BarLabel(Text):
    """A bar's name, centred in it: shortened with "…" to fit the bar's width as drawn, and
    not drawn at all where not even a few letters fit (so labels never spill over bars)."""

    def __init__(self, x0: float, x1: float, y: float, name: str, **kwargs):
        super().__init__((x0 + x1) / 2, y, name, ha="center", va="center", color="white",
                         clip_on=True, **kwargs)
        self.x0, self.x1, self.name = x0, x1, name

    def fitted(self, renderer) -> str:
        """The longest prefix of the name (with "…" when cut) that fits inside the bar."""
        assert self.axes is not None, "a bar label is drawn only once add_artist gave it its axes"
        left, right = self.axes.transData.transform([(self.x0, 0), (self.x1, 0)])[:, 0]
        room = abs(right - left) - 0.8 * float(self.get_fontsize()) * renderer.points_to_pixels(1)
        # No glyph is narrower than about a third of the font size: start from the most letters
        # that could fit, so long kernel names do not cost a measurement per letter.
        most = int(room / (0.3 * renderer.points_to_pixels(self.get_fontsize()))) + 1
        for n in range(min(len(self.name), max(most, 3)), 2, -1):
            text = self.name if n == len(self.name) else self.name[:n - 1] + "…"
            super().set_text(text)
            if self.get_window_extent(renderer).width <= room:
                return text
        return ""

    def draw(self, renderer):
        if not self.get_visible():
            return
        text = self.fitted(renderer)
        if text:
            super().draw(renderer)
        super().set_text(text)  # what was drawn, for whoever reads the figure afterwards


def _launch_rows(rows: list, y_of: dict) -> dict:
    """Per launching thread (tid), the row its arrows start from: its deepest CPU track."""
    deepest = {}
    for track in rows:
        if track[0] == "cpu":
            deepest[track[2]] = y_of[track]
            deepest.setdefault(None, y_of[track])
    return deepest
