"""Chapter 4's tile sizes: what the autotuner may try on a GPU, and what the interpreter uses.

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages). Any pair of powers of two works:
the causal stages are computed from the tile sizes, rounding down to a key-tile boundary.
What fits depends on the head dim: the tiles held on-chip grow with it. So each kernel
has a space per padded head dim, in the spirit of the autotune space of Triton's tutorial
06-fused-attention (BLOCK_M {64, 128} x BLOCK_N {32, 64, 128} x stages x warps), narrowed
to configs that the compiler says fit and do not spill on sm_80 and sm_90
(``python -m kernels.triton.compile_sweep`` compiles them all; tests/triton/test_compile_sweep.py
checks the pruning against the compiler). Fewer configs also mean a shorter autotuning:
each is compiled and timed on first use of every new key.
"""
import torch

from kernels.triton import launch

PADDED_HEAD_DIMS = (16, 32, 64, 128, 256)
_FWD_SMALL_D = [(128, 128, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
FORWARD_SPACE = {
    16: _FWD_SMALL_D,
    32: _FWD_SMALL_D,
    64: [(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3),
         (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 2)],
    128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3),
          (64, 128, 8, 2), (64, 64, 8, 3), (128, 32, 8, 2), (64, 32, 4, 2)],
    256: [(128, 64, 8, 2), (64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 4, 3), (32, 32, 4, 2)],
}
# The backward kernels hold more per program. dK/dV keeps K, V and two fp32 accumulators of
# its BLOCK_N keys and streams query tiles of BLOCK_M past them: 128-key tiles, as in Triton's
# tutorial, with 8 warps from D = 64 on (with 4, the tutorial's count, ptxas spills there on
# both targets), and at D = 256 only 32-key tiles hold without spilling. dQ keeps Q, dO and
# one accumulator of its BLOCK_M rows and streams key tiles of BLOCK_N: 128-row tiles where
# they fit.
_DKDV_SMALL_D = [(64, 128, 8, 2), (32, 128, 4, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3), (32, 32, 4, 2)]
DKDV_SPACE = {
    16: _DKDV_SMALL_D,
    32: _DKDV_SMALL_D,
    64: [(64, 128, 8, 2), (32, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3),
         (32, 32, 4, 2)],
    128: [(32, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 2), (32, 64, 8, 2), (32, 64, 4, 2), (32, 32, 8, 2)],
    256: [(32, 32, 8, 2), (32, 32, 8, 1), (16, 32, 4, 1)],
}
_DQ_SMALL_D = [(128, 128, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
DQ_SPACE = {
    16: _DQ_SMALL_D,
    32: _DQ_SMALL_D,
    64: [(128, 64, 8, 3), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)],
    128: [(128, 64, 8, 2), (128, 32, 8, 3), (128, 32, 8, 2), (64, 128, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2)],
    256: [(128, 32, 8, 2), (64, 32, 8, 2), (32, 64, 4, 2), (32, 32, 4, 2)],
}
# The TMA forward tries the forward's configs (its tiles are the same; only the loads differ).
_SPACES = {"fwd": FORWARD_SPACE, "fwd_tma": FORWARD_SPACE, "bwd_dkdv": DKDV_SPACE, "bwd_dq": DQ_SPACE}
KERNELS = ("fwd", "fwd_tma", "bwd_dkdv", "bwd_dq")
TMA_KERNELS = ("fwd_tma",)


def kernels_for(capability) -> tuple:
    """The kernels a GPU of ``capability`` (major, minor) may launch: the TMA forward on sm_90 only."""
    hopper = capability is not None and tuple(capability)[0] == 9
    return tuple(k for k in KERNELS if hopper or k not in TMA_KERNELS)

# Configs that fit an architecture's shared memory but that ptxas spills there, by Triton
# release (major, minor) and compute capability major; the pruning drops them on that
# architecture. Each table is measured with its release (bf16, every config the autotuner may
# try: ``python -m kernels.triton.compile_sweep --target sm_80|sm_90 --json``, the rows that fit
# and spill), because what spills is the compiler's decision and changes between releases:
# Triton 3.9 spills four sm_90 configs that 3.7.1 holds in registers, and on sm_80 two that
# 3.7.1 holds while holding two it spilled; 3.6.0 spills two on sm_80 and two on sm_90 that
# 3.7.1 holds; 3.8.0 (ptxas 12.9, where 3.6 and 3.7 ship 12.8) spills two on sm_80 that 3.7.1
# holds while holding one it spilled. Measured: 3.6.0, 3.7.1, 3.8.0 and 3.9. (3.7's sm_80 table
# also lists dQ's 128x32 tile at D = 256, which spills there but does not fit sm_80's shared
# memory, so the pruning drops it anyway.) A release without a table (before 3.6, after 3.9)
# gets every config that spilled on that architecture with any measured release. Ampere's
# mma.sync takes both operands from registers, where Hopper's wgmma reads one from shared
# memory, so sm_80 runs out of registers on tiles that sm_90 holds.
# tests/triton/test_compile_sweep.py fails when a kept config spills with the Triton that runs
# it, which is how a new release's changes are found (``make test-compat``).
_SPILLS_SM80_37 = {
    ("fwd", 64): {(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3)},
    ("fwd", 128): {(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)},
    ("fwd", 256): {(128, 64, 8, 2), (64, 32, 4, 3)},
    ("bwd_dkdv", 64): {(64, 128, 8, 3), (64, 64, 4, 3)},
    ("bwd_dkdv", 128): {(32, 128, 8, 2), (32, 128, 8, 3)},
    ("bwd_dq", 64): {(128, 64, 8, 3), (64, 64, 4, 3)},
    ("bwd_dq", 128): {(128, 64, 8, 2)},
    ("bwd_dq", 256): {(128, 32, 8, 2)},
}
SPILLS_BY_TRITON = {
    (3, 6): {
        8: {
            ("fwd", 64): {(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3)},
            ("fwd", 128): {(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)},
            ("fwd", 256): {(128, 64, 8, 2), (64, 32, 4, 3)},
            ("bwd_dkdv", 64): {(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3)},
            ("bwd_dkdv", 128): {(32, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 2)},
            ("bwd_dq", 64): {(128, 64, 8, 3), (64, 64, 4, 3)},
            ("bwd_dq", 128): {(128, 64, 8, 2)},
        },
        9: {
            ("fwd", 256): {(128, 64, 8, 2)},           # 8 bytes (Hopper pruning drops it too)
            ("fwd_tma", 256): {(32, 32, 4, 2)},        # 108 bytes
            ("bwd_dq", 256): {(32, 64, 4, 2)},         # 8 bytes
        },
    },
    (3, 7): {
        8: _SPILLS_SM80_37,
        9: {("fwd_tma", 256): {(32, 32, 4, 2)}},
    },
    (3, 8): {
        8: {
            ("fwd", 64): {(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3)},
            ("fwd", 128): {(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4)},
            ("fwd", 256): {(128, 64, 8, 2), (64, 64, 8, 2), (64, 32, 4, 3)},
            ("bwd_dkdv", 64): {(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3)},
            ("bwd_dkdv", 128): {(32, 128, 8, 2), (32, 128, 8, 3)},
            ("bwd_dq", 64): {(128, 64, 8, 3), (64, 64, 4, 3)},
            ("bwd_dq", 128): {(128, 64, 8, 2)},
        },
        9: {("fwd_tma", 256): {(32, 32, 4, 2)}},       # 8 bytes
    },
    (3, 9): {
        8: {
            ("fwd", 64): {(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3), (128, 64, 4, 4), (64, 128, 4, 3)},
            ("fwd", 128): {(128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4)},
            ("fwd", 256): {(64, 64, 8, 2), (64, 32, 4, 3)},
            ("bwd_dkdv", 64): {(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3)},
            ("bwd_dkdv", 128): {(32, 128, 8, 2), (32, 128, 8, 3)},
            ("bwd_dq", 64): {(128, 64, 8, 3), (64, 64, 4, 3)},
            ("bwd_dq", 128): {(128, 64, 8, 2)},
        },
        9: {
            ("fwd", 128): {(128, 128, 8, 2)},          # 32 bytes
            ("fwd_tma", 256): {(32, 32, 4, 2)},        # 56 bytes
            ("bwd_dq", 128): {(64, 128, 8, 2)},        # 80 bytes
            ("bwd_dq", 256): {(32, 64, 4, 2)},         # 208 bytes
        },
    },
}


def spilling_configs(triton_version=None) -> dict:
    """{capability major: {(kernel, head_dim): configs}} that ptxas spills with ``triton_version``
    (default: the installed Triton): per capability, the table measured with that release
    (3.6 to 3.9 are, by major and minor), and where none was (before 3.6, after 3.9), every
    config that spilled with any measured release (the safe side; the compile sweep's test
    then says what changed)."""
    if triton_version is None:
        triton_version = getattr(launch.triton, "__version__", None)
    measured = SPILLS_BY_TRITON.get(_release(triton_version), {}) if triton_version else {}
    union: dict = {}
    for table in SPILLS_BY_TRITON.values():
        for capability, configs in table.items():
            for key, spilled in configs.items():
                union.setdefault(capability, {}).setdefault(key, set()).update(spilled)
    return {capability: measured.get(capability, configs) for capability, configs in union.items()}


def _release(version: str) -> tuple:
    """(major, minor) of "3.9.0", "3.10.0+git1234"."""
    major, minor = (str(version).split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# What the installed Triton spills (see SPILLS_BY_TRITON).
SPILLS = spilling_configs()


def config_space(kernel: str, head_dim: int) -> list:
    """The configs the autotuner may try for ``kernel`` at padded ``head_dim``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if head_dim not in PADDED_HEAD_DIMS:
        raise ValueError(f"head_dim must be a padded one, {PADDED_HEAD_DIMS}, got {head_dim}")
    return list(_SPACES[kernel][head_dim])


# Every config of every space, the list handed to @triton.autotune; the prune hook narrows it
# to the space of the call's head dim. The first is the forward's largest tile.
GPU_CONFIGS = list(dict.fromkeys(c for space in _SPACES.values() for d in PADDED_HEAD_DIMS for c in space[d]))
# The interpreter runs one program at a time, each tile operation one NumPy call, so fewer,
# larger tiles run faster (64x32 is about 3x quicker than 32x16). BLOCK_M = 2·BLOCK_N
# makes the causal diagonal span two key tiles, the case that needs care.
INTERPRETER_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 32}
# The backward's masked steps are half as tall (dK/dV) or wide (dQ) as its tiles, so 64x64
# tiles in the interpreter still take two masked steps per diagonal, the case that needs
# care, in half the steps of 64x32.
INTERPRETER_BACKWARD_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 64}
PREPROCESS_BLOCK_M = 64


def shared_memory_estimate(block_m: int, block_n: int, num_stages: int, head_dim: int,
                           element_size: int, kernel: str = "fwd") -> int:
    """Bytes of shared memory a config needs, an upper bound of what Triton allocates.

    Written from what each kernel keeps in shared memory, and checked against the
    compiler's ``metadata.shared`` (tests/triton/test_compile_sweep.py: never below it):

    * forward: the Q tile, plus ``num_stages`` buffered K and V tiles for the pipelined loads.
      The TMA forward adds 1 KiB: its copies' barriers, in an allocation aligned to the
      1 KiB that 128-byte-swizzled tiles need.
    * dK/dV: K and V of its key tile; ``num_stages`` buffered Q and dO tiles with their rows'
      LSE and Delta (fp32), and at least two even for ``num_stages`` = 1 (the loop is not
      pipelined then, and its loads change layout through shared memory instead); one
      [BLOCK_M, BLOCK_N] tile on the way to the tensor cores.
    * dQ: Q and dO of its rows, plus ``num_stages`` buffered K and V tiles.
    """
    if kernel in ("fwd", "fwd_tma"):
        return (block_m + 2 * num_stages * block_n) * head_dim * element_size + (1024 if kernel == "fwd_tma" else 0)
    if kernel == "bwd_dkdv":
        buffered = max(num_stages, 2)
        return ((2 * block_n + 2 * buffered * block_m) * head_dim * element_size
                + 2 * buffered * block_m * 4 + block_m * block_n * element_size)
    if kernel == "bwd_dq":
        return (2 * block_m + 2 * num_stages * block_n) * head_dim * element_size
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def hopper_pruned(config, capability) -> bool:
    """On sm_90, 8 warps on a tile smaller than 128x128 leave warps idle (Triton's tutorial
    06-fused-attention prunes these configs on Hopper the same way)."""
    block_m, block_n, warps, _ = config
    return capability is not None and tuple(capability)[0] == 9 and warps == 8 and block_m * block_n < 128 * 128


def fitting_configs(configs, seq: int, head_dim: int, element_size: int, smem_limit: int,
                    kernel: str = "fwd", capability=None, seq_k=None, spills=None):
    """The configs whose tiles fit in shared memory and are not much longer than the sequence
    (BLOCK_M than the queries, ``seq``; BLOCK_N than the keys, ``seq_k``, by default ``seq``),
    less the configs the compiler spills on ``capability`` (SPILLS), less, for the forward,
    those Hopper pruning drops when ``capability`` is (9, x). (The
    backward's tiles are smaller than 128x128 and need their 8 warps to hold the dK/dV
    accumulators, so the rule is not applied to them, as the tutorial applies it to its
    forward only.)

    ``spills``: another Triton release's table (``spilling_configs(version)``), for a plan made
    for a GPU machine whose Triton is not the one installed here.

    Always returns at least one config: if nothing passes, the smallest one.
    """
    longest_m = max(16, launch.next_power_of_2(seq))
    longest_n = max(16, launch.next_power_of_2(seq if seq_k is None else seq_k))

    def estimate(c):
        return shared_memory_estimate(c[0], c[1], c[3], head_dim, element_size, kernel)

    table = SPILLS if spills is None else spills
    spilled = table.get(tuple(capability)[0], {}).get((kernel, head_dim), set()) if capability else set()
    kept = [c for c in configs
            if estimate(c) <= smem_limit and c[0] <= longest_m and c[1] <= longest_n
            and not (kernel in ("fwd", "fwd_tma") and hopper_pruned(c, capability)) and tuple(c) not in spilled]
    if kept:
        return kept
    return [min(configs, key=estimate)]


def _pruner(kernel: str):
    def prune(configs, named_args, **kwargs):
        """early_config_prune hook: the head dim's space, less what `fitting_configs` drops."""
        args = {**named_args, **kwargs}
        q = getattr(args["Q"], "base", args["Q"])   # the TMA forward's Q is a descriptor
        props = torch.cuda.get_device_properties(q.device)
        limit = getattr(props, "shared_memory_per_block_optin", 48 * 1024)
        as_tuple = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages): c for c in configs}
        space = set(config_space(kernel, args["HEAD_DIM"]))
        # A caller (a test) may have narrowed kernel.configs to configs outside the space: keep those.
        candidates = [t for t in as_tuple if t in space] or list(as_tuple)
        kept = fitting_configs(candidates, args["SQ"], args["HEAD_DIM"], q.element_size(), limit,
                               kernel=kernel, capability=(props.major, props.minor), seq_k=args["SK"])
        return [as_tuple[t] for t in kept]
    return prune


def autotuned(kernel, name: str):
    """On a GPU, wrap ``kernel`` in @triton.autotune; in the interpreter (where autotune
    fails) return it unchanged and launch it with INTERPRETER_BLOCKS (the backward with
    INTERPRETER_BACKWARD_BLOCKS).

    The key holds the lengths rounded up to powers of two (SQ_BUCKET, SK_BUCKET), not the
    lengths themselves: a new length re-tunes only when it crosses a power of two.
    """
    if launch.INTERPRETED or launch.TRITON_MISSING:
        return kernel
    configs = [launch.triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in GPU_CONFIGS]
    return launch.triton.autotune(configs=configs, key=["SQ_BUCKET", "SK_BUCKET", "GROUP", "HEAD_DIM", "CAUSAL"],
                                  prune_configs_by={"early_config_prune": _pruner(name)})(kernel)


def _descriptor_tiles(args):
    """Autotuner pre-hook of the TMA forward: a descriptor carries its tile's shape, so each
    config sets the shape it tiles with before it runs."""
    m, n, d = args["BLOCK_M"], args["BLOCK_N"], args["HEAD_DIM"]
    for name, rows in (("Q", m), ("O", m), ("O32", m), ("K", n), ("V", n)):
        args[name].block_shape = [1, 1, rows, d]


def autotuned_tma(kernel):
    """`autotuned` for the TMA forward: the forward's configs, each with `_descriptor_tiles`."""
    if launch.INTERPRETED or launch.TRITON_MISSING:
        return kernel
    configs = [launch.triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s,
                                    pre_hook=_descriptor_tiles) for m, n, w, s in GPU_CONFIGS]
    return launch.triton.autotune(configs=configs,
                                  key=["SQ_BUCKET", "SK_BUCKET", "GROUP", "HEAD_DIM", "CAUSAL", "ELEMENT_BYTES"],
                                  prune_configs_by={"early_config_prune": _pruner("fwd_tma")})(kernel)

