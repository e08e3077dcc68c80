"""Profile a function: run it under ``torch.profiler`` and read its trace back as data.

``profile(fn, q, k, v)`` runs ``fn`` for a few steps under ``torch.profiler`` (wait, warm-up,
active), each call inside a ``record_function`` label, exports the Chrome/Perfetto trace
(the file you would open in Perfetto), and reads that file back with ``kernels.trace``.

Why parse the exported file instead of ``prof.key_averages()``? Because the trace keeps
what the averages throw away: order, nesting, which call each op belongs to, and the
GPU kernels' launch footprint (grid, block, registers, shared memory, occupancy). It is
also the same file a reader opens in Perfetto, so the book and the UI cannot disagree.

This module records. The rest lives one job per module, and is re-exported here so that
``profiling.load_trace``, ``profiling.diff``, ``profiling.timeline`` and friends keep working:

- ``kernels.trace``: a trace file as tables (``load_trace``, ``Trace``, ``Step``, ``median_step``);
- ``kernels.trace_tables``: what the chapters display of a step (``op_table``, ``kernel_table``,
  ``counts``);
- ``kernels.tracediff``: what changed between two steps (``diff``, ``StepDiff``);
- ``kernels.timeline``: the timeline figure, drawn on ``Figure`` objects.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from . import timeline as _timeline
from . import tracediff as _tracediff
from .trace import (DTYPE_BYTES, GPU_CATEGORIES, LAUNCH_CATEGORIES, VIEW_OPS, Step, Trace,  # noqa: F401
                    _inclusive, _shape_bytes, load_trace, median_step, read_events)
from .trace_tables import counts, kernel_table, op_table  # noqa: F401
from .tracediff import StepDiff  # noqa: F401

if TYPE_CHECKING:
    from torch.autograd.profiler_util import EventList

# ----------------------------------------------------------------------------- recording

@dataclass
class Profile:
    """What ``profile()`` returns: the trace file, the parsed trace, and the averages table."""

    label: str
    trace_path: Path
    trace: "Trace"
    averages: "EventList"  # prof.key_averages()

    def steps(self) -> list["Step"]:
        return self.trace.steps(self.label)

    def step(self, index: int = -1) -> "Step":
        return self.steps()[index]

    def table(self, sort_by: str = "cpu_time_total", row_limit: int = 12) -> str:
        """PyTorch's own summary table (``prof.key_averages().table()``)."""
        return self.averages.table(sort_by=sort_by, row_limit=row_limit)


def profile(fn: Callable, *args, label: Optional[str] = None, wait: int = 1, warmup: int = 2,
            active: int = 3, trace_dir: str | os.PathLike = "traces", trace_name: Optional[str] = None,
            record_shapes: bool = True, profile_memory: bool = True, with_stack: bool = False,
            **kwargs) -> Profile:
    """Call ``fn(*args, **kwargs)`` for ``wait + warmup + active`` steps under the profiler.

    Each call runs inside ``record_function(label)``; only the ``active`` steps are
    recorded. On a GPU every step ends with a synchronize so that one step's kernels do
    not spill into the next step's lane. Runs under ``torch.no_grad()`` unless an input
    requires grad. The trace is written to ``trace_dir/<trace_name>.json.gz``.
    """
    label = label or getattr(fn, "__name__", "step")
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"{trace_name or label}.json.gz"
    needs_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    with _quiet_kineto(), torch.set_grad_enabled(needs_grad), torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
    ) as prof:
        for _ in range(wait + warmup + active):
            with record_function(label):
                fn(*args, **kwargs)
            if on_gpu:
                torch.cuda.synchronize()
            prof.step()
    return Profile(label, path, load_trace(path), prof.key_averages())


# Kineto's start/stop status lines, and c10's note when a block allocated before profiling
# began is freed during it (harmless: the trace simply has no size for that block).
KINETO_NOISE = re.compile(r"^(USDT|STAGE):.*SyncActivityProfilerHandler|.*CPUAllocator.*Memory block of unknown size")


@contextlib.contextmanager
def _quiet_kineto():
    """Drop Kineto's start/stop status lines, which it writes straight to file descriptor 2
    (so Jupyter shows them in every cell); everything else written there is passed on."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded interpreters): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                    if not KINETO_NOISE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))


# ----------------------------------------------------------------------- re-exports, shown
#
# The chapters call ``fig = profiling.timeline(step)`` and ``changes.figure()`` and rely on
# the notebook showing the figure at the end of the cell, which only a pyplot-managed figure
# does. ``kernels.timeline`` and ``kernels.tracediff`` draw on Figure objects of their own;
# these two thin wrappers keep the chapters' figures showing by drawing them into a pyplot
# figure. New code calls the modules themselves and displays the Figure it gets back.

def _pyplot_axes(figsize):
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize).add_subplot()


def timeline(step: Step, ax=None, title: Optional[str] = None, min_label_frac: float = 0.06,
             views: bool = False):
    """``kernels.timeline.timeline`` into a pyplot figure (shown at the end of a notebook cell)."""
    if ax is None:
        ax = _pyplot_axes((11, 0.45 * len(_timeline.lanes(step, views)) + 1.4))
        fig = _timeline.timeline(step, ax=ax, title=title, min_label_frac=min_label_frac, views=views)
        fig.tight_layout()
        return fig
    return _timeline.timeline(step, ax=ax, title=title, min_label_frac=min_label_frac, views=views)


class _ShownStepDiff(StepDiff):
    """A ``StepDiff`` whose ``figure()`` goes to a pyplot figure (see the note above)."""

    def figure(self, ax=None, max_rows: int = 12):
        if ax is None:
            rows = len(self.changed().head(max_rows))
            ax = _pyplot_axes((10, 0.7 * max(rows, 1) + 1.8))
        return super().figure(ax=ax, max_rows=max_rows)


def diff(a: Step, b: Step, label_a: Optional[str] = None, label_b: Optional[str] = None) -> StepDiff:
    """``kernels.tracediff.diff``, its figure shown in a notebook cell."""
    d = _tracediff.diff(a, b, label_a, label_b)
    return _ShownStepDiff(d.a, d.b, d.label_a, d.label_b, d.ops, d.kernels)
