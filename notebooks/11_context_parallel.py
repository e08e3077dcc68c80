# %% [markdown]
# # 11. Attention across devices: one trace per rank
#
# A sequence too long for one device is cut into pieces, one per **rank** of a process group:
# **context parallelism**. Here two CPU processes talk through gloo (NCCL is its GPU
# counterpart); we profile each rank, read the traces side by side, then model real GPUs.
#
# **You will learn to:**
#
# - merge partial attentions by their [log-sum-exp](glossary.md#log-sum-exp);
# - read per-rank traces side by side: imbalance, waits, overlap;
# - count the bytes the ring and Ulysses send, and model when transfers hide behind compute.
#
# **Before you start:** [4. FlashAttention-2 in Triton](04_triton.ipynb) and
# [6. Showdown](06_showdown.ipynb).
#
# **Time:** about {reading_minutes} min to read; the closing note says how long the chapter took
# to execute on the machine that built this page.

# %% [install]

# %% [parameters]

# %%
import time

import torch

from kernels import borrowed, reference
from kernels.book import ch11_context_parallel as page
from kernels.hw import devices
from kernels.notebook import glue, inputs, lesson, reveal, say, setup, show_lines, timing_claims
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

# %% tags=["remove-input"]
borrowed.traces_box({"HTA ranks 0 and 1": page.RankPair()})

# %% [markdown]
# ## Why attention is the layer that needs the whole sequence
#
# Token-wise layers (normalisation, projections, the MLP) do not notice a cut sequence;
# attention does: query *i* mixes the values of every key *j ≤ i*. Each half alone:

# %% tags=["remove-input"]
q, k, v = inputs(1, 2, 64, 16, seed=1)
mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).requires_grad_(False)
whole = reference.attention(q, k, v, causal=True)
halves = torch.cat([reference.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True) for a, b in ((0, 32), (32, 64))], 2)
lesson(torch.allclose(mlp(q), torch.cat([mlp(h) for h in q.split(32, dim=2)], dim=2), atol=1e-6),
       "a token-wise layer gives the same output on each half as on the whole")
second_half_error = reference.max_rel_error(halves[:, :, 32:], whole[:, :, 32:])
lesson(torch.allclose(halves[:, :, :32], whole[:, :, :32]) and second_half_error > 0.1,
       "causal attention on each half alone gets only the first half right",
       f"second half: relative error {second_half_error:.1f}")

# %% [markdown]
# So each rank must see every rank's keys and values. The **ring** passes K/V shards from rank to
# rank; **Ulysses** swaps the sequence split for a head split with an **all-to-all** (every rank
# sends a different piece to every other). `ranks.Ranks(n)` starts `n` processes that run
# functions from an importable module (here `kernels.parallel.programs`) on every rank at once.

# %% tags=["remove-cell"]
t0 = time.perf_counter()

# %%
group = ranks.Ranks(world, timeout_s=120)

# %% tags=["remove-cell"]
glue("startup_s", time.perf_counter() - t0)

# %% [markdown]
# Starting them took {glue:text}`startup_s:.1f` s, so the chapter starts them once.
#
# ## The ring, and the merge that makes it exact
#
# Each rank attends its queries to the K/V block it holds while that block moves on; after
# `world` steps every query has met every key. The partial attentions merge by each row's
# log-sum-exp (LSE), as in chapter 4's online softmax: over disjoint keys A and B,
# $(e^{LSE_A} o_A + e^{LSE_B} o_B) / (e^{LSE_A} + e^{LSE_B})$, which `ring.merge` (its source
# folded below) computes with `logaddexp`, without overflow:

# %% tags=["remove-input", "hide-output"]
show_lines(ring.merge)

# %%
q, k, v = inputs(2, 4, 77, 32, seed=2)  # keys split at an odd point: 45 and 32
merged, merged_lse = ring.merge(*ring.partial_attention(q, k, v, slice(0, 45)),
                                *ring.partial_attention(q, k, v, slice(45, 77)))

# %% tags=["remove-input"]
verdict = reference.judge(merged.float(), q, k, v, causal=False)
lesson(verdict.ok, "merging two partial attentions by their LSE gives attention over all the keys",
       f"max error {verdict['out'].error:.1e}, bound {verdict['out'].bound:.1e}")

# %% [markdown]
# The ring's forward (source folded below) posts the send and receive before the local attention and
# waits after it (`ring:wait`), so the transfer can overlap the arithmetic.

# %% tags=["remove-input", "hide-output"]
show_lines(ring.ring_forward)

# %% [markdown]
# Is it right? Forward and backward on both processes, judged against float64: odd lengths,
# [grouped-query attention](glossary.md#gqa), both layouts, both causal modes (the fold holds the table).

# %% tags=["remove-cell"]
cases = [cp.Case(batch=2, heads=4, kv_heads=4, seq=67, head_dim=16, layout=layout, causal=causal, seed=3)
         for layout in ring.LAYOUTS for causal in (True, False)]
cases += [cp.Case(batch=1, heads=6, kv_heads=2, seq=45, head_dim=24, layout="zigzag", causal=True, seed=4)]

# %%
judged = [cp.judge_ring(group.run(cp.ring_check, case.with_(device=cp_device, dtype=cp_dtype)),
                        case.with_(dtype=cp_dtype))
          for case in cases]

# %% tags=["remove-input", "hide-output"]
checked = page.ring_cases(cases, judged)
checked

# %% tags=["remove-input"]
lesson(checked["ok"].all() and (checked["error / bound"] < 1).all(),
       f"the ring's output and gradients, gathered from {world} ranks, pass the judge in every case")

# %% [markdown]
# ## The imbalance of a causal ring
#
# The `contiguous` split gives rank 0 the first half and rank 1 the second. Under a causal mask
# rank 1's queries see rank 0's keys too, rank 0's only their own. The ring computes each block a
# rank attends in full (the diagonal one too, then masked). Counted that way,
# how many times as many query-key pairs as rank 0 does the last rank compute?

# %%
guess_imbalance = 1.5  # edit me: the last rank's pairs over rank 0's, contiguous split, 2 ranks

# %%
work = ring.pairs_per_rank(seq_cp, world)  # pairs per rank and split; zigzag comes later

# %% tags=["remove-input"]
predicted_ratio = work["contiguous"].iloc[-1] / work["contiguous"].iloc[0]
_ = reveal(guess_imbalance, predicted_ratio, "last rank's work over rank 0's", source="the split")

# %% [markdown]
# The traces should show it. Each rank profiles {glue:text}`active_steps` forwards between
# barriers into its own trace; `rank_traces` reads the folder: CPU ops are compute, gloo's ranges
# communication, and the rank's waits (`ring:wait kv`, `step:wait barrier`) **exposed**
# communication. A gloo range ends when `wait()` returns: it bounds a transfer, never times it.

# %% tags=["remove-cell"]
shapes = cp.Case(batch=batch, heads=heads, kv_heads=heads, seq=seq_cp, head_dim=head_dim, dtype=cp_dtype,
                 device=cp_device)
glue("active_steps", active_steps)

# %%
folders = {layout: cp.profiled(group, shapes.with_(layout=layout), "ring",
                               f"{trace_dir}/ring-{layout}", active_steps)
           for layout in ring.LAYOUTS}
steps = {layout: folders[layout].steps("ring forward", active_steps) for layout in ring.LAYOUTS}
naive = rank_traces.step_totals(steps["contiguous"])  # each rank's times and FLOPs, all steps

# %% tags=["remove-input", "hide-output"]
page.per_step({"contiguous": naive}, active_steps)

# %% [markdown]
# The fold above holds each rank's mean step; the timeline draws a typical one. **Idle** is time a
# rank neither computed, sent nor waited.

# %% tags=["remove-cell"]
# The step to draw, chosen before it is drawn: one that the per-step claims this run asserts
# (the ✔ lines below) describe; a claim the run cannot assert picks nothing.
last, first = naive.index[-1], naive.index[0]
contiguous_steps = [s.summary() for s in steps["contiguous"]]
computed_longer = [t.loc[last, "compute_us"] > t.loc[first, "compute_us"] for t in contiguous_steps]
waited_longer = [t.loc[first, "exposed_communication_us"] > t.loc[last, "exposed_communication_us"] for t in contiguous_steps]
last_on_path = [int(s.critical_path().query("round == 1").iloc[0]["rank"]) == last for s in steps["contiguous"]]
agrees = page.asserted_agreement([computed_longer, waited_longer, last_on_path])
step = page.typical_step(steps["contiguous"], agrees)

# %%
fig = step.timeline(f"ring forward, contiguous split, {world} ranks (one step)")  # step: a typical step

# %% tags=["remove-input"]
#| caption: One ring forward, contiguous split (a typical step), a track per rank: compute, gloo's sends and receives (posted to completed), and where the rank blocked in a wait; where a track shows none of these, the rank was idle.
#| alt: Timeline with one track per rank of compute bars, communication bars and wait bars for one contiguous ring step.
page.legend_above(fig)

# %% tags=["remove-input"]
from IPython.display import Markdown

display(Markdown(page.step_reading(step.summary())),  # what this run's drawn step shows, as plain prose
        *(links(r.path, title=f"ring forward, contiguous, rank {r.rank}") for r in folders["contiguous"].ranks))

# %% [markdown]
# The **critical path** is the chain of work that sets the step's length: in each piece between
# communication rounds, the rank that computed longest is the one the others wait for (the fold
# holds it per round).

# %%
path = step.critical_path()

# %% tags=["remove-input", "hide-output"]
page.critical_path_ms(path)

# %% tags=["remove-input"]
flop_ratio = naive.loc[last, "matmul_flop"] / naive.loc[first, "matmul_flop"]
lesson(abs(flop_ratio - predicted_ratio) <= 1e-9 * predicted_ratio,
       "the trace's matmul shapes give the last rank the arithmetic the split predicts",
       f"{flop_ratio:.2f}x rank 0's FLOPs")
measured_imbalance = naive.loc[last, "compute_us"] / naive.loc[first, "compute_us"]
after_exchange = path[path["round"] == 1].iloc[0]
contiguous_claims = [
    (computed_longer, "the last rank's compute takes longer than rank 0's", f"{measured_imbalance:.2f}x"),
    (waited_longer, "rank 0, with less to compute, sits longer blocked, waiting for the slowest rank",
     f"{naive.loc[first, 'exposed_communication_us'] / active_steps / 1e3:.1f} ms against "
     f"{naive.loc[last, 'exposed_communication_us'] / active_steps / 1e3:.1f} ms per step"),
    (last_on_path, "after the first exchange the critical path runs through the last rank",
     f"step drawn: rank {last}, {after_exchange['slack_us'] / 1e3:.0f} ms longer than the other there"
     if int(after_exchange["rank"]) == last else "")]
# A claim the steps contradict (held in at most 20% of them) is said as such, not asserted: two
# processes on two shared cores can swap speeds for a whole run; the prose then says only what held.
if [c for c in contiguous_claims if not page.contradicted(c[0])]:
    timing_claims([c for c in contiguous_claims if not page.contradicted(c[0])])
if page.contradicted_note(contiguous_claims):
    say(page.contradicted_note(contiguous_claims), kind="note")
glue("time_reading", page.time_reading(page.held(computed_longer), page.held(waited_longer), measured_imbalance))
glue("flop_ratio", flop_ratio)

# %% [markdown]
# The matrix products give the last rank {glue:text}`flop_ratio:.1f` times rank 0's FLOPs;
# {glue:text}`time_reading`.
#
# ## Zigzag: the same work on every rank
#
# Cut the sequence into 2 × world chunks and give rank r chunks r and 2·world − 1 − r, an early
# one and a late one. Counting blocks whole: by how many times does zigzag cut the busiest rank's
# arithmetic?

# %%
guess_zigzag = 2.0  # edit me: the busiest rank's FLOPs, contiguous over zigzag

# %% tags=["remove-input"]
zigzag = rank_traces.step_totals(steps["zigzag"])
busiest = {name: t["matmul_flop"].max() for name, t in (("contiguous", naive), ("zigzag", zigzag))}
_ = reveal(guess_zigzag, round(busiest["contiguous"] / busiest["zigzag"], 2), "busiest rank's FLOPs, contiguous over zigzag")

# %% [markdown]
# Each split's mean step; the fold below holds a typical zigzag step's timeline:

# %% tags=["remove-input"]
zigzag_step = page.typical_step(steps["zigzag"])
page.per_step({"contiguous": naive, "zigzag": zigzag}, active_steps)

# %% tags=["remove-input", "hide-output"]
#| caption: The same ring forward with the zigzag split (one step, the closest to the medians): both ranks now do the same arithmetic; how long each takes, and who waits, is what this run's timing shows (the ✔ lines below).
#| alt: Timeline with one track per rank of compute, communication and wait bars under the zigzag split.
page.legend_above(zigzag_step.timeline(f"ring forward, zigzag split, {world} ranks (one step)"))

# %% tags=["remove-input"]
lesson(work["zigzag"].nunique() == 1 and zigzag["matmul_flop"].nunique() == 1,
       "zigzag gives every rank the same query-key pairs, and the trace the same matmul FLOPs",
       f"{int(work['zigzag'].iloc[0]):,} pairs each")
lesson(busiest["zigzag"] < busiest["contiguous"],
       "the busiest rank's matmul FLOPs, read from the trace, drop with zigzag",
       f"{busiest['zigzag'] / active_steps / 1e9:.2f} against {busiest['contiguous'] / active_steps / 1e9:.2f} GFLOP per step")
glue("flop_cut", busiest["contiguous"] / busiest["zigzag"])
wait_outcomes = page.shorter_waits(steps["contiguous"], steps["zigzag"])
slow_z, slower_outcomes, speed_ratio = page.unequal_speed(steps["zigzag"])
waits_ms = tuple(t["exposed_communication_us"].max() / active_steps / 1e3 for t in (naive, zigzag))  # the table's column
zigzag_claims = []
if sum(wait_outcomes) > 0.2 * len(wait_outcomes):  # fewer: the reading below says the wait did not fall
    zigzag_claims.append((wait_outcomes, "in the zigzag run, a step's most exposed rank blocks less than in the separate "
                          "contiguous run's median step",
                          f"mean per step: {waits_ms[1]:.1f} ms zigzag, {waits_ms[0]:.1f} ms contiguous"))
if sum(slower_outcomes) > 0.2 * len(slower_outcomes):
    zigzag_claims.append((slower_outcomes, f"at equal FLOPs rank {slow_z} still computes longer: "
                          "the processes run at different speeds", f"{speed_ratio:.2f}x over the steps"))
if zigzag_claims:
    timing_claims(zigzag_claims)
rank0_rates = tuple(t.loc[first, "matmul_flop"] / t.loc[first, "compute_us"] / 1e3 for t in (naive, zigzag))  # GFLOP/s
glue("zigzag_reading", page.zigzag_reading(page.held(wait_outcomes), page.held(slower_outcomes), slow_z, speed_ratio,
                                           waits_ms, rank0_rates))
ring_steps = steps["contiguous"] + steps["zigzag"]
if all(s.marks_waits(i) for s in ring_steps for i in range(world)):  # CPU ranks: the waits say it
    transfer_ms = page.largest_single_ms(ring_steps, ("gloo:send", "gloo:recv"))  # one rank, one step: a maximum
    kv_wait_ms = page.largest_single_ms(ring_steps, ("ring:wait kv",))
    hid = timing_claims([([bool((s.summary()["arrived_before_wait"] == s.summary()["exchanges"]).all())
                           for s in ring_steps],
                          "on every rank the K/V block had arrived before the rank waited for it: "
                          "the transfer hid behind compute", "both splits")])
    glue("overlap_reading", "in any one step of either split, " + page.overlap_reading(transfer_ms, kv_wait_ms, hid))
else:  # GPU ranks: NCCL's kernels are the transfers, on their own stream
    hidden = min(naive["overlap_us"].min(), zigzag["overlap_us"].min())
    lesson(hidden > 0, "on every rank, NCCL's transfer kernels ran while the rank's attention kernels did",
           f"at least {hidden / active_steps / 1e3:.2f} ms of overlap per rank and step")
    glue("overlap_reading", "NCCL's transfer kernels ran beside the attention kernels (the overlap above)")

# %% [markdown]
# Zigzag cut the busiest rank's arithmetic by {glue:text}`flop_cut:.2f`x, not 2x: from two blocks
# of pairs to one and a quarter, equal on both ranks. The times: {glue:text}`zigzag_reading`.
# Two processes sharing two cores need not run at one speed, so the FLOP count, not a time
# ratio, states the imbalance.
#
# Gloo moves the bytes on its own threads while a helper thread (`ring.Exchange`) waits on each
# exchange, so the rank's wait, `ring:wait kv (arrived)` or `(in flight)`, says whether the block
# was there: {glue:text}`overlap_reading`.
#
# ## Ulysses: an all-to-all over heads
#
# In Ulysses (DeepSpeed-Ulysses, arXiv 2309.14509) an all-to-all (`ulysses.to_heads`, folded below)
# gives each rank the whole sequence for `heads / world` heads; it runs causal
# [SDPA](glossary.md#sdpa) on them, and a second all-to-all sends the rows back. The heads (with
# GQA, the K/V heads too) must divide by the world size.

# %% tags=["remove-input", "hide-output"]
show_lines(ulysses.to_heads)

# %% tags=["remove-input"]
small = cp.Case(batch=1, heads=4, kv_heads=2, seq=51, head_dim=16, seed=5)
uly_judged = cp.judge_ulysses(group.run(cp.ulysses_check, small.with_(device=cp_device, dtype=cp_dtype)),
                              small.with_(dtype=cp_dtype))
lesson(uly_judged.ok, f"Ulysses' output, gathered from {world} ranks, passes the judge (odd length, GQA)",
       f"max error {uly_judged['out'].error:.1e}, bound {uly_judged['out'].bound:.1e}")
try:
    ulysses.check_heads(3, 3, world)  # query heads, K/V heads, ranks
    refused = False
except ValueError:
    refused = True
lesson(refused, f"Ulysses refuses 3 heads over {world} ranks before any rank starts")

# %% [markdown]
# Bytes per rank and forward: the ring sends its K/V block `world − 1` times,
# 2·B·H_kv·(S/world)·D elements each; Ulysses (world − 1)/world of its q, k, v and output shards,
# (2·H + 2·H_kv)·B·(S/world)·D elements. Guess the ratio with two ranks and H_kv = H; the traces
# count it from gloo's tensor shapes (the fold after the checks holds a Ulysses timeline).

# %%
guess_ratio = 2.0  # edit me: the ring's bytes over Ulysses' bytes, per rank and forward

# %%
folders["ulysses"] = cp.profiled(group, shapes.with_(layout="contiguous"), "ulysses",
                                 f"{trace_dir}/ulysses", active_steps)
steps["ulysses"] = folders["ulysses"].steps("ulysses forward", active_steps)
uly = rank_traces.step_totals(steps["ulysses"])
sent = cp.sent_bytes(shapes, world, {"ring": naive, "ulysses": uly}, active_steps)

# %% tags=["remove-input"]
display(page.in_mib(sent))
predicted, measured = sent["from the shapes (bytes)"], sent["in the traces (bytes)"]
reveal(guess_ratio, round(measured["ring"] / measured["ulysses"], 3), "ring bytes over Ulysses bytes")
lesson(((measured - predicted).abs() <= 1e-9 * predicted).all(),  # both columns in the table above
       "each rank's bytes, summed from the traces, match the shapes' prediction for both schemes")
lesson(measured["ring"] == measured["ulysses"],
       "with two ranks and H_kv = H, the ring and Ulysses send the same bytes")
if all(s.marks_waits(i) for s in steps["ulysses"] for i in range(world)):  # CPU ranks
    a2a_ms = rank_traces.in_ranges(steps["ulysses"], "gloo:all_to_all") / active_steps / 1e3  # on gloo's worker thread, while it works
    timing_claims([([bool((s.summary()["overlap_us"] < 0.5 * rank_traces.in_ranges([s], "gloo:all_to_all")).all())
                     for s in steps["ulysses"]],
                    "Ulysses' all-to-alls are exposed: the ranks computed during almost none of them",
                    f"all-to-alls {a2a_ms.max():.1f} ms a step at most, computed during them "
                    f"{uly['overlap_us'].max() / active_steps / 1e3:.2f} ms")])
else:  # GPU ranks: NCCL's kernels
    lesson(uly["exposed_communication_us"].median() > 0.5 * uly["communication_us"].median(),
           "Ulysses' all-to-alls are mostly exposed: the attention cannot start before they finish",
           f"{uly['exposed_communication_us'].median() / 1e3:.1f} of {uly['communication_us'].median() / 1e3:.1f} ms exposed")

# %% tags=["remove-input", "hide-output"]
#| caption: One Ulysses forward (the step closest to the medians), a track per rank: the all-to-alls that bring the rank its heads (one each for q, k and v), the attention on those heads, then the all-to-all that sends the output rows back; the attention cannot start until the first ones finish.
#| alt: Timeline with one track per rank: all-to-all communication bars, then a compute bar, then another all-to-all, with no compute under either all-to-all.
uly_step = page.typical_step(steps["ulysses"])
page.legend_above(uly_step.timeline(f"Ulysses forward, {world} ranks (one step)"))

# %% [markdown]
# With more ranks they part: the ring's bytes per rank stay near 2·B·H_kv·S·D, Ulysses' shrink as
# 1/world; GQA cuts the ring's more. For 128k tokens, 32 query heads, head dim 128 (in the fold):

# %% tags=["hide-output"]
volumes = ulysses.volume_table(worlds=(2, 8, 64), heads=32, kv_heads=(32, 8), seq_len=131072, head_dim=128)
volumes

# %% tags=["remove-input"]
lesson(volumes.loc[(64, "32:32"), "ring / ulysses"] > volumes.loc[(2, "32:32"), "ring / ulysses"],
       "the ring's bytes per rank grow relative to Ulysses' as the world grows")

# %% [markdown]
# With enough ranks Ulysses sends fewer bytes, but cannot hide its all-to-alls; the ring hides
# its transfers while a block's attention outlasts them. Until when?
#
# ## How it scales past this machine: a model
#
# One ring step per rank, chunk c = S/world tokens, zigzag-balanced:
#
# - **compute**: 2·B·H·c²·D FLOPs at the [roofline](glossary.md#roofline)'s ceiling for the H100
#   SXM's dense bfloat16 (a lower bound on the time);
# - **communication**: one K/V block, 2·B·H_kv·c·D·2 bytes, over NVLink 4 inside a server
#   (NVIDIA's H100 page: 900 GB/s both ways, 450 each way) or one 400 Gb/s NDR InfiniBand
#   port (its ConnectX-7 manual: 50 GB/s each way); `ring.links_table` cites both.
#
# Compute grows as c², communication as c: the transfers hide until c falls below
# c* = H_kv·2·F / (H·BW), F the FLOP rate.

# %% tags=["remove-cell"]
h100 = devices.match_gpu("NVIDIA H100 80GB HBM3")  # the SXM part's row of kernels.hw.devices (NVIDIA's datasheet)
assert h100 is not None, "kernels.hw.devices has the H100 SXM's datasheet row"

# %%
#| caption: The ring's time per forward and rank against the number of ranks, 128k tokens, modelled from an H100's datasheet peak (dense bf16) and two links' bandwidths: past each crossover the transfers no longer hide behind compute.
#| alt: Log-log chart of milliseconds per forward and per rank against the number of ranks: a falling black line for compute, two dashed lines for the K/V transfers over NVLink and InfiniBand, and a vertical line at each crossover.
fig, crossovers = ring.scaling_figure(ring.LINKS, h100.flops, h100.name,
                                      seq_len=131072, heads=32, kv_heads=8, head_dim=128)
fig

# %% tags=["remove-input"]
lesson(crossovers["NVLink 4 (450 GB/s each way)"] > crossovers["InfiniBand NDR (50 GB/s each way)"],
       "over InfiniBand the transfers stop hiding behind compute at fewer ranks than over NVLink")
# The prose reads the NVLink crossover as beyond one server's 8 GPUs: the model must say so.
assert crossovers["NVLink 4 (450 GB/s each way)"] > 8, crossovers
glue("cross_nvlink", crossovers["NVLink 4 (450 GB/s each way)"])
glue("cross_ib", crossovers["InfiniBand NDR (50 GB/s each way)"])

# %% [markdown]
# With 8 K/V heads of 32, the transfers hide up to about {glue:text}`cross_nvlink:.0f` ranks on
# NVLink, more than the 8 GPUs it joins in one server (an HGX H100 board); over one InfiniBand
# port per GPU, up to about {glue:text}`cross_ib:.0f`. Real kernels stay well under the ceiling
# (chapter 6), moving both crossovers right. So Ulysses belongs inside a server; the ring can
# cross servers. The model leaves out NCCL's share of the [SMs](glossary.md#sm) and real link
# bandwidths.
#
# PyTorch's `torch.distributed.tensor.experimental.context_parallel` (torch 2.13) balances
# head-tail, i.e. zigzag (`_HeadTailLoadBalancer`), and all-gathers K/V by default; it registers SDPA's CUDA
# operators only, so on a CPU it refuses.

# %% tags=["remove-input"]
# PyTorch's context_parallel against the course's ring: only where each rank has a GPU.
if cp.torch_context_parallel_reason(cp_device) is None:
    theirs = group.run(cp.torch_context_parallel, shapes)[0]["out"]  # PyTorch unshards it on every rank
    q_, k_, v_, _ = shapes.with_(device="cpu").whole()
    ours = cp.gather(group.run(cp.ring_check, shapes.with_(layout="zigzag"), False), "out", "zigzag")
    lesson(reference.judge(theirs, q_, k_, v_, causal=True).ok and reference.judge(ours, q_, k_, v_, causal=True).ok,
           "PyTorch's context_parallel and the course's ring both pass the judge on the same inputs")

# %% [markdown]
# ## Real multi-rank traces, read the same way
#
# The same reader takes "HTA ranks 0 and 1" (credited at the top), two ranks of a 128-rank
# training job: NCCL [kernels](glossary.md#kernel) are communication, other kernels compute. The
# [cuBLAS](glossary.md#cublas) [GEMM](glossary.md#gemm) names, `ampere_sgemm_...`, say Ampere
# GPUs (most likely A100s); the traces record no device properties.

# %%
pair = rank_traces.load_ranks(borrowed.rank_pair())
real_step = pair.step()  # the first ProfilerStep#N both ranks recorded
fig = real_step.timeline(f"{real_step.label}: ranks 0 and 1")

# %% tags=["remove-input"]
#| caption: A real step of two ranks of a 128-rank job on Ampere GPUs (trace: HTA ranks 0 and 1): NCCL kernels are communication, every other kernel compute; the gaps are time the GPU ran no kernel.
#| alt: Timeline with a track per rank of a real training step: compute kernels and NCCL communication kernels on separate rows, with long gaps between them.
real_summary = real_step.summary()
display(page.real_step_ms(real_summary), page.legend_above(fig))

# %% tags=["remove-input"]
slow = real_step.slowest_rank()
fast = [r for r in real_summary.index if r != slow][0]
lesson((real_summary["communication_us"] > 0).all() and pair.world == 128,
       "both real ranks spent GPU time in NCCL kernels, in a job the traces say had 128 ranks")
lesson(real_summary.loc[fast, "exposed_communication_us"] > real_summary.loc[slow, "exposed_communication_us"],
       "in the real job, the rank with less compute had more exposed communication")
glue("real_slow", int(slow))
glue("real_step_ms", real_summary["step_us"].median() / 1e3)
glue("real_idle_ms", real_summary["idle_us"].median() / 1e3)
lesson((real_summary["idle_us"] > real_summary["compute_us"]).all(),
       "in the real step, each rank's GPU ran no kernel at all for longer than it computed",
       "; ".join(f"rank {r}: idle {row.idle_us / 1e3:.0f} ms, compute {row.compute_us / 1e3:.0f} ms"
                 for r, row in real_summary.iterrows()))
group.close()
glue("elapsed_s", time.perf_counter() - started)

# %% [markdown]
# Rank {glue:text}`real_slow` computed longer; its own wait on the other ranks is beyond these
# files. About {glue:text}`real_idle_ms:.0f` ms of each rank's {glue:text}`real_step_ms:.0f` ms
# ran no kernel ("idle"); the kernels cannot say why, the same file's CPU rows can (slow
# launches, data loading, synchronisation).
#
# ## What to remember
#
# - The ring moves K/V blocks, Ulysses heads; partials merge exactly by their log-sum-exp.
# - A causal contiguous split loads the last rank; zigzag equalises the FLOPs, but the waits
#   vanish only where the ranks also run at the same speed.
# - Read ranks side by side: compute, exposed communication, idle time, the critical path.
# - The ring's bytes per rank stay near 2·B·H_kv·S·D, Ulysses' shrink as 1/world; the ring's
#   transfers hide while a block's compute outlasts them.
#
# This chapter took {glue:text}`elapsed_s:.0f` s to execute here.

# %% [markdown]
# **Practice:** [the exercises for this chapter](exercises/11_context_parallel.ipynb), with automatic checks, hints and hidden solutions.
