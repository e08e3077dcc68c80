"""The GPU run's plan: what each phase compiles on an H100/H200, how long that should take, and
the time limits ``.ci/device-run`` sets from it.

    python tools/gpu_plan.py            # print the plan (make gpu-plan)
    python tools/gpu_plan.py --write    # recompute the counts and seconds into tools/gpu_plan.json

``tools/gpu_plan.json`` holds two things. What a person writes: the seconds each kind of work
takes (measured on this project's CPU machine, or assumed, each with how), which Triton
launches each chapter and test makes at the ``cuda`` preset's shapes (read from the
chapters' sources), the nvcc units and Inductor graphs. And what this module computes from
them, under ``computed``: the compile counts, the expected seconds per chapter and phase, and
each phase's limit (expected times the margin). The run reads ``computed`` only (it imports
no torch to start), and tests/tools/test_gpu_run.py fails when ``computed`` is stale.

Compile counting follows Triton's JIT: a kernel compiles once per config and per
*specialization* of its arguments, and each integer argument is specialized as equal to 1, a
multiple of 16, or neither (``triton/runtime/jit.py``, the ``specialize`` of each argument;
the pointers are 16-byte aligned here). The autotuner tries every config the pruning keeps for
a new key (``kernels.triton.tiles.fitting_configs``) and times each. Compiled kernels go to
Triton's disk cache, so a later chapter (another process) that needs the same compile finds it;
the autotuner's timings do not persist, so each process times its configs again.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "tools" / "gpu_plan.json"
# The Triton of the GPU image the plan is for (README "Running on a GPU"): its autotuner prunes
# by that release's spill table, whatever Triton this machine has, so the plan is the same here
# and in the compatibility matrix's environments.
GPU_IMAGE_TRITON = "3.6.0"
PHASES = ("environment", "gpu-tests", "chapters", "bench")


def load(path: Path = PLAN) -> dict:
    return json.loads(path.read_text())


def value(expr, params: dict) -> int:
    """An integer of a launch: a number, or an expression of the preset's parameters ("seq // 2 - 15")."""
    if isinstance(expr, int):
        return expr
    return int(eval(expr, {"__builtins__": {}}, dict(params)))  # repository data, not user input


def int_class(v: int) -> str:
    """How Triton's JIT specializes an integer argument: the constant 1, a multiple of 16, or neither."""
    return "1" if v == 1 else ("16" if v % 16 == 0 else "n")


def specialization(kernel: str, use: dict, params: dict) -> tuple:
    """The arguments that decide a compile, apart from the config: the kernel, the head dim and
    dtype (constexprs and pointer types), causality, and the class of each size argument
    (``kernels.triton.launch.sizes``: H, GROUP, SQ, SK, OFFSET and the two buckets)."""
    sq, sk = value(use["sq"], params), value(use["sk"], params)
    heads, kv = value(use.get("heads", "heads"), params), value(use.get("kv_heads", use.get("heads", "heads")), params)
    bucket = lambda s: 1 << max(0, (s - 1).bit_length())
    head_dim = value(use.get("head_dim", "head_dim"), params)
    pad = max(16, 1 << (head_dim - 1).bit_length())
    sizes = (heads, heads // kv, sq, sk, head_dim, sk - sq, bucket(sq), bucket(sk))
    return (kernel, pad, pad != head_dim, use.get("dtype", "bf16"), use["causal"],
            tuple(int_class(s) for s in sizes))


def cuda_parameters() -> dict:
    """The chapters' parameters at the ``cuda`` preset (``kernels/presets.yml``): what the plan's
    launch expressions ("seq // 2 - 15") are evaluated with."""
    sys.path.insert(0, str(ROOT))
    from kernels.presets import chapter_parameters, load_presets  # here, as below: kernels loads torch

    return chapter_parameters(load_presets()["cuda"])


def kept_configs(kernel: str, use: dict, params: dict, target: dict) -> list:
    """The configs the autotuner compiles and times for this launch on the target GPU."""
    sys.path.insert(0, str(ROOT))
    from kernels.triton import launch
    from kernels.triton import tiles

    if kernel == "bwd_pre":      # the backward's preprocess (Delta = rowsum(O * dO)): one fixed block
        return [("preprocess",)]
    head_dim = value(use.get("head_dim", "head_dim"), params)
    pad = launch.padded_head_dim(head_dim)
    element = {"bf16": 2, "fp16": 2, "fp32": 4}[use.get("dtype", "bf16")]
    if use.get("one_config"):   # a test that narrows the autotuner to one config
        return [tuple(use["one_config"])]
    return [tuple(c) for c in tiles.fitting_configs(
        tiles.config_space(kernel, pad), value(use["sq"], params), pad, element, target["smem_optin"],
        kernel=kernel, capability=tuple(target["capability"]), seq_k=value(use["sk"], params),
        spills=tiles.spilling_configs(GPU_IMAGE_TRITON))]


def triton_work(uses: list, params: dict, target: dict, compiled: set) -> dict:
    """Compiles (new to the run's disk cache, which ``compiled`` holds) and timed configs of one
    process's launches; each process times every new autotune key again."""
    compiles, timed, keys = 0, 0, set()
    for use in uses:
        for kernel in use["kernels"]:
            spec = specialization(kernel, use, params)
            configs = kept_configs(kernel, use, params, target)
            for config in configs:
                if (spec, config) not in compiled:
                    compiled.add((spec, config))
                    compiles += 1
            if kernel != "bwd_pre" and not use.get("one_config") and spec not in keys:
                keys.add(spec)
                timed += len(configs)
    return {"triton_compiles": compiles, "triton_timed_configs": timed}


def expected_seconds(work: dict, seconds: dict, base: float, carried: bool = False) -> float:
    s = seconds
    compile_s = 0.0 if carried else work["triton_compiles"] * s["triton_compile"]["value"]
    return (base + compile_s + work["triton_timed_configs"] * s["autotune_time_per_config"]["value"]
            + work.get("nvcc_units", 0) * s["nvcc_unit"]["value"]
            + work.get("extension_builds", 0) * s["extension_build"]["value"]
            + work.get("inductor_graphs", 0) * s["inductor_graph"]["value"])


def test_cases(where: str) -> list:
    """The Triton launches of a covering grid of GPU tests (``tests/triton/test_triton_flash.py::GPU_CASES``):
    each case is a forward and a backward with the autotuner narrowed to one config. The
    forward is the TMA one where the head dim is a power of two (its descriptor tiles the
    whole row), else the pointer one."""
    module, name = where.split("::")
    sys.path.insert(0, str(ROOT))
    import importlib

    cases = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), name)
    uses = []
    for dtype, d, causal, (sq, sk), (heads, kv) in cases:
        short = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}[str(dtype)]
        forward = "fwd_tma" if d & (d - 1) == 0 else "fwd"
        uses.append({"kernels": [forward, "bwd_pre", "bwd_dkdv", "bwd_dq"], "causal": causal, "sq": sq, "sk": sk,
                     "heads": heads, "kv_heads": kv, "head_dim": d, "dtype": short, "one_config": [64, 32, 4, 2]})
    return uses


def compute(plan: dict) -> dict:
    """The ``computed`` section: counts, expected seconds and limits, per chapter and phase."""
    params, target, seconds = cuda_parameters(), plan["target"], plan["seconds"]
    margin = plan["margin"]
    compiled: set = set()
    phases, chapters = {}, {}
    env = plan["environment"]
    phases["environment"] = {"expected_s": env["base_s"], "counts": {}}
    tests = plan["gpu_tests"]
    uses = (test_cases(tests["triton_cases"]) if tests.get("triton_cases") else []) + tests["triton"]
    work = triton_work(uses, params, target, compiled)
    work.update(nvcc_units=tests.get("nvcc_units", 0), extension_builds=tests.get("extension_builds", 0))
    phases["gpu-tests"] = {"expected_s": round(expected_seconds(work, seconds, tests["base_s"]), 1), "counts": work}
    total = {"triton_compiles": 0, "triton_timed_configs": 0, "nvcc_units": 0, "inductor_graphs": 0}
    sys.path.insert(0, str(ROOT / "tools"))
    from gpu_run import toc_chapters

    for name in toc_chapters(ROOT):   # a chapter the plan does not describe: its base seconds, no compiles
        chapter = plan["chapters"].get(name, {})
        work = triton_work(chapter.get("triton", []), params, target, compiled)
        work.update(nvcc_units=chapter.get("nvcc_units", 0), inductor_graphs=chapter.get("inductor_graphs", 0))
        base = chapter.get("base_s", plan["chapter_base_s"]["value"])
        expected = expected_seconds(work, seconds, base)
        chapters[name] = {"expected_s": round(expected, 1), "limit_s": math.ceil(expected * margin), "counts": work}
        for k in total:
            total[k] += work[k]
    phases["chapters"] = {"expected_s": round(sum(c["expected_s"] for c in chapters.values()), 1), "counts": total}
    bench = plan["bench"]
    work = triton_work(bench["triton"], params, target, compiled)
    points = bench["points"]
    phases["bench"] = {"expected_s": round(expected_seconds(work, seconds, bench["base_s"])
                                           + points * bench["seconds_per_point"], 1), "counts": work}
    for p in phases.values():
        p["limit_s"] = math.ceil(p["expected_s"] * margin)
    calls = split(plan, phases, chapters)
    return {"phases": phases, "chapters": chapters, "calls": calls,
            "distinct_triton_compiles": len(compiled)}


def pieces(phases: dict, chapters: dict, compile_s: float = 0.0) -> list:
    """The run's work in order of value, as (name, expected seconds): each phase, the chapters one
    by one; ``compile_s`` (seconds per Triton compile) is taken off, for a run whose carried
    cache holds every compile."""
    out = []
    for p in PHASES:
        rows = chapters.items() if p == "chapters" else [(p, phases[p])]
        out += [(name, row["expected_s"] - compile_s * row["counts"].get("triton_compiles", 0)) for name, row in rows]
    return out


def split(plan: dict, phases: dict, chapters: dict) -> list:
    """Each device call's share of the work: call i stops after ``stop_after`` (a phase or a chapter),
    and every call after the first starts with the environment again (it checks the GPU and
    the commit are the first call's)."""
    cold, warm = pieces(phases, chapters), pieces(phases, chapters, plan["seconds"]["triton_compile"]["value"])
    calls, start = [], 0
    for call in plan["calls"]:
        names = [n for n, _ in cold]
        end = names.index(call["stop_after"]) + 1 if call["stop_after"] else len(cold)
        again = [0] if start else []   # a later call checks the environment again
        done = [cold[i] for i in again + list(range(start, end))]
        carried = [warm[i] for i in again + list(range(start, end))]
        calls.append({"does": [n for n, _ in done], "stop_after": call["stop_after"],
                      "expected_s": round(sum(s for _, s in done), 1),
                      "expected_with_cache_s": round(sum(s for _, s in carried), 1), "budget_s": call["budget_s"]})
        start = end
    return calls


def limits(plan: dict, dry_run: bool) -> tuple[dict, dict]:
    """(phase -> limit seconds, chapter -> limit seconds) for a run: the dry run's come from its
    CPU measurement, the GPU run's from ``computed``."""
    if dry_run:
        d = plan["dry_run"]
        return dict(d["phase_limits_s"]), dict(d["chapter_limits_s"])
    c = plan["computed"]
    return ({p: c["phases"][p]["limit_s"] for p in PHASES}, {n: r["limit_s"] for n, r in c["chapters"].items()})


def device_command(plan: dict, call: int) -> str:
    stop = plan["calls"][call]["stop_after"]
    stop = f" --stop-after {stop}" if stop else ""
    resume = f" --resume {plan['resume_archive']}" if call else ""
    return f'bash .ci/device-run{resume}{stop} "$OUT"'


def describe(plan: dict) -> str:
    c = plan["computed"]
    lines = [f"GPU run plan ({plan['target']['gpu']}), margin x{plan['margin']}; seconds are expected, "
             "not measured on a GPU (see tools/gpu_plan.json 'assumptions')", ""]
    lines.append(f"{'phase / chapter':<24}{'expected s':>11}{'limit s':>9}  compiles (Triton, nvcc, Inductor), timed configs")
    for p in PHASES:
        row = c["phases"][p]
        k = row["counts"]
        lines.append(f"{p:<24}{row['expected_s']:>11.0f}{row['limit_s']:>9}  "
                     f"{k.get('triton_compiles', 0)}, {k.get('nvcc_units', 0)}, {k.get('inductor_graphs', 0)}; "
                     f"{k.get('triton_timed_configs', 0)}")
        if p == "chapters":
            for name, ch in c["chapters"].items():
                k = ch["counts"]
                lines.append(f"  {name:<22}{ch['expected_s']:>11.0f}{ch['limit_s']:>9}  "
                             f"{k['triton_compiles']}, {k['nvcc_units']}, {k['inductor_graphs']}; "
                             f"{k['triton_timed_configs']}")
    lines.append("")
    carry = plan["carry"]
    for i, call in enumerate(c["calls"]):
        lines.append(f"call {i + 1}: {call['does'][0]} .. {call['does'][-1]} ({len(call['does'])} pieces): "
                     f"expected {call['expected_s']:.0f} s with Triton's cache cold, "
                     f"{call['expected_with_cache_s']:.0f} s with the carried cache found, of a {call['budget_s']} s budget")
        carried = carry + ([plan["resume_archive"]] if i else [])
        lines.append(f"  run(command='{device_command(plan, i)}', carry={json.dumps(carried)}, "
                     f"timeout_s={min(600, call['budget_s'] + 60)})")
    total = sum(call["expected_s"] for call in c["calls"])
    lines.append(f"the lease: {total:.0f} s of device time expected for the calls (cold), plus each machine "
                 f"start (a minute or more) and the transfers, of 900 s in all: give call 2 what is left")
    lines.append("")
    lines.append("carried: " + "; ".join(f"{p}: {why}" for p, why in plan["carry_why"].items()))
    lines.append(f"between the calls: copy call 1's gpu-run.tar.gz to {plan['resume_archive']}; "
                 "after call 2: make gpu-import ARCHIVE=<call 2's gpu-run.tar.gz>")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/gpu_plan.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="recompute 'computed' into tools/gpu_plan.json")
    args = ap.parse_args(argv)
    plan = load()
    if args.write:
        plan["computed"] = compute(plan)
        PLAN.write_text(json.dumps(plan, indent=1) + "\n")
    elif plan.get("computed") != compute(plan):
        print("tools/gpu_plan.json's 'computed' is stale: run python tools/gpu_plan.py --write", file=sys.stderr)
        return 1
    print(describe(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
