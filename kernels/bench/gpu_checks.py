"""What makes a GPU benchmark number trustworthy, beyond its median: checks that need a GPU.

- ``cross_check``: the same timed call timed by Triton's own timers, ``do_bench`` (L2 flushed between
  calls) and ``do_bench_cudagraph`` (a CUDA graph: no Python dispatch). A median far above the
  graph's means the point measured dispatch and launch overhead, not the kernel.
- ``chosen_configs``: the Triton configs the autotuner picked for the last call.

On a CPU these say they were not run, and why; nothing here fails for lack of a GPU or Triton.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

import torch

from kernels.bench.results import first_line

# Where each autotuned kernel lives: (module, attribute).
TRITON_KERNELS = {"fwd": ("kernels.triton.flash", "attn_fwd_tuned"), "fwd_tma": ("kernels.triton.flash", "attn_fwd_tma_tuned"),
                  "bwd_dkdv": ("kernels.triton.backward", "attn_bwd_dkdv_tuned"),
                  "bwd_dq": ("kernels.triton.backward", "attn_bwd_dq_tuned")}


def chosen_configs(name: str) -> Optional[str]:
    """The configs Triton's autotuner chose in the last call of ``name`` (JSON), or None.

    Only the ``triton`` implementation is autotuned; in the interpreter it is not (its
    kernels are plain functions without ``best_config``), and then this is None too.
    """
    if name != "triton":
        return None
    # Read from the modules only if they are loaded: asking must not import Triton.
    chosen = {}
    for short, (module, attr) in TRITON_KERNELS.items():
        config = getattr(getattr(sys.modules.get(module), attr, None), "best_config", None)
        if config is not None:
            chosen[short] = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return json.dumps(chosen, sort_keys=True) if chosen else None


def cross_check(timed_call, device: torch.device) -> tuple[Optional[float], Optional[float], str]:
    """(do_bench ms, do_bench_cudagraph ms, note): Triton's own timers on the same timed call.

    ``triton.testing.do_bench`` clears a 256 MB buffer (the L2) before each call and times
    with CUDA events; ``do_bench_cudagraph`` captures the call in a CUDA graph and replays it,
    which takes the CPU's dispatch out. Where our median sits far above the graph's, the point
    measures Python and launch overhead rather than the kernel. Needs a CUDA GPU.
    """
    if device.type != "cuda":
        return None, None, f"not run: triton.testing.do_bench needs a CUDA GPU (device is {device.type})"
    try:
        from triton.testing import do_bench, do_bench_cudagraph
    except Exception as err:  # no Triton, or a broken one
        return None, None, f"not run: triton.testing unavailable ({type(err).__name__}: {err})"
    notes, flushed, graphed = [], None, None
    try:
        flushed = float(do_bench(timed_call, warmup=5, rep=50, return_mode="median"))
        notes.append("do_bench (L2 flushed, median)")
    except Exception as err:
        notes.append(f"do_bench failed: {first_line(err)}")
    try:
        graphed = float(do_bench_cudagraph(timed_call, rep=50, return_mode="median"))
        notes.append("do_bench_cudagraph (median)")
    except Exception as err:  # e.g. a call that cannot be captured
        notes.append(f"do_bench_cudagraph failed: {first_line(err)}")
    return flushed, graphed, "; ".join(notes)
