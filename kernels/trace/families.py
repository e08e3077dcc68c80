"""Attention kernels by family: which library wrote a kernel, whether it computes attention or
merges partial results, and a name a reader can read.

``FAMILIES`` is one table, one row a kernel-name pattern: the library, the stage ("main": it
computes attention; "combine": it merges the partial outputs of a split over the keys and belongs
to the main kernel before it; "prologue": it prepares the inputs, e.g. quantises them, and belongs
to the main kernel after it), where the name is published, and the shared real trace the row was
checked on (``checked_on``; ``None``: checked on the published name only, see ``source``).
The first row that matches wins, so specific names come before general ones.

``readable_name(name)`` turns a symbol into the kernel's own name and its key template arguments:
an Itanium-mangled symbol (``_ZN7ck_tile6kentry...``) is demangled first (with ``c++filt``, where
the machine has it), a generic entry point (``ck_tile::kentry``, ``cutlass::device_kernel``) gives
way to the kernel class inside it, and the first tile shape (``ck_tile::sequence<128, 128, ...>``)
or FlashAttention's kernel traits (head dim, tile, warps) are spelled out.
"""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True)
class Family:
    """One attention-kernel pattern and what it says."""

    library: str
    pattern: str
    stage: str                    # "main", "combine" or "prologue"
    source: str                   # where the kernel's name is published
    checked_on: Optional[str]     # the shared real trace it was checked on; None: by its published name only


FA = "Dao-AILab/flash-attention"
FAMILIES: tuple[Family, ...] = (
    # FlashAttention-4 is written in CuTe DSL; its generated symbol carries the class name.
    Family("FlashAttention-4 (CuTe DSL)", r"FlashAttentionForwardCombine", "combine",
           f"{FA} flash_attn/cute/flash_fwd_combine.py (class FlashAttentionForwardCombine)", None),
    Family("FlashAttention-4 (CuTe DSL)", r"FlashAttentionForwardSm1\d\d|FlashAttentionForwardSm90", "main",
           f"{FA} flash_attn/cute/flash_fwd_sm100.py (class FlashAttentionForwardSm100)", None),
    Family("FlashAttention-3", r"FlashAttnFwdCombine", "combine",
           f"{FA} hopper/flash_fwd_combine_kernel.h (FlashAttnFwdCombine)", None),
    Family("FlashAttention-3", r"FlashAttnFwdSm\d+", "main",
           f"{FA} hopper/flash_fwd_kernel_sm90.h (FlashAttnFwdSm90)", None),
    Family("FlashAttention-2", r"flash_fwd_splitkv_combine", "combine",
           f"{FA} csrc/flash_attn/src/flash_fwd_launch_template.h (flash_fwd_splitkv_combine_kernel)", None),
    Family("FlashAttention-2", r"pytorch_flash::flash_fwd|flash_fwd_\w*kernel", "main",
           f"{FA} csrc/flash_attn/src/flash_fwd_launch_template.h; vendored in PyTorch as pytorch_flash::",
           "H100 Qwen, H100 BERT, H100 ViT"),
    Family("cuDNN", r"cudnn\w*sdpa\w*fprop|cudnn_generated\w*flash_fprop", "main",
           "cuDNN runtime-generated SDPA kernels (cudnn_generated_fort_native_sdpa_sm90_flash_fprop_...)", None),
    Family("CUTLASS memory-efficient (xFormers)", r"fmha_cutlassF", "main",
           "pytorch/pytorch aten/src/ATen/native/transformers/cuda/mem_eff_attention/kernels/ (fmha_cutlassF_*)",
           None),
    # composable kernel's tile kernels: AITER and PyTorch's CK backend on ROCm build them.
    Family("composable kernel / AITER", r"FmhaBatchPrefillWithPagedKVCacheKernel", "main",
           "ROCm/composable_kernel include/ck_tile/ops/fmha/kernel/fmha_batch_prefill_kernel.hpp; the whole "
           "symbol in TraceLens's report of its SGLang prefill+decode trace (tests/traces/inference/"
           "sglang_prefilldecode/perf_csvs/InferenceAttention_fwd.csv)", None),
    Family("composable kernel / AITER", r"FmhaFwdSplitKVCombineKernel|fmha_fwd_splitkv_combine", "combine",
           "ROCm/composable_kernel include/ck_tile/ops/fmha/kernel/fmha_fwd_splitkv_combine_kernel.hpp", None),
    Family("composable kernel / AITER", r"FmhaFwd\w*Kernel|fmha_fwd|mha_fwd", "main",
           "ROCm/composable_kernel include/ck_tile/ops/fmha/kernel/fmha_fwd_kernel.hpp; ROCm/aiter (mha_fwd)", None),
    Family("AITER paged attention (ROCm)", r"paged_attention_ll4mi\w*reduce", "combine",
           "ROCm/aiter csrc/cpp_itfs/pa (paged_attention_ll4mi_reduce_kernel)", "SGLang decode"),
    Family("AITER paged attention (ROCm)", r"paged_attention_ll4mi", "main",
           "ROCm/aiter csrc/cpp_itfs/pa (paged_attention_ll4mi_QKV_mfma16_kernel, ck_tile templates)",
           "SGLang decode"),
    Family("vLLM paged attention (CUDA)", r"paged_attention_v\d_reduce", "combine",
           "vllm-project/vllm csrc/attention/paged_attention_v2.cu (paged_attention_v2_reduce_kernel)", None),
    Family("vLLM paged attention (CUDA)", r"paged_attention_v\d", "main",
           "vllm-project/vllm csrc/attention/paged_attention_v1.cu, _v2.cu", None),
    Family("vLLM unified attention (Triton)", r"^reduce_segments$", "combine",
           "vllm-project/vllm vllm/attention/ops/triton_unified_attention.py (reduce_segments); seen after "
           "kernel_unified_attention_3d in TraceLens's report of its vllm_decode_full trace", None),
    Family("vLLM unified attention (Triton)", r"kernel_unified_attention_3d", "main",
           "vllm-project/vllm vllm/attention/ops/triton_unified_attention.py (kernel_unified_attention_3d)", None),
    Family("vLLM unified attention (Triton)", r"kernel_unified_attention", "main",
           "vllm-project/vllm vllm/attention/ops/triton_unified_attention.py (kernel_unified_attention_2d)",
           "vLLM prefill+decode"),
    Family("FlashInfer", r"MergeStates|merge_state", "combine",
           "flashinfer-ai/flashinfer include/flashinfer/attention/cascade.cuh (MergeStatesKernel)", None),
    Family("FlashInfer", r"BatchDecodeWith|BatchPrefillWith|SingleDecodeWith|SinglePrefillWith", "main",
           "flashinfer-ai/flashinfer include/flashinfer/attention/decode.cuh, prefill.cuh", None),
    Family("SGLang decode attention (Triton)", r"_fwd_kernel_stage2|_decode_softmax_reducev", "combine",
           "sgl-project/sglang python/sglang/srt/layers/attention/triton_ops/decode_attention.py", None),
    Family("SGLang decode attention (Triton)", r"_fwd_(grouped_)?kernel_stage1|_decode_att_m_fwd", "main",
           "sgl-project/sglang python/sglang/srt/layers/attention/triton_ops/decode_attention.py", None),
    # AITER's Triton SageAttention: quantise Q and K, then attend in int8; seen as sage_quant_kernel_0
    # and sage_fwd_1 in TraceLens's report of its xdit_flux.1_aiter_sage trace (ops_summary.csv).
    Family("SageAttention (AITER Triton)", r"sage_quant", "prologue",
           "ROCm/aiter aiter/ops/triton/ (sage_quant_kernel); TraceLens tests/traces/inference/"
           "xdit_flux.1_aiter_sage/perf_csvs/ops_summary.csv", None),
    Family("SageAttention (AITER Triton)", r"sage_fwd", "main",
           "ROCm/aiter aiter/ops/triton/ (@triton.jit def sage_fwd); TraceLens tests/traces/inference/"
           "xdit_flux.1_aiter_sage/perf_csvs/ops_summary.csv", None),
    # AOTriton: PyTorch's SDPA flash and memory-efficient backends on ROCm run its attn_fwd (also
    # the name of the Triton tutorial's kernel).
    Family("AOTriton (PyTorch SDPA on ROCm)", r"^attn_fwd\w*$", "main",
           "ROCm/aotriton tritonsrc/flash.py (attn_fwd); PyTorch's mha_all_aot",
           "MI300X Qwen, MI300X BERT, SD 3.5, torch.compile"),
    Family("this course's CUDA FlashAttention", r"\bflash_v\d+_kernel", "main",
           "kernels/cuda/csrc/flash_v1.cu, flash_v2.cu", None),
)
_COMPILED = tuple((re.compile(f.pattern), f) for f in FAMILIES)

# Families found by their op rather than a kernel name (their kernels are generated per program):
# (op, or where the op runs) -> (library, source, checked on).
OP_FAMILIES: dict[str, tuple[str, str, Optional[str]]] = {
    "FlexAttentionAutogradOp": (
        "FlexAttention", "pytorch/pytorch torch/_higher_order_ops/flex_attention.py (FlexAttentionAutogradOp)",
        "a CPU profile recorded by tests/trace/test_families.py"),
    "an SDPA op inside a CompiledFxGraph range": (
        "torch.compile'd SDPA", "Inductor's generated code calls aten::_scaled_dot_product_*_attention directly",
        "torch.compile, SD 3.5"),
}


@functools.lru_cache(maxsize=8192)   # a trace repeats a few hundred names thousands of times
def kernel_family(name: str) -> Optional[Family]:
    """The first row of ``FAMILIES`` whose pattern is in ``name`` (a raw or demangled symbol)."""
    text = demangle(name)
    for pattern, family in _COMPILED:
        if pattern.search(text):
            return family
    return None


# ----------------------------------------------------------------------------- readable names

@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """A C++ symbol as C++ (``c++filt``); anything else, or a machine without c++filt, as given."""
    if not name.startswith("_Z"):
        return name
    return demangle_many([name])[0]


def demangle_many(names: Iterable[str]) -> list[str]:
    """``demangle`` for many names in one ``c++filt`` run."""
    names = list(names)
    mangled = sorted({n for n in names if n.startswith("_Z") and "\n" not in n})
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return names
    try:
        done = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return names
    out = done.stdout.splitlines()
    table = dict(zip(mangled, out)) if done.returncode == 0 and len(out) == len(mangled) else {}
    return [table.get(n, n) for n in names]


_GENERIC_ENTRIES = {"kentry", "device_kernel", "kernel", "Kernel", "kernel_entry"}
_SHORT_TYPES = (("c10::BFloat16", "bf16"), ("__hip_bfloat16", "bf16"), ("std::bfloat16_t", "bf16"),
                ("cutlass::bfloat16_t", "bf16"), ("__nv_bfloat16", "bf16"), ("c10::Half", "fp16"),
                ("cutlass::half_t", "fp16"), ("_Float16", "fp16"), ("__half", "fp16"))


@functools.lru_cache(maxsize=8192)
def readable_name(name: str) -> str:
    """The kernel's name and its key template arguments, e.g. ``flash_fwd_kernel (D 64, tile
    128x64, 4 warps)`` or ``FmhaBatchPrefillWithPagedKVCacheKernel (tile 128x128x32...)``."""
    text = re.sub(r"^void\s+", "", demangle(name).strip())
    if text.startswith("_Z"):          # c++filt could not read it (or is missing): read the symbol itself
        return _readable_mangled(text)
    ident, args = _split_template(_drop_parameters(text))
    base = ident.split("::")[-1]
    if base in _GENERIC_ENTRIES and args:
        inner = next((a for a in args if re.match(r"[A-Za-z_]", a)), None)
        if inner is not None:
            ident, args = _split_template(inner)
            base = ident.split("::")[-1]
    traits = re.search(r"Flash_fwd_kernel_traits<(\d+), (\d+), (\d+), (\d+)", text)
    if traits:
        d, m, n, warps = traits.groups()
        return f"{base} (D {d}, tile {m}x{n}, {warps} warps)"
    tile = re.search(r"sequence<(\d+(?:, \d+)+)>", text)
    if tile:
        return f"{base} (tile {'x'.join(tile.group(1).split(', '))})"
    if args:
        shown = [_short_arg(a) for a in args]
        return f"{base}<{', '.join(shown)}>"
    return base


def _mangled_names(symbol: str) -> list[str]:
    """The source names an Itanium symbol spells as <length><name> (``7ck_tile`` -> "ck_tile")."""
    names, i, after_name = [], 0, False
    while i < len(symbol):
        m = re.match(r"\d+", symbol[i:])
        # a length starts after a name or a non-digit; digits inside a number are not one
        if m and i > 0 and (after_name or not symbol[i - 1].isdigit()):
            size = int(m.group())
            start = i + len(m.group())
            word = symbol[start:start + size]
            if size and re.fullmatch(r"[A-Za-z_]\w*", word):
                names.append(word)
                i, after_name = start + size, True
                continue
        i, after_name = i + 1, False
    return names


def _readable_mangled(symbol: str) -> str:
    """A kernel's name from its mangled symbol, skipping namespaces and generic entry points, with
    the first tile shape (``8sequenceIJLi128ELi128E...`` -> 128x128...)."""
    names = [n for n in _mangled_names(symbol) if n not in _GENERIC_ENTRIES]
    kernel = next((n for n in names if re.search(r"[Kk]ernel|Fwd|fwd|attn|Attention", n)), None)
    if kernel is None:
        kernel = names[1] if len(names) > 1 else (names[0] if names else symbol)
    tile = re.search(r"8sequenceIJ((?:Li\d+E)+)E", symbol)
    if tile:
        sizes = re.findall(r"Li(\d+)E", tile.group(1))
        return f"{kernel} (tile {'x'.join(sizes)})"
    return kernel


def _drop_parameters(text: str) -> str:
    """``f<...>(int, float*)`` without its parameter list (the last balanced ``(...)``)."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return text[:i].rstrip() if i > 0 else text
    return text


def _split_template(text: str) -> tuple[str, list[str]]:
    """``a::b<x, c<y, z>>`` -> ("a::b", ["x", "c<y, z>"]); no template: (text, [])."""
    start = text.find("<")
    if start < 0 or not text.endswith(">"):
        return text.strip(), []
    args, depth, current = [], 0, ""
    for ch in text[start + 1:-1]:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        args.append(current.strip())
    return text[:start].strip(), args


def _short_arg(arg: str) -> str:
    for long, short in _SHORT_TYPES:
        arg = arg.replace(long, short)
    arg = re.sub(r"^\([\w:]+\)", "", arg)          # (vllm::Fp8KVCacheDataType)0 -> 0
    ident, inner = _split_template(arg)
    return ident.split("::")[-1] if inner else arg.split("::")[-1]


def family_table():
    """``FAMILIES`` as a pandas DataFrame (library, pattern, stage, checked on, source)."""
    import pandas as pd  # a dependency of the project, imported when a table is asked for

    rows = [{"library": f.library, "pattern": f.pattern, "stage": f.stage,
             "checked on": f.checked_on or "name only", "source": f.source} for f in FAMILIES]
    rows += [{"library": library, "pattern": f"op: {op}", "stage": "main", "checked on": checked or "name only",
              "source": source} for op, (library, source, checked) in OP_FAMILIES.items()]
    return pd.DataFrame(rows)


__all__ = ["FAMILIES", "OP_FAMILIES", "Family", "demangle", "demangle_many", "family_table", "kernel_family",
           "readable_name"]
