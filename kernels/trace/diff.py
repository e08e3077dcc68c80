"""What changed between two steps: ``diff(a, b)`` and the ``StepDiff`` it returns.

``diff(a, b)`` compares two steps (naive against in-place, math against flash) the way you
would by eye in two Perfetto windows, but exhaustively: every op is matched by its name
*and* its input shapes (a 4-byte ``copy_`` is not an S×S ``copy_``), every kernel by its
name and launch shape (grid, block), and the counts, times and allocations of each match
are compared.
Views and bare allocations (``VIEW_OPS``) do no work of their own, so their time and bytes
are credited to the op that called them: ``clone`` owns the buffer its ``empty_like``
allocated. Times are self times, so the rows of one step add up to its whole op time.

One profiled step is one sample: on a busy machine any op in it can stall for milliseconds
while its thread waits for a core. Give ``diff`` each side's recorded steps (a list) and
every row's time is its median over them, while counts and bytes come from the median step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import pandas as pd
from matplotlib.figure import Figure

from kernels.figures import apply_font_floor, font_floor
from kernels.trace.reader import Step, median_step


def _shapes_key(dims) -> str:
    """Input shapes as one readable string: ``(1, 8, 512, 512) (512, 512) ()``."""
    return " ".join(str(tuple(d)) if isinstance(d, list) else repr(d) for d in dims)


def _owners(ops: pd.DataFrame) -> list[int]:
    """For each op, the op its work counts towards: itself, or for a view/allocation the
    nearest ancestor that is not one (a view called directly by your code owns itself)."""
    owner = []
    for i in range(len(ops)):
        j = i
        while ops.at[j, "is_view"] and ops.at[j, "parent"] >= 0:
            j = ops.at[j, "parent"]
        owner.append(j)
    return owner


def _op_groups(step: Step) -> pd.DataFrame:
    """One row per (name, input shapes) of the step's working ops: count, self time, bytes."""
    ops = step.ops
    columns = ["name", "shapes", "count", "time_us", "alloc_bytes"]
    if ops.empty:
        return pd.DataFrame(columns=columns)
    owner = pd.Series(_owners(ops), index=ops.index)
    credited = pd.DataFrame({"owner": owner, "self_us": ops["self_us"], "bytes": ops["self_alloc_bytes"]})
    per_owner = credited.groupby("owner")[["self_us", "bytes"]].sum()
    rows = ops.loc[per_owner.index]
    table = pd.DataFrame({"name": rows["name"].values,
                          "shapes": [_shapes_key(d) for d in rows["input_dims"]],
                          "time_us": per_owner["self_us"].values,
                          "alloc_bytes": per_owner["bytes"].values})
    table["count"] = 1
    return table.groupby(["name", "shapes"], as_index=False)[["count", "time_us", "alloc_bytes"]].sum()[columns]


def _kernel_groups(step: Step) -> pd.DataFrame:
    """One row per (kernel name, grid × block) of the step's GPU work: count and GPU time."""
    k = step.gpu_work
    columns = ["name", "shapes", "count", "time_us", "alloc_bytes"]
    if k.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame({"name": k["name"].values,
                          "shapes": [f"grid {tuple(g)} block {tuple(b)}" if g is not None else ""
                                     for g, b in zip(k["grid"], k["block"])],
                          "time_us": k["dur_us"].values, "alloc_bytes": 0, "count": 1})
    return table.groupby(["name", "shapes"], as_index=False)[["count", "time_us", "alloc_bytes"]].sum()[columns]


def _compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    both = a.merge(b, on=["name", "shapes"], how="outer", suffixes=("_a", "_b"))
    for col in ("count", "time_us", "alloc_bytes"):
        both[f"{col}_a"] = both[f"{col}_a"].fillna(0)
        both[f"{col}_b"] = both[f"{col}_b"].fillna(0)
        both[f"{col}_change"] = both[f"{col}_b"] - both[f"{col}_a"]
    for col in ("count_a", "count_b", "count_change", "alloc_bytes_a", "alloc_bytes_b", "alloc_bytes_change"):
        both[col] = both[col].astype(int)
    both["only_in"] = ["a" if nb == 0 else "b" if na == 0 else ""
                       for na, nb in zip(both["count_a"], both["count_b"])]
    # Rows of substance first (by how much they moved), then the unchanged ones by time.
    both["substance"] = (both["count_change"] != 0) | (both["alloc_bytes_change"] != 0)
    both["_weight"] = both["time_us_change"].abs() + both[["time_us_a", "time_us_b"]].max(axis=1) * 1e-6
    both = both.sort_values(["substance", "_weight"], ascending=False).drop(columns="_weight")
    return both.reset_index(drop=True)


@dataclass
class StepDiff:
    """What ``diff(a, b)`` returns. Changes are *b minus a*.

    ``ops`` and ``gpu_work`` hold one row per matched (name, shapes) with ``count_a``,
    ``count_b``, ``time_us_a``/``_b`` (self time), ``alloc_bytes_a``/``_b`` and their
    ``*_change``; ``only_in`` is ``"a"``, ``"b"`` or empty; ``substance`` is True where the
    count or the allocated bytes differ (time alone always differs a little).
    """

    a: Step
    b: Step
    label_a: str
    label_b: str
    ops: pd.DataFrame
    gpu_work: pd.DataFrame
    steps_per_side: tuple = (1, 1)   # how many recorded steps each side's times are the median of

    def changed(self) -> pd.DataFrame:
        """Ops and kernels whose count or allocated bytes differ: the substance of the diff.
        (Time alone always differs a little; it is reported, never a reason to list a row.)"""
        rows = pd.concat([self.ops.assign(kind="op"), self.gpu_work.assign(kind="GPU")], ignore_index=True)
        return rows[rows["substance"]].drop(columns=["substance"]).reset_index(drop=True)

    def only_in(self, side: str) -> pd.DataFrame:
        """Rows found in only one step: ``side`` is ``"a"``, ``"b"`` or that step's label."""
        side = {self.label_a: "a", self.label_b: "b"}.get(side, side)
        if side not in ("a", "b"):
            raise ValueError(f"side must be 'a', 'b', {self.label_a!r} or {self.label_b!r}, got {side!r}")
        return self.changed()[lambda t: t["only_in"] == side]

    def totals(self) -> pd.DataFrame:
        """The two steps' summaries side by side, with the change."""
        sa, sb = self.a.summary(), self.b.summary()
        keys = [k for k in sa if k != "label"]
        return pd.DataFrame({self.label_a: [sa[k] for k in keys], self.label_b: [sb[k] for k in keys],
                             "change": [sb[k] - sa[k] for k in keys]}, index=keys)

    def table(self, everything: bool = False) -> pd.DataFrame:
        """The diff for display: by default only the rows of substance."""
        rows = pd.concat([self.ops.assign(kind="op"), self.gpu_work.assign(kind="GPU")], ignore_index=True)
        if not everything:
            rows = rows[rows["substance"]]
        a, b = self.label_a, self.label_b
        return pd.DataFrame({
            "kind": rows["kind"], "name": rows["name"].str.slice(0, 60), "input shapes": rows["shapes"],
            f"count {a}": rows["count_a"], f"count {b}": rows["count_b"], "count change": rows["count_change"],
            f"self time {a} (us)": rows["time_us_a"].round(1), f"self time {b} (us)": rows["time_us_b"].round(1),
            "allocated change (KiB)": (rows["alloc_bytes_change"] / 1024).round(1),
            "only in": rows["only_in"].map({"a": a, "b": b, "": ""}),
        }).reset_index(drop=True)

    def figure(self, ax=None, max_rows: int = 12):
        """Self time of every changed row in both steps; the unchanged rest as a note.

        A row found in one step only has a single bar; its label says the count (a → b)
        and the allocation change. Text keeps the book's font floor (``kernels.figures.font_floor``) and
        the legend sits above the bars, outside them. Returns the Figure (a new one unless
        ``ax`` is given).
        """
        changed = self.changed().head(max_rows)
        rest = pd.concat([self.ops, self.gpu_work])
        rest = rest[~rest["substance"]]
        labels = [f"{_clip(n.replace('aten::', ''), 32)} {_clip(s, 34)}\n{ca} → {cb}"
                  + (f", {alloc / 2**20:+.2f} MiB" if alloc else "")
                  for n, s, ca, cb, alloc in zip(changed["name"], changed["shapes"], changed["count_a"],
                                                 changed["count_b"], changed["alloc_bytes_change"])]
        owns_figure = ax is None
        if owns_figure:
            ax = Figure(figsize=(8.5, 0.7 * max(len(labels), 1) + 1.8)).add_subplot()
        fig = ax.figure
        size = font_floor(fig)
        y = list(range(len(labels)))
        ax.barh([i - 0.2 for i in y], changed["time_us_a"] / 1e3, height=0.38, color="#d62728", label=self.label_a)
        ax.barh([i + 0.2 for i in y], changed["time_us_b"] / 1e3, height=0.38, color="#1f77b4", label=self.label_b)
        ax.set_yticks(y, labels, fontsize=size)
        ax.invert_yaxis()
        if not labels:
            ax.text(0.5, 0.5, "no op or kernel changed its count or allocation", ha="center",
                    va="center", transform=ax.transAxes)
        over = ("in one step" if self.steps_per_side == (1, 1)
                else f"per step, the median of {'/'.join(map(str, self.steps_per_side))} recorded steps")
        ax.set_xlabel(f"self time {over} (ms)\n"
                      f"everything else: {len(rest)} matched rows, the same work (counts and bytes);\n"
                      f"{rest['time_us_a'].sum() / 1e3:.2f} ms ({self.label_a}) vs "
                      f"{rest['time_us_b'].sum() / 1e3:.2f} ms ({self.label_b}) in one profile each, not a timing")
        # The legend in its own row above the bars, the title above it (the pad leaves the
        # room): a long title never runs under it. It names only the steps that have a bar.
        ax.set_title(f"what changed from {self.label_a} to {self.label_b}", loc="left", pad=2.4 * size)
        drawn = [(h, lab) for h, lab, times in zip(*ax.get_legend_handles_labels(),
                                                  (changed["time_us_a"], changed["time_us_b"]))
                 if (times.fillna(0) > 0).any()]
        if drawn:
            ax.legend(*zip(*drawn), loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=size,
                      frameon=False, borderaxespad=0.2)
        ax.grid(axis="x", alpha=0.3)
        apply_font_floor(fig)
        fig.tight_layout()
        return fig

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def _clip(text: str, n: int) -> str:
    """``text`` in at most ``n`` characters, with "…" where it was cut (a label cut silently reads as whole)."""
    return text if len(text) <= n else text[:n - 1] + "…"


def _median_times(groups, steps: list[Step], median: Step) -> pd.DataFrame:
    """``groups(median)`` (the median step's rows) with each row's time replaced by its median
    over ``steps``; a row absent from a step counts as 0 µs there."""
    per_step = {id(s): groups(s) for s in steps}
    times = pd.concat([g.set_index(["name", "shapes"])["time_us"] for g in per_step.values()], axis=1)
    times = times.fillna(0).median(axis=1)
    base = per_step[id(median)]
    return base.assign(time_us=[float(times[n, sh]) for n, sh in zip(base["name"], base["shapes"])])


def _side(x: Union[Step, Sequence[Step]], which: str) -> tuple[Step, list[Step]]:
    steps = [x] if isinstance(x, Step) else list(x) if isinstance(x, (list, tuple)) else None
    if not steps or not all(isinstance(s, Step) for s in steps):
        raise TypeError(f"diff compares two Steps, or two lists of a profile's Steps (profile(...).steps()); "
                        f"got {type(x).__name__} for {which}")
    return median_step(steps), steps


def diff(a: Union[Step, Sequence[Step]], b: Union[Step, Sequence[Step]]) -> StepDiff:
    """Compare two steps op by op (name and input shapes) and kernel by kernel (name and
    launch shape): what only one of them runs, and which counts, times and allocations moved.

    ``a`` and ``b`` are Steps, or lists of one profile's recorded Steps: then counts and bytes
    are the median step's and each row's self time is its median over the list.
    ``diff(naive_steps, inplace_steps).table()`` lists the rows of substance (count or bytes
    changed); ``.figure()`` draws them; ``.totals()`` compares the two median steps' summaries.
    """
    (a, steps_a), (b, steps_b) = _side(a, "a"), _side(b, "b")
    label_a, label_b = a.label, b.label
    if label_a == label_b:
        label_a, label_b = f"{label_a} (a)", f"{label_b} (b)"
    ops = [_median_times(_op_groups, st, s) for s, st in ((a, steps_a), (b, steps_b))]
    gpu = [_median_times(_kernel_groups, st, s) for s, st in ((a, steps_a), (b, steps_b))]
    return StepDiff(a, b, label_a, label_b, _compare(*ops), _compare(*gpu), (len(steps_a), len(steps_b)))
