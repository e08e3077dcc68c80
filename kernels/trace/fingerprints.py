"""Kernel fingerprints: what a GPU kernel's name tells you before you look any further.

A trace's kernel names follow the conventions of the library that wrote them
(``ampere_bf16_s16816gemm_bf16_128x128_..._tn``: an Ampere tensor-core GEMM, 128x128 tiles;
``fmha_cutlassF_...``: PyTorch's memory-efficient attention). ``fingerprint(name)`` reads one
name into a ``Fingerprint``: the kind of work (a GEMM, fused attention, an elementwise
pass...), the library, whether it runs on tensor cores, its data type when the name says,
and one sentence for a reader. ``classify_many(names)`` does a whole trace into a table;
``kind_of``, ``is_gemm`` and ``mentions_op`` answer one question each.

The rules are heuristics over real names (the comments cite where each format was seen);
a name no rule knows comes back as kind "other", never as an error.
"""
from __future__ import annotations

import re
from dataclasses import KW_ONLY, asdict, dataclass
from typing import Callable, Iterable, Optional

from kernels.trace.families import FAMILIES, kernel_family

KINDS = ("gemm", "fused_attention", "elementwise", "reduction", "softmax", "copy", "memset",
         "other")


@dataclass(frozen=True)
class Fingerprint:
    name: str
    kind: str                       # one of KINDS
    family: Optional[str]           # "cublas", "cutlass", "flash", "cutlass_fmha", "cudnn", "triton",
    #                                 "aten", "cuda" (runtime copies), "nccl", "course" (this course's),
    #                                 "tensile", "miopen" (AMD's)
    _: KW_ONLY                      # the facts below are named where a fingerprint is written
    tensor_cores: Optional[bool]    # None: the name does not say
    dtype: Optional[str]            # "bf16", "fp16", "fp32", "tf32", ... or None
    note: str                       # one sentence for a reader


# --------------------------------------------------------------------------- dtypes

# Library names spell types compactly; the first match wins, so tf32 is found before
# the "f32" it contains, and bf16 before the "f16" inside it.
_NAME_DTYPES = (
    (r"tf32", "tf32"), (r"bf16|bfloat16", "bf16"), (r"e4m3|e5m2|fp8", "fp8"),
    (r"fp16|f16|half|(?<![a-z])h\d{3,5}gemm|hgemm", "fp16"), (r"sgemm|fp32|f32", "fp32"),
    (r"dgemm|fp64|f64|d884", "fp64"), (r"i8816|int8|(?<![a-z])s8|u8", "int8"),
)

# C++ template arguments of ATen kernels: the first scalar type named is the tensor's,
# (later ones are often the fp32 accumulator: cunn_SoftMaxForward<8, c10::BFloat16, float, ...>).
_CPP_DTYPES = {
    "c10::BFloat16": "bf16", "c10::Half": "fp16", "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8", "double": "fp64", "float": "fp32", "bool": "bool",
    "long": "int64", "signed char": "int8", "unsigned char": "uint8",
    "cutlass::bfloat16_t": "bf16", "cutlass::half_t": "fp16", "bfloat16_t": "bf16",
    "half_t": "fp16", "__nv_bfloat16": "bf16", "__half": "fp16",
}
_CPP_DTYPE_RE = re.compile(r"(?<![\w:])(" + "|".join(
    re.escape(k) for k in sorted(_CPP_DTYPES, key=len, reverse=True)) + r")(?![\w])")


def _dtype_in_token(name: str) -> Optional[str]:
    low = name.lower()
    for pattern, dtype in _NAME_DTYPES:
        if re.search(pattern, low):
            return dtype
    return None


# Value arguments printed with a cast, "(bool)0", "(int)128" (Nsight's style), are not types.
_CAST_RE = re.compile(r"(?<![\w])\((?:bool|int|long|unsigned int|unsigned long|char)\)(?=\w)")


def _dtype_in_template(name: str) -> Optional[str]:
    m = _CPP_DTYPE_RE.search(_CAST_RE.sub("", name))
    return _CPP_DTYPES[m.group(1)] if m else None


# --------------------------------------------------------------------------- the rules
# Each rule takes the name and returns a Fingerprint or None; the first that answers wins,
# so the specific rules (attention) come before the general ones (anything cutlass).

def _copy_engine(name: str) -> Optional[Fingerprint]:
    # The profiler's own labels for cudaMemcpy/cudaMemset activity: "Memcpy HtoD (Pageable
    # -> Device)", "Memcpy DtoD (Device -> Device)", "Memset (Device)".
    if name.startswith("Memcpy"):
        direction = name.split()[1] if len(name.split()) > 1 else ""
        notes = {
            "DtoD": "a device-to-device copy (in the article's naive attention, out-of-place "
                    "masked_fill cloning the scores before writing the mask)",
            "HtoD": "a host-to-device transfer over PCIe; 'Pageable' means the source was not "
                    "pinned, so the copy is staged and synchronous",
            "DtoH": "a device-to-host transfer: the CPU waits for it (.item(), .cpu(), printing)",
        }
        note = notes.get(direction, "a memory copy issued through the CUDA runtime")
        return Fingerprint(name, "copy", "cuda", tensor_cores=None, dtype=None, note=_sentence(note))
    if name.startswith("Memset"):
        return Fingerprint(name, "memset", "cuda", tensor_cores=None, dtype=None,
                           note="A cudaMemset: the runtime fills memory with a byte value "
                           "(torch.zeros can take this path).")
    return None


def _nccl(name: str) -> Optional[Fingerprint]:
    # e.g. "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t"
    if name.startswith(("ncclKernel", "ncclDevKernel")) or "nccl" in name[:12].lower():
        return Fingerprint(name, "other", "nccl", tensor_cores=False, dtype=_dtype_in_token(name),
                           note="Communication between GPUs (NCCL collective), not computation.")
    return None


def _cudnn_attention(name: str) -> Optional[Fingerprint]:
    # cuDNN's runtime-generated SDPA kernels, e.g. the article's
    # cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_kernel0_0
    # and ..._sm90_flash_fprop_wgmma_f16..., ..._sm80_flash_bprop_wmma_f16... seen in traces.
    if "cudnn" in name.lower() and "sdpa" in name.lower():
        step = "backward" if "bprop" in name else "forward"
        dtype = "bf16" if "bf16" in name else "fp16/bf16"
        return Fingerprint(name, "fused_attention", "cudnn", tensor_cores=True, dtype=dtype, note=(
            f"cuDNN's fused flash-style attention {step}, generated for this problem at run "
            "time; its name says f16 even in a bf16 run (the article's bf16 trace shows f16)."))
    return None


def _cutlass_fmha(name: str) -> Optional[Fingerprint]:
    # PyTorch's memory-efficient SDPA backend (derived from xFormers), e.g.
    # fmha_cutlassF_bf16_aligned_64x64_rf_sm80 (forward), fmha_cutlassB_f16_aligned_64x64_k64_sm80.
    m = re.search(r"fmha_cutlass([FB])_(\w+?)_(?:not)?aligned_(\d+x\d+).*?sm(\d+)", name)
    if not m:
        return None
    step = "forward" if m.group(1) == "F" else "backward"
    dtype = _dtype_in_token(m.group(2))
    sm = int(m.group(4))
    # xFormers' kernels use tensor-core MMA from sm_80 for every dtype (fp32 via TF32
    # emulation) and on sm_70/75 for 16-bit types; the sm_50 build is SIMT.
    tc = sm >= 80 or (sm >= 70 and dtype in ("fp16", "bf16"))
    return Fingerprint(name, "fused_attention", "cutlass_fmha", tensor_cores=tc, dtype=dtype, note=(
        f"PyTorch's memory-efficient attention {step} (CUTLASS, from xFormers), "
        f"{m.group(3)} tiles, built for sm_{sm}."))


def _course(name: str) -> Optional[Fingerprint]:
    # This course's own CUDA kernels (kernels/cuda/csrc/flash_v1.cu, flash_v2.cu), e.g.
    # "void (anonymous namespace)::flash_v2_kernel<__nv_bfloat16, 64, true>(flash::Problem)".
    m = re.search(r"\bflash_v(\d+)_kernel", name)
    if not m:
        return None
    if m.group(1) == "1":
        return Fingerprint(name, "fused_attention", "course", tensor_cores=False, dtype=_dtype_in_template(name), note=(
            "This course's first hand-written CUDA FlashAttention (kernels/cuda/csrc/flash_v1.cu): "
            "CUDA cores and fp32 math, written to be read."))
    return Fingerprint(name, "fused_attention", "course", tensor_cores=True, dtype=_dtype_in_template(name), note=(
        f"This course's hand-written CUDA FlashAttention, version {m.group(1)} "
        f"(kernels/cuda/csrc/flash_v{m.group(1)}.cu): tensor cores through mma.sync m16n8k16."))


def _flash(name: str) -> Optional[Fingerprint]:
    # FlashAttention: vendored in PyTorch ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<...>>",
    # flash_fwd_splitkv_kernel, flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel), the flash-attn
    # package ("flash::flash_fwd_kernel", "void flash_fwd_kernel<...>"), and FlashAttention-3
    # on Hopper ("cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>").
    if name.startswith("_") or not re.search(
            r"pytorch_flash::|\bflash::|flash_(fwd|bwd)|FlashAttn|FlashAttention", name):
        return None
    step = "backward" if re.search(r"bwd|Bwd|Backward", name) else "forward"
    # FlashAttention-2 names are snake_case (flash_fwd_kernel); FA3 (Hopper, CUTLASS 3)
    # writes FlashAttnFwdSm90, FA4 (Blackwell, CuTe DSL) FlashAttentionForwardSm100.
    if re.search(r"[Ss]m1\d\d", name):
        version = "FlashAttention-4 (Blackwell)"
    elif re.search(r"FlashAttn|[Ss]m90", name):
        version = "FlashAttention-3 (Hopper wgmma)"
    else:
        version = "FlashAttention-2"
    where = "vendored in PyTorch (SDPA's flash backend)" if "pytorch_flash" in name else "flash-attn"
    if re.search(r"[Cc]ombine", name):
        return Fingerprint(name, "fused_attention", "flash", tensor_cores=False, dtype=_dtype_in_template(name), note=(
            f"{version}, second step of split-KV: merges the partial outputs of the key "
            "blocks by their log-sum-exp (no matmul)."))
    extra = ", splitting the keys across blocks (split-KV) for long keys and few queries" \
        if "splitkv" in name else ""
    return Fingerprint(name, "fused_attention", "flash", tensor_cores=True, dtype=_dtype_in_template(name), note=(
        f"{version} {step}, {where}{extra}: the whole attention in one kernel, tiles kept "
        "on-chip."))


def _triton_attention(name: str) -> Optional[Fingerprint]:
    # Triton's fused-attention tutorial (06-fused-attention.py) names its kernels attn_fwd,
    # attn_bwd_preprocess, _attn_bwd (older versions _fwd_kernel, _bwd_kernel); a Triton
    # kernel appears in a trace under its Python function name, often a private one.
    if re.fullmatch(r"_?attn_(fwd|bwd)\w*|_(fwd|bwd)_kernel\w*|_\w*(attn|attention|flash|fmha)\w*",
                    name):
        step = "backward" if re.search(r"bwd|backward", name) else "forward"
        return Fingerprint(name, "fused_attention", "triton", tensor_cores=None, dtype=None, note=(
            f"A Triton fused-attention {step} (the tutorial's naming); tl.dot uses tensor "
            "cores for 16-bit inputs, but the name alone does not say the dtype."))
    return None


def _cpp_inductor(name: str) -> Optional[Fingerprint]:
    # On a CPU, torch.compile (Inductor) writes C++ instead: cpp_fused_<ops>_<n>, sometimes with
    # a graph_<n>_ prefix when several graphs are compiled together (graph_0_cpp_fused_mul_0).
    m = re.match(r"(graph_\d+_)?cpp_fused_", name)
    if not m:
        return None
    ops = name[m.end():]
    kind = "softmax" if "softmax" in ops else "elementwise"
    return Fingerprint(name, kind, "inductor_cpp", tensor_cores=False, dtype=None,
                       note="A C++ loop generated by torch.compile (Inductor) on the CPU, fused from "
                       "several ops into one pass; " + _ops_words(ops) + ".")


def _triton_inductor(name: str) -> Optional[Fingerprint]:
    # torch.compile (Inductor) names its generated kernels triton_{poi,red,per,tem}_fused_<ops>_<n>,
    # e.g. triton_poi_fused_add_mul_0, triton_red_fused__softmax_1, triton_per_fused_native_layer_norm_0.
    m = re.match(r"triton_(poi|red|per|tem|for)_", name)
    if not m:
        return None
    ops = name[m.end():]
    if "softmax" in ops:
        return Fingerprint(name, "softmax", "triton", tensor_cores=False, dtype=None,
                           note="A softmax generated by torch.compile (Inductor), fused with what "
                           "surrounds it; " + _ops_words(ops) + ".")
    style = m.group(1)
    if style == "poi":
        return Fingerprint(name, "elementwise", "triton", tensor_cores=False, dtype=None,
                           note="A pointwise kernel generated by torch.compile (Inductor): one pass "
                           "over memory for several ops; " + _ops_words(ops) + ".")
    if style in ("red", "per"):
        how = "one row per block, held on-chip" if style == "per" else "looping over the row"
        return Fingerprint(name, "reduction", "triton", tensor_cores=False, dtype=None,
                           note=f"A reduction generated by torch.compile (Inductor), {how}; "
                           + _ops_words(ops) + ".")
    if style == "tem" and re.search(r"(^|_)(add|b)?mm(_|$)", ops):
        return Fingerprint(name, "gemm", "triton", tensor_cores=True, dtype=None,
                           note="A matmul from an Inductor Triton template (max-autotune), with "
                           "its epilogue fused.")
    return Fingerprint(name, "other", "triton", tensor_cores=None, dtype=None,
                       note="A Triton kernel from an Inductor template (a matmul, or FlexAttention); "
                       "the name alone does not say which.")


def _ops_words(ops: str) -> str:
    ops = re.sub(r"_\d+$", "", ops).replace("fused_", "", 1).strip("_")
    return f"the ops in its name are {ops}" if ops else "its name lists no ops"


# cuBLAS kernel names: <arch>_<in dtype>_<mma><gemm>_<out dtype>_<tile>..._<layouts>, e.g.
# ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn, ampere_sgemm_128x64_tn,
# volta_sgemm_128x64_nn, turing_fp16_s1688gemm_fp16_..., volta_fp16_s884gemm_fp16_...,
# ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn (seen in profiler traces).
_CUBLAS_ARCH = r"(maxwell|pascal|volta|turing|ampere|ada|hopper|sm\d{2,3})"
_MMA_SHAPES = {"16816": "m16n8k16", "1688": "m16n8k8", "884": "m8n8k4", "8816": "m8n8k16",
               "161616": "m16n16k16 (WMMA)"}
_ACCUMULATE = {"s": "fp32", "h": "fp16", "i": "int32", "d": "fp64"}


def _cublas(name: str) -> Optional[Fingerprint]:
    bare = _bare(name)
    if bare.startswith("nvjet"):
        # cuBLAS 12.8+ on Hopper/Blackwell: nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT,
        # nvjet_sm100_tst_..., nvjet_sm90_... (seen in H100/B200 traces).
        return Fingerprint(name, "gemm", "cublas", tensor_cores=True, dtype=None,
                           note="A cuBLAS GEMM from its newer generated 'nvjet' family (Hopper and "
                           "later): tensor cores; the name gives the tile, not the dtype.")
    m = re.match(r"sm(\d{2,3})_xmma_gemm_(\w+?)_(tn|nt|nn|tt)_", bare)
    if m:
        # sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_..._cublas
        hopper = "warpgroup" in bare
        how = "Hopper wgmma (warpgroup MMA)" if hopper else f"tensor-core MMA on sm_{m.group(1)}"
        dtype = _dtype_in_token(m.group(2))
        return Fingerprint(name, "gemm", "cublas", tensor_cores=True, dtype=dtype,
                           note=f"A cuBLAS {dtype or ''} GEMM on tensor cores via {how}; the second "
                           "type group is accumulator and output.".replace("  ", " "))
    # "gc"/"c"/"z" before gemm: complex GEMMs (ampere_gcgemm_64x64_nt, cuDNN's FFT convolutions run it).
    m = re.match(_CUBLAS_ARCH + r"_(?:(\w+?)_)?([shdi])?(\d{3,6})?(?:g?[cz])?(gemm|gemv)", bare)
    if not m or "cutlass" in bare:
        return _cublas_helpers(name, bare)
    arch, acc, shape, what = m.group(1), m.group(3), m.group(4), m.group(5)
    dtype = _dtype_in_token(bare)
    if shape:
        mma = _MMA_SHAPES.get(shape, "m" + shape)
        return Fingerprint(name, "gemm", "cublas", tensor_cores=True, dtype=dtype, note=(
            f"A cuBLAS {dtype} {what.upper()} on tensor cores ({arch} kernel; {acc}{shape} = "
            f"{_ACCUMULATE.get(acc, acc)} accumulate, mma {mma})."))
    return Fingerprint(name, "gemm", "cublas", tensor_cores=False, dtype=dtype, note=(
        f"A cuBLAS {dtype + ' ' if dtype else ''}GEMM on the CUDA cores, not tensor cores ({arch} kernel; "
        f"{_plain_gemm_words(bare)})."))


def _plain_gemm_words(bare: str) -> str:
    if "sgemm" in bare:
        return "sgemm = single-precision fp32 multiply-adds"
    if "hgemm" in bare:
        return "hgemm = fp16 without tensor-core MMA"
    if re.search(r"g?cgemm|zgemm", bare):
        return "cgemm/zgemm = complex numbers"
    if "dgemm" in bare:
        return "dgemm = fp64"
    return "no MMA shape in the name"


def _cublas_helpers(name: str, bare: str) -> Optional[Fingerprint]:
    # Smaller cuBLAS/cuBLASLt kernels: "void gemv2T_kernel_val<...>", "gemvx", "gemmSN_TN_kernel",
    # "gemmk1_kernel", "void cublasLt::splitKreduce_kernel<...>", "magma_sgemmEx_kernel".
    if "splitKreduce" in name:
        return Fingerprint(name, "reduction", "cublas", tensor_cores=False, dtype=_dtype_in_template(name),
                           note="cuBLASLt's split-K reduction: the second half of a GEMM that split "
                           "its K dimension across blocks and now sums the partial results.")
    # ... and "internal::gemvx::kernel<...>" inside a std::enable_if<...>::type return type.
    if re.match(r"(gemv|gemvx|gemv2[NT])", bare) or re.search(r"\bgemv\w*(_kernel|::kernel)", name):
        return Fingerprint(name, "gemm", "cublas", tensor_cores=False, dtype=_dtype_in_template(name),
                           note="A cuBLAS matrix-vector product (GEMV): one operand is a vector, so "
                           "it is memory-bound and runs on CUDA cores.")
    if re.match(r"[sdhcz]gemm_\w+", bare):  # cuBLAS's hand-written SIMT kernels: "void sgemm_largek_lds64<...>"
        return Fingerprint(name, "gemm", "cublas", tensor_cores=False, dtype=_dtype_in_token(bare),
                           note="A cuBLAS GEMM kernel of the older hand-written kind, on CUDA cores; the "
                           "letter before gemm is the type (s fp32, d fp64, h fp16, c and z complex).")
    if re.match(r"(gemmSN|gemmk1|gemm_kernel|magma_\w*gemm)", bare):
        return Fingerprint(name, "gemm", "cublas", tensor_cores=False, dtype=_dtype_in_template(name) or
                           _dtype_in_token(bare),
                           note="A small-shape cuBLAS GEMM kernel on CUDA cores (used for skinny or "
                           "tiny matrices).")
    return None


def _cutlass(name: str) -> Optional[Fingerprint]:
    # CUTLASS kernels as cuBLAS/ATen instantiate them, e.g.
    # cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>,
    # cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>,
    # cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8 (seen in traces).
    m = re.search(r"cutlass_(\d+)?_?(tensorop|simt|wmma_tensorop|wmma)_(\w+)", name)
    if m and re.search(r"gemm|conv|fprop|dgrad|wgrad", m.group(3)):
        tc = "tensorop" in m.group(2) or "wmma" in m.group(2)
        dtype = _dtype_in_token(m.group(3))
        epilogue = " with a fused ReLU epilogue" if "relu" in m.group(3) else ""
        arch = f" for sm_{m.group(1)}" if m.group(1) else ""
        where = "on tensor cores" if tc else "on CUDA cores (SIMT)"
        return Fingerprint(name, "gemm", "cutlass", tensor_cores=tc, dtype=dtype, note=(
            f"A CUTLASS {dtype or ''} GEMM{arch} {where}{epilogue}, launched by cuBLAS or "
            "ATen.").replace("  ", " "))
    if "cutlass" in name and re.search(r"[Gg]emm", name):
        return Fingerprint(name, "gemm", "cutlass", tensor_cores=None, dtype=_dtype_in_template(name),
                           note="A CUTLASS GEMM (template instantiation; the name hides the details).")
    return None


def _rocm_and_layout(name: str) -> Optional[Fingerprint]:
    # Names seen in the borrowed MI300X and H100 traces (book/data/borrowed): Tensile/hipBLASLt
    # GEMMs (rocBLAS's naming, Cijk_Alik_Bljk_B_BS_BH_..._MT128x144x64_MI16x16x1_...), MIOpen's
    # implicit-GEMM convolutions (igemm_fwd_gtcx3_nhwc_bf16_...) and layout transposes
    # (batched_transpose_128x4_half), cuDNN's layout transforms (cudnn::...::nchwToNhwcKernel<...>).
    if name.startswith("Cijk_"):
        return Fingerprint(name, "gemm", "tensile", tensor_cores=None, dtype=None,
                           note="An AMD GEMM generated by Tensile (rocBLAS, hipBLASLt); MT gives the "
                           "macro tile, MI the matrix-core instruction.")
    if re.match(r"igemm_(fwd|bwd|wrw)_", name):
        return Fingerprint(name, "gemm", "miopen", tensor_cores=None, dtype=_dtype_in_token(name),
                           note="MIOpen's convolution computed as an implicit GEMM (AMD).")
    layout = "A layout transform around a convolution (NCHW and NHWC): memory traffic, no arithmetic."
    if name.startswith("batched_transpose_"):
        return Fingerprint(name, "copy", "miopen", tensor_cores=False, dtype=_dtype_in_token(name), note=layout)
    if re.search(r"nchwToNhwcKernel|nhwcToNchwKernel", name):
        return Fingerprint(name, "copy", "cudnn", tensor_cores=False, dtype=_dtype_in_template(name), note=layout)
    return None


# ATen's hand-written kernels ("void at::native::..."): the kernel template says how the
# work is shaped, a functor or lambda inside it says what the work is.

def _aten_softmax(name: str) -> Optional[Fingerprint]:
    # void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, ...>,
    # void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>,
    # cunn_SoftMaxBackward, softmax_warp_backward, cunn_SpatialSoftMaxForward.
    step = "backward" if re.search(r"Backward|backward|bwd", name) else "forward"
    if re.search(r"cunn_\w*SoftMax|softmax_warp", name):
        how = ("one warp per row (short rows)" if "warp" in name
               else "one block per row: max, sum of exponentials, divide")
        return Fingerprint(name, "softmax", "aten", tensor_cores=False, dtype=_dtype_in_template(name),
                           note=f"ATen's softmax {step}, {how}; the scores are read and written "
                           "again in full.")
    if re.search(r"softmax", name, flags=re.IGNORECASE):
        return Fingerprint(name, "softmax", "aten" if _is_aten(name) else None, tensor_cores=False,
                           dtype=_dtype_in_template(name),
                           note=f"A softmax {step}, by its name (library not recognised).")
    return None


_ATEN_COPY = re.compile(r"CatArrayBatchedCopy|direct_copy_kernel|copy_kernel|"
                        r"transpose|_to_copy|copy_device_to_device")
_ATEN_REDUCTION = re.compile(r"reduce_kernel|ReduceOp|layer_norm|LayerNorm|RowwiseMoments|"
                             r"rms_norm|RMSNorm|batch_norm|BatchNorm|\bnorm_kernel|cumsum|"
                             r"tensor_kernel_scan|argmax|argmin|topk|sort")
_ATEN_ELEMENTWISE = re.compile(r"elementwise_kernel|triu_tril_kernel|multi_tensor_apply|"
                               r"index_elementwise|fill_kernel|FillFunctor|where_kernel|"
                               r"masked_fill|distribution_elementwise|dropout")


def _aten_copy(name: str) -> Optional[Fingerprint]:
    if _ATEN_COPY.search(name) and ("at::native" in name or "at::" in name
                                    or name.startswith(("CatArray", "void CatArray"))):
        what = ("a torch.cat gathering its inputs into one tensor" if "CatArray" in name else
                "a copy (.contiguous(), .to(), a transpose made real) done by an ATen kernel")
        return Fingerprint(name, "copy", "aten", tensor_cores=False, dtype=_dtype_in_template(name),
                           note=_sentence(what + ": memory traffic, no arithmetic"))
    return None


def _aten_reduction(name: str) -> Optional[Fingerprint]:
    if not (_ATEN_REDUCTION.search(name) and _is_aten(name)):
        return None
    if re.search(r"layer_norm|LayerNorm|RowwiseMoments|rms_norm|RMSNorm", name):
        what = "normalization: per-row mean and variance (a reduction), then a scale"
    else:
        op = re.search(r"(Sum|Mean|Max|Min|ArgMax|ArgMin|Norm|sum|mean|max|min|norm)\w*?(Ops|_functor)",
                       name)
        what = f"reduction ({op.group(1).lower()})" if op else "reduction"
    return Fingerprint(name, "reduction", "aten", tensor_cores=False, dtype=_dtype_in_template(name),
                       note=f"An ATen {what}: memory-bound, one read of the input.")


_ELEMENTWISE_WHAT = (
    (r"masked_fill", "the mask step, masked_fill writing -inf where the mask is set"),
    (r"triu_tril", "builds a triangular (causal) mask with torch.tril/triu on the GPU"),
    (r"MulFunctor|mul_kernel", "an elementwise multiply (in attention, often the 1/sqrt(d) scale)"),
    (r"AddFunctor|add_kernel|CUDAFunctor_add", "an elementwise add"),
    (r"DivFunctor|div_", "an elementwise divide"),
    (r"FillFunctor|fill_kernel", "fills a tensor with a constant (torch.ones, zeros, full)"),
    (r"where_kernel", "torch.where: picks from two tensors by a condition"),
    (r"multi_tensor_apply", "the optimizer updating many tensors in one launch (foreach)"),
    (r"dropout|distribution", "random numbers for dropout or sampling"),
    (r"index_elementwise|gather|scatter|index_put", "indexing: gather or scatter by index"),
    (r"exp_kernel|ExpFunctor", "an elementwise exp"),
    (r"gelu|Gelu|silu|Silu|relu|sigmoid", "an activation function"),
)


def _aten_elementwise(name: str) -> Optional[Fingerprint]:
    if not (_ATEN_ELEMENTWISE.search(name) and _is_aten(name)):
        return None
    what = next((words for pattern, words in _ELEMENTWISE_WHAT if re.search(pattern, name)),
                "an elementwise operation")
    shape = " (vectorized loads)" if "vectorized" in name else ""
    return Fingerprint(name, "elementwise", "aten", tensor_cores=False, dtype=_dtype_in_template(name),
                       note=f"An ATen elementwise kernel{shape}: {what}; one read and one write "
                       "per element, memory-bound.")


def _is_aten(name: str) -> bool:
    return bool(re.search(r"at::native|at::cuda|at_cuda_detail|c10::|CatArray|"
                          r"multi_tensor_apply|\(anonymous namespace\)|<unnamed>", name))


def _aten_other(name: str) -> Optional[Fingerprint]:
    if "at::native" in name:
        return Fingerprint(name, "other", "aten", tensor_cores=False, dtype=_dtype_in_template(name),
                           note="An ATen (PyTorch's own) CUDA kernel no rule here describes.")
    return None


def _python_named(name: str) -> Optional[Fingerprint]:
    # C++ kernels reach a trace demangled ("void ns::kernel<...>(args)"); Triton kernels
    # appear under their Python function name, often private (a leading underscore).
    if re.fullmatch(r"_[a-z][a-z0-9_]*", name):
        return Fingerprint(name, "other", "triton", tensor_cores=None, dtype=None,
                           note="Probably a Triton kernel (a bare Python-style function name); "
                           "read its source to know what it does.")
    return None


def _named_attention(name: str) -> Optional[Fingerprint]:
    # Last resort for attention kernels of other libraries (vLLM's paged_attention_v2_kernel,
    # FlashInfer's BatchPrefillWithPagedKVCacheKernel...): trust the name, say so.
    if re.search(r"attention|attn|fmha|mha_fwd|mha_bwd|PrefillWith|DecodeWith", name,
                 flags=re.IGNORECASE):
        return Fingerprint(name, "fused_attention", None, tensor_cores=None, dtype=_dtype_in_template(name),
                           note="By its name an attention kernel, from a library no rule here knows.")
    return None


RULES: tuple[Callable[[str], Optional[Fingerprint]], ...] = (
    _copy_engine, _nccl, _cudnn_attention, _cutlass_fmha, _course, _flash, _triton_attention,
    _triton_inductor, _cpp_inductor, _cublas, _cutlass, _rocm_and_layout, _aten_softmax, _aten_copy, _aten_reduction,
    _aten_elementwise, _aten_other, _named_attention, _python_named,
)


# --------------------------------------------------------------------------- the API

def fingerprint(name: str) -> Fingerprint:
    """Read a kernel name from a trace into what it tells a reader (never raises on a name)."""
    if not isinstance(name, str):
        raise TypeError(f"a kernel name is a str, got {type(name).__name__}")
    clean = name.strip()
    for rule in RULES:
        found = rule(clean)
        if found is not None:
            return found
    return Fingerprint(clean, "other", None, tensor_cores=None, dtype=_dtype_in_template(clean), note=(
        "A kernel no rule here recognises; its library's naming convention would tell more."))


def classify_many(names: Iterable[str]):
    """A pandas DataFrame, one row per name: name, kind, family, tensor_cores, dtype, note."""
    import pandas as pd  # a dependency of the project, imported when tables are asked for

    rows = [asdict(fingerprint(n)) for n in names]
    columns = ["name", "kind", "family", "tensor_cores", "dtype", "note"]
    # object columns keep None as None ("the name does not say"), not NaN
    return pd.DataFrame(rows, columns=columns, dtype=object)


# The PyTorch ops that are matrix multiplies, as a trace's CPU tracks name them: where a chapter
# reads CPU ops (no GPU track), these are its matmuls.
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                        "aten::linear", "aten::_scaled_mm"})
_INDUCTOR_STYLE = re.compile(r"triton_(poi|red|per|tem|for)_")


def kind_of(name: str) -> str:
    """The kind of work one trace row does (one of KINDS): a GPU kernel's by its name
    (``fingerprint``), a PyTorch op's by the op (``MATMUL_OPS`` are "gemm")."""
    return "gemm" if name in MATMUL_OPS else fingerprint(name).kind


def is_gemm(name: str) -> bool:
    """Whether a kernel (cuBLAS's nvjet_*/sm90_xmma_*/ampere_*, CUTLASS, an Inductor mm
    template...) or a PyTorch op (aten::addmm...) is a matrix multiply."""
    return kind_of(name) == "gemm"


def inductor_style(name: str) -> Optional[str]:
    """Which kind of Inductor Triton kernel a name is: "poi" (pointwise), "red" (reduction,
    looping), "per" (persistent reduction), "tem" (a template: FlexAttention, or a matmul with
    max-autotune), "for" (foreach); None for anything Inductor did not generate."""
    m = _INDUCTOR_STYLE.match(name)
    return m.group(1) if m else None


def mentions_op(name: str, op: str) -> bool:
    """Whether a row's name says it runs ``op`` ("gelu"): an ATen op (aten::gelu), an ATen
    kernel's functor (GeluCUDAKernelImpl) or the op list of an Inductor kernel
    (triton_poi_fused_gelu_view_1) all spell it, in some case."""
    return op.lower() in name.lower()


def _bare(name: str) -> str:
    """The kernel's identifier: without "void ", namespaces, template arguments, parameters."""
    text = re.sub(r"^void\s+", "", name)
    text = re.split(r"[<(]", text, maxsplit=1)[0]
    return text.split("::")[-1].strip()


def _sentence(text: str) -> str:
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


# --------------------------------------------------------------------------- attention, by name
# What ``kernels.trace.attention`` recognises as one attention call. Tables, not code: a library
# that is missing gets a row here.

@dataclass(frozen=True)
class AttentionOp:
    """A PyTorch op that is a whole attention forward, and how to read its recorded inputs."""

    library: str
    layout: Optional[str]        # "BHSD" or "BSHD": how q, k, v (inputs 0, 1, 2) are laid out; None: unknown
    causal_arg: Optional[int]    # the input that holds is_causal (in "Concrete Inputs"), None: not recorded
    mask_arg: Optional[int] = None   # an attn_mask/bias input: a recorded tensor there means masked


# Forward ops only (signatures from ATen's native_functions.yaml and the libraries' op schemas).
ATTENTION_OPS: dict[str, AttentionOp] = {
    "aten::scaled_dot_product_attention": AttentionOp("PyTorch SDPA", "BHSD", 5, 3),
    "aten::_scaled_dot_product_flash_attention": AttentionOp("SDPA flash backend", "BHSD", 4),
    "aten::_scaled_dot_product_efficient_attention": AttentionOp("SDPA memory-efficient backend", "BHSD", 6, 3),
    "aten::_scaled_dot_product_cudnn_attention": AttentionOp("SDPA cuDNN backend", "BHSD", 6, 3),
    "aten::_scaled_dot_product_flash_attention_for_cpu": AttentionOp("SDPA flash backend (CPU)", "BHSD", 4, 5),
    "aten::_scaled_dot_product_fused_attention_overrideable": AttentionOp("SDPA fused backend", "BHSD", 6, 3),
    "aten::_flash_attention_forward": AttentionOp("FlashAttention-2 (PyTorch)", "BSHD", 8),
    "aten::_efficient_attention_forward": AttentionOp("memory-efficient attention (PyTorch)", "BSHD", None, 3),
    "flash_attn::_flash_attn_forward": AttentionOp("flash-attn", "BSHD", 5),
    "flash_attn_3::fwd": AttentionOp("FlashAttention-3", "BSHD", None),
    "vllm::unified_attention": AttentionOp("vLLM", None, None),
    "vllm::unified_attention_with_output": AttentionOp("vLLM", None, None),
    "sglang::unified_attention_with_output": AttentionOp("SGLang", None, None),
    # FlexAttention's autograd function, recorded with q, k, v [B, H, S, D]; its mask is a block mask
    # the trace does not record (torch/_higher_order_ops/flex_attention.py).
    "FlexAttentionAutogradOp": AttentionOp("FlexAttention", "BHSD", None),
}

# (kernel-name pattern, library, stage), from the one table of attention-kernel families
# (``kernels.trace.families.FAMILIES``: where each name is published, which real trace checked it).
# "main" kernels compute attention; "combine" kernels merge the partial results of a split over the
# keys (split-KV, paged decode) and belong to the main kernel before them; "prologue" kernels
# prepare its inputs (SageAttention's quantisation) and belong to the main kernel after them.
ATTENTION_KERNELS: tuple[tuple[str, str, str], ...] = tuple((f.pattern, f.library, f.stage) for f in FAMILIES)


def attention_kernel(name: str) -> Optional[tuple[str, str]]:
    """(library, stage) of an attention forward kernel by its name, None for any other kernel."""
    found = kernel_family(name)
    return (found.library, found.stage) if found else None


__all__ = ["ATTENTION_KERNELS", "ATTENTION_OPS", "KINDS", "MATMUL_OPS", "AttentionOp", "Fingerprint",
           "attention_kernel", "classify_many", "fingerprint", "inductor_style", "is_gemm", "kind_of",
           "mentions_op"]
