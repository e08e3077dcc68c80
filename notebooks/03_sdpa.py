# %% [markdown]
# # 3. One call: `scaled_dot_product_attention`
#
# Chapters 1 and 2 wrote attention by hand. PyTorch has it as one function,
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` (SDPA), and behind that one
# call sit several implementations, called *backends*: a plain-PyTorch **math** fallback,
# a CUTLASS **memory-efficient** kernel, **FlashAttention-2**, and **cuDNN**'s generated
# kernel. SDPA picks one per call; we can pin one and profile it on its own.
#
# The guess most of us make: one call instead of five ops, so the trace gets simpler. For
# the fused backends that is true. For the math backend it is spectacularly false, and the
# reasons (an fp32 upcast, a mask rebuilt on every call, a NaN guard) are what this
# chapter reads out of the trace. On a CPU we profile the two backends that run here,
# math and PyTorch's CPU flash kernel; the GPU-only backends are decoded from the source
# article's A100 traces and, when this notebook runs on a GPU, checked on its own.

# %% [install]

# %% [parameters]

# %%
import math

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F

import kernels
import kernels.sdpa
from kernels import profiling, recorded, reference, traces
from kernels.book import glue, inputs, lesson, mib, reveal, setup, show_source
from kernels.fingerprints import classify_many, fingerprint
from kernels.occupancy import KINETO_SHARED_MEM_LIMIT, arch_of, occupancy

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")

# %% [markdown]
# ## One call replaces the module
#
# Everything `NaiveAttention` did (scores, scale, causal mask, softmax, weighted sum) is
# now one line. It gives the same answer as the float64 reference, and the same answer
# as chapter 2's in-place module up to rounding (the backends add things up in a
# different order, so bit-identity is not expected here):

# %%
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
verdict = reference.judge(out, q, k, v, causal=True)
lesson(verdict.ok, "SDPA matches the float64 reference by the course's rule", str(verdict))
both = reference.judge(kernels.get("inplace")(q, k, v), q, k, v, causal=True)
lesson(both.ok, "so does the hand-written in-place module: the two agree to within the rule",
       f"SDPA {verdict['out'].error:.1e}, in-place {both['out'].error:.1e}, bound {verdict['out'].bound:.1e}")

# %% [markdown]
# ## Which backend ran?
#
# SDPA walks its backends in a priority order and takes the first whose checks pass for
# these inputs (device, dtype, head dim, mask, sequence lengths). The order is not fixed.
# By default it is flash, memory-efficient, math, cuDNN; but torch 2.11 to 2.13 move cuDNN
# to the front on compute capability 9.x and 10.x (H100, H200, B200) when the runtime cuDNN
# is newer than 9.15.0, unless the environment sets `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`,
# deterministic algorithms are on, or `torch.backends.cuda.enable_cudnn_sdp(False)` turns it
# off; and `sdpa_kernel([...], set_priority=True)` imposes an order of your own. So the same
# unpinned bf16 causal call picks flash on an A100 and cuDNN on an H200.
# `kernels.sdpa.predicted_backend` writes those rules down as a pure function of the GPU:

# %%
predictions = pd.DataFrame([{"GPU": gpu, "dtype": str(dt).replace("torch.", ""), "head_dim": d,
                             "unpinned SDPA picks": kernels.sdpa.predicted_backend(cap, dt, d, cudnn_version=92000, **kw),
                             "note": note}
                            for gpu, cap, dt, d, kw, note in [
                                ("A100 (sm_80)", (8, 0), torch.bfloat16, 64, {}, "the default order"),
                                ("H200 (sm_90)", (9, 0), torch.bfloat16, 64, {}, "cuDNN first"),
                                ("H200 (sm_90)", (9, 0), torch.bfloat16, 64, {"deprioritized": True},
                                 "TORCH_CUDNN_SDPA_DEPRIORITIZED=1"),
                                ("H200 (sm_90)", (9, 0), torch.float32, 64, {}, "flash and cuDNN take 16 bits only"),
                                ("T4 (sm_75)", (7, 5), torch.float16, 64, {}, "no flash before sm_80")]])
display(predictions.set_index("GPU"))
lesson(predictions["unpinned SDPA picks"].tolist()[:2] == ["sdpa_flash", "sdpa_cudnn"],
       "by PyTorch's rules the same bf16 call picks flash on an A100 and cuDNN on an H200 (cuDNN 9.20)")

# %% [markdown]
# To ask PyTorch itself why a backend was refused, build the call's parameters and ask each
# backend's check with `debug=True`: it warns with the reason, e.g.
# `torch.backends.cuda.can_use_flash_attention(torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, False), debug=True)`
# (`can_use_efficient_attention` and `can_use_cudnn_attention` likewise; on a CPU-only build
# they simply return False). PyTorch exposes the final decision as `torch._fused_sdp_choice`;
# `kernels.sdpa.default_backend_name` translates it into the course's names, and
# `kernels.sdpa.probe` simply tries every backend pinned on its own:

# %%
chosen = kernels.sdpa.default_backend_name(q, k, v)
probed = kernels.sdpa.probe(q, k, v)
print("unpinned SDPA picks:", chosen)
display(pd.DataFrame({"runs on these inputs": {n: r is None for n, r in probed.items()},
                      "why not": {n: r or "" for n, r in probed.items()}}))
runnable = [n for n, r in probed.items() if r is None]
pinned_out = kernels.get(chosen)(q, k, v)
lesson(torch.equal(out, pinned_out), f"unpinned SDPA is exactly the {chosen} backend pinned",
       "bit-identical outputs")
if device.type == "cuda":
    predicted = kernels.sdpa.predicted_backend_here(device, dtype, head_dim)
    lesson(chosen == predicted, "on this GPU, SDPA picked the backend its priority rules predict", chosen)
glue("default_backend", chosen)

# %% [markdown]
# Here the unpinned call picked **{glue:text}`default_backend`**. Pinning is done with the
# `torch.nn.attention.sdpa_kernel` context manager, as the source article's scripts do.
# The course wraps each backend in a registry function that pins it, so `sdpa_math` is
# always the math backend and fails loudly (with PyTorch's own reason) rather than
# quietly falling back to another one:

# %%
show_source(kernels.sdpa.pinned)

# %% [markdown]
# Before running anything, the registry can already say what cannot run on this device,
# and why (`kernels.available(device)`; `None` means it runs here):

# %%
avail = kernels.available(device)
display(pd.Series({n: r or "runs here" for n, r in avail.items()}, name="kernels.available").to_frame())
if device.type == "cpu":
    lesson(chosen == "sdpa_flash", "on a CPU, unpinned SDPA uses PyTorch's CPU flash kernel")
    lesson(probed["sdpa_efficient"] is not None and probed["sdpa_cudnn"] is not None,
           "the memory-efficient and cuDNN backends have no CPU kernel and refuse to run here")
    lesson(probed["sdpa_math"] is None and probed["sdpa_flash"] is None,
           "math and flash both run on a CPU")

# %% [markdown]
# ## Profile every backend that runs here
#
# Same schedule as before, same inputs, one label per variant; chapters 1 and 2's
# modules are profiled again so that the table at the end compares like with like.
# Before the reveal: the hand-written module does five things (matmul, scale, mask,
# softmax, matmul). How many ops doing work (`Step.work_ops`: no views or bare
# allocations) do you expect one forward of SDPA's math backend to run on this machine?

# %%
guess_math_work_ops = 8  # edit me before running on

# %%
variants = ["naive", "inplace"] + [n for n in kernels.sdpa.BACKENDS if n in runnable]
runs = {name: profiling.profile(kernels.get(name), q, k, v, label=name, active=steps, trace_dir=trace_dir)
        for name in variants}
step = {name: profiling.median_step(r.steps()) for name, r in runs.items()}
work_ops = {name: len(s.work_ops()) for name, s in step.items()}  # the course's one definition
print({name: f"{n} ops doing work" for name, n in work_ops.items()})
# The GPU lanes this chapter reads: this run's own on a GPU, else the newest recording's.
lanes, lane_source, lane_capability = recorded.gpu_lanes(
    device, step, "03_sdpa", ["inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn"])
print(f"GPU lanes: {lane_source}" if lanes else lane_source)

# %% [markdown]
# ## The math backend: one line, more work
#
# The source article's first surprise: on its A100, the math backend launched **20
# kernels** per forward where the hand-written in-place version launched **5**, and its
# forward was 3.7x slower (7.239 ms against 1.955 ms of GPU time per forward). The CPU
# trace shows the same inflation as ops:

# %%
glue("math_ops", work_ops["sdpa_math"])
glue("inplace_ops", work_ops["inplace"])
reveal(guess_math_work_ops, work_ops["sdpa_math"], "ops doing work in one math-backend forward")
lesson(work_ops["sdpa_math"] > work_ops["inplace"],
       "the math backend dispatches more ops per forward than the hand-written in-place module",
       f"{work_ops['sdpa_math']} vs {work_ops['inplace']} ops doing work")
if {"sdpa_math", "inplace"} <= set(lanes):
    n_kernels = {n: int((lanes[n].kernels["cat"] == "kernel").sum()) for n in ("inplace", "sdpa_math")}
    print(f"kernels per forward ({lane_source}):", n_kernels)
    lesson(n_kernels["sdpa_math"] > n_kernels["inplace"],
           "the math backend launches more GPU kernels per forward than the in-place module",
           f"{n_kernels['sdpa_math']} vs {n_kernels['inplace']}, {lane_source}")

# %% [markdown]
# {glue:text}`math_ops` ops doing work against {glue:text}`inplace_ops`. To see what they
# are, here is the math backend written out in Python, one ATen op per line, as
# `kernels.sdpa.math_decomposed`. It mirrors ATen's `_scaled_dot_product_attention_math`:

# %%
show_source(kernels.sdpa.math_decomposed)

# %%
same = torch.equal(kernels.sdpa.math_decomposed(q, k, v), kernels.get("sdpa_math")(q, k, v))
lesson(same, "math_decomposed returns the math backend's output bit for bit")
profiling.op_table(step["sdpa_math"])

# %% [markdown]
# Which of those ops are new? `profiling.diff`, chapter 2's tool, matches one forward of the
# in-place module with one of the math backend, op by op, by name *and* input shapes, and
# keeps the rows whose count or allocated bytes differ:

# %%
changes = profiling.diff(step["inplace"], step["sdpa_math"])
changes.table()

# %%
only_inplace, only_math = changes.only_in("inplace"), changes.only_in("sdpa_math")
scores_dims, qk_dims = str((batch, heads, seq, seq)), (str((batch, heads, seq, head_dim)), str((batch, heads, head_dim, seq)))
inplace_muls = only_inplace.loc[only_inplace["name"] == "aten::mul", "shapes"]
math_muls = only_math.loc[only_math["name"] == "aten::mul", "shapes"]
lesson("aten::masked_fill_" in set(only_inplace["name"]) and inplace_muls.str.startswith(scores_dims).any(),
       "only the in-place module applies a cached mask with masked_fill_ and scales the S×S scores",
       ", ".join(sorted(set(only_inplace["name"]))))
lesson({"aten::ones", "aten::tril", "aten::where", "aten::add_"} <= set(only_math["name"]),
       "only the math backend builds the causal mask (ones, tril, where) and adds it (add_)")
lesson({"aten::_safe_softmax", "aten::isneginf", "aten::all"} <= set(only_math["name"]),
       "only the math backend runs _safe_softmax with its guards (isneginf, all)")
lesson(all(math_muls.str.startswith(dims).any() for dims in qk_dims),
       "the math backend scales q and k, S×D tensors, instead of the S×S scores",
       ", ".join(math_muls))
changed_names = set(changes.changed()["name"])
if dtype == torch.float32:
    lesson(not {"aten::bmm", "aten::_softmax"} & changed_names,
           "in float32 the matmuls and the softmax itself are matched: same count, same bytes")
else:
    lesson("aten::bmm" in changed_names, "at 16 bits even the matmuls differ: the math backend's are float32")
fig = changes.figure()

# %%
# The two traces behind this figure: download them, or open them in Perfetto.
display(traces.links(runs["inplace"]), traces.links(runs["sdpa_math"]))

# %% [markdown]
# Only in the in-place forward: the cached mask, applied with `masked_fill_`, and the scale,
# multiplied into the S×S scores. Only in the math backend: the mask built anew (`ones`,
# `tril`, `where`) and added with `add_`, the scale split over q and k (two S×D tensors
# rather than one S×S), and `_safe_softmax` with its guards. In a float32 run the matmuls
# and the softmax itself are matched and stay out of the table; with 16-bit inputs they
# differ too, for the first reason below. Three things in that source have no counterpart
# in chapter 2's module.
#
# ### 1. The fp32 upcast
#
# The math backend values accuracy over speed: bfloat16 or float16 inputs are converted
# to float32 first, and every S×S intermediate is float32. This run's inputs are
# {glue:text}`run_dtype`, so to watch the conversion on this device we profile one small
# bfloat16 forward:

# %%
glue("run_dtype", str(dtype).replace("torch.", ""))
seq16 = 64
q16, k16, v16 = inputs(1, 2, seq16, 16, dtype=torch.bfloat16, device=device)
small = profiling.profile(kernels.get("sdpa_math"), q16, k16, v16, label="sdpa_math_bf16",
                          wait=0, warmup=1, active=1, trace_dir=trace_dir).step()
copies = small.find("aten::copy_")
upcasts = copies[[t[:2] == ["float", "c10::BFloat16"] and d[0] == list(q16.shape)
                  for t, d in zip(copies["input_types"], copies["input_dims"])]]
downcasts = copies[[t[:2] == ["c10::BFloat16", "float"] for t in copies["input_types"]]]
bmm_types = {tuple(t[:2]) for t in small.find("aten::bmm")["input_types"]}
print("upcasts (dst float <- src bf16):", upcasts["input_dims"].map(lambda d: d[0]).tolist())
print("downcasts (dst bf16 <- src float):", downcasts["input_dims"].map(lambda d: d[0]).tolist())
print("matmul (bmm) input types:", bmm_types)
lesson(len(upcasts) == 3, "the math backend copies q, k and v from bfloat16 to float32 on every call")
lesson(bmm_types == {("float", "float")}, "both of its matmuls then run in float32")
lesson([seq16, seq16] in [d[0][-2:] for d in downcasts["input_dims"]],
       "it also converts the S×S probabilities back to bfloat16", "a copy_ of a [..., 64, 64] tensor")

# %% [markdown]
# Besides the output, the last list shows a second conversion back: the math backend
# returns the S×S probabilities as well as the output, and converts both to bfloat16.
# `scaled_dot_product_attention` keeps only the output; nothing reads the probabilities, not
# even the backward pass, for which autograd differentiates the decomposed ops themselves
# (the softmax's backward saves its own result).
#
# On a GPU the float32 matmul is what makes the math backend slow. Kernel names say which
# hardware a GEMM ran on; the article reads them as fingerprints (its Figures 10 and 11).
# Here are names of the two kinds, as cuBLAS writes them on Ampere, decoded by
# `kernels.fingerprints`:

# %%
gemm_names = {"naive (bf16)": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn",
              "SDPA math (upcast)": "ampere_sgemm_128x64_nn"}
gemms = classify_many(gemm_names.values()).assign(run=list(gemm_names))
display(gemms[["run", "name", "tensor_cores", "dtype", "note"]])
lesson(gemms["tensor_cores"].tolist() == [True, False],
       "s16816 names a bf16 tensor-core GEMM; sgemm names an fp32 GEMM on CUDA cores")

# %% [markdown]
# `s16816` is the tensor-core matrix instruction (m16n8k16) with fp32 accumulation; `sgemm`
# is single precision on the ordinary CUDA cores. The upcast moves twice the bytes and
# leaves the tensor cores idle.

# %%
if "sdpa_math" in lanes:
    fps = classify_many(lanes["sdpa_math"].kernels["name"])
    display(fps[["name", "kind", "tensor_cores", "dtype"]].assign(name=fps["name"].str.slice(0, 70)))
    gemm_dtypes = set(fps.loc[fps["kind"] == "gemm", "dtype"])
    lesson(bool(gemm_dtypes) and not gemm_dtypes & {"bf16", "fp16"},
           "no GEMM of the math backend runs in 16 bits on the GPU lane",
           f"GEMM dtypes from the names: {gemm_dtypes}, {lane_source}")

# %% [markdown]
# ### 2. The causal mask, rebuilt on every call
#
# Chapter 1 built its mask once and cached it. With `is_causal=True` the math backend has
# no cache: every forward runs `ones` (an S×S boolean tensor), `tril` (keep the lower
# triangle) and `where` (turn it into an additive bias of 0 and $-\infty$), then adds it to
# the scores with `add_`. The article watched these ops on its CPU lane (its Figure 12);
# they are on ours too, in that order, in every recorded step:

# %%
def mask_ops(s):
    """Start times of the mask-building ops: ones, then tril and where on an S×S tensor."""
    found = {"ones": s.find("aten::ones"), "tril": s.find("aten::tril", [seq, seq]),
             "where": s.find("aten::where", [seq, seq])}
    return {name: hits["start_us"].min() if not hits.empty else None for name, hits in found.items()}

per_step = [mask_ops(s) for s in runs["sdpa_math"].steps()]
display(pd.DataFrame(per_step).round(1).rename_axis("recorded step"))
lesson(all(None not in m.values() for m in per_step),
       f"every recorded math forward builds the causal mask anew ({len(per_step)} of {len(per_step)} steps)")
lesson(all(m["ones"] < m["tril"] < m["where"] for m in per_step), "in the order ones -> tril -> where")
lesson(not step["sdpa_math"].find("aten::add_").empty, "and adds it to the scores with add_")

# %%
if "sdpa_math" in lanes:
    tril_kernels = lanes["sdpa_math"].kernels["name"].str.contains("triu_tril")
    lesson(tril_kernels.any(), "on the GPU lane the mask shows up as a triu_tril kernel", lane_source)

# %% [markdown]
# ### 3. The safe softmax
#
# Chapter 1 called `softmax`. The math backend calls `_safe_softmax`, which runs the
# softmax plus three more passes over the S×S scores: `isneginf`, `all` along each row,
# and a `where` that zeroes any row that was entirely masked:

# %%
math_ops = step["sdpa_math"].ops
safe = math_ops[math_ops["name"] == "aten::_safe_softmax"]
children = set(math_ops.loc[math_ops["parent"].isin(safe.index), "name"])
print("inside _safe_softmax:", sorted(children))
lesson(len(safe) == 1 and {"aten::softmax", "aten::isneginf", "aten::all", "aten::where"} <= children,
       "the math backend's softmax carries isneginf, all and where as NaN guards")
show_source(kernels.sdpa.safe_softmax)

# %% [markdown]
# What does the guard protect against? A row whose every score is $-\infty$: nothing may be
# attended to. A causal mask never produces one (every query sees at least itself), but an
# arbitrary boolean `attn_mask`, say for a padding token, can. A plain softmax computes
# $e^{-\infty} / \sum e^{-\infty} = 0/0$ there:

# %%
row = torch.full((1, 4), float("-inf"), device=device, dtype=dtype)
scores = torch.cat([torch.tensor([[0.5, -1.0, float("-inf"), 2.0]], device=device, dtype=dtype), row])
plain = torch.softmax(scores, dim=-1)
guarded = kernels.sdpa.safe_softmax(scores, dim=-1)
print("plain softmax:\n", plain, "\nsafe softmax:\n", guarded)
lesson(torch.isnan(plain[1]).all() and not torch.isnan(plain[0]).any(),
       "a plain softmax turns a fully masked row into NaN", f"on {device.type}")
lesson(torch.equal(guarded[1], torch.zeros_like(guarded[1])) and torch.equal(guarded[0], plain[0]),
       "the safe softmax returns zeros there and the plain softmax everywhere else")
lesson(torch.allclose(guarded, torch._safe_softmax(scores, -1)), "the course's safe_softmax matches ATen's _safe_softmax")

# %% [markdown]
# Through SDPA, a query whose mask row is all `False` gets an output of zeros from the
# math backend; chapter 1's module, with its plain softmax, would have produced NaNs:

# %%
qm, km, vm = inputs(1, 1, 4, 8, dtype=dtype, device=device)
allowed = torch.ones(4, 4, dtype=torch.bool, device=device).tril()
allowed[2] = False  # query 2 may attend to nothing
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
    masked_out = F.scaled_dot_product_attention(qm, km, vm, attn_mask=allowed)
lesson(torch.equal(masked_out[0, 0, 2], torch.zeros_like(masked_out[0, 0, 2]))
       and not torch.isnan(masked_out).any(), "SDPA math gives a fully masked query zeros, not NaN")

# %% [markdown]
# So the math backend is chapter 1's attention done carefully: dtype-safe, NaN-safe, and
# correct for any mask, which is why it is the fallback that always runs. Its price is
# visible in one forward's timeline, a wall of ops over S×S tensors:

# %%
fig = profiling.timeline(step["sdpa_math"], title=f"SDPA math backend: one forward ({device.type})")

# %%
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
traces.links(runs["sdpa_math"])

# %% [markdown]
# ## The fused backends: one kernel each
#
# The other three backends exist to collapse all of that into a single kernel that keeps
# 16-bit inputs in 16 bits, runs on tensor cores, and never writes the S×S scores to
# memory: it walks K and V in tiles, keeps a running (online) softmax, and accumulates
# the output tile by tile. The source article found exactly **one kernel per forward**
# for each of them on its A100. `kernels.sdpa.ARTICLE_A100_KERNELS` holds their names
# (the flash name shortened); decoded:

# %%
article = classify_many(kernels.sdpa.ARTICLE_A100_KERNELS.values())
article.insert(0, "backend", list(kernels.sdpa.ARTICLE_A100_KERNELS))
display(article[["backend", "name", "family", "tensor_cores", "dtype", "note"]])
lesson((article["kind"] == "fused_attention").all() and article["tensor_cores"].all(),
       "each article kernel decodes as one fused attention kernel on tensor cores")

# %% [markdown]
# Read left to right, `fmha_cutlassF_bf16_aligned_64x64_rf_sm80` says: fused multi-head
# attention, built from CUTLASS templates, forward, bfloat16, aligned inputs, 64×64 tiles,
# working set in the register file, compiled for sm_80. It is the memory-efficient kernel
# that came from Meta's xFormers. `pytorch_flash::flash_fwd_kernel` is FlashAttention-2,
# vendored into PyTorch. The cuDNN name is not a fixed binary at all: `cudnn_generated`
# kernels are produced for the problem at hand, `flash_fprop` names the algorithm
# family, `wmma_f16` the 16-bit tensor-core path, `knob_6` the tuned configuration it
# picked and `128x64x64` its tiles. (It says `f16` even in a bf16 run.)
#
# ### The flash backend in this run's trace
#
# The CPU has its own fused flash kernel, SDPA's default there. On a CPU one forward is one
# op doing work, `_scaled_dot_product_flash_attention_for_cpu`, plus a few views (on a GPU,
# the op launches the one kernel):

# %%
transposes = pd.DataFrame(columns=["alloc_bytes"])
if "sdpa_flash" in step:
    fl = step["sdpa_flash"]
    display(profiling.op_table(fl, views=True))
    transposes = fl.find("aten::transpose")
    if device.type == "cpu":
        work = fl.ops.loc[~fl.ops["is_view"], "name"].tolist()
        lesson(work == ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"],
               "a CPU flash forward is a single fused op under scaled_dot_product_attention", ", ".join(work))
    lesson(len(transposes) >= 4 and transposes["alloc_bytes"].sum() == 0,
           "the flash forward's transposes only rearrange metadata: they allocate nothing",
           f"{len(transposes)} transposes, 0 bytes")
glue("flash_transposes", len(transposes))

# %% [markdown]
# Those {glue:text}`flash_transposes` `transpose` calls swap the tensors' strides, from
# [B, H, S, D] to the [B, S, H, D] layout the kernel reads, and back; no data moves. The
# article saw the same on its GPU: flash and efficient each put four such metadata
# transposes on the CPU lane before their kernel,
# while cuDNN, whose generator emits a kernel for the [B, H, S, D] layout directly, has
# none (its Figures 19 to 21). The flash forward's timeline is short:

# %%
if "sdpa_flash" in step:
    fig = profiling.timeline(step["sdpa_flash"], title=f"SDPA flash backend: one forward ({device.type})")

# %%
# The trace behind this figure: download it, or open it in Perfetto (see the Perfetto appendix).
traces.links(runs["sdpa_flash"]) if "sdpa_flash" in runs else None

# %% [markdown]
# ### Low occupancy, on purpose
#
# The profiler's footprint of the flash kernel surprised the article's authors: about 13%
# estimated occupancy, for the fastest backend. Occupancy is the share of an SM's warp
# slots that resident warps fill, and registers decide it here. The article's arithmetic
# for a block of 128 threads at 255 registers each on an A100 (sm_80), reproduced with
# `kernels.occupancy`:

# %%
flash_occ = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_80")
print(flash_occ.explain())
lesson(flash_occ.blocks_per_sm == 2 and flash_occ.warps_per_sm == 8 and flash_occ.percent == 12.5,
       "128 threads x 255 registers on sm_80: 2 blocks, 8 of 64 warps, 12.5% occupancy")
glue("flash_occ", flash_occ.percent)
glue("flash_blocks", flash_occ.blocks_per_sm)
glue("flash_warps_per_block", flash_occ.warps_per_block)
glue("flash_warps", flash_occ.warps_per_sm)
glue("max_warps", flash_occ.max_warps_per_sm)

# %% [markdown]
# {glue:text}`flash_blocks` blocks of {glue:text}`flash_warps_per_block` warps make
# {glue:text}`flash_warps` resident warps of {glue:text}`max_warps`: {glue:text}`flash_occ:.1f`%.
# That is not a flaw.
# High occupancy hides memory latency by having other warps to switch to. Flash still streams
# every K and V tile from HBM, but it hides that latency another way: while the tensor cores
# work on the current tile, the next one is already on its way into shared memory
# (`cp.async` prefetching). Its registers and shared memory go to those on-chip tiles and the
# running softmax, and low occupancy is the price of never writing the scores to memory.
#
# ### cuDNN: a 0% that is not real
#
# The article's cuDNN kernel reported 0% estimated occupancy (its Figure 23). The field is
# not a measurement: Kineto, the profiler's tracing library, computes it itself from the
# kernel's registers, block size and shared memory with CUDA's occupancy calculator, and it
# assumes the 48 KiB default limit of shared memory per block (pytorch/kineto,
# `libkineto/src/DeviceProperties.cpp`). A kernel that opts into more shared memory than that,
# as cuDNN's flash kernels do, gets zero resident blocks in that calculation and reads 0%,
# whichever API launched it. The GPU-lane cell below checks exactly that rule on every fused
# kernel it sees. The footprint the article's trace does report, 256 threads at 240
# registers, gives the register-limited figure:

# %%
cudnn_occ = occupancy(threads_per_block=256, registers_per_thread=240, arch="sm_80")
print(cudnn_occ.explain())
lesson(cudnn_occ.blocks_per_sm == 1 and cudnn_occ.percent == 12.5,
       "256 threads x 240 registers on sm_80: 1 block of 8 warps, 12.5% occupancy, like flash")
glue("cudnn_occ", cudnn_occ.percent)

# %% [markdown]
# One block of 61,440 registers fits in the SM's 65,536, a second does not:
# {glue:text}`cudnn_occ:.1f`%, in line with flash. cuDNN has a CPU-side cost too. The article
# measured, per forward on its A100 (GPU / CPU time): efficient 277.9 / 117 µs, flash
# 146.8 / 138 µs, cuDNN 186.3 / **214** µs. cuDNN, with no transposes at all, spends the most
# CPU time, inside one opaque `_cudnn_attention_forward` bar. That is not a plan being chosen
# on every call: PyTorch builds the cuDNN graph for a shape once and caches it
# (`aten/src/ATen/native/cudnn/MHA.cpp`, a per-thread graph cache), so a steady-state call pays
# for looking the graph up, filling in the tensors' addresses, a workspace allocation and the
# execute call. The first call at a new shape is the expensive one, and if it falls inside
# the profiled window it inflates the average. A cleaner trace did not mean less work; the
# work moved where the profiler cannot split it.
#
# On a GPU the cell below measures that split directly, without the profiler (whose own
# bookkeeping of shapes and memory would add to every CPU time): the CPU time of cuDNN's first
# call at a shape it has not seen, against the median of the calls after it.

# %%
if device.type == "cuda" and "sdpa_cudnn" in runnable:
    import statistics
    import time

    cudnn = kernels.get("sdpa_cudnn")
    fresh = inputs(batch, heads, seq + 64, head_dim, dtype=dtype, device=device, seed=3)  # a new shape

    def cpu_ms() -> float:
        """CPU time of one call: the launch, not the kernel (the GPU runs on afterwards)."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        cudnn(*fresh)
        spent = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize()
        return spent

    first = cpu_ms()
    steady = statistics.median(cpu_ms() for _ in range(20))
    print(f"cuDNN at a new shape: first call {first:.2f} ms of CPU time, then {steady:.3f} ms per call (median of 20)")
    lesson(first > 3 * steady, "cuDNN's first call at a new shape costs far more CPU time than the calls after it: "
           "the graph is built once and then found in the cache", f"{first:.2f} vs {steady:.3f} ms")
    glue("cudnn_first_ms", first)
    glue("cudnn_steady_ms", steady)
else:
    print("This run has no cuDNN backend to time (it needs a GPU with compute capability 8.0 or newer).")

# %% [markdown]
# The cell below checks the one-kernel shape of every fused backend on a GPU lane, decodes
# each kernel's name, and recomputes its occupancy from the footprint the trace carries.
# The lane is this run's own when it ran on a GPU, else the repository's recorded GPU run
# (labelled as such), else there is none to read and the cell says so.

# %%
fused = [n for n in ("sdpa_efficient", "sdpa_flash", "sdpa_cudnn") if n in lanes]
if fused:
    print(f"GPU lane: {lane_source}")
    arch = None
    try:
        arch = arch_of(lane_capability)
    except ValueError as err:
        print(f"no occupancy table for this GPU: {err}")
    rows = []
    for name in fused:
        s = lanes[name]
        ks = s.kernels[s.kernels["cat"] == "kernel"]
        lesson(len(ks) == 1, f"{name} launches exactly one kernel per forward", ", ".join(ks["name"].str.slice(0, 60)))
        kern = ks.iloc[0]
        fp = fingerprint(kern["name"])
        lesson(fp.kind == "fused_attention", f"{name}'s kernel decodes as fused attention", fp.note)
        computed = None
        footprint = isinstance(kern["block"], (list, tuple)) and pd.notna(kern["registers_per_thread"])
        smem = int(kern["shared_memory"]) if pd.notna(kern["shared_memory"]) else None
        if arch and footprint:
            computed = occupancy(threads_per_block=math.prod(int(x) for x in kern["block"]),
                                 registers_per_thread=int(kern["registers_per_thread"]),
                                 shared_mem_per_block=smem or 0, arch=arch).percent
        rows.append({"backend": name, "kernel": kern["name"][:60], "launched by": kern["launcher"],
                     "regs/thread": kern["registers_per_thread"], "block": kern["block"],
                     "shared KiB": None if smem is None else round(smem / 1024, 1),
                     "reported occupancy %": kern["occupancy_pct"], "computed occupancy %": computed,
                     "transposes (CPU)": len(s.find("aten::transpose")),
                     "GPU us": s.gpu_time_us, "CPU us": s.cpu_time_us})
    table = pd.DataFrame(rows)
    display(table)
    if "sdpa_flash" in fused and table.loc[fused.index("sdpa_flash"), "computed occupancy %"] is not None:
        lesson(table.loc[fused.index("sdpa_flash"), "computed occupancy %"] < 50,
               "flash's footprint gives low theoretical occupancy on this GPU too")
    # Kineto's estimate assumes the 48 KiB default per-block shared-memory limit: a kernel
    # that opts into more reads 0%, whatever launched it.
    known = table.dropna(subset=["shared KiB", "reported occupancy %"])
    over = known["shared KiB"] * 1024 > KINETO_SHARED_MEM_LIMIT
    lesson(((known["reported occupancy %"] == 0) == over).all(),
           "the kernels that read 0% estimated occupancy are exactly those using more than 48 KiB of shared memory",
           "; ".join(f"{b}: {kib} KiB, {pct}%" for b, kib, pct in
                     zip(known["backend"], known["shared KiB"], known["reported occupancy %"])) or "no footprint recorded")
    if "sdpa_cudnn" in fused:
        launcher = table.loc[fused.index("sdpa_cudnn"), "launched by"]
        lesson(launcher != "cudaLaunchKernel", "cuDNN does not launch through cudaLaunchKernel", launcher)
else:
    print(f"{lane_source}\nOn this machine the efficient and cuDNN backends have no kernel at all "
          f"(kernels.available says: {avail['sdpa_cudnn']}).")

# %% [markdown]
# ## Memory: S² against S
#
# The fused kernels' real gift is memory. The math backend holds S×S intermediates (the
# scores, the probabilities, the guards), so its peak should grow 4x each time the
# sequence doubles. The flash kernel only allocates the output, one log-sum-exp per row,
# and a fixed scratch buffer per thread, so it should grow about 2x. Guess, then measure
# one forward at a few sequence lengths (the same batch, heads and head dim as above;
# math stops one doubling earlier, its largest point would cost more than all the others):

# %%
# On a GPU one doubling longer: the larger batch and heads there have bigger S-sized
# (not S×S) buffers, which would blur the 4x at short sequences.
sweep_seqs = [256, 512, 1024, 2048] if device.type == "cpu" else [512, 1024, 2048, 4096]
sweep_for = {"sdpa_math": sweep_seqs[:-1], "sdpa_flash": sweep_seqs}
sweep, sweep_steps = [], {}
for s_len in sweep_seqs:
    qs, ks_, vs = inputs(batch, heads, s_len, head_dim, dtype=dtype, device=device)
    for name, lengths in sweep_for.items():
        if name not in step or s_len not in lengths:
            continue
        st = profiling.profile(kernels.get(name), qs, ks_, vs, label=name, wait=0, warmup=1, active=1,
                               trace_dir=trace_dir, trace_name=f"{name}_S{s_len}").step()
        sweep_steps[name, s_len] = st
        sweep.append({"backend": name, "seq": s_len, "peak (MiB)": mib(st.peak_bytes)})
peaks = pd.DataFrame(sweep).pivot(index="seq", columns="backend", values="peak (MiB)")
growth = (peaks / peaks.shift(1)).rename(columns=lambda c: f"{c} x per doubling")
display(pd.concat([peaks.round(2), growth.round(2)], axis=1))

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
for name in peaks.columns:
    measured = peaks[name].dropna()
    ax.plot(measured.index, measured, "o-", label=name)
s0 = peaks.index[0]
for power, style, anchor in ((2, ":", "sdpa_math"), (1, "--", "sdpa_flash")):
    if anchor in peaks:
        guide = peaks[anchor].iloc[0] * (peaks.index / s0) ** power
        ax.plot(peaks.index, guide, style, color="grey", label=f"∝ S{'²' if power == 2 else ''} (from the first point)")
ax.set(xscale="log", yscale="log", xlabel="sequence length S", ylabel="peak memory of one forward (MiB)",
       title=f"Peak memory, B={batch} H={heads} D={head_dim}, {str(dtype).replace('torch.', '')}")
ax.xaxis.set_minor_locator(plt.NullLocator())  # log axes label minor ticks otherwise
ax.set_xticks(peaks.index, [str(s) for s in peaks.index])
ax.legend()
fig.tight_layout()

# %%
# The traces behind each point: download them, or open them in Perfetto.
display(*(traces.links(st) for st in sweep_steps.values()))

# %%
math_growth = growth["sdpa_math x per doubling"].dropna()
lesson(((math_growth > 3) & (math_growth < 4.2)).all() and math_growth.iloc[-1] > 3.5,
       "the math backend's peak grows about 4x per doubling of S (it holds S×S buffers)",
       ", ".join(f"{x:.2f}x" for x in math_growth))
glue("math_growth_last", float(math_growth.iloc[-1]))
glue("math_peak_max", float(peaks["sdpa_math"].dropna().iloc[-1]))
glue("math_max_seq", sweep_for["sdpa_math"][-1])
glue("flash_max_seq", sweep_for["sdpa_flash"][-1])
if "sdpa_flash" in peaks:
    flash_growth = growth["sdpa_flash x per doubling"].dropna()
    lesson(flash_growth.iloc[-1] <= 2.1, "the flash backend's peak grows at most about 2x per doubling once S is large",
           ", ".join(f"{x:.2f}x" for x in flash_growth))
    glue("flash_growth_last", float(flash_growth.iloc[-1]))
    glue("flash_peak_max", float(peaks["sdpa_flash"].iloc[-1]))
else:  # a GPU without the flash backend (e.g. a T4): nothing to compare
    glue("flash_growth_last", float("nan"))
    glue("flash_peak_max", float("nan"))

# %% [markdown]
# At S = {glue:text}`math_max_seq` the math backend peaked at {glue:text}`math_peak_max:.0f` MiB,
# its last doubling costing {glue:text}`math_growth_last:.2f`x. At S = {glue:text}`flash_max_seq`
# flash peaked at {glue:text}`flash_peak_max:.1f` MiB, up {glue:text}`flash_growth_last:.2f`x
# from the length before. On a CPU the flash curve has a bump in the middle. The CPU
# kernel (ATen's `cpu_flash_attention`) gives every thread a scratch buffer for one block
# of queries against one block of keys, and it picks larger blocks for longer sequences;
# the buffer follows the block sizes, not S. Its allocations add up exactly:

# %%
if device.type == "cpu" and "sdpa_flash" in step:
    def flash_allocations(s_len):
        st = sweep_steps["sdpa_flash", s_len]
        sizes = st.memory.loc[st.memory["bytes"] > 0, "bytes"].tolist()
        out_bytes = batch * heads * s_len * head_dim * q.element_size()
        lse_bytes = batch * heads * s_len * 4  # one float32 log-sum-exp per query row
        scratch = [b for b in sizes if b not in (out_bytes, lse_bytes)]
        return {"seq": s_len, "allocations": len(sizes), "output": out_bytes in sizes,
                "log-sum-exp": lse_bytes in sizes, "scratch (KiB)": sum(scratch) / 1024}
    acc = pd.DataFrame([flash_allocations(s) for s in sweep_seqs]).set_index("seq")
    display(acc)
    lesson((acc["allocations"] == 3).all() and acc["output"].all() and acc["log-sum-exp"].all(),
           "every CPU flash forward allocates exactly three buffers: the output, the log-sum-exp, a scratch buffer")
    lesson(acc["scratch (KiB)"].is_monotonic_increasing and acc["scratch (KiB)"].nunique() > 1,
           "the bump is the scratch buffer: it steps up as the kernel picks larger blocks",
           ", ".join(f"{x:.0f}" for x in acc["scratch (KiB)"]) + " KiB")
    lesson(acc["scratch (KiB)"].iloc[-1] == acc["scratch (KiB)"].iloc[-2],
           "the scratch buffer does not grow with S (same size at the two longest sequences)",
           f"{acc['scratch (KiB)'].iloc[-1]:.0f} KiB")

# %% [markdown]
# No buffer is S×S. On a GPU the tiles live in registers and shared memory instead of a
# scratch buffer; a GPU run of this notebook checks the same 2x growth in the sweep above.
#
# ## So far
#
# Every number below comes from the profiles of this notebook, one row per variant: ops
# per forward (all of them, and those doing work), on a GPU the kernels and their time,
# the CPU time of the median recorded step (the wall time of the labelled call), and its
# peak memory.

# %%
table = pd.DataFrame([s.summary() for s in step.values()]).set_index("label")
table["work"] = [len(s.work_ops()) for s in step.values()]
columns = {"ops": "ops", "work": "ops doing work", "cpu_time_ms": "CPU time (ms)",
           "peak_MiB": "peak (MiB)"}
if device.type == "cuda":
    columns = {"ops": "ops", "work": "ops doing work", "kernels": "kernels",
               "cpu_time_ms": "CPU time (ms)", "gpu_time_ms": "GPU time (ms)", "peak_MiB": "peak (MiB)"}
so_far = table[list(columns)].rename(columns=columns).round(2)
time_col = "CPU time (ms)"
so_far.index.name = "variant"
display(so_far)
lesson(so_far.loc["sdpa_math", "ops doing work"] == so_far["ops doing work"].max(),
       "of all variants so far, the math backend dispatches the most ops")
unfused = ["naive", "inplace", "sdpa_math"]
if "sdpa_flash" in so_far.index:
    lesson(table.loc["sdpa_flash", "peak_MiB"] < table.loc[unfused, "peak_MiB"].min() / 4,
           "the flash backend's peak is a small fraction of any unfused variant's",
           f"{table.loc['sdpa_flash', 'peak_MiB']:.2f} MiB vs at least {table.loc[unfused, 'peak_MiB'].min():.1f} MiB")
    glue("flash_ms", float(so_far.loc["sdpa_flash", time_col]))
    glue("flash_peak", float(so_far.loc["sdpa_flash", "peak (MiB)"]))
else:
    glue("flash_ms", float("nan"))
    glue("flash_peak", float("nan"))
glue("math_ms", float(so_far.loc["sdpa_math", time_col]))
glue("math_peak", float(so_far.loc["sdpa_math", "peak (MiB)"]))
glue("inplace_ms", float(so_far.loc["inplace", time_col]))
glue("steps_glued", steps)

# %% [markdown]
# On this run one forward took {glue:text}`math_ms:.2f` ms with the math backend
# ({glue:text}`math_peak:.1f` MiB at its peak), {glue:text}`inplace_ms:.2f` ms with the
# in-place module, and {glue:text}`flash_ms:.2f` ms with flash ({glue:text}`flash_peak:.2f`
# MiB). Each is one profiled step, the median of {glue:text}`steps_glued` recorded ones,
# on a machine that may be busy with other work; the showdown chapter has benchmark timings.

# %% [markdown]
# ## What to remember
#
# - One call is not one kernel: the math backend is attention in primitive ops, made
#   careful (fp32 upcast, a mask rebuilt per call, NaN guards), and it pays for each.
# - The fused backends are one kernel each; read their names as fingerprints before
#   anything else.
# - Low occupancy can be a design choice, and a 0% occupancy can be a missing
#   measurement: check the footprint.
# - Fused attention's memory grows with S, not S²: the scores never leave the chip.
#
# Next: write that fused kernel ourselves, in Triton.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/03_sdpa.ipynb), with automatic checks, hints and hidden solutions.
