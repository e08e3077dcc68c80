"""Triton's cache for the GPU run, compiled on a CPU before the lease, and the check that a fresh
process finds every entry without compiling. Run it with the GPU image's stack (Python 3.12,
torch 2.11, Triton 3.6.0, NumPy < 2.4): Triton's cache key holds its version and build, so
only the same Triton's entries can be hits there::

    PY tools/triton_cache.py build _build/triton-cache    # compile the plan's launches for sm_90
    PY tools/triton_cache.py check _build/triton-cache    # a new process: every launch a hit?

How a launch is reproduced without a GPU: the course's own launchers
(``kernels.triton.flash.flash_forward``, ``kernels.triton.backward.flash_backward``) run on CPU
tensors of the launch's shape and dtype with the interpreter off; Triton's driver is replaced
by one that names an sm_90 GPU (``GPUTarget("cuda", 90, 32)``, what an H100/H200 reports) and
every launch becomes a ``warmup`` (compile, do not run). So the arguments, Triton's own binder
and specialization (16-byte pointer alignment, integers equal to 1 or multiples of 16), the
constexprs and the options are those of the real call; the autotuner's pruning runs with an
H200's shared-memory limit and each config it keeps is compiled, as the autotuner compiles each
before timing it. A listener (``triton.knobs.compilation.listener``) counts hits and compiles.

The folder also gets ``attention-profiled.json``: the Triton version, the hash of
``triton_key()`` (Triton's sources and libtriton, part of every cache key) and ptxas's version,
which the GPU run's environment phase compares with its own (tools/gpu_run.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = "attention-profiled.json"
SM90 = dict(major=9, minor=0, shared_memory_per_block_optin=232448, multi_processor_count=132,
            name="sm_90 stand-in (no GPU)")


def prepare(cache: Path):
    """Triton compiling for sm_90 in this process: its cache in ``cache``, launches as warmups."""
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    os.environ["TRITON_INTERPRET"] = "0"        # the course's kernels stay compiled objects
    os.environ.setdefault("TRITON_STORE_BINARY_ONLY", "1")   # cubins and metadata: the carry is 64 MiB
    sys.path.insert(0, str(ROOT))
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    class Sm90Driver:
        """What the JIT asks of a driver before it compiles: a device, a stream, its target."""
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

    driver.set_active(Sm90Driver())
    jit_run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return jit_run(self, *args, grid=grid, warmup=True, **kwargs)

    def every_kept_config(self, *args, **kwargs):
        """The autotuner's first call of a key: prune, then compile each config it would time."""
        self.nargs = dict(zip(self.arg_names, args))
        grid = kwargs.pop("grid")
        kwargs.pop("warmup", None)
        for config in self.prune_configs(kwargs):
            full = {**self.nargs, **kwargs, **config.all_kwargs()}
            if config.pre_hook:
                config.pre_hook(full)
            self.fn.run(*args, grid=grid, warmup=True, **kwargs, **config.all_kwargs())
        self.nargs = None

    JITFunction.run = compile_only
    Autotuner.run = every_kept_config
    setattr(torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(**SM90))  # mypy: a stand-in's type
    import kernels.triton.flash as tf
    tf._capability = lambda t: (SM90["major"], SM90["minor"])
    assert not tf.INTERPRETED, "the kernels must be compiled objects here (TRITON_INTERPRET=0)"
    return tf, triton


def launches(grid: bool = True) -> list:
    """The plan's Triton launches (the GPU tests' covering grid unless ``grid`` is False, their
    autotuned test, the chapters, the bench), each once."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_plan

    plan = gpu_plan.load()
    tests = plan["gpu_tests"]
    # The covering grid's launches, in the tests' layout (make_attention_inputs(..., layouts="bshd")):
    # at a ragged head dim the strides' classes depend on it.
    uses = [{**u, "layout": "bshd"} for u in gpu_plan.test_cases(tests["triton_cases"])] \
        if grid and tests.get("triton_cases") else []
    uses += tests["triton"]
    for chapter in plan["chapters"].values():
        uses += chapter.get("triton", [])
    uses += plan["bench"]["triton"]
    params, seen, out = gpu_plan.cuda_parameters(), set(), []
    for use in uses:
        key = json.dumps({k: v for k, v in use.items() if k != "why"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append((use, params))
    return out


def launch(tf, use: dict, params: dict) -> None:
    """The course's forward (and backward) at one launch's shape, on CPU tensors: compiles only."""
    import torch

    import kernels.triton.backward as tb
    sys.path.insert(0, str(ROOT / "tools"))
    from gpu_plan import value

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[use.get("dtype", "bf16")]
    sq, sk = value(use["sq"], params), value(use["sk"], params)
    heads = value(use.get("heads", "heads"), params)
    kv = value(use.get("kv_heads", use.get("heads", "heads")), params)
    d = value(use.get("head_dim", "head_dim"), params)
    # Batch 1: the batch is no kernel argument, and every stride keeps its class (a multiple of 16
    # or not) at any batch.
    def tensor(h, s):
        if use.get("layout") == "bshd":   # [B, S, H, D] memory seen as [B, H, S, D]
            return torch.zeros(1, s, h, d, dtype=dtype).transpose(1, 2)
        return torch.zeros(1, h, s, d, dtype=dtype)     # [B, H, S, D] contiguous, as the chapters' inputs
    q, k, v = tensor(heads, sq), tensor(kv, sk), tensor(kv, sk)
    scale = d ** -0.5
    backward = any(name.startswith("bwd") for name in use["kernels"])
    tma = None if "fwd_tma" in use["kernels"] else False   # None: the launcher decides, as it does on the GPU
    narrowed = []
    if use.get("one_config"):   # as tests/triton/test_triton_flash.py's one_autotune_config fixture does
        for kernel in (tf.attn_fwd, tf.attn_fwd_tma, tb.attn_bwd_dkdv, tb.attn_bwd_dq):
            narrowed.append((kernel, kernel.configs))
            kernel.configs = [c for c in kernel.configs if [c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                                           c.num_stages] == list(use["one_config"])]
    try:
        o, lse, o32 = tf.flash_forward(q, k, v, use["causal"], scale, keep_fp32_o=backward, tma=tma)
        if backward:
            tb.flash_backward(q, k, v, o32, lse, torch.zeros_like(o), use["causal"], scale)
    finally:
        for kernel, configs in narrowed:
            kernel.configs = configs


def stamp_fields(triton) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import triton_key

    return {"triton": triton.__version__, "triton_key": hashlib.sha256(triton_key().encode()).hexdigest(),
            "ptxas_sm90": get_ptxas_version(90).strip().splitlines()[-1], "capability": [9, 0],
            "python": sys.version.split()[0]}


def run(cache: Path, expect_hits: bool, grid: bool = True) -> dict:
    tf, triton = prepare(cache)
    counts: dict = {"hits": 0, "compiles": 0, "compile_s": 0.0}

    def listener(src, metadata, metadata_group, times, cache_hit):
        counts["hits" if cache_hit else "compiles"] += 1

    triton.knobs.compilation.listener = listener
    start, per_launch = time.perf_counter(), []
    for use, params in launches(grid):
        before = counts["compiles"]
        launch(tf, use, params)
        per_launch.append([use.get("why", use["kernels"]), counts["compiles"] - before])
    counts["compile_s"] = round(time.perf_counter() - start, 1)
    counts["per_launch"] = per_launch
    fields = stamp_fields(triton)
    entries = sum(1 for p in cache.rglob("*.json") if not p.name.startswith("__grp__") and p.name != STAMP)
    size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    if not expect_hits:
        (cache / STAMP).write_text(json.dumps({**fields, "entries": entries}, indent=1) + "\n")
    return {**counts, **fields, "entries": entries, "mib": round(size / 2**20, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/triton_cache.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("build", "check"))
    ap.add_argument("cache", type=Path)
    ap.add_argument("--no-test-grid", action="store_true",
                    help="leave out the GPU tests' covering grid (one config each): the book's launches only")
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    result = run(args.cache.resolve(), expect_hits=args.what == "check", grid=not args.no_test_grid)
    print(json.dumps(result))
    if args.what == "check":
        stamp = json.loads((args.cache / STAMP).read_text())
        same = {k: stamp.get(k) == result[k] for k in ("triton", "triton_key", "ptxas_sm90")}
        ok = result["compiles"] == 0 and result["hits"] > 0 and all(same.values())
        print(f"{result['hits']} launches found in the cache, {result['compiles']} compiled; stamp matches: {same}")
        return 0 if ok else 1
    print(f"{result['compiles']} compiled ({result['hits']} already there) in {result['compile_s']} s; "
          f"{result['entries']} entries, {result['mib']} MiB in {args.cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
