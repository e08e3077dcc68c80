"""Chapter 4's tile configs: what the autotuner may try on a GPU, and what the interpreter uses.

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages). Any pair of powers of two works:
the causal stages are computed from the tile sizes, rounding down to a key-tile boundary.
Every kernel is handed one list of candidates, in the spirit of the autotune space of
Triton's tutorial 06-fused-attention (BLOCK_M {64, 128} x BLOCK_N {32, 64, 128} x stages x
warps, here with 32-row tiles too, which the backward and large head dims need), and a
rule on each config's footprint prunes it, as the tutorial's ``keep()`` does: what it holds
in shared memory must fit the GPU, what it holds in registers must leave room
(``values_per_thread``: accumulators, scores and operand tiles, within what the compile
sweep shows ptxas holds without spilling), and on Hopper the forward's 8 warps need a
128x128 tile. Fewer configs also mean a shorter autotuning: each is compiled and timed on
first use of every new key. What the compiler actually makes of each config (registers,
spills, shared memory) is chapter 4's look at the compiler, ``python -m
kernels.triton.compile_sweep``.
"""
from typing import Optional

import torch

from kernels.hw.occupancy import Launch
from kernels.triton import launch

PADDED_HEAD_DIMS = (16, 32, 64, 128, 256)
KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
# The candidates, largest tiles first. The first is the forward's largest tile.
GPU_CONFIGS = [(m, n, w, s) for m in (128, 64, 32) for n in (128, 64, 32) for w in (8, 4) for s in (3, 2)]


# The interpreter runs one program at a time, each tile operation one NumPy call, so fewer,
# larger tiles run faster (64x32 is about 3x quicker than 32x16). BLOCK_M = 2·BLOCK_N
# makes the causal diagonal span two key tiles, the case that needs care.
INTERPRETER_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 32}
# The backward's masked steps are half as tall (dK/dV) or wide (dQ) as its tiles, so 64x64
# tiles in the interpreter still take two masked steps per diagonal, the case that needs
# care, in half the steps of 64x32.
INTERPRETER_BACKWARD_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 64}
PREPROCESS_BLOCK_M = 64


def register_footprint(block_m: int, block_n: int, head_dim: int, kernel: str = "fwd") -> int:
    """The float32 values a program keeps in registers across its loop: its accumulators and
    one tile of scores. Forward and dQ: [BLOCK_M, HEAD_DIM] and [BLOCK_M, BLOCK_N]; dK/dV:
    two [BLOCK_N, HEAD_DIM] (dK and dV) and [BLOCK_N, BLOCK_M]."""
    if kernel in ("fwd", "bwd_dq"):
        return block_m * head_dim + block_m * block_n
    if kernel == "bwd_dkdv":
        return 2 * block_n * head_dim + block_n * block_m
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def operand_values(block_m: int, block_n: int, head_dim: int, kernel: str = "fwd", element_size: int = 2) -> int:
    """The registers (in float32 values) a program takes on top of `register_footprint`: the
    [rows, HEAD_DIM] operand tiles it holds across its loop (forward: Q; dK/dV: K and V; dQ:
    Q and dO) and the one it streams (forward and dQ: a K tile; dK/dV: a Q tile), at
    ``element_size`` bytes each, so two bf16 values to a register; and in the backward the
    second tile of scores, float32 (dP beside P: dK/dV [BLOCK_N, BLOCK_M], dQ [BLOCK_M,
    BLOCK_N])."""
    if kernel == "fwd":
        return (block_m * head_dim + block_n * head_dim) * element_size // 4
    if kernel == "bwd_dq":
        return (2 * block_m * head_dim + block_n * head_dim) * element_size // 4 + block_m * block_n
    if kernel == "bwd_dkdv":
        return (2 * block_n * head_dim + block_m * head_dim) * element_size // 4 + block_m * block_n
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def values_per_thread(config, head_dim: int, kernel: str = "fwd", element_size: int = 2) -> float:
    """What one thread of ``config`` holds in registers: `register_footprint` and
    `operand_values` over its ``num_warps`` x 32 threads."""
    block_m, block_n, warps, _ = config
    values = register_footprint(block_m, block_n, head_dim, kernel) + \
        operand_values(block_m, block_n, head_dim, kernel, element_size)
    return values / (32 * warps)


# Values per thread (`values_per_thread`) a config may keep, of 255 registers, the rest for
# addresses, masks and loop state. Checked against the compile sweep (bf16, every config of
# every kernel and head dim, ``python -m kernels.triton.compile_sweep --target sm_80|sm_90``).
# Counting the accumulators and one score tile alone (the rule before), with 80 values a
# thread on sm_80 and 128 on sm_90, the pruning kept 42 configs that ptxas spills (up to
# 1,316 bytes), most at D = 128 and 256, where the operand tiles the count left out grow
# with D: a 32x128 forward tile with 4 warps at D = 128 counted 64 values a thread, and took
# 255 registers and spilled on both targets. With the operands and the backward's second
# score tile counted, and the backward's tile shapes as `streams_the_shorter_tile` says,
# 80 values a thread keep nothing that spills on sm_90 (106 configs); sm_80, whose mma.sync
# takes both operands from registers, spills a dQ 64x64 tile with 8 warps at D = 64 at 72
# (32 bytes), so its budget is 68 (96 configs). Below 68 the forward keeps nothing at
# D = 256. At D = 256 the backward holds more even in a 32x32 tile with 8 warps:
# `fitting_configs` then keeps that one (about 190 registers, no spills on either target).
VALUES_PER_THREAD = {8: 68, 9: 80}
DEFAULT_VALUES_PER_THREAD = 80
# What no count of values separates, so `keep` names it: ptxas caps a few 8-warp sm_80
# forward configs at D <= 32 at 128 registers and spills 8 bytes of them, where the same tile
# with the other stage count spills nothing (the sweep, bf16). Of these the footprint rule
# alone would keep 128x64 with 3 stages at D = 32. Keyed by (capability major, kernel, padded
# head dim) -> configs.
PTXAS_SPILLS = {
    (8, "fwd", 16): {(64, 64, 8, 2)},
    (8, "fwd", 32): {(128, 64, 8, 3), (64, 64, 8, 3)},
}


def shared_memory_estimate(block_m: int, block_n: int, num_stages: int, head_dim: int,
                           element_size: int, kernel: str = "fwd") -> int:
    """Bytes of shared memory a config needs, an upper bound of what Triton allocates.

    Written from what each kernel keeps in shared memory, and checked against the
    compiler's ``metadata.shared`` (tests/triton/test_compile_sweep.py: never below it):

    * forward: the Q tile, plus ``num_stages`` buffered K and V tiles for the pipelined loads.
    * dK/dV: K and V of its key tile; ``num_stages`` buffered Q and dO tiles with their rows'
      LSE and Delta (fp32), and at least two even for ``num_stages`` = 1 (the loop is not
      pipelined then, and its loads change layout through shared memory instead); one
      [BLOCK_M, BLOCK_N] tile on the way to the tensor cores.
    * dQ: Q and dO of its rows, plus ``num_stages`` buffered K and V tiles.
    """
    if kernel == "fwd":
        return (block_m + 2 * num_stages * block_n) * head_dim * element_size
    if kernel == "bwd_dkdv":
        buffered = max(num_stages, 2)
        return ((2 * block_n + 2 * buffered * block_m) * head_dim * element_size
                + 2 * buffered * block_m * 4 + block_m * block_n * element_size)
    if kernel == "bwd_dq":
        return (2 * block_m + 2 * num_stages * block_n) * head_dim * element_size
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def streams_the_shorter_tile(config, kernel: str = "fwd") -> bool:
    """The backward streams its other operand past the tile it holds: dK/dV holds BLOCK_N
    keys and streams BLOCK_M queries, dQ holds BLOCK_M queries and streams BLOCK_N keys. As in
    Triton's tutorial (dK/dV 32 x 128, dQ 128 x 32), the streamed tile must not be the longer
    one: the compile sweep shows dK/dV 128x32 and 128x64 tiles at D = 32 spilling with 8 warps
    on sm_80 and sm_90, within the register budget, and dQ 64x128 at D = 64 spilling 376 bytes
    on sm_80. The forward holds no such choice (True)."""
    block_m, block_n = config[0], config[1]
    if kernel == "bwd_dkdv":
        return block_m <= block_n
    if kernel == "bwd_dq":
        return block_n <= block_m
    return True


def budget(capability=None) -> int:
    """`VALUES_PER_THREAD` of a GPU of ``capability`` (major, minor); the default without one."""
    if not capability:
        return DEFAULT_VALUES_PER_THREAD
    return VALUES_PER_THREAD.get(tuple(capability)[0], DEFAULT_VALUES_PER_THREAD)


def keep(config, head_dim: int, element_size: int, smem_limit: int, kernel: str = "fwd", capability=None) -> bool:
    """Whether a config's footprint suits the GPU: its shared memory fits ``smem_limit``, and
    what a thread holds in registers (`values_per_thread`: accumulators, scores and operand
    tiles) fits the budget of ``capability`` (``VALUES_PER_THREAD``) with the fewest warps
    that hold it, 4 or 8: 8 warps on a tile 4 can hold leave warps idle (the rule Triton's
    tutorial applies on Hopper, 8 warps only for 128x128 tiles, drawn from the footprint).
    The budget is what the compile sweep shows ptxas holds without spilling; what it spills
    within the budget is named in ``PTXAS_SPILLS``."""
    block_m, block_n, warps, stages = config
    if not streams_the_shorter_tile(config, kernel):
        return False
    if capability and tuple(config) in PTXAS_SPILLS.get((tuple(capability)[0], kernel, head_dim), ()):
        return False
    per_thread = budget(capability)
    fewest_warps = 4 if values_per_thread((block_m, block_n, 4, stages), head_dim, kernel, element_size) \
        <= per_thread else 8
    return (shared_memory_estimate(block_m, block_n, stages, head_dim, element_size, kernel) <= smem_limit
            and warps == fewest_warps
            and values_per_thread(config, head_dim, kernel, element_size) <= per_thread)


def fitting_configs(configs, seq: int, head_dim: int, element_size: int, smem_limit: int,
                    kernel: str = "fwd", capability=None, seq_k=None):
    """The configs `keep` keeps whose tiles are not much longer than the sequence (BLOCK_M
    than the queries, ``seq``; BLOCK_N than the keys, ``seq_k``, by default ``seq``).

    Always returns at least one config: if nothing passes, the one whose threads hold the
    fewest values (`values_per_thread`), and of those the smallest shared memory estimate:
    the one least likely to spill, and to overflow shared memory (the backward at D = 256,
    where even a 32x32 tile with 8 warps is over ``VALUES_PER_THREAD``, and compiles with
    about 190 registers and no spills on sm_80 and sm_90).
    """
    longest_m = max(16, launch.next_power_of_2(seq))
    longest_n = max(16, launch.next_power_of_2(seq if seq_k is None else seq_k))
    kept = [c for c in configs if c[0] <= longest_m and c[1] <= longest_n
            and keep(c, head_dim, element_size, smem_limit, kernel, capability)]
    if kept:
        return kept
    return [min(configs, key=lambda c: (values_per_thread(c, head_dim, kernel, element_size),
                                        shared_memory_estimate(c[0], c[1], c[3], head_dim, element_size, kernel)))]


def forward_launches(batch_heads: Optional[int], seq: Optional[int], head_dim: Optional[int], element_size: int,
                     capability, smem_limit: int) -> list:
    """The launches the forward may make for one attention call, one per config the pruning
    keeps (the autotuner times these and runs one): grid (B·H, cdiv(S, BLOCK_M)), as
    ``flash_forward`` builds it, ``num_warps`` x 32 threads, and `shared_memory_estimate`
    (an upper bound of Triton's). Registers are left unknown: only a compile tells them.
    Of configs differing only in stages, the deepest is kept."""
    if batch_heads is None or seq is None or head_dim is None:   # a trace that recorded no shapes
        raise ValueError(f"batch_heads, seq and head_dim must be known, got {batch_heads}, {seq}, {head_dim}")
    if min(batch_heads, seq, head_dim, element_size) < 1:
        raise ValueError(f"batch_heads, seq, head_dim and element_size must be >= 1, got "
                         f"{batch_heads}, {seq}, {head_dim}, {element_size}")
    padded = launch.padded_head_dim(head_dim)
    kept = fitting_configs(GPU_CONFIGS, seq, padded, element_size, smem_limit, kernel="fwd", capability=capability)
    deepest: dict = {}
    for m, n, w, s in kept:
        deepest[m, n, w] = max(s, deepest.get((m, n, w), 0))
    return [Launch(f"attn_fwd {m}x{n}, {w} warps, {s} stages", (batch_heads, -(-seq // m), 1), 32 * w, None,
                   shared_memory_estimate(m, n, s, padded, element_size, "fwd"),
                   "configs: kept by the pruning")
            for (m, n, w), s in deepest.items()]


def pruner(kernel: str):
    """The autotuner's ``early_config_prune`` hook for ``kernel``: at each new key it reads the
    launch's GPU (capability, opt-in shared memory) and lengths, and keeps ``fitting_configs``."""
    def prune(configs, named_args, **kwargs):
        """early_config_prune hook: the configs `fitting_configs` keeps for this launch."""
        args = {**named_args, **kwargs}
        q = args["Q"]
        props = torch.cuda.get_device_properties(q.device)
        limit = getattr(props, "shared_memory_per_block_optin", 48 * 1024)
        as_tuple = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages): c for c in configs}
        kept = fitting_configs(list(as_tuple), args["SQ"], args["HEAD_DIM"], q.element_size(), limit,
                               kernel=kernel, capability=(props.major, props.minor), seq_k=args["SK"])
        return [as_tuple[t] for t in kept]
    return prune


def autotuned(kernel, name: str):
    """On a GPU, wrap ``kernel`` in @triton.autotune, keyed on the lengths and the shapes the
    tiles depend on; in the interpreter (where autotune fails) return it unchanged, to be
    launched with INTERPRETER_BLOCKS (the backward with INTERPRETER_BACKWARD_BLOCKS)."""
    if launch.INTERPRETED or launch.TRITON_MISSING:
        return kernel
    configs = [launch.triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in GPU_CONFIGS]
    return launch.triton.autotune(configs=configs, key=["SQ", "SK", "GROUP", "HEAD_DIM", "CAUSAL"],
                                  prune_configs_by={"early_config_prune": pruner(name)})(kernel)
