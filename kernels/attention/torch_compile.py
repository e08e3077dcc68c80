"""Chapter 7: attention that ``torch.compile`` writes for us, and FlexAttention.

Two registry entries: ``compiled_naive`` (chapter 1's naive module under ``torch.compile``:
Inductor fuses scale, mask and softmax into one generated kernel and keeps the matmuls as
library calls) and ``flex`` (``flex_attention`` with a bottom-right causal ``BlockMask``: one
fused kernel that skips the tiles the mask hides). Both compile on the first call at each
new shape (seconds); nothing is set at import. The helpers are what chapter 7 reads traces
with: ``generated_kernels``, ``fused_ops``, ``block_counts``, ``score_buffers``, ``memory_table``,
``alibi``, ``alibi_error`` and ``compiled_call`` (a borrowed GPU trace of one compiled call).
"""
from __future__ import annotations

import functools
import math
import re
import shutil
import time
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Optional

import torch

from kernels import reference
from kernels.attention.naive import NaiveAttention
from kernels.registry import LRU, Reason, refuse_double_backward, register

if TYPE_CHECKING:
    import pandas

    from kernels.trace.fingerprints import Fingerprint
    from kernels.trace.reader import Step

MODULES = 16        # compiled naive modules kept, one per (causal, scale, device)
BLOCK_MASKS = 16    # block masks kept, one per (Sq, Sk, device)

# Inductor names its generated kernels after the ops it fused: cpp_fused_<ops>_<n> on a CPU
# (graph_<g>_cpp_fused_... when kernel profiling is on), triton_<poi|red|per|tem>_fused_<ops>_<n>
# on a GPU. FlexAttention's own template is triton_tem_fused_... on a GPU; on a CPU its C++
# template shows (kernel profiling on) as graph_<g>_kernel, a name that lists no ops.
GENERATED = re.compile(r"(?:^|_)(?:cpp|triton)_(?:poi_|red_|per_|tem_|for_)?fused|^graph_\d+_kernel$|CppFlexAttention",
                       re.I)
COMPILED_REGION = "Torch-Compiled Region"


# ------------------------------------------------------------------------------ can it run?

def compiler_reason(device: torch.device) -> Reason:
    """Why ``torch.compile``'s Inductor backend cannot generate code for ``device`` here (or None)."""
    if device.type == "cpu":
        if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
            return ("torch.compile on a CPU writes C++ and needs a C++ compiler (c++, g++ or "
                    "clang++ on PATH); none was found")
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile on a GPU writes Triton kernels and needs the triton package; it is not installed"
        return None
    return f"torch.compile's Inductor backend is used here on cpu and cuda only, not {device.type}"


# ------------------------------------------------------------------------------ compiled_naive

_compiled = LRU(MODULES)


def compiled_module(causal: bool, scale: float, device, dynamic: Optional[bool] = None) -> "CompiledNaive":
    """One compiled NaiveAttention per (causal, scale, device), kept (bounded) so it compiles once.

    ``dynamic=None`` is torch.compile's default: the first shape is compiled static, and a
    second shape recompiles with symbolic sizes, so a sweep over the lengths of one layout
    (Sq == Sk > 1, same heads and head dim) pays at most two compiles in all, not one per
    length. ``tests/attention/test_compiled.py`` counts them over 12 lengths. Other shape
    classes (one query, Sq > Sk, grouped-query heads) and grad modes (no_grad, inference_mode,
    inputs that require grad) take a graph each. ``NaiveAttention`` builds its mask inside the
    graph when compiled, so its mask cache adds no guard (see ``NaiveAttention.mask_for``).
    """
    return _compiled.get_or_make((causal, scale, str(device), dynamic),
                                 lambda: CompiledNaive(NaiveAttention(causal=causal, scale=scale), dynamic))


def _attend(module, q, k, v):
    return module(q, k, v)


def _own_code(fn: Callable) -> Callable:
    """A copy of ``fn`` with a code object of its own (Dynamo keeps its graphs per code object)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class CompiledNaive:
    """``module`` under ``torch.compile(fullgraph=True)``, which keeps running past Dynamo's recompile limit.

    Dynamo compiles a graph per shape class and grad mode, and at ``recompile_limit`` (8)
    graphs of one code object, with ``fullgraph=True``, every new one raises
    ``FailOnRecompileLimitHit`` ("Hard failure due to fullgraph=True"). So each instance compiles
    its own copy of a one-line function (its graphs count apart from every other instance's), and
    when the limit is hit it starts over on a fresh copy: the call recompiles instead of failing,
    and never runs eagerly under a compiled name. ``fullgraph=True`` still makes any failure
    to capture one graph raise."""

    def __init__(self, module: NaiveAttention, dynamic: Optional[bool] = None):
        self.module, self.dynamic = module, dynamic
        self.restarts = 0  # how many times the limit was hit and a fresh copy compiled
        self._fn = self._compile()

    def _compile(self) -> Callable:
        return torch.compile(_own_code(_attend), dynamic=self.dynamic, fullgraph=True)

    def __call__(self, q, k, v):
        from torch._dynamo.exc import FailOnRecompileLimitHit, Unsupported

        try:
            out = self._fn(self.module, q, k, v)
        except FailOnRecompileLimitHit as hit:
            # Nothing ran eagerly: take the hit off Dynamo's count of frames given up, which
            # compile_counts() and the benchmark's eager-fallback check read.
            if isinstance(hit.__cause__, Unsupported) and getattr(hit.__cause__, "category", None):
                hit.__cause__.remove_from_stats()
            self._fn = self._compile()
            self.restarts += 1
            out = self._fn(self.module, q, k, v)
        if torch.is_grad_enabled() and out.requires_grad:
            out = _OnceDifferentiable.apply(out)
        return out


class _OnceDifferentiable(torch.autograd.Function):
    """Identity whose backward refuses to build a graph (``create_graph=True``, double backward)
    in words: AOTAutograd compiles one backward, which fails there with a message about donated
    buffers that names neither the implementation nor what was asked."""

    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("compiled_naive", "torch.compile's AOTAutograd compiles a single backward")
        return grad


@register("compiled_naive", order=80, requires=compiler_reason, materializes_scores=True, slow_on_cpu=True)
def compiled_naive(q, k, v, causal=True, scale=None):
    """The naive module of chapter 1 under torch.compile (Inductor fuses scale, mask and softmax)."""
    return compiled_module(causal, scale, q.device)(q, k, v)


class BrokenAttention(NaiveAttention):
    """NaiveAttention with a graph break before the mask: the same arithmetic, two graphs.

    ``torch._dynamo.graph_break()`` stands for anything Dynamo cannot trace (a print, a call
    into a C extension, data-dependent Python control flow): Dynamo ends the graph there, runs
    that line in Python, and starts a new graph after it. Eager, it does nothing.
    """

    def mask_scores(self, scores, future):
        torch._dynamo.graph_break()
        return super().mask_scores(scores, future)


# ------------------------------------------------------------------------------ flex

def causal_mod(offset: int) -> Callable:
    """mask_mod: query i sees key j when j <= i + offset (offset = Sk - Sq: bottom-right causal)."""
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    causal.__qualname__ = f"causal_mod({offset})"
    return causal


_mods = LRU(BLOCK_MASKS)
_block_masks = LRU(BLOCK_MASKS)


def causal_block_mask(sq: int, sk: int, device):
    """The BlockMask of bottom-right causal attention for Sq queries and Sk keys (cached per shape).

    ``create_block_mask`` evaluates the mask_mod once per (query, key) pair, up front, and
    keeps per 128×128 tile whether it is full (no mask needed), partial (mask each score)
    or empty (skipped). One mask_mod function per offset, so that the compiled kernel's
    guards see the same function at the same shape.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    mod = _mods.get_or_make(sk - sq, lambda: causal_mod(sk - sq))
    return _block_masks.get_or_make(
        (sq, sk, str(device)), lambda: create_block_mask(mod, None, None, sq, sk, device=str(device)))


@functools.cache
def compiled_flex() -> Callable:
    """``torch.compile(flex_attention)``, made on first use (PyTorch's documented way to run it:
    called eagerly, flex_attention materializes the scores and warns)."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention)


def flex_call(q, k, v, *, block_mask=None, score_mod=None, scale=None):
    """Compiled flex_attention on the contract's shapes (GQA passed as ``enable_gqa``)."""
    return compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                           enable_gqa=q.shape[1] != k.shape[1])


@register("flex", order=81, requires=compiler_reason, slow_on_cpu=True,
          dtypes=(torch.float32, torch.float16, torch.bfloat16))
def flex(q, k, v, causal=True, scale=None):
    """FlexAttention, compiled, with a bottom-right causal block mask (chapter 7).

    Rows that see no key (causal with Sq > Sk) come out as zeros: their tiles are all empty,
    so nothing is accumulated, and FlexAttention writes 0 where the row's sum is 0. float64
    is refused: FlexAttention's CPU kernel takes float32, float16 and bfloat16 only.
    """
    mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return flex_call(q, k, v, block_mask=mask, scale=scale)


# ------------------------------------------------------------------------------ score_mods

def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes for a power-of-two head count: 2^(-8/H), 2^(-16/H), ... (Press et
    al., "Train Short, Test Long", 2021)."""
    if heads < 1 or heads & (heads - 1):
        raise ValueError(f"ALiBi's geometric slopes are defined here for a power-of-two head count, got {heads}")
    return [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]


def alibi(heads: int, device="cpu") -> Callable:
    """score_mod adding ALiBi's bias: slope[h] · (j - i), a penalty growing with distance.

    The slopes are a tensor the score_mod captures; flex reads it inside its kernel, so it must
    live on the inputs' device.
    """
    slopes = torch.tensor(alibi_slopes(heads), device=device)

    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi_bias


def alibi_reference(q, k, v, causal: bool = True, scale=None, dtype=torch.float64) -> torch.Tensor:
    """ALiBi attention written out: in float64 on the CPU (the judge of the flex version), or,
    with ``dtype``, in that dtype on the inputs' device (plain attention's own error in a 16-bit
    dtype, which FlashAttention's rule lets a fused kernel double)."""
    device = "cpu" if dtype == torch.float64 else q.device
    q, k, v = (t.detach().to(device, dtype) for t in (q, k, v))
    b, h, sq, d = q.shape
    sk = k.shape[-2]
    group = h // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)              # [B, H, Sk, D]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    slopes = torch.tensor(alibi_slopes(h), dtype=dtype, device=device).view(h, 1, 1)   # [H, 1, 1]
    i = torch.arange(sq, dtype=dtype, device=device).view(sq, 1)                      # [Sq, 1]
    j = torch.arange(sk, dtype=dtype, device=device).view(1, sk)                      # [1, Sk]
    scores = (q @ k.transpose(-2, -1)) * scale + slopes * (j - i)                 # [B, H, Sq, Sk]
    if causal:
        scores = scores.masked_fill(j > i + (sk - sq), float("-inf"))
    return scores.softmax(-1) @ v                                                   # [B, H, Sq, D]


def alibi_error(out: torch.Tensor, q, k, v, causal: bool = True) -> tuple[float, float]:
    """``out``'s max abs error against float64 ALiBi attention, and the bound it must stay within:
    FlashAttention's rule for 16-bit inputs (2x the error of plain ALiBi attention computed in
    that dtype, + 1e-5), else the course's fp32 rule (``reference.tolerance`` of max |ref| + 1e-6)."""
    want = alibi_reference(q, k, v, causal=causal)
    err = reference.max_abs_error(out, want)
    if q.dtype in (torch.float16, torch.bfloat16):
        plain = alibi_reference(q, k, v, causal=causal, dtype=q.dtype)
        return err, 2 * reference.max_abs_error(plain, want) + 1e-5
    return err, reference.tolerance(q.dtype) * want.abs().max().item() + 1e-6


# ------------------------------------------------------------------------------ reading them

@dataclass(frozen=True)
class BlockCounts:
    """What a BlockMask decides per tile: ``full`` (no mask), ``partial`` (masked), ``skipped``."""

    block: tuple[int, int]
    full: int
    partial: int
    skipped: int

    @property
    def total(self) -> int:
        return self.full + self.partial + self.skipped

    @property
    def skipped_share(self) -> float:
        return self.skipped / self.total

    def table(self) -> "pandas.DataFrame":  # noqa: F821
        """The counts as the page shows them: tile size, tiles, full, partial, skipped, skipped share."""
        import pandas as pd

        return pd.Series({"tile (queries × keys)": f"{self.block[0]} × {self.block[1]}", "tiles": self.total,
                          "full": self.full, "partial (masked)": self.partial, "skipped": self.skipped,
                          "skipped share": f"{self.skipped_share:.1%}"}).to_frame("causal block mask")


def block_counts(block_mask) -> BlockCounts:
    """Count the tiles a BlockMask computes in full, computes with a mask, and skips (all heads)."""
    full = int(block_mask.full_kv_num_blocks.sum()) if block_mask.full_kv_num_blocks is not None else 0
    partial = int(block_mask.kv_num_blocks.sum())
    q_len, kv_len = block_mask.seq_lengths
    bq, bk = block_mask.BLOCK_SIZE
    rows = block_mask.kv_num_blocks.numel()  # one row of tiles per (batch, head, query block)
    total = rows * math.ceil(kv_len / bk)
    return BlockCounts((bq, bk), full, partial, total - full - partial)


def fused_ops(kernel_name: str) -> list[str]:
    """The ops a generated kernel's name lists: ``cpp_fused__softmax_masked_fill_mul_view_0``
    -> ["softmax", "masked_fill", "mul", "view"]. Inductor names a kernel ``fused_`` plus the
    ATen ops it swallowed, joined by underscores, then a counter; the op names themselves hold
    underscores (masked_fill), so a known list splits them."""
    m = re.search(r"fused_(.*?)(_\d+)?$", kernel_name)
    if not m:
        return []
    text, found = m.group(1), []
    while text:
        text = text.lstrip("_")
        for op in _OP_NAMES:
            if text == op or text.startswith(op + "_"):
                found.append(op)
                text = text[len(op):]
                break
        else:
            head, _, text = text.partition("_")
            found.append(head)
    return found


# Longest first, so that masked_fill is not read as "masked", "fill".
_OP_NAMES = sorted(["softmax", "masked_fill", "mul", "div", "add", "sub", "exp", "amax", "sum", "view",
                    "where", "clone", "copy", "native_layer_norm", "layer_norm", "gelu", "silu",
                    "rsqrt", "pow", "mean", "tanh", "relu", "transpose", "permute", "expand",
                    "unsqueeze", "squeeze", "scalar_tensor", "lift_fresh", "logical_not", "bmm", "mm",
                    "addmm", "baddbmm", "embedding", "split", "cat", "full", "zeros", "ones", "tril",
                    "triu", "arange", "ge", "le", "lt", "gt", "eq", "index", "t", "select", "slice",
                    "unsafe_view", "reshape", "neg", "sqrt", "max", "min", "fill", "bitwise_and",
                    "bitwise_or", "to_copy", "_to_copy", "detach"], key=len, reverse=True)


def generated_kernels(step) -> "pandas.DataFrame":  # noqa: F821
    """The rows of ``step.ops`` (CPU) or ``step.gpu_work`` (GPU) that Inductor generated, with the
    ops each name says it fused (column ``fused``)."""
    table = step.gpu_work if len(step.gpu_work) else step.ops
    rows = table[table["name"].str.contains(GENERATED)].copy()
    rows["fused"] = [fused_ops(n) for n in rows["name"]]
    return rows


def regions(step) -> "pandas.DataFrame":  # noqa: F821
    """The Torch-Compiled Region spans of a step (one per compiled graph that ran, outermost)."""
    ops = step.ops
    return ops[ops["name"].str.startswith(COMPILED_REGION)]


@dataclass(frozen=True)
class Compiles:
    """What Dynamo and Inductor compiled between two snapshots (``compile_counts()``)."""

    graphs: int         # graphs Dynamo captured and handed to the backend (one per compile)
    cache_hits: int     # graphs Inductor loaded from its FX graph cache instead of compiling
    cache_misses: int   # graphs Inductor generated and compiled code for
    gave_up: int        # frames Dynamo gave up on (recompile limit, unsupported code): eager from then on

    def __sub__(self, before: "Compiles") -> "Compiles":
        return Compiles(self.graphs - before.graphs, self.cache_hits - before.cache_hits,
                        self.cache_misses - before.cache_misses, self.gave_up - before.gave_up)

    def __str__(self) -> str:
        return (f"{self.graphs} graph{'' if self.graphs == 1 else 's'} compiled ({self.cache_hits} found in Inductor's cache, "
                f"{self.cache_misses} generated)" + (f", {self.gave_up} given up" if self.gave_up else ""))


def compile_counts() -> Compiles:
    """A snapshot of torch._dynamo's counters; subtract two to count what happened between them."""
    from torch._dynamo.utils import counters

    return Compiles(counters["stats"]["unique_graphs"], counters["inductor"]["fxgraph_cache_hit"],
                    counters["inductor"]["fxgraph_cache_miss"], sum(counters["unimplemented"].values()))


@dataclass(frozen=True)
class FirstAndSteady:
    """Seconds of a first call and median seconds of the calls after it, with what each compiled."""

    first_s: float
    steady_s: float
    first: Compiles    # what the first call compiled
    steady: Compiles   # what the steady calls compiled (nothing, when one compile serves the shape)

    @property
    def compiled_once(self) -> bool:
        """One graph compiled (or loaded from Inductor's cache) on the first call, none after it,
        and Dynamo gave up on nothing: the first call's time is the whole compile cost."""
        return (self.first.graphs == 1 and self.first.cache_hits + self.first.cache_misses == 1
                and self.steady.graphs == 0 and not self.first.gave_up + self.steady.gave_up)


def timed_compiles(fn: Callable, *args, steady_calls: int = 5, **kwargs) -> FirstAndSteady:
    """``first_and_steady`` that also counts every compile each part paid for (Dynamo's counters),
    so a recompile on the second call cannot hide in the steady-state time."""
    counts = [compile_counts()]
    first, steady = first_and_steady(fn, *args, steady_calls=steady_calls, between=lambda: counts.append(
        compile_counts()), **kwargs)
    return FirstAndSteady(first, steady, counts[1] - counts[0], compile_counts() - counts[1])


def first_and_steady(fn: Callable, *args, steady_calls: int = 5, between: Optional[Callable[[], None]] = None,
                     **kwargs) -> tuple[float, float]:
    """Seconds of the first call (which compiles, if nothing is cached for it) and the median
    seconds of ``steady_calls`` calls after it, counted apart (``between`` runs in between)."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)

    def one() -> float:
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        if on_gpu:  # GPU work is asynchronous: time it to the end of its kernels
            torch.cuda.synchronize()
        return time.perf_counter() - t0
    with torch.no_grad():
        first = one()
        if between is not None:
            between()
        steady = sorted(one() for _ in range(steady_calls))
    return first, steady[len(steady) // 2]


def score_buffers(step, scores_bytes: int) -> int:
    """How many buffers of exactly one S×S scores tensor (``scores_bytes`` bytes) ``step`` allocated:
    the count that says whether fusion kept a pass's output in memory."""
    if scores_bytes <= 0:
        raise ValueError(f"scores_bytes must be positive, got {scores_bytes}")
    return int((step.memory["bytes"] == scores_bytes).sum())


def memory_table(steps: Mapping[str, "Step"], scores_bytes: int) -> "pandas.DataFrame":  # noqa: F821
    """One row per labelled step: S×S buffers allocated, peak and total MiB, copies of S×S size."""
    import pandas as pd

    return pd.DataFrame({label: {"S×S buffers allocated": score_buffers(s, scores_bytes),
                                 "peak (MiB)": s.peak_bytes / 2**20, "allocated (MiB)": s.allocated_bytes / 2**20,
                                 "copies of S×S": len(s.copies(min_bytes=scores_bytes))}
                         for label, s in steps.items()}).T.round(2)


@dataclass(frozen=True)
class CompiledCall:
    """One compiled call read from a GPU trace (``compiled_call``)."""

    ops: "pandas.DataFrame"      # noqa: F821  every CPU op: name, depth, dur_us
    kernels: "pandas.DataFrame"  # noqa: F821  the GPU work: name, launcher, dur_us, grid, block
    kernel: "Fingerprint"        # noqa: F821  the first kernel, read from its name
    region_us: float             # CPU time of the Torch-Compiled Region(s)
    gpu_us: float                # GPU time of all its kernels
    credit: str                  # who recorded it, where (shown beside the tables)

    @property
    def names(self) -> list[str]:
        return self.ops["name"].tolist()

    @property
    def busy_share(self) -> float:
        """The GPU's busy time as a share of the compiled region's CPU time."""
        return self.gpu_us / self.region_us


def compiled_call(borrowed) -> CompiledCall:
    """Read a borrowed GPU trace of one ``torch.compile``d call (a ``kernels.borrowed.Borrowed``):
    its ops, its kernels, the first kernel's fingerprint, and GPU time against region time."""
    from kernels.trace import fingerprints

    trace = borrowed.trace()
    step = borrowed.step(trace=trace)
    work = step.gpu_work
    in_region = step.ops["name"].str.startswith(COMPILED_REGION)
    if work.empty or not in_region.any():
        raise ValueError(f"{borrowed.file}: a compiled call needs GPU work and a {COMPILED_REGION} "
                         f"({len(work)} kernels, {int(in_region.sum())} regions)")
    return CompiledCall(step.ops[["name", "depth", "dur_us"]], work[["name", "launcher", "dur_us", "grid", "block"]],
                        fingerprints.fingerprint(work["name"].iloc[0]), float(step.ops.loc[in_region, "dur_us"].sum()),
                        float(work["dur_us"].sum()), borrowed.credit(trace))
