# %% [markdown]
# # 3. One call: `scaled_dot_product_attention`
#
# Chapters 1 and 2 wrote attention by hand. PyTorch has it as one function,
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` ([SDPA](glossary.md#sdpa)), with
# several implementations, *backends*, behind it: a plain-PyTorch **math** fallback, a
# [CUTLASS](glossary.md#cutlass) **memory-efficient** [kernel](glossary.md#kernel),
# **FlashAttention-2**, and **cuDNN**'s generated kernel. SDPA picks one per call.
#
# The usual guess: one call instead of five ops, so a simpler trace. True for the fused backends
# ([3b](03b_sdpa_fused.ipynb) reads their kernels, [occupancy](glossary.md#occupancy) and
# memory); spectacularly false for the math backend, as its trace shows.
#
# **You will learn to:**
#
# - say which SDPA backend a call takes and why, and pin one to profile it alone;
# - follow one SDPA call in a real GPU trace down to its kernel, and check its backend against
#   the rules from the recorded inputs;
# - diff the math backend against chapter 2's module op by op and find its three costs: the fp32
#   upcast (and the [GEMM](glossary.md#gemm) names that show it), a causal mask rebuilt every
#   call, and `_safe_softmax`'s NaN guards.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb) and [2. In
# place](02_inplace.ipynb).
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from kernels import borrowed, recorded, reference
from kernels.attention import sdpa
from kernels.book import ch03_sdpa as ch03
from kernels.notebook import glue, glue_all, inputs, lesson, reveal, say, setup, show_lines
from kernels.trace import diff as tracediff, reader, record, timeline
from kernels.trace.fingerprints import classify_many, mentions_op
from kernels.trace.links import links

device, dtype = setup(device, dtype)
q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device)
print(f"q, k, v: {tuple(q.shape)} [batch, heads, seq, head_dim], {dtype}, on {device}")

# %% tags=["remove-input"]
QWEN = {"H100 Qwen": borrowed.TRACELENS["h100_qwen"], "MI300X Qwen": borrowed.TRACELENS["mi300x_qwen"]}
borrowed.traces_box(QWEN)

# %% [markdown]
# ## One call replaces the module
#
# Everything `NaiveAttention` did (scores, scale, causal mask, softmax, weighted sum) is now one
# line. It agrees with the float64 reference, and with chapter 2's module up to rounding (the
# backends sum in another order):

# %%
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

# %% tags=["remove-input"]
verdict = reference.judge(out, q, k, v, causal=True)
lesson(verdict.ok, "SDPA matches the float64 reference within its dtype's tolerance",
       f"largest error {verdict['out'].error:.1e}, bound {verdict['out'].bound:.1e}")
both = reference.judge(kernels.get("inplace")(q, k, v), q, k, v, causal=True)
lesson(both.ok, "so does chapter 2's in-place module", f"largest error {both['out'].error:.1e}")

# %% [markdown]
# ## Which backend ran?
#
# SDPA walks its backends in priority order and takes the first whose checks pass for these
# inputs (device, dtype, head dim, mask, lengths). The rule a reader needs: **the order is not
# the same on every GPU.** By default it is flash, memory-efficient, math, cuDNN; torch 2.11 to
# 2.13 put cuDNN first on compute capability 9.x and 10.x (H100, H200, B200) when the runtime
# cuDNN is newer than 9.15, as the one their wheels ship: pin the backend you mean to profile.
# `sdpa.predictions` asks PyTorch's rules (`sdpa.predicted_backend`) about a few GPUs:
#
# :::{dropdown} The version rules in full (torch 2.5 to 2.14)
# From `check_prefer_cudnn_attention` and the `can_use_*` checks in PyTorch's
# `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`. 2.5.0 tried cuDNN first on 9.x; 2.5.1
# made it opt-in after bugs (pytorch/pytorch#138522); 2.9 put it first again on sm_90 and
# sm_100 (pytorch/pytorch#162073). In 2.11 to 2.13 the rule is the one above: cuDNN first on
# 9.x and 10.x when the runtime cuDNN is newer than 9.15.0 (2.11 ships 9.19, 2.12 and 2.13 ship
# 9.20). One exception: a torch built against CUDA 12 applies it only to 9.0, 10.0 and 10.3.
# `TORCH_CUDNN_SDPA_DEPRIORITIZED=1` or `torch.backends.cuda.enable_cudnn_sdp(False)` keeps it in
# its default place; `sdpa_kernel([...], set_priority=True)` imposes your order. Deterministic
# algorithms reorder nothing: cuDNN fails its check and the next backend runs (with
# `warn_only=True`, cuDNN runs). Accepted head dims change too: cuDNN takes up to 128, or 256 on
# capability 9.0 with cuDNN 9.10+ in torch 2.13; from 2.14, 256 needs cuDNN newer than 9.22 (on
# 9.0 and 10.x), and with gradients dims between 128 and 256 are refused.
# `sdpa.predicted_backend` follows the running torch (`torch_version=` asks about another).
# :::

# %%
sdpa.predictions()

# %% tags=["remove-input"]
predictions = sdpa.predictions()
lesson(predictions["unpinned SDPA picks"].tolist()[:2] == ["sdpa_flash", "sdpa_cudnn"],
       "by PyTorch's rules the same bf16 call picks flash on an A100, cuDNN on an H200 (cuDNN 9.20)")

# %% [markdown]
# PyTorch warns why it refuses a backend if you pass the call's parameters to that backend's
# check with `debug=True`: `torch.backends.cuda.can_use_flash_attention(torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, False), debug=True)`
# (a CPU-only build just returns False). Here `sdpa.default_backend_name` reads PyTorch's choice
# and `sdpa.probe` tries each backend pinned alone (its table of
# refusals is folded):

# %% tags=["hide-output"]
chosen = sdpa.default_backend_name(q, k, v)
probed = sdpa.probe(q, k, v)
sdpa.reasons_table(probed)

# %% tags=["remove-input"]
lesson(torch.equal(out, kernels.get(chosen)(q, k, v)), f"unpinned SDPA is exactly the {chosen} backend pinned")
glue("default_backend", chosen)
if device.type == "cpu":
    lesson(chosen == "sdpa_flash", "on a CPU, unpinned SDPA uses PyTorch's CPU flash kernel")
    lesson(probed["sdpa_efficient"] is not None and probed["sdpa_cudnn"] is not None,
           "the memory-efficient and cuDNN backends have no CPU kernel: they refuse to run")
    lesson(probed["sdpa_math"] is None and probed["sdpa_flash"] is None, "math and flash both run on a CPU")
else:  # the rules, asked about this GPU, must name what SDPA picked
    predicted = sdpa.predicted_backend_here(device, dtype, head_dim)
    lesson(chosen == predicted, "on this GPU, SDPA picked the backend its priority rules predict", chosen)

# %% [markdown]
# Pin a backend with `torch.nn.attention.sdpa_kernel`, as the article's scripts do; the book's
# `kernels.get("sdpa_math")` and siblings wrap it, and fail with PyTorch's reason rather than
# fall back:

# %%
with sdpa_kernel([SDPBackend.MATH]):
    out_math = F.scaled_dot_product_attention(q, k, v, is_causal=True)

# %% tags=["remove-input"]
lesson(torch.equal(out_math, kernels.get("sdpa_math")(q, k, v)),
       "the book's sdpa_math is SDPA pinned to the math backend, bit for bit")

# %% [markdown]
# ## The chain on a real GPU
#
# On a GPU a trace records SDPA's whole chain: the call, the backend op it chose, the launch on
# the CPU, the kernel on a GPU stream. No GPU ran this page: we read H100 Qwen and MI300X Qwen,
# whose every layer calls SDPA with 16-bit, causal inputs of head dim 64. Which backend and
# kernel do you expect on each GPU? `ch03.chain_figure` draws each trace's first call:

# %%
#| caption: The first of the model's SDPA calls in H100 Qwen (top) and MI300X Qwen (bottom), one row per level: the call, the backend op SDPA chose (`_scaled_dot_product_flash_attention`), the ops inside it (transposes, `_flash_attention_forward`), the ops inside that, the CPU runtime call that launched each kernel, and the kernel on the GPU, with a line from each launch to its kernel. Light grey: views and allocations (the shortest unnamed).
#| alt: Two panels. H100: the call, the flash backend op, three short transposes then the forward op, a few allocations, one launch, and on the GPU flash_fwd_kernel, which starts after the call has returned. MI300X: the same ops, a zeros op that fills a buffer, two launches, and on the GPU a tiny fill kernel then attn_fwd.
steps = {name: trace.step() for name, trace in QWEN.items()}
calls = {name: ch03.recorded_calls(st) for name, st in steps.items()}
first_call = {name: ch03.call_step(steps[name], c[0]) for name, c in calls.items()}
ch03.chain_figure(first_call)

# %% [markdown]
# `ch03.chain` gives H100 Qwen's chain as a table, with times (folded):

# %% tags=["hide-output"]
ch03.chain(first_call["H100 Qwen"], indent=True, allocations=False)

# %% tags=["remove-input"]
chains = {name: ch03.chain(call, indent=True) for name, call in first_call.items()}
launches = {name: [n.strip("· ") for n in tree.index[tree["kind"] == "runtime"]] for name, tree in chains.items()}
lesson(launches["H100 Qwen"] == ["cudaLaunchKernel"] and "hipModuleLaunchKernel" in launches["MI300X Qwen"],
       "one cudaLaunchKernel on the H100; the MI300X launches its attention kernel as a module",
       ", ".join(launches["MI300X Qwen"]))
h100_chain = chains["H100 Qwen"]
h100_kernel_start = h100_chain.loc[h100_chain["kind"] == "GPU kernel", "starts (µs)"].iloc[0]
lesson(h100_kernel_start > h100_chain["takes (µs)"].iloc[0], "on the H100 the kernel starts after the call returned",
       f"at {h100_kernel_start} vs {h100_chain['takes (µs)'].iloc[0]} µs")

# %% [markdown]
# On both GPUs the call nests the same two ops: `_scaled_dot_product_flash_attention` (the
# backend SDPA chose) and `_flash_attention_forward`, with the transposes chapter 3b reads between
# them (short grey bars). Below them the vendors part: the H100 runs FlashAttention-2's
# `flash_fwd_kernel`; PyTorch's ROCm build runs AMD's `attn_fwd` (a Triton kernel compiled ahead
# of time), after a tiny kernel filling a buffer `zeros` allocated.
#
# Why flash? The trace recorded what the backend rules look at: the call's `Input Dims`,
# `Input type` and `Concrete Inputs`. `ch03.recorded_calls` reads them:

# %%
pd.DataFrame({name: c[0].summary() for name, c in calls.items()})

# %% tags=["remove-input"]
for name, cs in calls.items():
    lesson(len({(str(c.q), c.dtype, c.is_causal, c.attn_mask is None, c.backend) for c in cs}) == 1,
           f"all {len(cs)} SDPA calls in {name} share their inputs and backend", str(cs[0].backend))
h100_trace = QWEN["H100 Qwen"].trace()
h100_call = calls["H100 Qwen"][0]
h100_cap = tuple(h100_trace.device_properties[0][f"compute{part}"] for part in ("Major", "Minor"))
h100_torch = QWEN["H100 Qwen"].torch_version(h100_trace)
lesson(h100_call.rules_reason() is None, "the recorded call fits the rules: no mask or dropout, causal, Sq == Sk",
       f"q {h100_call.q}" + ("" if h100_call.k == h100_call.q else f", k {h100_call.k}"))
rules_say = sdpa.predicted_backend(h100_cap, h100_call.dtype, h100_call.head_dim, torch_version=h100_torch)
lesson(rules_say == h100_call.backend, f"torch {h100_torch}'s rules on capability {h100_cap[0]}.{h100_cap[1]} "
       "pick flash, as the trace shows", rules_say)
today = sdpa.predicted_backend(h100_cap, h100_call.dtype, h100_call.head_dim, cudnn_version=92000, torch_version="2.13.0")
lesson(today == "sdpa_cudnn", "under torch 2.13 and its cuDNN 9.20 the same call would take cuDNN", today)
glue_all(qwen_h100_torch=h100_torch, qwen_calls=len(calls["H100 Qwen"]))

# %% [markdown]
# Flash was first in line: the trace's torch, {glue:text}`qwen_h100_torch`, came after 2.5.1 made
# cuDNN opt-in and before 2.9 put it first again on an H100. The backend is a fact about the inputs, the GPU *and* the torch
# version. (CUDA's rules do not cover the MI300X; ROCm took flash too.)

# %% [markdown]
# ## Profile the math backend
#
# Same schedule and inputs, with chapter 2's in-place module profiled beside it. Its trace shows
# five steps (matmul, scale, mask, softmax, matmul) and a small `copy_` turning the Python scale
# into a tensor. How many ops doing work (no views, no bare allocations) do you expect one
# math-backend forward to run here?

# %%
guess_math_work_ops = 8  # edit me before running on

# %%
runs = {name: record.profile(kernels.get(name), q, k, v, label=name, active=active_steps,
                             trace_dir=trace_dir)
        for name in ["inplace", "sdpa_math"]}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}
work_ops = {name: len(s.work_ops()) for name, s in step.items()}  # no views, no bare allocations

# %% tags=["remove-input"]
reveal(guess_math_work_ops, work_ops["sdpa_math"], "ops doing work in one math-backend forward")
lesson(work_ops["sdpa_math"] > work_ops["inplace"], "the math backend runs more ops doing work per forward than "
       "the in-place module", f"{work_ops['sdpa_math']} vs {work_ops['inplace']}")
inplace_work = step["inplace"].work_ops()
lesson("aten::copy_" in inplace_work, "the in-place module runs its five steps plus the scale's small copy_",
       ", ".join(n.removeprefix("aten::") for n in inplace_work))
glue_all(math_ops=work_ops["sdpa_math"], inplace_ops=work_ops["inplace"])
# The math backend's GPU run, where there is one: this run's own on a GPU, else the book's recording.
# No borrowed trace ran the math backend, so without either the GPU checks of this page stay silent.
gpu_steps, gpu_source, gpu_capability = recorded.gpu_steps(device, step, "03_sdpa", ["inplace", "sdpa_math"])
if gpu_steps:
    say(f"GPU run: {gpu_source}")
if {"sdpa_math", "inplace"} <= set(gpu_steps):
    n_kernels = {n: int((gpu_steps[n].gpu_work["cat"] == "kernel").sum()) for n in ("inplace", "sdpa_math")}
    lesson(n_kernels["sdpa_math"] > n_kernels["inplace"], "the math backend launches more GPU kernels per forward "
           "than the in-place module", f"kernels per forward: {n_kernels}, {gpu_source}")

# %% [markdown]
# ## The math backend: one line, more work
#
# The article's first surprise: on its A100 the math backend launched **20 kernels** per
# forward against the in-place version's **5**, and ran 3.7x slower (7.239 against 1.955 ms of
# GPU time); here the ops inflate alike. `sdpa.math_decomposed` writes it out one ATen op a line,
# in the order ATen's `_scaled_dot_product_attention_math` runs them (folded; its causal mask
# is aligned bottom-right, ATen's top-left: the same here, where Sq = Sk):

# %% tags=["hide-output"]
show_lines(sdpa.math_decomposed, "out_dtype = q.dtype", "return (probs @ v)")

# %% tags=["remove-input"]
lesson(torch.equal(sdpa.math_decomposed(q, k, v), kernels.get("sdpa_math")(q, k, v)),
       "math_decomposed returns the math backend's output bit for bit (at Sq = Sk)")

# %% [markdown]
# Which ops are new? Chapter 2's `tracediff.diff` matches the forwards op by op (name and input
# shapes) and keeps the rows whose count or bytes differ:

# %%
changes = tracediff.diff(runs["inplace"].steps(), runs["sdpa_math"].steps())
fig = changes.figure()

# %% tags=["remove-input"]
#| caption: The rows that differ between the in-place module and SDPA's math backend (the 12 whose self time changed most), each labelled with its op, its largest input, the count per forward (in-place → math), the memory it allocates, and its part in the forward. Red: ops only the in-place forward runs (its cached mask applied with `masked_fill_`, its scale on the S×S scores). Blue: ops only the math backend runs (the mask built anew, the scale split over q and k, its softmax's NaN guard). `fill_` on an S×S tensor is `ones` filling the mask it allocated; the mask's `where` counts twice because a `where` with scalar arguments calls the tensor `where` inside itself.
#| alt: Horizontal bar chart of self time per changed op: two red bars for inplace-only ops and about ten blue bars for math-backend-only ops such as isneginf, all, where, tril and add_.
ch03.without_matched_times(fig, changes, seq)
only_inplace, only_math = changes.only_in("inplace"), changes.only_in("sdpa_math")
inplace_muls, math_muls = (d.loc[d["name"] == "aten::mul", "shapes"] for d in (only_inplace, only_math))
views = set(runs["inplace"].steps()[0].ops.query("is_view")["name"])
lesson("aten::masked_fill_" in set(only_inplace["name"]) and inplace_muls.str.startswith(str((batch, heads, seq, seq))).any(),
       "only the in-place module applies a cached mask with masked_fill_ and scales the S×S scores",
       ", ".join(sorted(n.removeprefix("aten::") for n in set(only_inplace["name"]) - views)))
lesson({"aten::ones", "aten::tril", "aten::where", "aten::add_"} <= set(only_math["name"]),
       "only the math backend builds the causal mask (ones, tril, where) and adds it (add_)")
lesson(all(math_muls.str.startswith(str(dims)).any() for dims in ((batch, heads, seq, head_dim), (batch, heads, head_dim, seq))),
       "the math backend scales q and k (S×D), not the S×S scores",
       "inputs " + " and ".join(s.split(")")[0] + ")" for s in math_muls))
bmm_differs = "aten::bmm" in set(changes.changed()["name"])
lesson(bmm_differs == (dtype != torch.float32),
       f"in this {str(dtype).replace('torch.', '')} run the matmuls {'differ' if bmm_differs else 'match row for row'}"
       " (at 16 bits the math backend's are float32)")
fig

# %% [markdown]
# Read which rows changed, not the bars' lengths (on a shared CPU an op's self time varies more
# between runs than between forwards). Three costs have no counterpart in chapter 2's module.
#
# ### 1. The fp32 upcast
#
# The math backend values accuracy over speed: bfloat16 or float16 inputs become float32 first,
# and so does every S×S intermediate (`torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`
# turns this off). This run is {glue:text}`run_dtype`, so one small bfloat16 forward shows the
# conversion (table folded):

# %% tags=["hide-output"]
q16, k16, v16 = inputs(1, 2, 64, 16, dtype=torch.bfloat16, device=device)
small = record.profile(kernels.get("sdpa_math"), q16, k16, v16, label="sdpa_math_bf16",
                       wait=0, warmup=1, active=1, trace_dir=trace_dir).step()
pd.Series(ch03.dtype_casts(small), name="in one bfloat16 forward").to_frame()

# %% tags=["remove-input"]
glue("run_dtype", str(dtype).replace("torch.", ""))
casts = ch03.dtype_casts(small)  # copy_ shapes: bf16 -> float32 (up) and back (down)
lesson(casts["upcasts"] == [list(q16.shape)] * 3, "the math backend copies q, k and v from bfloat16 to float32 on every call")
lesson(casts["matmul input types"] == "float32 × float32", "both of its matmuls then run in float32")
lesson([64, 64] in [d[-2:] for d in casts["downcasts"]],
       "it also converts the S×S probabilities back to bfloat16", "a copy_ of a [..., 64, 64] tensor")

# %% [markdown]
# The probabilities go back because the math backend returns them with the output (SDPA drops
# them). On a GPU the float32 matmul is what makes it slow, and a GEMM's kernel name says which
# hardware ran it (the article's Figures 10 and 11). Two [cuBLAS](glossary.md#cublas) names from
# Ampere, decoded (table folded):

# %% tags=["hide-output"]
classify_many(["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "ampere_sgemm_128x64_nn"])

# %% tags=["remove-input"]
gemms = classify_many(["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "ampere_sgemm_128x64_nn"])
lesson(gemms["tensor_cores"].tolist() == [True, False],
       "s16816 names a bf16 tensor-core GEMM; sgemm names an fp32 GEMM on CUDA cores")
if "sdpa_math" in gpu_steps:
    display(ch03.math_gemms_not_16bit(gpu_steps["sdpa_math"], gpu_source))

# %% [markdown]
# `s16816`, the naive module's, is the [tensor-core](glossary.md#tensor-core) instruction
# (m16n8k16), accumulating in fp32; the math backend's `sgemm` runs on ordinary CUDA cores. The
# upcast moves twice the bytes and, with PyTorch's default of no [TF32](glossary.md#tf32) for
# matmuls, leaves the tensor cores idle (`torch.backends.cuda.matmul.allow_tf32 = True` runs it in
# TF32, under another name).
#
# ### 2. The causal mask, rebuilt on every call
#
# Chapter 1 cached its mask. With `is_causal=True` the math backend builds it every forward:
# `ones` (an S×S boolean tensor), `tril` (keep the lower triangle), `where` (an additive bias of
# 0 and $-\infty$), then `add_` to the scores, as the article saw (its Figure 12).
# `ch03.mask_build_order` finds them in every recorded forward (folded):

# %% tags=["hide-output"]
order = pd.DataFrame([ch03.mask_build_order(s, seq, seq) for s in runs["sdpa_math"].steps()])
order.rename_axis("step").T.rename_axis("position among the forward's ops")

# %% tags=["remove-input"]
per_step = [ch03.mask_build_order(s, seq, seq) for s in runs["sdpa_math"].steps()]
lesson(all(None not in m.values() for m in per_step),
       f"every recorded math forward builds the causal mask anew ({len(per_step)} of {len(per_step)} steps)")
lesson(all(m["ones"] < m["tril"] < m["where"] for m in per_step), "in the order ones -> tril -> where")
lesson(not step["sdpa_math"].find("aten::add_").empty, "and adds it to the scores with add_")
if "sdpa_math" in gpu_steps:
    tril_kernels = [mentions_op(n, "triu_tril") for n in gpu_steps["sdpa_math"].gpu_work["name"]]
    lesson(any(tril_kernels), "on the GPU track the mask shows up as a triu_tril kernel", gpu_source)

# %% [markdown]
# ### 3. The safe softmax
#
# Chapter 1 called `softmax`; the math backend calls `_safe_softmax`, which adds three passes
# over the S×S scores (`isneginf`, `all` per row, `where`) to zero any row whose every score is
# $-\infty$. A causal mask never makes one (each query sees itself), but a boolean `attn_mask`,
# say for padding, can, and a plain softmax computes $0/0$ there:

# %%
scores = torch.tensor([[0.5, -1.0, float("-inf"), 2.0], [float("-inf")] * 4], device=device, dtype=dtype)
print("plain softmax:\n", torch.softmax(scores, dim=-1),
      "\nsafe softmax:\n", sdpa.safe_softmax(scores, dim=-1))

# %% tags=["remove-input"]
math_ops = step["sdpa_math"].ops
safe = step["sdpa_math"].find("aten::_safe_softmax")
children = set(math_ops.loc[math_ops["parent"].isin(safe.index), "name"])
lesson(len(safe) == 1 and {"aten::softmax", "aten::isneginf", "aten::all", "aten::where"} <= children,
       "_safe_softmax adds isneginf, all and where as NaN guards", "inside it: " + ", ".join(sorted(n.removeprefix("aten::") for n in children)))
plain, guarded = torch.softmax(scores, dim=-1), sdpa.safe_softmax(scores, dim=-1)
lesson(bool(torch.isnan(plain[1]).all()) and not torch.isnan(plain[0]).any(),
       "a plain softmax turns a fully masked row into NaN", f"on {device.type}")
lesson(torch.equal(guarded[1], torch.zeros_like(guarded[1])) and torch.equal(guarded[0], plain[0]),
       "the safe softmax returns zeros there and the plain softmax everywhere else")
qm, km, vm = inputs(1, 1, 4, 8, dtype=dtype, device=device)
allowed = torch.ones(4, 4, dtype=torch.bool, device=device).tril()
allowed[2] = False  # query 2 may attend to nothing
with sdpa_kernel([SDPBackend.MATH]):
    masked_out = F.scaled_dot_product_attention(qm, km, vm, attn_mask=allowed)
lesson(torch.equal(masked_out[0, 0, 2], torch.zeros_like(masked_out[0, 0, 2]))
       and not torch.isnan(masked_out).any(), "SDPA math gives a fully masked query zeros, not NaN")

# %% [markdown]
# So the math backend is chapter 1's attention done carefully: dtype-safe, NaN-safe, correct for
# any mask, the fallback that always runs. Its price shows in one forward's timeline, a wall of
# ops over S×S tensors:

# %%
fig = timeline.timeline(step["sdpa_math"], title=f"SDPA math backend: one forward ({device.type})")

# %% tags=["remove-input"]
#| caption: One forward of SDPA's math backend: ordinary ATen ops, one after another under a single `scaled_dot_product_attention` call, most of them over an S×S tensor. The call and `_scaled_dot_product_attention_math` get a colour of their own here (the timeline's name rule would call them fused attention: they only wrap the ops below), and the ops inside `_safe_softmax`, its NaN guard included, the softmax's green.
#| alt: Timeline of the math backend's forward: the SDPA call and the math op on top, and many short ops nested beneath them across the whole step: mul, the mask's ones, tril and where, the matmuls, add_, and _safe_softmax with its guard ops.
ch03.math_timeline_colours(fig, step["sdpa_math"])

# %%
links(runs["sdpa_math"])

# %% [markdown]
# ## So far
#
# This page's profiles, one row per variant (on a GPU, with kernels and GPU time; no CPU time: a
# profiled step is a poor clock, chapter 0):

# %% tags=["remove-input"]
display(ch03.so_far(step, work_ops, device))

# %% [markdown]
# ## What to remember
#
# - One call is not one kernel: the math backend is attention in primitive ops, made careful
#   (fp32 upcast, a mask rebuilt per call, NaN guards), and it pays for each.
# - The backend depends on the GPU, dtype, head dim, lengths and a priority order that differs
#   between GPUs: pin one to profile it, and ask PyTorch (`debug=True`) why it refused another.
# - Diff two forwards op by op (`tracediff.diff`) to see what one adds over the other.
#
# Next: [3b. The fused backends](03b_sdpa_fused.ipynb), all of this in one kernel.
#
# **Practice:** [the exercises for this chapter](exercises/03_sdpa.ipynb), with automatic checks, hints and hidden solutions.
