"""What only chapter 8 (one transformer block) needs: its FLOP table, the reveal of a guessed
set of attentions, the count of a real model's GEMMs by the op that launched them, and its
reading of where the compiled block's GELU ran."""
from __future__ import annotations

import pandas as pd

from kernels.notebook import lesson
from kernels.trace import fingerprints

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def flop_table(shares: pd.DataFrame):
    """``block.flop_shares``' table as the page shows it: the counted GFLOP of the linear layers
    and of attention, and attention's share in percent (the formula columns are checked, not
    shown: they equal the counted ones)."""
    shown = shares[["linear (GFLOP)", "attention (GFLOP)", "attention share"]]
    return shown.rename(columns={"attention share": "attention's share"}).style.format(
        {"linear (GFLOP)": "{:,.2f}", "attention (GFLOP)": "{:,.2f}", "attention's share": "{:.1%}"})


def reveal_set(guess, seen, what: str) -> None:
    """Print how a guessed set (order does not matter) compares with what the trace shows."""
    guess, seen = set(guess or ()), set(seen)
    if not guess:
        print(f"No guess written: edit the guess cell above. {what}: {', '.join(sorted(seen))}")
        return
    right, missed, extra = sorted(guess & seen), sorted(seen - guess), sorted(guess - seen)
    print(f"{what}: the trace shows {', '.join(sorted(seen)) or 'none'}; you named {len(right)} of them"
          + (f"; not named: {', '.join(missed)}" if missed else "")
          + (f"; named but without one: {', '.join(extra)}" if extra else ""))


def gemm_shapes(step) -> pd.DataFrame:
    """The matmul ops (mm, addmm, bmm) of a GPU step, one row per distinct call shape: how many
    ran, their operands' shapes (A is M×K, B is K×N) and element type. addmm's bias is left out."""
    ops = step.ops[step.ops["name"].isin(MATMUL_OPS)]
    rows = []
    for name, dims, types in zip(ops["name"], ops["input_dims"], ops["input_types"]):
        operands = dims[1:3] if name == "aten::addmm" else dims[:2]
        rows.append({"op": name.removeprefix("aten::"), "A": tuple(operands[0]), "B": tuple(operands[1]),
                     "type": str(types[-1 if name != "aten::addmm" else 2]).removeprefix("c10::")})
    table = pd.DataFrame(rows)
    return table.value_counts().rename("calls").reset_index()


def layer_flops(shapes: pd.DataFrame, layers: int, tokens: int) -> dict:
    """The decoder layers' matmul FLOPs per token and layer from ``gemm_shapes``' table: the
    shapes that run ``layers`` times or a multiple of it, with M = ``tokens`` rows. Returns
    the width W (K of the first projection), the MLP's intermediate size I (its widest N),
    the linear FLOPs per token and layer, and the other matmul calls (shape rows) not in a layer."""
    in_layer = (shapes["calls"] % layers == 0) & (shapes["A"].map(lambda a: a[0]) == tokens)
    per_layer = shapes[in_layer]
    flops = sum(2 * a[1] * b[1] * calls / layers for a, b, calls in zip(per_layer["A"], per_layer["B"], per_layer["calls"]))
    return {"width": int(min(a[1] for a in per_layer["A"])), "intermediate": int(max(b[1] for b in per_layer["B"])),
            "gemms per layer": int(per_layer["calls"].sum() // layers), "linear per token": flops,
            "outside the layers": shapes[~in_layer]}


def gelu_between_matmuls(work: pd.DataFrame) -> list[str]:
    """GELU is a pass of its own between two library matmuls (fc_in's and fc_out's).

    ``work`` is a step's GPU kernels, or its CPU ops where there is no GPU track; matmuls are
    what ``fingerprints.is_gemm`` says (cuBLAS's nvjet_* on Hopper included). Returns the
    matmul and GELU rows' names in launch order."""
    keep = [fingerprints.is_gemm(n) or fingerprints.mentions_op(n, "gelu") for n in work["name"]]
    names = work[keep].sort_values("start_us")["name"].tolist()
    gelu = [fingerprints.mentions_op(n, "gelu") for n in names]
    at = gelu.index(True) if any(gelu) else None
    lesson(at is not None and 0 < at < len(names) - 1 and not gelu[at - 1] and not gelu[at + 1],
           "but GELU is still a pass of its own between two library matmuls (fc_in's and fc_out's)",
           " -> ".join(n.removeprefix("aten::")[:40] for n in names))
    return names


def alive_at_peak(step, smallest: int = 2**16) -> dict[int, int]:
    """The buffers the step allocated that are still alive when its memory peaks: how many of
    each size (bytes), from the allocation events up to the peak (the events carry sizes, not
    addresses, so a free is matched by its size). Buffers under ``smallest`` bytes are left out."""
    events = step.memory.sort_values("ts", kind="stable").reset_index(drop=True)
    upto = events.iloc[: int(events["total_allocated"].idxmax()) + 1]
    alive: dict[int, int] = {}
    for b in upto["bytes"]:
        alive[abs(b)] = alive.get(abs(b), 0) + (1 if b > 0 else -1)
    return {size: n for size, n in sorted(alive.items(), reverse=True) if n > 0 and size >= smallest}


def ops_and_allocations(step) -> pd.DataFrame:
    """``tables.op_table`` of a step without its CPU times (one profile's are noise: ops of the
    same work differ by orders of magnitude) and with a header short enough to fit the page.
    A compiled region's own code allocates its buffers (the ops under it write into them through
    ``out=``): a row under the region, "(the region's own code)", shows those bytes, so the rows
    under a region add up to its total."""
    from kernels.trace.tables import NESTING, op_table

    table = op_table(step, times=False)
    column = "allocated (KiB, incl. children)"
    ops = step.ops[~step.ops["is_view"]].reset_index(drop=True)
    for at in reversed(range(len(ops))):  # from the bottom, so inserted rows leave the others' places
        if not str(ops.at[at, "name"]).startswith(REGION):
            continue
        own = ops.at[at, "alloc_bytes"] - children(ops, at)["alloc_bytes"].sum()
        if own > 0:
            row = {"op": NESTING * (int(ops.at[at, "depth"]) + 1) + "(the region's own code)",
                   "input shapes": "", column: round(own / 1024, 1)}
            table = pd.concat([table.iloc[:at + 1], pd.DataFrame([row]), table.iloc[at + 1:]], ignore_index=True)
    return table.rename(columns={column: "allocated (KiB)"})


# How the profiler names a torch.compile'd graph's run ("Torch-Compiled Region: 0/0").
REGION = "Torch-Compiled Region"


def children(ops: pd.DataFrame, at: int) -> pd.DataFrame:
    """The ops directly under row ``at`` of ``ops`` (rows in call order, with a ``depth``)."""
    depth, rows = int(ops.at[at, "depth"]), []
    for below in range(at + 1, len(ops)):
        if ops.at[below, "depth"] <= depth:
            break
        if ops.at[below, "depth"] == depth + 1:
            rows.append(below)
    return ops.loc[rows]
