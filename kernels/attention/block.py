"""Chapter 8: one transformer block, with any registered attention plugged in.

A pre-norm decoder block in the style of nanoGPT (Karpathy, ``model.py``):

    x = x + proj(attention(qkv(norm1(x))))
    x = x + mlp(norm2(x)),   mlp = fc_out(gelu(fc_in(·)))

The attention is looked up by name (``kernels.get(name)``). Each part runs inside a
``record_function`` label (``block.qkv``, ``block.attention``, ...), so a profiled forward
splits by part; a compiled block has none (``labels=False``). ``flops_by_part`` counts the
block's matmul FLOPs by part, the way ``FlopCounterMode`` counts what runs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import record_function

from kernels.reference import max_rel_error
from kernels.registry import get
from kernels.trace import breakdown

PARTS = ("norm1", "qkv", "attention", "proj", "norm2", "mlp")


class Block(nn.Module):
    """One pre-norm transformer block: width = heads × head_dim, MLP hidden = mlp_ratio × width."""

    def __init__(self, width: int, heads: int, attention="sdpa_flash", mlp_ratio: int = 4,
                 labels: bool = True):
        super().__init__()
        if width % heads:
            raise ValueError(f"width ({width}) must be a multiple of heads ({heads})")
        self.width, self.heads, self.labels = width, heads, labels
        # A registered name (KeyError listing the names if unknown), or any fn(q, k, v, causal=).
        self.attention = attention if isinstance(attention, str) else getattr(attention, "__name__", "custom")
        self.attend = get(attention) if isinstance(attention, str) else attention
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)             # q, k and v in one matmul
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc_in = nn.Linear(width, mlp_ratio * width)
        self.fc_out = nn.Linear(mlp_ratio * width, width)

    def part(self, name: str):
        return record_function(f"block.{name}") if self.labels else contextlib.nullcontext()

    def forward(self, x):                                  # x: [B, S, W]
        b, s, w = x.shape
        h, d = self.heads, w // self.heads
        with self.part("norm1"):
            y = self.norm1(x)
        with self.part("qkv"):
            q, k, v = self.qkv(y).split(w, dim=-1)        # [B, S, 3W] -> 3 × [B, S, W]
            q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in (q, k, v))   # [B, H, S, D] views
        with self.part("attention"):
            a = self.attend(q, k, v, causal=True)          # [B, H, S, D]
        with self.part("proj"):
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))   # [B, S, H, D] -> [B, S, W]
        with self.part("norm2"):
            y = self.norm2(x)
        with self.part("mlp"):
            x = x + self.fc_out(F.gelu(self.fc_in(y)))     # [B, S, W] -> [B, S, 4W] -> [B, S, W]
        return x


def sdpa_causal(q, k, v, causal: bool = True):
    """SDPA with its default backend choice, for a compiled block: Sq == Sk in a block, so
    SDPA's top-left ``is_causal`` is the same mask as the bottom-right one ``kernels.get``'s
    implementations use, and the call compiles into one graph."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def flops_by_part(seq: int, width: int, batch: int = 1, mlp_ratio: int = 4, causal_skip: bool = False) -> dict:
    """Matmul FLOPs of one forward by part (2 per multiply-add). The attention computes
    q kᵀ and probs · v over all S×S scores (4·B·S²·W), halved when ``causal_skip`` (a kernel
    that skips the tiles above the diagonal). Norms, GELU and residual adds are not matmuls
    and are left out: they are O(S·W) and small next to these."""
    tokens = batch * seq
    attention = 4.0 * batch * seq * seq * width
    return {
        "qkv": 2.0 * tokens * width * 3 * width,
        "attention": attention / 2 if causal_skip else attention,
        "proj": 2.0 * tokens * width * width,
        "mlp": 2.0 * 2 * tokens * width * mlp_ratio * width,
    }


def attention_share(seq: int, width: int, mlp_ratio: int = 4, causal_skip: bool = False) -> float:
    """Attention's share of the block's matmul FLOPs: S / (S + c·W), with c = 6 for a dense
    S×S attention and 12 for one that skips the masked half (at mlp_ratio 4). It grows with S
    at fixed width, and passes one half at S = c·W."""
    f = flops_by_part(seq, width, mlp_ratio=mlp_ratio, causal_skip=causal_skip)
    return f["attention"] / sum(f.values())


def counted_flops(module: nn.Module, x: torch.Tensor) -> dict:
    """FLOPs PyTorch's FlopCounterMode counts for one forward, by ATen op (mm, bmm, addmm, ...)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(x)
    return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def block_input(batch: int, seq: int, width: int, device="cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A block's input: [batch, seq, width] standard-normal activations, seeded by ``seq`` (the
    same tokens at the same length, whatever ran before)."""
    g = torch.Generator().manual_seed(seq)
    return torch.randn(batch, seq, width, generator=g).to(device=device, dtype=dtype)


def seeded_block(width: int, heads: int, attention, labels: bool = True, device="cpu",
                 dtype: torch.dtype = torch.float32) -> Block:
    """A ``Block`` in eval mode with weights from seed 0: the same weights for every attention
    plugged in, so their outputs can be compared."""
    torch.manual_seed(0)
    return Block(width, heads, attention, labels=labels).to(device=device, dtype=dtype).eval()


def pluggable(device) -> list[str]:
    """The registered attentions worth plugging into a block on ``device``: those that run here,
    less the compiled entries (they compile once per shape; chapter 8 compiles the whole block
    instead) and, on a CPU, Triton's interpreter (seconds per call, no performance number)."""
    from kernels.registry import available

    device = torch.device(device)
    return [name for name, why in available(device).items()
            if why is None and name not in ("compiled_naive", "flex") and not (name == "triton" and device.type == "cpu")]


def largest_difference(outs: dict) -> float:
    """The largest difference between any output in ``outs`` and the first, relative to the
    first's largest magnitude: one number that says whether every attention gave the block the
    same result."""
    if not outs:
        raise ValueError("largest_difference needs at least one output")
    base = next(iter(outs.values()))
    return max(max_rel_error(o, base) for o in outs.values())


def flop_shares(module: nn.Module, batch: int, width: int, seqs, device="cpu",
                dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """One row per length in ``seqs``: the linear layers' and attention's GFLOP of one forward of
    ``module`` as FlopCounterMode counts them (addmm, bmm), beside ``flops_by_part``'s formula,
    and attention's counted share. ``module`` is a block whose attention computes every score
    (``naive``), so the formula is the dense one."""
    rows = []
    for s in seqs:
        counted = counted_flops(module, block_input(batch, s, width, device=device, dtype=dtype))
        formula = flops_by_part(s, width, batch)
        rows.append({"seq": s, "linear (GFLOP)": counted.get("addmm", 0) / 1e9,
                     "attention (GFLOP)": counted.get("bmm", 0) / 1e9,
                     "formula linear": (formula["qkv"] + formula["proj"] + formula["mlp"]) / 1e9,
                     "formula attention": formula["attention"] / 1e9})
    table = pd.DataFrame(rows).set_index("seq")
    table["attention share"] = table["attention (GFLOP)"] / (table["attention (GFLOP)"] + table["linear (GFLOP)"])
    return table


def formula_gap(shares: pd.DataFrame) -> float:
    """The largest difference (GFLOP) between what FlopCounterMode counted and the formula, over
    ``flop_shares``' table: linear layers and attention, every length."""
    counted = shares[["linear (GFLOP)", "attention (GFLOP)"]].to_numpy()
    return float(abs(counted - shares[["formula linear", "formula attention"]].to_numpy()).max())


def share_figure(shares: pd.DataFrame, width: int):
    """Attention's share of a block's FLOPs against S: ``flop_shares``' counted points on the
    formula's curves S / (S + 6W) (every score computed) and S / (S + 12W) (causal tiles skipped)."""
    from matplotlib.figure import Figure

    grid = [32 * 2**i for i in range(9)]
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(shares.index, shares["attention share"], "o", label="counted (FlopCounterMode, naive attention)")
    ax.plot(grid, [attention_share(s, width) for s in grid], "-", label="S / (S + 6W): all scores computed")
    ax.plot(grid, [attention_share(s, width, causal_skip=True) for s in grid], "--",
            label="S / (S + 12W): causal tiles skipped")
    ax.axhline(0.5, color="grey", lw=0.6)
    ax.set(xscale="log", xlabel="sequence length S", ylabel="attention's share of block FLOPs",
           title=f"one block, width {width}", ylim=(0, 1))
    ax.legend(fontsize=8)
    return fig


def memory_by_attention(blocks_by_name: dict, x: torch.Tensor, *, active: int, trace_dir="traces") -> tuple[dict, pd.DataFrame]:
    """Profile each block of ``blocks_by_name`` (one warm-up step, then ``active`` steps) and read
    its memory: the block's peak and total allocated, what its ``block.attention`` part allocated,
    and its largest single allocation (MiB). Returns each block's median step and that table."""
    from kernels.trace.reader import median_step

    runs, steps = profile_blocks(blocks_by_name, x, active=active, trace_dir=trace_dir)
    rows = {}
    for name, step in steps.items():
        run = runs[name]
        rows[name] = {"block peak (MiB)": step.peak_bytes / 2**20, "block allocated (MiB)": step.allocated_bytes / 2**20,
                      "attention allocated (MiB)": median_step(run.trace.steps("block.attention")).allocated_bytes / 2**20,
                      "largest allocation (MiB)": step.memory["bytes"].max() / 2**20}
    return steps, pd.DataFrame(rows).T.round(1)


def profile_blocks(blocks_by_name: dict, x: torch.Tensor, *, active: int, trace_dir="traces") -> tuple[dict, dict]:
    """Profile each block of ``blocks_by_name`` on ``x`` (one warm-up step, then ``active`` steps,
    trace ``block_<name>``). Returns each block's run and its median step, by name."""
    from kernels.trace import reader, record

    if not blocks_by_name:
        raise ValueError("profile_blocks needs at least one block to profile")
    runs = {name: record.profile(module, x, label="block", wait=0, warmup=1, active=active, trace_dir=trace_dir,
                                 trace_name=f"block_{name}") for name, module in blocks_by_name.items()}
    return runs, {name: reader.median_step(run.steps()) for name, run in runs.items()}


@dataclass(frozen=True)
class ForwardParts:
    """One model forward read from a GPU trace, split by kind of work (``forward_parts``)."""

    parts: pd.DataFrame   # ``forward_parts``' table
    layers: int           # decoder layers: one attention call each
    device: str
    credit: str           # who recorded the trace, where (shown beside its table)

    def part(self, kind: str) -> pd.Series:
        """The row of one kind of work: a key of ``breakdown.KIND_LABELS`` ("gemm", "attention", ...)."""
        return self.parts.loc[breakdown.KIND_LABELS[kind]]


def forward_parts(borrowed) -> ForwardParts:
    """Read a borrowed model forward (a ``kernels.borrowed.Borrowed``): its GPU time by part,
    its number of layers (one attention call per layer), the GPU and the trace's credit."""
    from kernels.trace.attention import find_attention

    trace = borrowed.trace()
    report = find_attention(borrowed.step(trace=trace))
    if not report.calls:
        raise ValueError(f"{borrowed.file}: no attention call found, so no layers to count")
    # The chapter's words for time_by_kind's table, its rows by GPU time (most first).
    parts = breakdown.time_by_kind(report).sort_values("GPU µs", ascending=False).rename(
        index=breakdown.KIND_LABELS, columns={"work": "kernels", "share": "share of the step",
                                              "launched by": "launched by"})
    return ForwardParts(parts, len(report.calls), report.device or borrowed.gpu(trace),
                        borrowed.credit(trace))


def parts_figure(parts: pd.DataFrame, title: str):
    """Horizontal bars of each part's share of a step's GPU time (``forward_parts``' table),
    the largest on top."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3), layout="constrained")
    ax = fig.add_subplot()
    shares = parts["share of the step"].iloc[::-1]   # the largest drawn last: on top
    ax.barh(list(shares.index), shares.to_numpy(), color="tab:blue")
    ax.set(xlabel="share of the step's GPU time", ylabel="", title=title)
    return fig


def parts_table(parts: pd.DataFrame, layers: int):
    """``forward_parts``' table as the page shows it: GPU ms, µs per layer (``layers``
    decoder layers in the step) and share of the step, formatted."""
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    shown = parts.assign(**{"GPU ms": parts["GPU µs"] / 1e3, "per layer (µs)": parts["GPU µs"] / layers})
    return shown.drop(columns="GPU µs").style.format({"GPU ms": "{:.2f}", "per layer (µs)": "{:.0f}",
                                                      "share of the step": "{:.1%}"})
