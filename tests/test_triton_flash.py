"""The Triton FlashAttention kernels against the float64 reference.

On a machine without a GPU these run in Triton's interpreter (slow: keep S <= 256 and
the cases few). Shapes cover S = 1, 17, 113 and 203: a single row, less than one tile,
and ragged tails after several tiles. They also cover every supported head_dim, both
causal modes, non-contiguous [B, S, H, D] views, fp16 and bf16.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kernels
import kernels.triton_flash as tf
from kernels import reference
from conftest import make_qkv

triton_attention = kernels.get("triton")
needs_interpreter_or_gpu = pytest.mark.skipif(
    tf.requirement(torch.device("cpu")) is not None,
    reason=f"triton cannot run on the CPU here: {tf.requirement(torch.device('cpu'))}")


def expected(q, k, v, causal, scale=None):
    """The float64 reference output (no autograd graph, so it can be compared freely)."""
    with torch.no_grad():
        return reference.attention(q, k, v, causal, scale)


def reference_grads(q, k, v, grad_out, causal, scale=None):
    """dq, dk, dv of the float64 reference attention, by autograd."""
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v))
    reference.attention(q64, k64, v64, causal, scale).backward(grad_out.to("cpu", torch.float64))
    return q64.grad, k64.grad, v64.grad


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


def test_tiled_softmax_history_by_hand():
    # x = [0, 0, ln 2] in tiles of 2.
    # Tile 1: max 0, sum e^0 + e^0 = 2.
    # Tile 2: the max rises to ln 2, so the old sum is rescaled: 2·e^(0 - ln 2) + e^0 = 1 + 1 = 2.
    # Softmax: [1, 1, 2] / 4.
    x = torch.tensor([0.0, 0.0, math.log(2.0)], dtype=torch.float64)
    soft, history = tf.tiled_softmax(x, 2)
    (m1, l1), (m2, l2) = history
    assert (m1.item(), l1.item()) == (0.0, 2.0)
    assert m2.item() == pytest.approx(math.log(2.0)) and l2.item() == pytest.approx(2.0)
    torch.testing.assert_close(soft, torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))


# --- forward ----------------------------------------------------------------------------

# (batch, heads, seq, head_dim, causal, layout): every S in both causal modes, every head_dim,
# both layouts; batch > 1 somewhere so the (batch, head) split of the grid is exercised.
FORWARD_CASES = [
    (1, 2, 1, 16, True, "bhsd"),
    (2, 1, 1, 64, False, "bhsd"),  # at S = 1 a [B, S, H, D] view is contiguous anyway
    (2, 3, 17, 32, True, "bshd"),
    (1, 2, 17, 128, False, "bhsd"),
    (1, 2, 113, 64, True, "bhsd"),
    (2, 2, 113, 16, False, "bshd"),
    (1, 2, 203, 128, True, "bshd"),
    (1, 1, 203, 32, False, "bhsd"),
]


@needs_interpreter_or_gpu
@pytest.mark.parametrize("b,h,s,d,causal,layout", FORWARD_CASES)
def test_forward_matches_reference_fp32(b, h, s, d, causal, layout):
    q, k, v = make_qkv(b, h, s, d, layout=layout, seed=s + d)
    out = triton_attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    err = reference.max_rel_error(out, expected(q, k, v, causal))
    assert err < reference.tolerance(torch.float32), err


@needs_interpreter_or_gpu
def test_forward_explicit_scale():
    q, k, v = make_qkv(1, 2, 17, 32, seed=3)
    out = triton_attention(q, k, v, causal=True, scale=0.3)
    err = reference.max_rel_error(out, expected(q, k, v, True, scale=0.3))
    assert err < reference.tolerance(torch.float32), err
    # A different scale must change the result (the kernel really uses it).
    assert reference.max_rel_error(triton_attention(q, k, v, causal=True), out) > 1e-3


@needs_interpreter_or_gpu
@pytest.mark.parametrize("dtype,s,d,causal,layout", [
    (torch.float16, 113, 64, True, "bshd"),
    (torch.bfloat16, 113, 32, False, "bhsd"),
    (torch.bfloat16, 17, 128, True, "bshd"),
])
def test_forward_half_precision(dtype, s, d, causal, layout):
    q, k, v = make_qkv(1, 2, s, d, dtype=dtype, layout=layout, seed=7)
    out = triton_attention(q, k, v, causal=causal)
    assert out.dtype == dtype
    ref = expected(q, k, v, causal)
    err = reference.max_rel_error(out, ref)
    assert err < reference.tolerance(dtype), err
    # Stricter than the tolerance: the kernel accumulates in float32, so its output should
    # be the float32 result rounded once, i.e. within one rounding of the reference itself.
    rounding_err = reference.max_rel_error(ref.to(dtype), ref)
    assert err <= 2 * rounding_err + 1e-6, (err, rounding_err)


# --- backward ---------------------------------------------------------------------------

@needs_interpreter_or_gpu
@pytest.mark.parametrize("s,d,causal,layout", [
    (17, 32, True, "bshd"),
    (17, 64, False, "bhsd"),
    (113, 64, True, "bhsd"),
    (113, 16, False, "bshd"),
])
def test_backward_matches_reference_fp32(s, d, causal, layout):
    q, k, v = make_qkv(2, 2, s, d, layout=layout, seed=11 + s, requires_grad=True)
    # A random upstream gradient in plain [B, H, S, D] layout: its strides differ from O's
    # when the inputs are [B, S, H, D] views, so dO strides are exercised too.
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    out = triton_attention(q, k, v, causal=causal)
    out.backward(grad_out)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, causal)):
        assert got.shape == want.shape
        err = reference.max_rel_error(got, want)
        assert err < reference.tolerance(torch.float32), f"d{name}: {err}"


@needs_interpreter_or_gpu
def test_backward_fp16():
    q, k, v = make_qkv(1, 2, 17, 32, dtype=torch.float16, seed=2, requires_grad=True)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).half()
    triton_attention(q, k, v, causal=True).backward(grad_out)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, True)):
        assert got.dtype == torch.float16
        err = reference.max_rel_error(got, want)
        assert err < reference.tolerance(torch.float16), f"d{name}: {err}"


@pytest.mark.skipif(not tf.INTERPRETED, reason="tile sizes are fixed only in the interpreter")
@pytest.mark.parametrize("block_m,block_n", [(128, 64), (32, 32)])
def test_other_tile_shapes_in_the_interpreter(monkeypatch, block_m, block_n):
    # The GPU autotunes over other tile shapes than the interpreter's default. Run the
    # largest and the square one here, so that a tile-shape bug shows without a GPU.
    monkeypatch.setattr(tf, "_FIXED_BLOCKS", {"BLOCK_M": block_m, "BLOCK_N": block_n})
    q, k, v = make_qkv(1, 2, 203, 32, layout="bshd", seed=4, requires_grad=True)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    out = triton_attention(q, k, v, causal=True)
    out.backward(grad_out)
    assert reference.max_rel_error(out, expected(q, k, v, True)) < reference.tolerance(torch.float32)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, True)):
        err = reference.max_rel_error(got, want)
        assert err < reference.tolerance(torch.float32), f"d{name}: {err}"


# --- every output element is written ----------------------------------------------------

@needs_interpreter_or_gpu
@pytest.mark.parametrize("dtype,s", [(torch.float32, 113), (torch.bfloat16, 17)])
def test_poisoned_outputs_are_fully_written(monkeypatch, dtype, s):
    def nan_filled(like, dtype=None):
        return torch.full_like(like, float("nan"), dtype=dtype)

    monkeypatch.setattr(tf, "_new_output", nan_filled)
    q, k, v = make_qkv(1, 2, s, 32, dtype=dtype, layout="bshd", seed=9, requires_grad=True)
    out = triton_attention(q, k, v, causal=True)
    assert not out.isnan().any(), "forward left elements of O unwritten"
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    out.backward(grad_out)
    for name, grad in zip("qkv", (q.grad, k.grad, v.grad)):
        assert not grad.isnan().any(), f"backward left elements of d{name} unwritten"
    err = reference.max_rel_error(out, expected(q, k, v, True))
    assert err < reference.tolerance(dtype), err


# --- refusals and requirements ----------------------------------------------------------

@pytest.mark.parametrize("d", [8, 48, 256])
def test_unsupported_head_dim_is_a_value_error(d):
    q, k, v = make_qkv(1, 1, 4, d)
    with pytest.raises(ValueError, match="head_dim"):
        triton_attention(q, k, v)


def test_float64_is_refused_with_a_type_error():
    q, k, v = make_qkv(1, 1, 4, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        triton_attention(q, k, v)


def test_requirement_explains_what_is_missing(monkeypatch):
    assert "meta" in tf.requirement(torch.device("meta"))
    if not torch.cuda.is_available():
        assert "CUDA" in kernels.available("cuda")["triton"]
        # Without a GPU, the interpreter was switched on at import and the CPU is supported.
        assert tf.INTERPRETED and kernels.available("cpu")["triton"] is None
    monkeypatch.setattr(tf, "INTERPRETED", False)
    assert "TRITON_INTERPRET" in tf.requirement(torch.device("cpu"))
    monkeypatch.setattr(tf, "TRITON_MISSING", "needs the triton package")
    assert tf.requirement(torch.device("cpu")) == "needs the triton package"


def test_import_without_triton_explains_instead_of_failing():
    # A fresh interpreter in which `import triton` fails, as on a machine without it.
    script = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None          # makes `import triton` raise ImportError
        import torch
        import kernels, kernels.triton_flash
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
    # fp16, head_dim 128: (128 + 2·3·64)·128·2 bytes = 131072 for the largest config.
    assert tf.shared_memory_estimate(128, 64, 3, 128, 2) == (128 + 2 * 3 * 64) * 128 * 2
    everything = tf.fitting_configs(tf.GPU_CONFIGS, 4096, 128, 2, smem_limit=10**9)
    assert everything == tf.GPU_CONFIGS
    limit = 64 * 1024
    kept = tf.fitting_configs(tf.GPU_CONFIGS, 4096, 128, 2, smem_limit=limit)
    assert kept and all(tf.shared_memory_estimate(m, n, st, 128, 2) <= limit for m, n, w, st in kept)
    assert (128, 64, 8, 3) not in kept
    # A 40-token sequence has no use for 128-row query tiles.
    assert all(m <= 64 for m, *_ in tf.fitting_configs(tf.GPU_CONFIGS, 40, 64, 2, smem_limit=10**9))
    # Nothing fits: the smallest config is kept rather than none.
    assert tf.fitting_configs(tf.GPU_CONFIGS, 4096, 128, 2, smem_limit=1) == [(32, 32, 4, 2)]
    for m, n, *_ in tf.GPU_CONFIGS:
        assert m % n == 0, "the forward's diagonal must start on a key-tile boundary"


# --- on a GPU: the compiled, autotuned kernels at realistic sizes ------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,s,d,causal", [
    # Few cases on purpose: each new (dtype, head_dim, causal) compiles every autotune config.
    (torch.float16, 1024, 64, True),
    (torch.bfloat16, 2048, 128, True),
    (torch.bfloat16, 1000, 128, False),
    (torch.float16, 257, 32, False),
    (torch.float32, 203, 64, True),
    (torch.bfloat16, 1, 16, False),
])
def test_gpu_forward_and_backward(dtype, s, d, causal):
    layout = "bshd" if s > 1 else "bhsd"  # at S = 1 a [B, S, H, D] view is contiguous anyway
    q, k, v = make_qkv(2, 4, s, d, dtype=dtype, device="cuda", layout=layout, seed=s,
                       requires_grad=True)
    out = triton_attention(q, k, v, causal=causal)
    err = reference.max_rel_error(out, expected(q, k, v, causal))
    assert err < reference.tolerance(dtype), err
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    out.backward(grad_out)
    # Backward sums over S terms in low precision, so allow twice the forward's tolerance.
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, causal)):
        err = reference.max_rel_error(got, want)
        assert err < 2 * reference.tolerance(dtype), f"d{name}: {err}"
