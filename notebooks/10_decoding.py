# %% [markdown]
# # 10. Decoding, one query against a long cache
#
# A language model generates in two phases. **Prefill** runs the whole prompt through
# attention at once (Sq = Sk), the case every chapter so far has profiled. **Decode** then makes
# one token per step: one query (Sq = 1) against the keys and values of every token so far, kept
# in a **[KV cache](glossary.md#kv-cache)**.
#
# **You will learn to:**
#
# - decode through a KV cache with causal attention aligned bottom-right;
# - place a decode token on a [roofline](glossary.md#roofline), and tell a mis-measured roof from
#   a kernel that beats the hardware;
# - work out what [grouped-query attention (GQA)](glossary.md#gqa) saves, and which
#   [SDPA](glossary.md#sdpa) backend takes a decode token;
# - read a serving engine's decode step: a split-KV attention [kernel](glossary.md#kernel) and its
#   reduce, replayed from a graph.
#
# **Before you start:** [3. One call: `scaled_dot_product_attention`](03_sdpa.ipynb) (SDPA's
# backends) and [6. Showdown](06_showdown.ipynb) (FLOP counts).
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from kernels import reference
from kernels.attention import decoding
from kernels.bench import plots, sweep
from kernels.bench.results import DECODE, FORWARD
from kernels.book import ch10_decoding as ch10
from kernels.borrowed import SGLANG_DECODE_CAPTURE, TRACELENS, traces_box
from kernels.hw import devices
from kernels.notebook import glue, glue_all, inputs, lesson, mib, readable, reveal, setup, show_lines, timing_claims
from kernels.trace import breakdown
from kernels.trace.attention import find_attention
from kernels.trace.links import links
device, dtype = setup(device, dtype)
print(run_label := devices.run_label(device))

# %% tags=["remove-input"]
traces_box({"SGLang decode": TRACELENS["sglang_decode"], "SGLang capture": SGLANG_DECODE_CAPTURE})

# %% [markdown]
# ## A KV cache
#
# One layer's cache (`decoding.KVCache`) is two buffers, K and V, allocated once for the longest
# sequence; `append` writes new tokens after the filled part and returns views of everything
# filled so far, copying nothing. Prefill a prompt, then decode token by token with
# `kernels.get(name)(q, k, v, causal=True)`. Causal attention aligned bottom-right (query i sees
# keys j ≤ i + Sk − Sq) lets a single query see every cached key. Same rows as one causal pass?

# %% tags=["remove-input"]
show_lines(decoding.prefill_then_decode, "keys, values = cache.append(k[:, :, :prompt]", "rows.append(")

# %% tags=["remove-cell"]
impl = "sdpa_flash" if kernels.available(device)["sdpa_flash"] is None else "sdpa_math"  # math where flash is missing

# %%
prompt, generated = seq // 2, 8
q_all, k_all, v_all = inputs(batch, heads, prompt + generated, head_dim, dtype=dtype, device=device)
attend = kernels.get(impl)  # "sdpa_flash"
decoded, cache = decoding.prefill_then_decode(attend, q_all, k_all, v_all, prompt)
verdict = reference.judge(decoded, q_all, k_all, v_all, causal=True)    # against float64, the course's rule

# %% tags=["remove-input"]
total = prompt + generated
out_verdict = verdict["out"]
lesson(cache.length == total and verdict.ok,
       f"prefill + {generated} decode tokens through the cache give the rows of one causal pass",
       f"error {readable(out_verdict.error)} ≤ {readable(out_verdict.bound)}")
glue("prompt", prompt); glue("generated", generated); glue("total", total); glue("seq", seq)

# %% [markdown]
# ### What a decode token copies
#
# Two decode tokens profiled (`decoding.decode_step`), each from a cache of {glue:text}`seq`
# tokens: one appends to a `KVCache`, the other to a `ConcatCache`, which grows plain K and V
# tensors with `torch.cat`, a common first version. Before looking: how many MiB does the
# `torch.cat` step allocate?

# %%
guess_cat_mib = 0.1  # edit me: MiB allocated per torch.cat step

# %% tags=["remove-cell"]
k_new, v_new = inputs(batch, heads, 1, head_dim, dtype=dtype, device=device, seed=3)[1:]  # one new token
cached = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, seed=4)[1:]      # a cache of seq tokens

# %%
q_new = q_all[:, :, -1:]   # k_new, v_new: that token's K and V; cached: K and V of seq earlier tokens
cached_step, cat_step = decoding.profile_cache_steps(cached, attend, q_new, k_new, v_new, trace_dir)
copies = decoding.copies_table({"KVCache.append": cached_step, "torch.cat": cat_step})

# %% tags=["remove-input"]
display(links(cached_step), links(cat_step), ch10.copies_shown(copies))

# %% tags=["remove-input"]
token_bytes = batch * heads * head_dim * q_all.element_size()                 # one token's K (or V)
reveal(guess_cat_mib, round(mib(cat_step.allocated_bytes), 3), "MiB the torch.cat step allocates")
lesson(cached_step.copies()["bytes"].max() == token_bytes and cached_step.allocated_bytes < token_bytes * seq,
       "appending to the KV cache copies one token's K and V, allocating far less than the cache",
       f"largest copy_ {readable(token_bytes)} bytes, one token's K or V; {cached_step.allocated_bytes / 1024:.1f} KiB "
       f"allocated against a {mib(token_bytes * seq * 2):.0f} MiB cache")
grown = decoding.cache_bytes(seq + 1, heads, head_dim, dtype, batch=batch)  # K and V after the append
lesson(cat_step.allocated_bytes >= grown,
       "growing K and V with torch.cat allocates and copies the whole cache again every step",
       f"{mib(cat_step.allocated_bytes):.2f} MiB")
glue("cat_mib", mib(cat_step.allocated_bytes)); glue("cache_step_kib", cached_step.allocated_bytes / 1024)
glue("grown_mib", mib(grown)); glue("seq_plus_one", seq + 1)

# %% [markdown]
# With `torch.cat` a step allocated new K and V for all {glue:text}`seq_plus_one` tokens
# ({glue:text}`grown_mib:.2f` MiB) and filled them inside `aten::cat` (no `copy_` row: the
# allocation is the copy), so its cost grows with the cache before attention reads it. The
# `KVCache` step allocated {glue:text}`cache_step_kib:.1f` KiB and copied one token.
#
# ### A trap: SDPA's own `is_causal` with one query
#
# `F.scaled_dot_product_attention(..., is_causal=True)` aligns its mask **top left**: query i sees
# keys j ≤ i (PyTorch's documentation; `torch.nn.attention.bias.causal_lower_right` gives the
# other alignment). With Sq = Sk the two agree. With one query and {glue:text}`total` cached keys,
# what does the top-left mask let it see?

# %%
guess_keys_seen = 264  # edit me: how many of the cached keys does the query attend to?

# %%
with sdpa_kernel(SDPBackend.MATH):  # the reference semantics; the fused backends should agree
    top_left = F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True)
only_first = torch.allclose(top_left, v_all[:, :, :1])  # attending to key 0 alone returns v[0]

# %% tags=["remove-input"]
reveal(guess_keys_seen, 1 if only_first else total, "keys the single query sees under is_causal=True",
       source="the output")
lesson(only_first, "one query under SDPA's top-left is_causal sees the first key only: the output is v[0]")
if device.type == "cpu":  # unpinned: whichever backend SDPA picks here
    lesson(torch.allclose(F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True), v_all[:, :, :1]),
           "the CPU's unpinned SDPA does the same")

# %% [markdown]
# So the book's SDPA wrappers never pass `is_causal=True` when Sq ≠ Sk: one query needs no mask,
# and longer chunks get a bottom-right one.
#
# ## What one step computes, and what it moves
#
# `decoding.counts_table` counts both for a fused kernel: a prefill of S tokens, and one decode
# token against a cache of S. Before looking: at S = 4096 in bfloat16, with as many K/V heads as
# query heads, how many FLOPs does a decode token do per byte it moves?

# %%
guess_decode_intensity = 64  # edit me: FLOP per byte

# %%
counts = decoding.counts_table((512, 1024, 2048, 4096, 8192), heads=32, head_dim=128, dtype=torch.bfloat16)

# %% tags=["remove-input"]
ch10.counts_in_units(counts)

# %% tags=["remove-input"]
gpu_peaks = devices.match_gpu("NVIDIA H200")
assert gpu_peaks is not None, "kernels.hw.devices has the H200's datasheet row"
decode_4k = decoding.intensity(1, 32, 1, 4096, 128, dtype=torch.bfloat16)
reveal(guess_decode_intensity, round(decode_4k, 3), "FLOP per byte of a bf16 decode token at S = 4096", source="the count")
lesson(decode_4k < 1.01 and counts[("FLOP/byte", "decode")].max() < 1.01,
       "decode does about one FLOP per byte in bfloat16, at every cache length", f"{decode_4k:.3f}")
lesson(counts[("FLOP/byte", "prefill")].is_monotonic_increasing and
       counts[("FLOP/byte", "prefill")].loc[4096] > gpu_peaks.ridge,
       f"prefill's intensity grows with S and passes the H200's ridge ({gpu_peaks.ridge:.0f} FLOP/byte)",
       f"{counts[('FLOP/byte', 'prefill')].loc[4096]:.0f} at S = 4096")
glue("decode_4k", decode_4k); glue("prefill_4k", float(counts[("FLOP/byte", "prefill")].loc[4096]))
glue("h200_ridge", gpu_peaks.ridge)

# %% [markdown]
# A decode token computes 4·H·S·D FLOPs on the whole cache, 2·Hkv·S·D elements, one multiply-add
# each: two FLOPs per two bytes at any length. A prefill (2·H·S²·D FLOPs causal, 4·H·S·D elements
# moved) reuses each key for every query. An H200 needs {glue:text}`h200_ridge:.0f` FLOPs per byte
# to keep its [tensor cores](glossary.md#tensor-core) busy (989 [TFLOP/s](glossary.md#flops) dense
# bf16 over 4.8 TB/s of [HBM](glossary.md#hbm), NVIDIA's datasheet): decode sits two orders of
# magnitude below that ridge, waiting on memory.
#
# ## On a roofline, measured here
#
# `kernels.bench.sweep` times a prefill and a decode token at a few lengths
# ({glue:text}`bench_seqs` here); `plots.roofline` draws the points that pass the spread check
# under this machine's measured ceilings (a matmul, a 32 MiB copy). Inputs are fresh, rotated
# through more memory than the caches hold: timed on the same few MiB, a decode token would read
# its cache from the CPU's caches and land *above* a slope measured with a copy too big for them.
# A roof measured while other work held the cores reads low, and prefill lands above it. Neither
# is a kernel beating the hardware: a point above a CPU roof gets the roof measured again.

# %% tags=["remove-cell"]
bench_seqs = [128, 256, 512, 1024] if device.type == "cpu" else [1024, 2048, 4096, 8192]
budget = sweep.book_budget(on_gpu=device.type == "cuda")  # how many timed calls the book can afford
glue("bench_seqs", ", ".join(map(str, bench_seqs)))

# %%
rows = sweep.sweep([impl], seqs=bench_seqs, modes=(FORWARD, DECODE), head_dims=(head_dim,), dtypes=(dtype,),
                   batch=batch, heads=heads, device=device, memory=False, progress=None, **budget)
peaks_here, shown = devices.roofline_peaks(device), plots.steady(rows)

# %% tags=["remove-cell"]
peaks_here, over = devices.roof_for_points(shown, peaks_here, device)  # a CPU roof read low is measured again

# %%
#| caption: Prefill and decode calls measured here on this machine's roofline, drawn only where their timed calls passed the spread check (the ✔ line below counts them): prefill moving right as S grows, decode (one intensity, whatever the cache length) far to the left of the ridge, each point under its ceiling.
#| alt: Log-log roofline scatter: prefill points at high arithmetic intensity under the flat roof, decode points stacked at one low intensity under the sloped bandwidth line.
display(plots.roofline(shown, device=peaks_here))

# %% tags=["remove-input"]
lesson(all(r.intensity < peaks_here.ridge for r in rows if r.mode == DECODE),
       "every decode point lies left of this machine's ridge", f"{peaks_here.ridge:.1f} FLOP/byte")
decode_here = [r.intensity for r in rows if r.mode == DECODE]
element = torch.empty((), dtype=dtype).element_size()
lesson(all(abs(i * element / 2 - 1) < 0.02 for i in decode_here),
       f"in {str(dtype).removeprefix('torch.')} every decode point sits at about {2 / element:g} FLOP/byte, "
       "at every length", f"{min(decode_here):.3f} to {max(decode_here):.3f}")
glue("decode_here", f"{max(decode_here):.2f}")
glue("element_bytes", element); glue("dtype_here", str(dtype).removeprefix("torch."))
lesson(not over, "every point drawn sits at or under its ceiling",
       ", ".join(f"{r.mode} S={r.seq}" for r in over) or f"{len(shown)} of {len(rows)} points drawn")
# Prefill against decode at the longest S: the two timed again in turns, round by round, so a busy
# spell of the machine hits both alike (measured apart, one phase can land in it alone).
pre, dec = (next(r for r in rows if r.mode == m and r.seq == max(bench_seqs)) for m in (FORWARD, DECODE))
turns = ch10.phase_turns(impl, pre.seq, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, device=device)
phases_asserted = timing_claims(ch10.phase_claims(turns, pre, dec), counted="timed rounds")

# %% [markdown]
# In {glue:text}`dtype_here` the decode points sit at {glue:text}`decode_here` FLOP/byte, not
# bfloat16's 1: the same two FLOPs read a {glue:text}`element_bytes`-byte element. (Chapter 6
# measured its roof in its own run; a roof moves with what else held the cores.)

# %% tags=["remove-input"]
# How far the drawn decode points sit under their slope, and why: plain prose that follows the run.
from IPython.display import Markdown

display(Markdown(ch10.decode_gap([r for r in shown if r.mode == DECODE], peaks_here)))

# %% [markdown]
# On a GPU with a long cache, reading it sets a decode token's time.
#
# ## What grouped-query attention saves
#
# GQA lets a group of query heads share one K/V head (Ainslie et al., *GQA*, arXiv 2305.13245).
# The FLOPs stay; the cache, and the bytes a decode token reads, shrink by the group size. For a
# Llama-3-8B-like model (32 layers, 32 query heads, 8 K/V heads, D = 128, bf16) at 8192 tokens:

# %%
gqa_rows = decoding.sharing_table(layers=32, heads=32, head_dim=128, context=8192,
                                  kv_options={"multi-head (MHA)": 32,
                                              "grouped-query (GQA)": 8,
                                              "multi-query (MQA)": 1})

# %% tags=["remove-input"]
hq, hkv = 32, 8    # the query and K/V heads of the table's GQA row
display(ch10.sharing_shown(gqa_rows))
saving = gqa_rows.iloc[0]["KV cache (MiB)"] / gqa_rows.iloc[1]["KV cache (MiB)"]
step_saving = gqa_rows.iloc[0]["bytes per decode token, one layer (MiB)"] / gqa_rows.iloc[1]["bytes per decode token, one layer (MiB)"]
lesson(saving == hq // hkv, f"sharing each K/V head among {hq // hkv} query heads makes the cache {hq // hkv}x smaller")
lesson(0.9 * (hq // hkv) < step_saving <= hq // hkv, "and a decode token moves almost that many times fewer bytes",
       f"{step_saving:.2f}x: q and o are not shared")
glue("gqa_cache_mha", float(gqa_rows.iloc[0]["KV cache (MiB)"]) / 1024)
glue("gqa_cache_gqa", float(gqa_rows.iloc[1]["KV cache (MiB)"]) / 1024)
glue("gqa_step_saving", float(step_saving))

# %% [markdown]
# The cache of one 8192-token sequence is {glue:text}`gqa_cache_mha:.1f` GiB with multi-head
# attention and {glue:text}`gqa_cache_gqa:.1f` GiB with 8 K/V heads; at the same bandwidth a step
# reading {glue:text}`gqa_step_saving:.2f`x fewer bytes takes that much less time.
#
# ## Which SDPA backend takes a decode token?
#
# A decode token is an SDPA call with one query, no mask and `is_causal=False` (`enable_gqa=True`
# for shared heads). None of PyTorch's backend checks
# (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`) refuses that, so chapter 3's backend
# order decides, as for prefill:

# %%
decode_predictions = kernels.attention.sdpa.predictions(
    [("A100 (sm_80)", (8, 0), torch.bfloat16, False, "the default order"),
     ("H200 (sm_90)", (9, 0), torch.bfloat16, False, "cuDNN first"),
     ("T4 (sm_75)", (7, 5), torch.float16, False, "no flash before sm_80")], head_dim=128)
decode_predictions

# %% tags=["remove-input"]
chosen, chosen_gqa = decoding.decode_backends(batch, heads, seq, head_dim, dtype, device)  # multi-head, GQA
lesson(decode_predictions["unpinned SDPA picks"].tolist()[:2] == ["sdpa_flash", "sdpa_cudnn"],
       "by PyTorch's rules a bf16 decode token goes to flash on an A100 and to cuDNN on an H200 (cuDNN 9.20)")
ch10.decode_backend_here(chosen, chosen_gqa, device, dtype, head_dim)
glue("decode_backend", chosen)

# %% [markdown]
# The GPU rows are PyTorch's rules, not a measurement.
#
# ## A real decode step: split over the cache, then reduce
#
# *SGLang decode* is one decode step of SGLang serving Qwen3-8B to 32 requests on an MI300X, its
# attention AITER's (AMD's kernel library) paged-attention pair (the cache in fixed-size blocks).
# Per layer, the main kernel splits each request's cache into partitions, each giving a partial
# softmax-weighted sum of V with its row maximum and sum; the reduce merges them with chapter 4's
# online-softmax rescaling.
# Replayed from a HIP graph (AMD's [CUDA graph](glossary.md#cuda-graph)), the step recorded no
# shapes: `find_attention` reads the batch in SGLang's step annotation, the heads in the run's
# graph-capture trace (*SGLang capture*, passed as `capture=`). Before the reveal: what share
# of the step's GPU time is attention?

# %%
guess_decode_attention_percent = 50  # edit me: % of the step's GPU time

# %%
#| caption: The attention of each of the 36 layers in one decode step of SGLang decode (Qwen3-8B, batch 32, MI300X): the split-KV main kernel's GPU time, with the reduce kernel's stacked on top.
#| alt: Stacked bars, one per layer, of nearly equal height: a tall main-kernel part and a thin reduce part on top.
sglang_step = TRACELENS["sglang_decode"].step()
decode_report = find_attention(sglang_step, capture=SGLANG_DECODE_CAPTURE.trace())
pairs = decoding.split_and_reduce(decode_report)    # each call: its split over the cache, then its reduce
plots.split_kv_bars(pairs, f"SGLang decode, {decode_report.device}: one decode step")

# %% tags=["remove-input"]
decode_share = decode_report.attention_share
assert decode_share is not None, "the SGLang step has kernels, so a GPU time to share"
_ = reveal(guess_decode_attention_percent, round(100 * decode_share, 1),
           "% of the decode step's GPU time in attention")
QWEN3_8B = {"layers": 36, "heads": 32, "kv_heads": 8, "head_dim": 128}  # Qwen3-8B's published config.json
lesson(len(pairs) == QWEN3_8B["layers"] and (pairs["kernels"] == 2).all() and pairs["reduce kernel"].notna().all(),
       "one attention call per Qwen3-8B layer, each a split over the cache, then a reduce", f"{len(pairs)} calls")
lesson(pairs["main kernel"].str.startswith("paged_attention_ll4mi").all()
       and pairs["reduce kernel"].str.startswith("paged_attention_ll4mi").all(),
       "both are AITER's paged-attention kernels")
lesson(set(pairs["launched by"]) == {"hipGraphLaunch"}, "all of them were replayed from a graph", "hipGraphLaunch")
shares = ch10.reduce_shares(pairs)
lesson(shares["call_max"] < 0.15, "merging the partitions is cheap: the reduce is under 15% of every call",
       f"at most {shares['call_max']:.1%}")
sg_kinds = breakdown.time_by_kind(decode_report)["share"]
lesson(sg_kinds.drop("attention").idxmax() == "gemm" and sg_kinds["gemm"] > 0.5,
       "most of the rest of the step is GEMMs", f"GEMM {sg_kinds['gemm']:.1%}, attention {sg_kinds['attention']:.1%}")
glue_all(sg_share=100 * decode_share, sg_gemm=100 * sg_kinds["gemm"], sg_main_us=pairs["main µs"].median(),
         sg_reduce_call_pct=100 * shares["call_median"], sg_reduce_main_pct=100 * shares["main_median"])

# %% [markdown]
# The rest is mostly the layers' [GEMMs](glossary.md#gemm). A main kernel took
# {glue:text}`sg_main_us:.0f` µs (median). With the shapes, `roof_table` puts each call on the roof:

# %%
decode_report.roof_table().drop(columns="kernel").head(3)

# %% tags=["remove-input"]
from statistics import median

engine = decode_report.engine_steps[0]              # the step annotation the report read
lesson(len(decode_report.engine_steps) == 1 and engine.context_requests == 0
       and engine.generation_requests == engine.g_sq == 32 and engine.g_sk > 100 * engine.generation_requests,
       "SGLang's step annotation: 32 requests, one new query each, against caches averaging over 100 tokens",
       f"{readable(engine.g_sk)} cached tokens in all, about "
       f"{readable(round(engine.g_sk / engine.generation_requests))} a request")
calls = decode_report.calls
lesson(all((c.heads, c.kv_heads, c.d) == (QWEN3_8B["heads"], QWEN3_8B["kv_heads"], QWEN3_8B["head_dim"])
           and c.heads_source is not None and SGLANG_DECODE_CAPTURE.file in c.heads_source for c in calls),
       "the capture trace gives every call Qwen3-8B's heads: 32 query heads, 8 K/V heads of 128")
mi300x, placed = decode_report.peaks, [c.roof() for c in calls]   # the datasheet row of the GPU the trace names
assert mi300x is not None, f"kernels.hw.devices has no datasheet row for {decode_report.device}"
roofs = [r for r in placed if r is not None]
first_bytes, first_flops = calls[0].bytes, calls[0].flops
assert len(roofs) == len(calls) and first_bytes is not None and first_flops is not None, \
    "every call has its heads, a 16-bit dtype and a named GPU, so a place on the roof (its FLOPs and bytes)"
group, intensity = QWEN3_8B["heads"] // QWEN3_8B["kv_heads"], roofs[0].intensity
lesson(all(r.bound == "memory" and abs(r.intensity - group) < 0.1 and r.intensity < mi300x.ridge / 20 for r in roofs),
       f"each call does about {group} FLOPs a byte, far below the MI300X's ridge",
       f"{intensity:.1f} vs {mi300x.ridge:.0f}")
call_us, share = median(c.gpu_us for c in calls), median(r.share for r in roofs)
floor_us = first_bytes / mi300x.bandwidth * 1e6
lesson(all(c.gpu_us > floor_us for c in calls) and max(r.share for r in roofs) < 1,
       "a call takes longer than reading its bytes at the datasheet's bandwidth would",
       f"{call_us:.0f} vs {floor_us:.0f} µs")
glue_all(sg_mib=first_bytes / 2**20, sg_gflop=first_flops / 1e9, sg_call_us=float(call_us), sg_intensity=intensity,
         sg_ridge=mi300x.ridge, sg_floor_us=floor_us, sg_tbs=float(share * mi300x.bandwidth / 1e12),
         sg_peak_tbs=mi300x.bandwidth / 1e12, sg_bw_pct=float(100 * share))

# %% [markdown]
# A layer's call moves
# {glue:text}`sg_mib:.1f` MiB, almost all KV cache, for {glue:text}`sg_gflop:.3f` GFLOP (GQA's group
# of 4 lifts the intensity from 1 to {glue:text}`sg_intensity:.1f`). The median call reached
# {glue:text}`sg_tbs:.2f` TB/s of the datasheet's {glue:text}`sg_peak_tbs:.1f`,
# {glue:text}`sg_bw_pct:.0f`% of the memory roof: memory-bound, yet short of the datasheet. On
# your own trace: `python -m kernels.trace.attention TRACE --capture
# CAPTURE_TRACE` (chapter 12).

# %% tags=["remove-input"]
replay = ch10.graph_replay(sglang_step)
step_kernels = len(sglang_step.gpu_work)
lesson(replay["launch_calls"] == 1 and replay["kernels"] > 0.9 * step_kernels,
       "one hipGraphLaunch call queued almost all of the step's GPU work",
       f"{replay['kernels']} of {step_kernels}")
lesson(replay["median_gap_us"] < 0.01 and replay["busy_us"] > 0.95 * replay["span_us"],
       "inside the replay the kernels run back to back",
       f"median gap {replay['median_gap_us'] * 1e3:.1f} ns, busy {replay['busy_us'] / replay['span_us']:.1%}")
glue("sg_replay_kernels", replay["kernels"]); glue("sg_replay_busy_pct", 100 * replay["busy_us"] / replay["span_us"])

# %% [markdown]
# This step does not wait on launches; its attention waits on memory.
#
# ## What to remember
#
# - Decode and prefill agree only with causal attention aligned bottom-right (SDPA's `is_causal`
#   is top-left).
# - A decode token does about one FLOP per byte in 16 bits: memory-bound on any GPU.
# - A point above its roof is a ceiling that does not describe it: time on fresh inputs, and
#   measure the roof again.
# - GQA divides the cache and the bytes per step by the group size; the FLOPs stay.
# - A serving engine's decode splits the cache and reduces the partials cheaply; reading the cache
#   sets the time, and a graph replay hides the launches.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/10_decoding.ipynb), with automatic checks, hints and hidden solutions.
