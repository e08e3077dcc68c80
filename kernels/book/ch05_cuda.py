"""What only chapter 5 (FlashAttention in CUDA) needs: the reading of the book's own GPU
recording, each profiled forward of ``cuda_v1``/``cuda_v2`` checked against its launcher (one
kernel, its grid, block and dynamic shared memory, Kineto's 48 KiB rule), and whether tensor
cores won the benchmark. Each function states its lesson with ``kernels.notebook.lesson``; the
tests hand them Hopper-shaped fixture steps, so this branch runs without a GPU."""
from __future__ import annotations

from typing import Iterable, Mapping

import pandas as pd

from kernels.bench.results import BenchResult
from kernels.book.gpu_kernels import kineto_zero_rule, launched, names_text
from kernels.cuda import flash as cuda_flash
from kernels.notebook import lesson
from kernels.trace.reader import Step


def cuda_forward(step: Step, name: str, cfg, batch: int, heads: int, seq: int) -> dict:
    """One forward of ``cuda_v1``/``cuda_v2`` on the GPU track: one kernel, with its launcher's
    grid, block and dynamic shared memory; returns its footprint as the trace recorded it."""
    ks = launched(step.gpu_work)
    version = name.removeprefix("cuda_")
    lesson(len(ks) == 1 and f"flash_{version}_kernel" in ks["name"].iloc[0],
           f"one forward of {name} is one kernel on the GPU track", names_text(ks))
    row = ks.iloc[0]
    lesson(list(row["block"]) == [cfg.threads, 1, 1] and list(row["grid"]) == list(cfg.grid(batch, heads, seq)),
           f"{name}'s trace shows the grid and block of its launcher", f"grid {row['grid']}, block {row['block']}")
    lesson(int(row["shared_memory"]) == cfg.dynamic_shared_bytes,
           f"{name}'s shared memory in the trace is the launcher's dynamic shared memory",
           f"{int(row['shared_memory']):,} B")
    if pd.notna(row["occupancy_pct"]):
        kineto_zero_rule(name, int(row["shared_memory"]), row["occupancy_pct"])
    return {"kernel": row["name"][:60], "registers (trace)": row["registers_per_thread"],
            "shared memory (trace, B)": row["shared_memory"],
            "est. achieved occupancy % (trace)": row["occupancy_pct"],
            "GPU time per forward (us)": round(step.gpu_time_us, 1)}


def cuda_forwards(steps: Mapping[str, Step], head_dim: int, batch: int, heads: int, seq: int) -> pd.DataFrame:
    """Each profiled forward of ``steps`` ({"cuda_v1": step, ...}) checked against its launcher
    (``cuda_forward``); their footprints as the traces recorded them, one column per kernel."""
    return pd.DataFrame({name: cuda_forward(step, name, cuda_flash.launch_config(name.removeprefix("cuda_"), head_dim),
                                            batch, heads, seq)
                         for name, step in steps.items()})


def tensor_cores_win(results: Iterable[BenchResult]) -> bool:
    """v2 (tensor cores) is faster than v1 (CUDA cores), by the benchmark's medians. Asserted
    where the sweep timed both; returns whether it was (False: one of them was not in it)."""
    points = {r.impl: r for r in results if r.impl in ("cuda_v1", "cuda_v2")}
    if len(points) < 2:
        return False
    v1, v2 = points["cuda_v1"], points["cuda_v2"]
    claim = "tensor cores win: v2 is faster than v1"
    if v1.median_ms is None or v2.median_ms is None:
        lesson(False, claim, f"not both timed: v1 {v1.status}, v2 {v2.status}")
    else:
        lesson(v2.median_ms < v1.median_ms, claim,
               f"{v1.median_ms:.3f} ms vs {v2.median_ms:.3f} ms, {v1.median_ms / v2.median_ms:.1f}x")
    return True


def excerpts(source, *pieces: tuple[str, ...]):
    """Several ``show_lines`` pieces of one CUDA file in a single code block, each headed by
    its own line numbers: excerpts read together take one block's height on the page."""
    from IPython.display import Markdown

    from kernels.notebook import source_piece

    parts = [f"// {where}\n{code}" for where, code in (source_piece(source, *piece) for piece in pieces)]
    return Markdown("```cuda\n" + "\n\n".join(parts) + "\n```")


def compiler_words(where_from: str) -> str:
    """``resources.read_kernels``'s account of where its numbers came from, cut to what a reader
    needs: the compiler's version ("nvcc 13.0"), or the snapshot's words, whole, where no compile
    ran (a reader should know those numbers were not made on this run)."""
    import re

    found = re.match(r"compiled now by nvcc (\d+\.\d+)", where_from)
    return f"compiled with nvcc {found.group(1)} on this run" if found else where_from


def reveal_revisions(guess: Iterable[int], seen: Iterable[int], what: str, why: Mapping[int, str]) -> str:
    """The reader's guess of a set of revisions against the compiler's: both sets in full, then
    each revision either names, with ``why`` (revision -> reason) where one is given. Order
    does not matter; nothing here asserts the guess. Returns the printed text."""
    guess, seen = sorted(set(guess)), sorted(set(seen))
    lines = [f"{what}: you guessed {guess}, the compiler's report shows {seen}"
             + (" (exactly right)" if guess == seen else "")]
    for r in sorted(set(guess) | set(seen)):
        verdict = ("yes, as you guessed" if r in seen and r in guess else
                   "yes, not guessed" if r in seen else "no")
        lines.append(f"  revision {r}: {verdict}" + (f" ({why[r]})" if r in why else ""))
    text = "\n".join(lines)
    print(text)
    return text
