"""Chapter 4's plumbing: what the Triton forward and backward launches share.

``kernels.triton.flash`` (the forward, and the registry entry ``triton``) and
``kernels.triton.backward`` (the backward) both take from here: Triton itself, or a stand-in
that says what is missing; whether launches run in Triton's interpreter (``INTERPRETED``,
decided without changing the process; see ``kernels.triton.interpreter``); the tile-pointer
helper ``_tile`` every kernel loads through; the output buffers; and the size arguments every
kernel takes after its tensors and strides.
"""
# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations, and
# keeping them real objects rather than strings is the form every Triton version expects.
import contextlib

import torch

from kernels.triton import interpreter
from kernels.registry import Reason

# Whether launches go through Triton's interpreter: TRITON_INTERPRET when it is set, else
# exactly when there is no GPU. Deciding it changes nothing in the process.
INTERPRETED = interpreter.wanted()


class _NoTriton:
    """Stands in for ``triton`` and ``triton.language`` when Triton is missing.

    The kernel definitions below still execute (as plain, never-called Python functions),
    so ``import kernels`` works and ``available()`` can say what is missing.
    """

    constexpr = None

    @staticmethod
    def jit(fn):
        return fn


try:
    import triton
    import triton.language as tl
    TRITON_MISSING: Reason = None
except Exception as err:  # ImportError, or a broken install failing in its own way
    triton = tl = _NoTriton()
    TRITON_MISSING = f"needs the triton package, which failed to import ({type(err).__name__}: {err})"
try:
    # Host-side tensor descriptors (Triton >= 3.4; the TMA forward's arguments). Without them
    # the forward keeps its pointer kernel everywhere.
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:
    TensorDescriptor = None

LOG2E = 1.4426950408889634     # log2(e): exp(x) == exp2(x * LOG2E)


# Offsets: a tile's first row is added to the base pointer in int64 (``_tile``), because
# row · stride reaches 2**31 elements on long sequences (S = 128k in a [B, S, H, D] layout
# with H·D = 16384 does); offsets inside a tile stay int32, which is cheaper.
# The grid puts the B·H programs on axis 0, which may be 2**31 - 1 long, and the tiles of one
# head on axis 1 (at most 65,535): B·H passes 65,535 sooner than the tiles of one sequence.

@triton.jit
def _tile(base, b, h, start, offs, cols, stride_b, stride_h, stride_s, stride_d):
    """Pointers to rows start + offs, columns cols of head (b, h) of a [B, H, S, D] tensor with
    any strides. b, h and start are scaled in int64, the in-tile offsets in int32."""
    return (base + b * stride_b + h * stride_h + tl.cast(start, tl.int64) * stride_s
            + (offs[:, None] * stride_s + cols[None, :] * stride_d))


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def new_output(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Memory for O, dQ, dK or dV, with ``like``'s shape and (when dense) strides.

    Uninitialized, because the kernels write every element. Tests replace this function
    with one that fills NaN, to prove it.
    """
    return torch.empty_like(like, dtype=dtype)


def kernel_target(out: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel should write ``out`` through.

    Usually ``out`` itself. The exception is bfloat16 in the interpreter: its float32 to
    bfloat16 conversion truncates instead of rounding to nearest, so there the kernel
    writes float32 and PyTorch rounds it into ``out`` (see `copy_into_output`).
    """
    if INTERPRETED and out.dtype == torch.bfloat16:
        return new_output(out, torch.float32)
    return out


def copy_into_output(out: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    if written is not out:
        out.copy_(written)
    return out


def kernel_options(q: torch.Tensor) -> dict:
    # The interpreter does bfloat16 arithmetic on raw bits (silently wrong), so there
    # every tile is upcast to float32 right after its load. On a GPU, float32 matmuls
    # would default to TF32 (about 1e-3 error). "ieee" keeps them exact to the course's
    # 1e-5 tolerance, at the price of not using tensor cores.
    return dict(UPCAST=INTERPRETED,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 or INTERPRETED else "tf32")


def padded_head_dim(head_dim: int) -> int:
    """The power of two >= head_dim (and >= 16, tl.dot's smallest size) the kernels work in."""
    return max(16, next_power_of_2(head_dim))


def sizes(q, k) -> dict:
    """The size arguments every kernel takes, after its tensors and strides."""
    s_q, s_k = q.shape[2], k.shape[2]
    return dict(H=q.shape[1], GROUP=q.shape[1] // k.shape[1], SQ=s_q, SK=s_k, D=q.shape[3],
                OFFSET=s_k - s_q, SQ_BUCKET=next_power_of_2(s_q), SK_BUCKET=next_power_of_2(s_k))


def launching(namespace: dict):
    """Where a launcher's launches happen: in the interpreter, the kernels of ``namespace`` (the
    launching module's globals) and Triton's standard library are seen as interpreted copies
    until the block ends; on a GPU, nothing changes."""
    if INTERPRETED and not TRITON_MISSING:
        return interpreter.interpreting(namespace)
    return contextlib.nullcontext()
