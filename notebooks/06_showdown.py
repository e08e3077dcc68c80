# %% [markdown]
# # 6. Showdown
#
# Every implementation of the course, side by side, on the machine that built this page: what
# one forward runs (ops on a CPU, [kernels](glossary.md#kernel) on a GPU), its time, its peak
# memory and its place under the device's [roofline](glossary.md#roofline); then a real model's
# attention on two datacenter GPUs. The source article closes with a table typed by hand from one
# A100; this one is regenerated on every build, so it cannot disagree with the code.
#
# **You will learn to:**
#
# - read a benchmark table the build regenerates: median time with its spread, peak memory and
#   [FLOP/s](glossary.md#flops);
# - count causal FLOPs at half, for a forward, a training step and a decode token, and place each
#   implementation under the roofline;
# - tell from a real trace's grid, [SM](glossary.md#sm) count and registers why a short sequence's
#   attention reaches a small fraction of a GPU's peak.
#
# **Before you start:** Chapters [1. Attention by hand](01_naive.ipynb) to [5. FlashAttention in
# CUDA, by hand](05_cuda.ipynb): their implementations are the contenders.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math

from kernels import reference
from kernels.attention.sdpa import flash_tiles
from kernels.bench import plots, sweep
from kernels.book import ch06_showdown as ch06
from kernels.borrowed import TRACELENS, traces_box
from kernels.hw import devices
from kernels.notebook import glue, glue_all, inputs, lesson, mib, readable, reveal, say, setup
from kernels.trace.attention import find_attention
from kernels.trace.links import links

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
glue("run_label", run_label := devices.run_label(device))
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)

# %% tags=["remove-input"]
borrowed = {"H100 Qwen": TRACELENS["h100_qwen"], "MI300X Qwen": TRACELENS["mi300x_qwen"],
            "H100 BERT": TRACELENS["h100_bert"]}
traces_box(borrowed)

# %% [markdown]
# Measured on: {glue:text}`run_label`, except the last two sections (the GPU traces in the box
# above, the source article's A100 table).
#
# ## The contenders
#
# The library says what runs on this device, and why not where it cannot. Two exclusions are
# choices: on a CPU, `triton` runs in Triton's *interpreter* (NumPy, to check correctness), and
# `compiled_naive` and `flex` would compile for seconds at each length (chapter 7 times compiled
# naive against eager and quotes flex's speed).

# %% tags=["hide-output"]
contenders = ch06.contenders(device)[0]   # the names measured here
ch06.lineup(device)

# %% tags=["remove-input"]
if not on_gpu:
    lesson(contenders == ["naive", "inplace", "sdpa_math", "sdpa_flash"],
           "on a CPU the showdown is naive, inplace, sdpa_math and sdpa_flash")

# %% [markdown]
# ## What one forward runs
#
# Each contender is profiled with `kernels.trace.record` at the chapter's shape
# (B={glue:text}`shape_b`, H={glue:text}`shape_h`, S={glue:text}`shape_s`,
# D={glue:text}`shape_d`). On a CPU we count the ops that do arithmetic themselves: not views or
# allocations (not `matmul`, but the `bmm` under it). On a GPU we count the kernels, copies and
# memsets of one forward. The traces are linked, folded, under the table.

# %%
steps_of = ch06.profile_forwards(contenders, q, k, v, active_steps, trace_dir)  # {name: its median step}
ch06.ops_table(steps_of)

# %% tags=["remove-input", "hide-output"]
display(*(links(s) for s in steps_of.values()))

# %% tags=["remove-input"]
contenders = list(steps_of)
work = {name: s.work_ops() for name, s in steps_of.items()}
glue_all(shape_b=batch, shape_h=heads, shape_s=seq, shape_d=head_dim)
if not on_gpu:
    lesson(work["sdpa_flash"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"],
           "the fused CPU flash backend is one op per forward", ", ".join(work["sdpa_flash"]))
lesson(all(len(work[n]) > len(work["sdpa_flash"]) for n in ("naive", "inplace", "sdpa_math")),
       "every unfused implementation runs more ops than the fused one",
       ", ".join(f"{n} {len(work[n])}" for n in ("naive", "inplace", "sdpa_math")))
lesson(len(work["naive"]) > len(work["inplace"]), "the in-place forward runs fewer ops than the naive one")

# %% [markdown]
# ## Timing and memory: the sweep
#
# Times come from `kernels.bench`, never from one profiled step: it warms up, times many calls on
# fresh inputs rotated through more memory than the caches hold, and keeps the median and the
# 10th-90th percentile spread. A time is a result only where it passes the spread check (90th
# percentile within 2x the 10th), which mostly catches other work on the same cores. Peak memory
# is measured on one more call. [*Measuring honestly*](appendix/measuring.ipynb) explains each
# choice. The book sweeps
# S = {glue:text}`other_seqs` besides S={glue:text}`shape_s`, on a short budget (at most
# {glue:text}`budget_reps` timed calls and {glue:text}`budget_s` s a point); `python -m kernels.bench`
# sweeps longer.

# %%
other_seqs, budget = ch06.book_sweep(on_gpu, seq)   # the other lengths, and a short timing budget
common = dict(head_dims=(head_dim,), dtypes=(dtype,), batch=batch, heads=heads,
              device=device, progress=None)
results = sweep.sweep(contenders, seqs=(seq,), **common, **budget)   # this shape, with peak memory
results.extend(sweep.sweep(contenders, seqs=other_seqs, memory=False, **common, **budget))

# %% tags=["remove-input"]
at_seq = {r.impl: r for r in results if r.seq == seq and r.ok}
glue_all(other_seqs=", ".join(map(str, other_seqs)), budget_reps=budget["reps"], budget_s=budget["max_seconds"])
lesson(set(at_seq) == set(contenders), "every contender was measured at the chapter's shape")

# %% [markdown]
# ## Everything at a glance
#
# One row per contender at the chapter's shape: peak memory, median time with the spread of the
# middle 80% of calls, the FLOP rate (causal FLOPs halved), and its place under the roof (read in
# [The roofline](#the-roofline)). Before the table, rank the contenders by peak memory, smallest
# first (memory, unlike time, does not depend on how busy the machine is; a tie may come in either
# order):

# %%
guess_memory_order = ["inplace", "naive", "sdpa_flash", "sdpa_math"]  # edit me: smallest peak first

# %% tags=["remove-input"]
memory = {name: r.peak_memory_bytes for name, r in at_seq.items()}
print(ch06.smallest_first_verdict(guess_memory_order, {name: ch06.three_figures(mib(b)) for name, b in memory.items()}))

# %% tags=["remove-cell"]
def glance_caption(peaks):   # what the table was measured on, in its caption
    return f"This run: {run_label}. {dtype} B={batch} H={heads} S={seq} D={head_dim}, causal, forward. Roof: {peaks.source}."


# %%
peaks = devices.roofline_peaks(device)
glance = ch06.glance(at_seq, peaks)

# %% tags=["remove-input"]
ch06.glance_styled(glance, glance_caption(peaks))

# %% tags=["remove-input"]
smallest = min(memory, key=memory.__getitem__)
if not on_gpu:
    lesson(smallest == "sdpa_flash", "sdpa_flash has the smallest peak memory on the CPU", f"{readable(ch06.three_figures(mib(memory[smallest])))} MiB")
tied = ch06.overlapping({n: at_seq[n] for n in glance.index[glance["time (ms)"].notna()]})
say("Times whose spreads overlap rank nothing, whichever median is lower: here "
    + "; ".join(f"{a} and {b}" for a, b in tied) + "." if tied
    else "On this run no two timed rows' spreads overlap.")
glue_all(smallest=smallest, smallest_mib=readable(ch06.three_figures(mib(memory[smallest]))),
         naive_mib=readable(ch06.three_figures(mib(memory["naive"]))),
         untimed=ch06.untimed_text(glance), ridge=peaks.ridge)

# %% [markdown]
# The smallest peak is **{glue:text}`smallest`**'s, {glue:text}`smallest_mib` MiB against
# {glue:text}`naive_mib` MiB for naive. Naive and in-place can share a peak:
# [chapter 2](02_inplace.ipynb) showed that removing the copy lowers the total allocated, not the
# peak. Memory is asserted; times are quoted, never ranked by an assertion ({glue:text}`untimed`).
#
# ## Counting FLOPs: causal is half
#
# A forward does two matmuls of $2 \cdot S^2 \cdot D$ FLOPs per head, $4BHS^2D$ in all. With a
# causal mask half of the score matrix is never needed, and a fused kernel skips it, so the course
# counts causal attention at **half**: $2BHS^2D$. Counting it in full doubles every TFLOP/s, a
# mistake that has shipped in real benchmarks (the [appendix](appendix/measuring.ipynb) tells the
# story). Other chapters link here for the rule.

# %% tags=["remove-input"]
wrong = [(r.impl, r.seq) for r in results if not (r.causal and r.flops == 2 * r.batch * r.heads * r.seq**2 * r.head_dim
                                                  == reference.flops(r.batch, r.heads, r.seq, r.head_dim, causal=False) / 2)]
lesson(not wrong, "every row counts causal FLOPs as half of full attention, 2·B·H·S²·D",
       f"{len(results)} rows" if not wrong else f"wrong: {wrong}")
glue_all(flash_gflop=at_seq["sdpa_flash"].flops / 1e9, flash_gflop_full=2 * at_seq["sdpa_flash"].flops / 1e9)

# %% [markdown]
# So every forward at S={glue:text}`shape_s` counts {glue:text}`flash_gflop:.3g` GFLOP, not
# {glue:text}`flash_gflop_full:.3g`.
#
# ## Across sequence lengths
#
# Time first, then (folded) throughput under the compute ceiling ({glue:text}`peak_label`). On
# log-log axes a slope of 2 is attention's S²; the band is the spread of the timed calls. Only
# points that pass the spread check are drawn, and where two bands overlap the lines' order is
# noise. Peak memory against S is measured in [chapter 3b](03b_sdpa_fused.ipynb).

# %% tags=["remove-cell"]
glue_all(drawn=len(plots.steady(results)), measured=sum(r.ok for r in results),
         peak_label=(f"{readable(peaks.flops / 1e9)} GFLOP/s" if peaks.flops < 1e12 else
                     f"{readable(peaks.flops / 1e12)} TFLOP/s") + f" {peaks.flops_dtype}, {peaks.source}")

# %%
#| caption: Median time per call against sequence length, log-log, for the points whose timed calls passed the spread check; the band is the 10th to 90th percentile, and a slope of 2 is attention's S².
#| alt: Log-log line chart of time per call against sequence length, one line per implementation with a shaded spread band.
steady = plots.steady(results)
plots.time_vs_seq(steady)

# %% tags=["remove-input"]
say(ch06.sweep_reading(results))

# %% tags=["hide-output"]
#| caption: Achieved TFLOP/s against sequence length under the device's compute ceiling (dashed), causal FLOPs counted as half of full attention, for the points that passed the spread check.
#| alt: Line chart of achieved TFLOP/s against sequence length, one line per implementation, under a dashed horizontal peak line.
plots.tflops_vs_seq(steady, peak=peaks)

# %% [markdown]
# ## The roofline
#
# Each point is one implementation at one S: its arithmetic intensity (FLOPs per byte that must
# cross memory at least once, `kernels.reference.io_bytes`) against the FLOP/s it achieved. Below
# the ridge ({glue:text}`ridge:.3g` FLOP/byte here) a kernel can at best run at memory speed;
# above it, at compute speed. A point far under its roof is limited by neither (by overheads or
# latency, say). Writing and reading the S×S scores pins the materializing implementations'
# intensity near a constant; a fused kernel's grows with S.

# %% tags=["remove-input"]
peaks, above = devices.roof_for_points(steady, peaks, device)   # a CPU roof read low is measured again
lesson(not above, "every forward drawn sits at or under its ceiling",
       ", ".join(f"{r.impl} at S={r.seq}" for r in above) or f"{len(steady)} points")

# %%
#| caption: The roofline: each forward at its arithmetic intensity (FLOP per byte moved) and its achieved FLOP/s, under the device's two ceilings, memory bandwidth (the slope) and compute (the flat roof); every point drawn sits under its ceiling (checked above).
#| alt: Log-log scatter of achieved FLOP/s against arithmetic intensity per implementation and length, under a sloped bandwidth line and a flat compute line.
plots.roofline(steady, device=peaks)

# %% [markdown]
# ## Beyond one forward: a training step and a decode token
#
# **Training** runs the forward and then its backward ([chapter 9](09_backward.ipynb)): five
# matmuls to the forward's two, so a training step counts 3.5x the forward's FLOPs. **Generation**
# runs one **decode token** per new token: a single query against a
# [KV cache](glossary.md#kv-cache) of $S_k$ keys, $4 \cdot B \cdot H \cdot S_k \cdot D$ FLOPs with
# nothing halved, because the causal mask hides no key from the newest query. At this chapter's
# shape:

# %%
forward_flops = reference.flops(batch, heads, seq, head_dim, causal=True)
training_flops = reference.flops(batch, heads, seq, head_dim, causal=True, backward=True)
decode_flops = reference.decode_flops(batch, heads, seq, head_dim)

# %% tags=["remove-input"]
lesson(training_flops == 3.5 * forward_flops, "a training step counts 3.5x the forward's FLOPs, the backward 2.5x",
       f"{readable(training_flops / 1e9)} vs {readable(forward_flops / 1e9)} GFLOP")
lesson(decode_flops == 4 * batch * heads * seq * head_dim == 2 * forward_flops / seq,
       "a decode token counts 4·B·H·Sk·D, nothing halved", f"{readable(decode_flops / 1e6)} MFLOP")

# %% [markdown]
# A decode token reads the whole cache for those few FLOPs: memory-bound by construction, as
# [chapter 10](10_decoding.ipynb) measures.
#
# ## On real GPUs: one model's attention on an H100 and an MI300X
#
# *H100 Qwen* and *MI300X Qwen* are one forward of Qwen1.5-0.5B-Chat (16 prompts of 559 tokens,
# bfloat16, PyTorch's [SDPA](glossary.md#sdpa)) profiled on an H100 and an MI300X by AMD's TraceLens
# project (the box's 2048 is the harness's length setting; the shapes show the 559 tokens that
# ran). `kernels.trace.attention.find_attention` reads every SDPA call: kernel, shapes, GPU time
# and FLOPs, counted [causal half](#counting-flops-causal-is-half). Before the reveal: what share
# of the H100's dense bf16 peak did one call reach?

# %%
guess_h100_percent_of_peak = 50  # edit me: % of the H100's dense bf16 peak, per call

# %%
reports = {name: find_attention(trace.step()) for name, trace in borrowed.items()}
calls = ch06.achieved_against_peak({name: reports[name] for name in ("H100 Qwen", "MI300X Qwen")})
per_gpu = ch06.per_gpu(calls)
per_gpu

# %% tags=["remove-input"]
h100_row, mi300x_row = per_gpu.loc["H100 Qwen"], per_gpu.loc["MI300X Qwen"]
_ = reveal(guess_h100_percent_of_peak, round(h100_row["median % of peak"], 1), "% of the H100's peak, median call",
           source="H100 Qwen")

# %% tags=["hide-output"]
#| caption: Every attention call of one Qwen1.5-0.5B forward (16 x 559 tokens, causal, bf16) on an H100 and on an MI300X (H100 Qwen, MI300X Qwen), at its achieved TFLOP/s (causal FLOPs counted half), under each GPU's dense bf16 peak (dashed, datasheet).
#| alt: Scatter of 24 points per GPU near the bottom of the chart, far below two dashed horizontal peak lines at 989 and 1307 TFLOP/s.
plots.achieved_vs_peak(calls)

# %% tags=["remove-input"]
shapes = set(calls[["B·H", "Sq", "Sk", "D", "causal"]].itertuples(index=False))
lesson(len(shapes) == 1 and all(row.GFLOP * 1e9 == reference.flops(1, row[1], row.Sq, row.D, causal=True)
                                for row in calls[["GFLOP", "B·H", "Sq", "D"]].itertuples(index=False)),
       "every call on both GPUs is the same causal attention, counted causal half",
       "B·H, Sq, Sk, D = " + "; ".join(", ".join(str(x) for x in s[:4]) for s in shapes))
lesson(calls["% of peak"].max() < 10, "no call reached a tenth of its GPU's dense bf16 peak",
       f"best {calls['% of peak'].max():.1f}%")
lesson(h100_row["median TFLOP/s"] > mi300x_row["median TFLOP/s"],
       "the H100 ran these calls at more TFLOP/s than the MI300X, whose datasheet peak is higher",
       f"medians {h100_row['median TFLOP/s']:.1f} vs {mi300x_row['median TFLOP/s']:.1f}")
glue_all(qwen_h100_tflops=h100_row["median TFLOP/s"], qwen_h100_pct=h100_row["median % of peak"],
         qwen_mi300x_tflops=mi300x_row["median TFLOP/s"], qwen_mi300x_pct=mi300x_row["median % of peak"],
         qwen_h100_peak=h100_row["peak TFLOP/s"], qwen_mi300x_peak=mi300x_row["peak TFLOP/s"])

# %% [markdown]
# The median call ran at {glue:text}`qwen_h100_pct:.1f`% of the H100's {glue:text}`qwen_h100_peak:.0f`
# TFLOP/s and {glue:text}`qwen_mi300x_pct:.1f`% of the MI300X's {glue:text}`qwen_mi300x_peak:.0f`. A
# datasheet peak is every multiply unit of the chip ([tensor cores](glossary.md#tensor-core) here)
# busy on every cycle: how much of the chip did these calls keep busy?
#
# ### Why: the grid against the SMs
#
# A kernel is launched as a grid of thread blocks ([CTAs](glossary.md#cta); *workgroups* on AMD),
# each run whole on one [SM](glossary.md#sm) (a *compute unit*, CU, on AMD); the trace records the
# grid and the SM count. An SM holds as many blocks at once as its
# [registers](glossary.md#registers), [shared memory](glossary.md#shared-memory) and
# [warp](glossary.md#warp) slots allow ([occupancy](glossary.md#occupancy), chapters 3b and 4); a larger
# grid runs in [*waves*](glossary.md#wave), and the last may leave SMs idle. A third trace, *H100
# BERT*, shows the short end: BERT-small, 141 tokens, same H100. Our occupancy is that of an SM
# holding blocks; Kineto's spreads the grid over all SMs, so the two part where few SMs get blocks.
# "—": not recorded (ROCm traces carry no register counts).

# %%
grids = ch06.grids_table(reports)
grids

# %% tags=["remove-input"]
h100_grid, mi300x_grid, bert_grid = (ch06.grid_against_sms(reports[n]).iloc[0] for n in borrowed)
qwen_call = calls.iloc[0]
bert_call = ch06.achieved_against_peak({"H100 BERT": reports["H100 BERT"]}).iloc[0]
h100_kernel = reports["H100 Qwen"].calls[0].main_kernel()
assert h100_kernel is not None, "the H100 Qwen trace's first attention call launched its flash kernel"
tiles = flash_tiles(h100_kernel["name"])   # its template arguments
query_tiles, key_tiles = math.ceil(qwen_call["Sq"] / tiles.block_m), math.ceil(qwen_call["Sk"] / tiles.block_n)
lesson(h100_grid["CTAs"] == query_tiles * qwen_call["B·H"],
       f"on the H100, flash launches one CTA per {tiles.block_m} query rows of each (batch, head): "
       f"ceil({qwen_call['Sq']} / {tiles.block_m}) x {qwen_call['B·H']} CTAs", f"grid {h100_grid['grid']} = {h100_grid['CTAs']} CTAs")
tail_idle = ch06.tail_estimate(h100_grid["waves"])
lesson(h100_grid["waves"] > 4 and tail_idle < 0.05,
       "they fill the H100's SMs in several waves; the last wave's idle SMs cost under 5% of the call",
       f"{h100_grid['CTAs']} / ({h100_grid['SMs (CUs)']} SMs x {h100_grid['CTAs per SM at once']}) = "
       f"{h100_grid['waves']:.2f} waves")
h100_occ = h100_grid["occupancy % (ours)"]
lesson(abs(h100_occ - h100_grid["occupancy % (trace)"]) < 1,
       "each SM holds only a few CTAs (registers: 255 per thread), the occupancy Kineto estimated",
       f"{h100_occ:.1f}% of warp slots; trace {h100_grid['occupancy % (trace)']:g}%")
lesson(bert_grid["CTAs"] < bert_grid["SMs (CUs)"] / 4,
       "BERT-small's 141 tokens launch fewer CTAs than a quarter of the H100's SMs",
       f"{bert_grid['CTAs']} CTAs on {bert_grid['SMs (CUs)']} SMs, {bert_call['TFLOP/s']:.1f} TFLOP/s")
cus, workgroups = mi300x_grid["SMs (CUs)"], mi300x_grid["CTAs"]
lesson(workgroups % cus == 0 and all(workgroups != math.ceil(qwen_call["Sq"] / m) * qwen_call["B·H"]
                                     for m in (16, 32, 64, 128, 256)),
       "the MI300X's grid is a whole multiple of its CUs and no count of query tiles: each workgroup loops over tiles",
       f"{workgroups} = {workgroups // cus} x {cus} CUs")
glue_all(qwen_ctas=int(h100_grid["CTAs"]), qwen_waves=h100_grid["waves"], h100_sms=int(h100_grid["SMs (CUs)"]),
         qwen_per_sm=int(h100_grid["CTAs per SM at once"]), qwen_occ=h100_occ,
         qwen_padded=query_tiles * tiles.block_m, qwen_sq=int(qwen_call["Sq"]), qwen_key_tiles=key_tiles,
         tail_idle_pct=100 * tail_idle, bert_ctas=int(bert_grid["CTAs"]),
         bert_kineto_occ=float(bert_grid["occupancy % (trace)"]), bert_tflops=bert_call["TFLOP/s"],
         mi300x_wg=int(workgroups), mi300x_cus=int(cus), qwen_smem_kib=int(h100_kernel["shared_memory"]) // 1024,
         qwen_first_key_tiles_text=ch06.count_of(math.ceil(min(tiles.block_m, qwen_call["Sq"]) / tiles.block_n),
                                                 "key tile"))

# %% [markdown]
# The last wave's cost is an estimate that assumes equal work per CTA (causal CTAs differ: the first query tile meets
# {glue:text}`qwen_first_key_tiles_text`, the last {glue:text}`qwen_key_tiles`). Two things weigh
# more. Each SM ran only {glue:text}`qwen_occ:.1f`% of its warp slots: FlashAttention keeps Q, K and
# V tiles in shared memory ({glue:text}`qwen_smem_kib` KiB a CTA, as in
# [chapter 3b](03b_sdpa_fused.ipynb)) and the score tile and output in registers, trading
# occupancy for them. And each CTA had little to do: {glue:text}`qwen_sq` rows padded to
# {glue:text}`qwen_padded`, at most {glue:text}`qwen_key_tiles` key tiles a query tile, so loading
# Q, writing O and masking the diagonal weigh as much as the multiplies. Longer sequences amortise
# them: the FlashAttention-3 paper (arXiv 2407.08608, Fig. 5) measures FlashAttention-2, the kernel
# here, on an H100 at 191 TFLOP/s for causal S = 512 and 335 at S = 16k (D = 128).
#
# BERT-small left most SMs without a block (hence Kineto's {glue:text}`bert_kineto_occ:g`%, its
# CTAs spread over all {glue:text}`h100_sms`). The MI300X's grid is sized to the chip, so no wave
# is half empty; why its calls were slower, the trace does not record.
#
# ## Recorded elsewhere: the source article's A100
#
# Quoted from the source article (named in the caption), measured on one NVIDIA A100-SXM4-80GB in
# bfloat16 under `torch.no_grad`; never mixed with this run's numbers.

# %% tags=["remove-input"]
ch06.article_styled()

# %% tags=["remove-input"]
cuda_us = ch06.ARTICLE_A100["CUDA time per forward (µs)"]
glue_all(article_math_ratio=float(cuda_us["SDPA math"] / cuda_us["in-place (masked_fill_)"]),
         article_fused_max_us=float(cuda_us[["SDPA efficient", "SDPA flash", "SDPA cuDNN"]].max()))
if on_gpu:  # this run's fused medians, beside the article's
    print(ch06.fused_medians(at_seq))

# %% [markdown]
# On that A100, SDPA's math backend was {glue:text}`article_math_ratio:.1f`x slower than the
# hand-written in-place version, while each fused backend needed at most
# {glue:text}`article_fused_max_us:.0f` µs per forward; the fused backends' ranking is the
# article's, on its shapes and GPU. A GPU build of this book fills the tables above with its own
# numbers, which other shapes, GPUs and versions move away from the article's.

# %% [markdown]
# ## What to remember
#
# - A table a build regenerates cannot drift from the code; another machine's numbers are quoted
#   with their source, apart.
# - Quote medians with their spread, from a benchmark harness, where the spread check passes.
# - Count causal FLOPs at half, or every TFLOP/s is twice too high; a decode token counts in full.
# - A training step is 3.5 forwards of FLOPs; a decode token is memory-bound by construction.
# - A datasheet peak needs every SM busy with enough work: at {glue:text}`qwen_sq` tokens each H100
#   SM held {glue:text}`qwen_per_sm` CTAs with little work each; at BERT's 141 most SMs got none.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/06_showdown.ipynb), with automatic checks, hints and hidden solutions.
