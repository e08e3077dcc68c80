# %% [markdown]
# # 3. One call: `scaled_dot_product_attention`
#
# Chapters 1 and 2 wrote attention by hand. PyTorch has it as one function,
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` ([SDPA](glossary.md#sdpa)), and
# behind that one call sit several implementations, called *backends*: a plain-PyTorch
# **math** fallback, a CUTLASS **memory-efficient** [kernel](glossary.md#kernel), **FlashAttention-2**, and **cuDNN**'s generated
# kernel. SDPA picks one per call; we can pin one and profile it on its own.
#
# The guess most of us make: one call instead of five ops, so the trace gets simpler. For
# the fused backends that is true. For the math backend it is spectacularly false, and the
# reasons (an fp32 upcast, a mask rebuilt on every call, a NaN guard) are what this
# chapter reads out of the trace. This part is about the call itself: which backend SDPA
# picks and why, and the math backend taken apart. The fused backends, their single
# kernels, their [occupancy](glossary.md#occupancy) and their memory are the [second part](03b_sdpa_fused.ipynb).
#
# **You will learn to:**
#
# - say which SDPA backend a call takes and why (the priority order, each backend's checks,
#   `debug=True`), and pin one to profile it alone;
# - follow one SDPA call in a real GPU trace down to its kernel, on an NVIDIA H100 and an AMD
#   MI300X, and check the backend it took against the rules, from the inputs the trace recorded;
# - diff the math backend against chapter 2's module op by op, and read its extra ops in the
#   trace;
# - find the math backend's three costs: the fp32 upcast (and the [GEMM](glossary.md#gemm) kernel names that show
#   it), a causal mask rebuilt on every call, and the NaN guards of `_safe_softmax`.
#
# **Before you start:** [1. Attention by hand](01_naive.ipynb) and [2. In
# place](02_inplace.ipynb): their module and `tracediff.diff` are what this chapter compares
# against. The float dtypes: bf16, fp16 and fp32.
#
# **Time:** about {reading_minutes} min to read.

# %% [install]

# %% [parameters]

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F

import kernels
import kernels.attention.sdpa
from kernels import borrowed, gpu_lessons, recorded, reference
from kernels.notebook import glue, glue_all, inputs, lesson, reveal, say, setup, show_lines
from kernels.trace import diff as tracediff, reader, record, tables, timeline
from kernels.trace.fingerprints import classify_many, mentions_op
from kernels.trace.links import links

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
lesson(verdict.ok, "SDPA matches the float64 reference within its dtype's tolerance", str(verdict))
both = reference.judge(kernels.get("inplace")(q, k, v), q, k, v, causal=True)
lesson(both.ok, "so does the hand-written in-place module: the two agree within that tolerance",
       f"SDPA {verdict['out'].error:.1e}, in-place {both['out'].error:.1e}, bound {verdict['out'].bound:.1e}")

# %% [markdown]
# ## Which backend ran?
#
# SDPA walks its backends in a priority order and takes the first whose checks pass for
# these inputs (device, dtype, head dim, mask, sequence lengths). The order is not fixed.
# By default it is flash, memory-efficient, math, cuDNN; but torch 2.11 to 2.13 move cuDNN
# to the front on compute capability 9.x and 10.x (H100, H200, B200) when the runtime cuDNN
# is newer than 9.15.0 (a torch built against CUDA 12 does it on minor versions 0 and 3
# only: sm_90, sm_100, sm_103), unless the environment sets `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`
# or `torch.backends.cuda.enable_cudnn_sdp(False)` turns it off; and
# `sdpa_kernel([...], set_priority=True)` imposes an order of your own. Deterministic
# algorithms do not reorder anything: cuDNN then fails its own check and the next backend in
# line runs, unless `torch.use_deterministic_algorithms(True, warn_only=True)` asked only for
# warnings, in which case cuDNN still runs. So the same
# unpinned bf16 causal call picks flash on an A100 and cuDNN on an H200.
# `kernels.attention.sdpa.predicted_backend` writes those rules down as a pure function of the GPU.
# They are read from PyTorch's own checks, `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`,
# as torch 2.13 has them: `check_prefer_cudnn_attention` for the order, and each backend's
# `can_use_*` constraints for what it accepts. PyTorch changes them from release to release:
# cuDNN, for instance, takes head dims up to 128, or up to 256 on compute capability 9.0 with
# cuDNN 9.10 or newer in torch 2.13; from torch 2.14 on, 256 needs a cuDNN newer than 9.22 (on
# 9.0 and 10.x), and with gradients the dims between 128 and 256 are refused. The function
# follows the torch it runs with (`torch_version=` asks about another), so read them again
# for a newer version:

# %%
predictions = kernels.attention.sdpa.predictions()   # kernels.attention.sdpa.PREDICTION_CASES, through the rules above
display(predictions)
lesson(predictions["unpinned SDPA picks"].tolist()[:2] == ["sdpa_flash", "sdpa_cudnn"],
       "by PyTorch's rules the same bf16 call picks flash on an A100 and cuDNN on an H200 (cuDNN 9.20)")

# %% [markdown]
# To ask PyTorch itself why a backend was refused, build the call's parameters and ask each
# backend's check with `debug=True`: it warns with the reason, e.g.
# `torch.backends.cuda.can_use_flash_attention(torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, False), debug=True)`
# (`can_use_efficient_attention` and `can_use_cudnn_attention` likewise; on a CPU-only build
# they simply return False). PyTorch exposes the final decision as `torch._fused_sdp_choice`;
# `kernels.attention.sdpa.default_backend_name` translates it into this book's names, and
# `kernels.attention.sdpa.probe` simply tries every backend pinned on its own:

# %%
chosen = kernels.attention.sdpa.default_backend_name(q, k, v)
probed = kernels.attention.sdpa.probe(q, k, v)
display(kernels.attention.sdpa.reasons_table(probed))

lesson(torch.equal(out, kernels.get(chosen)(q, k, v)), f"unpinned SDPA is exactly the {chosen} backend pinned",
       "bit-identical outputs")
glue("default_backend", chosen)

# %% tags=["remove-input"]
# On a GPU run only: the rules above, asked about this machine, must name what SDPA picked.
if device.type == "cuda":
    predicted = kernels.attention.sdpa.predicted_backend_here(device, dtype, head_dim)
    lesson(chosen == predicted, "on this GPU, SDPA picked the backend its priority rules predict", chosen)

# %% [markdown]
# Here the unpinned call picked **{glue:text}`default_backend`**. Pinning is done with the
# `torch.nn.attention.sdpa_kernel` context manager, as the source article's scripts do.
# This book wraps each backend in a function that pins it, so `sdpa_math` is always the
# math backend and fails loudly (with PyTorch's own reason) rather than quietly falling
# back to another one. On this machine the table above already says which backends
# refuse these inputs, and why:

# %%
show_lines(kernels.attention.sdpa.pinned)
if device.type == "cpu":
    lesson(chosen == "sdpa_flash", "on a CPU, unpinned SDPA uses PyTorch's CPU flash kernel")
    lesson(probed["sdpa_efficient"] is not None and probed["sdpa_cudnn"] is not None,
           "the memory-efficient and cuDNN backends have no CPU kernel and refuse to run here")
    lesson(probed["sdpa_math"] is None and probed["sdpa_flash"] is None,
           "math and flash both run on a CPU")

# %% [markdown]
# ## The chain on a real GPU: an H100 and an MI300X
#
# This machine's call stops at a CPU kernel. On a GPU, SDPA's backend op launches a kernel,
# and a trace records the whole chain: the call, the backend it chose, the launch on the CPU,
# the kernel on a GPU stream. No GPU ran this page, so we read a real trace that others
# recorded: one forward of a Qwen1.5-0.5B chat model in bfloat16, whose every layer calls
# `scaled_dot_product_attention`, profiled on an NVIDIA H100 and on an AMD MI300X. Before
# reading on: its inputs are 16-bit, causal, and have a head dim of 64. Which backend do
# you expect on each GPU, and which kernel?

# %%
qwen = {gpu: borrowed.TRACELENS[f"{gpu}_qwen"] for gpu in ("h100", "mi300x")}
qwen_trace = {gpu: entry.trace() for gpu, entry in qwen.items()}
qwen_step = {gpu: qwen[gpu].step(trace=qwen_trace[gpu]) for gpu in qwen}
qwen_calls = {gpu: kernels.attention.sdpa.recorded_calls(qwen_step[gpu]) for gpu in qwen}
first_call = {gpu: kernels.attention.sdpa.call_step(qwen_step[gpu], calls[0]) for gpu, calls in qwen_calls.items()}
for gpu in qwen:
    say(qwen[gpu].credit(qwen_trace[gpu]))

# %%
#| caption: The first of the model's SDPA calls on each GPU, from the borrowed traces (credited above; not this book's run). Top rows: the CPU thread, the call and the ops nested in it; bottom row: the GPU stream, with a line from each launch to the kernel it queued.
#| alt: Two timelines. H100: scaled_dot_product_attention, then _scaled_dot_product_flash_attention, then _flash_attention_forward on the CPU, and one flash_fwd_kernel on the GPU stream. MI300X: the same three ops, a small fill op, and on the GPU a tiny fill kernel then attn_fwd.
fig, axes = plt.subplots(2, 1, figsize=(9, 6.5))
for ax, gpu in zip(axes, qwen):
    timeline.timeline(first_call[gpu], ax=ax, title=f"{qwen[gpu].gpu(qwen_trace[gpu])}: one SDPA call")
fig.tight_layout()

# %% [markdown]
# The same chain as a table, one row per op, per launch and per kernel, indented by nesting
# (`kernels.attention.sdpa.chain`; the views' own `as_strided` are left out):

# %%
chains = {gpu: kernels.attention.sdpa.chain(call, indent=True) for gpu, call in first_call.items()}
for gpu, tree in chains.items():
    say(f"On the {qwen[gpu].gpu(qwen_trace[gpu])}:")
    display(tree)
launches = {gpu: [n.strip("· ") for n in tree.index[tree["kind"] == "runtime"]] for gpu, tree in chains.items()}
lesson(launches["h100"] == ["cudaLaunchKernel"] and "hipModuleLaunchKernel" in launches["mi300x"],
       "one cudaLaunchKernel on the H100; on the MI300X the attention kernel is launched as a module",
       "; ".join(f"{gpu}: {', '.join(names)}" for gpu, names in launches.items()))
h100_kernel_start = chains["h100"].loc[chains["h100"]["kind"] == "GPU kernel", "starts (µs)"].iloc[0]
lesson(h100_kernel_start > chains["h100"]["takes (µs)"].iloc[0], "on the H100 the kernel starts after the call returned",
       f"kernel at {h100_kernel_start} µs, call over at {chains['h100']['takes (µs)'].iloc[0]} µs")

# %% [markdown]
# On both GPUs the call nests the same two ops: `_scaled_dot_product_flash_attention` (the
# backend SDPA chose) and `_flash_attention_forward`, with the transposes of part two between
# them. Below them the vendors part. On the H100 one `cudaLaunchKernel` queues FlashAttention-2's
# `flash_fwd_kernel`; the kernel starts on the GPU after the CPU has already left the call.
# On the MI300X PyTorch's ROCm build runs the same flash op on AMD's `attn_fwd` (a Triton
# kernel compiled ahead of time, launched as a module with `hipModuleLaunchKernel`), after a
# tiny fill kernel that zeroes a one-element integer buffer.
#
# Why flash? The trace recorded the call's inputs (`Input Dims`, `Input type`, and the values
# of its scalar arguments, `Concrete Inputs`): that is everything the backend rules look at.
# `kernels.attention.sdpa.recorded_calls` reads them for every call of the step:

# %%
display(pd.DataFrame({qwen[gpu].gpu(qwen_trace[gpu]): {"calls": len(calls), **calls[0].summary()}
                     for gpu, calls in qwen_calls.items()}).T)
for gpu, calls in qwen_calls.items():
    lesson(len({(str(c.q), c.dtype, c.is_causal, c.attn_mask is None, c.backend) for c in calls}) == 1,
           f"all {len(calls)} SDPA calls on the {gpu.upper()} have the same inputs and took the same backend", str(calls[0].backend))
h100_call = qwen_calls["h100"][0]
h100_cap = tuple(qwen_trace["h100"].device_properties[0][f"compute{part}"] for part in ("Major", "Minor"))
h100_torch = qwen["h100"].torch_version(qwen_trace["h100"])
lesson(h100_call.rules_reason() is None, "the recorded call is one the backend rules above describe: no mask, no dropout, "
       "causal with Sq == Sk", f"q {h100_call.q}, k {h100_call.k}")
rules_say = kernels.attention.sdpa.predicted_backend(h100_cap, h100_call.dtype, h100_call.head_dim, torch_version=h100_torch)
lesson(rules_say == h100_call.backend, f"by the backend rules of torch {h100_torch} on compute capability "
       f"{h100_cap[0]}.{h100_cap[1]}, this call takes flash, and the trace shows flash ran", rules_say)
today = kernels.attention.sdpa.predicted_backend(h100_cap, h100_call.dtype, h100_call.head_dim, cudnn_version=92000,
                                                 torch_version="2.13.0")
lesson(today == "sdpa_cudnn", "the same call under torch 2.13 with its cuDNN 9.20 would take cuDNN instead", today)
glue_all(qwen_h100_torch=h100_torch, qwen_calls=len(qwen_calls["h100"]))

# %% [markdown]
# Every input the rules read is in the trace, the same for all {glue:text}`qwen_calls` calls:
# bfloat16, head dim 64, no `attn_mask` (its
# slot is empty), `is_causal=True` with equal query and key lengths, no dropout. Flash
# accepts all of that, and it was first in line: the trace's torch, {glue:text}`qwen_h100_torch`,
# predates torch 2.9, where cuDNN moved to the front on the H100 (pytorch/pytorch#162073; 2.5.1
# had made it opt-in after bugs in 2.5.0, #138522). Asked about a torch of today, the same rules put this call on cuDNN:
# the backend is a fact about the inputs, the GPU *and* the torch version. The MI300X's
# compute capability (9.4 in its trace) is AMD's numbering, not CUDA's, and the rules above
# are CUDA's; what the trace shows there is that PyTorch's ROCm build took the same
# flash backend for the same inputs and ran it on AMD's kernel. Part two reads that H100
# flash kernel's footprint.

# %% [markdown]
# ## Profile the math backend
#
# Same schedule as before, same inputs, one label per variant; chapter 2's in-place module
# is profiled again so that the comparisons below set like against like.
# Before the reveal: the hand-written module does five things (matmul, scale, mask,
# softmax, matmul). How many ops doing work (ops that compute: no views, no bare
# allocations) do you expect one forward of SDPA's math backend to run on this machine?

# %%
guess_math_work_ops = 8  # edit me before running on

# %%
variants = ["inplace", "sdpa_math"]
runs = {name: record.profile(kernels.get(name), q, k, v, label=name, active=active_steps, trace_dir=trace_dir)
        for name in variants}
step = {name: reader.median_step(r.steps()) for name, r in runs.items()}
work_ops = {name: len(s.work_ops()) for name, s in step.items()}  # no views, no bare allocations
reveal(guess_math_work_ops, work_ops["sdpa_math"], "ops doing work in one math-backend forward")
lesson(work_ops["sdpa_math"] > work_ops["inplace"], "the math backend dispatches more ops per forward than the "
       "hand-written in-place module", f"{work_ops['sdpa_math']} vs {work_ops['inplace']} ops doing work")
glue_all(math_ops=work_ops["sdpa_math"], inplace_ops=work_ops["inplace"])

# %% tags=["remove-input"]
# The math backend's GPU run, where there is one: this run's own on a GPU, else the book's recording.
# No borrowed trace ran the math backend, so without either the checks below it stay silent.
gpu_steps, gpu_source, gpu_capability = recorded.gpu_steps(device, step, "03_sdpa", variants)
if gpu_steps:
    say(f"GPU run: {gpu_source}")

# %% [markdown]
# ## The math backend: one line, more work
#
# The source article's first surprise: on its A100, the math backend launched **20
# kernels** per forward where the hand-written in-place version launched **5**, and its
# forward was 3.7x slower (7.239 ms against 1.955 ms of GPU time per forward). The CPU
# trace shows the same inflation as ops: {glue:text}`math_ops` ops doing work against
# {glue:text}`inplace_ops`.

# %% tags=["remove-input"]
if {"sdpa_math", "inplace"} <= set(gpu_steps):
    n_kernels = {n: int((gpu_steps[n].gpu_work["cat"] == "kernel").sum()) for n in ("inplace", "sdpa_math")}
    lesson(n_kernels["sdpa_math"] > n_kernels["inplace"], "the math backend launches more GPU kernels per forward "
           "than the in-place module", f"kernels per forward: {n_kernels}, {gpu_source}")

# %% [markdown]
# To see what those ops are, here is the math backend written out in Python, one ATen op per
# line, as `kernels.attention.sdpa.math_decomposed`. It mirrors ATen's
# `_scaled_dot_product_attention_math`:

# %%
show_lines(kernels.attention.sdpa.math_decomposed)

# %%
lesson(torch.equal(kernels.attention.sdpa.math_decomposed(q, k, v), kernels.get("sdpa_math")(q, k, v)),
       "math_decomposed returns the math backend's output bit for bit")
tables.op_table(step["sdpa_math"])

# %% [markdown]
# Which of those ops are new? `tracediff.diff`, chapter 2's tool, matches the in-place
# module's forward with the math backend's, op by op, by name *and* input shapes, keeps the
# rows whose count or allocated bytes differ, and gives each row's median self time over the
# recorded forwards:

# %%
changes = tracediff.diff(runs["inplace"].steps(), runs["sdpa_math"].steps())
changes.table()

# %%
#| caption: The rows that differ between the in-place module and SDPA's math backend, each bar a row's median self time over the recorded forwards. Red bars: ops only the in-place forward runs (its cached mask applied with `masked_fill_`, its scale on the S×S scores). Blue bars: ops only the math backend runs (the mask built anew, the scale split over q and k, its softmax's NaN guard).
#| alt: Horizontal bar chart of self time per changed op: two red bars for inplace-only ops and about ten blue bars for math-backend-only ops such as isneginf, all, where, tril and add_.
only_inplace, only_math = changes.only_in("inplace"), changes.only_in("sdpa_math")
inplace_muls, math_muls = (d.loc[d["name"] == "aten::mul", "shapes"] for d in (only_inplace, only_math))
lesson("aten::masked_fill_" in set(only_inplace["name"]) and inplace_muls.str.startswith(str((batch, heads, seq, seq))).any(),
       "only the in-place module applies a cached mask with masked_fill_ and scales the S×S scores",
       ", ".join(sorted(set(only_inplace["name"]))))
lesson({"aten::ones", "aten::tril", "aten::where", "aten::add_"} <= set(only_math["name"]),
       "only the math backend builds the causal mask (ones, tril, where) and adds it (add_)")
lesson(all(math_muls.str.startswith(str(dims)).any() for dims in ((batch, heads, seq, head_dim), (batch, heads, head_dim, seq))),
       "the math backend scales q and k, S×D tensors, instead of the S×S scores",
       ", ".join(math_muls))
lesson(("aten::bmm" in set(changes.changed()["name"])) == (dtype != torch.float32),
       "the matmuls differ only at 16 bits, where the math backend's run in float32", f"run in {dtype}")
changes.figure()

# %%
display(links(runs["inplace"]), links(runs["sdpa_math"]))

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
# The math backend values accuracy over speed: by default bfloat16 or float16 inputs are
# converted to float32 first, and every S×S intermediate is float32
# (`torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)` turns the upcast off). This run's inputs are
# {glue:text}`run_dtype`, so to watch the conversion on this device we profile one small
# bfloat16 forward:

# %%
glue("run_dtype", str(dtype).replace("torch.", ""))
q16, k16, v16 = inputs(1, 2, 64, 16, dtype=torch.bfloat16, device=device)
small = record.profile(kernels.get("sdpa_math"), q16, k16, v16, label="sdpa_math_bf16",
                       wait=0, warmup=1, active=1, trace_dir=trace_dir).step()
casts = kernels.attention.sdpa.dtype_casts(small)   # copy_ shapes: bf16 -> float32 (up) and back (down)
display(pd.Series(casts, name="in one bfloat16 forward").to_frame())
lesson(casts["upcasts"] == [list(q16.shape)] * 3, "the math backend copies q, k and v from bfloat16 to float32 on every call")
lesson(casts["matmul input types"] == {("float", "float")}, "both of its matmuls then run in float32")
lesson([64, 64] in [d[-2:] for d in casts["downcasts"]],
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
# `kernels.trace.fingerprints`:

# %%
gemm_names = {"naive (bf16)": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn",
              "SDPA math (upcast)": "ampere_sgemm_128x64_nn"}
gemms = classify_many(gemm_names.values()).assign(run=list(gemm_names))
display(gemms[["run", "name", "tensor_cores", "dtype", "note"]])
lesson(gemms["tensor_cores"].tolist() == [True, False],
       "s16816 names a bf16 tensor-core GEMM; sgemm names an fp32 GEMM on CUDA cores")

# %% [markdown]
# `s16816` is the [tensor-core](glossary.md#tensor-core) matrix instruction (m16n8k16) with fp32 accumulation; `sgemm`
# is single precision on the ordinary CUDA cores. The upcast moves twice the bytes and, with
# PyTorch's default of no TF32 for matmuls, leaves the tensor cores
# idle; with TF32 allowed (`torch.backends.cuda.matmul.allow_tf32 = True`), float32 GEMMs run
# on the tensor cores in TF32, and the name changes with them.

# %% tags=["remove-input"]
if "sdpa_math" in gpu_steps:
    display(gpu_lessons.math_gemms_not_16bit(gpu_steps["sdpa_math"], gpu_source))


# %% [markdown]
# ### 2. The causal mask, rebuilt on every call
#
# Chapter 1 built its mask once and cached it. With `is_causal=True` the math backend has
# no cache: every forward runs `ones` (an S×S boolean tensor), `tril` (keep the lower
# triangle) and `where` (turn it into an additive bias of 0 and $-\infty$), then adds it to
# the scores with `add_`. The article watched these ops on its CPU thread's track (its Figure 12);
# they are on ours too, in that order, in every recorded step:

# %%
per_step = [kernels.attention.sdpa.mask_build_order(s, seq, seq) for s in runs["sdpa_math"].steps()]
display(pd.DataFrame(per_step).rename_axis("recorded step (position of each op in the forward)"))
lesson(all(None not in m.values() for m in per_step),
       f"every recorded math forward builds the causal mask anew ({len(per_step)} of {len(per_step)} steps)")
lesson(all(m["ones"] < m["tril"] < m["where"] for m in per_step), "in the order ones -> tril -> where")
lesson(not step["sdpa_math"].find("aten::add_").empty, "and adds it to the scores with add_")

# %% tags=["remove-input"]
if "sdpa_math" in gpu_steps:
    tril_kernels = [mentions_op(n, "triu_tril") for n in gpu_steps["sdpa_math"].gpu_work["name"]]
    lesson(any(tril_kernels), "on the GPU track the mask shows up as a triu_tril kernel", gpu_source)

# %% [markdown]
# ### 3. The safe softmax
#
# Chapter 1 called `softmax`. The math backend calls `_safe_softmax`, which runs the
# softmax plus three more passes over the S×S scores: `isneginf`, `all` along each row,
# and a `where` that zeroes any row that was entirely masked:

# %%
math_ops = step["sdpa_math"].ops
safe = step["sdpa_math"].find("aten::_safe_softmax")
children = set(math_ops.loc[math_ops["parent"].isin(safe.index), "name"])
lesson(len(safe) == 1 and {"aten::softmax", "aten::isneginf", "aten::all", "aten::where"} <= children,
       "the math backend's softmax carries isneginf, all and where as NaN guards", f"inside _safe_softmax: {sorted(children)}")
show_lines(kernels.attention.sdpa.safe_softmax)

# %% [markdown]
# What does the guard protect against? A row whose every score is $-\infty$: nothing may be
# attended to. A causal mask never produces one (every query sees at least itself), but an
# arbitrary boolean `attn_mask`, say for a padding token, can. A plain softmax computes
# $e^{-\infty} / \sum e^{-\infty} = 0/0$ there:

# %%
scores = torch.tensor([[0.5, -1.0, float("-inf"), 2.0], [float("-inf")] * 4], device=device, dtype=dtype)
plain = torch.softmax(scores, dim=-1)
guarded = kernels.attention.sdpa.safe_softmax(scores, dim=-1)
print("plain softmax:\n", plain, "\nsafe softmax:\n", guarded)
lesson(bool(torch.isnan(plain[1]).all()) and not torch.isnan(plain[0]).any(),
       "a plain softmax turns a fully masked row into NaN", f"on {device.type}")
lesson(torch.equal(guarded[1], torch.zeros_like(guarded[1])) and torch.equal(guarded[0], plain[0]),
       "the safe softmax returns zeros there and the plain softmax everywhere else")

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
#| caption: One forward of SDPA's math backend: ordinary ATen ops, one after another under a single `scaled_dot_product_attention` call, most of them over an S×S tensor.
#| alt: Timeline of the math backend's forward: the SDPA call on top and many short ops nested beneath it across the whole step.
timeline.timeline(step["sdpa_math"], title=f"SDPA math backend: one forward ({device.type})")

# %%
links(runs["sdpa_math"])
# %% [markdown]
# ## So far
#
# One row per variant, from the profiles of this notebook: ops per forward (all of them,
# and those doing work), its peak memory, and on a GPU the kernels and their GPU time.

# %%
columns = ["ops", "peak_MiB"] + (["kernels", "gpu_time_ms"] if device.type == "cuda" else [])
so_far = pd.DataFrame([s.summary() for s in step.values()]).set_index("label")[columns].assign(**{"ops doing work": pd.Series(work_ops)})
display(so_far.round(2).rename_axis("variant"))

# %% [markdown]
# The table leaves out CPU time on purpose: a profiled step is a poor clock (chapter 0). The
# article's A100 (its numbers, quoted) put the math backend 3.7x behind the in-place module in
# bfloat16, with its GEMMs in float32 on CUDA cores (the upcast above), a cost a CPU run in
# float32 cannot show. [Part two](03b_sdpa_fused.ipynb) times the in-place module, the math
# backend and the flash kernel against each other apart from the profiler; the showdown
# chapter benchmarks every variant.
#
# ## What to remember
#
# - One call is not one kernel: the math backend is attention in primitive ops, made
#   careful (fp32 upcast, a mask rebuilt per call, NaN guards), and it pays for each.
# - Which backend runs depends on the GPU, the dtype, the head dim, the lengths and the
#   priority order, which is not the same on every GPU: pin a backend when you profile
#   one, and ask PyTorch (`debug=True`) why it refused another.
# - Diff two forwards op by op (`tracediff.diff`) to see exactly what one adds over the other.
#
# Next: [the fused backends](03b_sdpa_fused.ipynb), which do all of this in one kernel.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/03_sdpa.ipynb), with automatic checks, hints and hidden solutions.
