# %% [markdown]
# # Exercises 5: FlashAttention in CUDA, by hand
#
# Practice for [chapter 5, FlashAttention in CUDA](../05_cuda.ipynb). Three tasks, none of
# which needs a GPU or even `nvcc`: read what the compiler says a kernel costs, turn that
# into occupancy on an A100 (sm_80) and an H100/H200 (sm_90), and place every thread of
# v2's block on the elements it computes.

# %% [install]

# %% [parameters]
# `solutions = True` runs the hidden solutions instead of your answers (the book is built that way).
solutions = False

# %% tags=["setup"]
import re

import pandas as pd

from kernels.cuda import flash as cuda_flash, resources
from kernels.exercises import showing_solutions
from kernels.exercises.cuda import check_read_ptxas, check_v2_lane
from kernels.exercises.occupancy import check_occupancy
from kernels.hw.occupancy import ARCHES
from kernels.notebook import readable, setup

device, dtype = setup(device, dtype)
showing_solutions(solutions)

# %% [markdown]
# ## Task 1: read the compiler's log
#
# `nvcc -Xptxas -v` makes the assembler print, for every kernel and every architecture it
# compiles for, what one thread and one block will use. Below is real output of nvcc 13.0
# for a small file from the course's tests, compiled for sm_80 and sm_90 with at most 32
# registers per thread: `many<64>` (mangled `_Z4manyILi64EEvPKfPfi`) indexes 64 floats
# dynamically and has to spill, `tile_sum` has a 256-float `__shared__` array, and
# `helper` is a device function, not a kernel.

# %% tags=["setup"]
from kernels.cuda.ptxas import SAMPLE_PTXAS_LOG as ptxas_log

print(ptxas_log)

# %% [markdown]
# Write `read_ptxas(text, kernel, arch)` that returns `(registers, shared_bytes,
# spilled_bytes)` for one kernel (by its mangled name) on one architecture: registers per
# thread, static shared memory per block (0 when the log does not mention `smem`), and
# the bytes spilled to local memory, stores plus loads. The check feeds your function
# fresh logs in the same format with other numbers.

# %% tags=["stub"]
def read_ptxas(text, kernel, arch):
    # your code here: return registers, shared_bytes, spilled_bytes
    ...

# %% [markdown]
# :::{dropdown} Hint 1: find the right block
# A kernel's entry starts at `Compiling entry function '<kernel>' for '<arch>'` and ends
# at the next `Used ... registers` line. The same kernel appears again for the other
# architecture, with other numbers: search for the name *and* the arch.
# :::
#
# :::{dropdown} Hint 2: which number is which
# In that block, the spill line counts both directions, and the `Used` line holds the
# registers and, only if the kernel has any, its static shared memory. Beware the
# `bytes cumulative stack size` on the same line: that is local memory, not shared memory.
# :::

# %% tags=["solution", "hide-input"]
# Solution: cut out the kernel's block for that arch, then read three numbers from it.
def solution_read_ptxas(text, kernel, arch):
    start = text.index(f"Compiling entry function '{kernel}' for '{arch}'")
    used = re.compile(r"Used (\d+) registers.*").search(text, start)
    if used is None:
        raise ValueError(f"no 'Used ... registers' line after {kernel} for {arch}")
    block = text[start:used.end()]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
    if spills is None:
        raise ValueError(f"no spill line for {kernel} on {arch}")
    stores, loads = spills.groups()
    smem = re.search(r"(\d+) bytes smem", used.group(0))
    return int(used.group(1)), int(smem.group(1)) if smem else 0, int(stores) + int(loads)

# %% tags=["check"]
read = solution_read_ptxas if solutions else read_ptxas
check_read_ptxas(read)
pd.DataFrame({(kernel, arch): dict(zip(("registers", "shared B", "spilled B"), read(ptxas_log, kernel, arch)))
              for kernel in ("_Z4manyILi64EEvPKfPfi", "_Z8tile_sumPKfPf") for arch in ("sm_80", "sm_90")})

# %% [markdown]
# Capped at 32 registers, `many<64>` spills on both architectures, to local memory, which
# lives in DRAM behind the caches. The chapter's kernels spill nothing: their
# `__launch_bounds__` promise one or two blocks of 128 or 256 threads per SM, which lets
# ptxas use up to 255 registers a thread instead.
#
# ## Task 2: occupancy on sm_80 and sm_90
#
# Write `my_occupancy(threads, registers, shared_bytes, arch)` returning
# `(blocks_per_sm, fraction)`, where `fraction` is resident warps over the SM's warp slots.
# Take each architecture's limits from `ARCHES[arch]` (`kernels.hw.occupancy.ARCHES`): the
# fields `registers_per_sm`, `sub_partitions`, `register_granularity`, `shared_mem_per_sm`,
# `reserved_shared_mem_per_block`, `shared_mem_granularity`, `max_warps_per_sm` and
# `max_blocks_per_sm`. The rules are the ones chapter 5 works through by hand; what differs
# between the two architectures is in the table:

# %% tags=["setup"]
fields = ["gpus", "registers_per_sm", "sub_partitions", "register_granularity", "shared_mem_per_sm",
          "reserved_shared_mem_per_block", "shared_mem_granularity", "max_warps_per_sm", "max_blocks_per_sm"]
pd.DataFrame({arch: {f: getattr(ARCHES[arch], f) for f in fields} for arch in ("sm_80", "sm_90")}).map(readable)

# %% tags=["stub"]
def my_occupancy(threads, registers, shared_bytes, arch):
    # your code here: return blocks_per_sm, fraction
    ...

# %% [markdown]
# :::{dropdown} Hint 1: the four limits
# Registers, shared memory, warp slots and block slots each allow a number of whole blocks;
# the SM runs the smallest. A limit that does not apply (no shared memory, say) allows any
# number. Count a block in whole warps.
# :::
#
# :::{dropdown} Hint 2: the two roundings
# Registers go to a warp in units of `register_granularity`, from one scheduler's share of the
# register file (there are `sub_partitions` schedulers). Shared memory carries the
# per-block reserve and is allocated in units of `shared_mem_granularity`. Chapter 5 works
# both through for v2 on sm_80.
# :::

# %% tags=["solution", "hide-input"]
# Solution: the occupancy calculator's rules, with the limits of the architecture asked for.
def solution_occupancy(threads, registers, shared_bytes, arch):
    lim = ARCHES[arch]

    def round_up(x, unit):
        return -(-x // unit) * unit

    warps = -(-threads // 32)
    limits = [lim.max_warps_per_sm // warps, lim.max_blocks_per_sm]
    if registers:
        per_warp = round_up(registers * 32, lim.register_granularity)
        per_scheduler = lim.registers_per_sm // lim.sub_partitions // per_warp
        limits.append(per_scheduler * lim.sub_partitions // warps)
    allocated = round_up(shared_bytes + lim.reserved_shared_mem_per_block, lim.shared_mem_granularity)
    if allocated:
        limits.append(lim.shared_mem_per_sm // allocated)
    blocks = min(limits)
    return blocks, blocks * warps / lim.max_warps_per_sm

# %% tags=["check"]
occupancy_fn = solution_occupancy if solutions else my_occupancy
check_occupancy(occupancy_fn, takes_arch=True)
# v2 at bf16, D = 64, from the chapter's nvcc snapshot. ptxas counts 0 bytes of static
# shared memory: the launcher's dynamic shared memory is the block's whole share.
snapshot = resources.snapshot_kernels()
dynamic = cuda_flash.launch_config("v2", 64).dynamic_shared_bytes
rows = {}
for arch in ("sm_80", "sm_90"):
    k = resources.find_kernel(snapshot, arch, "v2", "bf16", 64)
    blocks, fraction = occupancy_fn(k.threads_per_block, k.registers, k.shared_bytes + dynamic, arch)
    rows[arch] = {"registers": k.registers, "shared B": k.shared_bytes + dynamic, "blocks/SM": blocks,
                  "occupancy %": 100 * fraction,
                  "chapter's table %": resources.occupancy_of(k).percent}
pd.DataFrame.from_dict(rows, orient="index")

# %% [markdown]
# sm_90 has more shared memory per SM than sm_80, but v2 is limited by registers on both,
# so the extra room buys it nothing: the same blocks per SM, the same occupancy.
#
# ## Task 3: which thread holds which element in v2
#
# v2's block has 256 threads, 8 warps, and 128 query rows. Warp `w` owns rows `16w` to
# `16w + 15`; inside the warp, lane `4g + t` holds rows `g` and `g + 8` of those 16, and
# columns `2t` and `2t + 1` of every 8-column tile (the accumulator layout of
# `mma.m16n8k16`). Write `lane_elements(tid)` that returns `(rows, cols)` for thread
# `tid` (0 to 255): its two query rows within the block, and its two columns within an
# 8-column tile. The check tries all 256 threads against `kernels.cuda.threads.owners_v2`,
# the chapter's figure.

# %% tags=["stub"]
def lane_elements(tid):
    # your code here: return rows, cols (two integers each)
    ...

# %% [markdown]
# :::{dropdown} Hint 1
# Split the thread index twice: into its warp and its lane within the warp, then the lane
# into the `g` and `t` of `4g + t`.
# :::
#
# :::{dropdown} Hint 2
# The rows asked for are counted in the whole block, not within the warp.
# :::

# %% tags=["solution", "hide-input"]
# Solution: split the thread index twice, into (warp, lane) and the lane into (g, t).
def solution_lane_elements(tid):
    warp, lane = divmod(tid, 32)
    g, t = divmod(lane, 4)
    return [16 * warp + g, 16 * warp + g + 8], [2 * t, 2 * t + 1]

# %% tags=["check"]
place = solution_lane_elements if solutions else lane_elements
check_v2_lane(place)
rows_of_warp = {w: sorted({r for tid in range(32 * w, 32 * w + 32) for r in place(tid)[0]}) for w in range(8)}
pd.DataFrame({f"warp {w}": [f"{rows[0]}..{rows[-1]}", len(rows)] for w, rows in rows_of_warp.items()},
             index=["query rows", "how many"]).T

# %% [markdown]
# Each warp's 32 lanes cover exactly its 16 rows, two per lane and four lanes per row. A
# row's maximum and sum therefore need only a shuffle among 4 lanes of one warp
# (`__shfl_xor_sync`), never shared memory or a barrier: the reason v2 gives each warp
# whole rows.
#
# Back to [chapter 5](../05_cuda.ipynb), or on to the [exercises of chapter 6](06_showdown.ipynb).
