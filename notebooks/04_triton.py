# %% [markdown]
# # 4. FlashAttention-2 in Triton
#
# The [SDPA](glossary.md#sdpa) chapter ended on `pytorch_flash`, one fused
# [kernel](glossary.md#kernel) that keeps the S×S scores out of memory. Here we write one in
# Triton and read it like any other trace.
#
# **You will learn to:**
#
# - work the online softmax by hand;
# - count the tiles a causal program computes and skips, and test the skipping;
# - read a FlashAttention-2 forward in Triton: grid, inner loop, causal stages;
# - read its profile: one opaque span in the interpreter, one kernel and its
#   [occupancy](glossary.md#occupancy) on a GPU.
#
# **Before you start:** [3b. The fused backends](03b_sdpa_fused.ipynb); softmax and matrix
# products.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
%matplotlib inline
import math
import os
import warnings

import torch
from IPython.display import Markdown
from matplotlib.figure import Figure

import kernels
import kernels.triton.flash as tf
from kernels import reference
from kernels.attention import sdpa
from kernels.bench import plots, sweep
from kernels.bench.results import FORWARD, FORWARD_BACKWARD, points_table
from kernels.book import ch04_triton as ch04
from kernels.borrowed import TRACELENS, traces_box
from kernels.dtypes import TORCH_DTYPES
from kernels.hw import occupancy
from kernels.notebook import glue, glue_all, inputs, lesson, reveal, say, setup, show_lines
from kernels.trace import reader, record, tables
from kernels.trace.attention import find_attention
from kernels.trace.links import links
from kernels.triton import backward as triton_backward, configs, launch, tiling

device, dtype = setup(device, dtype)
on_gpu = device.type == "cuda"
triton_attention = kernels.get("triton")
# Without a GPU the kernels run in Triton's interpreter, one NumPy call per tile operation:
# seconds per forward, so the CPU run keeps one batch element, two heads, 256 tokens at most.
run_batch, run_heads, run_seq = (batch, heads, seq) if on_gpu else (1, min(heads, 2), min(seq, 256))
q, k, v = inputs(run_batch, run_heads, run_seq, head_dim, dtype=dtype, device=device)
# The interpreter's fixed tile (a GPU's autotuner picks its own).
block_m, block_n = configs.INTERPRETER_BLOCKS["BLOCK_M"], configs.INTERPRETER_BLOCKS["BLOCK_N"]
# On the CPU one interpreted forward is enough to profile: no compilation, no autotuning to warm up.
profile_args: dict = dict(active=active_steps) if on_gpu else dict(wait=0, warmup=0, active=1)
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
glue("run_shape", f"B={run_batch} H={run_heads} S={run_seq} D={head_dim}")
glue("dtype", str(dtype).replace("torch.", ""))

# %% tags=["remove-input"]
traces_box({"H100 Qwen": TRACELENS["h100_qwen"]})

# %% [markdown]
# This run: {glue:text}`run_shape`, {glue:text}`dtype`. Without a GPU the kernel runs in
# Triton's slow *interpreter* ("Run it" says how), hence the small shapes.
#
# ## The online softmax
#
# Softmax needs the whole row: its maximum (so that $e^{x - m}$ never overflows) and the sum
# of exponentials. A FlashAttention program sees a row one tile of keys at a time, so it keeps
# a running maximum $m$ and sum $\ell$ per row, and corrects $\ell$ whenever a tile raises the
# maximum:
#
# $$m_{\text{new}} = \max(m, \max_j x_j),$$
#
# $$\ell_{\text{new}} = \ell \cdot e^{m - m_{\text{new}}} + \sum_j e^{x_j - m_{\text{new}}}.$$
#
# ### The rescaling step, by hand
#
# Take the row $x = [1, 2, 5, 0]$ in two tiles of two.
#
# - Tile 1, $[1, 2]$: $m = 2$, $\ell = e^{1-2} + e^{2-2}$ = {glue:text}`hand_l1:.4f`.
# - Tile 2, $[5, 0]$: $m$ rises to 5, so the old sum, relative to 2, is multiplied by
#   $e^{2-5}$: {glue:text}`hand_rescaled:.4f`; the new terms add $e^{5-5} + e^{0-5}$ =
#   {glue:text}`hand_new:.4f`; $\ell$ = {glue:text}`hand_l2:.4f`.
#
# That is $\sum_j e^{x_j - 5}$, as if the maximum were known from the start.
# `tf.tiled_softmax` (`kernels.triton.flash`) is this update in PyTorch, keeping
# $(m, \ell)$ after each tile:

# %%
x = torch.tensor([1.0, 2.0, 5.0, 0.0], dtype=torch.float64)
_, ((m1, l1), (m2, l2)) = tf.tiled_softmax(x, 2)

# %% tags=["remove-input"]
rescaled, new_terms = l1 * torch.exp(m1 - m2), torch.exp(x[2:] - m2).sum()
lesson(float(m1) == 2.0 and float(m2) == 5.0, "the running max goes 2, then 5")
lesson(bool(torch.isclose(l2, rescaled + new_terms)) and bool(torch.isclose(l2, torch.exp(x - 5).sum())),
       "rescaled old sum + new terms = the whole row's sum relative to its max",
       f"{float(rescaled):.4f} + {float(new_terms):.4f} = {float(l2):.4f}")
glue_all(hand_l1=float(l1), hand_rescaled=float(rescaled), hand_new=float(new_terms), hand_l2=float(l2))

# %% [markdown]
# ### From softmax to attention
#
# Attention needs $\sum_j \mathrm{softmax}(s)_j\, v_j$. The same trick carries over: keep an
# unnormalized output `acc` $=\sum_j e^{s_j - m} v_j$, rescale it by the same
# $\alpha = e^{m - m_\text{new}}$ when the maximum moves, and divide by $\ell$ at the end.
# `tf.online_attention_row` does it for one query row of this run, {glue:text}`softmax_block`
# keys at a time:

# %%
q64, k64, v64 = (t[0, 0].detach().to("cpu", torch.float64) for t in (q, k, v))
online = tf.online_attention_row(q64[-1], k64, v64, block_n)
exact = reference.attention(q64[None, None, -1:], k64[None, None], v64[None, None], causal=False)[0, 0, 0]

# %% tags=["remove-input"]
lesson(torch.allclose(online, exact, rtol=1e-12, atol=1e-12),
       "online attention of one row, tile by tile, equals the float64 reference row")
glue("softmax_block", block_n)

# %% [markdown]
# The kernel runs the same update on a `[BLOCK_M, BLOCK_N]` tile of scores. Its inner loop,
# `attn_fwd_inner`:

# %%
show_lines(tf.attn_fwd_inner, "m_new = tl.maximum", "m_i = m_new")

# %% [markdown]
# Line for line: the new max, $\alpha$, the probabilities, the rescaled sum, the rescaled
# output plus this tile's $P V$ (one `tl.dot`, on the [tensor cores](glossary.md#tensor-core)
# for 16-bit inputs). `m_ref` keeps a row with no key yet (all scores $-\infty$) from NaN.
#
# The kernel works in base 2, which GPUs compute natively: $e^x = 2^{x \log_2 e}$, and the
# launcher folds $\log_2 e$ ≈ {glue:text}`log2e:.3f` into the scale $1/\sqrt{d}$ once, on the
# host:

# %% tags=["remove-input"]
s = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 10
scale = 1 / math.sqrt(head_dim)
base_e = torch.exp(s * scale - (s * scale).max())
base_2 = torch.exp2(s * (scale * launch.LOG2E) - (s * (scale * launch.LOG2E)).max())
lesson(torch.allclose(base_e, base_2, rtol=1e-12), "exp(s·scale - m) = exp2(s·scale·log2 e - m·log2 e)")
glue("log2e", launch.LOG2E)

# %% [markdown]
# After the loop the program divides `acc` by $\ell$ and stores one more number per row, the
# [log-sum-exp](glossary.md#log-sum-exp) $m + \log_2 \ell$: from it the backward rebuilds any
# $P_{ij} = 2^{s_{ij} - \mathrm{LSE}_i}$ without storing $P$ (S numbers per head, not S²);
# its store, folded:

# %% tags=["remove-input", "hide-output"]
show_lines(tf.attn_fwd, "# log2 of each row's softmax denominator", "tl.store(LSE")

# %% [markdown]
# ## Tiles: what one program touches
#
# One *program* (one [CTA](glossary.md#cta) on a GPU) owns `BLOCK_M` query rows: it loads its
# Q tile once and streams the K and V tiles past it, `BLOCK_N` keys at a time. Each score tile
# is **full** (no mask), **masked** (on the causal diagonal, or past the end) or, when causal,
# **skipped** (all in the future: never loaded). `kernels.triton.tiling` classifies them, here
# for a ragged 200-token sequence and the interpreter's tiles:

# %% tags=["remove-cell"]
glue_all(block_m=block_m, block_n=block_n, n_gpu_configs=len(configs.GPU_CONFIGS))

# %%
#| caption: Which tiles each program computes, causal (top) and full (bottom), for a ragged sequence. Blue tiles need no mask, orange ones are masked (on the diagonal, at the ragged edge), grey ones are skipped; the green box is one program's Q tile, the strip on top the K, V tiles it streams.
#| alt: Two grids of tiles over query and key positions, one above the other. Top, causal: blue tiles below the diagonal, orange on it, grey above it. Bottom, full: all blue but an orange ragged last column.
fig = Figure(figsize=(5.2, 9.4), layout="constrained")
for ax, causal in zip(fig.subplots(2, 1), (True, False)):
    tiling.draw_tiles(200, block_m, block_n, causal=causal, program=2, ax=ax)
fig

# %% [markdown]
# A causal program walks its row of tiles left to right: unmasked, masked, then it stops. The
# kernel's loop does the same in two *stages*, each a call of `attn_fwd_inner` over
# the key tiles that `fwd_stages` computes:

# %% tags=["remove-input"]
show_lines(tf.fwd_stages, "if CAUSAL:", "return full_hi")

# %% [markdown]
# Causal is aligned bottom-right: query $i$ sees keys $j \le i + (S_k - S_q)$. Stage 1,
# `[0, full_hi)`, runs with `MASKED=False`: no comparison at all; stage 2,
# `[full_hi, masked_hi)`, masks; the loop goes no further: that is the skipping. `MASKED`,
# `CAUSAL` and the tile sizes are `tl.constexpr`: Triton compiles a branch-free loop for each
# value. Only stage 2 runs the mask's lines (folded):

# %% tags=["remove-input", "hide-output"]
show_lines(tf.attn_fwd_inner, "keep = cols[None, :] < SK", "s = tl.where(keep")

# %% [markdown]
# ### How much work does causal skip?
#
# Guess first. With GPU tiles of `BLOCK_M` = {glue:text}`gpu_block_m` query rows and
# `BLOCK_N` = {glue:text}`gpu_block_n` keys, what share of the non-causal kernel's tiles
# does a causal kernel compute at S = 256, where there are only two query tiles?

# %%
guess_causal_share_at_256 = 0.5  # edit me before running on

# %%
gpu_block_m, gpu_block_n = configs.GPU_CONFIGS[0][:2]
share = {s: tiling.computed_fraction(s, gpu_block_m, gpu_block_n) for s in (256, 1024, 16384)}

# %% tags=["remove-input"]
reveal(guess_causal_share_at_256, share[256], "the causal share of tiles at S=256", source="the tile count")
lesson(all(abs(share[s] - tiling.expected_fraction(math.ceil(s / gpu_block_m))) < 1e-12 for s in share),
       "with n query tiles the causal kernel computes (n+1)/(2n) of the tiles",
       ", ".join(f"S={s}: {f:.4f}" for s, f in share.items()))
glue_all(gpu_block_m=gpu_block_m, gpu_block_n=gpu_block_n, share_16k=share[16384])

# %% [markdown]
# Query tile $i$ computes $i$ tiles plus its diagonal one, hence $(n+1)/(2n)$, near one half
# at long S. [TFLOP/s](glossary.md#flops) count causal as exactly half
# ([chapter 6](06_showdown.ipynb) says why), so the masked half of each diagonal tile is work
# not credited.
#
# ### The skipping is real: a poison test
#
# Fill V with NaN from key `poison_from` ({glue:text}`poison_from`, the largest `BLOCK_M` the
# kernel may use here) on. A kernel that skips the tiles above the diagonal never reads those
# keys for earlier queries, whose outputs stay finite; one that masks after reading computes
# $0 \times \text{NaN} = \text{NaN}$.

# %% tags=["remove-cell"]
poison_from = max(c[0] for c in configs.GPU_CONFIGS) if on_gpu else block_m  # the largest BLOCK_M

# %%
qp, kp, vp = inputs(1, 1, 2 * poison_from, head_dim, dtype=dtype, device=device)
vp[:, :, poison_from:] = float("nan")
rows_nan = {name: kernels.get(name)(qp, kp, vp, causal=True).isnan().any(dim=-1)[0, 0]
            for name in ("triton", "naive")}

# %% tags=["remove-input"]
lesson(not rows_nan["triton"][:poison_from].any() and bool(rows_nan["triton"][poison_from:].all()),
       f"Triton: rows before {poison_from} stay finite, so no tile holding a later key was loaded for them")
lesson(bool(rows_nan["naive"].all()), "naive attention reads every key for every row: all rows are NaN")
glue("poison_from", poison_from)

# %% [markdown]
# ## The program and its grid
#
# The launcher, `tf.flash_forward`, starts one program per (batch, head) and query tile:

# %%
show_lines(tf.flash_forward, "triton.cdiv(s_q, meta")

# %% [markdown]
# `meta["BLOCK_M"]` is the tile height the *autotuner* picked: on a GPU the kernel is
# `attn_fwd_tuned`, `attn_fwd` under `@triton.autotune` with {glue:text}`n_gpu_configs`
# configurations; at each new shape it drops those that do not fit, times the rest and keeps the
# fastest (the interpreter: {glue:text}`block_m`×{glue:text}`block_n`). Each program first
# works out its rows (folded):

# %% tags=["remove-input", "hide-output"]
show_lines(tf.attn_fwd, "bh = tl.program_id(0)", "kvh = h // GROUP")

# %% [markdown]
# - `tl.program_id(0)` is the (batch, head): B·H goes on the grid's first axis, as the others
#   stop at 65,535.
# - `tl.program_id(1)` is the query tile, reversed when causal: longest job first.
# - With [grouped-query attention](glossary.md#gqa), query head `h` reads key/value head
#   `h // GROUP`, so K and V are never repeated in memory.
#
# Inside a kernel there are only pointers and masked loads (`row_ok = offs_m < SQ`), which
# read 0 past the ragged end.

# %% [markdown]
# ### The backward: three kernels, no atomics
#
# With $P$ rebuilt from the LSE, $dV = P^\top dO$, $dP = dO\,V^\top$,
# $dS = P \circ (dP - \Delta)$ with $\Delta_i = \sum_d O_{id}\, dO_{id}$, then
# $dK = \text{scale}\cdot dS^\top Q$ and $dQ = \text{scale}\cdot dS\,K$.
# `triton_backward.flash_backward` runs three kernels; their grids (folded):

# %% tags=["remove-input", "hide-output"]
show_lines(triton_backward.flash_backward, "pre_grid = ", "q_grid = ")

# %% [markdown]
# `attn_bwd_preprocess` computes $\Delta$; `attn_bwd_dkdv`, one program per *key* tile, $dK$
# and $dV$; `attn_bwd_dq`, one per query tile, $dQ$. One pass would need atomics on $dQ$, as
# FlashAttention-2's CUDA backward does (last bits that vary run to run); with two passes
# after the $\Delta$ one, each program owns what it writes, at the price of rebuilding $P$ twice.
#
# ## Run it
#
# `import kernels.triton` (which `kernels.get` does) sets `TRITON_INTERPRET=1` where no GPU is
# visible, unless you set it; `@triton.jit` reads it, and the kernels run on CPU tensors, NumPy
# doing the arithmetic.

# %% tags=["remove-input"]
lesson(kernels.available(device)["triton"] is None, f"the triton kernels run on {device.type}")
lesson(launch.INTERPRETED == (not on_gpu), "the kernels are interpreted exactly where there is no GPU",
       f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')}")
ragged_seq = run_seq // 2 - 15 if run_seq > 64 else run_seq   # 113 at S=256: a multiple of no tile size

# %% [markdown]
# Forward and backward against the float64 reference (chapter 1's rule), causal at {glue:text}`run_seq_text` tokens and
# non-causal at a ragged {glue:text}`ragged_seq`:

# %%
verdicts = {}
for causal, length in ((True, run_seq), (False, ragged_seq)):
    qs, ks, vs = inputs(1, 2, length, head_dim, dtype=dtype, device=device, seed=length)
    verdicts[causal, length] = reference.check(triton_attention, qs, ks, vs, causal, backward=True)

# %% tags=["remove-input"]
lesson(all(j.ok for j in verdicts.values()), "output, dQ, dK and dV all match the float64 reference",
       "; ".join(f"{'causal' if c else 'full'}, S={s}: worst {max(v.error for v in j.values()):.1e}"
                 for (c, s), j in verdicts.items()))
glue_all(run_seq_text=run_seq, ragged_seq=ragged_seq)

# %% [markdown]
# ## Profile it
#
# Guess first: how many aten ops, of any kind, does the profiler record under the `triton`
# label of one forward here? (The trace goes to `trace_dir`, a page parameter.)

# %%
guess_ops_in_forward = 3  # edit me before running on

# %%
run = record.profile(triton_attention, q, k, v, label="triton", trace_dir=trace_dir, **profile_args)
step = reader.median_step(run.steps())
tables.op_table(step, max_depth=0, times=False)

# %% tags=["remove-input"]
ops, top = step.ops, step.top_level()
compute_pattern = r"aten::(.*attention.*|matmul|mm|bmm|addmm|baddbmm|_?softmax|exp2?_?)"  # exp, not expand
aten_compute = ops[ops["name"].str.fullmatch(compute_pattern)]
reveal(guess_ops_in_forward, int(ops["name"].str.startswith("aten::").sum()), "aten ops under the triton label")
lesson(top["name"].tolist() == ["FlashAttention"], "one op at the top of the triton step: our autograd Function")
lesson(aten_compute.empty, "not one of the ops under it is a matmul, a softmax or an exp",
       f"{len(ops) - 1} ops, {len(aten_compute)} computing")
display(links(run))
glue("triton_ops", len(ops) - 1)
glue("triton_children", ", ".join(f"{n} ×{c}" for n, c in ops["name"][ops.index != top.index[0]].value_counts().items()))

# %% [markdown]
# The span is `FlashAttention`, our `torch.autograd.Function`; the {glue:text}`triton_ops` ops
# under it ({glue:text}`triton_children`) only allocate O and the LSE and move arguments to
# host views and back. The arithmetic runs in NumPy, unseen; on a GPU the span holds one
# kernel launch.

# %% tags=["remove-input"]
if not on_gpu:
    self_share = float(ops.loc[top.index[0], "self_us"] / top.iloc[0]["dur_us"])
    lesson(self_share > 0.9, "over 90% of the FlashAttention span is its own time: NumPy work the profiler cannot see",
           f"{100 * self_share:.1f}% self time")

# %% [markdown]
# SDPA's flash backend is one op too, over `aten::_scaled_dot_product_flash_attention_for_cpu`
# on a CPU (table and trace folded below):

# %% tags=["remove-input", "hide-output"]
# SDPA flash profiled the same way, where it takes these inputs (on a GPU: 16-bit only).
sdpa_steps = {}
if kernels.available(device)["sdpa_flash"] is None and sdpa.input_reason("sdpa_flash", q) is None:
    sdpa_run = record.profile(kernels.get("sdpa_flash"), q, k, v, label="sdpa_flash", trace_dir=trace_dir,
                              **profile_args)
    sdpa_steps["sdpa_flash"] = reader.median_step(sdpa_run.steps())
    display(tables.op_table(sdpa_steps["sdpa_flash"], times=False), links(sdpa_run))

# %% tags=["remove-input"]
if sdpa_steps:
    judged = {n: reference.judge(kernels.get(n)(q, k, v, causal=True), q, k, v, causal=True)["out"]
              for n in ("triton", "sdpa_flash")}
    lesson(all(j.ok for j in judged.values()), "Triton and SDPA flash both match the float64 reference",
           ", ".join(f"{n} error {j.error:.1e} ≤ {j.bound:.1e}" for n, j in judged.items()))
else:
    print("sdpa_flash cannot run here:", kernels.available(device)["sdpa_flash"] or sdpa.input_reason("sdpa_flash", q))
triton_ms = step.cpu_time_us / 1e3
glue("speed_note", f"This run used the compiled kernel: {triton_ms:.2f} ms of CPU time per profiled forward, launch "
     "included (the GPU's own time is in the benchmark below)." if on_gpu else
     f"This run's forward ran in the interpreter, for {run_heads} heads of {run_seq} tokens.")

# %% [markdown]
# {glue:text}`speed_note` On a CPU that time is Python walking tiles, not the kernel: this
# page does not time it.
#
# ## On a GPU: the grid, the block, the occupancy
#
# What would our forward launch for a real model? In H100 Qwen, SDPA ran PyTorch's
# `flash_fwd_kernel`, whose [registers](glossary.md#registers) limit it to 2 CTAs per
# [SM](glossary.md#sm) (chapter 3b). At that shape the autotuner keeps
# {glue:text}`n_tile_shapes` of our tile shapes (`BLOCK_M`×`BLOCK_N`, shared memory):
# {glue:text}`tile_shapes`. The table sets our 128-row shape beside torch's kernel. Our
# registers need a compile (`kernels.triton.compile_sweep`).
#
# Guess first: our 128×32 program asks for {glue:text}`ours_kib` KiB of shared memory and
# {glue:text}`ours_warps` warps. An H100 SM holds {glue:text}`sm_smem_kib` KiB and
# {glue:text}`sm_warps` warps; leaving registers aside, how many of our programs fit one SM?

# %%
guess_our_ctas_per_sm = 8  # edit me before running on

# %% tags=["remove-cell"]
# The GPU's properties as the trace recorded them: what the autotuner's pruning would see there.
qwen_trace = TRACELENS["h100_qwen"].trace()
gpu = qwen_trace.device_properties[0]
capability = (gpu["computeMajor"], gpu["computeMinor"])
qwen_arch = occupancy.arch_of(capability)
smem_optin = gpu["sharedMemPerBlockOptin"]

# %%
qwen_call = find_attention(TRACELENS["h100_qwen"].step(trace=qwen_trace)).calls[0]
torch_launch = occupancy.launch_from_footprint("flash_fwd_kernel (H100 Qwen)",
                                               qwen_call.footprint(), "the trace")
element_size = TORCH_DTYPES[str(qwen_call.dtype)].itemsize
triton_launches = configs.forward_launches(qwen_call.batch_heads, qwen_call.sq, qwen_call.d,
                                           element_size, capability, smem_optin)
same_rows = [t for t in triton_launches if t.blocks == torch_launch.blocks]

# %% tags=["remove-cell"]
limits = occupancy.ARCHES[qwen_arch]
glue_all(n_tile_shapes=len(triton_launches),
         tile_shapes=", ".join(f"{t.kernel.split(',')[0].split()[1].replace('x', '×')} ({t.shared_mem_per_block / 1024:g} KiB)"
                               for t in triton_launches),
         ours_kib=f"{same_rows[0].shared_mem_per_block / 1024:g}", ours_warps=same_rows[0].threads_per_block // 32,
         sm_smem_kib=limits.shared_mem_per_sm // 1024, sm_warps=limits.max_warps_per_sm)

# %% tags=["remove-input"]
print(f"H100 Qwen, {qwen_call.op}: B·H={qwen_call.batch_heads}, S={qwen_call.sq}, D={qwen_call.d}, "
      f"{qwen_call.dtype}, causal={qwen_call.causal}; {gpu['name']}, {gpu['numSms']} SMs ({qwen_arch})")

# %%
occupancy.launch_table([torch_launch, *same_rows], qwen_arch, gpu["numSms"])[
    ["registers", "shared KiB", "CTAs per SM", "occupancy %", "limited by", "waves"]].T

# %% tags=["remove-input"]
torch_occ = torch_launch.occupancy(qwen_arch)
ours_occ = same_rows[0].occupancy(qwen_arch)
reveal(guess_our_ctas_per_sm, ours_occ.blocks_per_sm, "our 128×32 programs per SM, at most", source="the footprint")
lesson(ours_occ.limited_by == "shared_memory", "shared memory, not warps, caps our 128×32 programs per SM",
       f"{ours_occ.blocks_by_shared_memory} by shared memory, {ours_occ.blocks_by_warps} by warps")
lesson(torch_occ.limited_by == "registers", "torch's flash kernel is limited by its registers",
       f"{torch_occ.blocks_per_sm} CTAs x {torch_occ.warps_per_block} warps per SM = {torch_occ.percent:g}%")
lesson(bool(same_rows) and all(t.grid[0] == qwen_call.batch_heads for t in triton_launches),
       f"our 128-row tiles launch torch's {torch_launch.blocks:,} CTAs, B·H on x where torch puts query tiles",
       f"torch {torch_launch.grid}, ours {same_rows[0].grid if same_rows else None}")
over_48 = [t for t in triton_launches if t.shared_mem_per_block > occupancy.KINETO_SHARED_MEM_LIMIT]
lesson(2 * len(over_48) > len(triton_launches), "most of our tile shapes ask for more than 48 KiB of shared memory",
       f"{len(over_48)} of {len(triton_launches)}")
others = [t for t in triton_launches if t not in same_rows]
lesson(all(t.blocks > torch_launch.blocks for t in others), "our other tile shapes have fewer rows, so more programs",
       f"{' or '.join(f'{b:,}' for b in sorted({t.blocks for t in others}))} against torch's {torch_launch.blocks:,}")
# Registers are allocated per warp in units of 256 (cuda_occupancy.h, as kernels.hw.occupancy
# computes it): the most a thread may take is below 65,536 / (programs x threads), a multiple of 8.
ours = same_rows[0]
def fits(registers: int) -> bool:
    return occupancy.occupancy(ours.threads_per_block, registers, ours.shared_mem_per_block,
                               qwen_arch).blocks_per_sm >= ours_occ.blocks_per_sm
max_regs = max(r for r in range(1, limits.max_registers_per_thread + 1) if fits(r))
plain_regs = limits.registers_per_sm // (ours_occ.blocks_per_sm * ours.threads_per_block)
lesson(max_regs % 8 == 0 and not fits(plain_regs),
       f"{ours_occ.blocks_per_sm} of our programs per SM need ≤ {max_regs} registers a thread",
       f"allocated per warp in 256s: not {limits.registers_per_sm:,} / "
       f"({ours_occ.blocks_per_sm}·{ours.threads_per_block}) = {plain_regs}")
glue_all(ours_max_regs=max_regs, ours_ctas=ours_occ.blocks_per_sm, torch_ctas=torch_occ.blocks_per_sm, torch_waves=torch_launch.waves(qwen_arch, gpu["numSms"]),
         torch_blocks=f"{torch_launch.blocks:,}", gpu_sms=gpu["numSms"])

# %% [markdown]
# Registers are handed out per warp in units of 256 (the CUDA occupancy calculator's rule),
# hence the bound above. Torch's {glue:text}`torch_blocks` CTAs, {glue:text}`torch_ctas`
# at a time on each of {glue:text}`gpu_sms` SMs, run in {glue:text}`torch_waves:.2f`
# [waves](glossary.md#wave); a part-full last wave leaves SMs idle, the tail that launching the
# longest causal tiles first shortens ([chapter 6](06_showdown.ipynb) estimates it). The
# trace's "est. achieved occupancy" is [Kineto](glossary.md#kineto)'s arithmetic, not a
# measurement, and reads 0% above 48 KiB of shared memory ([chapter 3b](03b_sdpa_fused.ipynb)).

# %% tags=["remove-input"]
# The book's own GPU recording: this run's attn_fwd and SDPA's kernel read the same way, and
# forward + backward checked to be four kernels with no memset (nothing zero-filled for atomics).
if on_gpu:
    say("This page was built on a GPU: this run's own `attn_fwd` and SDPA's flash kernel, read the same way, and "
        "one forward + backward, which is four kernels and no memset (nothing is zero-filled for atomic adds).")
    ch04.triton_forward_footprints({"triton": step, **sdpa_steps}, "attn_fwd", tf.attn_fwd_tuned.best_config,
                                          (run_batch, run_heads, run_seq), show=display)
    fb = reader.median_step(record.profile(tf.forward_backward, q, k, v, torch.randn_like(q),
                                           label="triton_fwd_bwd", active=active_steps, trace_dir=trace_dir).steps())
    ch04.triton_backward(fb, "attn_fwd", show=display)

# %% tags=["remove-input"]
# The book's own GPU recording: Triton against SDPA's flash backend, timed. On a CPU the
# interpreter's time measures Python, not the kernel, so there is nothing to show.
if on_gpu:
    display(Markdown(
        "## Speed\n\nTriton against SDPA's flash backend on this run's GPU, forward and forward+backward, at "
        "sequence lengths around the chosen one, in TFLOP/s with causal counted as half. For published H100 "
        "numbers of the Triton tutorial's kernel beside FlashAttention-2, cuDNN and FlashAttention-3, see the "
        "FlashAttention-3 paper (arXiv 2407.08608, section 4.1). Our kernel takes the tutorial's main ideas (two "
        "causal stages, exp2 with the scale folded in, the transposed backward) but runs the backward's two passes "
        "as two kernels, so read its numbers next to SDPA's on the same GPU rather than against the paper's."))
    sweep_seqs = sorted({max(128, seq // 2), seq, 2 * seq})   # small: each new length re-runs the autotuner
    results = sweep.sweep(["triton", "sdpa_flash"], seqs=sweep_seqs, head_dims=(head_dim,), dtypes=(dtype,),
                          causal=(True,), modes=(FORWARD, FORWARD_BACKWARD),
                          batch=batch, heads=heads, device=device, max_seconds=0.5, memory=False, progress=None)
    display(points_table(results, ["impl", "mode", "seq", "status", "median_ms", "tflops"]))
    ch04.ran_at_every_point(results, "triton",
                                   "the Triton kernel ran at every point of the sweep, forward and forward+backward")
    display(plots.tflops_vs_seq(results))

# %% [markdown]
# ## What to remember
#
# - The online softmax rescales a running max and sum; one log-sum-exp per row serves the
#   backward.
# - Causal programs stop at the diagonal: $(n+1)/(2n)$ of the tiles.
# - The interpreter's profile is one opaque span; a GPU's is one kernel, its footprint bounding
#   its occupancy.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/04_triton.ipynb), with automatic checks, hints and hidden solutions.
