"""An attention call of a step and the report that holds a step's calls: ``AttentionCall`` (its
kernels, shapes, FLOPs, bytes and the roof it sits under, with ``why()`` for what it cannot know)
and ``AttentionReport`` (a step's calls and their device, as tables, text and JSON). The package's
docstring (``kernels.trace.attention``) states the conventions.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

import pandas as pd

from kernels.hw.devices import Peaks
from kernels.trace import roof, serving
from kernels.trace.attention_text import report_text
from kernels.trace.families import demangle, readable_name
from kernels.trace.fingerprints import attention_kernel
from kernels.trace.reader import Step
from kernels.trace.side_by_side import shape_text

SIXTEEN_BIT = {"c10::BFloat16": "bf16", "c10::Half": "fp16"}
FOOTPRINT = ("grid", "block", "registers_per_thread", "shared_memory", "occupancy_pct")


def three_digits(x: float) -> str:
    """A positive count to 3 significant digits without an exponent: "0.537", "65.0", "1,100"."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:,.{max(0, 2 - math.floor(math.log10(x)))}f}"


@dataclass
class AttentionCall:
    """One attention forward in a step: how it was found, its kernels, shapes and cost."""

    how: str                        # "fused", "kernels" (by name, no op) or "hand-written"
    library: str
    op: Optional[str]               # the outermost op of the call (None: kernels by name)
    kernels: pd.DataFrame = field(repr=False)   # its rows of Step.gpu_work, in GPU start order
    batch_heads: Optional[int] = None           # B·H (query heads), None where shapes are unknown
    sq: Optional[int] = None
    sk: Optional[int] = None
    d: Optional[int] = None
    dv: Optional[int] = None
    shapes: Optional[dict] = None   # the recorded input dims it was read from
    causal: Optional[bool] = None   # None: not recorded (hand-written cores, some traces)
    dtype: Optional[str] = None
    cpu_start_us: Optional[float] = None    # where its ops begin on the CPU (None: kernels by name)
    cpu_us: Optional[float] = None          # its ops' CPU wall time, launches included
    batch: Optional[int] = None
    heads: Optional[int] = None             # query heads
    kv_heads: Optional[int] = None
    tokens: Optional[serving.TokenCounts] = None   # a serving engine's step: its requests' token counts
    heads_source: Optional[str] = None      # where heads and head dims were read, for a serving call
    compiled: bool = False                  # launched from a torch.compile'd graph
    peaks: Optional[Peaks] = field(default=None, repr=False)   # the device's, set by find_attention

    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def _of_kernels(self, key: str, compute):
        """``compute()`` once for the current ``kernels`` table (read many times by the tables and the JSON)."""
        held = self._cache.get(key)
        if held is None or held[0] is not self.kernels:
            held = self._cache[key] = (self.kernels, compute())
        return held[1]

    @property
    def gpu_us(self) -> float:
        return self._of_kernels("gpu_us", lambda: float(self.kernels["dur_us"].sum()))

    @property
    def start_us(self) -> float:
        """When its first kernel started (µs from the step's start); on a CPU-only trace, its first op."""
        if len(self.kernels):
            return float(self.kernels["start_us"].min())
        return self.cpu_start_us if self.cpu_start_us is not None else math.nan

    def _serving_ready(self) -> bool:
        return self.tokens is not None and None not in (self.heads, self.kv_heads, self.d, self.dv)

    @property
    def flops(self) -> Optional[float]:
        """Forward FLOPs by the module's convention; None where shapes or causality are unknown."""
        if self.tokens is not None:
            heads, d, dv = self.heads, self.d, self.dv
            if not self._serving_ready() or heads is None or d is None or dv is None:  # named again: typed int below
                return None
            return roof.serving_flops(heads, d, dv, self.tokens.pairs)
        bh, sq, sk, d, dv = self.batch_heads, self.sq, self.sk, self.d, self.dv
        if bh is None or sq is None or sk is None or d is None or dv is None:
            return None
        full = roof.full_flops(bh, sq, sk, d, dv)
        if self.how == "hand-written":
            return full
        if self.causal is None:
            return None
        return full / 2 if self.causal else full

    @property
    def bytes(self) -> Optional[int]:
        """Q, K, V read once and O written once (``kernels.trace.roof``); None where unknown."""
        element = roof.ELEMENT_BYTES.get(self.dtype or "")
        if element is None or self.d is None or self.dv is None:
            return None
        if self.tokens is not None:
            heads, kv_heads = self.heads, self.kv_heads
            if not self._serving_ready() or heads is None or kv_heads is None:  # named again: typed int below
                return None
            return roof.io_bytes(self.tokens.queries * heads, self.tokens.keys * kv_heads,
                                 self.d, self.dv, element)
        if self.batch_heads is None or self.sq is None or self.sk is None:
            return None
        kv_rows = self.batch_heads * self.sk
        if self.batch is not None and self.kv_heads is not None:
            kv_rows = self.batch * self.kv_heads * self.sk
        return roof.io_bytes(self.batch_heads * self.sq, kv_rows, self.d, self.dv, element)

    @property
    def tflops(self) -> Optional[float]:
        flops = self.flops
        return flops / (self.gpu_us * 1e-6) / 1e12 if flops is not None and self.gpu_us > 0 else None

    @property
    def tbps(self) -> Optional[float]:
        """Bytes (the module's count) over the call's GPU time, in TB/s."""
        nbytes = self.bytes
        return nbytes / (self.gpu_us * 1e-6) / 1e12 if nbytes is not None and self.gpu_us > 0 else None

    def roof(self) -> Optional[roof.Roof]:
        """Where the call sits under its device's roofline; None where ``why()`` says."""
        if self.flops is None or not self.bytes or self.gpu_us <= 0 or self.peaks is None \
                or self.dtype not in roof.SIXTEEN_BIT_NAMES:
            return None
        return roof.place(self.flops, self.bytes, self.gpu_us * 1e-6, self.peaks)

    @property
    def bound(self) -> Optional[str]:
        found = self.roof()
        return found.bound if found else None

    def why(self) -> dict:
        """For each cost field that is None, the reason, in words."""
        reasons = {}
        shapes = self._why_no_shapes()
        if self.flops is None:
            reasons["flops"] = shapes or ("the trace does not record this call's mask (is_causal, or a "
                                          "FlexAttention block mask)"
                                          if self.causal is None else "unknown")
        if self.bytes is None:
            reasons["bytes"] = shapes or (f"no element size known for dtype {self.dtype!r}"
                                          if self.dtype else "the trace records no input dtype")
        no_time = "no GPU time: the trace records no kernel for this call (a CPU-only trace)"
        for name, base in (("tflops", "flops"), ("tbps", "bytes")):
            if getattr(self, name) is None:
                reasons[name] = reasons.get(base) or no_time
        if self.roof() is None:
            if self.peaks is None:
                why = "no datasheet peaks for this device (not named in the trace: give --device NAME)"
            elif self.dtype not in roof.SIXTEEN_BIT_NAMES:
                why = f"the peaks here are dense 16-bit ones and this call's inputs are {self.dtype or 'of unknown dtype'}"
            else:
                why = reasons.get("flops") or reasons.get("bytes") or no_time
            reasons["bound"] = reasons["roof_share"] = why
        if self.peak_share(self.peaks.flops if self.peaks else None) is None:
            reasons["peak_share"] = reasons.get("bound") or reasons.get("tflops") or "unknown"
        return reasons

    def _why_no_shapes(self) -> Optional[str]:
        if self.tokens is not None:
            if self._serving_ready():
                return None
            return ("the step annotation gives the token counts, but nothing gives the heads and head dim: "
                    "no engine attention op with shapes in this trace; give its graph-capture trace "
                    "(--capture) or --heads HQ/HKV --head-dim D")
        if self.batch_heads is not None and self.sq is not None:
            return None
        if self.how == "kernels":
            return ("replayed from a graph: no op recorded its shapes, and no engine step annotation "
                    "(execute_..._context_..._generation_...) covers its launch")
        return "its op records no input shapes (record_shapes=False, or a layout this module does not read)"

    def main_kernel(self) -> Optional[pd.Series]:
        """The call's attention kernel (by name, a main one first), else its longest kernel."""
        return self._of_kernels("main", self._find_main_kernel)

    def _find_main_kernel(self) -> Optional[pd.Series]:
        k = self.kernels[self.kernels["cat"] == "kernel"]
        if k.empty:
            return None
        stages = [attention_kernel(n) for n in k["name"]]
        for wanted in (("main",), ("main", "combine", "prologue")):
            named = k[[x is not None and x[1] in wanted for x in stages]]
            if len(named):
                return named.loc[named["dur_us"].idxmax()]
        return k.loc[k["dur_us"].idxmax()]

    def footprint(self) -> dict:
        """Grid, block, registers per thread, shared memory (bytes) and Kineto's estimated
        occupancy (%) of the main kernel; None for what the trace did not record."""
        return dict(self._of_kernels("footprint", self._read_footprint))

    def _read_footprint(self) -> dict:
        main = self.main_kernel()
        if main is None:
            return dict.fromkeys(FOOTPRINT)
        return {k: _plain(main[k]) for k in FOOTPRINT}

    def as_dict(self, peak_flops: Optional[float] = None) -> dict:
        main = self.main_kernel()
        found = self.roof()
        peak = peak_flops if peak_flops is not None else (self.peaks.flops if self.peaks else None)
        return {
            "how": self.how, "library": self.library, "op": self.op, "compiled": self.compiled,
            "kernels": self.kernels["name"].tolist(),
            "main_kernel": None if main is None else main["name"],
            "readable_kernel": None if main is None else readable_name(main["name"]),
            "start_us": round(self.start_us, 3), "gpu_us": round(self.gpu_us, 3), "cpu_us": self.cpu_us,
            "batch_heads": self.batch_heads, "batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads,
            "sq": self.sq, "sk": self.sk, "d": self.d, "dv": self.dv,
            "tokens": self.tokens.as_dict() if self.tokens else None, "heads_source": self.heads_source,
            "shapes": self.shapes, "causal": self.causal, "dtype": self.dtype,
            "flops": self.flops, "bytes": self.bytes, "intensity": found.intensity if found else None,
            "tflops": self.tflops, "tbps": self.tbps, "bound": found.bound if found else None,
            "roof_share": found.share if found else None, "peak_share": self.peak_share(peak),
            **self.footprint(), "why": self.why(),
        }

    def peak_share(self, peak_flops: Optional[float]) -> Optional[float]:
        """Achieved FLOP/s over the device's dense 16-bit peak, for 16-bit inputs only."""
        t = self.tflops
        if t is None or not peak_flops or self.dtype not in SIXTEEN_BIT.values():
            return None
        return t * 1e12 / peak_flops


@dataclass
class AttentionReport:
    """The attention calls of one step, with the device they ran on."""

    step: Step = field(repr=False)
    device: Optional[str]
    peaks: Optional[Peaks]
    calls: list[AttentionCall]
    device_how: Optional[str] = None     # how the device was known: named in the trace, matched, given
    engine_steps: list = field(default_factory=list)   # the serving engine's step annotations read

    @property
    def step_gpu_us(self) -> float:
        return self.step.gpu_time_us

    @property
    def attention_gpu_us(self) -> float:
        return sum(c.gpu_us for c in self.calls)

    @property
    def attention_share(self) -> Optional[float]:
        return self.attention_gpu_us / self.step_gpu_us if self.step_gpu_us > 0 else None

    def as_dict(self) -> dict:
        peak = self.peaks.flops if self.peaks else None
        return {
            "device": self.device, "device_how": self.device_how,
            "peak_tflops": peak / 1e12 if peak else None,
            "bandwidth_tbps": self.peaks.bandwidth / 1e12 if self.peaks else None,
            "ridge": self.peaks.ridge if self.peaks else None,
            "peak_source": f"{self.peaks.name}: {self.peaks.source}" if self.peaks else None,
            "step": self.step.label, "step_gpu_us": round(self.step_gpu_us, 3),
            "engine_steps": [c.as_dict() for c in self.engine_steps],
            "attention_gpu_us": round(self.attention_gpu_us, 3), "attention_share": self.attention_share,
            "calls": [c.as_dict(peak) for c in self.calls],
        }

    def summary(self) -> dict:
        """The step's attention in one column, to set one model's step on two devices side by
        side: the device, how many calls, their kernels, the median call's GPU time, TFLOP/s and
        share of peak, attention's share of the step, and the first call's footprint ("not
        recorded" where the trace has none). Medians suit a step whose calls are alike (one
        model's layers); a step with calls of two shapes is better read with ``table``."""
        if not self.calls:
            raise ValueError(f"step {self.step.label} has no attention call to summarise")
        peak = self.peaks.flops if self.peaks else None
        calls = pd.DataFrame([{"gpu_us": c.gpu_us, "kernels": len(c.kernels), "tflops": c.tflops,
                               "peak": c.peak_share(peak)} for c in self.calls])
        mains = sorted({short_kernel_name(m["name"]) for m in (c.main_kernel() for c in self.calls) if m is not None})
        fp = self.calls[0].footprint()
        missing = "not recorded"
        share = self.attention_share
        return {
            "device": self.device or missing,
            "attention calls": len(self.calls),
            "kernels per call": int(calls["kernels"].median()),
            "main kernel": ", ".join(mains) or "none",
            "GPU µs per call (median)": round(float(calls["gpu_us"].median()), 1),
            "TFLOP/s (median)": _median_or(calls["tflops"], missing, 1),
            "% of dense 16-bit peak (median)": _median_or(100 * calls["peak"].astype(float), missing, 1),
            "attention's share of the step (%)": missing if share is None else round(100 * share, 1),
            "grid": dims_text(fp["grid"]) or missing, "block": dims_text(fp["block"]) or missing,
            "registers per thread": missing if fp["registers_per_thread"] is None else int(fp["registers_per_thread"]),
            "shared memory (KiB)": missing if fp["shared_memory"] is None else round(fp["shared_memory"] / 1024, 1),
            "occupancy (%)": missing if fp["occupancy_pct"] is None else fp["occupancy_pct"],
        }

    def table(self) -> pd.DataFrame:
        """One row per call: how it was found, its kernel, shape and footprint (``roof_table`` has its costs)."""
        peak = self.peaks.flops if self.peaks else None
        rows = []
        for i, c in enumerate(self.calls):
            main, fp = c.main_kernel(), c.footprint()
            share = c.peak_share(peak)
            rows.append({
                "#": i, "how": c.how, "kernels": len(c.kernels),
                "main kernel": "" if main is None else short_kernel_name(main["name"]),
                "B·H x Sq x Sk x D": shape_text(c), "causal": "" if c.tokens is not None else {None: "?", True: "yes", False: "no"}[c.causal],
                "GPU µs": round(c.gpu_us, 1),
                "GFLOP": "" if c.flops is None else f"{c.flops / 1e9:.2f}",
                "TFLOP/s": "" if c.tflops is None else f"{c.tflops:.1f}",
                "% peak": "" if share is None else f"{100 * share:.1f}",
                "grid": dims_text(fp["grid"]), "block": dims_text(fp["block"]),
                "regs": "" if fp["registers_per_thread"] is None else int(fp["registers_per_thread"]),
                "smem KiB": "" if fp["shared_memory"] is None else f"{fp['shared_memory'] / 1024:g}",
                "occ %": "" if fp["occupancy_pct"] is None else f"{fp['occupancy_pct']:g}",
            })
        return pd.DataFrame(rows)

    def roof_table(self) -> pd.DataFrame:
        """One row per call, seven columns: its kernel (readable), GPU µs, GFLOP, MiB moved,
        TB/s, the roof that binds and the share of it achieved; blank where ``why`` says."""
        rows = []
        for i, c in enumerate(self.calls):
            main, found = c.main_kernel(), c.roof()
            rows.append({
                "kernel": "" if main is None else readable_name(main["name"]),
                "GPU µs": round(c.gpu_us, 1),
                "GFLOP": "" if c.flops is None else three_digits(c.flops / 1e9),
                "MiB moved": "" if c.bytes is None else f"{c.bytes / 2**20:.1f}",
                "TB/s": "" if c.tbps is None else f"{c.tbps:.2f}",
                "bound": "" if found is None else found.bound,
                "% of roof": "" if found is None else f"{100 * found.share:.1f}",
            })
        return pd.DataFrame(rows, index=pd.RangeIndex(len(rows), name="#"))

    def footnotes(self) -> list[str]:
        """Why the blank cells are blank: each distinct reason once, with the fields it empties."""
        seen: dict[str, set] = {}
        for c in self.calls:
            for name, reason in c.why().items():
                seen.setdefault(reason, set()).add(name)
        return [f"{', '.join(sorted(fields))} blank: {reason}" for reason, fields in seen.items()]

    def text(self) -> str:
        """The report as a reader sees it in a terminal."""
        return report_text(self)


# ----------------------------------------------------------------------------- display helpers

def short_kernel_name(name: str) -> str:
    """A kernel's identifier without ``void``, template arguments and parameters."""
    text = re.sub(r"^void\s+", "", demangle(name)).replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", text, maxsplit=1)[0].strip()


def _median_or(values: pd.Series, missing: str, digits: int):
    known = pd.to_numeric(values, errors="coerce").dropna()
    return round(float(known.median()), digits) if len(known) else missing


def dims_text(dims) -> str:
    """A kernel's grid or block as a reader writes it ("5x16x16"); "" where none was recorded."""
    return "x".join(str(int(x)) for x in dims) if isinstance(dims, (list, tuple)) and dims else ""


def _plain(value):
    """A trace value as plain JSON (no NaN, no numpy scalars)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, list):
        return [int(x) for x in value]
    return float(value) if isinstance(value, (int, float)) or hasattr(value, "item") else value


__all__ = ["AttentionCall", "AttentionReport", "FOOTPRINT", "SIXTEEN_BIT", "dims_text", "short_kernel_name"]
