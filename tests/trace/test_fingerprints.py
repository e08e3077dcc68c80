"""Kernel fingerprints on real kernel names.

Each name below was seen in a PyTorch profiler trace, an Nsight Systems summary or a
profiler table in public repositories (long C++ names are sometimes cut where the tool
cut them, with "..."), or in the source article's traces (Hugging Face blog, "Profiling in PyTorch (Part 3)"); the course's own
kernels are named as their sources in kernels/ will make them appear. Every rule in
kernels/trace/fingerprints.py answers at least one of them.
"""
from __future__ import annotations

import pytest

from kernels.trace import fingerprints
from kernels.trace.fingerprints import KINDS, Fingerprint, classify_many, fingerprint

# (name, kind, family, tensor_cores, dtype)
REAL_NAMES = [
    # --- the article's A100 traces
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "fused_attention", "cutlass_fmha", True, "bf16"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
     "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
     "fused_attention", "flash", True, "bf16"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64_4x1x1_kernel0_0",
     "fused_attention", "cudnn", True, "fp16/bf16"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm", "cublas", True, "bf16"),
    ("ampere_sgemm_128x64_tn", "gemm", "cublas", False, "fp32"),
    ("void at::native::triu_tril_kernel<bool, int, false, 4, true>(at::cuda::detail::TensorInfo<bool, "
     "int>, at::cuda::detail::TensorInfo<bool const, int>, long, long, long, int)",
     "elementwise", "aten", False, "bool"),
    ("Memcpy DtoD (Device -> Device)", "copy", "cuda", None, None),
    ("Memset (Device)", "memset", "cuda", None, None),
    # --- attention kernels elsewhere
    ("fmha_cutlassB_f16_aligned_64x64_k64_dropout_sm80", "fused_attention", "cutlass_fmha", True, "fp16"),
    ("fmha_cutlassB_f16_aligned_64x64_k32_sm50", "fused_attention", "cutlass_fmha", False, "fp16"),
    ("void pytorch_flash::flash_fwd_kernel<...cutlass::half_t...>", "fused_attention", "flash", True, "fp16"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<traits>(params)", "fused_attention", "flash", True, None),
    ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<...>>(...)", "fused_attention", "flash",
     False, None),
    ("flash::FlashAttentionForwardSm100", "fused_attention", "flash", True, None),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_bprop_wmma_f16_knob_2_64x128x64_1x4x1_cga1x1x1_kernel0_0",
     "fused_attention", "cudnn", True, "fp16/bf16"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "fused_attention", "cudnn", True,
     "fp16/bf16"),
    ("attn_fwd", "fused_attention", "triton", None, None),
    ("attn_bwd_preprocess", "fused_attention", "triton", None, None),
    ("void vllm::merge_attn_states_kernel<c10::BFloat16, 128>(...)", "fused_attention", None, None, "bf16"),
    ("BatchPrefillWithRaggedKVCacheKernel", "fused_attention", None, None, None),
    # --- this course's own kernels, as their templates in kernels/cuda/csrc will be named
    ("void (anonymous namespace)::flash_v1_kernel<float, 64>(flash::Problem)", "fused_attention",
     "course", False, "fp32"),
    ("void (anonymous namespace)::flash_v2_kernel<__nv_bfloat16, 64, true>(flash::Problem)",
     "fused_attention", "course", True, "bf16"),
    ("attn_bwd_dkdv", "fused_attention", "triton", None, None),
    # --- GEMMs
    ("volta_sgemm_128x64_nn", "gemm", "cublas", False, "fp32"),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", "gemm", "cublas", True, "fp16"),
    ("ampere_fp16_s1688gemm_fp16_256x64_ldg8_f2f_nt", "gemm", "cublas", True, "fp16"),
    ("ampere_s16816gemm_fp16_64x64_sliced1x2_ldg8_stages_6...", "gemm", "cublas", True, "fp16"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "gemm", "cublas", True, "fp16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
     "off_kernel__5x_cublas", "gemm", "cublas", True, "bf16"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_"
     "off_kernel__5x_cublas", "gemm", "cublas", True, "tf32"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm", "cublas", True, None),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
     "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
     "gemm", "cutlass", True, "bf16"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
     "gemm", "cutlass", False, "fp32"),
    ("cutlass_tensorop_s16816gemm_f16_256x128_32x3_nn_align8", "gemm", "cutlass", True, "fp16"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<"
     "float const>, cublasGemvTensorStridedBatched<float>, float> >(...)", "gemm", "cublas", False, "fp32"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, false, false>(...)",
     "reduction", "cublas", False, "fp32"),
    ("triton_tem_fused_mm_0", "gemm", "triton", True, None),
    # --- AMD's, and cuDNN's layout transforms (the borrowed MI300X and H100 traces)
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_...",
     "gemm", "tensile", None, None),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt256x64x8_wt64x16x4_ws1x1_wr2x2_ta1x1x8x1_1x8x1x32_tb1x1x2x1_1x8x1x32_me",
     "gemm", "miopen", None, "bf16"),
    ("batched_transpose_256x4_half", "copy", "miopen", False, "fp16"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, "
     "(cudnnKernelDataType_t)0>(...)", "copy", "cudnn", False, "bf16"),
    # --- softmax
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)",
     "softmax", "aten", False, "fp16"),
    ("void at::native::<unnamed>::cunn_SoftMaxForward<(int)8, c10::BFloat16, float,...",
     "softmax", "aten", False, "bf16"),
    ("void <unnamed>::softmax_warp_forward<float, float, float, (int)8, (bool)0, (bool)0>(T2 *",
     "softmax", "aten", False, "fp32"),
    ("triton_red_fused__softmax_1", "softmax", "triton", False, None),
    ("softmax_kernel_inner", "softmax", None, False, None),
    # --- elementwise
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, "
     "float, at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>"
     "(int, T2, T3)", "elementwise", "aten", False, "fp32"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}"
     "::operator()() const::{lambda()#7}::operator()() const::{lambda(float, bool)#1}>(at::"
     "TensorIteratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, "
     "c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() c",
     "elementwise", "aten", False, "fp32"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}"
     "::operator()() const::{lambda()#11}::operator()() const::{lambda(c10::Half, bool)#1}>(at::"
     "TensorIteratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, "
     "c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#11}::operator",
     "elementwise", "aten", False, "fp16"),
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, std::array<c",
     "elementwise", "aten", False, "fp32"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native:",
     "elementwise", "aten", False, None),
    ("multi_tensor_apply_kernel", "elementwise", "aten", False, None),
    ("triton_poi_fused_0", "elementwise", "triton", False, None),
    ("triton_poi_fused_add_mul_0", "elementwise", "triton", False, None),
    # chapter 7's compiled naive attention on this course's CPU (torch 2.13 Inductor, C++ backend)
    ("cpp_fused__softmax_masked_fill_mul_view_0", "softmax", "inductor_cpp", False, None),
    # --- copies
    ("Memcpy HtoD (Pageable -> Device)", "copy", "cuda", None, None),
    ("void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::"
     "native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() "
     "const::[lambda() (instance 7)]::operator ()() const::[lambda(float) (instance 1)]>(at::"
     "TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T", "copy", "aten", False, "fp32"),
    ("CatArrayBatchedCopy", "copy", "aten", False, None),
    # --- reductions
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::"
     "MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)", "reduction", "aten", False, "fp32"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::"
     "func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::"
     "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 8> >"
     "(at::n", "reduction", "aten", False, "bf16"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, "
     "float const*, float const*, float const*, float*, float*, float*)", "reduction", "aten", False, "fp32"),
    ("triton_per_fused_add_embedding_mean_mul_pow_rsqrt_6", "reduction", "triton", False, None),
    ("triton_red_fused_native_layer_norm_0", "reduction", "triton", False, None),
    # --- the rest
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "other", "nccl", False, "bf16"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>"
     "(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)",
     "other", "aten", False, "fp32"),
    ("_rmsnorm_kernel", "other", "triton", None, None),
    ("_gumbel_sample_kernel", "other", "triton", None, None),
    ("softdtw_naive_kernel_multi", "other", None, None, None),
    ("mhc_pre_big_fuse_with_norm_tilelang_kernel", "other", None, None, None),
]


def _real(part: str) -> str:
    return next(name for name, *_ in REAL_NAMES if part in name)


@pytest.mark.parametrize("name, kind, family, tensor_cores, dtype", REAL_NAMES,
                         ids=[n[:50] for n, *_ in REAL_NAMES])
def test_real_names(name, kind, family, tensor_cores, dtype):
    fp = fingerprint(name)
    assert (fp.kind, fp.family, fp.tensor_cores, fp.dtype) == (kind, family, tensor_cores, dtype)
    assert fp.name == name.strip()
    assert fp.kind in KINDS
    assert len(fp.note) > 20 and fp.note.endswith("."), fp.note


def test_every_rule_answers_at_least_one_real_name():
    names = [n for n, *_ in REAL_NAMES]
    for rule in fingerprints.RULES:
        assert any(rule(n) is not None for n in names), rule.__name__


def test_the_notes_that_teach():
    # sgemm is fp32 on CUDA cores; s16816 is the m16n8k16 tensor-core MMA.
    assert "not tensor cores" in fingerprint("ampere_sgemm_128x64_tn").note
    assert "m16n8k16" in fingerprint("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn").note
    assert "wgmma" in fingerprint(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cublas").note
    # cuDNN says f16 in a bf16 run; the note warns, and a name that says bf16 is believed.
    assert "bf16" in fingerprint("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_"
                                 "128x64x64_4x1x1_kernel0_0").note
    assert fingerprint("cudnn_generated_fort_native_sdpa_sm100_flash_fprop_bf16_x").dtype == "bf16"
    assert "masked_fill" in fingerprint(_real("masked_fill_kernel")).note
    assert "causal" in fingerprint(_real("triu_tril_kernel")).note
    assert "1/sqrt(d)" in fingerprint(_real("MulFunctor")).note
    assert "backward" in fingerprint("fmha_cutlassB_f16_aligned_64x64_k64_dropout_sm80").note


@pytest.mark.parametrize("name", ["", "   ", "void", "???", "x" * 10_000, "kernel<<<", "ünïcode_kernel",
                                  "void foo<(bool)1>(int)", "Memcpy", "triton_", "sm90_xmma_gemm_"])
def test_unknown_or_odd_names_never_raise(name):
    fp = fingerprint(name)
    assert isinstance(fp, Fingerprint) and fp.kind in KINDS


def test_non_strings_are_a_type_error():
    with pytest.raises(TypeError):
        fingerprint(None)
    with pytest.raises(TypeError):
        fingerprint(42)


def test_classify_many_table():
    names = [n for n, *_ in REAL_NAMES[:8]]
    table = classify_many(names)
    assert list(table.columns) == ["name", "kind", "family", "tensor_cores", "dtype", "note"]
    assert len(table) == len(names)
    assert list(table["kind"]) == [k for _, k, *_ in REAL_NAMES[:8]]
    # "the name does not say" stays None, not NaN
    assert table.loc[6, "dtype"] is None and table.loc[6, "tensor_cores"] is None
    assert classify_many([]).empty


@pytest.mark.parametrize("name, kind", [("cpp_fused__softmax_masked_fill_mul_view_0", "softmax"),
                                        ("graph_0_cpp_fused_add_mul_1", "elementwise")])
def test_inductor_cpu_kernels_are_named_as_generated_cpp(name, kind):
    """Chapter 7's compiled naive attention on a CPU runs Inductor's C++ kernels."""
    fp = fingerprint(name)
    assert (fp.kind, fp.family, fp.tensor_cores) == (kind, "inductor_cpp", False)
    assert "torch.compile" in fp.note and "C++" in fp.note
