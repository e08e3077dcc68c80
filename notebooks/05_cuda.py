# %% [markdown]
# # 5. FlashAttention in CUDA, by hand
#
# The Triton kernel of chapter 4 let the compiler decide what each thread does: we wrote
# operations on whole tiles (`tl.dot`, `tl.max`), and Triton spread them over threads and
# picked the instructions. This chapter writes the same forward pass in CUDA, where every
# one of those decisions is ours, twice:
#
# * **v1** (`kernels/cuda/csrc/flash_v1.cu`) is the algorithm with nothing in the way: tiles in
#   shared memory, fp32 arithmetic on CUDA cores, one thread per element of the work.
# * **v2** (`kernels/cuda/csrc/flash_v2.cu`) is FlashAttention-2 on tensor cores: `mma.sync`
#   matrix instructions, scores kept in registers, asynchronous copies into two K/V buffers,
#   the mask applied only where a tile needs it.
#
# Much of what makes a CUDA kernel fast or slow is fixed before it ever runs: registers per
# thread, shared memory per block, and which instructions the compiler emitted. We read all
# three from the compiler, which needs `nvcc` but no GPU, so this chapter has something to
# show on every machine, including what each of v2's design changes does to those numbers.
# Running, profiling and timing the kernels needs a GPU.
#
# **You will learn to:**
#
# - map tiles to threads: the grid of blocks, the warps, and which thread owns which element, in
#   v1 and v2;
# - read registers, shared memory and spills from `nvcc -Xptxas -v` without a GPU, and work out
#   occupancy from them by hand;
# - spot tensor cores in the compiled code: `mma.sync` in the PTX, against scalar `fma`;
# - follow v2's four design revisions in the compiler's resources, one change at a time.
#
# **Before you start:** [4. FlashAttention-2 in Triton](04_triton.ipynb) (the tiles and the
# online softmax) and [3b. The fused backends](03b_sdpa_fused.ipynb) (occupancy). Reading C++.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import re
import time

import pandas as pd
import torch

import kernels
from kernels import gpu_lessons
from kernels.bench import sweep
from kernels.bench.results import points_table
from kernels.borrowed import TRACELENS
from kernels.cuda import design, flash as cuda_flash, ptxas, resources, threads
from kernels.cuda.excerpts import cuda_excerpt, cuda_markdown
from kernels.hw import occupancy
from kernels.notebook import glue, inputs, lesson, reveal, say, setup, show_source, timed
from kernels.trace import reader, record
from kernels.trace.attention import find_attention

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
V1, V2 = cuda_flash.CSRC / "flash_v1.cu", cuda_flash.CSRC / "flash_v2.cu"

# The kernels exist for head_dim 64 and 128. v2 takes 16-bit inputs only, so where this run
# is in fp32 (the CPU preset) the compiler sections read the bf16 kernels, the GPU preset's.
kernel_dim = head_dim if head_dim in cuda_flash.HEAD_DIMS else 64
kernel_dtype = "fp16" if dtype == torch.float16 else "bf16"
if kernel_dim != head_dim:
    print(f"head_dim {head_dim} has no CUDA kernel here (they take {cuda_flash.HEAD_DIMS}); reading D={kernel_dim}")
glue("kernel_dim", kernel_dim)
glue("kernel_dtype", kernel_dtype)
pd.DataFrame({"can it run here?": {name: why or "yes" for name, why in kernels.available(device).items()
                                   if name.startswith("cuda")}})

# %% [markdown]
# ## From tiles to threads
#
# Both kernels split the work the way the Triton kernel did: one **thread block** per tile of
# query rows of one (batch, head), so the launch **grid** is two-dimensional, query tiles ×
# (batch × heads), and each block walks over the keys tile by tile. What CUDA adds is the
# inside of a block: a few hundred threads, which the hardware runs as **warps** of 32
# threads in lockstep. The launch configuration mirrors `flash_api.h`:

# %%
show_source(cuda_flash.launch_config)

# %%
launch, cfgs = {}, {}
for version in ("v1", "v2"):
    cfg = cfgs[version] = cuda_flash.launch_config(version, kernel_dim)
    grid = cfg.grid(batch, heads, seq)
    launch[version] = {"threads per block": cfg.threads, "warps per block": cfg.threads // 32,
                       "query rows per block (BLOCK_M)": cfg.block_m, "keys per tile (BLOCK_N)": cfg.block_n,
                       "grid (x, y)": "(B·H, query tiles)" if cfg.heads_on_x else "(query tiles, B·H)",
                       f"grid at B={batch} H={heads} S={seq}": f"({grid[0]}, {grid[1]})",
                       "dynamic shared memory (B)": cfg.dynamic_shared_bytes}
    glue(f"{version}_grid", f"{grid[0]} × {grid[1]}")
    glue(f"{version}_blocks", grid[0] * grid[1])
    glue(f"{version}_block_m", cfg.block_m)
    glue(f"{version}_threads", cfg.threads)
    glue(f"{version}_warps", cfg.threads // 32)
lesson(cfgs["v2"].threads // 32 * 16 == cfgs["v2"].block_m, "each of v2's warps owns 16 query rows",
       f"{cfgs['v2'].threads // 32} warps, {cfgs['v2'].block_m} rows")
pd.DataFrame(launch)

# %% [markdown]
# At this chapter's shape v1 launches a grid of {glue:text}`v1_grid` = {glue:text}`v1_blocks`
# blocks of {glue:text}`v1_block_m` query rows and {glue:text}`v1_threads` threads
# ({glue:text}`v1_warps` warps), v2 one of {glue:text}`v2_grid` = {glue:text}`v2_blocks`
# blocks of {glue:text}`v2_block_m` rows and {glue:text}`v2_threads` threads
# ({glue:text}`v2_warps` warps). v2 puts batch × heads on the grid's x axis, which may hold
# 2³¹ − 1 blocks, where the y axis stops at 65,535 (v1 refuses batch × heads above that).
# Who computes what inside a block is where the two versions part ways. The figure colours
# each element of a tile by the warp whose thread computes it, straight from the index
# formulas of the two `.cu` files (`kernels.cuda.threads.owners_*`):
#
# * **v1, phase 1** (scores): thread `t` owns key column `t % 32` and every fourth query row,
#   8 scores each. A warp spans the 32 keys of one row at a time.
# * **v1, phase 2** (online softmax): one thread per query row. Only the first 32 threads,
#   warp 0, have a row; warps 1 to 3 wait at the barrier.
# * **v1, phase 3** (`O += P V`): thread `t` owns output column `t % D` and every
#   `128 / D`-th row.
# * **v2**: warp `w` owns query rows `16w … 16w+15` for the whole kernel, for the scores, the
#   softmax and the output alike, so a block of 8 warps holds 128 rows. Inside the warp, lane
#   `4g + t` holds rows `g` and `g+8`, columns `2t` and `2t+1` of every 8-column tile: the
#   accumulator layout of the tensor-core instruction `mma.m16n8k16`. The squares outline one
#   lane's elements.

# %%
#| caption: Who computes each element, coloured by warp. Top: cuda_v1's three phases, whose owners change from phase to phase. Bottom: cuda_v2, where warp w owns rows 16w to 16w+15 for the scores, the softmax and the output alike; the squares mark one lane's elements.
#| alt: Colour maps of query rows by column: three small panels for v1's scores, softmax and output, and a tall panel for v2's accumulators in eight horizontal bands, one per warp.
fig = threads.thread_map(head_dim=kernel_dim)

# %%
s1, s2, s3 = threads.owners_v1_scores(), threads.owners_v1_softmax(), threads.owners_v1_output(kernel_dim)
o2 = threads.owners_v2(kernel_dim, cfgs["v2"].block_m, cfgs["v2"].threads)
lesson(bool((s1 >= 0).all() and (s3 >= 0).all() and (o2 >= 0).all()),
       "every score and every output element has a thread that computes it, in both versions")
lesson(set((s2 // 32).ravel()) == {0}, "v1's softmax runs on warp 0 alone: the other 3 warps wait",
       f"rows owned by threads {s2.min()}..{s2.max()}")
rows_of_warp = {w: {int(r) for t in range(32 * w, 32 * (w + 1)) for r in (o2 == t).nonzero()[0]}
                for w in range(cfgs["v2"].threads // 32)}
lesson(all(rows == set(range(16 * w, 16 * w + 16)) for w, rows in rows_of_warp.items()),
       "in v2 each warp owns 16 whole query rows, so a row's softmax never leaves its warp")

# %% [markdown]
# ## v1, read from the source
#
# The source is in `kernels/cuda/csrc/flash_v1.cu` (shipped with the package). The launcher sizes
# the grid and opts in to more than 48 KB of dynamic shared memory when the tiles need it:

# %%
cuda_markdown(cuda_excerpt(V1, "int launch(const flash::Problem& p"))

# %% [markdown]
# The kernel carves its dynamic shared memory into the tiles it keeps: Q for the whole
# kernel, K and V for the current key tile, the scores, and one factor per row. Each thread
# finds its (batch, head) from `blockIdx.y` and its query rows from `blockIdx.x`:

# %%
cuda_markdown(cuda_excerpt(V1, "__global__ void __launch_bounds__", "load_tile<T, D>(q_s"))

# %% [markdown]
# Tiles are copied element by element and converted to fp32 on the way in; consecutive
# threads read consecutive elements of a row, so a warp's 32 loads combine into a few wide
# memory transactions (they *coalesce*):

# %%
cuda_markdown(cuda_excerpt(V1, "__device__ void load_tile"))

# %% [markdown]
# Then, for each tile of 32 keys, three phases separated by `__syncthreads()`. **Phase 1**,
# the scores: each thread reads one value of K from shared memory and multiplies it into its
# 8 running dot products, one `d` at a time.

# %%
cuda_markdown(cuda_excerpt(V1, "// Phase 1: scores", "// Phase 2"))

# %% [markdown]
# **Phase 2**, the online softmax of chapter 4, one thread per row: the new running maximum,
# the factor `alpha` that rescales what was accumulated so far, and the probabilities, written
# over the scores.

# %%
cuda_markdown(cuda_excerpt(V1, "// Phase 2: online softmax", "// Phase 3"))

# %% [markdown]
# **Phase 3** rescales the accumulators and adds `P @ V`; after the last tile each row is
# divided by its sum and written back in the input's dtype:

# %%
cuda_markdown(cuda_excerpt(V1, "// Phase 3: O = alpha", "template <typename T, int D>"))

# %% [markdown]
# ## What the compiler says it costs
#
# `nvcc -Xptxas -v` makes the assembler (ptxas, which turns PTX into the GPU's machine code,
# SASS) print what each kernel needs per thread and per block: registers, static shared
# memory, bytes spilled to slow local memory. Dynamic shared memory is decided at launch, so
# the launch configuration adds it. `kernels.cuda.flash.kernel_resources(archs)` does this for
# every instantiation of both kernels; this chapter uses `kernels.cuda.resources.compile_kernels`,
# the same device compile with the same flags that also keeps the PTX for the next section.
# Both need `nvcc` and no GPU. Where there is no `nvcc` (Colab's default runtime, most
# laptops), the chapter reads a snapshot of one real `nvcc` run instead, and says so.
#
# Guess before the table: v1 keeps its tiles in shared memory, v2 keeps Q fragments, scores
# and the output in registers. What share of an sm_80 SM's warp slots (its occupancy) do you
# expect v2 to fill?

# %%
guess_v2_occupancy_sm_80 = 50.0  # percent; edit me before running on

# %%
archs = ("sm_80", "sm_90")
nvcc = ptxas.nvcc_path()
if nvcc is not None:
    started = time.perf_counter()
    try:
        all_kernels, ptx = resources.compile_kernels(archs)
        resources_source = (f"compiled now by nvcc {ptxas.nvcc_version()} "
                            f"in {time.perf_counter() - started:.1f} s")
    except RuntimeError as err:  # a toolkit too old for these kernels, say
        print(f"nvcc is here but the compile failed; using the nvcc snapshot.\n{err}")
        nvcc = None
if nvcc is None:
    snapshot = resources.load_snapshot()
    all_kernels, ptx = resources.snapshot_kernels(snapshot), None
    resources_source = (f"read from a snapshot of nvcc {snapshot['nvcc']} taken on {snapshot['date']}, "
                        "because this machine has no nvcc (no PATH entry, no CUDA_HOME)")
glue("resources_source", resources_source)
print("Kernel resources:", resources_source)
table = resources.resources_table(all_kernels)
table

# %% [markdown]
# These numbers were {glue:text}`resources_source`. A row is one kernel instantiation: an
# architecture (sm_80 is the A100, sm_90 the H100 and H200), a version, an input dtype and a
# head dimension. The last four columns are not from the compiler: they are the theoretical
# occupancy those resources allow, computed by `kernels.hw.occupancy` ([chapter 3b](03b_sdpa_fused.ipynb)).

# %%
focus = {(arch, version): resources.find_kernel(all_kernels, arch, version, kernel_dtype, kernel_dim)
         for arch in archs for version in ("v1", "v2")}
occ = {key: resources.occupancy_of(k) for key, k in focus.items()}
for (arch, version), k in focus.items():
    glue(f"{version}_regs_{arch}", k.registers)
    glue(f"{version}_smem_{arch}", k.total_shared_bytes)
    glue(f"{version}_occ_{arch}", occ[arch, version].percent)
    glue(f"{version}_limit_{arch}", " and ".join(occ[arch, version].limiters).replace("_", " "))
lesson(not any(k.spills for k in all_kernels), "no kernel spills registers to local memory, in either version",
       f"{len(all_kernels)} kernels checked")
lesson(all(k.shared_bytes == 0 for k in all_kernels),
       "all shared memory is dynamic: the launcher, not the compiler, decides its size")
# What each kernel promises ptxas: a block size and a minimum of resident blocks per SM
# (__launch_bounds__), which caps registers at 65,536 / (threads x blocks) per thread.
v1_bounds = re.search(r"__launch_bounds__\(kV1Threads, (\d+)\)", V1.read_text())
assert v1_bounds is not None, "flash_v1.cu declares __launch_bounds__(kV1Threads, blocks)"
v1_min_blocks = int(v1_bounds.group(1))
lesson("__launch_bounds__(Production<D>::kThreads, Production<D>::kMinBlocks)" in V2.read_text()
       and "kMinBlocks = 256 / kThreads" in V2.read_text(), "v2's launch bounds come from its Design: 256 / threads blocks")
v2_min_blocks = max(1, 256 // cfgs["v2"].threads)
register_cap = {v: 65536 // (cfgs[v].threads * b) for v, b in (("v1", v1_min_blocks), ("v2", v2_min_blocks))}
lesson(all(cap >= 256 for cap in register_cap.values()) and all(k.registers <= 255 for k in all_kernels),
       "both kernels' launch bounds leave ptxas 255 registers per thread, and none needs more",
       f"v1: {cfgs['v1'].threads} threads x {v1_min_blocks} blocks, v2: {cfgs['v2'].threads} x {v2_min_blocks}")
glue("v1_min_blocks", v1_min_blocks)
glue("v2_min_blocks", v2_min_blocks)
lesson(all(focus[a, "v2"].registers > focus[a, "v1"].registers for a in archs),
       "v2 needs more registers per thread than v1: its Q fragments, scores and output live in registers",
       ", ".join(f"{a}: {focus[a, 'v1'].registers} vs {focus[a, 'v2'].registers}" for a in archs))

# %% [markdown]
# For {glue:text}`kernel_dtype` and D = {glue:text}`kernel_dim`, v1 uses
# {glue:text}`v1_regs_sm_80` registers per thread on sm_80 and v2 {glue:text}`v2_regs_sm_80`
# (on sm_90: {glue:text}`v1_regs_sm_90` and {glue:text}`v2_regs_sm_90`). Both tell ptxas
# how they launch with `__launch_bounds__`: v1 blocks of {glue:text}`v1_threads` threads, at
# least {glue:text}`v1_min_blocks` per SM; v2 blocks of {glue:text}`v2_threads`, at least
# {glue:text}`v2_min_blocks`. Either way that leaves up to 255 registers per thread, so
# ptxas has no reason to spill. v2 spends them on what v1 keeps in shared memory: its warp's
# rows of Q, the scores and the output accumulators.
#
# ## Occupancy, for sm_80 and sm_90
#
# What do those numbers allow on one SM? `occupancy(...).explain()` shows the arithmetic:

# %%
for (arch, version), k in focus.items():
    print(f"--- {version}<{kernel_dtype}, {kernel_dim}> on {arch}: {k.registers} registers, "
          f"{k.threads_per_block} threads, {k.total_shared_bytes:,} B shared memory")
    print(occ[arch, version].explain())

# %% [markdown]
# Check it by hand, for every kernel in the table: registers are allocated per warp in
# units of 256 and each of the SM's 4 schedulers holds a quarter of the 65,536; shared memory
# is allocated in units of 128 bytes plus 1 KB the driver reserves per block. The smaller of
# the two limits (unless the SM's warp or block slots are smaller still) is the answer:

# %%
def by_hand(k):
    lim = occupancy.ARCHES[k.arch]
    warps = k.threads_per_block // 32
    regs_per_warp = -(-k.registers * 32 // 256) * 256
    by_registers = (65536 // 4 // regs_per_warp) * 4 // warps
    by_shared = lim.shared_mem_per_sm // (-(-(k.total_shared_bytes + 1024) // 128) * 128)
    return {"registers": by_registers, "shared_memory": by_shared,
            "warps": lim.max_warps_per_sm // warps, "blocks": lim.max_blocks_per_sm}

agree = []
for k in all_kernels:
    hand, o = by_hand(k), resources.occupancy_of(k)
    agree.append(o.blocks_per_sm == min(hand.values()) and hand[o.limited_by] == o.blocks_per_sm)
reveal(guess_v2_occupancy_sm_80, occ["sm_80", "v2"].percent, "v2's occupancy on sm_80 (%)", source="the compiler's resources")
lesson(all(agree), "kernels.hw.occupancy agrees with the hand arithmetic on every kernel: blocks per SM "
       "and which resource limits them", f"{len(agree)} kernels")
lesson(all(occ[a, "v2"].limited_by == "registers" for a in archs),
       "v2's occupancy is limited by registers on both architectures",
       ", ".join(f"{a}: {occ[a, 'v2'].blocks_per_sm} blocks" for a in archs))
lesson(all(occ[a, "v2"].percent <= occ[a, "v1"].percent for a in archs),
       "v2, the tensor-core kernel, has the lower (or equal) occupancy",
       ", ".join(f"{a}: v1 {occ[a, 'v1'].percent:g}% vs v2 {occ[a, 'v2'].percent:g}%" for a in archs))

# %% [markdown]
# What will a PyTorch trace say about these kernels? Its "est. achieved occupancy %" is
# Kineto's own estimate ([chapter 3b](03b_sdpa_fused.ipynb)): CUDA's calculator with the *default* 48 KiB of shared
# memory per block. Our launcher opts into more where a kernel needs it, so from the table
# alone we can predict which kernels a trace will show at 0% although they run:

# %%
def kineto_reads(k) -> float:
    """Kineto's estimate for kernel ``k`` of the table, on a grid large enough to fill every SM."""
    return occupancy.kineto_estimate(k.threads_per_block, k.registers, k.total_shared_bytes,
                                     grid_blocks=10**6, sm_count=1, arch=k.arch)

zero_in_a_trace = [k for k in all_kernels if kineto_reads(k) == 0]
display(pd.DataFrame([{"arch": k.arch, "kernel": resources.instance_label(k.name), "shared KiB": round(k.total_shared_bytes / 1024, 1),
                       "real occupancy %": resources.occupancy_of(k).percent, "a trace would read %": kineto_reads(k)}
                      for k in all_kernels]).set_index(["arch", "kernel"]))
lesson(all((kineto_reads(k) == 0) == (k.total_shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT) for k in all_kernels)
       and all(resources.occupancy_of(k).blocks_per_sm > 0 for k in zero_in_a_trace),
       "exactly the kernels over 48 KiB of shared memory would read 0% in a trace, though each fits on an SM",
       ", ".join(sorted({resources.instance_label(k.name) for k in zero_in_a_trace})) or "none over 48 KiB")
zero_kib = {resources.instance_label(k.name): k.total_shared_bytes / 1024 for k in zero_in_a_trace}
glue("kineto_zero_kernels", ", ".join(f"{name} ({kib:.1f} KiB)" for name, kib in sorted(zero_kib.items())) or "none")

# %% [markdown]
# From this table, the kernels a trace will show at 0%: {glue:text}`kineto_zero_kernels`.
# Each needs more than the 48 KiB of shared memory a block gets by default, so its launcher
# opts in (`cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...)`,
# without which the launch would fail), and Kineto's estimate, which assumes the default,
# finds no block fitting an SM. The "0%" beside a running kernel is the estimate's blind
# spot, not the kernel's occupancy; a GPU run of this chapter checks that prediction on
# its own trace.

# %% [markdown]
# On sm_80, v1 reaches {glue:text}`v1_occ_sm_80:.1f`% occupancy (limited by
# {glue:text}`v1_limit_sm_80`) and v2 {glue:text}`v2_occ_sm_80:.1f`% (limited by
# {glue:text}`v2_limit_sm_80`); on sm_90, {glue:text}`v1_occ_sm_90:.1f`% and
# {glue:text}`v2_occ_sm_90:.1f`%. The kernel built for speed is the one with fewer warps
# per SM, as the source article found for PyTorch's own flash kernel on an A100 (about 13%
# estimated occupancy, and the fastest kernel in its trace). Occupancy hides memory latency with more
# warps; FlashAttention hides it by reusing tiles already on chip and by loading the next K/V
# tile (v2 uses `cp.async`) while the tensor cores work on the current one.
#
# ## Why v1 is slow, and v2's fingerprint
#
# Read v1's phase 1 again. Each multiply-add is one fp32 `fma` instruction of one thread:
# one element of Q times one element of K, both fetched from shared memory just before.
# Every product of the two matmuls goes through that, on the SM's general-purpose *CUDA
# cores*, in fp32 even when the inputs are bf16. And the softmax runs on one warp in four.
#
# GPUs have had **tensor cores** for exactly this since Volta (whose instructions are
# `mma.m8n8k4` and WMMA). The one v2 uses, `mma.sync.aligned.m16n8k16` with f16/bf16 inputs,
# needs sm_80 (Ampere) or newer; ptxas rejects it for sm_75. It multiplies a 16×16 tile by a
# 16×8 tile, 16 · 8 · 16 = {glue:text}`mma_macs` multiply-adds, as *one* instruction of a warp,
# with 16-bit inputs and fp32 accumulators. v2 issues them from inline PTX:

# %%
mma_macs = resources.MMA_M * resources.MMA_N * resources.MMA_K
glue("mma_macs", f"{mma_macs:,}")
glue("mma_macs_per_lane", mma_macs // 32)
cuda_markdown(cuda_excerpt(V2, "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,"))

# %% [markdown]
# That is {glue:text}`mma_macs_per_lane` multiply-adds per thread per instruction, against
# one for an `fma`. The compiler's output is where this shows: count the instructions in the
# PTX of each kernel (`nvcc -ptx`, kept from the compile above). Each loop over the tile is
# unrolled, so a warp's matrix instructions for one tile of keys appear in the text once per
# copy of the tile pass, and their number follows from the tile shapes:
# `(BLOCK_N / 8) · (D / 16)` for `S = Q Kᵀ` plus `(D / 8) · (BLOCK_N / 16)` for `O += P V`.
# v2 has two copies, one without the mask and one with it (the next section says why).

# %%
show_source(resources.mma_per_key_tile)

# %%
if ptx is None:
    print("No PTX to read: this machine has no nvcc (the nvcc snapshot holds resources only). "
          "With the CUDA toolkit installed, this cell counts the instructions of each kernel.")
    for key in ("v2_mma", "v1_mma", "v1_fma"):
        glue(key, "not counted (no nvcc here)")
else:
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for arch in archs:
        for version, source in (("v1", "flash_v1.cu"), ("v2", "flash_v2.cu")):
            text = ptx[arch][source]
            for op in ("mma.sync", "fma.rn.f32", "ldmatrix", "cp.async.cg", "shfl.sync"):
                for name, n in resources.instruction_counts(text, op).items():
                    counts.setdefault((arch, resources.instance_label(name)), {})[op] = n
    counted = pd.DataFrame(counts).T.rename_axis(["arch", "kernel"])
    display(counted)
    v1_mma = {key: c["mma.sync"] for key, c in counts.items() if key[1].startswith("v1")}
    v2_mma = {key: c["mma.sync"] for key, c in counts.items() if key[1].startswith("v2")}
    lesson(bool(v1_mma) and sum(v1_mma.values()) == 0, "v1 contains no tensor-core instruction: not one mma.sync in its PTX",
           f"{len(v1_mma)} kernels")
    # The head dimension is in the kernel's name, e.g. v2<bf16, 64>; two tile-pass bodies each.
    expected = {key: 2 * resources.mma_per_key_tile(int(key[1].rstrip(">").split(", ")[1])) for key in v2_mma}
    lesson(v2_mma == expected and all(n > 0 for n in v2_mma.values()),
           "v2's PTX holds exactly the mma.sync instructions its tile shapes call for, in each of its two tile passes",
           ", ".join(f"{name} {n}" for (a, name), n in v2_mma.items() if a == "sm_80"))
    focus_name = f"v2<{kernel_dtype}, {kernel_dim}>"
    glue("v2_mma", counts["sm_80", focus_name]["mma.sync"])
    glue("v1_mma", counts["sm_80", f"v1<{kernel_dtype}, {kernel_dim}>"]["mma.sync"])
    glue("v1_fma", counts["sm_80", f"v1<{kernel_dtype}, {kernel_dim}>"]["fma.rn.f32"])
    first = next(line.strip() for line in ptx["sm_80"]["flash_v2.cu"].splitlines() if "mma.sync" in line)
    print("One of them, as the PTX reads:\n   ", first)

# %% [markdown]
# In the PTX for sm_80, at {glue:text}`kernel_dtype` and D = {glue:text}`kernel_dim`:
# `mma.sync` instructions in v2: {glue:text}`v2_mma`; in v1: {glue:text}`v1_mma`. v1 does
# its arithmetic with fp32 `fma` instructions instead ({glue:text}`v1_fma` in its program
# text), each one scalar multiply-add. In a GPU trace this is the difference the article reads from kernel names
# (`s16816gemm`: tensor cores, `sgemm`: CUDA cores); here we read it from the program itself.
# (SASS, the machine code, calls the instruction `HMMA`; reading it needs `cuobjdump` or
# `nvdisasm`, which a minimal CUDA toolkit may lack, and ptxas' resources above are already the
# SASS-level resource count.)
#
# The rest of v2 is about feeding those instructions. The scores of one tile of 64 keys: K
# fragments come from shared memory with `ldmatrix`, four 8×8 matrices per instruction, and
# every fragment feeds two `mma`s:

# %%
cuda_markdown(cuda_excerpt(V2, "// S = Q K_j^T.", "// The masked instantiation"))

# %% [markdown]
# After the softmax, the probabilities do not go back to shared memory at all: the
# accumulator layout of two 8-column score tiles is exactly the layout `mma` wants for its A
# operand, so each lane packs its own values into 16-bit pairs and the second matmul starts:

# %%
cuda_markdown(cuda_excerpt(V2, "// C layout of S tiles", "// O += P V_j"))

# %% [markdown]
# ## v2, one change at a time
#
# v2 went through four revisions after its first version, each aimed at a cost the compiler's
# resources or the PTX can show: bigger query tiles, a mask paid only where it is needed, a
# cheaper exponential, and loads that overlap the arithmetic. The source keeps them as
# compile-time switches, a `Design` template, so that the same file compiles at every revision
# and the kernel the launcher runs is simply the last one:

# %%
cuda_markdown(cuda_excerpt(V2, "template <int kBlockM, bool kSplitMask"))

# %% [markdown]
# Guess before the table: which change will cost registers, and which will change the
# shared memory a block asks for?

# %%
guess_costliest_revision_in_registers = 4  # 1..4, the revision (change) you expect to add the most registers; edit me

# %%
revisions_live = nvcc is not None
try:
    design_rows = design.design_revisions(kernel_dim, archs, live=revisions_live)
except RuntimeError as err:  # a compile that fails here fell back above too
    print(f"the design revisions did not compile; using the nvcc snapshot's.\n{err}")
    revisions_live, design_rows = False, design.design_revisions(kernel_dim, archs, live=False)
snapshot = resources.load_snapshot()
glue("revisions_source", f"compiled now by nvcc {ptxas.nvcc_version()}" if revisions_live else
     f"read from a snapshot of nvcc {snapshot['nvcc']} taken on {snapshot['date']}")
revisions_table = design.design_table(design_rows)
revision_of = {(r.kernel.arch, r.index): r for r in design_rows}
display(revisions_table.set_index(["arch", "revision"]).drop(columns=["change", "limited by"]))
pd.DataFrame({"change": {i: r.change for i, r in enumerate(design.DESIGN_REVISIONS)}}).rename_axis("revision")

# %% [markdown]
# One row per architecture and revision, bf16, D = {glue:text}`kernel_dim`,
# {glue:text}`revisions_source`. Revision 0 is the first version's design rebuilt from this
# source (every switch off); each later revision turns on one more change; revision 4 is what
# the launcher runs. The columns after the occupancy are counts in each revision's PTX, and "a trace
# reads %" is Kineto's estimate from the same footprint (the 48 KiB rule above).

# %%
def delta(arch, revision, what):
    """What `revision` changed in the table's column `what`, against the revision before it."""
    row = revisions_table.set_index(["arch", "revision"])
    return row.loc[(arch, revision), what] - row.loc[(arch, revision - 1), what]

added = {i: max(delta(a, i, "registers") for a in archs) for i in range(1, len(design.DESIGN_REVISIONS))}
reveal(guess_costliest_revision_in_registers, max(added, key=lambda i: added[i]), "revision adding the most registers",
       source="the compiler's resources")
for a in archs:
    for i in range(len(design.DESIGN_REVISIONS)):
        r = revision_of[a, i]
        glue(f"rev{i}_regs_{a}", r.kernel.registers)
        glue(f"rev{i}_smem_{a}", f"{r.kernel.total_shared_bytes:,}")
        glue(f"rev{i}_warps_{a}", resources.occupancy_of(r.kernel).warps_per_sm)
        glue(f"rev{i}_blocks_{a}", resources.occupancy_of(r.kernel).blocks_per_sm)
        glue(f"rev{i}_mma_{a}", r.counts["mma.sync"])
        glue(f"rev{i}_bar_{a}", f"{design.barriers_per_tile(r):g}")
first_revision, final_revision = revision_of["sm_80", 0], revision_of["sm_80", len(design.DESIGN_REVISIONS) - 1]
for i in (0, 1):
    glue(f"rev{i}_threads", revision_of["sm_80", i].revision.threads)
    glue(f"rev{i}_block_warps", revision_of["sm_80", i].revision.threads // 32)
    glue(f"rev{i}_rows", revision_of["sm_80", i].revision.block_m)
glue("rows_ratio", revision_of["sm_80", 1].revision.block_m // first_revision.revision.block_m)
lesson(not any(r.kernel.spills or r.kernel.stack_frame_bytes for r in design_rows),
       "no revision spills registers or keeps anything in local memory", f"{len(design_rows)} kernels")
lesson(all(r.kernel.total_shared_bytes <= occupancy.ARCHES[r.kernel.arch].max_shared_mem_per_block
           and resources.occupancy_of(r.kernel).blocks_per_sm >= 1 for r in design_rows),
       "every revision fits one SM of its architecture (registers and shared memory)")

# %% [markdown]
# **128 query rows per block.** The first version gave a block {glue:text}`rev0_rows` rows
# and {glue:text}`rev0_block_warps` warps; revision 1 gives it {glue:text}`rev1_rows` rows and
# {glue:text}`rev1_block_warps` warps ({glue:text}`rev0_threads` → {glue:text}`rev1_threads`
# threads). A warp's own work does not change (16 rows against a 64-key tile), so neither do
# its registers much: {glue:text}`rev0_regs_sm_80` → {glue:text}`rev1_regs_sm_80` on
# sm_80, {glue:text}`rev0_regs_sm_90` → {glue:text}`rev1_regs_sm_90` on sm_90. What changes
# is reuse: every K/V tile copied into shared memory now serves {glue:text}`rows_ratio`×
# as many queries, so a forward copies each K/V tile from L2 or HBM {glue:text}`rows_ratio`×
# less often. The price is in the occupancy columns: one block of 8 warps now fills an SM's
# registers, where {glue:text}`rev0_blocks_sm_80` (sm_80) or {glue:text}`rev0_blocks_sm_90`
# (sm_90) blocks of 4 warps fit before, so warps per SM go {glue:text}`rev0_warps_sm_80` →
# {glue:text}`rev1_warps_sm_80` on sm_80 and {glue:text}`rev0_warps_sm_90` →
# {glue:text}`rev1_warps_sm_90` on sm_90.
# Shared memory per block goes {glue:text}`rev0_smem_sm_80` → {glue:text}`rev1_smem_sm_80`
# bytes (Q's tile doubles).

# %%
rows = {a: (revision_of[a, 0].kernel.registers, revision_of[a, 1].kernel.registers) for a in archs}
lesson(all(abs(after - before) <= 0.1 * before for before, after in rows.values()),
       "doubling the rows per block moves registers per thread by at most 10%: a warp's work is unchanged",
       ", ".join(f"{a}: {b} -> {c}" for a, (b, c) in rows.items()))
lesson(all(revision_of[a, 1].revision.threads == 2 * revision_of[a, 0].revision.threads for a in archs),
       "128-row tiles mean twice the threads (8 warps of 16 rows)")

# %% [markdown]
# **Masked and unmasked tile passes.** Most key tiles a block reads are visible to every one
# of its rows; only the tiles on the causal diagonal, and a ragged last tile, need the mask.
# The first version tested every score of every tile anyway. Now the tile pass is a template
# on `kMasked`, the block runs its fully visible tiles through one instantiation and the rest
# through the other, and the decision is made once per tile, by which loop the tile is in:

# %%
cuda_markdown(cuda_excerpt(V2, "// Fully visible tiles first", "// Epilogue"))

# %% [markdown]
# Only the masked instantiation looks at positions; it uses the contract's rule, bottom-right
# aligned, the same function the tile schedule is built from (`flash_api.h`):

# %%
cuda_markdown(cuda_excerpt(V2, "// The masked instantiation", "// Online softmax."))

# %%
def unmasked_share(s):
    """Share (%) of the key tiles a causal forward of length s reads that need no mask."""
    c = design.tile_census(s, s, cfgs["v2"].block_m, cfgs["v2"].block_n, causal=True)
    return 100 * c["unmasked"] / (c["unmasked"] + c["masked"])

census = design.tile_census(seq, seq, cfgs["v2"].block_m, cfgs["v2"].block_n, causal=True)
read = census["unmasked"] + census["masked"]
glue("kernel_seq", seq)
glue("longer_seq", 4 * seq)
glue("longer_share", f"{unmasked_share(4 * seq):.0f}")
lesson(unmasked_share(4 * seq) > unmasked_share(seq), "the longer the sequence, the larger the share of tiles without a mask",
       f"S={seq}: {unmasked_share(seq):.0f}%, S={4 * seq}: {unmasked_share(4 * seq):.0f}%")
glue("census_unmasked", census["unmasked"])
glue("census_masked", census["masked"])
glue("census_skipped", census["skipped"])
glue("census_share", f"{100 * census['unmasked'] / read:.0f}")
lesson(all(design.tile_bodies(revision_of[a, 2]) == 2 * design.tile_bodies(revision_of[a, 1]) == 2 for a in archs),
       "splitting the mask off doubles the tile pass's code: two bodies, each with one tile's mma.sync",
       ", ".join(f"{a}: mma.sync {revision_of[a, 1].counts['mma.sync']} -> {revision_of[a, 2].counts['mma.sync']}" for a in archs))
pd.DataFrame({f"causal, S = {seq}": census}).T

# %% [markdown]
# The PTX shows the second body: {glue:text}`rev1_mma_sm_80` → {glue:text}`rev2_mma_sm_80`
# `mma.sync` instructions on sm_80, and registers {glue:text}`rev1_regs_sm_80` →
# {glue:text}`rev2_regs_sm_80`. At this chapter's causal shape, S = {glue:text}`kernel_seq`,
# the blocks read {glue:text}`census_unmasked` tiles through the unmasked tile pass and
# {glue:text}`census_masked` through the masked one ({glue:text}`census_share`% without a
# mask), and never load {glue:text}`census_skipped` tiles above the diagonal. At S =
# {glue:text}`longer_seq` the share without a mask is {glue:text}`longer_share`%.
#
# **Fast exp2, the scale folded in.** `exp(x · scale)` is `exp2(x · scale · log₂e)`. `exp2f`
# without fast-math flags compiles to `ex2.approx.f32` in PTX, which must handle subnormal
# inputs and results; the `.ftz` form flushes them to zero (the
# [PTX ISA](https://docs.nvidia.com/cuda/parallel-thread-execution/), `ex2`), and flushing
# probabilities below 2⁻¹²⁶ to 0 costs a softmax nothing. The unmasked tile pass also stops
# multiplying each score by the scale first: the row max of the raw scores times the scale is
# the max of the scaled ones, so "scale, subtract the max" becomes one fused multiply-add:

# %%
cuda_markdown(cuda_excerpt(V2, "__device__ __forceinline__ float fast_exp2(float x)"))

# %%
lesson(all(revision_of[a, 2].counts["ex2.approx.ftz.f32"] == 0 and revision_of[a, 3].counts["ex2.approx.f32"] == 0
           and revision_of[a, 3].counts["ex2.approx.ftz.f32"] == revision_of[a, 2].counts["ex2.approx.f32"] > 0 for a in archs),
       "revision 3 swaps every ex2.approx.f32 for ex2.approx.ftz.f32, one for one",
       ", ".join(f"{a}: {revision_of[a, 2].counts['ex2.approx.f32']} -> {revision_of[a, 3].counts['ex2.approx.ftz.f32']}"
                 for a in archs))
glue("exp_count", revision_of["sm_80", 3].counts["ex2.approx.ftz.f32"])

# %% [markdown]
# All {glue:text}`exp_count` exponentials of the kernel's two tile passes are now the fast
# form; registers move {glue:text}`rev2_regs_sm_80` → {glue:text}`rev3_regs_sm_80` on
# sm_80. Any gain is in instructions per score (the FMA replaces a multiply and a subtract,
# and the exponential needs no subnormal handling), which the resource counts cannot show
# and a GPU run must.
#
# **K/V double-buffered.** With one buffer, tile j + 1 can be loaded only after every warp is
# done with tile j: a barrier before the compute (tile j has arrived) and one after (the
# buffer is free), and nothing to overlap the load with. With two, the copies of tile j + 1
# (`cp.async`, global memory straight into shared memory) are issued into the other buffer
# and land while tile j computes, and one barrier per tile does both jobs:

# %%
cuda_markdown(cuda_excerpt(V2, "// One key tile: S = Q K_j^T", "// S = Q K_j^T."))

# %%
lesson(all(design.barriers_per_tile(revision_of[a, 3]) == 2 and design.barriers_per_tile(revision_of[a, 4]) == 1
           for a in archs), "double buffering halves the barriers per tile, 2 -> 1, counted in the PTX")
lesson(all(revision_of[a, 4].kernel.total_shared_bytes == revision_of[a, 3].kernel.total_shared_bytes for a in archs),
       "the second K/V buffer costs no shared memory: Q passes through it before tile 1 arrives",
       f"{revision_of['sm_80', 4].kernel.total_shared_bytes:,} B")
moves = ", ".join(f"{revision_of[a, 3].kernel.registers} → {revision_of[a, 4].kernel.registers} on {a}" for a in archs)
most = max(delta(a, 4, "registers") for a in archs)
glue("buffer_registers", f"it costs up to {most} registers per thread ({moves})" if most > 0 else
     f"at this head dim it costs no registers ({moves}); at D = 128, where a warp holds more, it can")
zero_revisions = sorted({r.index for r in design_rows if r.kernel.total_shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT})
glue("revisions_at_zero", ", ".join(map(str, zero_revisions)) if zero_revisions else "none")
glue("final_kib", f"{final_revision.kernel.total_shared_bytes / 1024:.0f}")

# %% [markdown]
# Barriers per tile go {glue:text}`rev3_bar_sm_80` → {glue:text}`rev4_bar_sm_80`, shared
# memory stays at {glue:text}`rev4_smem_sm_80` bytes, because Q, which moves into registers
# at the start, leaves its {glue:text}`v2_block_m` rows to the second buffer. Where double
# buffering costs anything, it is registers: the addresses of the next tile's copies stay
# live across the whole compute, and {glue:text}`buffer_registers`. The kernel that runs
# stays under 255 registers without a spill at both head dims (the resources table above),
# which is why the launcher keeps 128-row tiles everywhere rather than fall back to 64 where
# registers are tightest.
#
# In a PyTorch trace, the revisions above 48 KiB of shared memory per block (here:
# {glue:text}`revisions_at_zero`) would read 0% occupancy: the kernel that runs asks for
# {glue:text}`final_kib` KiB at D = {glue:text}`kernel_dim`. Whether each change pays is a
# question for a GPU: the resource counts say what each costs and what it fixes, and the
# benchmark below (and the showdown chapter) says what it is worth.

# %% [markdown]
# ## Beside PyTorch's flash kernel, on a real trace
#
# How does v2's launch compare with the kernel PyTorch itself runs? The trace below was
# recorded by others: Qwen1.5-0.5B's forward on an H100, where SDPA ran `flash_fwd_kernel`,
# and the trace records its grid, block, registers and shared memory. Beside it, what v2
# would launch for the same shape, its grid and block from `launch_config` and its
# registers from the compiler rows above, and the occupancy of each on that GPU.

# %%
qwen = TRACELENS["h100_qwen"]
qwen_trace = qwen.trace()
qwen_call = find_attention(qwen.step(trace=qwen_trace)).calls[0]
gpu = qwen_trace.device_properties[0]
qwen_arch = occupancy.arch_of((gpu["computeMajor"], gpu["computeMinor"]))
torch_launch = occupancy.launch_from_footprint("flash_fwd_kernel (torch)", qwen_call.footprint(), "the trace")
v2_launch = resources.v2_launch(qwen_call.batch_heads, qwen_call.sq, int(qwen_call.d or 0), str(qwen_call.dtype), qwen_arch,
                                all_kernels)
say(qwen.credit(qwen_trace))
print(f"{qwen_call.op}: B·H={qwen_call.batch_heads}, S={qwen_call.sq}, D={qwen_call.d}, {qwen_call.dtype}, "
      f"causal={qwen_call.causal}; {gpu['name']}, {gpu['numSms']} SMs ({qwen_arch})")
occupancy.launch_table([torch_launch, v2_launch], qwen_arch, gpu["numSms"])

# %%
occ_torch, occ_v2 = torch_launch.occupancy(qwen_arch), v2_launch.occupancy(qwen_arch)
lesson(torch_launch.blocks == v2_launch.blocks, "v2 launches as many CTAs as torch's kernel: 128 query rows each",
       f"{v2_launch.blocks}: torch's grid {torch_launch.grid}, v2's {v2_launch.grid}")
lesson(occ_torch.limited_by == occ_v2.limited_by == "registers", "both kernels are limited by registers on this GPU",
       f"torch {occ_torch.blocks_per_sm} CTAs x {occ_torch.warps_per_block} warps, "
       f"v2 {occ_v2.blocks_per_sm} x {occ_v2.warps_per_block}")
glue("qwen_torch_warps", occ_torch.warps_per_sm)
glue("qwen_v2_warps", occ_v2.warps_per_sm)
glue("qwen_torch_waves", torch_launch.waves(qwen_arch, gpu["numSms"]))
glue("qwen_v2_waves", v2_launch.waves(qwen_arch, gpu["numSms"]))

# %% [markdown]
# Both launch one CTA per 128 query rows of one (batch, head), and both spend registers for
# tiles on chip: torch's kernel keeps {glue:text}`qwen_torch_warps` warps per SM resident,
# v2 {glue:text}`qwen_v2_warps`, so torch's CTAs run in {glue:text}`qwen_torch_waves:.2f`
# waves over the SMs and v2's in {glue:text}`qwen_v2_waves:.2f`: the same work in CTAs
# of a different shape, and the table says which resource sets each one's count per SM.
#
# ## On a GPU: correct, one kernel, and how fast
#
# Running the kernels needs a GPU with a CUDA build of PyTorch; where this page is built on
# one, the hidden cells below build the extension, check both kernels against the float64
# reference on odd shapes, profile one forward of each (one kernel per forward, with the
# footprint the trace records) and time them against `triton` and `sdpa_flash`.

# %% tags=["hide-input"]
runnable = [n for n in ("cuda_v1", "cuda_v2") if kernels.available(device)[n] is None
            and head_dim in cuda_flash.HEAD_DIMS]
if runnable:
    timed(cuda_flash.extension, "extension ready")
    # Odd shapes, [B, S, H, D] views, grouped-query K/V heads and Sq != Sk both ways.
    for name in runnable:
        gpu_lessons.cuda_matches_reference(kernels.get(name), name, heads, seq, head_dim, dtype, device)
    q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
    steps = {name: reader.median_step(record.profile(kernels.get(name), q, k, v, label=name,
                                                     active=active_steps, trace_dir=trace_dir).steps())
             for name in runnable}
    display(gpu_lessons.cuda_forwards(steps, head_dim, batch, heads, seq))
    contenders = [n for n in ("sdpa_flash", "triton", *runnable) if kernels.available(device)[n] is None]
    results = sweep.sweep(contenders, seqs=(seq,), head_dims=(head_dim,), dtypes=(dtype,), causal=(True,),
                          batch=batch, heads=heads, device=device, progress=None)
    display(points_table(results, ["status", "median_ms", "p10_ms", "p90_ms", "tflops", "reason"], index="impl"))
    gpu_lessons.tensor_cores_win(results)

# %% [markdown]
# For scale, the course's reference notes record that a from-scratch FlashAttention-2 in CUDA
# can get close to the real thing (one write-up in 16 iterations reached about 99% of FlashAttention-2
# on an A100 at D = 128, non-causal), and that FlashAttention-2 itself reaches up to
# 230 TFLOP/s forward on an A100, 73% of its 312 TFLOP/s bf16 peak (arXiv 2307.08691). v2
# has the structure of those kernels but none of their later refinements; the showdown
# chapter measures everything side by side.
#
# ## What to remember
#
# - A CUDA kernel's launch is a grid of blocks (here: query tiles and batch·heads) of a few
#   warps each (4 in v1, 8 in v2); *which thread owns which element* is the design.
# - Registers, shared memory and spills are fixed at compile time: `nvcc -Xptxas -v`
#   prints them without a GPU, and occupancy follows from them by arithmetic.
# - Lower occupancy is not slower: v2 runs fewer warps per SM than v1 because it keeps more
#   on chip.
# - A design revision can be read in the compiler's resources before it runs: bigger tiles
#   (threads, shared memory, warps per SM), a mask split into its own instantiation (a second
#   tile-pass body), a fast exponential (`ex2.approx.ftz`), double buffering (one barrier per
#   tile, more registers). What each is worth needs a GPU.
# - Tensor cores leave a fingerprint in the compiled code: `mma.sync` in PTX (`HMMA` in SASS).
#   A kernel without it does its matmuls one scalar `fma` at a time.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/05_cuda.ipynb), with automatic checks, hints and hidden solutions.
