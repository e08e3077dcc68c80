"""The benchmark harness: time every implementation over a sweep, and say what it achieved.

One *point* is one implementation at one shape (batch, heads, sequence length, head dim,
K/V heads), dtype, causal flag and mode: a forward, a training step (forward+backward), the
backward alone, or a decoding step (one query against a KV cache). For each point:

1. **Warm up** a few calls: first calls pay for kernel selection, compilation, caches.
2. **Time many calls** and keep the median (robust to the odd slow run) and the 10th and
   90th percentiles (the spread). On a GPU each call is bracketed by CUDA events, which
   time the GPU's own work; on a CPU by ``time.perf_counter``.
3. **Rotate the inputs** among pre-made sets (up to 256, together larger than the caches
   where that many allow): calling the same small q, k, v over and over would serve them
   from cache and flatter small shapes.
4. **Convert** the median into TFLOP/s and GB/s with the mode's own counts
   (``kernels.reference``): ``flops`` (causal halved; backward 2.5x forward, a training step
   3.5x) and ``io_bytes`` (implementations that write the S×S scores are charged for them);
   a decoding step ``decode_flops`` (4·B·Hq·Sk·D, never halved: one query row sees every key)
   and ``decode_bytes`` (the K/V cache read dominates; GQA divides it by Hq / Hkv). Each row
   also carries its arithmetic intensity (FLOP/byte).
5. **Measure peak memory** of one more call, apart from the timed ones (see MEMORY_METHODS).

Nothing stops the sweep: a point that cannot run records why (``status`` and ``reason``)
and the sweep goes on. Results save to JSON (with where, when and how they were made) and
CSV, and ``load_results`` reads either back.

    python -m kernels.bench --out bench_cpu                 # the CPU sweep, < 2 min on 2 cores
    python -m kernels.bench --mode forward training --device cuda --out bench_gpu
    python -m kernels.bench --mode decode --seq 4096 16384 --gqa 4 --out decode
    python -m kernels.bench --device cuda --impls triton --backward-only --repeats 3 --crosscheck
    python -m kernels.bench --mode context-parallel --world 2 --seq 1024   # ring, Ulysses, one device

This module is the CLI and the one name chapters import; the harness lives one concept per
module, and its names are re-exported here (``bench.sweep``, ``bench.compare``...):

- ``kernels.bench.results``: a row (``BenchResult``), the modes, statuses, the run's meta, JSON/CSV files;
- ``kernels.bench.timing``: synchronize, warm up, time calls, spread, peak memory, warm the GPU;
- ``kernels.bench.sweep``: input sets, the step each mode times, one point, the sweep;
- ``kernels.bench.comparison``: interleaved rounds of a few callables (``compare``, ``Comparison``);
- ``kernels.bench.gpu_checks``: Triton's own timers and the autotuner's choice (GPU only).

More than the medians, each row carries what makes a GPU number trustworthy:

* the first call (autotuning, compiling) is timed apart (``first_call_ms``), so the warm-up
  and the timed calls see the steady state;
* the Triton configs the autotuner chose (``config``, from each kernel's ``best_config``;
  None in the interpreter, which does not autotune);
* with ``repeats`` > 1, each round's median and their spread (``round_spread``);
* with ``crosscheck`` on a GPU, Triton's ``do_bench`` (L2 flushed between calls) and
  ``do_bench_cudagraph`` (a CUDA graph, no Python dispatch): a median far above the graph's
  means the point measured dispatch, not the kernel. On a CPU the row says it was not run;
* the run's ``meta["peaks"]``: the datasheet's ceilings next to a matmul and a copy measured
  on the same device just before.

Performance goals (not yet measured: no GPU run has recorded them). On H100/H200, causal
bf16, S 1k-16k, D 64 and 128, all in the same run: the ``triton`` forward at >= 1.0x the
speed of ``sdpa_flash`` (SDPA's FlashAttention-2 backend), ``triton`` forward+backward at
>= 0.85x, and ``cuda_v2``'s forward at >= 0.7x. ``.ci/device-run`` measures them in its bench
phase (``tools/gpu_run.py`` BENCH_ARGS: sdpa_flash, sdpa_cudnn, triton and cuda_v2 at S 1024,
2048, 4096, 16384, D 64 and 128, B 4, H 16, bf16, causal, forward and forward+backward); the
ratio is the two medians of one run at the same shape (``kernels.bench.results.GOALS`` and
``goal_ratios``; chapter 6 reads them from a recorded run). For scale, FlashAttention-3's paper
(arXiv 2407.08608, Fig. 5: H100, causal forward, D = 128, S 512 to 16k) gives Triton's kernel
146 to 378 TFLOP/s, FlashAttention-2 191 to 335 and cuDNN 315 to 539.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from kernels.presets import bench_defaults, load_presets
from kernels.registry import names
from kernels.bench.results import BACKWARD, DECODE, FORWARD, FORWARD_BACKWARD, STATUSES, save_results
from kernels.bench.sweep import sweep
from kernels.bench.timing import warm_gpu

# What --mode accepts: each mode's own name, and the words people use for it.
MODE_WORDS = {"forward": FORWARD, "fwd": FORWARD,
              "training": FORWARD_BACKWARD, "train": FORWARD_BACKWARD, "forward+backward": FORWARD_BACKWARD,
              "fwd+bwd": FORWARD_BACKWARD,
              "backward": BACKWARD, "bwd": BACKWARD,
              "decode": DECODE}


def split_list(values, kind=str) -> Optional[list]:
    """``--seq 128 256`` and ``--seq 128,256`` both mean [128, 256]."""
    if values is None:
        return None
    return [kind(v) for text in values for v in str(text).split(",") if v]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description="Benchmark attention implementations: latency, TFLOP/s, GB/s, arithmetic intensity "
                    "(FLOP/byte), peak memory; forward, training step, backward alone or decoding step.",
        epilog="Without options: the CPU sweep (S 128..2048, D 64, B 1, H 8, fp32, causal, forward). "
               "Modes: forward (Sq = Sk = S); training = forward+backward (FLOPs 3.5x the forward's); "
               "backward alone (2.5x); decode = one query (Sq = 1) against a KV cache of Sk = S keys "
               "(FLOPs 4·B·H·Sk·D, not halved by causal; bytes dominated by reading the cache).")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--impls", nargs="+", help=f"implementations (default: all; registered: {', '.join(names())})")
    p.add_argument("--mode", nargs="+", metavar="MODE",
                   help="forward, training (forward+backward), backward, decode; several allowed (default: forward)")
    p.add_argument("--seq", nargs="+", help="sequence lengths; in decode, KV cache lengths Sk (default per device)")
    p.add_argument("--head-dim", nargs="+", help="head dims (default 64 on CPU)")
    p.add_argument("--dtype", nargs="+", help="fp32, fp16, bf16 (default fp32 on CPU, bf16 on GPU)")
    p.add_argument("--batch", type=int, help="batch size (default 1 on CPU)")
    p.add_argument("--heads", type=int, help="number of query heads (default 8 on CPU)")
    p.add_argument("--gqa", type=int, default=1, metavar="RATIO",
                   help="grouped-query attention: query heads per K/V head, so K/V heads = heads / RATIO "
                        "(default 1; in every mode; it divides the K/V bytes, not the FLOPs)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal mask (default) or --no-causal")
    p.add_argument("--backward", action="store_true", help="also time forward+backward (same as adding --mode training)")
    p.add_argument("--backward-only", action="store_true",
                   help="also time the backward alone (FLOPs 2.5x the forward's; same as adding --mode backward)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the sweep this many times and record each point's spread (default 1)")
    p.add_argument("--crosscheck", action="store_true",
                   help="on a GPU, also time each point with triton.testing.do_bench and do_bench_cudagraph")
    p.add_argument("--reps", type=int, default=30, help="timed calls per point, at most (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per point (default 3)")
    p.add_argument("--max-seconds", type=float, default=2.0,
                   help="time budget of a point's timed calls (default 2 s; at least 5 calls)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--warm-gpu", type=float, default=0.0, metavar="SECONDS",
                   help="on a GPU, run matmuls this long first so the clocks leave their idle state")
    p.add_argument("--world", type=int, default=2,
                   help="with --mode context-parallel: the number of ranks (processes; default 2)")
    p.add_argument("--out", default=str(Path("_build") / "bench" / "bench_results"),
                   help="output stem: writes OUT.json and OUT.csv (default: _build/bench/bench_results)")
    return p


def chosen_modes(args, cli: argparse.ArgumentParser) -> tuple:
    """The modes --mode names (forward if none), then --backward's and --backward-only's, each once."""
    words = split_list(args.mode) or ["forward"]
    unknown = [w for w in words if w.lower() not in MODE_WORDS]
    if unknown:
        cli.error(f"unknown mode(s) {', '.join(unknown)}; use forward, training, backward or decode")
    modes = [MODE_WORDS[w.lower()] for w in words]
    modes += [FORWARD_BACKWARD] * args.backward + [BACKWARD] * args.backward_only
    return tuple(dict.fromkeys(modes))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cli = parser()
    args = cli.parse_args(argv)
    if "context-parallel" in (split_list(args.mode) or []):  # ranks in processes: kernels.parallel.programs
        from kernels.parallel import programs

        if args.world < 1:
            cli.error(f"--world must be a positive number of ranks, got {args.world}")
        args.argv = argv
        return programs.bench_main(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        cli.error("--device cuda needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    preset = bench_defaults(load_presets()["cuda" if device.type == "cuda" else "cpu"])  # kernels/presets.yml
    unknown = [n for n in split_list(args.impls) or [] if n not in names()]
    if unknown:
        cli.error(f"unknown implementation(s) {', '.join(unknown)}; registered: {', '.join(names())}")
    modes = chosen_modes(args, cli)
    heads = args.heads or preset["heads"]
    if args.gqa < 1 or heads % args.gqa:
        cli.error(f"--gqa {args.gqa} must be a positive divisor of the {heads} query heads")
    if device.type == "cuda" and args.warm_gpu > 0:
        print(f"warming the GPU for {args.warm_gpu:g} s", file=sys.stderr, flush=True)
        warm_gpu(args.warm_gpu, device)
    results = sweep(
        impls=split_list(args.impls),
        seqs=split_list(args.seq, int) or preset["seq"],
        head_dims=split_list(args.head_dim, int) or preset["head_dim"],
        dtypes=split_list(args.dtype) or preset["dtype"],
        causal=(args.causal,), modes=modes,
        repeats=args.repeats, crosscheck=args.crosscheck,
        batch=args.batch or preset["batch"], heads=heads, kv_heads=heads // args.gqa,
        device=device, reps=args.reps, warmup=args.warmup, max_seconds=args.max_seconds,
        memory=not args.no_memory, progress=sys.stderr,
        command=shlex.join(["python", "-m", "kernels.bench", *argv]))
    json_path, csv_path = save_results(results, args.out)
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print(f"{len(results)} points ({summary}); wrote {json_path} and {csv_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
