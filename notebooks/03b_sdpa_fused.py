# %% [markdown]
# # 3b. The fused backends: one kernel, low occupancy, memory in S
#
# [Chapter 3, the dispatcher](03_sdpa.ipynb), took [SDPA](glossary.md#sdpa)'s math backend apart:
# attention in primitive ops, each S×S intermediate written to memory and read back. The other
# three backends (memory-efficient, FlashAttention-2 and cuDNN) collapse all of that into a
# single [kernel](glossary.md#kernel) that keeps 16-bit inputs in 16 bits, runs on
# [tensor cores](glossary.md#tensor-core), and never writes the S×S scores to memory: it walks K
# and V in tiles, keeps a running (online) softmax, and accumulates the output tile by tile.
#
# This chapter reads those kernels: their names, their footprint and the occupancy the profiler
# estimates from it (and why that estimate can read 0%), what cuDNN costs on the CPU, and what
# fusion does to memory. On a CPU the one fused backend is PyTorch's CPU flash kernel; the GPU
# kernels are read from the source article's A100 numbers and from a real H100 trace recorded
# by others.
#
# **You will learn to:**
#
# - read the fused backends' kernel names as fingerprints;
# - compute a kernel's [occupancy](glossary.md#occupancy) from its [registers](glossary.md#registers)
#   and [shared memory](glossary.md#shared-memory), see why flash's low occupancy is by design
#   and why the profiler can read 0%, and redo the arithmetic on a real H100 kernel;
# - know where cuDNN's CPU time goes, from the article's numbers and PyTorch's source (no trace
#   on this page ran cuDNN): one opaque op, and a graph built once per shape;
# - measure that fused attention's peak memory grows with S, the math backend's with S².
#
# **Before you start:** [3. One call: `scaled_dot_product_attention`](03_sdpa.ipynb).
#
# **Time:** about {reading_minutes} min to read, longer if you redo the occupancy arithmetic by hand.

# %% [install]

# %% [parameters]

# %%
import functools

import torch
from IPython.display import Markdown

import kernels
from kernels import borrowed, recorded
from kernels.attention import sdpa
from kernels.bench import comparison
from kernels.book import ch03_sdpa as ch03, ch03b_sdpa_fused as ch03b
from kernels.hw.occupancy import KINETO_SHARED_MEM_LIMIT, device_limits_table, occupancy, trace_kernel
from kernels.notebook import glue, glue_all, inputs, lesson, reveal, say, setup
from kernels.trace import reader, record, tables, timeline
from kernels.trace.attention import short_kernel_name
from kernels.trace.fingerprints import classify_many
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")

# %% tags=["remove-input"]
borrowed.traces_box({"H100 Qwen": borrowed.TRACELENS["h100_qwen"]})
# Which backends take these inputs on this device, by chapter 3's rules (no call needed).
FUSED = ("sdpa_efficient", "sdpa_flash", "sdpa_cudnn")
refused = sdpa.rule_reasons(("sdpa_math",) + FUSED, device, q, k)
fused_here = [n for n in FUSED if refused[n] is None]
if "sdpa_flash" not in fused_here:   # the page reads the flash backend throughout
    raise RuntimeError(f"SDPA's flash backend refuses these inputs on {device}: {refused['sdpa_flash']}. "
                       "Run this chapter on a CPU, or on a GPU in bfloat16 or float16 (the cuda preset).")
if device.type == "cpu":
    lesson(fused_here == ["sdpa_flash"], "on a CPU the one fused backend that runs is PyTorch's CPU flash kernel")

# %% [markdown]
# ## One kernel each
#
# The source article found exactly **one kernel per forward** for each fused backend on its
# A100. `sdpa.ARTICLE_A100_KERNELS` holds their names (the flash name shortened, as the article
# prints it); decoded, with the full names under the table:

# %%
article = classify_many(sdpa.ARTICLE_A100_KERNELS.values())

# %% tags=["remove-input"]
display(ch03b.article_kernel_table(article, list(sdpa.ARTICLE_A100_KERNELS)))
display(Markdown(ch03b.kernel_name_list(sdpa.ARTICLE_A100_KERNELS)))
lesson((article["kind"] == "fused_attention").all() and article["tensor_cores"].all(),
       "each article kernel decodes as one fused attention kernel on tensor cores")

# %% [markdown]
# Read left to right, `fmha_cutlassF_bf16_aligned_64x64_rf_sm80` says: fused multi-head
# attention, built from [CUTLASS](glossary.md#cutlass) templates, forward, bfloat16, aligned
# inputs, 64×64 tiles, the output accumulator kept in registers (`rf`; `gmem` would keep it in
# global memory), and `sm80` the lowest architecture it was built for. It is the
# memory-efficient kernel that came from Meta's xFormers. `pytorch_flash::flash_fwd_kernel` is
# FlashAttention-2, vendored into PyTorch. The cuDNN name is not a fixed binary: `cudnn_generated`
# kernels are produced for the problem at hand, `flash_fprop` names the algorithm family,
# `wmma_f16` the 16-bit tensor-core path (even in a bf16 run), `knob_6` the tuned configuration
# and `128x64x64` its tiles.
#
# ## The flash backend in this run's trace
#
# The CPU has its own fused flash kernel, SDPA's default there. The cell after the guess
# profiles each fused backend that takes these inputs on this device (`fused_here`, by chapter
# 3's rules: on a CPU, flash alone). Before profiling: chapter 3 counted the ops doing work in
# one forward of the math backend. How many do you expect one forward of the flash backend to
# run (views and bare allocations left out)?

# %%
guess_flash_work_ops = 3  # edit me before running on

# %% tags=["hide-output"]
runs = {name: record.profile(kernels.get(name), q, k, v, label=name, active=active_steps,
                             trace_dir=trace_dir)
        for name in fused_here}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}
tables.op_table(step["sdpa_flash"], views=True)

# %% tags=["remove-input"]
work_ops = {name: s.work_ops() for name, s in step.items()}  # ops that compute: no views, no bare allocations
# The fused backends' GPU run, where there is one: this run's own on a GPU, else the book's recording.
gpu_steps, gpu_source, gpu_capability = recorded.gpu_steps(device, step, "03b_sdpa_fused", list(FUSED))
if gpu_steps:
    say(f"GPU run: {gpu_source}")
reveal(guess_flash_work_ops, len(work_ops["sdpa_flash"]), "ops doing work in one flash forward")
transposes = step["sdpa_flash"].find("aten::transpose")
if device.type == "cpu":
    lesson(work_ops["sdpa_flash"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"],
           "a CPU flash forward runs exactly one op doing work: the fused kernel", ", ".join(work_ops["sdpa_flash"]))
lesson(len(transposes) >= 4 and transposes["alloc_bytes"].sum() == 0,
       "the flash forward's transposes only rearrange metadata: they allocate nothing",
       f"{len(transposes)} transposes, 0 bytes")
n_work = len(work_ops["sdpa_flash"])
glue_all(flash_transposes=len(transposes),
         flash_work_reading=("One op does work" if n_work == 1 else f"{n_work} ops do work")
         + " in this run's flash forward (its op table is folded above).")

# %% [markdown]
# {glue:text}`flash_work_reading` If you guessed more, you probably counted the views (the
# `transpose` calls) or the `scaled_dot_product_attention` wrapper, which does no arithmetic of
# its own. Those {glue:text}`flash_transposes` `transpose`
# calls swap the tensors' strides, from [B, H, S, D] to the [B, S, H, D] layout the kernel reads,
# and back; no data moves. The article saw the same on its GPU: flash and efficient each put four
# such transposes on the CPU track before their kernel, while cuDNN, whose generator emits a
# kernel for the [B, H, S, D] layout directly, has none (its Figures 19 to 21).

# %%
#| caption: One forward of SDPA's flash backend: the SDPA call and the one fused op beneath it that does the whole attention, where the math backend ran dozens of ops. Like every timeline here it leaves out views, so the transposes are not drawn.
#| alt: Short timeline: the SDPA call and one wide fused flash-attention op beneath it.
timeline.timeline(step["sdpa_flash"], title="SDPA flash backend: one forward")

# %% [markdown]
# ## Low occupancy, on purpose
#
# The profiler's footprint of the flash kernel surprised the article's authors: about 13%
# estimated occupancy, for the fastest backend. (The profiler writes the estimate as a whole
# number, rounded half up, so 12.5% reads 13: [Kineto](glossary.md#kineto), the profiler's
# tracing library, rounds it with `std::lround` in `libkineto/src/CuptiActivity.h`.) Occupancy
# is the share of an [SM](glossary.md#sm)'s [warp](glossary.md#warp) slots that resident warps
# fill. Four resources each cap how many blocks (a block is a [CTA](glossary.md#cta)) can be
# resident on one SM at once: registers, shared memory, warp slots, and a limit of 32 blocks; the
# first to run out sets the occupancy. FlashAttention is famous for its shared-memory tiles.
# Before the arithmetic: which resource runs out first for its kernel?

# %%
guess_first_limit = "shared memory"  # edit me: registers, shared memory, warp slots or blocks

# %% [markdown]
# The article gives the kernel's footprint on its A100 (sm_80): blocks of 128 threads at 255
# registers each. It does not quote the shared memory; the arithmetic takes the 48 KiB that
# FlashAttention-2's forward kernel asks for at head dim 64 in the H100 trace below (and the
# article's cannot have been more: above 48 KiB the profiler reads 0%, as the cuDNN section
# explains). Reproduced with
# `kernels.hw.occupancy`:

# %%
flash_occ = occupancy(threads_per_block=128, registers_per_thread=255,
                      shared_mem_per_block=48 * 1024, arch="sm_80")
print(flash_occ.explain())

# %% tags=["remove-input"]
ch03b.reveal_limit(guess_first_limit, flash_occ)
lesson(flash_occ.blocks_per_sm == 2 and flash_occ.warps_per_sm == 8 and flash_occ.percent == 12.5,
       "128 threads x 255 registers on sm_80: 2 blocks, 8 of 64 warps, 12.5% occupancy")
lesson(flash_occ.limited_by == "registers" and (flash_occ.blocks_by_shared_memory or 0) > flash_occ.blocks_per_sm,
       "registers run out first: the 48 KiB of shared memory would let more blocks in",
       f"{flash_occ.blocks_per_sm} blocks by registers, {flash_occ.blocks_by_shared_memory} by shared memory")
glue_all(flash_occ=flash_occ.percent, flash_blocks=flash_occ.blocks_per_sm, flash_warps_per_block=flash_occ.warps_per_block,
         flash_warps=flash_occ.warps_per_sm, max_warps=flash_occ.max_warps_per_sm)

# %% [markdown]
# {glue:text}`flash_blocks` blocks of {glue:text}`flash_warps_per_block` warps make
# {glue:text}`flash_warps` resident warps of {glue:text}`max_warps`: {glue:text}`flash_occ:.1f`%.
# (The printout's KB are KiB, 1,024 bytes: 164 KB is 167,936 B. The "As allocated" line is how the hardware hands out registers: per warp, in units of 256,
# from the share of the register file that belongs to each of the SM's four warp schedulers,
# the units that pick which resident warp issues next.) That is not a flaw. High occupancy hides memory latency by having other warps to switch to.
# Flash still streams every K and V tile from [HBM](glossary.md#hbm), but hides that latency
# another way: while the tensor cores work on the current tile, the next one is already on its
# way into shared memory (`cp.async` prefetching). Its registers and shared memory go to those
# on-chip tiles and the running softmax; low occupancy is the price of never writing the scores
# to memory.
#
# ## cuDNN: a 0% that is not real
#
# The article's cuDNN kernel reported 0% estimated occupancy (its Figure 23). The field is not a
# measurement: Kineto computes it from the kernel's registers, block size and shared memory with
# CUDA's occupancy calculator, assuming the 48 KiB default limit of shared memory per block
# (pytorch/kineto, `libkineto/src/DeviceProperties.cpp`). A kernel that opts into more, as
# cuDNN's flash kernels do, gets zero resident blocks in that calculation and reads 0%,
# whichever API launched it. Kineto also caps the blocks per SM at the grid's average (the
# trace's "blocks per SM" is grid blocks over SMs, not a count of resident blocks), so a small
# grid reads low because it is small. The footprint the article does report for cuDNN, 256
# threads at 240 registers, is enough. Its shared memory is not reported, so it is left at 0 B
# below: read the "Shared memory" line as setting no limit, not as the kernel's real figure.

# %%
cudnn_occ = occupancy(threads_per_block=256, registers_per_thread=240, arch="sm_80")
print(cudnn_occ.explain())

# %% tags=["remove-input"]
lesson(cudnn_occ.blocks_per_sm == 1 and cudnn_occ.percent == 12.5,
       "256 threads x 240 registers on sm_80: 1 block of 8 warps, 12.5% occupancy, like flash")
glue("cudnn_occ", cudnn_occ.percent)

# %% [markdown]
# One block of 61,440 registers fits in the SM's 65,536, a second does not. Whatever its shared
# memory, then, at most one block is resident; and the kernel ran, so at least one fits:
# {glue:text}`cudnn_occ:.1f`% is its theoretical occupancy, in line with flash, where the trace read 0%.
#
# ## The flash kernel on a real H100
#
# The article's numbers come from screenshots of an A100 trace. Every kernel event of a trace
# carries the same footprint, so the arithmetic can be redone on a real one: H100 Qwen, the
# forward chapter 3 read (16 sequences of 559 tokens, 16 heads of 64, bfloat16, causal). Each
# of its SDPA calls ran one `flash_fwd_kernel`. A step's `gpu_work` names the op that launched
# each kernel; `kernels.hw.occupancy.trace_kernel` reads the first flash kernel's footprint as
# the trace recorded it:

# %%
h100_trace = borrowed.TRACELENS["h100_qwen"].trace()
h100_step = borrowed.TRACELENS["h100_qwen"].step(trace=h100_trace)
flash_kernels = h100_step.gpu_work[h100_step.gpu_work["op"] == "aten::_flash_attention_forward"]
real = trace_kernel(flash_kernels.iloc[0], h100_trace.device_properties)
flash_kernels[["grid", "block", "registers_per_thread", "shared_memory"]].head(3)   # the first of its 24 calls

# %% tags=["remove-input"]
say(f"{short_kernel_name(real.name)}: grid {list(real.grid)}, block {list(real.block)}, "
    f"{real.registers_per_thread} registers per thread, {real.shared_mem_per_block / 1024:g} KiB of shared memory per block")
h100_calls = ch03.recorded_calls(h100_step)
h100_call = h100_calls[0]
per_call = [ch03.call_step(h100_step, call).gpu_work for call in h100_calls]
lesson(all(len(kernels_) == 1 for kernels_ in per_call) and len(flash_kernels) == len(h100_calls),
       "each of its SDPA calls launched exactly one kernel, the flash kernel",
       f"{len(h100_calls)} calls, {len(flash_kernels)} {short_kernel_name(real.name)}")
lesson(flash_kernels["grid"].astype(str).nunique() == 1 and flash_kernels["registers_per_thread"].nunique() == 1
       and flash_kernels["shared_memory"].nunique() == 1,
       "all of one footprint: the first kernel's stands for every call", f"grid {list(real.grid)}")
limits = device_limits_table(h100_trace.device_properties[0])
lesson((limits["the trace"] == limits["kernels.hw.occupancy's sm_90 table"]).all(),
       "the SM limits the trace records are those the occupancy arithmetic uses for sm_90",
       ", ".join(f"{field} {value:,}" for field, value in limits["the trace"].items()))
trace_sm = limits["the trace"]
glue_all(h100_regs_per_sm=f"{int(trace_sm['regsPerMultiprocessor']):,}", h100_smem_kib=int(trace_sm["sharedMemPerMultiprocessor"]) // 1024,
         h100_warp_slots=int(trace_sm["maxThreadsPerMultiprocessor"] // trace_sm["warpSize"]))

# %% [markdown]
# Its `deviceProperties` give the H100's SM {glue:text}`h100_regs_per_sm` registers and
# {glue:text}`h100_warp_slots` warp slots, as the A100's, and more shared memory
# ({glue:text}`h100_smem_kib` KiB per SM). Does the bigger shared memory let more of these
# blocks in?

# %%
print(real.occupancy.explain())

# %% tags=["remove-input"]
lesson(real.occupancy.limited_by == "registers"
       and (real.occupancy.blocks_by_shared_memory or 0) > real.occupancy.blocks_per_sm,
       "registers bind: shared memory alone would let more blocks in",
       f"{real.occupancy.blocks_per_sm} blocks by registers, {real.occupancy.blocks_by_shared_memory} by shared memory")
lesson(real.kineto_rounded == real.recorded_percent,
       "Kineto's estimate, recomputed from the footprint and the grid, is the trace's number",
       f"{real.kineto_percent:g}% -> {real.kineto_rounded}, the trace says {real.recorded_percent:g}")
lesson(real.occupancy.percent == flash_occ.percent, "the same footprint gives the H100 the A100's occupancy",
       f"{real.occupancy.percent:g}% on both")
glue_all(h100_blocks=real.occupancy.blocks_per_sm, h100_warps_per_block=real.occupancy.warps_per_block,
         h100_warps=real.occupancy.warps_per_sm, h100_occ=real.occupancy.percent, h100_recorded_occ=real.recorded_percent,
         h100_regs_per_block=f"{real.registers_per_thread * real.threads_per_block:,}",
         h100_smem_blocks=real.occupancy.blocks_by_shared_memory, a100_smem_blocks=flash_occ.blocks_by_shared_memory)

# %% [markdown]
# A block needs {glue:text}`h100_regs_per_block` registers (after rounding, 8,192 per warp), so
# two fit in {glue:text}`h100_regs_per_sm`: {glue:text}`h100_blocks` blocks of {glue:text}`h100_warps_per_block` warps,
# {glue:text}`h100_warps` of 64 warp slots, {glue:text}`h100_occ:.1f`%, which the trace writes as
# {glue:text}`h100_recorded_occ:.0f`. Shared memory would now let {glue:text}`h100_smem_blocks`
# blocks in, not {glue:text}`a100_smem_blocks`, but the registers still hold it to
# {glue:text}`h100_blocks`: the same footprint gives the H100 the A100's occupancy.
#
# The kernel's name says why it asks for exactly 48 KiB. Its template arguments,
# `Flash_fwd_kernel_traits<64, 128, 128, 4, ...>`, are FlashAttention-2's tile configuration:
# head dim 64, 128 query rows per block, 128 key rows per step of its loop, 4 warps. The tiles in
# shared memory are one of Q and one each of K and V, in bfloat16:

# %%
tiles = sdpa.flash_tiles(real.name)

# %% tags=["remove-input"]
batch_, heads_, seq_ = h100_call.q[0], h100_call.q[1], h100_call.q[2]
print(f"shared memory: ({tiles.block_m} + 2 x {tiles.block_n}) rows x {tiles.head_dim} x 2 bytes = "
      f"{tiles.shared_bytes():,} B; grid: ceil({seq_} / {tiles.block_m}) query tiles x {batch_} x {heads_} = "
      f"{tiles.grid(batch_, heads_, seq_)}")
lesson(tiles.shared_bytes() == real.shared_mem_per_block and tiles.threads == real.threads_per_block,
       "the tiles in the kernel's name account for its shared memory and its threads, byte for byte",
       f"{tiles.shared_bytes():,} B, {tiles.threads} threads")
lesson(tiles.grid(batch_, heads_, seq_) == list(real.grid),
       "and its grid is one block per query tile, sequence and head of the recorded call", str(list(real.grid)))
lesson(real.shared_mem_per_block <= KINETO_SHARED_MEM_LIMIT,
       "48 KiB is exactly the per-block default Kineto's estimate assumes, so this kernel does not read 0%")
lesson(4 < real.waves < 5, "the grid takes four full waves of resident blocks and part of a fifth", f"{real.waves:.2f} waves")
glue_all(h100_grid_blocks=f"{real.grid_blocks:,}", h100_resident=real.resident_blocks, h100_waves=real.waves,
         h100_sms=real.sm_count, h100_avg_blocks=real.grid_blocks / real.sm_count)
# A GPU run only (this run's or the book's recording): each fused backend is one kernel, and the trace's
# occupancy is Kineto's estimate recomputed from its footprint (0% above 48 KiB of shared memory).
if any(n in gpu_steps for n in FUSED):
    display(ch03b.fused_kernels_read(gpu_steps))

# %% [markdown]
# The grid holds {glue:text}`h100_grid_blocks` blocks; the H100's {glue:text}`h100_sms` SMs hold
# {glue:text}`h100_resident` of them at a time, so the kernel runs in
# {glue:text}`h100_waves:.2f` [waves](glossary.md#wave): four full rounds and a last one that
# leaves some SMs idle. Kineto's own "blocks per SM", {glue:text}`h100_avg_blocks:.2f`, is the
# grid divided by the SMs; its estimate takes the smaller of that average and what fits.
#
# ## cuDNN's CPU time
#
# cuDNN has a CPU-side cost too. No trace on this page ran cuDNN (none of the borrowed traces
# did), so this section reads the article's numbers and PyTorch's source. The article measured,
# per forward on its A100 (GPU / CPU time):
# efficient 277.9 / 117 µs, flash 146.8 / 138 µs, cuDNN 186.3 / **214** µs. cuDNN, with no
# transposes at all, spends the most CPU time, inside one opaque `_cudnn_attention_forward` bar.
# That is not a plan chosen on every call: PyTorch builds the cuDNN graph for a shape once and
# caches it (`aten/src/ATen/native/cudnn/MHA.cpp`, a per-thread graph cache), so a steady-state
# call pays for looking the graph up, filling in the tensors' addresses, a workspace allocation
# and the execute call. The first call at a new shape is the expensive one, and if it falls
# inside the profiled window it inflates the average. A cleaner trace did not mean less work;
# the work moved where the profiler cannot split it.

# %% tags=["remove-input"]
# A GPU run measures that split directly, without the profiler: cuDNN's first call at a new shape
# against the median of the calls after it. None of the borrowed traces ran cuDNN.
if device.type == "cuda" and "sdpa_cudnn" in fused_here:
    fresh = inputs(batch, heads, seq + 64, head_dim, dtype=dtype, device=device, seed=3)  # a new shape
    first, steady = ch03b.first_call_cpu_ms(kernels.get("sdpa_cudnn"), fresh, calls=21)
    lesson(first > 3 * steady, "cuDNN's first call at a new shape costs far more CPU time than the calls after it: "
           "the graph is built once and then found in the cache", f"{first:.2f} vs {steady:.3f} ms")

# %% [markdown]
# ## Memory: S² against S
#
# The fused kernels' real gift is memory. Before measuring: each time the sequence doubles, by
# what factor do you expect one forward's peak memory to grow, with the math backend and with
# the flash kernel? The cell after yours profiles one forward at a few sequence lengths (the
# math backend stops one doubling earlier: its largest point would cost more than all the
# others).

# %%
guess_growth = {"sdpa_math": 2.0, "sdpa_flash": 1.0}  # edit me: peak memory x per doubling of S

# %% tags=["remove-cell"]
# On a GPU the sweep starts one doubling later: the larger batch and heads there have bigger
# S-sized (not S×S) buffers, which would blur the 4x at short sequences.
sweep_seqs = [256, 512, 1024, 2048] if device.type == "cpu" else [512, 1024, 2048, 4096]
sweep_title = f"Peak memory, B={batch} H={heads} D={head_dim}, {str(dtype).removeprefix('torch.')}"

# %%
sweep_for = {"sdpa_math": sweep_seqs[:-1], "sdpa_flash": sweep_seqs}  # sweep_seqs: 256 to 2048 on a CPU
peaks, sweep_steps = ch03b.peak_memory_sweep(sweep_for, batch, heads, head_dim, dtype=dtype, device=device,
                                            trace_dir=trace_dir)
ch03b.peaks_and_growth(peaks)

# %%
#| caption: Peak memory of one forward against sequence length, log-log. The math backend follows the dotted S² guide (about 4x per doubling); the flash kernel follows the dashed S guide (about 2x), apart from any doubling marked with its factor: a step of the CPU kernel's scratch buffer, explained below.
#| alt: Log-log line chart of peak memory against sequence length for sdpa_math and sdpa_flash, with guide lines proportional to S and to S squared.
ch03b.peak_memory_figure(peaks, sweep_title)

# %% tags=["remove-input"]
growth = ch03b.growth_per_doubling(peaks)
math_growth = growth["sdpa_math x per doubling"].dropna()
reveal(guess_growth["sdpa_math"], round(float(math_growth.iloc[-1]), 2), "sdpa_math's peak x, last doubling", source="the sweep")
lesson(((math_growth > 3) & (math_growth < 4.2)).all() and math_growth.iloc[-1] > 3.5,
       "the math backend's peak grows about 4x per doubling of S (it holds S×S buffers)",
       ", ".join(f"{x:.2f}x" for x in math_growth))
glue_all(math_growth_last=float(math_growth.iloc[-1]), math_peak_max=float(peaks["sdpa_math"].dropna().iloc[-1]),
         math_max_seq=sweep_for["sdpa_math"][-1])
flash_growth = growth["sdpa_flash x per doubling"].dropna()
reveal(guess_growth["sdpa_flash"], round(float(flash_growth.iloc[-1]), 2), "sdpa_flash's peak x, last doubling", source="the sweep")
lesson(flash_growth.iloc[-1] <= 2.1, "at its last doubling the flash backend's peak grows about 2x or less, not 4x",
       f"{flash_growth.iloc[-1]:.2f}x; every doubling: " + ", ".join(f"{x:.2f}x" for x in flash_growth))
common = peaks.dropna().index[-1]
lesson(peaks.loc[common, "sdpa_flash"] < peaks.loc[common, "sdpa_math"] / 4,
       "at the longest sequence both ran, the flash backend's peak is a small fraction of the math backend's",
       f"S={common}: {peaks.loc[common, 'sdpa_flash']:.2f} vs {peaks.loc[common, 'sdpa_math']:.1f} MiB")
glue("flash_reading", f"At S = {peaks.index[-1]} flash peaked at {peaks['sdpa_flash'].iloc[-1]:.1f} MiB, "
                      f"up {flash_growth.iloc[-1]:.2f}x from the length before.")

# %% [markdown]
# The math backend holds S×S intermediates (the scores, the probabilities, the guards), so its
# peak grows with S², about 4x per doubling: a guess of 2x counted the tokens, not the pairs of
# them. The flash kernel allocates only the output (S×D), one
# [log-sum-exp](glossary.md#log-sum-exp) per row and one scratch buffer, a slice for each
# thread, sized by the blocks the kernel picks for S (never S×S: it stops growing once the blocks
# are at their largest), so its peak grows with S, about 2x once S is large: a guess
# of 1x forgot that the output itself grows with S, and 4x treats flash like the math backend. At S = {glue:text}`math_max_seq` the math backend peaked at
# {glue:text}`math_peak_max:.0f` MiB, its last doubling costing {glue:text}`math_growth_last:.2f`x.
# {glue:text}`flash_reading`
#
# On a CPU the flash curve has a bump in the middle. The CPU kernel (ATen's `cpu_flash_attention`)
# gives each thread a slice of its one scratch buffer, room for one block of queries against one
# block of keys, and picks larger blocks for longer sequences, so the buffer steps up with the
# block sizes and then stays put. No buffer
# is S×S. On a GPU the tiles live in registers and shared memory instead.

# %% tags=["remove-input"]
if device.type == "cpu" and "sdpa_flash" in fused_here:
    acc = ch03b.cpu_flash_allocation_table(sweep_steps, batch, heads, head_dim, q.element_size())
    lesson((acc["allocations"] == 3).all() and acc["output"].all() and acc["log-sum-exp"].all(),
           "every CPU flash forward allocates exactly three buffers: the output, the log-sum-exp, one scratch buffer shared by the threads")
    lesson(acc["scratch (KiB)"].is_monotonic_increasing and acc["scratch (KiB)"].nunique() > 1,
           "the bump is the scratch buffer: it steps up as the kernel picks larger blocks",
           ", ".join(f"{x:,.0f}" for x in acc["scratch (KiB)"]) + " KiB")
    lesson(acc["scratch (KiB)"].iloc[-1] == acc["scratch (KiB)"].iloc[-2],
           "the scratch buffer does not grow with S (same size at the two longest sequences)",
           f"{acc['scratch (KiB)'].iloc[-1]:,.0f} KiB")

# %% [markdown]
# ## Side by side: three forwards, timed
#
# The sweep profiled each point once, with the profiler's memory bookkeeping on: right for
# memory, wrong for time. To compare speed, the cell below times chapter 2's in-place module, the
# math backend and the flash kernel apart from the profiler, alternating them call by call, and
# calls one the fastest only when its slowest tenth of calls beats every other's fastest tenth
# (`kernels.bench.comparison.compare`). The table under it gives each one's fastest tenth (p10),
# median and slowest tenth (p90):

# %%
timing = comparison.compare({n: functools.partial(kernels.get(n), q, k, v)
                             for n in ("inplace", "sdpa_math", "sdpa_flash")},
                            device=device, rounds=11)

# %% tags=["remove-input"]
display(ch03b.timing_table(timing))
others = [n for n in timing.median_ms if n != "sdpa_flash"]
lesson(not any(timing.p90_ms[o] < timing.p10_ms["sdpa_flash"] for o in others),
       "timed apart from the profiler, the spread check ranks the fused kernel fastest of the three: its slowest "
       "tenth of calls below the others' fastest tenth" if timing.faster() == "sdpa_flash" else
       "timed apart from the profiler, neither the in-place module nor the math backend comes out faster than the "
       "fused kernel", "; ".join(ch03b.pair_verdict(timing, "sdpa_flash", o) for o in others))
glue("fused_timing_reading", ch03b.pair_reading(timing, "inplace", "sdpa_math"))

# %% [markdown]
# {glue:text}`fused_timing_reading` The medians move from run to run and machine to machine; only
# a ranking the spread check makes is a result. The showdown chapter benchmarks every
# implementation over a sweep of shapes.
#
# ## What to remember
#
# - The fused backends are one kernel each; read their names as fingerprints before anything else.
# - Low occupancy can be a design choice: flash spends its registers and shared memory on the
#   tiles it keeps on chip, and its registers, not its tiles, are what limit it.
# - The profiler's occupancy is Kineto's estimate, computed from the footprint with the 48 KiB
#   default shared-memory limit: any kernel that asks for more reads 0%, whatever its real
#   occupancy. Check the footprint.
# - A cleaner CPU track is not less work: cuDNN's CPU time sits inside one opaque op, and its
#   first call at a new shape builds the graph the later calls find in a cache.
# - Fused attention's memory grows with S, not S²: the scores never leave the chip.
#
# Next: write that fused kernel ourselves, in Triton.
#
# **Practice:** [the exercises for this chapter](exercises/03_sdpa.ipynb), with automatic checks, hints and hidden solutions.
