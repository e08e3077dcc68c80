"""Chapter 4's plumbing: what the Triton forward and backward launches share.

``kernels.triton.flash`` (the forward, and the registry entry ``triton``) and
``kernels.triton.backward`` (the backward) both take from here: Triton itself, or a stand-in
that says what is missing; whether the kernels run in Triton's interpreter (``INTERPRETED``:
``kernels.triton`` turned it on where there is no GPU); the tile-pointer helper
``tile_ptrs`` the kernels load through; the output buffers; and the size arguments every
kernel takes after its tensors and strides.
"""
# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations, and
# keeping them real objects rather than strings is the form every Triton version expects.
import torch

from kernels.triton import interpreter
from kernels.registry import Reason

# Whether the kernels run in Triton's interpreter: what TRITON_INTERPRET says now, as the
# kernels below are decorated (``kernels.triton`` set it to 1 where no GPU is visible).
INTERPRETED = bool(interpreter.asked())


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

if INTERPRETED and not TRITON_MISSING:
    interpreter.squeeze_scalar_index()
    interpreter.interpret_standard_library()   # where Triton was imported before the switch

LOG2E = 1.4426950408889634     # log2(e): exp(x) == exp2(x * LOG2E)


# Offsets: a tile's first row is added to the base pointer in int64 (``tile_ptrs``), because
# row · stride reaches 2**31 elements on long sequences (S = 128k in a [B, S, H, D] layout
# with H·D = 16384 does); offsets inside a tile stay int32, which is cheaper.
# The grid puts the B·H programs on axis 0, which may be 2**31 - 1 long, and the tiles of one
# head on axis 1 (at most 65,535): B·H passes 65,535 sooner than the tiles of one sequence.

@triton.jit
def tile_ptrs(base, b, h, start, offs, cols, stride_b, stride_h, stride_s, stride_d):
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


def kernel_inputs(*tensors: torch.Tensor) -> tuple:
    """The tensors as the kernels read them: as they are on a GPU; in float32 in the
    interpreter, whose 16-bit arithmetic is not the GPU's (bfloat16 is done on raw bits,
    silently wrong, and its float32 to bfloat16 conversion truncates instead of rounding).
    The kernels' outputs are then float32 too, and PyTorch rounds them (``rounded``)."""
    if not INTERPRETED:
        return tensors
    return tuple(t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors)


def rounded(written: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What a kernel wrote, in ``dtype`` (itself when it is already)."""
    return written if written.dtype == dtype else written.to(dtype)


def padded_head_dim(head_dim: int) -> int:
    """The power of two >= head_dim (and >= 16, tl.dot's smallest size) the kernels work in."""
    return max(16, next_power_of_2(head_dim))


def sizes(q, k) -> dict:
    """The size arguments every kernel takes, after its tensors and strides."""
    return dict(H=q.shape[1], GROUP=q.shape[1] // k.shape[1], SQ=q.shape[2], SK=k.shape[2], D=q.shape[3])
