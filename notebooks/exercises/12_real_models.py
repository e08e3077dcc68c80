# %% [markdown]
# # Exercises 12: attention in a real model's trace
#
# Practice for [chapter 12, attention in a real model's trace](../12_real_models.ipynb). Three
# tasks on borrowed traces the chapter does not show: BERT-small on the AMD MI300X (the
# chapter ran the command on its H100 twin), and TimeSformer's hand-written attention on the
# MI300X (the chapter listed its kernels on the H100). Read the trace, write your answer, and
# the check compares it with what `kernels.trace.attention` reads from the same file, naming
# the mistake when it recognizes one.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
from kernels.borrowed import TRACELENS, root, traces_box
from kernels.exercises import showing_solutions
from kernels.exercises.real_models import check_attention_share, check_calls_and_kernel, check_longest_kernel
from kernels.notebook import setup
from kernels.trace.attention import find_attention, short_kernel_name

device, dtype = setup(device, dtype)
showing_solutions(solutions)
bert = TRACELENS["mi300x_bert"]
bert_step = bert.step()
timesformer = TRACELENS["mi300x_timesformer"]
timesformer_step = timesformer.step()

# %% tags=["remove-input"]
traces_box({"MI300X BERT": bert, "MI300X TimeSformer": timesformer})

# %% [markdown]
# `bert_step` and `timesformer_step` are the two traces' profiler steps (`kernels.trace.reader.Step`:
# `ops` and `gpu_work` tables). The file of a borrowed trace is `root() / bert.file`, for the
# command.
#
# ## Task 1: how many attention calls, and which kernel?
#
# How many attention calls does one step of BERT-small on the MI300X make, and what is the
# name of the attention kernel they run? Use the command
# (`!python -m kernels.trace.attention {root() / bert.file}` in a notebook cell), or
# `find_attention(bert_step)`, or read `bert_step.ops` and `bert_step.gpu_work` yourself.

# %% tags=["stub"]
calls = ...   # a number
kernel = ...  # a kernel's name, e.g. "some_kernel"

# %% [markdown]
# :::{dropdown} Hint 1: calls, not ops
# Each call appears as `aten::scaled_dot_product_attention` with its backend's ops nested
# inside it. Count the outermost ones.
# :::
#
# :::{dropdown} Hint 2: the kernel
# The kernel is a GPU row, launched by the innermost attention op. This trace was recorded on
# an AMD GPU: the chapter's H100 kernel is not in it.
# :::

# %% tags=["solution", "hide-input"]
# Solution: find_attention lists the calls; each one's main kernel is its attention kernel.
report = find_attention(bert_step)
solution_calls = len(report.calls)
solution_kernel = report.summary()["main kernel"]

# %% tags=["check"]
check_calls_and_kernel(solution_calls if solutions else calls, solution_kernel if solutions else kernel)

# %% [markdown]
# ## Task 2: attention's share of the step
#
# What fraction of that step's GPU time (every kernel, memcpy and memset, summed) went to
# attention? A number from 0 to 1; the check allows half a percentage point.

# %% tags=["stub"]
share = ...   # a fraction, 0 to 1

# %% [markdown]
# :::{dropdown} Hint
# The command prints it as a percentage. By hand: the attention calls' kernels' `dur_us`,
# summed, over `bert_step.gpu_time_us`. Not the step's CPU time, and not the span from the
# first kernel to the last: the GPU sat idle for most of this step.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the report's share is its calls' GPU time over the step's.
solution_share = find_attention(bert_step).attention_share

# %% tags=["check"]
check_attention_share(solution_share if solutions else share)

# %% [markdown]
# ## Task 3: inside hand-written attention
#
# TimeSformer writes its attention by hand. In its step on the MI300X, take the attention call
# with the most GPU time: which of its kernels runs longest? Give the kernel's name.

# %% tags=["stub"]
longest_kernel = ...  # a kernel's name

# %% [markdown]
# :::{dropdown} Hint 1
# `find_attention(timesformer_step).calls` finds the hand-written calls; each has `gpu_us`
# and `kernels` (its rows of `gpu_work`, with `name`, `dur_us` and the `op` that launched them).
# :::
#
# :::{dropdown} Hint 2
# The chapter's H100 table has the same call shape, but the MI300X's libraries name their
# kernels their own way.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the longest call, then its longest kernel.
ts_calls = find_attention(timesformer_step).calls
slowest = max(ts_calls, key=lambda c: c.gpu_us)
solution_longest_kernel = short_kernel_name(slowest.kernels.loc[slowest.kernels["dur_us"].idxmax(), "name"])

# %% tags=["check"]
check_longest_kernel(solution_longest_kernel if solutions else longest_kernel)

# %% [markdown]
# On the MI300X the longest kernel of TimeSformer's long attention calls is a softmax too, a
# variant of the H100's with another name: the reading is the same on both vendors, the names
# are not.
#
# Back to [chapter 12](../12_real_models.ipynb).
