# %% [markdown]
# # 5. FlashAttention in CUDA, by hand
#
# The Triton kernel of chapter 4 let the compiler decide what each thread does: we wrote
# operations on whole tiles (`tl.dot`, `tl.max`), and Triton spread them over threads and
# picked the instructions. This chapter writes the same forward pass in CUDA, where every
# one of those decisions is ours, twice:
#
# * **v1** (`kernels/csrc/flash_v1.cu`) is the algorithm with nothing in the way: tiles in
#   shared memory, fp32 arithmetic on CUDA cores, one thread per element of the work.
# * **v2** (`kernels/csrc/flash_v2.cu`) is FlashAttention-2 on tensor cores: `mma.sync`
#   matrix instructions, scores kept in registers, asynchronous copies.
#
# Much of what makes a CUDA kernel fast or slow is fixed before it ever runs: registers per
# thread, shared memory per block, and which instructions the compiler emitted. We read all
# three from the compiler, which needs `nvcc` but no GPU, so this chapter has something to
# show on every machine. Running, profiling and timing the kernels needs a GPU.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math
import time

import pandas as pd
import torch

import kernels
from kernels import bench, cuda_flash, cuda_report, occupancy, profiling, ptxas, reference
from kernels.book import glue, inputs, lesson, reveal, setup, show_source
from kernels.cuda_report import cuda_excerpt, cuda_markdown

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
V1, V2 = cuda_flash.CSRC / "flash_v1.cu", cuda_flash.CSRC / "flash_v2.cu"

# The kernels exist for head_dim 64 and 128. v2 takes 16-bit inputs only, so where this run
# is in fp32 (the CPU profile) the compiler sections read the bf16 kernels, the GPU profile's.
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
# query rows of one (batch, head), so the launch **grid** is two-dimensional,
# `grid = (ceil(S / BLOCK_M), batch × heads)`, and each block walks over the keys tile by
# tile. What CUDA adds is the inside of a block: **128 threads**, which the hardware runs as
# **4 warps** of 32 threads in lockstep. The launch configuration mirrors `flash_api.h`:

# %%
show_source(cuda_flash.launch_config)

# %%
launch = {}
for version in ("v1", "v2"):
    cfg = cuda_flash.launch_config(version, kernel_dim)
    launch[version] = {"threads per block": cfg.threads, "warps per block": cfg.threads // 32,
                       "query rows per block (BLOCK_M)": cfg.block_m, "keys per tile (BLOCK_N)": cfg.block_n,
                       f"grid at B={batch} H={heads} S={seq}": f"({math.ceil(seq / cfg.block_m)}, {batch * heads})",
                       "dynamic shared memory (B)": cfg.dynamic_shared_bytes}
    glue(f"{version}_grid_x", math.ceil(seq / cfg.block_m))
    glue(f"{version}_block_m", cfg.block_m)
glue("grid_y", batch * heads)
pd.DataFrame(launch)

# %% [markdown]
# At this chapter's shape v1 launches a grid of {glue:text}`v1_grid_x` × {glue:text}`grid_y`
# blocks of {glue:text}`v1_block_m` query rows, v2 one of {glue:text}`v2_grid_x` ×
# {glue:text}`grid_y` blocks of {glue:text}`v2_block_m` rows. Who computes what inside a
# block is where the two versions part ways. The figure colours each element of a tile by the
# warp whose thread computes it, straight from the index formulas of the two `.cu` files
# (`kernels.cuda_report.owners_*`):
#
# * **v1, phase 1** (scores): thread `t` owns key column `t % 32` and every fourth query row,
#   8 scores each. A warp spans the 32 keys of one row at a time.
# * **v1, phase 2** (online softmax): one thread per query row. Only the first 32 threads,
#   warp 0, have a row; warps 1 to 3 wait at the barrier.
# * **v1, phase 3** (`O += P V`): thread `t` owns output column `t % D` and every
#   `128 / D`-th row.
# * **v2**: warp `w` owns query rows `16w … 16w+15` for the whole kernel, for the scores, the
#   softmax and the output alike. Inside the warp, lane `4g + t` holds rows `g` and `g+8`,
#   columns `2t` and `2t+1` of every 8-column tile: the accumulator layout of the tensor-core
#   instruction `mma.m16n8k16`. The squares outline one lane's elements.

# %%
fig = cuda_report.thread_map(head_dim=kernel_dim)

# %%
s1, s2, s3 = cuda_report.owners_v1_scores(), cuda_report.owners_v1_softmax(), cuda_report.owners_v1_output(kernel_dim)
o2 = cuda_report.owners_v2(kernel_dim)
lesson((s1 >= 0).all() and (s3 >= 0).all() and (o2 >= 0).all(),
       "every score and every output element has a thread that computes it, in both versions")
lesson(set((s2 // 32).ravel()) == {0}, "v1's softmax runs on warp 0 alone: the other 3 warps wait",
       f"rows owned by threads {s2.min()}..{s2.max()}")
rows_of_warp = {w: {int(r) for t in range(32 * w, 32 * (w + 1)) for r in (o2 == t).nonzero()[0]} for w in range(4)}
lesson(all(rows == set(range(16 * w, 16 * w + 16)) for w, rows in rows_of_warp.items()),
       "in v2 each warp owns 16 whole query rows, so a row's softmax never leaves its warp")

# %% [markdown]
# ## v1, read from the source
#
# The source is in `kernels/csrc/flash_v1.cu` (shipped with the package). The launcher sizes
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
# the launch configuration adds it. `kernels.cuda_flash.kernel_report(archs)` does this for
# every instantiation of both kernels; this chapter uses `kernels.cuda_report.compile_kernels`,
# the same device compile with the same flags that also keeps the PTX for the next section.
# Both need `nvcc` and no GPU. Where there is no `nvcc` (Colab's default runtime, most
# laptops), the chapter reads a report recorded by a real `nvcc` run instead, and says so.
#
# Guess before the report: v1 keeps its tiles in shared memory, v2 keeps Q fragments, scores
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
        report, ptx = cuda_report.compile_kernels(archs)
        source_of_report = (f"compiled now by nvcc {cuda_report.nvcc_version()} "
                            f"in {time.perf_counter() - started:.1f} s")
    except RuntimeError as err:  # a toolkit too old for these kernels, say
        print(f"nvcc is here but the compile failed; using the recorded report.\n{err}")
        nvcc = None
if nvcc is None:
    report, ptx = cuda_report.recorded_report(), None
    source_of_report = (f"recorded on {cuda_report.RECORDED['date']} with nvcc {cuda_report.RECORDED['nvcc']}, "
                        "because this machine has no nvcc (no PATH entry, no CUDA_HOME)")
glue("report_source", source_of_report)
print("Compiler report:", source_of_report)
table = cuda_report.resources_table(report)
table

# %% [markdown]
# This report was {glue:text}`report_source`. A row is one kernel instantiation: an
# architecture (sm_80 is the A100, sm_90 the H100 and H200), a version, an input dtype and a
# head dimension. The last four columns are not from the compiler: they are the theoretical
# occupancy those resources allow, computed by `kernels.occupancy` (chapter 3).

# %%
focus = {(arch, version): cuda_report.find(report, arch, version, kernel_dtype, kernel_dim)
         for arch in archs for version in ("v1", "v2")}
occ = {key: cuda_report.occupancy_of(k) for key, k in focus.items()}
for (arch, version), k in focus.items():
    glue(f"{version}_regs_{arch}", k.registers)
    glue(f"{version}_smem_{arch}", k.total_shared_bytes)
    glue(f"{version}_occ_{arch}", occ[arch, version].percent)
    glue(f"{version}_limit_{arch}", " and ".join(occ[arch, version].limiters).replace("_", " "))
lesson(not any(k.spills for k in report), "no kernel spills registers to local memory, in either version",
       f"{len(report)} kernels checked")
lesson(all(k.shared_bytes == 0 for k in report),
       "all shared memory is dynamic: the launcher, not the compiler, decides its size")
lesson("__launch_bounds__(kV1Threads, 2)" in V1.read_text() and "__launch_bounds__(kV2Threads, 2)" in V2.read_text(),
       "both kernels promise ptxas 128 threads and 2 resident blocks per SM (__launch_bounds__)")
lesson(all(focus[a, "v2"].registers > focus[a, "v1"].registers for a in archs),
       "v2 needs more registers per thread than v1: its Q fragments, scores and output live in registers",
       ", ".join(f"{a}: {focus[a, 'v1'].registers} vs {focus[a, 'v2'].registers}" for a in archs))

# %% [markdown]
# For {glue:text}`kernel_dtype` and D = {glue:text}`kernel_dim`, v1 uses
# {glue:text}`v1_regs_sm_80` registers per thread on sm_80 and v2 {glue:text}`v2_regs_sm_80`
# (on sm_90: {glue:text}`v1_regs_sm_90` and {glue:text}`v2_regs_sm_90`). Both ask for
# "at least 2 blocks per SM" with `__launch_bounds__(128, 2)`, which lets ptxas use up to 255
# registers per thread rather than spill. v2 spends them on what v1 keeps in shared memory:
# its warp's rows of Q, the scores and the output accumulators.
#
# ## Occupancy, for sm_80 and sm_90
#
# What do those numbers allow on one SM? `occupancy(...).explain()` shows the arithmetic:

# %%
for (arch, version), k in focus.items():
    print(f"--- {version}<{kernel_dtype}, {kernel_dim}> on {arch}: {k.registers} registers, "
          f"{k.threads_per_block} threads, {k.total_shared_bytes:,} B shared memory")
    print(occupancy.occupancy(threads_per_block=k.threads_per_block, registers_per_thread=k.registers,
                              shared_mem_per_block=k.total_shared_bytes, arch=arch).explain())

# %% [markdown]
# Check it by hand, for every kernel in the report: registers are allocated per warp in
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
for k in report:
    hand, o = by_hand(k), cuda_report.occupancy_of(k)
    agree.append(o.blocks_per_sm == min(hand.values()) and hand[o.limited_by] == o.blocks_per_sm)
reveal(guess_v2_occupancy_sm_80, occ["sm_80", "v2"].percent, "v2's occupancy on sm_80 (%)", source="the compiler's report")
lesson(all(agree), "kernels.occupancy agrees with the hand arithmetic on every kernel: blocks per SM "
       "and which resource limits them", f"{len(agree)} kernels")
lesson(all(occ[a, "v2"].limited_by == "registers" for a in archs),
       "v2's occupancy is limited by registers on both architectures",
       ", ".join(f"{a}: {occ[a, 'v2'].blocks_per_sm} blocks" for a in archs))
lesson(all(occ[a, "v2"].percent <= occ[a, "v1"].percent for a in archs),
       "v2, the tensor-core kernel, has the lower (or equal) occupancy",
       ", ".join(f"{a}: v1 {occ[a, 'v1'].percent:g}% vs v2 {occ[a, 'v2'].percent:g}%" for a in archs))

# %% [markdown]
# What will a PyTorch trace say about these kernels? Its "est. achieved occupancy %" is
# Kineto's own estimate (chapter 3): CUDA's calculator with the *default* 48 KiB of shared
# memory per block. Our launcher opts into more where a kernel needs it, so from the report
# alone we can predict which kernels a trace will show at 0% although they run:

# %%
def kineto_reads(k) -> float:
    """Kineto's estimate for kernel ``k`` of the report, on a grid large enough to fill every SM."""
    return occupancy.kineto_estimate(k.threads_per_block, k.registers, k.total_shared_bytes,
                                     grid_blocks=10**6, sm_count=1, arch=k.arch)

zero_in_a_trace = [k for k in report if kineto_reads(k) == 0]
display(pd.DataFrame([{"arch": k.arch, "kernel": cuda_report.short_name(k.name), "shared KiB": round(k.total_shared_bytes / 1024, 1),
                       "real occupancy %": cuda_report.occupancy_of(k).percent, "a trace would read %": kineto_reads(k)}
                      for k in report]).set_index(["arch", "kernel"]))
lesson(all((kineto_reads(k) == 0) == (k.total_shared_bytes > occupancy.KINETO_SHARED_MEM_LIMIT) for k in report)
       and all(cuda_report.occupancy_of(k).blocks_per_sm > 0 for k in zero_in_a_trace),
       "exactly the kernels over 48 KiB of shared memory would read 0% in a trace, though each fits on an SM",
       ", ".join(sorted({cuda_report.short_name(k.name) for k in zero_in_a_trace})) or "none over 48 KiB")
glue("kineto_zero_kernels", ", ".join(sorted({cuda_report.short_name(k.name) for k in zero_in_a_trace})) or "none")

# %% [markdown]
# From this report: {glue:text}`kineto_zero_kernels`. A trace of these kernels will show
# "0%" beside a kernel that is running; the GPU cells below check that prediction on the
# trace when a GPU runs this chapter.

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
mma_macs = cuda_report.MMA_M * cuda_report.MMA_N * cuda_report.MMA_K
glue("mma_macs", f"{mma_macs:,}")
glue("mma_macs_per_lane", mma_macs // 32)
cuda_markdown(cuda_excerpt(V2, "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,"))

# %% [markdown]
# That is {glue:text}`mma_macs_per_lane` multiply-adds per thread per instruction, against
# one for an `fma`. The compiler's output is where this shows: count the instructions in the
# PTX of each kernel (`nvcc -ptx`, kept from the compile above). Each loop over the tile is
# unrolled, so a warp's matrix instructions for one tile of keys appear once each in the
# text, and their number follows from the tile shapes:
# `(BLOCK_N / 8) · (D / 16)` for `S = Q Kᵀ` plus `(D / 8) · (BLOCK_N / 16)` for `O += P V`.

# %%
show_source(cuda_report.mma_per_key_tile)

# %%
if ptx is None:
    print("No PTX to read: this machine has no nvcc (the recorded report holds resources only). "
          "With the CUDA toolkit installed, this cell counts the instructions of each kernel.")
    for key in ("v2_mma", "v1_mma", "v1_fma"):
        glue(key, "not counted (no nvcc here)")
else:
    counts = {}
    for arch in archs:
        for version, source in (("v1", "flash_v1.cu"), ("v2", "flash_v2.cu")):
            text = ptx[arch][source]
            for op in ("mma.sync", "fma.rn.f32", "ldmatrix", "cp.async.cg", "shfl.sync"):
                for name, n in cuda_report.instruction_counts(text, op).items():
                    counts.setdefault((arch, cuda_report.short_name(name)), {})[op] = n
    counted = pd.DataFrame(counts).T.rename_axis(["arch", "kernel"])
    display(counted)
    v1_mma = {key: c["mma.sync"] for key, c in counts.items() if key[1].startswith("v1")}
    v2_mma = {key: c["mma.sync"] for key, c in counts.items() if key[1].startswith("v2")}
    lesson(v1_mma and sum(v1_mma.values()) == 0, "v1 contains no tensor-core instruction: not one mma.sync in its PTX",
           f"{len(v1_mma)} kernels")
    # The head dimension is in the kernel's name, e.g. v2<bf16, 64>.
    expected = {key: cuda_report.mma_per_key_tile(int(key[1].rstrip(">").split(", ")[1])) for key in v2_mma}
    lesson(v2_mma == expected and all(n > 0 for n in v2_mma.values()),
           "v2's PTX holds exactly the mma.sync instructions its tile shapes call for",
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
# (SASS, the machine code, calls the instruction `HMMA`; reading it needs `cuobjdump`, which
# this machine's minimal toolkit lacks, and ptxas' report above is already the SASS-level
# resource count.)
#
# The rest of v2 is about feeding those instructions. The scores of one tile of 64 keys: K
# fragments come from shared memory with `ldmatrix`, four 8×8 matrices per instruction, and
# every fragment feeds two `mma`s:

# %%
cuda_markdown(cuda_excerpt(V2, "// S = Q K_j^T.", "__syncthreads();  // every warp is done with K_j"))

# %% [markdown]
# After the softmax, the probabilities do not go back to shared memory at all: the
# accumulator layout of two 8-column score tiles is exactly the layout `mma` wants for its A
# operand, so each lane packs its own values into 16-bit pairs and the second matmul starts:

# %%
cuda_markdown(cuda_excerpt(V2, "// C layout of S tiles", "// O += P V_j"))

# %% [markdown]
# ## On a GPU: correct, one kernel, and how fast
#
# The rest needs a GPU with a CUDA build of PyTorch: the first call builds the extension
# (`torch.utils.cpp_extension`, a minute or two, cached afterwards). The cells below check
# both kernels against the float64 reference on odd shapes and non-contiguous views, profile
# one forward of each (one kernel per forward, with the footprint the trace reports), and
# time them against `triton` and `sdpa_flash` with `kernels.bench`.

# %%
runnable = [n for n in ("cuda_v1", "cuda_v2") if kernels.available(device)[n] is None
            and head_dim in cuda_flash.HEAD_DIMS]
if not on_gpu:
    print("This run is CPU-only, so nothing in this section runs here. The registry says why:")
    for name in ("cuda_v1", "cuda_v2"):
        print(f"  {kernels.available(device)[name]}")
    print("There is no recorded GPU result for these kernels in the repository yet: the compiler "
          "and occupancy sections above are what this machine can establish.")
else:
    for name in ("cuda_v1", "cuda_v2"):
        if name not in runnable:
            why = kernels.available(device)[name] or f"{name}: head_dim {head_dim} not in {cuda_flash.HEAD_DIMS}"
            print("skipped:", why)
    if runnable:
        print("Building the CUDA extension if this machine has not yet (a minute or two)...")
        started = time.perf_counter()
        cuda_flash.extension()
        print(f"extension ready in {time.perf_counter() - started:.1f} s")

# %%
if on_gpu:
    for name in runnable:
        fn = kernels.get(name)
        for b, h, s, layout in ((2, 3, 203, "bhsd"), (2, 3, 203, "bshd view"), (1, heads, seq, "bhsd")):
            qs, ks, vs = inputs(b, h, s, head_dim, dtype=dtype, device=device, seed=s)
            if layout == "bshd view":  # same values, laid out [B, S, H, D]: non-contiguous views
                qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (qs, ks, vs))
            for causal in (True, False):
                verdict = reference.judge(fn(qs, ks, vs, causal=causal), qs, ks, vs, causal)
                lesson(verdict.ok, f"{name} matches the float64 reference by the course's rule",
                       f"B{b} H{h} S{s} D{head_dim} {layout} causal={causal}: {verdict}")

# %%
if on_gpu:
    q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
    footprints = {}
    for name in runnable:
        step = profiling.median_step(profiling.profile(kernels.get(name), q, k, v, label=name,
                                                       active=steps, trace_dir=trace_dir).steps())
        launched = step.kernels[step.kernels["cat"] == "kernel"]
        version = name.removeprefix("cuda_")
        lesson(len(launched) == 1 and f"flash_{version}_kernel" in launched["name"].iloc[0],
               f"one forward of {name} is one kernel on the GPU lane", ", ".join(launched["name"]))
        row = launched.iloc[0]
        cfg = cuda_flash.launch_config(version, head_dim)
        lesson(list(row["block"]) == [cfg.threads, 1, 1]
               and list(row["grid"]) == [math.ceil(seq / cfg.block_m), batch * heads, 1],
               f"{name}'s trace shows the grid and block of its launcher", f"grid {row['grid']}, block {row['block']}")
        lesson(int(row["shared_memory"]) == cfg.dynamic_shared_bytes,
               f"{name}'s shared memory in the trace is the launcher's dynamic shared memory",
               f"{int(row['shared_memory']):,} B")
        smem, reported = int(row["shared_memory"]), row["occupancy_pct"]
        if reported is not None and pd.notna(reported):
            lesson((reported == 0) == (smem > occupancy.KINETO_SHARED_MEM_LIMIT),
                   f"{name}: the trace reads 0% occupancy exactly when its shared memory passes 48 KiB",
                   f"{smem:,} B, trace {reported}%")
        footprints[name] = {"kernel": row["name"][:60], "registers (trace)": row["registers_per_thread"],
                            "shared memory (trace, B)": row["shared_memory"],
                            "est. achieved occupancy % (trace)": row["occupancy_pct"],
                            "GPU time per forward (us)": round(step.gpu_time_us, 1)}
    display(pd.DataFrame(footprints))

# %% [markdown]
# On a GPU run, the table above lists each kernel's footprint as the trace recorded it. Its
# registers should match the compiler report's row for the GPU's architecture when the same
# `nvcc` built both (PyTorch's extension build compiles for the GPU it finds). Then the
# timing, the median of many calls:

# %%
if on_gpu:
    contenders = [n for n in ("sdpa_flash", "triton", *runnable) if kernels.available(device)[n] is None]
    results = bench.sweep(contenders, seqs=(seq,), head_dims=(head_dim,), dtypes=(dtype,), causal=(True,),
                          batch=batch, heads=heads, device=device, progress=None)
    timing = results.to_frame().set_index("impl")[["status", "median_ms", "p10_ms", "p90_ms", "tflops", "reason"]]
    display(timing.round(3))
    if {"cuda_v1", "cuda_v2"} <= set(runnable):
        t1, t2 = timing.loc["cuda_v1", "median_ms"], timing.loc["cuda_v2", "median_ms"]
        lesson(t2 < t1, "tensor cores win: v2 is faster than v1", f"{t1:.3f} ms vs {t2:.3f} ms, {t1 / t2:.1f}x")

# %% [markdown]
# Where this page was built on a CPU, the GPU section above printed why it did not run. For
# scale, the course's reference notes record that a from-scratch FlashAttention-2 in CUDA
# can get close to the real thing (one 16-step write-up reached about 99% of FlashAttention-2
# on an A100 at D = 128, non-causal), and that FlashAttention-2 itself reaches up to
# 230 TFLOP/s forward on an A100, 73% of its 312 TFLOP/s bf16 peak (arXiv 2307.08691). v2
# has the structure of those kernels but none of their later refinements; the showdown
# chapter measures everything side by side.
#
# ## What to remember
#
# - A CUDA kernel's launch is a grid of blocks (here: query tiles × batch·heads) of 128
#   threads in 4 warps; *which thread owns which element* is the design.
# - Registers, shared memory and spills are fixed at compile time: `nvcc -Xptxas -v`
#   reports them without a GPU, and occupancy follows from them by arithmetic.
# - Lower occupancy is not slower: v2 runs fewer warps per SM than v1 because it keeps more
#   on chip.
# - Tensor cores leave a fingerprint in the compiled code: `mma.sync` in PTX (`HMMA` in SASS).
#   A kernel without it does its matmuls one scalar `fma` at a time.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/05_cuda.ipynb), with automatic checks, hints and hidden solutions.
