# %% [markdown]
# # 5. FlashAttention in CUDA, by hand
#
# Chapter 4's Triton [kernel](glossary.md#kernel) worked on whole tiles and let Triton spread
# them over threads. This chapter writes the same forward pass in CUDA, where every such
# decision is ours, twice:
#
# * **v1** (`kernels/cuda/csrc/flash_v1.cu`): the algorithm with nothing in the way, tiles in
#   [shared memory](glossary.md#shared-memory), fp32 arithmetic, and a simple map of threads
#   to elements that changes from phase to phase (the figure below draws it).
# * **v2** (`kernels/cuda/csrc/flash_v2.cu`): FlashAttention-2 on [tensor
#   cores](glossary.md#tensor-core), scores kept in [registers](glossary.md#registers),
#   asynchronous copies into two K/V buffers, the mask applied only where a tile needs it.
#
# **You will learn to:**
#
# - map tiles to threads: the grid of blocks, the [warps](glossary.md#warp), and which thread
#   owns which element, in v1 and v2;
# - read registers, shared memory and spills from `nvcc -Xptxas -v`, and work out
#   [occupancy](glossary.md#occupancy) from them;
# - spot tensor cores in the compiled code: `mma.sync` in the PTX (NVIDIA's portable assembly,
#   which the assembler ptxas turns into the GPU's machine code, SASS), against scalar `fma`;
# - follow v2's four design revisions in the compiler's numbers, one change at a time.
#
# **Before you start:** [4. FlashAttention-2 in Triton](04_triton.ipynb) (the tiles and the
# online softmax) and [3b. The fused backends](03b_sdpa_fused.ipynb) (occupancy). Reading C++.
#
# **Time:** about {reading_minutes} min to read, longer if you study each CUDA excerpt.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math

import torch
from IPython.display import Markdown

import kernels
from kernels import reference
from kernels.bench import sweep
from kernels.bench.results import points_table
from kernels.book import ch05_cuda as ch05
from kernels.borrowed import TRACELENS, traces_box
from kernels.cuda import design, flash as cuda_flash, resources, threads
from kernels.hw import occupancy
from kernels.notebook import glue, glue_all, inputs, lesson, readable, reveal, say, setup, show_lines, timed
from kernels.trace import reader, record
from kernels.trace.attention import find_attention

device, dtype = setup(device, dtype)
V1, V2 = cuda_flash.CSRC / "flash_v1.cu", cuda_flash.CSRC / "flash_v2.cu"
# The kernels exist for head_dim 64 and 128, and v2 takes 16-bit inputs only: where this run is
# in fp32 (as on a CPU), the compiler sections read the bf16 kernels.
kernel_dim = head_dim if head_dim in cuda_flash.HEAD_DIMS else 64
kernel_dtype = "fp16" if dtype == torch.float16 else "bf16"
glue("kernel_dim", kernel_dim)
glue("kernel_dtype", kernel_dtype)

# %% tags=["remove-input"]
traces_box({"H100 Qwen": TRACELENS["h100_qwen"]})

# %% [markdown]
# ## From tiles to threads
#
# Both kernels split the work the way the Triton kernel did: one **thread block**
# ([CTA](glossary.md#cta)) per tile of query rows of one (batch, head), so the launch **grid**
# is query tiles × (batch × heads), and each block walks over the keys tile by tile. What CUDA
# adds is the inside of a block: a few hundred threads, run as warps of 32. Both launches, at
# this chapter's shape (`kernels.cuda.flash.launch_config` holds the formulas of `flash_api.h`):

# %%
launches = cuda_flash.launch_configs(batch, heads, seq, kernel_dim)

# %% tags=["remove-input"]
launches.drop(index="dynamic shared memory (B)").map(readable)  # its shared memory: the resources table below

# %% [markdown]
# v2 puts batch × heads on the grid's x axis, which holds 2³¹ − 1 blocks where y stops at
# 65,535. Inside a block the two part ways. The figure colours
# each element of a tile by the warp whose thread computes it, from the index formulas of the
# two `.cu` files (`kernels.cuda.threads`):
#
# * **v1** changes owners by phase. Scores: warp `w` takes the rows `r` with `r % 4 == w`
#   (the horizontal stripes), and within it lane `t` takes key column `t`. The softmax: one
#   thread per row (so only warp 0 works). `O += P V`: by output column (`t % D`).
# * **v2**: warp `w` owns query rows `16w … 16w+15` for the whole kernel. Inside it, lane
#   `4g + t` holds rows `g` and `g+8`, columns `2t` and `2t+1` of every 8-column tile: the
#   accumulator layout of the tensor-core instruction `mma.m16n8k16`. Squares outline one lane.

# %%
#| caption: Who computes each element, coloured by warp. Top: cuda_v1's three phases, each with its own owners. Bottom: cuda_v2, where warp w owns rows 16w to 16w+15 throughout.
#| alt: Colour maps of query rows by column: three small panels for v1's scores, softmax and output, and a tall panel for v2's accumulators in eight horizontal bands, one per warp.
fig = threads.thread_map(head_dim=kernel_dim)

# %% tags=["remove-input"]
v1_softmax_warps = threads.rows_of_warps(threads.owners_v1_softmax())
lesson(list(v1_softmax_warps) == [0],
       f"v1's softmax runs on warp 0 alone: the other {launches['v1']['warps per block'] - 1} warps wait at the barrier")
v2_rows = threads.rows_of_warps(threads.owners_v2(kernel_dim))
lesson(all(rows == set(range(16 * w, 16 * w + 16)) for w, rows in v2_rows.items()),
       "in v2 each warp owns 16 whole query rows, so a row's softmax never leaves its warp", f"{len(v2_rows)} warps")

# %% [markdown]
# ## v1, read from the source
#
# The kernel, `flash_v1_kernel`, carves its dynamic shared memory into the tiles it keeps (Q
# for the whole kernel, K and V for the current key tile, the scores, one factor per row).
# Tiles are then copied element by element and converted to fp32 on the way in (`load_tile`,
# the second excerpt): consecutive threads read consecutive elements of a row, so a warp's 32
# loads combine into a few wide memory transactions (they *coalesce*). The `D + 1` and `N + 1`
# are padding: shared memory serves a warp from 32 banks of 4-byte words, and with rows a
# multiple of 32 words long a whole column sits in one bank, so 32 threads reading a column (as
# phases 1 and 2 do) would queue for it; one spare word per row staggers the rows across the
# banks (v2's `kPitch`, D + 8, does the same for `ldmatrix`).

# %%
ch05.excerpts(V1, ("extern __shared__ float smem[];", "float* row_s = s_s"),
              ("for (int idx = threadIdx.x; idx < count * D",))

# %% [markdown]
# Then, for each tile of 32 keys, three phases separated by `__syncthreads()` (the first two
# below):
#
# 1. the scores: each thread owns 8 scores (one key column, 8 rows), and for each `d` reads
#    one value of K and multiplies it into its 8 running dot products;
# 2. the online softmax of chapter 4, one thread per row (`threadIdx.x < M`): the factor
#    `alpha` that rescales what was summed so far, and the probabilities, written over the
#    scores;
# 3. each thread's output accumulators rescaled by `alpha`, plus `P @ V`, one output column
#    per thread (not shown). After the last tile each row is divided by its sum and written
#    back in the input's dtype.

# %%
ch05.excerpts(V1, ("for (int d = 0; d < D; ++d) {",),
              ("const float alpha = expf(row_max - shift);", "row_max = new_max;"))

# %% [markdown]
# ## What the compiler says it costs
#
# `nvcc -Xptxas -v` makes the assembler, ptxas, print what each kernel needs: registers per thread, static shared memory per block,
# bytes spilled to slow local memory. Dynamic shared memory is decided at launch, so the
# launch configuration adds it (`kernels.cuda.resources.read_kernels`; where there is no
# `nvcc`, it reads a snapshot of one real `nvcc` run, and says so).
#
# Guess before the table: v1 keeps its tiles in shared memory, v2 keeps Q, the scores and the
# output in registers. What share of an sm_80 [SM](glossary.md#sm)'s warp slots (its
# occupancy) do you expect v2 to fill?

# %%
guess_v2_occupancy_sm_80 = 50.0  # percent; edit me before running on

# %%
archs = ("sm_80", "sm_90")
all_kernels, ptx, resources_source = resources.read_kernels(archs)
table = resources.resources_table(all_kernels)

# %% tags=["remove-input"]
glue("resources_source", ch05.compiler_words(resources_source))
focus = {(arch, version): resources.find_kernel(all_kernels, arch, version, kernel_dtype, kernel_dim)
         for arch in archs for version in ("v1", "v2")}
occ = {key: resources.occupancy_of(k) for key, k in focus.items()}
reveal(guess_v2_occupancy_sm_80, occ["sm_80", "v2"].percent, "v2's occupancy on sm_80 (%)", source="the compiler's resource report")
shown = table[(table.dtype == kernel_dtype) & (table.arch == "sm_80")].assign(
    kernel=lambda t: t.kernel + "<" + t.dtype + ", " + t.head_dim.astype(str) + ">",
    **{"shared KiB": lambda t: t["dynamic smem (B)"] / 1024,
       "limited by": lambda t: t["limited by"].str.replace("_", " "),
       "a trace reads %": lambda t: (t["a trace reads %"] + 0.5).map(math.floor)})   # Kineto's lround
shown.set_index("kernel")[["registers", "shared KiB", "occupancy %", "limited by", "a trace reads %"]]

# %% [markdown]
# These numbers were {glue:text}`resources_source`. The table shows sm_80, the A100 (the
# lessons check sm_90, the H100 and H200, too); the last three columns are the occupancy those
# resources allow ([chapter 3b](03b_sdpa_fused.ipynb)) and what a PyTorch trace would print
# for a grid that fills every SM, rounded to a whole number as the trace does (12.5% reads
# 13). Both kernels tell ptxas how they launch
# (`__launch_bounds__`), which lets it use up to 255 registers per thread.

# %% tags=["remove-input"]
for (arch, version), k in focus.items():
    glue(f"{version}_regs_{arch}", k.registers)
    glue(f"{version}_occ_{arch}", occ[arch, version].percent)
per_arch = table[table.arch == archs[0]].groupby("kernel")["dtype"].unique()
lesson(not any(k.spills for k in all_kernels) and all(k.shared_bytes == 0 for k in all_kernels),
       "no kernel spills registers, and all shared memory is dynamic: the launcher decides its size",
       f"{len(all_kernels)} kernels: {len(archs)} archs × (" + " + ".join(
           f"{v} in {len(d)} dtypes" for v, d in per_arch.items()) + f") × {table.head_dim.nunique()} head dims")
lesson(all(focus[a, "v2"].registers > focus[a, "v1"].registers and occ[a, "v2"].percent <= occ[a, "v1"].percent
           and occ[a, "v2"].limited_by == "registers" for a in archs),
       "v2 needs more registers per thread than v1, which limits it to the lower occupancy",
       ", ".join(f"{a}: {focus[a, 'v1'].registers} vs {focus[a, 'v2'].registers} registers" for a in archs))

# %% [markdown]
# ## Occupancy, by hand
#
# Registers (handed out per warp, in units of 256), shared memory, and the SM's warp and block
# slots each cap the blocks per SM; the smallest cap wins. For v2 on sm_80:

# %%
v2_sm80 = resources.find_kernel(all_kernels, "sm_80", "v2", kernel_dtype, kernel_dim)
print(resources.occupancy_of(v2_sm80).explain())

# %% tags=["remove-input"]
zero_in_a_trace = sorted({resources.instance_label(k.name) for k in all_kernels
                          if resources.kineto_reads(k) == 0 and f"<{kernel_dtype}," in resources.instance_label(k.name)})
lesson(all(resources.occupancy_of(k).blocks_per_sm > 0 for k in all_kernels),
       "every kernel fits on an SM, including those a trace would show at 0%", ", ".join(zero_in_a_trace) or "none at 0%")
glue("kineto_zero_kernels", ", ".join(zero_in_a_trace) or "none of them")

# %% [markdown]
# On sm_80 v1 reaches {glue:text}`v1_occ_sm_80:.1f`% occupancy and v2
# {glue:text}`v2_occ_sm_80:.1f`% (on sm_90: {glue:text}`v1_occ_sm_90:.1f`% and
# {glue:text}`v2_occ_sm_90:.1f`%). The kernel built for speed has fewer warps per SM, as the
# source article found for PyTorch's own flash kernel on an A100 (about 13% estimated, and
# the fastest kernel in its trace). Occupancy hides memory latency with more warps;
# FlashAttention hides it by reusing tiles already on chip and by loading the next K/V tile
# (`cp.async` in v2) while the tensor cores work on the current one.
#
# A PyTorch trace would show {glue:text}`kineto_zero_kernels` at 0% (the last column): each
# asks for more than 48 KiB of shared memory per block, which [Kineto](glossary.md#kineto)'s
# estimate does not allow for ([chapter 3b](03b_sdpa_fused.ipynb)
# explains that 0%).
#
# ## Why v1 would be slow, and v2's fingerprint
#
# Read v1's phase 1 again: each multiply-add is one fp32 `fma` instruction of one thread, on
# the SM's general-purpose *CUDA cores*, in fp32 even when the inputs are bf16. Tensor cores
# do the same work a tile at a time. The instruction v2 uses, `mma.sync.aligned.m16n8k16` with
# f16/bf16 inputs, needs sm_80 (Ampere) or newer. It multiplies a 16×16 tile by a 16×8 tile, 16 · 8 · 16 =
# {glue:text}`mma_macs` multiply-adds, as *one* instruction of a warp, with fp32 accumulators.
# v2 issues it from inline PTX (`mma_16x8x16`, folded below):

# %% tags=["remove-cell"]
mma_macs = resources.MMA_M * resources.MMA_N * resources.MMA_K
glue_all(mma_macs=f"{mma_macs:,}", mma_macs_per_lane=mma_macs // 32)

# %% tags=["hide-output"]
show_lines(V2, "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,")

# %% [markdown]
# That is {glue:text}`mma_macs_per_lane` multiply-adds per thread per instruction, against one
# for an `fma`. The compiler's output shows it: count the instructions in each kernel's PTX
# (`nvcc -ptx`, kept from the compile above). The loops over a key tile are unrolled, so a
# warp's `mma.sync` for one tile appear once per copy of the tile pass:
# `(BLOCK_N / 8) · (D / 16)` for `S = Q Kᵀ` plus `(D / 8) · (BLOCK_N / 16)` for `O += P V`
# (`kernels.cuda.resources.mma_per_key_tile`). v2 has two copies, with and without the mask.

# %% tags=["remove-input"]
if ptx is None:
    say(f"No PTX to read: the resources were {resources_source} (the snapshot holds resources only).")
    for key in ("v2_mma", "v1_mma", "v1_fma"):
        glue(key, "not counted (no PTX on this run)")
else:
    counted = resources.instruction_table(ptx, ("mma.sync", "fma.rn.f32", "ldmatrix", "cp.async.cg", "shfl.sync"))
    lesson(not counted.filter(like="v1<", axis=0)["mma.sync"].any(), "v1 contains no tensor-core instruction")
    lesson(all(counted.loc[(a, f"v2<{kernel_dtype}, {d}>"), "mma.sync"] == 2 * resources.mma_per_key_tile(d)
               for a in archs for d in cuda_flash.HEAD_DIMS),
           "v2's PTX holds exactly the mma.sync its tile shapes call for, in each of its two tile passes")
    mine = counted.loc["sm_80"].loc[[f"v1<{kernel_dtype}, {kernel_dim}>", f"v2<{kernel_dtype}, {kernel_dim}>"]]
    glue("v2_mma", mine.loc[f"v2<{kernel_dtype}, {kernel_dim}>", "mma.sync"])
    glue("v1_mma", mine.loc[f"v1<{kernel_dtype}, {kernel_dim}>", "mma.sync"])
    glue("v1_fma", mine.loc[f"v1<{kernel_dtype}, {kernel_dim}>", "fma.rn.f32"])  # the counts the prose reads

# %% [markdown]
# In the PTX for sm_80, v2 holds {glue:text}`v2_mma` `mma.sync` instructions and v1
# {glue:text}`v1_mma`: v1 does its arithmetic with {glue:text}`v1_fma` scalar `fma`
# instructions instead. A GPU trace shows the same difference in the names of
# [cuBLAS](glossary.md#cublas)'s kernels (`s16816gemm`: tensor cores, `sgemm`: CUDA cores);
# here it is read from the program itself (SASS, read with `cuobjdump`, calls it `HMMA`).
#
# The rest of v2 feeds those instructions (both excerpts, folded, are from `Block::tile_pass`). For
# the scores of a 64-key tile, K fragments come from shared memory with `ldmatrix`, four 8×8
# matrices per instruction, enough for two `mma`s. After the softmax, the probabilities never
# go back to shared memory: the accumulator layout of two 8-column score tiles is exactly the
# layout `mma` wants for its A operand, so each lane packs its own values into 16-bit pairs
# and the second matmul starts:

# %% tags=["hide-output"]
display(show_lines(V2, "for (int n = 0; n < kNTiles; n += 2) {"))
show_lines(V2, "// C layout of S tiles")

# %% [markdown]
# ## v2, one change at a time
#
# v2 went through four revisions, each aimed at a cost the compiler can show. The source keeps
# them as four compile-time switches of a `Design` template
# (`kBlockM`, `kSplitMask`, `kFastExp2`, `kDoubleBuffer`), so the same file compiles at every
# revision (`kernels.cuda.design`). Revision 0 is the first version (64 query rows, the mask
# on every tile, `exp2f`, one K/V buffer); each later one turns on one change: 1, 128 rows per
# block; 2, a split mask; 3, a fast `exp2`; 4, double buffering, the kernel that runs.
#
# Guess before the table: which revisions make a block ask for *more* shared memory? (A list
# of revision numbers.)

# %%
guess_revisions_growing_shared_memory = [4]  # edit me: which of 1..4?

# %%
design_rows, revisions_source = design.read_revisions(kernel_dim, archs)
by_revision = design.design_table(design_rows).set_index(["arch", "revision"])

# %% tags=["remove-input"]
revision_of = {(r.kernel.arch, r.index): r for r in design_rows}
cost = design.register_cost(design_rows)
grows = {a: [i for i in range(1, 5) if revision_of[a, i].kernel.total_shared_bytes
             > revision_of[a, i - 1].kernel.total_shared_bytes] for a in archs}
ch05.reveal_revisions(guess_revisions_growing_shared_memory, grows["sm_80"], "revisions that grow a block's shared memory",
                      {1: "Q's buffer grows from 64 rows to 128", 2: "a second tile-pass body: code, not memory",
                       3: "other instructions on the same tiles",
                       4: "the second K/V buffer is the 128 rows Q passed through"})
lesson(grows["sm_80"] == grows["sm_90"] == [1],
       "only revision 1, 128 query rows per block, makes a block ask for more shared memory",
       ", ".join(f"{revision_of['sm_80', i].kernel.total_shared_bytes:,} B" for i in range(5)))
lesson(not any(r.kernel.spills or r.kernel.stack_frame_bytes for r in design_rows),
       "no revision spills registers or keeps anything in local memory",
       f"{len(design_rows)} kernels: {len(design_rows) // len(archs)} revisions × {len(archs)} archs")
revisions_words = ch05.compiler_words(revisions_source)
glue("revisions_source", "compiled the same way" if revisions_words == ch05.compiler_words(resources_source)
     else revisions_words)
for a, i in by_revision.index:
    glue(f"rev{i}_regs_{a}", by_revision.loc[(a, i), "registers"])
warps_before_after = {a: (by_revision.loc[(a, 0), "warps/SM"], by_revision.loc[(a, 1), "warps/SM"]) for a in archs}
glue("rev1_warps", ", and ".join(f"stay at {w0} on {a}" if w0 == w1 else f"drop {w0} → {w1} on {a}"
                                 for a, (w0, w1) in warps_before_after.items()))
sm80 = by_revision.loc["sm_80"].assign(**{"shared KiB": lambda t: t["shared memory (B)"] / 1024,
                                          "barriers per tile": lambda t: t["barriers per tile"].map(lambda b: int(b) if b == int(b) else b)})
sm80[["registers", "shared KiB", "warps/SM", "mma.sync", "ex2.approx.ftz.f32", "barriers per tile"]]

# %% [markdown]
# One row per revision on sm_80, bf16, D = {glue:text}`kernel_dim`,
# {glue:text}`revisions_source` (the lessons check sm_90 too); the last three columns are
# counts in each revision's PTX.

# %% [markdown]
# **128 query rows per block.** Revision 1 doubles a block's rows and warps. A warp's own work
# does not change (16 rows against a 64-key tile), so neither do its registers much
# ({glue:text}`rev0_regs_sm_80` → {glue:text}`rev1_regs_sm_80`). What changes is reuse: every
# K/V tile copied into shared memory serves twice as many queries, so a forward reads K and V
# from [L2](glossary.md#l2-cache) or [HBM](glossary.md#hbm) half as often. The price, where
# there is one, is occupancy: a block of 8 warps is a bigger unit to fit, and warps per SM
# {glue:text}`rev1_warps`.

# %% tags=["remove-input"]
lesson(all(revision_of[a, 1].revision.block_m == 2 * revision_of[a, 0].revision.block_m
           and revision_of[a, 1].kernel.threads_per_block == 2 * revision_of[a, 0].kernel.threads_per_block
           and abs(revision_of[a, 1].kernel.registers - revision_of[a, 0].kernel.registers)
           <= 0.1 * revision_of[a, 0].kernel.registers for a in archs),
       "twice the rows and the threads per block move registers per thread by at most 10%: a warp's work is unchanged")
lesson(all(by_revision.loc[(a, 1), "warps/SM"] <= by_revision.loc[(a, 0), "warps/SM"] for a in archs),
       "bigger blocks never raise the warps per SM")

# %% [markdown]
# **Masked and unmasked tile passes.** Most key tiles a block reads are visible to all its
# rows; only the tiles on the causal diagonal, and a ragged last tile, need the mask. The first
# version tested every score anyway. Now the tile pass is a template on `kMasked`: only the
# masked instantiation asks `flash::visible(query, key, ...)` of each score, and which loop a
# tile is in (`attention_block`) decides, once per tile, which instantiation runs it:

# %%
show_lines(V2, "const int unmasked = Dsg::split_mask", "tile_pass<true>(j)")

# %% tags=["remove-input"]
v2_cfg = cuda_flash.launch_config("v2", kernel_dim)
census = design.tile_census(seq, seq, v2_cfg.block_m, v2_cfg.block_n, causal=True)
glue_all(kernel_seq=seq, census_share=f"{design.unmasked_percent(census):.0f}")
lesson(all(design.tile_bodies(revision_of[a, 2]) == 2 * design.tile_bodies(revision_of[a, 1]) == 2 for a in archs),
       "splitting the mask off doubles the tile pass's code: two bodies, each with one tile's mma.sync")

# %% [markdown]
# The PTX shows the second body. At S = {glue:text}`kernel_seq` causal,
# {glue:text}`census_share`% of the tiles a block reads skip the mask, a share that grows with
# S. Tiles above the diagonal are never loaded at all, which is why causal attention costs
# about half the work ([chapter 6](06_showdown.ipynb)).
#
# **Fast exp2, the scale folded in.** `exp(x · scale)` is `exp2(x · scale · log₂e)`. `exp2f`
# compiles to `ex2.approx.f32`, which must handle subnormal numbers; the `.ftz` form flushes
# them to zero ([PTX ISA](https://docs.nvidia.com/cuda/parallel-thread-execution/), `ex2`),
# which costs a probability nothing. The unmasked pass also stops scaling each score first:
# the max of the raw scores times the scale is the max of the scaled ones, so "scale, subtract
# the max" becomes one fused multiply-add:

# %%
ch05.excerpts(V2, ("asm(\"ex2.approx.ftz.f32", "\"=f\"(y)"),
              ("const float x = kFold ? fmaf", "s[n][c] = exp2_of"))

# %% tags=["remove-input"]
lesson(all(revision_of[a, 2].counts["ex2.approx.ftz.f32"] == 0 and revision_of[a, 3].counts["ex2.approx.f32"] == 0
           and revision_of[a, 3].counts["ex2.approx.ftz.f32"] == revision_of[a, 2].counts["ex2.approx.f32"] > 0
           for a in archs),
       "revision 3 swaps every ex2.approx.f32 for ex2.approx.ftz.f32, one for one",
       f"sm_80: {revision_of['sm_80', 2].counts['ex2.approx.f32']} of them")

# %% [markdown]
# The gain is in instructions per score, which resource counts cannot show and a GPU run must.
#
# **K/V double-buffered.** With one buffer, tile j + 1 can load only after every warp is done
# with tile j: a barrier before the compute and one after, and nothing to overlap the load
# with. With two, the copies of tile j + 1 (`cp.async`, global memory straight into shared
# memory) go into the other buffer and land while tile j computes; one barrier per tile does
# both jobs (the top of `tile_pass`):

# %%
show_lines(V2, "cp_async_wait<0>();  // this thread's copies of tile j")

# %% tags=["remove-input"]
lesson(all(design.barriers_per_tile(revision_of[a, 3]) == 2 and design.barriers_per_tile(revision_of[a, 4]) == 1
           for a in archs), "double buffering halves the barriers per tile, 2 -> 1, counted in the PTX")
lesson(all(revision_of[a, 4].kernel.total_shared_bytes == revision_of[a, 3].kernel.total_shared_bytes for a in archs),
       "the second K/V buffer costs no shared memory: Q passes through it before tile 1 arrives")
moves = ", ".join(f"{revision_of[a, 3].kernel.registers} → {revision_of[a, 4].kernel.registers} on {a}" for a in archs)
glue("buffer_registers", f"it costs up to {cost[4]} registers per thread ({moves})" if cost[4] > 0 else
     f"at this head dim it costs no registers ({moves}); at D = 128, where a warp holds more, it can")

# %% [markdown]
# Where double buffering costs anything it is registers, since the
# addresses of the next tile's copies stay live across the compute: {glue:text}`buffer_registers`.
#
# ## Beside PyTorch's flash kernel, on a real trace
#
# How does v2's launch compare with the kernel PyTorch itself runs? In the H100 Qwen trace,
# Qwen1.5-0.5B's forward on an H100, [SDPA](glossary.md#sdpa) ran `flash_fwd_kernel`, and the
# trace records its grid, block, registers and shared memory; beside it, what v2 would launch
# for the same shape (`launch_config` and the compiler's registers):

# %%
qwen = TRACELENS["h100_qwen"]
qwen_trace = qwen.trace()
qwen_call = find_attention(qwen.step(trace=qwen_trace)).calls[0]
gpu = qwen_trace.device_properties[0]
qwen_arch = occupancy.arch_of((gpu["computeMajor"], gpu["computeMinor"]))
torch_launch = occupancy.launch_from_footprint("flash_fwd_kernel (H100 Qwen)", qwen_call.footprint(), "the trace")
v2_launch = resources.v2_launch(qwen_call.batch_heads, qwen_call.sq, int(qwen_call.d or 0), str(qwen_call.dtype), qwen_arch,
                                all_kernels)

# %% tags=["remove-cell"]
glue("qwen_shape", f"{qwen_call.op} at B·H = {qwen_call.batch_heads}, S = {qwen_call.sq}, D = {qwen_call.d}, "
     f"{qwen_call.dtype}, {'causal' if qwen_call.causal else 'not causal'}, on {gpu['numSms']} SMs ({qwen_arch})")

# %%
occupancy.launch_table([torch_launch, v2_launch], qwen_arch, gpu["numSms"])[
    ["threads per block", "registers", "shared KiB", "CTAs per SM", "occupancy %", "waves"]].T

# %% tags=["remove-input"]
occ_torch, occ_v2 = torch_launch.occupancy(qwen_arch), v2_launch.occupancy(qwen_arch)
lesson(torch_launch.blocks == v2_launch.blocks, "v2 launches as many CTAs as torch's kernel: 128 query rows each",
       f"{v2_launch.blocks:,}: torch's grid {torch_launch.grid}, v2's {v2_launch.grid}")
lesson(occ_torch.limited_by == occ_v2.limited_by == "registers", "both kernels are limited by registers on this GPU")
torch_waves, v2_waves = (launch.waves(qwen_arch, gpu["numSms"]) for launch in (torch_launch, v2_launch))
lesson(occ_v2.warps_per_block > occ_torch.warps_per_block and occ_v2.blocks_per_sm < occ_torch.blocks_per_sm
       and v2_waves > torch_waves,
       "v2 spends more warps on its 128 rows, so fewer of its CTAs fit an SM and its CTAs take more waves",
       f"{occ_v2.warps_per_block} vs {occ_torch.warps_per_block} warps, {occ_v2.blocks_per_sm} vs "
       f"{occ_torch.blocks_per_sm} CTAs per SM, {v2_waves:.2f} vs {torch_waves:.2f} waves")
glue_all(qwen_torch_warps=occ_torch.warps_per_sm, qwen_v2_warps=occ_v2.warps_per_sm,
         qwen_torch_cta_warps=occ_torch.warps_per_block, qwen_v2_cta_warps=occ_v2.warps_per_block,
         qwen_torch_ctas=occ_torch.blocks_per_sm, qwen_v2_ctas=occ_v2.blocks_per_sm,
         qwen_torch_waves=torch_waves, qwen_v2_waves=v2_waves)
runnable = [n for n in ("cuda_v1", "cuda_v2") if kernels.available(device)[n] is None
            and head_dim in cuda_flash.HEAD_DIMS]
glue("speed_where", "This copy of the page ran on one: its last section has the numbers." if runnable else
     "This copy of the page ran without one, so it has no timing of v1 or v2.")

# %% [markdown]
# The call: {glue:text}`qwen_shape`. Both launch one CTA per 128 query rows of one (batch,
# head), and both spend registers to keep tiles on chip. But torch's kernel gives those rows
# {glue:text}`qwen_torch_cta_warps` warps and v2 {glue:text}`qwen_v2_cta_warps`, so
# {glue:text}`qwen_torch_ctas` of torch's CTAs fit an SM and only {glue:text}`qwen_v2_ctas` of
# v2's. Torch's kernel keeps {glue:text}`qwen_torch_warps` warps per SM resident and v2
# {glue:text}`qwen_v2_warps`, but v2 works on fewer query tiles at once, so its CTAs run in
# {glue:text}`qwen_v2_waves:.2f` [waves](glossary.md#wave) over the SMs where torch's take
# {glue:text}`qwen_torch_waves:.2f`.
#
# How fast each version runs needs a GPU: run on one, this page adds a last section that times
# them against `triton` and `sdpa_flash`, and `python -m kernels.bench` times them too.
# {glue:text}`speed_where`

# %% tags=["remove-input"]
# The book's own GPU recording: build the extension, check both kernels against the float64
# reference at this page's shape (odd shapes are the GPU tests'), profile one forward of each
# (one kernel per forward) and time them against triton and sdpa_flash. Nothing to show on a CPU.
if runnable:
    display(Markdown("## On this GPU: correct, one kernel, and how fast\n\nThis page was built on a GPU: the "
                     "extension is built, both kernels are checked against the float64 reference at this page's "
                     "shape, one forward of each is profiled, and they are timed against `triton` and `sdpa_flash`."))
    timed(cuda_flash.extension, "extension ready")
    q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
    for name in runnable:  # odd shapes, views, grouped heads and Sq != Sk: the GPU tests (tests/cuda)
        for causal in (True, False):
            verdict = reference.judge(kernels.get(name)(q, k, v, causal=causal), q, k, v, causal)
            lesson(verdict.ok, f"{name} matches the float64 reference by the course's rule", f"causal={causal}: {verdict}")
    steps = {name: reader.median_step(record.profile(kernels.get(name), q, k, v, label=name,
                                                     active=active_steps, trace_dir=trace_dir).steps())
             for name in runnable}
    display(ch05.cuda_forwards(steps, head_dim, batch, heads, seq))
    contenders = [n for n in ("sdpa_flash", "triton", *runnable) if kernels.available(device)[n] is None]
    results = sweep.sweep(contenders, seqs=(seq,), head_dims=(head_dim,), dtypes=(dtype,), causal=(True,),
                          batch=batch, heads=heads, device=device, progress=None)
    display(points_table(results, ["status", "median_ms", "p10_ms", "p90_ms", "tflops", "reason"], index="impl"))
    ch05.tensor_cores_win(results)

# %% [markdown]
# ## What to remember
#
# - A launch is a grid of blocks of a few warps; *which thread owns which element* is the design.
# - Registers, shared memory and spills are fixed at compile time: `nvcc -Xptxas -v` prints
#   them without a GPU, occupancy follows by arithmetic, and lower occupancy is not necessarily slower: the source
#   article's fastest backend ran at about 13%.
# - Tensor cores leave a fingerprint: `mma.sync` in PTX (`HMMA` in SASS), not scalar `fma`.
# - A design change shows in the compiler's numbers before it runs; what it is worth needs a GPU.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/05_cuda.ipynb), with automatic checks, hints and hidden solutions.
