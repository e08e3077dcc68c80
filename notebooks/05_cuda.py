# %% [markdown]
# # 5. FlashAttention in CUDA, by hand
#
# Chapter 4's Triton [kernel](glossary.md#kernel) worked on whole tiles and let Triton spread
# them over threads. Here the same forward is written in CUDA, where every such decision is
# ours, twice:
#
# * **v1** (`kernels/cuda/csrc/flash_v1.cu`): the plain algorithm: tiles in
#   [shared memory](glossary.md#shared-memory), fp32 arithmetic (inputs converted on load),
#   threads mapped to elements anew in each phase.
# * **v2** (`kernels/cuda/csrc/flash_v2.cu`): FlashAttention-2 on [tensor
#   cores](glossary.md#tensor-core), scores in [registers](glossary.md#registers), two K/V
#   buffers filled asynchronously, the mask only where a tile needs it.
#
# **You will learn to:**
#
# - map tiles to threads: which thread of which [warp](glossary.md#warp) owns each element;
# - read registers, shared memory and spills from `nvcc -Xptxas -v`, and work out
#   [occupancy](glossary.md#occupancy) from them;
# - spot tensor cores in PTX (NVIDIA's portable assembly, which ptxas turns into machine code,
#   SASS): `mma.sync`, not scalar `fma`;
# - follow v2's four design revisions in the compiler's numbers.
#
# **Before you start:** [4. FlashAttention-2 in Triton](04_triton.ipynb) and
# [3b. The fused backends](03b_sdpa_fused.ipynb) (occupancy); reading C++.
#
# **Time:** about {reading_minutes} min to read, longer if you open the folded CUDA excerpts.

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
# Both kernels split the work as the Triton kernel did: one **thread block**
# ([CTA](glossary.md#cta)) per tile of query rows of one (batch, head), walking over the keys.
# CUDA adds the inside of a block: a few hundred threads, run as warps of 32. Both launches at
# this chapter's shape (the formulas of `kernels/cuda/csrc/flash_api.h`):

# %%
launches = cuda_flash.launch_configs(batch, heads, seq, kernel_dim)

# %% tags=["remove-input"]
launches.drop(index="dynamic shared memory (B)").map(readable)  # its shared memory: the resources table below

# %% [markdown]
# v2 puts batch × heads on the grid's x axis, as chapter 4's kernel does. Inside a block the
# two part ways; the figure colours each element of a tile by the warp that computes it, from
# the `.cu` files' index formulas:
#
# * **v1** changes owners by phase. Scores: warp `w` takes the rows `r % 4 == w`, lane `t` key
#   column `t`; softmax: one thread per row; `O += P V`: by column.
# * **v2**: lane `4g + t` of warp `w` holds rows `16w + g` and `16w + g + 8`, columns `2t` and
#   `2t+1` of each 8-column tile: the accumulator layout of the tensor-core instruction
#   `mma.m16n8k16`. Squares outline one lane.

# %%
#| caption: Who computes each element, coloured by warp. Top: cuda_v1's three phases, each with its own owners. Bottom: cuda_v2, where warp w owns rows 16w to 16w+15 throughout.
#| alt: Colour maps of query rows by column: three small panels for v1's scores, softmax and output, and a tall panel for v2's accumulators in eight horizontal bands, one per warp.
threads.thread_map(head_dim=kernel_dim)

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
# `flash_v1_kernel` carves its dynamic shared memory into the tiles it keeps, and `load_tile`
# fills them element by element in fp32 (both folded below): consecutive threads read
# consecutive elements, so a warp's 32 loads *coalesce* into a few wide transactions. The
# `D + 1` and `N + 1` are padding: shared memory serves a warp from 32 banks of 4-byte words, so
# with rows a multiple of 32 words a column sits in one bank and 32 threads reading it queue.
# One spare word per row staggers the rows.

# %% tags=["remove-input", "hide-output"]
ch05.excerpts(V1, ("extern __shared__ float smem[];", "float* row_s = s_s"),
              ("for (int idx = threadIdx.x; idx < count * D",))

# %% [markdown]
# Then, for each tile of 32 keys, three phases separated by `__syncthreads()`:
#
# 1. scores: each thread owns 8 (one key column, 8 rows), multiplying one K value per `d` into
#    its 8 dot products (below);
# 2. chapter 4's online softmax, one thread per row: `alpha`, and the probabilities written
#    over the scores (folded below);
# 3. the output rescaled by `alpha`, plus `P @ V`, one output column per thread; at the end,
#    each row divided by its sum.

# %%
show_lines(V1, "for (int d = 0; d < D; ++d) {")

# %% tags=["remove-input", "hide-output"]
show_lines(V1, "const float alpha = expf(row_max - shift);", "row_max = new_max;")

# %% [markdown]
# ## What the compiler says it costs
#
# `nvcc -Xptxas -v` makes the assembler, ptxas, print each kernel's registers per thread, static
# shared memory and bytes spilled to slow local memory; the launch adds the dynamic shared
# memory (`resources.read_kernels`).
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
shown.set_index("kernel").rename_axis(f"sm_80 (A100), {kernel_dtype}")[["registers", "shared KiB", "occupancy %", "limited by", "a trace reads %"]]

# %% [markdown]
# These numbers were {glue:text}`resources_source`; sm_80 is the A100. The last three columns
# are the occupancy these resources allow ([chapter 3b](03b_sdpa_fused.ipynb)) and what a
# PyTorch trace would print, rounded as the trace does (12.5% reads 13).

# %% tags=["remove-input"]
for (arch, version), k in focus.items():
    glue(f"{version}_regs_{arch}", k.registers)
    glue(f"{version}_occ_{arch}", occ[arch, version].percent)
lesson(not any(k.spills for k in all_kernels) and all(k.shared_bytes == 0 for k in all_kernels),
       "no kernel spills, and all shared memory is dynamic: the launcher sizes it",
       f"{len(all_kernels)} kernels")
lesson(all(focus[a, "v2"].registers > focus[a, "v1"].registers and occ[a, "v2"].percent <= occ[a, "v1"].percent
           and occ[a, "v2"].limited_by == "registers" for a in archs),
       "v2 needs more registers per thread than v1, capping it at the lower occupancy",
       ", ".join(f"{a}: v1 {focus[a, 'v1'].registers} vs v2 {focus[a, 'v2'].registers}" for a in archs))

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
# The kernel built for speed has the lower occupancy, as the source article (Hugging Face's
# "Profiling in PyTorch", Part 3) found for PyTorch's
# own flash kernel on an A100 (about 13%, and the fastest in its trace): occupancy hides memory
# latency with more warps, FlashAttention by reusing tiles on chip.
#
# Those a trace shows at 0% ask for over 48 KiB of shared memory per block, which
# [Kineto](glossary.md#kineto)'s estimate does not allow for ([chapter 3b](03b_sdpa_fused.ipynb)).
#
# ## Why v1 would be slow, and v2's fingerprint
#
# v1's phase 1 does each multiply-add as one fp32 `fma` of one thread, on the SM's
# general-purpose *CUDA cores*. Tensor cores work a tile at a time:
# `mma.sync.aligned.m16n8k16` (f16/bf16 inputs, sm_80 or newer) multiplies a 16×16 by a 16×8
# tile, {glue:text}`mma_macs` multiply-adds, as *one* warp instruction with fp32 accumulators.
# v2 issues it from inline PTX (`mma_16x8x16`, folded below):

# %% tags=["remove-cell"]
mma_macs = resources.MMA_M * resources.MMA_N * resources.MMA_K
glue_all(mma_macs=f"{mma_macs:,}", mma_macs_per_lane=mma_macs // 32)

# %% tags=["remove-input", "hide-output"]
show_lines(V2, "__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,")

# %% [markdown]
# That is {glue:text}`mma_macs_per_lane` multiply-adds per thread per instruction, against one
# for an `fma`. Count them in each kernel's PTX (`nvcc -ptx`): the key-tile loops are unrolled,
# so a tile's `mma.sync` appear once per copy of the tile pass, and v2 has two copies, with and
# without the mask.

# %%
if ptx is not None:  # PTX exists where nvcc compiled the kernels on this run
    counted = resources.instruction_table(ptx, ("mma.sync", "fma.rn.f32", "ldmatrix", "shfl.sync"))
    display(counted.loc["sm_80"].filter(like=f"<{kernel_dtype},", axis=0))

# %% tags=["remove-input"]
if ptx is None:
    say(f"No PTX to read: the resources were {resources_source} (the snapshot holds resources only).")
    for key in ("v2_mma", "v1_mma", "v1_fma"):
        glue(key, "not counted (no PTX on this run)")
else:
    lesson(not counted.filter(like="v1<", axis=0)["mma.sync"].any(), "v1 contains no tensor-core instruction")
    lesson(all(counted.loc[(a, f"v2<{kernel_dtype}, {d}>"), "mma.sync"] == 2 * resources.mma_per_key_tile(d)
               for a in archs for d in cuda_flash.HEAD_DIMS),
           "v2's PTX holds exactly the mma.sync its tile shapes call for, in each of its two tile passes")
    mine = counted.loc["sm_80"].loc[[f"v1<{kernel_dtype}, {kernel_dim}>", f"v2<{kernel_dtype}, {kernel_dim}>"]]
    glue("v2_mma", mine.loc[f"v2<{kernel_dtype}, {kernel_dim}>", "mma.sync"])
    glue("v1_mma", mine.loc[f"v1<{kernel_dtype}, {kernel_dim}>", "mma.sync"])
    glue("v1_fma", mine.loc[f"v1<{kernel_dtype}, {kernel_dim}>", "fma.rn.f32"])  # the counts the prose reads

# %% [markdown]
# In the PTX for sm_80, v2 holds {glue:text}`v2_mma` `mma.sync` and v1 {glue:text}`v1_mma`; v1
# uses {glue:text}`v1_fma` scalar `fma`. A GPU trace shows the same in
# [cuBLAS](glossary.md#cublas)'s kernel names (`s16816gemm`: tensor cores, `sgemm`: CUDA cores);
# SASS names the instruction `HMMA`.
#
# The rest of v2 feeds those instructions (folded below): `ldmatrix` loads K fragments, four 8×8
# matrices per instruction. The probabilities never go back to shared memory: two 8-column
# score tiles' accumulator layout is `mma`'s A-operand layout, so each lane packs its own values
# into 16-bit pairs:

# %% tags=["remove-input", "hide-output"]
display(show_lines(V2, "for (int n = 0; n < kNTiles; n += 2) {"))
show_lines(V2, "// C layout of S tiles")

# %% [markdown]
# ## v2, one change at a time
#
# v2 went through four revisions, each aimed at a cost the compiler can show; they are four
# compile-time switches of a `Design` template (`kernels.cuda.design`). Revision 0 is the first
# version (64 query rows, the mask on every tile, `exp2f`, one K/V buffer); each later one turns
# on one change: 1, 128 rows per block; 2, a split mask; 3, a fast `exp2`; 4, double buffering,
# the kernel that runs.
#
# Guess before the table: which revisions make a block ask for *more* shared memory?

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
shared_sm80 = [revision_of["sm_80", i].kernel.total_shared_bytes for i in range(5)]
lesson(grows["sm_80"] == grows["sm_90"] == [1],
       "only revision 1, 128 query rows per block, makes a block ask for more shared memory",
       " → ".join(f"{b:,}" for i, b in enumerate(shared_sm80) if i == 0 or b != shared_sm80[i - 1]) + " B")
lesson(not any(r.kernel.spills or r.kernel.stack_frame_bytes for r in design_rows),
       "no revision spills registers or keeps anything in local memory",
       f"{len(design_rows)} kernels")
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
# {glue:text}`revisions_source`; the last three columns count PTX instructions.

# %% [markdown]
# **128 query rows per block.** Revision 1 doubles a block's rows and warps. Each K/V tile in
# shared memory then serves twice the queries, so a forward reads K and V from
# [L2](glossary.md#l2-cache) or [HBM](glossary.md#hbm) half as often. The price, where there is
# one, is occupancy: warps per SM {glue:text}`rev1_warps`.

# %% tags=["remove-input"]
lesson(all(revision_of[a, 1].revision.block_m == 2 * revision_of[a, 0].revision.block_m
           and revision_of[a, 1].kernel.threads_per_block == 2 * revision_of[a, 0].kernel.threads_per_block
           and abs(revision_of[a, 1].kernel.registers - revision_of[a, 0].kernel.registers)
           <= 0.1 * revision_of[a, 0].kernel.registers for a in archs),
       "twice the rows and threads per block move registers per thread by ≤ 10%: a warp's work is unchanged",
       f"sm_80: {revision_of['sm_80', 0].kernel.registers} → {revision_of['sm_80', 1].kernel.registers}")
lesson(all(by_revision.loc[(a, 1), "warps/SM"] <= by_revision.loc[(a, 0), "warps/SM"] for a in archs),
       "bigger blocks never raise the warps per SM")

# %% [markdown]
# **Masked and unmasked tile passes.** Only the tiles on the causal diagonal, and a ragged last
# tile, need the mask; the first version tested every score anyway. Now `tile_pass` is a
# template on `kMasked`: only the masked one calls `flash::visible`, and `attention_block`
# picks one per tile:

# %%
show_lines(V2, "const int unmasked = Dsg::split_mask", "tile_pass<true>(j)")

# %% tags=["remove-input"]
v2_cfg = cuda_flash.launch_config("v2", kernel_dim)
census = design.tile_census(seq, seq, v2_cfg.block_m, v2_cfg.block_n, causal=True)
glue_all(kernel_seq=seq, census_share=f"{design.unmasked_percent(census):.0f}")
lesson(all(design.tile_bodies(revision_of[a, 2]) == 2 * design.tile_bodies(revision_of[a, 1]) == 2 for a in archs),
       "splitting the mask off doubles the tile pass's code: two bodies, each with one tile's mma.sync")

# %% [markdown]
# At S = {glue:text}`kernel_seq` causal,
# {glue:text}`census_share`% of the tiles a block reads skip the mask, a share that grows with S.
#
# **Fast exp2, the scale folded in** (as in chapter 4). `exp2f` compiles to `ex2.approx.f32`,
# which handles subnormal numbers; the `.ftz` form flushes them to zero
# ([PTX ISA](https://docs.nvidia.com/cuda/parallel-thread-execution/), `ex2`), costing a
# probability nothing. The unmasked pass also folds the scale into the max, so "scale, subtract
# the max" becomes one fused multiply-add (both folded):

# %% tags=["remove-input", "hide-output"]
ch05.excerpts(V2, ("asm(\"ex2.approx.ftz.f32", "\"=f\"(y)"),
              ("const float x = kFold ? fmaf", "s[n][c] = exp2_of"))

# %% tags=["remove-input"]
lesson(all(revision_of[a, 2].counts["ex2.approx.ftz.f32"] == 0 and revision_of[a, 3].counts["ex2.approx.f32"] == 0
           and revision_of[a, 3].counts["ex2.approx.ftz.f32"] == revision_of[a, 2].counts["ex2.approx.f32"] > 0
           for a in archs),
       "revision 3 swaps every ex2.approx.f32 for ex2.approx.ftz.f32, one for one",
       f"sm_80: {revision_of['sm_80', 2].counts['ex2.approx.f32']} of them")

# %% [markdown]
# What that saves per score, only a GPU run can show.
#
# **K/V double-buffered.** With one buffer, tile j + 1 loads only after every warp is done with
# tile j: a barrier before the compute, one after, and no overlap. With two, tile j + 1's copies
# (`cp.async`) land in the other buffer while tile j
# computes; one barrier per tile does both jobs (the top of `tile_pass`, folded):

# %% tags=["remove-input", "hide-output"]
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
# Where double buffering costs anything it is registers, since the addresses of the next tile's
# copies stay live across the compute: {glue:text}`buffer_registers`.
#
# ## Beside PyTorch's flash kernel, on a real trace
#
# In H100 Qwen, [SDPA](glossary.md#sdpa) ran `flash_fwd_kernel`; beside its recorded footprint,
# what v2 would launch for the same shape:

# %% tags=["remove-cell"]
# The GPU the trace recorded: its architecture picks the compiled v2 to set beside torch's kernel.
qwen_trace = TRACELENS["h100_qwen"].trace()
gpu = qwen_trace.device_properties[0]
qwen_arch = occupancy.arch_of((gpu["computeMajor"], gpu["computeMinor"]))

# %%
qwen_call = find_attention(TRACELENS["h100_qwen"].step(trace=qwen_trace)).calls[0]
torch_launch = occupancy.launch_from_footprint("flash_fwd_kernel (H100 Qwen)",
                                               qwen_call.footprint(), "the trace")
v2_launch = resources.v2_launch(qwen_call.batch_heads, qwen_call.sq, int(qwen_call.d or 0),
                                str(qwen_call.dtype), qwen_arch, all_kernels)

# %% tags=["remove-cell"]
glue("qwen_shape", f"{qwen_call.op} at B·H = {qwen_call.batch_heads}, S = {qwen_call.sq}, D = {qwen_call.d}, "
     f"{qwen_call.dtype}, {'causal' if qwen_call.causal else 'not causal'}, on {gpu['numSms']} SMs ({qwen_arch})")

# %%
occupancy.launch_table([torch_launch, v2_launch], qwen_arch, gpu["numSms"])[
    ["threads per block", "registers", "shared KiB", "CTAs per SM", "occupancy %", "waves"]].T

# %% tags=["remove-input"]
occ_torch, occ_v2 = torch_launch.occupancy(qwen_arch), v2_launch.occupancy(qwen_arch)
lesson(torch_launch.blocks == v2_launch.blocks, f"v2 launches torch's {v2_launch.blocks:,} CTAs, 128 query rows each",
       f"grids {torch_launch.grid} and {v2_launch.grid}")
lesson(occ_torch.limited_by == occ_v2.limited_by == "registers", "both kernels are limited by registers on this GPU")
torch_waves, v2_waves = (launch.waves(qwen_arch, gpu["numSms"]) for launch in (torch_launch, v2_launch))
lesson(occ_v2.warps_per_block > occ_torch.warps_per_block and occ_v2.blocks_per_sm < occ_torch.blocks_per_sm
       and v2_waves > torch_waves,
       "v2 gives its 128 rows more warps, so fewer CTAs fit an SM and take more waves",
       f"{occ_v2.warps_per_block} vs {occ_torch.warps_per_block} warps, {occ_v2.blocks_per_sm} vs "
       f"{occ_torch.blocks_per_sm} CTAs, {v2_waves:.2f} vs {torch_waves:.2f} waves")
glue_all(qwen_torch_warps=occ_torch.warps_per_sm, qwen_v2_warps=occ_v2.warps_per_sm,
         qwen_torch_cta_warps=occ_torch.warps_per_block, qwen_v2_cta_warps=occ_v2.warps_per_block,
         qwen_torch_ctas=occ_torch.blocks_per_sm, qwen_v2_ctas=occ_v2.blocks_per_sm,
         qwen_torch_waves=torch_waves, qwen_v2_waves=v2_waves,
         qwen_warps_per_sm=(f"{occ_v2.warps_per_sm} warps per SM either way" if occ_v2.warps_per_sm == occ_torch.warps_per_sm
                            else f"{occ_torch.warps_per_sm} against {occ_v2.warps_per_sm} warps per SM"))
runnable = [n for n in ("cuda_v1", "cuda_v2") if kernels.available(device)[n] is None
            and head_dim in cuda_flash.HEAD_DIMS]
glue("speed_where", "This copy of the page ran on one: its last section has the numbers." if runnable else
     "This copy of the page ran without one, so it has no timing of v1 or v2.")

# %% [markdown]
# The call: {glue:text}`qwen_shape`. Both kernels stage K and V through shared memory and keep
# the score tile and output in registers. Torch fits {glue:text}`qwen_torch_ctas` CTAs of
# {glue:text}`qwen_torch_cta_warps` warps per SM, v2 {glue:text}`qwen_v2_ctas` of
# {glue:text}`qwen_v2_cta_warps`: {glue:text}`qwen_warps_per_sm`; v2's CTAs still take more
# [waves](glossary.md#wave).
#
# A GPU run of this page adds a section timing v1 and v2 against `triton` and `sdpa_flash`.
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
# - *Which thread owns which element* is a CUDA kernel's design.
# - `nvcc -Xptxas -v` prints registers, shared memory and spills without a GPU; occupancy
#   follows by arithmetic, and lower is not necessarily slower.
# - Tensor cores leave a fingerprint: `mma.sync` in PTX (`HMMA` in SASS), not scalar `fma`.
# - A design change shows in the compiler's numbers before it runs; its worth needs a GPU.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/05_cuda.ipynb), with automatic checks, hints and hidden solutions.
