"""Profile a callable: run it under ``torch.profiler`` and read its trace back as data.

``profile(fn, q, k, v)`` runs ``fn`` for a few steps under ``torch.profiler`` (wait, warm-up,
active), each call inside a ``record_function`` label, exports the Chrome/Perfetto trace
(the file you would open in Perfetto), and reads that file back with ``kernels.trace.reader``.

Why parse the exported file instead of ``prof.key_averages()``? Because the trace keeps
what the averages throw away: order, nesting, which call each op belongs to, and the
GPU kernels' launch footprint. It is also the file a reader opens in Perfetto, so the book
and the UI cannot disagree.
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

from kernels.trace.reader import Step, Trace, load_trace

if TYPE_CHECKING:
    from torch.autograd.profiler_util import EventList

@dataclass
class ProfiledRun:
    """What ``profile()`` returns: the trace file, the parsed trace, and the averages table."""

    label: str
    trace_path: Path
    trace: "Trace"
    averages: "EventList"  # prof.key_averages(): its .table() is PyTorch's own summary table

    def steps(self) -> list["Step"]:
        return self.trace.steps(self.label)

    def step(self, index: int = -1) -> "Step":
        return self.steps()[index]


def profile(fn: Callable, *args, label: Optional[str] = None, wait: int = 1, warmup: int = 2,
            active: int = 3, trace_dir: str | os.PathLike = "traces", trace_name: Optional[str] = None,
            record_shapes: bool = True, profile_memory: bool = True, with_stack: bool = False,
            **kwargs) -> ProfiledRun:
    """Call ``fn(*args, **kwargs)`` for ``wait + warmup + active`` steps under the profiler.

    Each call runs inside ``record_function(label)``; only the ``active`` steps are
    recorded. On a GPU every step ends with a synchronize so that one step's kernels do
    not spill into the next step. Runs under ``torch.no_grad()`` unless an input
    requires grad. The trace is written to ``trace_dir/<trace_name>.json.gz``.
    """
    label = label or str(getattr(fn, "__name__", "step"))
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"{trace_name or label}.json.gz"
    needs_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    with quiet_kineto(), torch.set_grad_enabled(needs_grad), torch.profiler.profile(
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
    return ProfiledRun(label, path, load_trace(path), prof.key_averages())


# Kineto's start/stop status lines, and c10's note when a block allocated before profiling
# began is freed during it (harmless: the trace simply has no size for that block).
KINETO_NOISE = re.compile(r"^(USDT|STAGE):.*SyncActivityProfilerHandler|.*CPUAllocator.*Memory block of unknown size")


@contextlib.contextmanager
def quiet_kineto():
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


def mlp_step(x, w):
    """The profiler primer's first subject: a matrix product, then a ReLU. Two ops at the top
    level of its trace (``matmul``, ``relu``), with ``matmul`` dispatching to ``mm`` beneath:
    small enough to read every row, and the two ops differ in arithmetic by a factor of the
    inner dimension (``x.shape[1]`` multiply-adds per output element against one comparison)."""
    return torch.relu(x @ w)
