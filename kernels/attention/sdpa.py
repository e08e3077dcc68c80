"""Chapter 3: ``F.scaled_dot_product_attention`` with its backend pinned.

Pinning a backend with ``sdpa_kernel`` makes each of flash, memory-efficient, cuDNN and math
its own registry entry, so the profiler shows what each launches. The support rules mirror
PyTorch's own checks (aten sdp_utils) as pure functions of a compute capability, so a reader
is told why before a call fails. The entries add what the registry's contract needs:
bottom-right causal when Sq != Sk, ``enable_gqa`` for grouped-query attention, a copy for a
layout without unit stride along D, and a guard for the CPU flash kernel's NaN at scale <= 0.
``math_decomposed`` writes out what the math backend runs, one ATen op per line, bit for bit;
``ARTICLE_A100_KERNELS`` are the fused kernels of the source article's A100 traces, and
``flash_tiles`` reads FlashAttention-2's tiles off its kernel's name. Reading SDPA calls out of a
trace, and the pages' tables and figures, live with chapters 3 and 3b (``kernels.book.ch03_sdpa``,
``kernels.book.ch03b_sdpa_fused``).
"""
from __future__ import annotations

import functools
import math
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.reference import future_mask
from kernels.registry import CannotRun, Reason, check_inputs, cuda_reason, get, register, resolve_scale

if TYPE_CHECKING:   # the tables need pandas; importing the registry must stay cheap
    import pandas as pd

BACKENDS = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
HALF = (torch.float16, torch.bfloat16)
# PyTorch builds its flash kernels for sm_80 through sm_121 (torch 2.11-2.13).
FLASH_CAPABILITIES = ((8, 0), (12, 1))
# When cuDNN takes head dims past 128 (sdp_utils.cpp's check_cudnn_tensor_shapes), read from the
# compiled checks of the CUDA 13 wheels of torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0 (their
# constants; the source on PyTorch's main branch says the same as 2.14/2.15):
# - torch 2.11 to 2.13: 256 on compute capability 9.0 only (`major == 9 && !minor`) with a runtime
#   cuDNN of 9.10 or newer.
# - torch 2.14 on: 256 on 9.0 and on every 10.x (but 10.7 before cuDNN 9.26) with a cuDNN newer than
#   9.22, in a build against cuDNN frontend 1.24 or newer (the wheels are); and, when an input needs
#   gradients, head dims between 128 and 256 are refused (check_cudnn_d256_bprop_head_dim: the
#   backward takes <= 128, or 256 exactly, for equal q/k/v head dims).
# (Both also take d_qk 192 with d_v 128 on some GPUs; the course's heads are all one size.)
CUDNN_D256_RULES = {
    (2, 11): dict(capability=lambda cap: tuple(cap) == (9, 0), newer_than=90999, sm107_newer_than=None,
                  backward_gap=False),
    (2, 14): dict(capability=lambda cap: tuple(cap) == (9, 0) or cap[0] == 10, newer_than=92200,
                  sm107_newer_than=92500, backward_gap=True),
}


def capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _sm(cap: tuple[int, int]) -> str:
    return f"sm_{cap[0]}{cap[1]}"


# ---- PyTorch's backend rules (aten sdp_utils, torch 2.11-2.15), as pure functions ------------
# They take a capability tuple rather than a device, so tests can ask about GPUs CI never sees.

def capability_reason(name: str, cap: tuple[int, int]) -> Reason:
    """Why backend ``name`` cannot run on a GPU of compute capability ``cap`` at all."""
    if name in ("sdpa_flash", "sdpa_cudnn") and cap < (8, 0):
        return f"needs compute capability 8.0 (Ampere) or newer; this GPU is {_sm(cap)}"
    if name == "sdpa_flash" and cap > FLASH_CAPABILITIES[1]:
        return (f"PyTorch builds its flash kernels for sm_80 to sm_121; this GPU is {_sm(cap)}")
    if name == "sdpa_efficient" and cap < (5, 0):
        return f"needs compute capability 5.0 or newer; this GPU is {_sm(cap)}"
    return None


def gpu_input_reason(name: str, cap: tuple[int, int], dtype: torch.dtype, head_dim: int, *,
                     deterministic: bool = False, cudnn_version: Optional[int] = None,
                     torch_version: Optional[str] = None, requires_grad: bool = False) -> Reason:
    """Why backend ``name`` refuses inputs of ``dtype`` and ``head_dim`` on a GPU of capability ``cap``.

    ``torch_version`` picks the release's rules (default: the installed torch); ``requires_grad``:
    an input needs gradients (cuDNN's backward takes fewer head dims from torch 2.14 on)."""
    if name == "sdpa_cudnn":
        return capability_reason(name, cap) or _cudnn_rule(cap, dtype, head_dim, deterministic, cudnn_version,
                                                           torch_version or torch.__version__, requires_grad)
    rule = {"sdpa_flash": _flash_rule, "sdpa_efficient": _efficient_rule}.get(name)
    if rule is None:
        return None
    return capability_reason(name, cap) or rule(cap, dtype, head_dim)


def _flash_rule(cap, dtype, d) -> Reason:
    if dtype not in HALF:
        return f"takes float16 or bfloat16 on a GPU, got {dtype}"
    if d > 256:
        return f"supports head_dim <= 256, got {d}"
    return None


def _efficient_rule(cap, dtype, d) -> Reason:
    if dtype not in (torch.float32, *HALF):
        return f"takes float32, float16 or bfloat16, got {dtype}"
    if dtype == torch.bfloat16 and cap < (8, 0):
        return f"takes bfloat16 only on compute capability 8.0 or newer; this GPU is {_sm(cap)}"
    # The GEMMs' alignment: 16-bit on tensor cores (sm_70+) needs 8 elements, fp32 on sm_80+ 4.
    align = 8 if dtype in HALF and cap >= (7, 0) else 4 if cap >= (8, 0) else 1
    if d % align:
        return f"needs head_dim to be a multiple of {align} for {dtype} on {_sm(cap)}, got {d}"
    return None


def cudnn_d256_rule(torch_version: str) -> dict:
    """The CUDNN_D256_RULES entry of the newest release at or before ``torch_version``."""
    release = Version(torch_version).release[:2]
    return CUDNN_D256_RULES[max((r for r in CUDNN_D256_RULES if r <= release), default=min(CUDNN_D256_RULES))]


def _cudnn_rule(cap, dtype, d, deterministic, cudnn_version, torch_version, requires_grad) -> Reason:
    if dtype not in HALF:
        return f"takes float16 or bfloat16, got {dtype}"
    if deterministic:
        # check_cudnn_deterministic; with warn_only=True it only warns and cuDNN still runs.
        return "is not used while torch.use_deterministic_algorithms(True) is on (without warn_only)"
    if d % 8:
        return f"needs head_dim to be a multiple of 8, got {d}"
    rule = cudnn_d256_rule(torch_version)
    shown = Version(torch_version).public   # without the build's local tag (+cu130)
    sm107_newer_than = rule["sm107_newer_than"] if tuple(cap) == (10, 7) else None
    wide = (rule["capability"](cap) and cudnn_version is not None and cudnn_version > rule["newer_than"]
            and (sm107_newer_than is None or cudnn_version > sm107_newer_than))
    limit = 256 if wide else 128
    if d > limit:
        needs = ("compute capability 9.0 and cuDNN 9.10 or newer" if not rule["backward_gap"]
                 else "compute capability 9.0 or 10.x and a cuDNN newer than 9.22")
        return (f"supports head_dim <= {limit} here, got {d} (with torch {shown}, 256 needs "
                f"{needs}; this is {_sm(cap)} with cuDNN {cudnn_version})")
    if wide and rule["backward_gap"] and requires_grad and 128 < d < 256:
        return (f"computes gradients for head_dim <= 128 or exactly 256 on {_sm(cap)} "
                f"(torch {shown}), got {d}")
    return None


# ---- which backend SDPA tries first (torch 2.11-2.15, sdp_utils) ------------------------------

DEFAULT_PRIORITY = ("sdpa_flash", "sdpa_efficient", "sdpa_math", "sdpa_cudnn")
# torch 2.11-2.15 move cuDNN to the front on these capabilities with a runtime cuDNN newer than 9.15.0
# (sdp_utils.cpp's check_prefer_cudnn_attention; 91500 is the constant the CUDA 13 wheels of 2.13.0,
# 2.14.1 and 2.15.0 compare with); a build against CUDA older than 13.0 does so only
# on minor version 0 or 3 (sm_90, sm_100, sm_103): `(!minor || minor == 3)`.
CUDNN_FIRST_MAJORS = (9, 10)
# Before torch 2.9 no default order put cuDNN first: 2.5.1 made it opt-in after 2.5.0's bugs
# (pytorch/pytorch#138522) and #162073 put it first again on sm90/sm100 for 2.9. (2.5.0 itself
# tried cuDNN first on 9.x: its rules are not written down here.)
CUDNN_FIRST_FROM = (2, 9)
CUDNN_FIRST_AFTER = 91500
CUDNN_FIRST_MINORS_BEFORE_CUDA_13 = (0, 3)


def priority(cap: tuple[int, int], cudnn_version: Optional[int], *, deprioritized: bool = False,
             deterministic: bool = False, order=DEFAULT_PRIORITY, cuda_version: Optional[str] = None,
             torch_version: Optional[str] = None) -> list[str]:
    """The order an unpinned SDPA call on a GPU of capability ``cap`` tries its backends.

    ``order`` is the base order (``sdpa_kernel([...], set_priority=True)`` changes it). On
    capability 9.x and 10.x with cuDNN newer than 9.15.0, cuDNN goes first, unless
    ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` (``deprioritized``). Deterministic algorithms do not
    change the order (sdp_utils.cpp): cuDNN keeps its place and fails its own check
    (``check_cudnn_deterministic``, see ``gpu_input_reason``); ``deterministic`` is accepted here
    only so callers can pass one set of settings to both.
    ``cuda_version`` is the CUDA torch was built with (``torch.version.cuda``): before 13.0,
    only minor versions 0 and 3 put cuDNN first. None reads as 13.0 or newer.
    ``torch_version``: whose order (default: the installed torch's); before 2.9, never cuDNN first.
    """
    order = list(order)
    release = Version(torch_version or torch.__version__).release[:3]
    if release == (2, 5, 0):
        raise ValueError("torch 2.5.0 put cuDNN first on compute capability 9.x by rules the course does not "
                         "model (2.5.1 made cuDNN opt-in); ask about 2.5.1 or newer")
    if release[:2] < CUDNN_FIRST_FROM:
        return order
    cuda_major = Version(cuda_version).major if cuda_version else None
    minor_ok = cuda_major is None or cuda_major >= 13 or cap[1] in CUDNN_FIRST_MINORS_BEFORE_CUDA_13
    cudnn_first = (cap[0] in CUDNN_FIRST_MAJORS and minor_ok and cudnn_version is not None
                   and cudnn_version > CUDNN_FIRST_AFTER and not deprioritized)
    if cudnn_first and "sdpa_cudnn" in order:
        order.remove("sdpa_cudnn")
        order.insert(0, "sdpa_cudnn")
    return order


def predicted_backend(cap: tuple[int, int], dtype: torch.dtype, head_dim: int, *,
                      cudnn_version: Optional[int] = None, deprioritized: bool = False,
                      deterministic: bool = False, order=DEFAULT_PRIORITY, cuda_version: Optional[str] = None,
                      torch_version: Optional[str] = None, requires_grad: bool = False) -> str:
    """The backend an unpinned causal SDPA call (Sq == Sk, no mask) should pick on that GPU:
    the first in ``priority`` whose rules accept the inputs. Math accepts everything.
    ``torch_version``: whose rules (default: the installed torch's)."""
    for name in priority(cap, cudnn_version, deprioritized=deprioritized, deterministic=deterministic, order=order,
                         cuda_version=cuda_version, torch_version=torch_version):
        if name == "sdpa_math" or gpu_input_reason(name, cap, dtype, head_dim, deterministic=deterministic,
                                                   cudnn_version=cudnn_version, torch_version=torch_version,
                                                   requires_grad=requires_grad) is None:
            return name
    return "sdpa_math"


def predicted_backend_here(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """``predicted_backend`` for this machine's GPU, cuDNN, environment and deterministic mode."""
    import os

    return predicted_backend(torch.cuda.get_device_capability(device), dtype, head_dim,
                             cudnn_version=torch.backends.cudnn.version(),
                             deprioritized=os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1",
                             deterministic=torch.are_deterministic_algorithms_enabled(),
                             cuda_version=torch.version.cuda)


# Chapter 3's five GPUs and settings: (GPU, capability, dtype, TORCH_CUDNN_SDPA_DEPRIORITIZED, why it is there).
PREDICTION_CASES = (("A100 (sm_80)", (8, 0), torch.bfloat16, False, "the default order"),
                    ("H200 (sm_90)", (9, 0), torch.bfloat16, False, "cuDNN first"),
                    ("H200 (sm_90)", (9, 0), torch.bfloat16, True, "TORCH_CUDNN_SDPA_DEPRIORITIZED=1"),
                    ("H200 (sm_90)", (9, 0), torch.float32, False, "flash and cuDNN take 16 bits only"),
                    ("T4 (sm_75)", (7, 5), torch.float16, False, "no flash before sm_80"))


def predictions(cases=PREDICTION_CASES, head_dim: int = 64, cudnn_version: int = 92000) -> "pd.DataFrame":
    """One row per case of ``cases`` (see ``PREDICTION_CASES``), indexed by GPU: the backend
    ``predicted_backend`` says an unpinned SDPA call picks, the dtype, and why the case is there."""
    import pandas as pd

    # The answer first: a reader sees it without scrolling on a narrow page.
    rows = [{"GPU": gpu,
             "unpinned SDPA picks": predicted_backend(cap, dt, head_dim, cudnn_version=cudnn_version, deprioritized=dep),
             f"dtype (head dim {head_dim})": str(dt).replace("torch.", ""), "why this row": note}
            for gpu, cap, dt, dep, note in cases]
    return pd.DataFrame(rows).set_index("GPU")


# ---- the same rules, asked about this machine ------------------------------------------------

def device_reason(name: str, device: torch.device) -> Reason:
    """Why backend ``name`` cannot run on ``device`` at all (None if it can)."""
    if name == "sdpa_math":
        return None
    if name == "sdpa_flash" and device.type == "cpu":
        return None  # PyTorch ships a CPU flash kernel, and it is the CPU default
    if device.type == "cpu":
        label = {"sdpa_efficient": "memory-efficient", "sdpa_cudnn": "cuDNN"}[name]
        return (f"PyTorch has no CPU kernel for the {label} backend "
                "(on CPU, SDPA raises 'No viable backend'); it needs a CUDA GPU")
    return cuda_reason(device) or capability_reason(name, capability(device))


def input_reason(name: str, q: torch.Tensor, k: Optional[torch.Tensor] = None, causal: bool = True) -> Reason:
    """Why backend ``name`` cannot take these particular inputs on their device (None if it can)."""
    if q.device.type != "cuda" or name == "sdpa_math":
        return None
    return gpu_input_reason(name, capability(q.device), q.dtype, q.shape[-1],
                            deterministic=torch.are_deterministic_algorithms_enabled(),
                            cudnn_version=torch.backends.cudnn.version(),
                            requires_grad=torch.is_grad_enabled() and any(
                                t is not None and t.requires_grad for t in (q, k)))


# ---- the call ----------------------------------------------------------------------------------

def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # Every fused backend needs stride 1 along head_dim ("All fused kernels require the last
    # dimension of the input to have stride 1"); any other stride is made here, with a copy.
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _causal_args(name: str, q, k, causal: bool, scale: float) -> dict:
    """``is_causal``/``attn_mask`` for SDPA that give bottom-right causal attention.

    SDPA's ``is_causal`` is top-left: right only when Sq == Sk. With one query (decoding) the
    bottom-right mask hides nothing, so the call is simply not causal. Otherwise flash on a GPU
    gets ``causal_lower_right`` (PyTorch then runs its flash kernel with its native bottom-right
    causal); every other backend gets the explicit boolean mask.
    """
    s_q, s_k = q.shape[-2], k.shape[-2]
    if not causal or (s_q == 1 and s_k > 1):
        return dict(is_causal=False)
    # PyTorch's CPU flash kernel returns NaN for is_causal with scale <= 0 (torch 2.13: most rows
    # of a causal B1 H2 S31 D64 call); given the same causal pattern as a mask it is right.
    cpu_flash_bug = name == "sdpa_flash" and q.device.type == "cpu" and scale <= 0
    if s_q == s_k and not cpu_flash_bug:
        return dict(is_causal=True)
    if name == "sdpa_flash" and q.device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right
        return dict(is_causal=False, attn_mask=causal_lower_right(s_q, s_k))
    return dict(is_causal=False, attn_mask=~future_mask(s_q, s_k, q.device))   # SDPA's mask: True = keep


def _flash_lower_right_reason(q, k, v) -> Reason:
    """Why PyTorch's flash kernel cannot take these inputs for ``causal_lower_right``.

    ``causal_lower_right`` falls back to another kernel when flash cannot run, which would
    run a different backend under the name ``sdpa_flash``: ask first, and refuse instead.
    """
    from torch.backends.cuda import SDPAParams, can_use_flash_attention
    params = SDPAParams(q, k, v, None, 0.0, False, q.shape[1] != k.shape[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = can_use_flash_attention(params, debug=True)
    return None if ok else "PyTorch's flash kernel refused these inputs: " + _warning_text(caught)


def _warning_text(caught) -> str:
    # PyTorch explains a refused backend in warnings ("Flash attention kernel not used because:",
    # then the reason); keep their first lines, without the "(Triggered internally at ...)" tail.
    lines = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
    return " ".join(line for line in lines if line) or "no reason given"


def pinned(name: str):
    """The registry function for one backend: SDPA under ``sdpa_kernel(backend)``."""
    backend = BACKENDS[name]

    def attention(q, k, v, causal=True, scale=None):
        scale = resolve_scale(scale, q.shape[-1], name)
        reason = input_reason(name, q, k, causal)
        if reason:
            raise CannotRun(f"{name}: {reason}")
        if name != "sdpa_math":
            q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        args = _causal_args(name, q, k, causal, scale)
        if "attn_mask" in args and not isinstance(args["attn_mask"], torch.Tensor):
            reason = _flash_lower_right_reason(q, k, v)
            if reason:
                raise CannotRun(f"{name}: {reason}")
        return _run(name, backend, q, k, v, scale, args)

    attention.__name__ = name
    attention.__doc__ = (f"F.scaled_dot_product_attention pinned to SDPBackend.{backend.name}, with "
                         "bottom-right causal alignment and enable_gqa when Hkv < Hq.")
    return attention


def _run(name, backend, q, k, v, scale, args):
    gqa = q.shape[1] != k.shape[1]
    if torch.compiler.is_compiling():
        # Under torch.compile the warning capture below would break the graph in two; the
        # compiled call keeps PyTorch's own errors and warnings as they are.
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa, **args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa, **args)
        except RuntimeError as err:
            # PyTorch's own refusal; keep its words and reasons, and say which pinned backend refused.
            why = f" ({_warning_text(caught)})" if caught else ""
            raise CannotRun(f"{name}: PyTorch refused these inputs: {err}{why}") from err
    for w in caught:  # a call that worked keeps its warnings (shown once per caller, as usual)
        warnings.warn(w.message, stacklevel=4)
    return out


for _order, _name in enumerate(BACKENDS):
    register(_name, order=30 + _order, requires=functools.partial(device_reason, _name),
             materializes_scores=_name == "sdpa_math")(pinned(_name))


def probe(q, k, v, causal: bool = True) -> dict[str, Reason]:
    """Try every backend on these inputs: ``{name: None}`` if it ran, else PyTorch's reason."""
    result: dict[str, Reason] = {}
    for name in BACKENDS:
        try:
            get(name)(q, k, v, causal=causal)
            result[name] = None
        except RuntimeError as err:
            result[name] = str(err)
    return result


def rule_reasons(names, device: torch.device, q: torch.Tensor, k: torch.Tensor) -> dict[str, Reason]:
    """Why each backend of ``names`` would refuse these inputs on ``device`` by the rules alone
    (``device_reason``, then ``input_reason``), without calling it: ``{name: None}`` if it takes them."""
    return {n: device_reason(n, device) or input_reason(n, q, k) for n in names}


def reasons_table(reasons: dict[str, Reason]) -> "pd.DataFrame":
    """``probe``'s or ``rule_reasons``' answers as a table: whether each backend runs, and why not."""
    import pandas as pd

    return pd.DataFrame({"runs on these inputs": {n: r is None for n, r in reasons.items()},
                         "why not": {n: r or "" for n, r in reasons.items()}})


def default_backend_name(q, k, v, causal: bool = True) -> str:
    """Which backend SDPA picks unpinned, as the first in its priority order that works here.

    Asked with the arguments the registry passes: ``enable_gqa`` when Hkv < Hq, and bottom-right
    causal (``is_causal`` when Sq == Sk, nothing to hide for one query, else an explicit mask).
    """
    args = _causal_args("sdpa_math", q, k, causal, 1.0)
    order = torch._fused_sdp_choice(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **args)
    return {b.value: n for n, b in BACKENDS.items()}.get(order, f"backend #{order}")


# The one fused kernel per forward that each backend launched in the source article's traces
# ("Profiling in PyTorch (Part 3)", Hugging Face blog, one A100-SXM4-80GB, bf16). The flash
# name is shortened where the article's screenshot shows a long template argument list.
ARTICLE_A100_KERNELS = {
    "sdpa_efficient": "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
    "sdpa_flash": "void pytorch_flash::flash_fwd_kernel<...>",
    "sdpa_cudnn": "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_6_128x64x64"
                  "_4x1x1_cga1x1x1_kernel0_0",
}


def safe_softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` that gives 0, not NaN, on a slice where every score is -inf.

    A plain softmax of a fully masked row computes exp(-inf) / sum(exp(-inf)) = 0 / 0.
    ATen's ``_safe_softmax`` (what the math backend calls) adds two guard passes over the
    scores, ``isneginf`` and ``all``, and a ``where`` that zeroes those rows: three more
    full passes over an S x S tensor, i.e. more kernels on a GPU.
    """
    probs = torch.softmax(scores, dim)
    fully_masked = torch.isneginf(scores).all(dim, keepdim=True)
    return torch.where(fully_masked, 0.0, probs)


def math_decomposed(q, k, v, causal: bool = True, scale=None) -> torch.Tensor:
    """SDPA's math backend written out op by op (ATen ``_scaled_dot_product_attention_math``).

    Same ops, same order, same result bit for bit where the query and key lengths are equal; each
    comment says what it costs. The causal mask follows the course's rule for Sq < Sk (the
    queries are the last Sq positions: bottom-right), where ATen's ``is_causal`` aligns top-left.
    """
    check_inputs(q, k, v, name="math_decomposed")
    out_dtype = q.dtype
    if out_dtype in HALF:
        # Accuracy first: 16-bit inputs are upcast to fp32, so on a GPU both matmuls run as
        # fp32 GEMMs on CUDA cores ("sgemm") instead of bf16 tensor-core ones ("s16816").
        q, k, v = q.float(), k.float(), v.float()
    # The scale is split in two square roots, one on q and one on k, to keep the products small
    # (a negative scale keeps its sign on q's root).
    scale = resolve_scale(scale, q.shape[-1])
    root = math.sqrt(abs(scale))
    q = q * (-root if scale < 0 else root)
    bias = None
    if causal:
        # Rebuilt on every call: ones -> tril -> where (0 where allowed, -inf above the diagonal).
        # The diagonal is shifted by Sk - Sq: bottom-right alignment, as kernels.get's implementations take it.
        s_q, s_k = q.shape[-2], k.shape[-2]
        allowed = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)   # [Sq, Sk]
        bias = torch.where(allowed, 0.0, float("-inf")).to(q.dtype)                       # [Sq, Sk]
    if q.shape[1] != k.shape[1]:
        # Grouped-query attention: the math backend repeats each K/V head for its query heads.
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)   # [B, Hq, Sk, D]
    scores = q @ (k.transpose(-2, -1) * root)       # [B, H, Sq, D] @ [B, H, D, Sk] -> [B, H, Sq, Sk]
    if bias is not None:
        scores.add_(bias)                           # [Sq, Sk] broadcast over B and H
    probs = safe_softmax(scores, -1)                # [B, H, Sq, Sk]
    return (probs @ v).to(out_dtype)                # [B, H, Sq, Sk] @ [B, H, Sk, D] -> [B, H, Sq, D]


# The op every SDPA call records, whichever backend it takes (chapter 3 reads the calls of a trace).
SDPA_OP = "aten::scaled_dot_product_attention"


# ---- FlashAttention-2's forward kernel, read from its name ----------------------------------------

_FLASH_TRAITS = re.compile(r"Flash_fwd_kernel_traits<\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false),"
                           r"\s*(true|false)")


@dataclass(frozen=True)
class FlashTiles:
    """The tile configuration a ``flash_fwd_kernel`` name carries in its template arguments
    (``Flash_fwd_kernel_traits<head_dim, block_m, block_n, warps, Q in registers, Q/K share
    shared memory, ...>``, FlashAttention-2's ``kernel_traits.h``)."""

    head_dim: int
    block_m: int      # query rows per thread block
    block_n: int      # key/value rows per step of its loop
    warps: int
    q_in_regs: bool
    share_q_k: bool

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, element_bytes: int = 2) -> int:
        """Shared memory the tiles take: a Q tile and a K and a V tile (kernel_traits.h's
        kSmemSize: Q + K/V, or the larger of the two when Q and K share it)."""
        q = self.block_m * self.head_dim * element_bytes
        kv = 2 * self.block_n * self.head_dim * element_bytes
        return max(q, kv) if self.share_q_k else q + kv

    def grid(self, batch: int, heads: int, seq_q: int) -> list[int]:
        """FlashAttention-2's forward grid: (query tiles, batch, heads)."""
        return [math.ceil(seq_q / self.block_m), batch, heads]


def flash_tiles(kernel_name: str) -> FlashTiles:
    """The tiles of a FlashAttention-2 forward kernel, from its full (demangled) name."""
    m = _FLASH_TRAITS.search(kernel_name)
    if m is None:
        raise ValueError(f"not a FlashAttention-2 forward kernel name with its template arguments: {kernel_name[:120]!r}")
    d, bm, bn, w = (int(x) for x in m.groups()[:4])
    return FlashTiles(d, bm, bn, w, m.group(5) == "true", m.group(6) == "true")
