"""``python -m kernels.bench``: time the registered implementations over a sweep and save the rows.

Each point (implementation, shape, dtype, causal, mode) is warmed up, timed over rotating
inputs, converted to TFLOP/s and GB/s, and its peak memory measured (kernels.bench.sweep);
a point that cannot run records why. Rows go to JSON and CSV (kernels.bench.results, which
also holds the performance goals MAINTAINING.md states).

    python -m kernels.bench --out bench_cpu                 # the CPU sweep, < 2 min on 2 cores
    python -m kernels.bench --mode forward training --device cuda --out bench_gpu
    python -m kernels.bench --mode decode --seq 4096 16384 --gqa 4 --out decode
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
                    "(FLOP/byte), peak memory; forward, training step, backward alone or decode token.",
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
    p.add_argument("--reps", type=int, default=30, help="timed calls per point, at most (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per point (default 3)")
    p.add_argument("--max-seconds", type=float, default=2.0,
                   help="time budget of a point's timed calls (default 2 s; at least 5 calls)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--warm-gpu", type=float, default=0.0, metavar="SECONDS",
                   help="on a GPU, run matmuls this long first so the clocks leave their idle state")
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
        repeats=args.repeats,
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
