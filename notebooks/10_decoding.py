# %% [markdown]
# # 10. Decoding, one query against a long cache
#
# A language model generates in two phases. **Prefill** runs the whole prompt through
# attention at once: as many queries as keys (Sq = Sk), the case every chapter so far has
# profiled. **Decode** then makes one token per step: one new query (Sq = 1) against the
# keys and values of every token so far, which the model keeps in a **[KV cache](glossary.md#kv-cache)**
# instead of recomputing them. This chapter builds the cache, counts what a decode token computes
# and moves, shows on a [roofline](glossary.md#roofline) why decode attention is limited by memory,
# and what [grouped-query attention (GQA)](glossary.md#gqa) saves. Last, which [SDPA](glossary.md#sdpa)
# backend takes a decode token, and a serving engine's decode [kernels](glossary.md#kernel) on a real GPU.
#
# **You will learn to:**
#
# - build a KV cache, decode through it, and check it against a full causal pass, aligned
#   bottom-right (SDPA's own `is_causal` is not);
# - count a decode token's FLOPs and bytes and place it on a roofline, and tell a mis-measured
#   roof (warm caches, a busy machine) from a kernel that beats the hardware;
# - work out what grouped-query attention saves, and which SDPA backend takes a decode token;
# - read a serving engine's decode step: a split-KV attention kernel and its reduce per layer,
#   replayed from a graph.
#
# **Before you start:** [3. One call: `scaled_dot_product_attention`](03_sdpa.ipynb) (SDPA's
# backends) and [6. Showdown](06_showdown.ipynb) (FLOP counts, causal counted half). This chapter is
# the book's home of the decode roofline.
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
from kernels.notebook import glue, glue_all, inputs, lesson, mib, readable, reveal, say, setup, show_lines
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
# One layer's cache (`decoding.KVCache`) is two buffers, keys and values, allocated once for the
# longest sequence, and filled as tokens arrive. `append` checks the new tokens' shapes, writes their
# keys and values after the filled part and returns views of everything filled so far; nothing is
# copied when reading.

# %%
display(show_lines(decoding.KVCache, "shape = (batch", "self.length = 0"),
        show_lines(decoding.KVCache, "self.k[:, :, self.length:self.length + n] = k", "return self.k[:, :, :self.length]"))

# %% [markdown]
# Prefill a prompt, then decode token by token. Through the library, each call is
# `kernels.get(name)(q, k, v, causal=True)` with the cache's keys and values: causal
# attention is aligned bottom-right (query i sees keys j ≤ i + Sk − Sq), so a single query
# sees every cached key, and a chunk of queries sees what its positions may see. Does that
# give the same rows as one causal pass over the whole sequence?

# %%
show_lines(decoding.prefill_then_decode)

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
       f"error {readable(out_verdict.error)} within the bound {readable(out_verdict.bound)}, {attend.__name__}")
glue("prompt", prompt); glue("generated", generated); glue("total", total); glue("seq", seq)

# %% [markdown]
# A prompt of {glue:text}`prompt` tokens, then {glue:text}`generated` tokens one at a time:
# the same rows, within the float64 reference's tolerance for this dtype.
#
# ### What a decode token copies
#
# The cache exists so that a step does not redo, or move, what earlier steps made. The trace
# can check that. Here are two decode tokens profiled (`decoding.decode_step`): one appends to a
# `KVCache`, the other to a `ConcatCache`, which keeps K and V as plain tensors and grows them with
# `torch.cat`, a common first version. Each step starts from a cache of {glue:text}`seq` tokens
# and adds one. Before looking: how many bytes does each step copy
# or allocate?

# %%
guess_cat_mib = 0.1  # edit me: MiB allocated per torch.cat step

# %%
k_new, v_new = inputs(batch, heads, 1, head_dim, dtype=dtype, device=device, seed=3)[1:]
q_new = q_all[:, :, -1:]
cached = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, seed=4)[1:]
cached_step, cat_step = decoding.profile_cache_steps(cached, attend, q_new, k_new, v_new, trace_dir)
copies = decoding.copies_table({"KVCache.append": cached_step, "torch.cat": cat_step})
display(links(cached_step), links(cat_step))

# %% tags=["remove-input"]
ch10.copies_shown(copies)

# %% tags=["remove-input"]
token_bytes = batch * heads * head_dim * q_all.element_size()                 # one token's K (or V)
reveal(guess_cat_mib, round(mib(cat_step.allocated_bytes), 3), "MiB the torch.cat step allocates")
lesson(cached_step.copies()["bytes"].max() == token_bytes and cached_step.allocated_bytes < token_bytes * seq,
       "appending to the KV cache copies one token's K and V and allocates far less than the cache",
       f"largest copy {readable(token_bytes)} bytes")
grown = decoding.cache_bytes(seq + 1, heads, head_dim, dtype, batch=batch)  # K and V after the append
lesson(cat_step.allocated_bytes >= grown,
       "growing K and V with torch.cat allocates (and copies into) the whole cache again on every step",
       f"{mib(cat_step.allocated_bytes):.2f} MiB, of which {mib(grown):.2f} MiB are the K and V of all {seq + 1} tokens")
glue("cat_mib", mib(cat_step.allocated_bytes)); glue("cache_step_kib", cached_step.allocated_bytes / 1024)
glue("grown_mib", mib(grown)); glue("seq_plus_one", seq + 1)

# %% [markdown]
# With `torch.cat` every step allocated {glue:text}`cat_mib:.2f` MiB: new K and V tensors for
# all {glue:text}`seq_plus_one` tokens ({glue:text}`grown_mib:.2f` MiB), the rest the attention's
# output and scratch. It copied the whole history into them, inside `aten::cat` rather than
# through `aten::copy_` (so its row shows no `copy_`: the allocation is the copy). A decode
# token's cost would grow with the cache even before attention reads it. The `KVCache` step
# allocated {glue:text}`cache_step_kib:.1f` KiB (the attention's output and scratch) and copied
# one token.
#
# ### A trap: SDPA's own `is_causal` with one query
#
# `F.scaled_dot_product_attention(..., is_causal=True)` aligns its mask to the **top left**:
# query i sees keys j ≤ i (PyTorch's documentation of the function says so, and offers
# `torch.nn.attention.bias.causal_lower_right` for the other alignment). With Sq = Sk the two
# alignments agree. With one query and a cache of {glue:text}`total` keys (the prompt and the
# generated tokens above), guess what the top-left mask lets that query see:

# %%
guess_keys_seen = 264  # edit me: how many of the cached keys does the query attend to?

# %%
with sdpa_kernel(SDPBackend.MATH):  # the reference semantics; the fused backends should agree
    top_left = F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True)
only_first = torch.allclose(top_left, v_all[:, :, :1])  # attending to key 0 alone returns v[0]

# %% tags=["remove-input"]
reveal(guess_keys_seen, 1 if only_first else total, "keys the single query sees under is_causal=True",
       source="the output")
lesson(only_first, "with one query, SDPA's top-left is_causal attends to the first key only: the output is v[0]")
if device.type == "cpu":  # unpinned: whichever backend SDPA picks here
    lesson(torch.allclose(F.scaled_dot_product_attention(q_new, k_all, v_all, is_causal=True), v_all[:, :, :1]),
           "the CPU's unpinned SDPA does the same")

# %% [markdown]
# That is why the book's SDPA wrappers never pass `is_causal=True` when Sq ≠ Sk: one query
# needs no mask at all (it may see everything before it), and longer chunks get a
# bottom-right mask.
#
# ## What one step computes, and what it moves
#
# Count both for a fused kernel (`decoding.counts_table`, from `kernels.reference.flops` and
# `io_bytes`, which take Sq ≠ Sk and shared K/V heads), for a prefill of S tokens and for one
# decode token against a cache of S tokens. Before looking: at S = 4096 in bfloat16 with as
# many K/V heads as query heads, how many FLOPs does one decode token do per byte it moves?

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
# (The table uses a model-sized head count, H = 32 and D = 128; the ratios do not depend on
# it.) A prefill computes about 2·H·S²·D FLOPs (causal) and moves q, k, v and o, 4·H·S·D
# elements. A decode token computes 4·H·S·D FLOPs and moves the whole cache, 2·Hkv·S·D
# elements, to do it: it reads each cached element once and uses it in one multiply-add, two
# FLOPs per two bytes, {glue:text}`decode_4k:.2f` FLOP per byte, however long the cache. A
# prefill reuses each key for every query, so its intensity grows with S:
# {glue:text}`prefill_4k:.0f` at S = 4096. An H200 needs {glue:text}`h200_ridge:.0f` FLOPs per
# byte to keep its [tensor cores](glossary.md#tensor-core) busy (989 [TFLOP/s](glossary.md#flops) dense
# bf16 over 4.8 TB/s of [HBM](glossary.md#hbm), NVIDIA's datasheet, quoted). Below that ridge, a kernel
# waits on memory: decode sits two orders of magnitude below it.
#
# ## On a roofline, measured here
#
# `kernels.bench.sweep` times a prefill (mode `forward`) and a decode token (mode `decode`) at a
# few cache lengths (`bench_seqs`: {glue:text}`bench_seqs` tokens here), each on fresh inputs rotated through more memory than the caches hold;
# `kernels.bench.plots.roofline` draws them under this machine's two ceilings (on a CPU, a matmul
# and a 32 MiB copy measured by `kernels.hw.devices`), keeping only points whose timed calls pass
# the spread check (`plots.steady`: the 90th percentile within 2x the 10th).
#
# Fresh inputs matter. Timed again and again on the same K and V, a decode token's cache of a few
# MiB stays in the CPU's own caches: its bytes never cross main memory, and the point lands *above*
# the memory slope, measured with a copy too large for the caches. A roof measured while another
# job held half the cores reads low, and prefill points sit above it. Neither would be a kernel
# beating the hardware: each is a ceiling that does not describe its point.

# %% tags=["remove-cell"]
bench_seqs = [128, 256, 512, 1024] if device.type == "cpu" else [1024, 2048, 4096, 8192]
budget = sweep.book_budget(on_gpu=device.type == "cuda")  # how many timed calls the book can afford
glue("bench_seqs", ", ".join(map(str, bench_seqs)))

# %%
rows = sweep.sweep([impl], seqs=bench_seqs, modes=(FORWARD, DECODE), head_dims=(head_dim,), dtypes=(dtype,),
                   batch=batch, heads=heads, device=device, memory=False, progress=None, **budget)
peaks_here, shown = devices.roofline_peaks(device), plots.steady(rows)

# %% tags=["remove-cell"]
def above_roof(roof):
    return [f"{r.mode} S={r.seq}" for r in shown if r.tflops * 1e12 > roof.attainable(r.intensity)]


if above_roof(peaks_here) and device.type == "cpu":   # a busy moment read the roof low: measure again, keep the best
    peaks_here = peaks_here.best_with(devices.measured_peaks("cpu", repeats=60))

# %%
#| caption: Prefill and decode calls measured here on this machine's roofline, drawn only where their timed calls passed the spread check (the ✔ line below counts them): prefill moving right as S grows, decode (one intensity, whatever the cache length) far to the left of the ridge, each point under its ceiling.
#| alt: Log-log roofline scatter: prefill points at high arithmetic intensity under the flat roof, decode points stacked at one low intensity under the sloped bandwidth line.
display(plots.roofline(shown, device=peaks_here))

# %% tags=["remove-input"]
over = above_roof(peaks_here)
lesson(all(r.intensity < peaks_here.ridge for r in rows if r.mode == DECODE),
       f"every decode point lies left of this machine's ridge ({peaks_here.ridge:.1f} FLOP/byte, measured for this page)")
decode_here = [r.intensity for r in rows if r.mode == DECODE]
element = torch.empty((), dtype=dtype).element_size()
lesson(all(abs(i * element / 2 - 1) < 0.02 for i in decode_here),
       f"in {str(dtype).removeprefix('torch.')} every decode point sits at about {2 / element:g} FLOP/byte, whatever "
       f"the cache length: 2 FLOPs per {element}-byte cached element",
       ", ".join(f"S = {r.seq}: {r.intensity:.3f}" for r in rows if r.mode == DECODE))
glue("decode_here", f"{max(decode_here):.2f}")
glue("element_bytes", element); glue("dtype_here", str(dtype).removeprefix("torch."))
lesson(not over, "every point drawn sits at or under its ceiling: decode under the memory slope, prefill under its roof",
       f"{len(shown)} of {len(rows)} points drawn; roof {peaks_here.source}")
pair = decoding.phase_pair(shown)    # prefill and decode at the longest S where both passed the spread check
if pair is None:
    say("Too noisy on this run to compare prefill and decode times: no length passed the spread check in both phases.")
else:
    (pre, dec), longest = pair, pair[0].seq
    lesson(dec.flops / dec.p10_ms < pre.flops / pre.p90_ms,
           "decode achieves fewer FLOP/s than prefill: even its fastest calls (10th percentile) are below "
           "prefill's slowest (90th)", f"medians {dec.tflops * 1e3:.2f} vs {pre.tflops * 1e3:.2f} GFLOP/s at S = {longest}")
    lesson(dec.p10_ms > 5 * pre.p90_ms / longest, "a token costs over five times as much to decode as to prefill",
           f"{dec.median_ms / (pre.median_ms / longest):.0f}x: {dec.median_ms:.3f} ms vs {pre.median_ms / longest:.4f} ms "
           f"per token (medians) at S = {longest}, {run_label}")

# %% [markdown]
# Here, in {glue:text}`dtype_here`, the decode points sit at {glue:text}`decode_here` FLOP/byte,
# not the 1 counted above for bfloat16: the same two FLOPs now read a {glue:text}`element_bytes`-byte
# element. This machine's ceilings are measured on the page that draws them (best of 30 runs
# each), and a machine shared with other work moves them, so chapter 6's roof, measured in its
# own run, need not match this one to the digit.

# %% tags=["remove-input"]
# How far the drawn decode points sit under their slope, and why: plain prose that follows the run.
from IPython.display import Markdown

display(Markdown(ch10.decode_gap([r for r in shown if r.mode == DECODE], peaks_here)))

# %% [markdown]
# Prefill shares its fixed costs among S tokens and reuses every key it loads; a decode token pays
# them for one token and reads the whole cache. On a GPU, once S is long, the attention call takes
# as long as reading the cache takes: the cure is to move fewer bytes per token.
#
# ## What grouped-query attention saves
#
# GQA lets a group of query heads share one K/V head (Ainslie et al., *GQA*, arXiv 2305.13245).
# The FLOPs do not change (every query head still does its own dot products), but the cache,
# and so the bytes a decode token must read, shrink by the group size. Count it for a
# Llama-3-8B-like layer stack (32 layers, 32 query heads, 8 K/V heads, D = 128, bf16) and an
# 8192-token context:

# %%
hq, hkv = 32, 8
gqa_rows = decoding.sharing_table(
    layers=32, heads=hq, head_dim=128, context=8192,
    kv_options={"multi-head (MHA)": hq, "grouped-query (GQA)": hkv, "multi-query (MQA)": 1})

# %% tags=["remove-input"]
display(ch10.sharing_shown(gqa_rows))
saving = gqa_rows.iloc[0]["KV cache (MiB)"] / gqa_rows.iloc[1]["KV cache (MiB)"]
step_saving = gqa_rows.iloc[0]["bytes per decode token, one layer (MiB)"] / gqa_rows.iloc[1]["bytes per decode token, one layer (MiB)"]
lesson(saving == hq // hkv, f"sharing each K/V head among {hq // hkv} query heads makes the cache {hq // hkv}x smaller")
lesson(0.9 * (hq // hkv) < step_saving <= hq // hkv, "and a decode token moves almost that many times fewer bytes",
       f"{step_saving:.2f}x; q and o are not shared")
glue("gqa_cache_mha", float(gqa_rows.iloc[0]["KV cache (MiB)"]) / 1024)
glue("gqa_cache_gqa", float(gqa_rows.iloc[1]["KV cache (MiB)"]) / 1024)
glue("gqa_step_saving", float(step_saving))

# %% [markdown]
# The whole cache for one 8192-token sequence is {glue:text}`gqa_cache_mha:.1f` GiB with
# multi-head attention and {glue:text}`gqa_cache_gqa:.1f` GiB with 8 K/V heads, and a decode
# step reads {glue:text}`gqa_step_saving:.2f`x fewer bytes, so at the same bandwidth it can
# take that much less time. The book's implementations take shared K/V heads as they are (SDPA
# with `enable_gqa=True`), without repeating K and V in memory where they can avoid it.
#
# ## Which SDPA backend takes a decode token?
#
# Through the library a decode token is an SDPA call with one query, no mask, `is_causal=False`
# and `enable_gqa=True` when K/V heads are shared. None of PyTorch's backend checks
# (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`) refuses that (flash refuses `is_causal`
# only with Sq ≠ Sk, which a decode call does not pass), so chapter 3's backend order decides, as
# for prefill:

# %%
decode_predictions = kernels.attention.sdpa.predictions(
    [("A100 (sm_80)", (8, 0), torch.bfloat16, False, "the default order"),
     ("H200 (sm_90)", (9, 0), torch.bfloat16, False, "cuDNN first"),
     ("T4 (sm_75)", (7, 5), torch.float16, False, "no flash before sm_80")], head_dim=128)
display(decode_predictions)
chosen, chosen_gqa = decoding.decode_backends(batch, heads, seq, head_dim, dtype, device)  # multi-head, GQA

# %% tags=["remove-input"]
lesson(decode_predictions["unpinned SDPA picks"].tolist()[:2] == ["sdpa_flash", "sdpa_cudnn"],
       "by PyTorch's rules a bf16 decode token goes to flash on an A100 and to cuDNN on an H200 (cuDNN 9.20)")
ch10.decode_backend_here(chosen, chosen_gqa, device, dtype, head_dim)
glue("decode_backend", chosen)

# %% [markdown]
# Here the decode token went to **{glue:text}`decode_backend`**. The GPU rows of the table
# above are PyTorch's rules, not a measurement; on a GPU the same cell checks that the backend
# SDPA chose is the one they predict.
#
# ## A real decode step: split over the cache, then reduce
#
# A serving engine decodes many requests at once with a kernel written for one query against a
# long cache. *SGLang decode* is one decode step of SGLang serving Qwen3-8B to 32 requests on an
# MI300X. Its attention is the paged-attention pair (`paged_attention_ll4mi_*`) of AITER, AMD's
# library of AI kernels; "paged" means the KV cache is stored in fixed-size blocks that a table
# maps to each request's tokens, as vLLM introduced. Two kernels per layer: the main one splits each request's cache into partitions and computes, per partition, a
# partial softmax-weighted sum of V with its row maximum and sum; the reduce merges the partials with
# chapter 4's online-softmax rescaling. The step was replayed from a HIP graph (AMD's
# [CUDA graph](glossary.md#cuda-graph)), so no op recorded these kernels' shapes: `find_attention`
# finds each call by its kernels' names, reads the batch from SGLang's step annotation, and the heads
# from the same run's graph-capture trace (*SGLang capture*), given as `capture=`. Before the reveal:
# what share of this decode step's GPU time is attention?

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
       "one attention call per layer of Qwen3-8B, each two kernels: a split over the KV cache, then a reduce",
       f"{len(pairs)} calls")
lesson(pairs["main kernel"].str.startswith("paged_attention_ll4mi").all()
       and pairs["reduce kernel"].str.startswith("paged_attention_ll4mi").all(),
       "both are AITER's paged-attention kernels", f"{pairs['main kernel'].iloc[0]}, {pairs['reduce kernel'].iloc[0]}")
lesson(set(pairs["launched by"]) == {"hipGraphLaunch"}, "all of them were replayed from a graph",
       "launched by " + ", ".join(sorted(set(pairs["launched by"]))))
shares = ch10.reduce_shares(pairs)
lesson(shares["call_max"] < 0.15, "merging the partitions costs little: the reduce is under 15% of every call",
       f"median {shares['call_median']:.1%} of the call, {shares['main_median']:.1%} of the main kernel; "
       f"at most {shares['call_max']:.1%} and {shares['main_max']:.1%}")
sg_kinds = breakdown.time_by_kind(decode_report)["share"]
lesson(sg_kinds.drop("attention").idxmax() == "gemm" and sg_kinds["gemm"] > 0.5,
       "most of the rest of the step is GEMMs", f"GEMM {sg_kinds['gemm']:.1%}, attention {sg_kinds['attention']:.1%}")
glue_all(sg_share=100 * decode_share, sg_gemm=100 * sg_kinds["gemm"], sg_main_us=pairs["main µs"].median(),
         sg_reduce_call_pct=100 * shares["call_median"], sg_reduce_main_pct=100 * shares["main_median"])

# %% [markdown]
# Attention was {glue:text}`sg_share:.1f`% of the decode step's GPU time; most of the rest is the
# layers' [GEMMs](glossary.md#gemm), {glue:text}`sg_gemm:.0f`% of the step. Each layer's main kernel took
# {glue:text}`sg_main_us:.0f` µs (median), and the reduce took a median
# {glue:text}`sg_reduce_call_pct:.1f`% of a call, main and reduce together
# ({glue:text}`sg_reduce_main_pct:.1f`% of the main kernel's time). With the shapes, `roof_table` puts each call on the roof (the kernel's long name left out):

# %%
decode_report.roof_table().drop(columns="kernel").head(3)

# %% tags=["remove-input"]
from statistics import median

engine = decode_report.engine_steps[0]              # the step annotation the report read
lesson(len(decode_report.engine_steps) == 1 and engine.context_requests == 0
       and engine.generation_requests == engine.g_sq == 32 and engine.g_sk > 100 * engine.generation_requests,
       "SGLang's step annotation: 32 requests, one new query each, against a long cache",
       f"{engine.g_sq} queries against {readable(engine.g_sk)} cached tokens in all")
calls = decode_report.calls
lesson(all((c.heads, c.kv_heads, c.d) == (QWEN3_8B["heads"], QWEN3_8B["kv_heads"], QWEN3_8B["head_dim"])
           and c.heads_source is not None and SGLANG_DECODE_CAPTURE.file in c.heads_source for c in calls),
       "the capture trace's attention op gives every call Qwen3-8B's heads: 32 query heads, 8 K/V heads of 128",
       str(calls[0].heads_source))
mi300x, placed = decode_report.peaks, [c.roof() for c in calls]   # the datasheet row of the GPU the trace names
assert mi300x is not None, f"kernels.hw.devices has no datasheet row for {decode_report.device}"
roofs = [r for r in placed if r is not None]
first_bytes, first_flops = calls[0].bytes, calls[0].flops
assert len(roofs) == len(calls) and first_bytes is not None and first_flops is not None, \
    "every call has its heads, a 16-bit dtype and a named GPU, so a place on the roof (its FLOPs and bytes)"
group, intensity = QWEN3_8B["heads"] // QWEN3_8B["kv_heads"], roofs[0].intensity
lesson(all(r.bound == "memory" and abs(r.intensity - group) < 0.1 and r.intensity < mi300x.ridge / 20 for r in roofs),
       f"each call does about {group} FLOPs a byte (GQA's group of {group}): memory-bound, far below the MI300X's ridge",
       f"{intensity:.1f} against {mi300x.ridge:.0f} FLOP/byte")
call_us, share = median(c.gpu_us for c in calls), median(r.share for r in roofs)
floor_us = first_bytes / mi300x.bandwidth * 1e6
lesson(all(c.gpu_us > floor_us for c in calls) and max(r.share for r in roofs) < 1,
       "a call takes longer than reading its bytes at the datasheet's bandwidth would",
       f"{call_us:.0f} µs against {floor_us:.0f} µs; {share * mi300x.bandwidth / 1e12:.2f} TB/s reached (median)")
glue_all(sg_mib=first_bytes / 2**20, sg_gflop=first_flops / 1e9, sg_call_us=float(call_us), sg_intensity=intensity,
         sg_ridge=mi300x.ridge, sg_floor_us=floor_us, sg_tbs=float(share * mi300x.bandwidth / 1e12),
         sg_peak_tbs=mi300x.bandwidth / 1e12, sg_bw_pct=float(100 * share), sg_tokens=readable(engine.g_sk),
         sg_per_request=readable(round(engine.g_sk / engine.generation_requests)))

# %% [markdown]
# SGLang's annotation, `execute_32_context_0(...)_generation_32(sq32sk32785...)`, says 32
# decoding requests, 32 queries against {glue:text}`sg_tokens` cached tokens in all, about
# {glue:text}`sg_per_request` a request; the capture trace, 32 query heads and 8 K/V heads of 128
# (Qwen3-8B's published configuration). So one layer's call moves {glue:text}`sg_mib:.1f` MiB,
# almost all of it KV cache, for {glue:text}`sg_gflop:.3f` GFLOP: {glue:text}`sg_intensity:.1f`
# FLOPs a byte (GQA's group of 4 lifts it from 1), against the MI300X's ridge of
# {glue:text}`sg_ridge:.0f`. At the datasheet's {glue:text}`sg_peak_tbs:.1f` TB/s those bytes take
# {glue:text}`sg_floor_us:.0f` µs; the median call took {glue:text}`sg_call_us:.0f` µs,
# {glue:text}`sg_tbs:.2f` TB/s, {glue:text}`sg_bw_pct:.0f`% of the memory roof: memory-bound by its
# intensity, yet short of the datasheet bandwidth (one likely reason: one query per request gives
# the kernel little parallel work to keep every memory channel busy). On a trace of your
# own: `python -m kernels.trace.attention TRACE --capture CAPTURE_TRACE` (chapter 12). A decode
# kernel's time is set by the cache it reads: its length, its dtype and how many K/V heads share it.

# %% tags=["remove-input"]
replay = ch10.graph_replay(sglang_step)
step_kernels = len(sglang_step.gpu_work)
lesson(replay["launch_calls"] == 1 and replay["kernels"] > 0.9 * step_kernels,
       "one hipGraphLaunch call queued almost all of the step's GPU work",
       f"{replay['kernels']} of its {step_kernels} kernels and copies")
lesson(replay["median_gap_us"] < 0.01 and replay["busy_us"] > 0.95 * replay["span_us"],
       "inside the replay the kernels run back to back: the GPU is busy for almost all of its span",
       f"median gap {replay['median_gap_us'] * 1e3:.1f} ns; busy {replay['busy_us'] / replay['span_us']:.1%} "
       f"of {replay['span_us'] / 1e3:.2f} ms")
glue("sg_replay_kernels", replay["kernels"]); glue("sg_replay_busy_pct", 100 * replay["busy_us"] / replay["span_us"])

# %% [markdown]
# One `hipGraphLaunch` queued {glue:text}`sg_replay_kernels` of the step's kernels, and they ran
# back to back, the GPU busy for {glue:text}`sg_replay_busy_pct:.0f`% of the replay's span: this step
# does not wait on launches; its attention waits on memory.
#
# ## What to remember
#
# - A KV cache turns generation into prefill (Sq = Sk) and decode tokens (Sq = 1, Sk long);
#   causal attention must be aligned bottom-right for both to agree, and SDPA's own
#   `is_causal` is not.
# - A decode token moves its whole cache to do two FLOPs per element: about one FLOP per byte
#   in 16 bits, far below any GPU's ridge. Decode attention is memory-bound by construction.
# - A point above its roof is a ceiling that does not describe it: time decode on inputs fresh from
#   main memory, and measure the roof on the cores the timings get.
# - GQA divides the cache, and so the bytes per step, by the group size; the FLOPs stay.
# - A serving engine's decode attention splits the cache and reduces the partials: the reduce
#   is cheap, and the main kernel's time is set by reading the cache; a graph replay keeps the
#   launches out of the way.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/10_decoding.ipynb), with automatic checks, hints and hidden solutions.
