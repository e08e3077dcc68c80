"""The Triton FlashAttention kernels: what the contract grid (tests/attention/test_contract.py) leaves out.

The online softmax in PyTorch, the launch grid, GQA without copies, the fp32 output kept for
the backward, other tile shapes, the autotuner's pruning, refusals in words, the GPU grid at
realistic sizes, and the interpreter's effect on the process. Without a GPU these run in
Triton's interpreter (slow: keep S <= ~256).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kernels
import kernels.triton.flash as tf
import kernels.triton.backward as tb
import kernels.triton.configs as configs
import kernels.triton.launch as launch
from kernels import reference
from tests.helpers import ROOT, covering, make_attention_inputs, make_qkv

triton_attention = kernels.get("triton")
needs_interpreter_or_gpu = pytest.mark.skipif(
    tf.triton_reason(torch.device("cpu")) is not None,
    reason=f"triton cannot run on the CPU here: {tf.triton_reason(torch.device('cpu'))}")


def expected(q, k, v, causal, scale=None):
    """The float64 reference output (no autograd graph, so it can be compared freely)."""
    with torch.no_grad():
        return reference.attention(q, k, v, causal, scale)


# --- the online softmax in PyTorch ------------------------------------------------------

@pytest.mark.parametrize("block", [1, 3, 16, 100])
def test_tiled_softmax_equals_torch_softmax(block):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 4
    soft, history = tf.tiled_softmax(x, block)
    torch.testing.assert_close(soft, torch.softmax(x, dim=-1), rtol=1e-12, atol=1e-12)
    assert len(history) == math.ceil(37 / block)
    final_max, final_sum = history[-1]
    torch.testing.assert_close(final_max, x.amax(dim=-1))
    torch.testing.assert_close(final_sum, torch.exp(x - x.amax(dim=-1, keepdim=True)).sum(-1))


@pytest.mark.parametrize("block", [1, 7, 16, 50])
def test_online_attention_row_equals_the_reference_row(block):
    # 50 keys with scores far apart, so the running max rises several times and a missing
    # rescale of `l` or `acc` moves the result far past the tolerance.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 50, 8, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    want = reference.attention(q[:, :, -1:], k, v, causal=False)[0, 0, 0]
    torch.testing.assert_close(tf.online_attention_row(q[0, 0, -1], k[0, 0], v[0, 0], block), want,
                               rtol=1e-12, atol=1e-12)


def test_online_attention_row_refuses_an_empty_block():
    with pytest.raises(ValueError, match="block must be >= 1"):
        tf.online_attention_row(torch.zeros(4), torch.zeros(3, 4), torch.zeros(3, 4), 0)

# --- forward (its grid is the contract: tests/attention/test_contract.py) -------------

@needs_interpreter_or_gpu
def test_forward_backward_gives_the_reference_gradients_with_grad_off():
    q, k, v = make_qkv(1, 2, 40, 16, seed=5)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():   # as inside a profiler session on inputs that do not require grad
        grads = tf.forward_backward(q, k, v, grad_out, causal=True)
    verdict = reference.judge(triton_attention(q, k, v, causal=True), q, k, v, True, grads=grads, grad_out=grad_out)
    assert verdict.ok, verdict
    assert not any(t.requires_grad or t.grad is not None for t in (q, k, v))


@needs_interpreter_or_gpu
def test_forward_negative_scale():
    q, k, v = make_attention_inputs(1, 2, 1, 31, 31, 64, seed=6)
    reference.judge(triton_attention(q, k, v, causal=True, scale=-0.5), q, k, v, True, -0.5).assert_ok("triton")


@needs_interpreter_or_gpu
def test_grids_put_batch_times_heads_on_axis_0(monkeypatch):
    # Grid axis 1 (and 2) may be at most 65,535 long; axis 0 up to 2**31 - 1. B·H passes
    # 65,535 long before the tiles of one sequence do, so it goes on axis 0, for every kernel.
    grids = {}

    class Spy:
        def __init__(self, name, real):
            self.name, self.real = name, real

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                meta = {"BLOCK_M": 64, "BLOCK_N": 32, **kwargs}
                grids[self.name] = tuple(grid(meta) if callable(grid) else grid)
                return self.real[grid](*args, **kwargs)
            return launch

    for module, name in ((tf, "attn_fwd_tuned"), (tb, "attn_bwd_dkdv_tuned"), (tb, "attn_bwd_dq_tuned"),
                         (tb, "attn_bwd_preprocess")):
        monkeypatch.setattr(module, name, Spy(name.removesuffix("_tuned"), getattr(module, name)))
    # batch > 1 with GQA: program (b, h) must read K/V head h // group of batch b, and be right.
    q, k, v = make_attention_inputs(3, 4, 2, 70, 70, 16, layouts="bshd", seed=5)
    reference.check(triton_attention, q, k, v, causal=True, backward=True, seed=5).assert_ok("triton B=3")
    assert grids["attn_fwd"] == (3 * 4, math.ceil(70 / 64))
    assert grids["attn_bwd_dq"] == (3 * 4, math.ceil(70 / 64))
    assert grids["attn_bwd_preprocess"] == (3 * 4, math.ceil(70 / configs.PREPROCESS_BLOCK_M))
    key_tile = configs.INTERPRETER_BACKWARD_BLOCKS["BLOCK_N"] if tf.INTERPRETED else 32   # or the spy's default
    assert grids["attn_bwd_dkdv"] == (3 * 2, math.ceil(70 / key_tile)), "dK/dV: one program per K/V head's key tile"


@needs_interpreter_or_gpu
def test_gqa_reads_shared_heads_without_copies(monkeypatch):
    # The kernels must receive K and V as they are, [B, Hkv, Sk, D]: never repeated per query head.
    seen = []
    real = tf.attn_fwd_tuned

    class Spy:
        def __getitem__(self, grid):
            def launch(q, k, v, *args, **kwargs):
                seen.append((tuple(k.shape), k.data_ptr(), tuple(v.shape), v.data_ptr()))
                return real[grid](q, k, v, *args, **kwargs)
            return launch

    monkeypatch.setattr(tf, "attn_fwd_tuned", Spy())
    q, k, v = make_attention_inputs(1, 8, 1, 9, 9, 16, seed=2)
    triton_attention(q, k, v)
    assert seen == [((1, 1, 9, 16), k.data_ptr(), (1, 1, 9, 16), v.data_ptr())]


# --- half precision ----------------------------------------------------------------------

@needs_interpreter_or_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_backward_gets_the_output_before_rounding(dtype):
    # Delta = rowsum(dO·O) must use O as computed (fp32), not O rounded to 16 bits.
    q, k, v = (t.requires_grad_() for t in make_attention_inputs(1, 2, 2, 9, 9, 32, dtype=dtype, seed=1))
    out = triton_attention(q, k, v, causal=True)
    saved_o = out.grad_fn.saved_tensors[3]
    assert saved_o.dtype == torch.float32
    ref = expected(q, k, v, True)
    assert reference.max_rel_error(saved_o, ref) < 1e-5 < reference.max_rel_error(out, ref), \
        "the saved O must be the fp32 result, more exact than the rounded output"


@needs_interpreter_or_gpu
def test_no_fp32_copy_without_gradients():
    q, k, v = make_qkv(1, 2, 9, 32, dtype=torch.float16, seed=1)
    o, lse, o32 = tf.flash_forward(q, k, v, True, 0.2, keep_fp32_o=False)
    assert o32 is None and o.dtype == torch.float16


# --- backward ---------------------------------------------------------------------------

@pytest.mark.skipif(not tf.INTERPRETED, reason="tile sizes are fixed only in the interpreter")
@pytest.mark.parametrize("block_m,block_n,sq,sk", [(128, 64, 150, 203), (32, 128, 50, 140), (16, 64, 50, 70)])
def test_other_tile_shapes_in_the_interpreter(monkeypatch, block_m, block_n, sq, sk):
    # The GPU autotunes over other tile shapes than the interpreter's default. Run the largest
    # query tile, the tutorial's dK/dV shape (32 rows against 128 keys: masked steps of 16
    # rows, several per diagonal), and 16 rows (too few to halve, the masked steps keep 16),
    # with Sq != Sk and GQA, so that a tile-shape bug shows without a GPU.
    monkeypatch.setattr(configs, "INTERPRETER_BLOCKS", {"BLOCK_M": block_m, "BLOCK_N": block_n})
    monkeypatch.setattr(configs, "INTERPRETER_BACKWARD_BLOCKS", {"BLOCK_M": block_m, "BLOCK_N": block_n})
    q, k, v = make_attention_inputs(1, 2, 1, sq, sk, 16, layouts="bshd", seed=4)
    reference.check(triton_attention, q, k, v, causal=True, backward=True, seed=4).assert_ok(
        f"triton tiles {block_m}x{block_n}")


@needs_interpreter_or_gpu
@pytest.mark.parametrize("scale", [0.5, 1.3, 10.0])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp32_backward_at_large_scales_meets_the_float32_rule(scale, causal):
    # At scale 10 the log2-unit scores reach hundreds, and the backward rebuilds P = exp2(s·scale
    # - lse) from fresh scores against the forward's log-sum-exp: where the two round a score
    # differently (OpenBLAS's Haswell kernels in the interpreter round Sᵀ = K·Qᵀ unlike the
    # forward's Q·Kᵀ), dV is off by about 2e-5 of max|ref|, 5x plain float32. The judge's float32
    # bound carries float32's roundoff through the scores, from the inputs alone, so the
    # verdict does not depend on the machine's BLAS (make test-haswell runs this again under
    # OPENBLAS_CORETYPE=Haswell). Non-contiguous inputs, an odd length, GQA.
    q, k, v = make_attention_inputs(1, 4, 2, 113, 113, 64, layouts="bshd", seed=13)
    judgement = reference.check(triton_attention, q, k, v, causal=causal, scale=scale, backward=True, seed=3)
    judgement.assert_ok(f"triton fp32 backward, scale {scale}")


@needs_interpreter_or_gpu
def test_double_backward_is_refused_in_words():
    # Without the refusal autograd says only that dQ "does not have a grad_fn".
    q, k, v = (t.requires_grad_() for t in make_attention_inputs(1, 2, 1, 9, 9, 16, seed=5))
    out = triton_attention(q, k, v, causal=True)
    with pytest.raises(kernels.CannotRun, match=r"triton: double backward \(a backward with create_graph=True\) is not supported"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    (dq,) = torch.autograd.grad(triton_attention(q, k, v, causal=True).sum(), q)   # a single backward still runs
    assert dq.shape == q.shape and dq.grad_fn is None


# --- every output element is written ----------------------------------------------------

@needs_interpreter_or_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_poisoned_outputs_are_fully_written(monkeypatch, dtype):
    # Every buffer the launchers allocate (O, its fp32 copy, dQ, dK, dV) starts as NaN.
    def nan_filled(like, dtype=None):
        return torch.full_like(like, float("nan"), dtype=dtype)

    monkeypatch.setattr(launch, "new_output", nan_filled)
    q, k, v = make_attention_inputs(1, 4, 2, 40, 25, 40, dtype=dtype, layouts="bshd", seed=9)
    judgement = reference.check(triton_attention, q, k, v, causal=True, backward=True, seed=8)
    judgement.assert_ok(f"triton {dtype} with NaN-filled buffers (an unwritten element reads NaN)")


# --- refusals and requirements ----------------------------------------------------------

@pytest.mark.parametrize("d", [257, 512])
def test_head_dims_past_256_are_a_value_error(d):
    q, k, v = make_qkv(1, 1, 4, d)
    with pytest.raises(ValueError, match=f"head_dim {d} is not supported; supported: 1..256"):
        triton_attention(q, k, v)


def test_float64_is_refused_with_a_type_error():
    q, k, v = make_qkv(1, 1, 4, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        triton_attention(q, k, v)


def test_requirement_explains_what_is_missing(monkeypatch):
    assert "meta" in tf.triton_reason(torch.device("meta"))
    if not torch.cuda.is_available():
        assert "CUDA" in kernels.available("cuda")["triton"]
        # Without a GPU the launches go through the interpreter, and the CPU is supported.
        assert tf.INTERPRETED and kernels.available("cpu")["triton"] is None
    monkeypatch.setattr(tf, "INTERPRETED", False)
    assert "TRITON_INTERPRET" in tf.triton_reason(torch.device("cpu"))
    monkeypatch.setattr(tf, "TRITON_MISSING", "needs the triton package")
    assert tf.triton_reason(torch.device("cpu")) == "needs the triton package"


def test_import_without_triton_explains_instead_of_failing():
    # A fresh interpreter in which `import triton` fails, as on a machine without it.
    script = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None          # makes `import triton` raise ImportError
        import torch
        import kernels, kernels.triton.flash
        reason = kernels.available("cpu")["triton"]
        assert reason and "triton package" in reason, reason
        q = torch.randn(1, 1, 4, 16)
        try:
            kernels.get("triton")(q, q, q)
        except RuntimeError as err:
            assert "triton package" in str(err), err
        else:
            raise AssertionError("calling it without triton should raise RuntimeError")
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_gpu_configs_are_pruned_to_what_fits():
    # fp16, head_dim 128: (128 + 2·3·64)·128·2 bytes = 131072 for the forward's (128, 64, 8, 3).
    assert configs.shared_memory_estimate(128, 64, 3, 128, 2) == (128 + 2 * 3 * 64) * 128 * 2
    space = configs.GPU_CONFIGS
    limit = 64 * 1024
    kept = configs.fitting_configs(space, 4096, 128, 2, smem_limit=limit)
    assert kept and all(configs.shared_memory_estimate(m, n, st, 128, 2) <= limit for m, n, w, st in kept)
    assert (128, 64, 8, 3) not in kept
    # A 40-token sequence has no use for 128-row or 128-key tiles.
    assert all(max(m, n) <= 64 for m, n, *_ in configs.fitting_configs(configs.GPU_CONFIGS, 40, 64, 2,
                                                                    smem_limit=10**9))
    # 64 queries against 4096 keys (a chunk of decoding): no 128-row query tiles, 128-key ones still.
    short_q = configs.fitting_configs(configs.GPU_CONFIGS, 64, 64, 2, smem_limit=10**9, seq_k=4096)
    assert all(m <= 64 for m, *_ in short_q) and any(n == 128 for _, n, *_ in short_q), short_q
    assert all(n <= 32 for _, n, *_ in configs.fitting_configs(configs.GPU_CONFIGS, 4096, 64, 2,
                                                            smem_limit=10**9, seq_k=20))
    # Nothing fits: the smallest config is kept rather than none.
    smallest = min(space, key=lambda c: configs.shared_memory_estimate(c[0], c[1], c[3], 128, 2))
    assert configs.fitting_configs(space, 4096, 128, 2, smem_limit=1) == [smallest]


def test_the_autotuners_prune_hook_keeps_what_fits_the_launchs_gpu(monkeypatch):
    """configs.pruner runs only inside a GPU autotune: here with stand-in configs and an sm_90
    GPU of 227 KiB, the hook must keep exactly what fitting_configs keeps for that launch."""
    from types import SimpleNamespace

    stand_ins = [SimpleNamespace(kwargs={"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                 for m, n, w, s in configs.GPU_CONFIGS]
    gpu = SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=227 * 1024)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    q = torch.empty(1, 1, 1, 128, dtype=torch.float16)
    kept = configs.pruner("fwd")(stand_ins, {"Q": q, "SQ": 4096, "SK": 4096, "HEAD_DIM": 128})
    want = configs.fitting_configs(configs.GPU_CONFIGS, 4096, 128, 2, 227 * 1024, kernel="fwd",
                                   capability=(9, 0), seq_k=4096)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept] == want, \
        "the hook keeps the configs fitting_configs keeps, in its order, as the config objects given"
    assert 0 < len(kept) < len(stand_ins), "on this launch the pruning keeps some configs and drops others"


def test_register_footprint_counts_accumulators_and_one_score_tile():
    assert configs.register_footprint(128, 64, 128, "fwd") == 128 * 128 + 128 * 64
    assert configs.register_footprint(128, 64, 128, "bwd_dq") == 128 * 128 + 128 * 64
    assert configs.register_footprint(32, 128, 64, "bwd_dkdv") == 2 * 128 * 64 + 128 * 32
    with pytest.raises(ValueError, match="kernel"):
        configs.register_footprint(64, 64, 64, "nope")


def test_the_fewest_warps_that_hold_the_footprint_are_kept():
    # D = 16: a 128x64 forward tile holds 128·16 + 128·64 = 10240 float32 values and its Q and
    # K tiles, (128 + 64)·16 bf16 values, two to a register: 11776, 92 a thread with 4 warps,
    # 46 with 8; a 64x64 one holds 6144, 48 a thread with 4 warps.
    space = [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 8, 3)]
    assert configs.values_per_thread((128, 64, 4, 3), 16, "fwd", 2) == 11776 / 128
    for capability in ((8, 0), (9, 0)):
        kept = configs.fitting_configs(space, 4096, 16, 2, smem_limit=10**9, capability=capability)
        assert kept == [(128, 64, 8, 3), (64, 64, 4, 3)], (capability, kept)


def test_values_per_thread_count_the_operand_tiles():
    # D = 128, a 32x128 forward tile: 32·128 + 32·128 = 8192 float32 values, 64 a thread with
    # 4 warps, within the budget; with its Q and K tiles, (32 + 128)·128 bf16 values two to a
    # register, 18432, 144 a thread: ptxas spills it with 4 warps on sm_80 and sm_90, and the
    # pruning keeps 8 warps (72 a thread) instead on sm_90, neither on sm_80 (a budget of 68).
    assert configs.operand_values(32, 128, 128, "fwd", 2) == (32 + 128) * 128 // 2
    assert configs.operand_values(32, 128, 128, "fwd", 4) == (32 + 128) * 128
    # The backward also holds dP beside P: a second float32 tile of scores.
    assert configs.operand_values(32, 64, 64, "bwd_dq", 2) == (2 * 32 + 64) * 64 // 2 + 32 * 64
    assert configs.operand_values(32, 64, 64, "bwd_dkdv", 2) == (2 * 64 + 32) * 64 // 2 + 32 * 64
    space = [(32, 128, 4, 3), (32, 128, 8, 3)]
    assert configs.values_per_thread((32, 128, 8, 3), 128, "fwd", 2) == 72
    assert [c for c in space if configs.keep(c, 128, 2, 10**9, capability=(9, 0))] == [(32, 128, 8, 3)]
    assert not any(configs.keep(c, 128, 2, 10**9, capability=(8, 0)) for c in space)
    with pytest.raises(ValueError, match="kernel"):
        configs.operand_values(64, 64, 64, "nope")


def test_the_backward_streams_the_shorter_tile():
    # dK/dV holds BLOCK_N keys and streams BLOCK_M queries; dQ the other way round.
    assert configs.streams_the_shorter_tile((32, 128, 4, 2), "bwd_dkdv")
    assert not configs.streams_the_shorter_tile((128, 32, 8, 2), "bwd_dkdv")
    assert configs.streams_the_shorter_tile((128, 32, 8, 2), "bwd_dq")
    assert not configs.streams_the_shorter_tile((64, 128, 8, 2), "bwd_dq")
    assert configs.streams_the_shorter_tile((64, 128, 8, 2), "fwd")
    assert not configs.keep((128, 32, 8, 2), 32, 2, 10**9, "bwd_dkdv", (9, 0))


def test_what_ptxas_spills_within_the_budget_is_not_kept():
    # sm_80's forward at D = 32, 128x64 with 8 warps: 60 values a thread, within the budget of
    # 68 at either stage count; ptxas spills 8 bytes of the 3-stage one (the compile sweep),
    # so `keep` passes the 2-stage one only, and on sm_90, where neither spills, both.
    three, two = (128, 64, 8, 3), (128, 64, 8, 2)
    assert configs.values_per_thread(three, 32, "fwd", 2) == configs.values_per_thread(two, 32, "fwd", 2) == 60
    assert not configs.keep(three, 32, 2, 10**9, "fwd", (8, 0)), "a config ptxas spills on sm_80 is kept"
    assert configs.keep(two, 32, 2, 10**9, "fwd", (8, 0))
    assert configs.keep(three, 32, 2, 10**9, "fwd", (9, 0)) and configs.keep(two, 32, 2, 10**9, "fwd", (9, 0))

def test_when_nothing_is_kept_the_fewest_values_per_thread_are():
    # dK/dV at D = 256: even 32x32 with 8 warps holds 2·32·256 + 2·32·32 + (2·32 + 32)·256 / 2
    # = 30720 values, 120 a thread, over the budget; of what is left, the fewest per thread.
    assert not any(configs.keep(c, 256, 2, 10**9, "bwd_dkdv", (9, 0)) for c in configs.GPU_CONFIGS)
    assert configs.fitting_configs(configs.GPU_CONFIGS, 4096, 256, 2, 10**9, "bwd_dkdv", (9, 0)) == \
        [(32, 32, 8, 2)]


def test_backward_estimates_count_what_the_backward_keeps():
    # dK/dV at (128, 64, 8, 3), D = 128, bf16: 242 KiB per the compiler (REFERENCE: sm_90 AOT);
    # the estimate must not be below it, and must exceed sm_90's 227 KiB so the config is pruned.
    estimate = configs.shared_memory_estimate(128, 64, 3, 128, 2, kernel="bwd_dkdv")
    assert estimate >= 242 * 1024 and estimate > 227 * 1024
    assert configs.shared_memory_estimate(128, 64, 3, 128, 2, kernel="bwd_dq") == (2 * 128 + 6 * 64) * 128 * 2
    # One stage is no pipelining, not less memory: dK/dV (32, 32, 8, 1) at D = 256 takes 80 KiB
    # on both targets, more than (32, 32, 8, 2) (compile sweep, Triton 3.7.1).
    assert configs.shared_memory_estimate(32, 32, 1, 256, 2, kernel="bwd_dkdv") >= 80 * 1024
    with pytest.raises(ValueError):
        configs.shared_memory_estimate(64, 64, 2, 64, 2, kernel="nope")


@needs_interpreter_or_gpu
def test_zero_scale_gives_the_uniform_softmax():
    # Every score is 0, the softmax uniform; a hidden score must stay hidden (-inf, not -inf·0 = NaN).
    q, k, v = make_attention_inputs(1, 2, 2, 20, 20, 16, seed=12)
    out = triton_attention(q, k, v, causal=True, scale=0.0)
    reference.judge(out, q, k, v, True, 0.0).assert_ok("triton scale=0")


def test_padded_head_dim():
    assert [launch.padded_head_dim(d) for d in (1, 16, 17, 40, 64, 80, 111, 128, 160, 256)] == \
        [16, 16, 32, 64, 64, 128, 128, 128, 256, 256]


# --- on a GPU: the compiled, autotuned kernels at realistic sizes ------------------------

@pytest.fixture
def one_autotune_config(monkeypatch):
    """Autotune over one config instead of all of them.

    Each new (dtype, head dim, causal, ...) compiles every config of three kernels; one keeps
    this grid within a few minutes on a cold GPU. ``test_gpu_autotuned_at_the_chapters_shape``
    runs the full autotuning once.
    """
    if tf.INTERPRETED:  # interpreted kernels are not autotuned: nothing to narrow
        return
    keep = [(64, 32, 4, 2)]
    for kernel in (tf.attn_fwd_tuned, tb.attn_bwd_dkdv_tuned, tb.attn_bwd_dq_tuned):
        configs = [c for c in kernel.configs
                   if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in keep]
        monkeypatch.setattr(kernel, "configs", configs)


# Every dtype, every peer head dim, both causal modes, ragged lengths both ways, GQA 1/2/8.
GPU_CASES = covering(
    [torch.bfloat16, torch.float16, torch.float32],
    [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256],
    [True, False],
    [(1024, 1024), (113, 203), (1, 239), (3, 799), (1023, 1024), (2048, 2048), (203, 113), (1, 1)],
    [(8, 8), (8, 4), (8, 1)],
)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,d,causal,lengths,heads", GPU_CASES,
                         ids=lambda x: str(x).replace("torch.", "") if isinstance(x, torch.dtype) else None)
def test_gpu_forward_and_backward(one_autotune_config, dtype, d, causal, lengths, heads):
    sq, sk = lengths
    q, k, v = make_attention_inputs(1, *heads, sq, sk, d, dtype=dtype, device="cuda", layouts="bshd", seed=sq)
    judgement = reference.check(triton_attention, q, k, v, causal=causal, backward=True, seed=1)
    judgement.assert_ok(f"triton on GPU {dtype} d{d} q{sq} k{sk} h{heads} causal={causal}")


@pytest.mark.gpu
def test_gpu_autotuned_at_the_chapters_shape():
    # Every config is compiled and timed here; the winner must be right, forward and backward.
    q, k, v = make_attention_inputs(2, 8, 8, 1024, 1024, 128, dtype=torch.bfloat16, device="cuda",
                                    layouts="bshd", seed=3)
    reference.check(triton_attention, q, k, v, causal=True, backward=True).assert_ok("triton autotuned")


# --- compiled for a GPU, without one ------------------------------------------------------

_COMPILE_PROBE = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import kernels.triton.flash as tf
    import kernels.triton.backward as tb

    pointers, fp32 = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ"}, {"LSE", "DELTA"}

    def signature(fn, consts):
        return {n: "constexpr" if n in consts else "*bf16" if n in pointers else "*fp32" if n in fp32
                else "fp32" if n.endswith("scale") else "i32" for n in fn.arg_names}

    consts = dict(D=40, HEAD_DIM=64, BLOCK_M=64, BLOCK_N=32, CAUSAL=True)
    shared = {}
    for fn in (tf.attn_fwd, tb.attn_bwd_dkdv, tb.attn_bwd_dq):
        src = ASTSource(fn=fn, signature=signature(fn, consts),
                        constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
        shared[fn.__name__] = kernel.metadata.shared
    print(json.dumps(shared))
""")


@pytest.mark.skipif(tf.TRITON_MISSING is not None, reason=str(tf.TRITON_MISSING))
def test_kernels_compile_for_a_gpu_without_one(tmp_path):
    """The interpreter is lenient where the compiler is not: compile the kernels for sm_90 in
    a process where they are compiled objects (TRITON_INTERPRET=0), with Triton's cache empty
    so that nothing is read back. bf16, a padded head dim, causal: every branch the GPU takes."""
    shared = _probe(tmp_path, _COMPILE_PROBE, TRITON_INTERPRET="0",
                    TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    assert set(shared) == {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}
    for name, size in shared.items():
        assert 0 < size <= 227 * 1024, f"{name} must fit sm_90's 227 KiB of shared memory, needs {size}"


_PROCESS_PROBE = textwrap.dedent("""
    import json, os, sys
    import torch, torch.profiler
    with torch.profiler.profile():      # the profiler imports Triton before the library does
        torch.ones(4) + 1
    before = "triton" in sys.modules
    import kernels, kernels.triton
    import triton, triton.language as tl
    q, k, v = (torch.randn(1, 2, n, 24) for n in (37, 50, 50))
    out = kernels.get("triton")(q, k, v, causal=True) if kernels.available("cpu")["triton"] is None else None
    error = None if out is None else (out - kernels.get("naive")(q, k, v, causal=True)).abs().max().item()

    @triton.jit
    def row_max(X, Y, N: tl.constexpr):
        cols = tl.arange(0, N)
        tl.store(Y + tl.program_id(0), tl.max(tl.load(X + tl.program_id(0) * N + cols), 0))

    right = None
    if os.environ.get("TRITON_INTERPRET") == "1":
        x, y = torch.randn(3, 16), torch.empty(3)
        row_max[(3,)](x, y, N=16)
        right = bool(torch.equal(y, x.amax(1)))
    print(json.dumps(dict(triton_first=before, env=os.environ.get("TRITON_INTERPRET"), error=error,
                          reason=kernels.available("cpu")["triton"], theirs=type(row_max).__name__,
                          right=right)))
""")


def _probe(tmp_path, script, **env):
    """Run ``script`` (from a file: @triton.jit reads its kernels' source) in a fresh process
    without TRITON_INTERPRET unless ``env`` sets it; returns the JSON it printed last."""
    path = tmp_path / "probe.py"
    path.write_text(script)
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=180,
                          env={**base, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_library_turns_the_interpreter_on_only_without_a_gpu(tmp_path):
    """Without a GPU, `import kernels.triton` sets TRITON_INTERPRET=1 for the process, even with Triton
    imported first (by torch.profiler), and the Triton implementation and a reader's own
    kernel defined afterwards both run interpreted, and right. With a GPU nothing is set."""
    seen = _probe(tmp_path, _PROCESS_PROBE)
    assert seen["triton_first"], "torch.profiler imports Triton: the probe checks the hard order"
    if torch.cuda.is_available():
        assert seen["env"] is None and seen["theirs"] == "JITFunction", "with a GPU nothing is set"
        return
    assert seen["env"] == "1" and seen["theirs"] == "InterpretedFunction", seen
    assert seen["reason"] is None and seen["error"] < 1e-5, \
        "without a GPU the Triton implementation runs in the interpreter, within fp32's 1e-5"
    assert seen["right"], "a reader's kernel, which calls Triton's standard library, runs interpreted"


def test_a_user_who_turns_the_interpreter_off_is_told_so(tmp_path):
    seen = _probe(tmp_path, _PROCESS_PROBE, TRITON_INTERPRET="0")
    assert seen["env"] == "0", "a value the user set is left as it is"
    assert seen["error"] is None and "TRITON_INTERPRET=0" in seen["reason"], seen["reason"]
