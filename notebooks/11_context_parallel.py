# %% [markdown]
# # 11. Attention across devices: one trace per rank
#
# Every chapter so far ran attention on one device. Long-context training and inference go
# past that: the sequence no longer fits one device's memory (or takes too long on one), so
# it is cut into pieces and each device, a **rank** of a process group, holds one piece. This
# is **context parallelism**. This chapter builds it on `torch.distributed` with two CPU
# processes talking through gloo, profiles each rank, and reads the per-rank traces side by
# side: who computed, who waited, what the communication cost and what of it hid behind the
# arithmetic. Then it models what happens on real GPUs, where this machine cannot go.
#
# **You will learn to:**
#
# - start ranks from a notebook (`torch.distributed` over gloo) and profile one trace per rank;
# - merge partial attentions by their log-sum-exp, which is what makes ring attention exact;
# - read per-rank traces side by side (compute, waiting, communication, overlap), find the
#   causal ring's imbalance, and see zigzag remove it;
# - count the bytes the ring and Ulysses send, and model how far the transfers hide behind
#   compute on NVLink and InfiniBand.
#
# **Before you start:** [4. FlashAttention-2 in Triton](04_triton.ipynb) (the online softmax and
# its log-sum-exp) and [6. Showdown](06_showdown.ipynb). No GPU: the ranks are two CPU
# processes.
#
# **Time:** about {reading_minutes} min to read; the closing note says how long the chapter took
# to execute on the machine that built this page.

# %% [install]

# %% [parameters]

# %%
import time

import torch

from kernels import borrowed, reference
from kernels.hw import devices
from kernels.notebook import glue, inputs, lesson, reveal, setup, show_lines, timing_claims
from kernels.parallel import programs as cp, rank_traces, ranks, ring, ulysses
from kernels.trace.links import links

started = time.perf_counter()  # the closing note reports how long this chapter took
device, dtype = setup(device, dtype)
world = 2
# One GPU per rank or none: NCCL refuses two ranks on one GPU, so with fewer GPUs than ranks the
# ranks are CPU processes talking through gloo, in float32.
cp_device = "cuda" if torch.cuda.device_count() >= world else "cpu"
cp_dtype = "bfloat16" if cp_device == "cuda" else "float32"
seq_cp = seq  # the whole sequence, split over the ranks
print(f"{world} ranks on {cp_device} ({ranks.default_backend(world)}), {cp_dtype}")

# %% [markdown]
# ## Why attention is the layer that needs the whole sequence
#
# Cut a sequence in two and give each half to a device. Most of a transformer block does not
# notice: normalisation, the projections and the MLP act on each token alone, so each device
# computes its own tokens and nobody talks. Attention is the exception: query *i* mixes the
# values of every key *j ≤ i*, so the second half's queries need the first half's keys and
# values. Here is that difference on one process, with a token-wise layer and attention each
# run on the two halves separately:

# %%
q, k, v = inputs(1, 2, 64, 16, seed=1)
mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).requires_grad_(False)
whole = reference.attention(q, k, v, causal=True)
halves = torch.cat([reference.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True) for a, b in ((0, 32), (32, 64))], 2)
lesson(torch.allclose(mlp(q), torch.cat([mlp(h) for h in q.split(32, dim=2)], dim=2), atol=1e-6),
       "a token-wise layer computes the same on each half of the sequence as on the whole")
second_half_error = reference.max_rel_error(halves[:, :, 32:], whole[:, :, 32:])
lesson(torch.allclose(halves[:, :, :32], whole[:, :, :32]) and second_half_error > 0.1,
       "causal attention on the halves alone is right for the first half only: the second half needs the first half's keys",
       f"second half off by {second_half_error:.2f} (relative)")

# %% [markdown]
# So each rank must see every other rank's keys and values, without any rank ever holding
# the whole S × S score matrix. Two schemes do it: the **ring** passes the K/V shards from
# rank to rank, and **Ulysses** trades the sequence split for a head split with an
# all-to-all. Both run below on real processes.
#
# ## Ranks from a notebook
#
# `kernels.parallel.ranks.Ranks(n)` starts `n` Python processes with `torch.multiprocessing`'s spawn
# method, joins them into one process group over a free local port, and runs a function on
# every rank at once. Every collective and point-to-point operation of the group has a
# timeout, a rank that raises or dies ends the run with an error naming it, and closing the
# group ends every process. (The function must live in an importable module, since spawned
# processes do not share this notebook's namespace: the chapter's rank programs are in
# `kernels.parallel.programs`.)

# %%
t0 = time.perf_counter()
group = ranks.Ranks(world, timeout_s=120)
glue("startup_s", time.perf_counter() - t0)

# %% [markdown]
# Starting the ranks took {glue:text}`startup_s:.1f` s (a fresh process imports torch before it
# can join): that is why the chapter starts them once and sends them work, rather than starting
# processes per experiment.
#
# ## The ring, and the merge that makes it exact
#
# Each rank keeps its queries. At every step it attends its queries to the K/V block it holds,
# while that block travels to the next rank and the previous rank's block arrives: after
# `world` steps every query has met every key. Each step produces a *partial* attention, a
# softmax over one block's keys only. Chapter 4's online softmax already knows how to combine
# those: keep, for each query row, the log of its softmax denominator (the **log-sum-exp**, LSE)
# next to the output, and rescale each part by its share of the combined denominator. This is
# the library's merge, the whole of the trick:

# %%
show_lines(ring.merge)

# %% [markdown]
# Two parts over disjoint keys A and B: the exact output is
# (e^{LSE_A}·o_A + e^{LSE_B}·o_B) / (e^{LSE_A} + e^{LSE_B}), and `logaddexp` computes the
# denominator's log without overflow. On one process, split the keys at an odd point and check it:

# %%
q, k, v = inputs(2, 4, 77, 32, seed=2)
merged, merged_lse = ring.merge(*ring.partial_attention(q, k, v, slice(0, 45)),
                                *ring.partial_attention(q, k, v, slice(45, 77)))
verdict = reference.judge(merged.float(), q, k, v, causal=False)
lesson(verdict.ok, "merging two partial attentions by their log-sum-exp gives attention over all the keys", str(verdict))

# %% [markdown]
# The ring's forward on one rank, as the library runs it (the send and receive are posted
# before the local attention and waited on after it, so the transfer can overlap the
# arithmetic; `ring:wait` is where the rank blocks if it has not):

# %%
show_lines(ring.ring_forward)

# %% [markdown]
# Causal masking adds one more saving: a block whose keys all come after every query of the
# rank is never computed. The backward goes round the ring again, each block's gradient
# accumulator travelling with it and arriving home after `world` hops (`ring.ring_backward`).
#
# ### Is it right?
#
# Each case below draws the whole q, k, v on every rank from one seed, gives each rank its
# shard, runs the ring forward and backward on the two processes, gathers every rank's output
# and gradient shards and judges them against the float64 reference (float32 within ~1e-5).
# Odd lengths, grouped-query attention, both layouts (next section) and both causal modes:

# %%
cases = [cp.Case(batch=2, heads=4, kv_heads=4, seq=67, head_dim=16, layout=layout, causal=causal, seed=3)
         for layout in ring.LAYOUTS for causal in (True, False)]
cases += [cp.Case(batch=1, heads=6, kv_heads=2, seq=45, head_dim=24, layout="zigzag", causal=True, seed=4)]
checked = cp.check_cases(group, cases, cp_device, cp_dtype)
display(checked)
lesson(checked["ok"].all(),  # error / bound per tensor in the table
       f"the ring's output and gradients, gathered from {world} ranks, pass the judge in every case")

# %% [markdown]
# ## The imbalance of a causal ring
#
# The simplest split gives rank 0 the first half of the sequence and rank 1 the second
# (`contiguous`). Under a causal mask, rank 0's queries see only their own keys; rank 1's see
# their own and all of rank 0's. Before looking: how many times more query-key pairs does the
# last rank compute than rank 0, with two ranks?

# %%
guess_imbalance = 1.0  # edit me: the last rank's work over rank 0's, contiguous split, 2 ranks

# %%
work = ring.pairs_per_rank(seq_cp, world)
predicted_ratio = work["contiguous"].iloc[-1] / work["contiguous"].iloc[0]
reveal(guess_imbalance, predicted_ratio, "last rank's work over rank 0's", source="the split")
display(work)

# %% [markdown]
# That is counted from the split alone. The traces should show it too. Each rank now runs
# six profiled forwards after a warm-up, each started by a barrier so the ranks begin together
# and ended by another, as a training step ends at its next collective (a rank that finishes
# early waits there, inside the step), and writes its own trace into one folder, one file
# per rank. This chapter's rank program names them `rank-0.json.gz`, `rank-1.json.gz`; PyTorch's
# own `tensorboard_trace_handler` names them by host and process, not by rank
# (`{hostname}_{pid}.{ns}.pt.trace.json[.gz]`), and writes the rank inside the trace, in its
# `distributedInfo`, which is where the reader looks first. `kernels.parallel.rank_traces` reads the folder,
# picks the same step on every rank and classifies what each rank did: its CPU ops are
# compute, gloo's own ranges are communication, and the ranges where the rank program blocked
# (`ring:wait kv`, and `step:wait barrier` at the step's end) are **exposed** communication.
#
# What gloo's ranges measure needs care. PyTorch starts a `gloo:send` or `gloo:recv` range when
# the request is created and ends it when `wait()` returns, so a rank that posts, computes for
# 50 ms and then waits gets a 50 ms range whatever the transfer took: the range is an upper
# bound of the transfer, never its duration. And gloo marks a send or receive completed only
# inside `wait()`: `is_completed()` answers False until then. So the ring waits on each exchange
# from a helper thread the moment it is posted (`ring.Exchange`): gloo's ranges then end when
# the transfer completed, and the rank's own wait, named `ring:wait kv (arrived)` or
# `ring:wait kv (in flight)`, says whether its block was already there when the local attention
# ended, and how long the rank blocked if not.

# %%
shapes = cp.Case(batch=batch, heads=heads, kv_heads=heads, seq=seq_cp, head_dim=head_dim, dtype=cp_dtype,
                 device=cp_device)
ACTIVE = 6  # profiled forwards per scheme
folders = {layout: cp.profiled(group, shapes.with_(layout=layout), "ring", f"{trace_dir}/ring-{layout}", ACTIVE)
           for layout in ring.LAYOUTS}
steps = {layout: folders[layout].steps("ring forward", ACTIVE) for layout in ring.LAYOUTS}
naive = rank_traces.step_totals(steps["contiguous"])
display(rank_traces.times_ms(naive).join(naive[["exchanges", "arrived_before_wait"]]))

# %%
#| caption: One ring forward with the contiguous split, a track per rank: compute (its CPU ops), gloo's sends and receives (posted to completed), and where the rank blocked in a wait. Under the causal mask the last rank has the most arithmetic; on a steady run the others finish early and wait for it.
#| alt: Timeline with one track per rank of compute bars, communication bars and wait bars; the last rank's compute is the longest.
step = rank_traces.median_step(steps["contiguous"])
display(*(links(r.path, title=f"ring forward, contiguous, rank {r.rank}") for r in folders["contiguous"].ranks))
step.timeline(f"ring forward, contiguous split, {world} ranks (the median step)")

# %%
last, first = naive.index[-1], naive.index[0]
flop_ratio = naive.loc[last, "matmul_flop"] / naive.loc[first, "matmul_flop"]
lesson(abs(flop_ratio - predicted_ratio) <= 1e-9 * predicted_ratio,
       "the matrix products the trace recorded (their shapes) give the last rank the arithmetic the split predicts",
       f"{flop_ratio:.2f}x rank 0's FLOPs")
measured_imbalance = naive.loc[last, "compute_us"] / naive.loc[first, "compute_us"]
contiguous_steps = [s.summary() for s in steps["contiguous"]]
path = step.critical_path()
display(path.round(1))
after_exchange = path[path["round"] == 1].iloc[0]
shown = timing_claims([
    ([t.loc[last, "compute_us"] > t.loc[first, "compute_us"] for t in contiguous_steps],
     "and the last rank's compute takes longer than rank 0's in the trace",
     f"{measured_imbalance:.2f}x over {ACTIVE} steps (masked blocks cost a little more than their share)"),
    ([t.loc[first, "exposed_communication_us"] > t.loc[last, "exposed_communication_us"] for t in contiguous_steps],
     "rank 0, with less to compute, spends longer in communication it cannot hide: it waits for the slowest rank",
     f"{naive.loc[first, 'exposed_communication_us'] / 1e3:.1f} ms against "
     f"{naive.loc[last, 'exposed_communication_us'] / 1e3:.1f} ms over {ACTIVE} steps"),
    ([int(s.critical_path().query("round == 1").iloc[0]["rank"]) == last for s in steps["contiguous"]],
     "after the first exchange the critical path runs through the last rank, computing the block rank 0 skips",
     f"in the median step {after_exchange['compute_us'] / 1e3:.0f} ms on rank {int(after_exchange['rank'])}, "
     f"{after_exchange['slack_us'] / 1e3:.0f} ms more than rank 0 there")])
glue("time_reading", f"it computed {measured_imbalance:.2f} times as long (a diagonal block, computed whole and then "
     "masked, costs more than its share of pairs), and rank 0 spent the difference waiting at the step's end" if shown
     else "its times on this run were too noisy to show that (a machine shared with other work moves them), "
     "so the FLOP count is the statement")
glue("flop_ratio", flop_ratio)

# %% [markdown]
# Each rank's trace opens in Perfetto from the links above: one file per rank, so open both to
# see the ranks side by side. The trace agrees with the count: the shapes of its matrix products give the last rank
# {glue:text}`flop_ratio:.1f` times rank 0's FLOPs; {glue:text}`time_reading` (each timing
# claim is checked in every profiled step, not once). The critical path is read round by
# round: the step is cut where each rank's communication rounds end, and in each piece the
# rank that computed longest is the one the others wait for.
#
# ## Zigzag: the same work on every rank
#
# The fix is a different split. Cut the sequence into 2 × world chunks, and give rank r chunk
# r and chunk 2·world − 1 − r: an early chunk and a late one. Every rank then holds as many
# "cheap" queries as "expensive" ones:

# %%
display(ring.chunks_table(seq_cp, world, "zigzag"))

# %% [markdown]
# Guess again: with zigzag, the last rank's matmul FLOPs over rank 0's, as the trace's shapes
# give them?

# %%
guess_zigzag = 2.0  # edit me

# %%
#| caption: The same ring forward with the zigzag split: each rank holds one early and one late block of the sequence, so the ranks' compute comes out about equal.
#| alt: Timeline with one track per rank of compute and communication bars, the ranks' compute bars of about equal length.
zigzag = rank_traces.step_totals(steps["zigzag"])
reveal(guess_zigzag, round(zigzag.loc[last, "matmul_flop"] / zigzag.loc[first, "matmul_flop"], 2),
       "last rank's matmul FLOPs over rank 0's, zigzag")
rank_traces.median_step(steps["zigzag"]).timeline(f"ring forward, zigzag split, {world} ranks (the median step)")

# %%
lesson(work["zigzag"].nunique() == 1 and zigzag["matmul_flop"].nunique() == 1,  # pairs: the table above
       "zigzag gives every rank the same number of query-key pairs, and the trace the same matmul FLOPs")
busiest = {name: t["matmul_flop"].max() for name, t in (("contiguous", naive), ("zigzag", zigzag))}
lesson(busiest["zigzag"] < busiest["contiguous"],
       "the busiest rank's arithmetic, read from the trace's matmul shapes, drops with zigzag",
       f"{busiest['zigzag'] / ACTIVE / 1e9:.2f} against {busiest['contiguous'] / ACTIVE / 1e9:.2f} GFLOP per step")
glue("flop_cut", busiest["contiguous"] / busiest["zigzag"])
ring_steps = steps["contiguous"] + steps["zigzag"]
if all(s.marks_waits(i) for s in ring_steps for i in range(world)):  # CPU ranks: the waits say it
    transfer_ms = max(rank_traces.in_ranges(ring_steps, f"gloo:{op}").max() for op in ("send", "recv")) / len(ring_steps) / 1e3
    kv_wait_ms = rank_traces.in_ranges(ring_steps, "ring:wait kv").max() / len(ring_steps) / 1e3
    timing_claims([([bool((s.summary()["arrived_before_wait"] == s.summary()["exchanges"]).all())
                                  for s in ring_steps],
                                 "on every rank, the K/V block had arrived when the rank came to wait for it, after its "
                                 "local attention: the transfer hid behind the compute",
                                 f"the transfer took {transfer_ms:.2f} ms per step at most (post to completion, the "
                                 f"slowest rank's mean), the rank's wait for it {kv_wait_ms:.2f} ms")])
    glue("transfer_ms", f"{transfer_ms:.2f}")
    glue("kv_wait_ms", f"{kv_wait_ms:.2f}")
else:  # GPU ranks: NCCL's kernels are the transfers, on their own stream
    hidden = min(naive["overlap_us"].min(), zigzag["overlap_us"].min())
    lesson(hidden > 0, "on every rank, NCCL's transfer kernels ran while the rank's attention kernels did",
           f"at least {hidden / ACTIVE / 1e3:.2f} ms of overlap per rank and step")
    glue("transfer_ms", "(see NCCL's kernels)")
    glue("kv_wait_ms", "(see NCCL's kernels)")

# %% [markdown]
# Zigzag cut the busiest rank's arithmetic by {glue:text}`flop_cut:.2f`x and gave both ranks the
# same FLOPs. The assertions read that arithmetic from the trace's shapes, which no other
# process on the machine can disturb; the ranks' times also carry whatever else was running.
#
# PyTorch's own context parallelism balances causal load the same way: in torch 2.13 its
# default, when the length divides by 2 × world, is a head-tail split (`_HeadTailLoadBalancer`,
# in the `_load_balancer.py` of torch 2.13's context parallelism).
# On a CPU, gloo moves the bytes on its own threads, so a posted send proceeds while the rank
# computes. Measured as above (gloo's ranges ended by the helper thread's wait), the K/V
# transfer took {glue:text}`transfer_ms` ms per step at most, and the rank, coming to wait
# after its local attention, blocked {glue:text}`kv_wait_ms` ms for it: that is the hidden
# communication, a transfer complete before it was needed. Read with the rank's own `wait()`
# instead, gloo's ranges would have stretched over the whole local attention and shown an
# "overlap" that the code's shape guarantees, whatever the transfer took. On GPUs the overlap
# comes from [NCCL kernels](glossary.md#kernel) on their own stream beside the attention kernel, and there the
# kernels' own times are the transfers.
#
# ## Ulysses: an all-to-all over heads
#
# Ulysses (DeepSpeed-Ulysses, arXiv 2309.14509) moves a different thing. Each rank starts with
# its sequence shard of q, k and v for *all* heads; one all-to-all later it holds the *whole*
# sequence for `heads / world` of the heads, runs ordinary causal attention on them (any kernel:
# here [SDPA](glossary.md#sdpa)), and a second all-to-all sends every rank its own rows back. The heads must divide
# by the world size (with GQA, the K/V heads too): that is the scheme's rule. The first
# all-to-all, from the library:

# %%
show_lines(ulysses.to_heads)

# %%
small = cp.Case(batch=1, heads=4, kv_heads=2, seq=51, head_dim=16, seed=5)
judged = cp.judge_ulysses(group.run(cp.ulysses_check, small.with_(device=cp_device, dtype=cp_dtype)), small.with_(dtype=cp_dtype))
lesson(judged.ok, f"Ulysses' output, gathered from {world} ranks, passes the judge (odd length, GQA)", str(judged))
try:
    ulysses.check_heads(3, 3, world)
except ValueError as err:
    print(f"refused: {err}")

# %% [markdown]
# How many bytes does each scheme send per rank and forward? From the shapes: the ring sends
# its K/V block `world − 1` times, 2·B·H_kv·(S/world)·D elements each time. Ulysses sends
# (world − 1)/world of its q, k, v and output shards: (2·H + 2·H_kv)·B·(S/world)·D elements in
# all, times (world − 1)/world. Guess which sends more here, with two ranks and as many K/V heads
# as query heads, then the traces' own count (gloo's ranges carry their tensors' shapes):

# %%
guess_ratio = 2.0  # edit me: the ring's bytes over Ulysses' bytes, per rank and forward

# %%
#| caption: One Ulysses forward, a track per rank: the all-to-alls that trade sequence shards for head shards, and the attention, which cannot start until they finish.
#| alt: Timeline with one track per rank: communication bars of the all-to-alls around the compute bars of the attention.
folders["ulysses"] = cp.profiled(group, shapes.with_(layout="contiguous"), "ulysses", f"{trace_dir}/ulysses", ACTIVE)
steps["ulysses"] = folders["ulysses"].steps("ulysses forward", ACTIVE)
uly = rank_traces.step_totals(steps["ulysses"])
sent = cp.sent_bytes(shapes, world, {"ring": naive, "ulysses": uly}, ACTIVE)
display(sent)
predicted, measured = sent["from the shapes (bytes)"], sent["in the traces (bytes)"]
reveal(guess_ratio, round(measured["ring"] / measured["ulysses"], 3), "ring bytes over Ulysses bytes")
lesson(((measured - predicted).abs() <= 1e-9 * predicted).all(),  # both columns in the table above
       "the bytes each rank sends, summed from the traces, are the bytes the shapes predict, for both schemes")
lesson(measured["ring"] == measured["ulysses"],
       "with two ranks and as many K/V heads as query heads, the ring and Ulysses send the same bytes")
if all(s.marks_waits(i) for s in steps["ulysses"] for i in range(world)):  # CPU ranks
    a2a_ms = rank_traces.in_ranges(steps["ulysses"], "gloo:all_to_all") / ACTIVE / 1e3  # on gloo's worker thread, while it works
    a2a_wait_ms = rank_traces.in_ranges(steps["ulysses"], "ulysses:wait") / ACTIVE / 1e3  # the rank, blocked in the call
    timing_claims([([bool((s.summary()["overlap_us"] < 0.5 * rank_traces.in_ranges([s], "gloo:all_to_all")).all())
                                  for s in steps["ulysses"]],
                                 "Ulysses' all-to-alls are exposed: the ranks computed during almost none of them, "
                                 "the attention cannot start before they finish",
                                 f"per step, gloo's all-to-alls took {a2a_ms.min():.1f}-{a2a_ms.max():.1f} ms, and each "
                                 f"rank blocked {a2a_wait_ms.min():.1f}-{a2a_wait_ms.max():.1f} ms in the calls; computed "
                                 f"during them: {uly['overlap_us'].max() / ACTIVE / 1e3:.2f} ms at most")])
else:  # GPU ranks: NCCL's kernels
    lesson(uly["exposed_communication_us"].median() > 0.5 * uly["communication_us"].median(),
           "Ulysses' all-to-alls are mostly exposed: the attention cannot start before they finish",
           f"{uly['exposed_communication_us'].median() / 1e3:.1f} of {uly['communication_us'].median() / 1e3:.1f} ms exposed")
rank_traces.median_step(steps["ulysses"]).timeline(f"Ulysses forward, {world} ranks (the median step)")

# %% [markdown]
# With two ranks and as many K/V heads as query heads the two schemes send the same bytes. They
# part with more ranks: the ring's bytes per rank stay near 2·B·H_kv·S·D whatever the world
# size (a shard S/world, world − 1 times), while Ulysses' shrink as 1/world. GQA cuts the
# ring's (fewer K/V heads to pass) more than Ulysses' (its queries and outputs still move).

# %%
volumes = ulysses.volume_table(worlds=(2, 4, 8, 16, 64), heads=32, kv_heads=(32, 8), seq_len=131072, head_dim=128)
display(volumes.round(1))
lesson(volumes.loc[(64, "32:32"), "ring / ulysses"] > volumes.loc[(2, "32:32"), "ring / ulysses"],
       "the ring's bytes per rank grow relative to Ulysses' as the world grows")

# %% [markdown]
# The rule of thumb that follows: Ulysses sends fewer bytes once there are more than a couple
# of ranks, but needs heads divisible by the world size (so its world is capped by the head
# count) and cannot hide its all-to-alls behind arithmetic; the ring sends more, takes any
# head count, and hides its transfers as long as a block's attention takes longer than its
# transfer. Which leads to the question of the next section.
#
# ## How it scales past this machine: a model
#
# Two CPU processes cannot show what happens on 8 or 64 GPUs, but the two costs can be
# modelled. Take one ring step with chunk length c = S/world tokens per rank, causal with
# zigzag balance:
#
# - **compute**: the causal forward's FLOPs spread evenly, 2·B·H·c²·D per rank and step, at
#   the [roofline](glossary.md#roofline)'s ceiling for the H100 SXM's dense bfloat16 (the fastest it could go, so the
#   model's compute time is a lower bound);
# - **communication**: one K/V block, 2·B·H_kv·c·D·2 bytes, over the link each way: NVLink
#   inside a node, InfiniBand between nodes.
#
# Bandwidths, from the vendor's pages: NVIDIA's H100 page gives fourth-generation NVLink
# 900 GB/s per GPU (both directions together, so 450 GB/s each way); its ConnectX-7 adapter
# manual gives a single port of 400 Gb/s NDR InfiniBand (50 GB/s each way). Compute scales as c²
# and communication as c, so the ring hides its transfers while c is long and stops hiding
# them below a crossover c* = H_kv·2·F / (H·BW), where F is the FLOP rate.

# %%
#| caption: The ring's time per forward and per rank against the number of ranks for a 128k-token sequence, modelled from an H100's peak and two links' bandwidths: compute falls with the square of the shard, communication only with the shard, so past the crossover the transfers no longer hide behind compute.
#| alt: Log-log chart of milliseconds per forward and per rank against the number of ranks: a falling black line for compute, two dashed lines for the K/V transfers over NVLink and InfiniBand, and a vertical line at each crossover.
h100 = devices.match_gpu("NVIDIA H100 80GB HBM3")  # the SXM part's row of kernels.hw.devices (NVIDIA's datasheet)
assert h100 is not None, "kernels.hw.devices has the H100 SXM's datasheet row"
fig, crossovers = ring.scaling_figure(ring.LINKS, h100.flops, f"{h100.name} ({h100.source})", seq_len=131072, heads=32,
                                      kv_heads=8, head_dim=128)
display(fig)
display(ring.links_table(crossovers))
lesson(crossovers["NVLink 4 (450 GB/s each way)"] > crossovers["InfiniBand NDR (50 GB/s each way)"],
       "over InfiniBand the transfers stop hiding behind compute at fewer ranks than over NVLink")
glue("cross_nvlink", crossovers["NVLink 4 (450 GB/s each way)"])
glue("cross_ib", crossovers["InfiniBand NDR (50 GB/s each way)"])

# %% [markdown]
# For a 128k-token sequence with 8 K/V heads of 32, the transfers hide behind compute up to
# about {glue:text}`cross_nvlink:.0f` ranks on NVLink, and only up to about
# {glue:text}`cross_ib:.0f` over one InfiniBand port per GPU. Real kernels reach well under the
# ceiling (chapter 6's numbers), which lengthens compute and moves both crossovers right; an
# 8-GPU node puts most ring hops on NVLink and one on the network: one reason to run Ulysses
# inside a node and the ring across nodes.
#
# ## PyTorch's own: `context_parallel`
#
# PyTorch ships context parallelism as `torch.distributed.tensor.experimental.context_parallel`:
# inside its context manager, the named buffers are sharded along the sequence over a DTensor
# device mesh, and SDPA calls inside it are dispatched to its own context-parallel attention,
# with the head-tail load balancing of zigzag; by default (`rotate_method` in the
# `_attention.py` of torch 2.13) it gathers the K/V shards with an all-gather instead of passing them round, and all-to-all
# rotation is the alternative. It works by registering sharding strategies for SDPA's CUDA
# operators; on a CPU it refuses, because the CPU flash operator
# (`aten._scaled_dot_product_flash_attention_for_cpu`) has none registered (torch 2.13). So the
# comparison runs only where each rank has a GPU:

# %%
reason = cp.torch_context_parallel_reason(cp_device)
if reason is None:
    theirs = group.run(cp.torch_context_parallel, shapes)[0]["out"]  # PyTorch unshards it on every rank
    q_, k_, v_, _ = shapes.with_(device="cpu").whole()
    ours = cp.gather(group.run(cp.ring_check, shapes.with_(layout="zigzag"), False), "out", "zigzag")
    lesson(reference.judge(theirs, q_, k_, v_, causal=True).ok and reference.judge(ours, q_, k_, v_, causal=True).ok,
           "PyTorch's context_parallel and the course's ring both pass the judge on the same inputs")
else:
    print(f"Not run here: {reason}.")

# %% [markdown]
# ## Real multi-rank traces, read the same way
#
# The same reader takes the folders real jobs write. Two ranks of a 128-rank training job
# (from HolisticTraceAnalysis' test data), where communication is NCCL kernels on their own
# stream, and compute every other kernel. The traces record no device properties: that the
# GPUs were Ampere ones (most likely A100s) is read from the kernels' names, cuBLAS's
# `ampere_sgemm_...` [GEMMs](glossary.md#gemm), not from the trace:

# %%
#| caption: A real step of two ranks of a 128-rank training job on Ampere GPUs, by its kernel names (HolisticTraceAnalysis's test data, MIT licence), read the same way: NCCL kernels on their own stream are communication, every other kernel compute.
#| alt: Timeline with a track per rank of a real training step: compute kernels and NCCL communication kernels on separate rows.
pair = rank_traces.load_ranks(borrowed.rank_pair())
real_step = pair.step()  # the first ProfilerStep#N both ranks recorded
real_summary = real_step.summary()
display(rank_traces.times_ms(real_summary, digits=1))
display(real_step.timeline(f"{real_step.label} of a 128-rank job: ranks 0 and 1"))
print(borrowed.HTA_RANK_PAIR_CREDIT)
slow = real_step.slowest_rank()
fast = [r for r in real_summary.index if r != slow][0]
lesson((real_summary["communication_us"] > 0).all() and pair.world == 128,
       "both ranks of the real job spent GPU time in NCCL kernels, and the traces say the job had 128 ranks")
lesson(real_summary.loc[fast, "exposed_communication_us"] > real_summary.loc[slow, "exposed_communication_us"],
       "in the real job too, the rank with less compute spent longer in communication it could not hide")
glue("real_slow", int(slow))

# %% [markdown]
# In that step rank {glue:text}`real_slow` computed longer; only two of the job's 128 traces are
# here, so its own wait on ranks further away is beyond these two files.
#
# ## What cannot be recorded without GPUs
#
# This machine's path is CPU processes and gloo. What a GPU recording would add, and this
# chapter cannot show: NCCL kernels on their own CUDA stream running beside the attention
# kernel (the overlap is then between two streams of one GPU, not two CPU threads); NVLink's
# and InfiniBand's real bandwidths, so the model above stays a model; the copy engines, and
# how much of the [SMs](glossary.md#sm) NCCL takes from the attention. On a machine with a
# single GPU none of that can be recorded either: NCCL needs a GPU per rank, so the chapter
# runs this CPU path there too and says so at the top.

# %%
group.close()
glue("elapsed_s", time.perf_counter() - started)

# %% [markdown]
# ## What to remember
#
# - Attention is the layer that needs the whole sequence; context parallelism shards it and
#   moves keys and values (the ring) or heads (Ulysses) between ranks.
# - The ring is exact because partial attentions merge by their log-sum-exp: chapter 4's online
#   softmax across devices.
# - Under a causal mask the contiguous split leaves early ranks idle; the per-rank traces show
#   it as compute on one rank and waiting on the other, and zigzag removes it.
# - Read ranks side by side: compute, communication, what overlapped and what was exposed, and
#   the rank the critical path runs through. Exposed communication is where a rank blocked in
#   a wait; gloo's own ranges end when `wait()` returns, so they bound a transfer, never time it.
#
# This chapter took {glue:text}`elapsed_s:.0f` s to execute here.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/11_context_parallel.ipynb), with automatic checks, hints and hidden solutions.
