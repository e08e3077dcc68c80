# %% [markdown]
# # 3b. The fused backends: one kernel, low occupancy, memory in S
#
# [Chapter 3](03_sdpa.ipynb) took [SDPA](glossary.md#sdpa)'s math backend apart: primitive ops,
# each S×S intermediate written to memory and read back. The other three backends
# (memory-efficient, FlashAttention-2, cuDNN) collapse all of that into one
# [kernel](glossary.md#kernel) that keeps 16-bit inputs in 16 bits on
# [tensor cores](glossary.md#tensor-core) and never writes the S×S scores: it walks K and V in
# tiles with a running (online) softmax and accumulates the output tile by tile.
#
# **You will learn to:**
#
# - read the fused backends' kernel names as fingerprints;
# - compute a kernel's [occupancy](glossary.md#occupancy) from its [registers](glossary.md#registers)
#   and [shared memory](glossary.md#shared-memory), on the article's A100 and a real H100 kernel,
#   and see why flash's is low by design and why the profiler can read 0%;
# - know where cuDNN's CPU time goes: one opaque op, and a graph built once per shape;
# - measure that fused attention's peak memory grows with S, the math backend's with S².
#
# **Before you start:** [3. One call: `scaled_dot_product_attention`](03_sdpa.ipynb).
#
# **Time:** about {reading_minutes} min to read.

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
from kernels.trace import reader, record, tables
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

# %% [markdown]
# ## One kernel each
#
# The source article found **one kernel per forward** for each fused backend on its A100.
# Decoded from `sdpa.ARTICLE_A100_KERNELS` (flash's name shortened, as the article prints it),
# full names under the table:

# %%
article = classify_many(sdpa.ARTICLE_A100_KERNELS.values())

# %% tags=["remove-input"]
display(ch03b.article_kernel_table(article, list(sdpa.ARTICLE_A100_KERNELS)))
display(Markdown(ch03b.kernel_name_list(sdpa.ARTICLE_A100_KERNELS)))
lesson((article["kind"] == "fused_attention").all() and article["tensor_cores"].all(),
       "each article kernel decodes as one fused attention kernel on tensor cores")

# %% [markdown]
# `fmha_cutlassF_bf16_aligned_64x64_rf_sm80`: fused multi-head attention from
# [CUTLASS](glossary.md#cutlass) templates, forward, bfloat16, aligned inputs, 64×64 tiles,
# accumulator in registers (`rf`), for `sm80` and up: the memory-efficient kernel, from Meta's
# xFormers. `pytorch_flash::flash_fwd_kernel` is FlashAttention-2, vendored into PyTorch.
# `cudnn_generated` kernels are generated per problem: `flash_fprop` names the algorithm family, `wmma_f16` the 16-bit tensor-core path (even in a bf16 run), `knob_6` the
# tuned configuration, `128x64x64` its tiles.
#
# ## The flash backend in this run's trace
#
# The cells below profile the fused backends these inputs allow (`fused_here`: on a CPU, flash
# alone). Chapter 3 counted the math backend's ops doing work; how many do you
# expect one flash forward to run (views and bare allocations left out)?

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
    lesson(fused_here == ["sdpa_flash"], "on a CPU the only fused backend that runs is PyTorch's CPU flash kernel")
    lesson(work_ops["sdpa_flash"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"],
           "a CPU flash forward runs exactly one op doing work: the fused kernel", ", ".join(work_ops["sdpa_flash"]))
lesson(len(transposes) >= 4 and transposes["alloc_bytes"].sum() == 0,
       "the flash forward's transposes allocate nothing: they only rearrange metadata",
       f"{len(transposes)} transposes, 0 bytes")
n_work = len(work_ops["sdpa_flash"])
glue_all(flash_transposes=len(transposes),
         flash_work_reading=("One op does work" if n_work == 1 else f"{n_work} ops do work")
         + " in this run's flash forward (its op table is folded above).")

# %% [markdown]
# {glue:text}`flash_work_reading` A higher guess probably counted the
# {glue:text}`flash_transposes` `transpose` views or the `scaled_dot_product_attention` wrapper,
# which does no arithmetic. The transposes swap strides to the [B, S, H, D] layout the kernel
# reads, and back. The article saw four on the CPU track before
# flash's and efficient's GPU kernels, and none for cuDNN, whose generated kernel reads
# [B, H, S, D] directly (its Figures 19 to 21).
#
# ## Low occupancy, on purpose
#
# The flash kernel surprised the article's authors: about 13% estimated occupancy, for the
# fastest backend. Occupancy is the share of an [SM](glossary.md#sm)'s [warp](glossary.md#warp)
# slots that resident warps fill. Four resources cap the blocks ([CTAs](glossary.md#cta))
# resident on one SM: registers, shared memory, warp slots, and 32 blocks; the first to run out
# sets the occupancy. FlashAttention is famous for its shared-memory tiles. Which resource runs
# out first for its kernel?

# %%
guess_first_limit = "shared memory"  # edit me: registers, shared memory, warp slots or blocks

# %% [markdown]
# The article gives the footprint on its A100 (sm_80): 128 threads a block, 255 registers each.
# For shared memory, which it does not quote, take the 48 KiB FlashAttention-2's forward asks
# for at head dim 64 in the H100 trace below (the article's was no more: above 48 KiB the
# profiler would read 0%, as the cuDNN section explains). With `kernels.hw.occupancy`:

# %%
flash_occ = occupancy(threads_per_block=128, registers_per_thread=255,
                      shared_mem_per_block=48 * 1024, arch="sm_80")
print(flash_occ.explain())

# %% tags=["remove-input"]
ch03b.reveal_limit(guess_first_limit, flash_occ)
lesson(flash_occ.blocks_per_sm == 2 and flash_occ.warps_per_sm == 8 and flash_occ.percent == 12.5,
       "128 threads x 255 registers on sm_80: 2 blocks, 8 of 64 warps, 12.5% occupancy")
lesson(flash_occ.limited_by == "registers" and (flash_occ.blocks_by_shared_memory or 0) > flash_occ.blocks_per_sm,
       "registers run out first; 48 KiB of shared memory alone would allow more blocks",
       f"{flash_occ.blocks_per_sm} by registers, {flash_occ.blocks_by_shared_memory} by shared memory")
glue_all(flash_occ=flash_occ.percent, flash_blocks=flash_occ.blocks_per_sm, flash_warps_per_block=flash_occ.warps_per_block,
         flash_warps=flash_occ.warps_per_sm, max_warps=flash_occ.max_warps_per_sm)

# %% [markdown]
# Registers bind: {glue:text}`flash_occ:.1f`% occupancy, which the article's trace shows as 13
# ([Kineto](glossary.md#kineto), the profiler's tracing library, rounds half up). ("As
# allocated": registers go out per warp, in units of 256, from each of the SM's four warp
# schedulers' share.) That is not a flaw. High occupancy hides memory latency with
# other warps to switch to; flash hides it by prefetching the next K and V tile from [HBM](glossary.md#hbm) into shared
# memory (`cp.async`) while the tensor cores work on the current one. Its registers and shared
# memory go to those tiles and the running softmax: low occupancy is the price of never writing
# the scores to memory.
#
# ## cuDNN: a 0% that is not real
#
# The article's cuDNN kernel read 0% estimated occupancy (its Figure 23). The field is not a
# measurement: Kineto computes it with CUDA's occupancy calculator from the kernel's registers,
# block size and shared memory, assuming the 48 KiB default per block (pytorch/kineto,
# `libkineto/src/DeviceProperties.cpp`). A kernel that opts into more, as cuDNN's flash kernels
# do, gets zero resident blocks there and reads 0%, whichever API launched it. The footprint the
# article reports, 256 threads at 240 registers, is enough to bound its occupancy (its shared memory, not reported, is
# left at 0 B: no limit; the arithmetic is folded):

# %% tags=["hide-output"]
cudnn_occ = occupancy(threads_per_block=256, registers_per_thread=240, arch="sm_80")
print(cudnn_occ.explain())

# %% tags=["remove-input"]
lesson(cudnn_occ.blocks_per_sm == 1 and cudnn_occ.percent == 12.5,
       "256 threads x 240 registers on sm_80: 1 block of 8 warps, 12.5% occupancy, like flash")
glue("cudnn_occ", cudnn_occ.percent)

# %% [markdown]
# One block of 61,440 registers fits in 65,536, a second does not; the kernel ran, so one fits
# whatever its shared memory: {glue:text}`cudnn_occ:.1f`% where the trace read 0%.
#
# ## The flash kernel on a real H100
#
# Every kernel event of a trace carries its footprint, so the arithmetic can be redone on a real one: H100 Qwen, the forward chapter 3
# read (16 sequences of 559 tokens, 16 heads of 64, bfloat16, causal). A step's `gpu_work` names
# the op that launched each kernel; `trace_kernel` reads the first flash kernel's footprint:

# %%
h100_trace = borrowed.TRACELENS["h100_qwen"].trace()
h100_step = borrowed.TRACELENS["h100_qwen"].step(trace=h100_trace)
flash_kernels = h100_step.gpu_work[h100_step.gpu_work["op"] == "aten::_flash_attention_forward"]
real = trace_kernel(flash_kernels.iloc[0], h100_trace.device_properties)
footprint = ["grid", "block", "registers_per_thread", "shared_memory"]
flash_kernels[footprint].head(3)  # 3 of its 24 calls: one footprint

# %% tags=["remove-input"]
h100_calls = ch03.recorded_calls(h100_step)
h100_call = h100_calls[0]
per_call = [ch03.call_step(h100_step, call).gpu_work for call in h100_calls]
lesson(all(len(kernels_) == 1 for kernels_ in per_call) and len(flash_kernels) == len(h100_calls),
       "each SDPA call launched exactly one kernel, the flash kernel",
       f"{len(h100_calls)} calls, {len(flash_kernels)} kernels")
lesson(flash_kernels["grid"].astype(str).nunique() == 1 and flash_kernels["registers_per_thread"].nunique() == 1
       and flash_kernels["shared_memory"].nunique() == 1,
       "all of one footprint: the first kernel stands for every call", f"grid {list(real.grid)}")
limits = device_limits_table(h100_trace.device_properties[0])
lesson((limits["the trace"] == limits["kernels.hw.occupancy's sm_90 table"]).all(),
       "the trace's H100 SM has the limits the occupancy arithmetic assumes for sm_90",
       f"{len(limits)} of {len(limits)} fields equal")
trace_sm = limits["the trace"]
glue_all(h100_regs_per_sm=f"{int(trace_sm['regsPerMultiprocessor']):,}", h100_smem_kib=int(trace_sm["sharedMemPerMultiprocessor"]) // 1024,
         h100_warp_slots=int(trace_sm["maxThreadsPerMultiprocessor"] // trace_sm["warpSize"]))

# %% [markdown]
# Its `deviceProperties` give the H100's SM {glue:text}`h100_regs_per_sm` registers and
# {glue:text}`h100_warp_slots` warp slots, as the A100's, and more shared memory
# ({glue:text}`h100_smem_kib` KiB). Does that let more of these blocks in? (The arithmetic is
# folded under the cell.)

# %% tags=["hide-output"]
print(real.occupancy.explain())

# %% tags=["remove-input"]
lesson(real.occupancy.limited_by == "registers"
       and (real.occupancy.blocks_by_shared_memory or 0) > real.occupancy.blocks_per_sm,
       "registers bind: shared memory alone would allow more blocks",
       f"{real.occupancy.blocks_per_sm} by registers, {real.occupancy.blocks_by_shared_memory} by shared memory")
lesson(real.kineto_rounded == real.recorded_percent,
       "Kineto's estimate, redone from footprint and grid, matches the trace",
       f"{real.kineto_percent:g}% -> {real.kineto_rounded}, recorded {real.recorded_percent:g}")
lesson(real.occupancy.percent == flash_occ.percent, "the same footprint gives the H100 the A100's occupancy",
       f"{real.occupancy.percent:g}% on both")
glue_all(h100_blocks=real.occupancy.blocks_per_sm, h100_warps_per_block=real.occupancy.warps_per_block,
         h100_warps=real.occupancy.warps_per_sm, h100_occ=real.occupancy.percent, h100_recorded_occ=real.recorded_percent,
         h100_regs_per_block=f"{real.registers_per_thread * real.threads_per_block:,}",
         h100_smem_blocks=real.occupancy.blocks_by_shared_memory, a100_smem_blocks=flash_occ.blocks_by_shared_memory)

# %% [markdown]
# Why exactly 48 KiB? The name's template arguments, `Flash_fwd_kernel_traits<64, 128, 128, 4, ...>`,
# are FlashAttention-2's tiles: head dim 64, 128 query rows a block, 128 key rows a loop step,
# 4 warps. Shared memory holds one Q tile and one each of K and V, in bfloat16:

# %%
tiles = sdpa.flash_tiles(real.name)

# %% tags=["remove-input"]
batch_, heads_, seq_ = h100_call.q[0], h100_call.q[1], h100_call.q[2]
print(f"shared memory: ({tiles.block_m} + 2 x {tiles.block_n}) rows x {tiles.head_dim} x 2 bytes = "
      f"{tiles.shared_bytes():,} B; grid: ceil({seq_} / {tiles.block_m}) query tiles x {batch_} x {heads_} = "
      f"{tiles.grid(batch_, heads_, seq_)}")
lesson(tiles.shared_bytes() == real.shared_mem_per_block and tiles.threads == real.threads_per_block,
       "the name's tiles give its shared memory and threads exactly",
       f"{tiles.shared_bytes():,} B, {tiles.threads} threads")
lesson(tiles.grid(batch_, heads_, seq_) == list(real.grid),
       "its grid is one block per query tile, sequence and head of the call", str(list(real.grid)))
lesson(real.shared_mem_per_block <= KINETO_SHARED_MEM_LIMIT,
       "48 KiB is exactly Kineto's default per-block limit, so this kernel does not read 0%")
lesson(4 < real.waves < 5, "the grid runs in four full waves and part of a fifth", f"{real.waves:.2f} waves")
glue_all(h100_grid_blocks=f"{real.grid_blocks:,}", h100_resident=real.resident_blocks, h100_waves=real.waves,
         h100_sms=real.sm_count, h100_avg_blocks=real.grid_blocks / real.sm_count)
# A GPU run only (this run's or the book's recording): each fused backend is one kernel, and the trace's
# occupancy is Kineto's estimate recomputed from its footprint (0% above 48 KiB of shared memory).
if any(n in gpu_steps for n in FUSED):
    display(ch03b.fused_kernels_read(gpu_steps))

# %% [markdown]
# The grid's {glue:text}`h100_grid_blocks` blocks meet {glue:text}`h100_sms` SMs holding
# {glue:text}`h100_resident` at a time: {glue:text}`h100_waves:.2f` [waves](glossary.md#wave),
# the last leaving SMs idle. Kineto's "blocks per SM",
# {glue:text}`h100_avg_blocks:.2f`, is the grid over the SMs; its estimate takes the smaller of
# that average and what fits, so a small grid reads low because it is small.
#
# ## cuDNN's CPU time
#
# No trace here ran cuDNN: this reads the article's numbers and PyTorch's source. Per forward on
# its A100 (GPU / CPU time): efficient 277.9 / 117 µs, flash 146.8 / 138 µs, cuDNN
# 186.3 / **214** µs. cuDNN, with no transposes, spends the most CPU time, inside one opaque
# `_cudnn_attention_forward` bar. PyTorch builds the cuDNN graph once per shape and caches it
# (`aten/src/ATen/native/cudnn/MHA.cpp`): the first call at a new shape is the expensive one, and inside the profiled window it inflates the average. A cleaner
# trace did not mean less work: the work moved where the profiler cannot split it.

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
# Each time the sequence doubles, by what factor do you
# expect one forward's peak memory to grow, with the math backend and with flash? The cell after
# yours profiles one forward at a few lengths (math stops a doubling earlier, to spare memory).

# %%
guess_growth = {"sdpa_math": 2.0, "sdpa_flash": 1.0}  # edit me: peak memory x per doubling of S

# %% tags=["remove-cell"]
# On a GPU the sweep starts one doubling later: the larger batch and heads there have bigger
# S-sized (not S×S) buffers, which would blur the 4x at short sequences.
sweep_seqs = [256, 512, 1024, 2048] if device.type == "cpu" else [512, 1024, 2048, 4096]

# %%
sweep_for = {"sdpa_math": sweep_seqs[:-1], "sdpa_flash": sweep_seqs}  # sweep_seqs: 256 to 2048 on a CPU
peaks, sweep_steps = ch03b.peak_memory_sweep(sweep_for, batch, heads, head_dim, dtype=dtype, device=device,
                                            trace_dir=trace_dir)
ch03b.peaks_and_growth(peaks)

# %%
#| caption: Peak memory of one forward against sequence length, log-log. The math backend follows the dotted S² guide (about 4x per doubling); the flash kernel follows the dashed S guide (about 2x), apart from any doubling marked with its factor: a step of the CPU kernel's scratch buffer, explained below.
#| alt: Log-log line chart of peak memory against sequence length for sdpa_math and sdpa_flash, with guide lines proportional to S and to S squared.
ch03b.peak_memory_figure(peaks)

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
lesson(flash_growth.iloc[-1] <= 2.1, "at its last doubling flash's peak grows about 2x or less, not 4x",
       f"{flash_growth.iloc[-1]:.2f}x; all: " + ", ".join(f"{x:.2f}x" for x in flash_growth))
common = peaks.dropna().index[-1]
lesson(peaks.loc[common, "sdpa_flash"] < peaks.loc[common, "sdpa_math"] / 4,
       "at the longest S both ran, flash's peak is a small fraction of math's",
       f"S={common}: {peaks.loc[common, 'sdpa_flash']:.2f} vs {peaks.loc[common, 'sdpa_math']:.1f} MiB")
glue("flash_reading", f"At S = {peaks.index[-1]} flash peaked at {peaks['sdpa_flash'].iloc[-1]:.1f} MiB, "
                      f"up {flash_growth.iloc[-1]:.2f}x from the length before.")

# %% [markdown]
# The math backend holds S×S intermediates (scores, probabilities, guards), so its peak grows
# with S², about 4x per doubling: a guess of 2x counted tokens, not pairs of them. The flash kernel allocates only the output (S×D), one
# [log-sum-exp](glossary.md#log-sum-exp) per row and a scratch buffer (never S×S), so its peak
# grows with S, about 2x once S is large: a guess of 1x forgot that the output grows with S.
# {glue:text}`flash_reading`
#
# On a CPU the flash curve has a bump. ATen's `cpu_flash_attention` gives each thread a slice of
# one scratch buffer, room for one block of queries against one block of keys, and picks larger
# blocks for longer sequences, so the buffer steps up, then stays put.

# %% tags=["remove-input"]
if device.type == "cpu" and "sdpa_flash" in fused_here:
    acc = ch03b.cpu_flash_allocation_table(sweep_steps, batch, heads, head_dim, q.element_size())
    lesson((acc["allocations"] == 3).all() and acc["output"].all() and acc["log-sum-exp"].all(),
           "every CPU flash forward allocates exactly three buffers: output, log-sum-exp, one shared scratch buffer")
    lesson(acc["scratch (KiB)"].is_monotonic_increasing and acc["scratch (KiB)"].nunique() > 1,
           "the bump is the scratch buffer, stepping up as the kernel picks larger blocks",
           ", ".join(f"{x:,.0f}" for x in acc["scratch (KiB)"]) + " KiB")
    lesson(acc["scratch (KiB)"].iloc[-1] == acc["scratch (KiB)"].iloc[-2],
           "the scratch buffer stops growing: same size at the two longest S",
           f"{acc['scratch (KiB)'].iloc[-1]:,.0f} KiB")

# %% [markdown]
# ## Side by side: three forwards, timed
#
# The sweep's profiler tracked memory: right for memory, wrong for time. The cell below times
# chapter 2's in-place module, the math backend and flash without it, alternating call by call; `comparison.compare` ranks one fastest only when its slowest tenth of
# calls (p90) beats every other's fastest tenth (p10):

# %%
timing = comparison.compare({n: functools.partial(kernels.get(n), q, k, v)
                             for n in ("inplace", "sdpa_math", "sdpa_flash")},
                            device=device, rounds=11)

# %% tags=["remove-input"]
display(ch03b.timing_table(timing))
others = [n for n in timing.median_ms if n != "sdpa_flash"]
lesson(not any(timing.p90_ms[o] < timing.p10_ms["sdpa_flash"] for o in others),
       "timed without the profiler, the fused kernel ranks fastest of the three"
       if timing.faster() == "sdpa_flash" else
       "timed without the profiler, neither the in-place module nor the math backend beats the fused kernel",
       "; ".join(ch03b.pair_verdict(timing, "sdpa_flash", o) for o in others))
glue("fused_timing_reading", ch03b.pair_reading(timing, "inplace", "sdpa_math"))

# %% [markdown]
# {glue:text}`fused_timing_reading` Medians move between runs and machines; only a ranking the
# spread check makes is a result.
#
# ## What to remember
#
# - The fused backends are one kernel each; read their names as fingerprints first.
# - Low occupancy can be by design: flash spends registers and shared memory on on-chip tiles,
#   and its registers, not its shared-memory tiles, are what limit it.
# - The profiler's occupancy is Kineto's estimate, with a 48 KiB default shared-memory limit:
#   above it a kernel reads 0%. Check the footprint.
# - A cleaner CPU track is not less work: cuDNN's CPU time sits in one opaque op, and the first
#   call at a shape builds the graph.
# - Fused attention's memory grows with S, not S²: the scores never leave the chip.
#
# Next: write that fused kernel ourselves, in Triton.
#
# **Practice:** [the exercises for this chapter](exercises/03_sdpa.ipynb), with automatic checks, hints and hidden solutions.
