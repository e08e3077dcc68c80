"""Theoretical occupancy: how many warps a kernel's footprint lets an SM keep resident.

    blocks per SM = min(register limit, shared-memory limit, warp-slot limit, block-slot limit)
    occupancy     = blocks per SM x warps per block / max warps per SM

The arithmetic follows ``cuda_occupancy.h`` (the CUDA toolkit's header-only calculator),
with its roundings: registers per warp in units of 256, the register file split over 4
sub-partitions, shared memory in units of 128 bytes plus 1 KB reserved per block from Ampere on.

    >>> occ = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_80")
    >>> occ.blocks_per_sm, occ.warps_per_sm, occ.fraction, occ.limited_by
    (2, 8, 0.125, 'registers')

``explain()`` gives the whole arithmetic, one line per limit.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Union

KB = 1024


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of a compute capability can hold (the calculator's per-GPU table)."""

    name: str                       # "sm_80"
    capability: tuple               # (8, 0)
    gpus: str                       # examples, for a reader
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_mem_per_sm: int          # bytes: the largest shared-memory carveout
    max_shared_mem_per_block: int   # bytes a block may ask for (with the opt-in attribute)
    reserved_shared_mem_per_block: int  # bytes the driver adds to every block
    shared_mem_granularity: int     # shared memory is allocated in units of this many bytes
    registers_per_sm: int = 64 * KB
    max_registers_per_block: int = 64 * KB
    max_registers_per_thread: int = 255
    register_granularity: int = 256  # registers per warp are allocated in units of this
    sub_partitions: int = 4          # warp schedulers; each owns 1/4 of the register file
    max_threads_per_block: int = 1024
    warp_size: int = 32


# Sources, checked against each other:
# * NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" appendix, technical
#   specifications table (docs.nvidia.com/cuda/cuda-programming-guide, section 5.1) and
#   its per-architecture notes, e.g. for 8.6: "shared memory capacity can be set to
#   0, 8, 16, 32, 64 or 100 KB ... a single thread block [may] address up to 99 KB ...
#   The 1 KB of shared memory not made available to a thread block is reserved for
#   system use."
# * cuda_occupancy.h (CUDA 13.0): max blocks per SM 32 on 7.0, 16 on 7.5, 32 on 8.0,
#   16 on 8.6 and 8.7, 24 on 8.9, 32 on 9.0 and 10.0, 24 on 12.x; shared-memory carveouts
#   up to 96 KB on 7.0, 164 KB on 8.0 and 8.7, 228 KB on 9.0 and 10.x, 100 KB on 12.x;
#   shared-memory allocation unit 256 B on 7.x and 128 B from 8.x on; register
#   allocation unit 256; 4 sub-partitions; "Starting Ampere, CUDA driver reserves
#   additional shared memory per block" (1 KB, reservedSharedMemPerBlock).
# * Resident warps per SM (the Programming Guide's table): 64 on 7.0, 8.0, 9.0 and 10.0;
#   32 on 7.5; 48 on 8.6, 8.7, 8.9 and 12.0.
# * The CUDA Occupancy Calculator spreadsheet (as ported to JavaScript by the
#   cuda-calculator web page): 167,936 B per SM on 8.0, 102,400 on 8.6, 65,536 on 7.5.
ARCHES: dict[str, ArchLimits] = {
    a.name: a for a in (
        ArchLimits("sm_70", (7, 0), "V100, Titan V", max_warps_per_sm=64,
                   max_blocks_per_sm=32, shared_mem_per_sm=96 * KB,
                   max_shared_mem_per_block=96 * KB, reserved_shared_mem_per_block=0,
                   shared_mem_granularity=256),
        ArchLimits("sm_75", (7, 5), "T4, RTX 20xx, Quadro RTX", max_warps_per_sm=32,
                   max_blocks_per_sm=16, shared_mem_per_sm=64 * KB,
                   max_shared_mem_per_block=64 * KB, reserved_shared_mem_per_block=0,
                   shared_mem_granularity=256),
        ArchLimits("sm_80", (8, 0), "A100, A30", max_warps_per_sm=64,
                   max_blocks_per_sm=32, shared_mem_per_sm=164 * KB,
                   max_shared_mem_per_block=163 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_86", (8, 6), "A10, A40, RTX 30xx, RTX A6000", max_warps_per_sm=48,
                   max_blocks_per_sm=16, shared_mem_per_sm=100 * KB,
                   max_shared_mem_per_block=99 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_87", (8, 7), "Jetson AGX Orin, Orin NX", max_warps_per_sm=48,
                   max_blocks_per_sm=16, shared_mem_per_sm=164 * KB,
                   max_shared_mem_per_block=163 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_89", (8, 9), "L4, L40S, RTX 40xx", max_warps_per_sm=48,
                   max_blocks_per_sm=24, shared_mem_per_sm=100 * KB,
                   max_shared_mem_per_block=99 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_90", (9, 0), "H100, H200, GH200", max_warps_per_sm=64,
                   max_blocks_per_sm=32, shared_mem_per_sm=228 * KB,
                   max_shared_mem_per_block=227 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_100", (10, 0), "B200, B100, GB200", max_warps_per_sm=64,
                   max_blocks_per_sm=32, shared_mem_per_sm=228 * KB,
                   max_shared_mem_per_block=227 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
        ArchLimits("sm_120", (12, 0), "RTX 50xx, RTX PRO Blackwell", max_warps_per_sm=48,
                   max_blocks_per_sm=24, shared_mem_per_sm=100 * KB,
                   max_shared_mem_per_block=99 * KB, reserved_shared_mem_per_block=KB,
                   shared_mem_granularity=128),
    )
}

# When two limits allow the same number of blocks, name the first of this order.
LIMITS = ("registers", "shared_memory", "warps", "blocks")

ArchLike = Union[str, tuple, list, ArchLimits]


# --------------------------------------------------------------------------- arch names

def _known() -> str:
    return ", ".join(f"{a.name} ({a.capability[0]}.{a.capability[1]}: {a.gpus})"
                     for a in ARCHES.values())


def _limits(arch: ArchLike) -> ArchLimits:
    """Accept "sm_80", "sm80", "sm_90a", "compute_80", "8.0", (8, 0) or an ArchLimits."""
    if isinstance(arch, ArchLimits):
        return arch
    capability = _parse_capability(arch)
    name = f"sm_{capability[0]}{capability[1]}" if capability else None
    if name not in ARCHES:
        raise ValueError(f"unknown GPU architecture {arch!r}; known: {_known()}")
    return ARCHES[name]


def _parse_capability(arch) -> Optional[tuple]:
    if isinstance(arch, (tuple, list)) and len(arch) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in arch):
        return int(arch[0]), int(arch[1])
    if not isinstance(arch, str):
        return None
    text = arch.strip().lower()
    m = re.fullmatch(r"(?:sm|compute)_?(\d+)(\d)a?", text) or re.fullmatch(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


# Marketing names -> architecture, most specific first ("A100" before "A10", "Ada" before
# "RTX 6000", "L40" before "L4"). Word boundaries keep "A10" from matching "A100".
_GPU_NAMES = (
    (r"\bG?B(100|200)\b", "sm_100"),
    (r"RTX 50\d\d|RTX PRO \d{4} Blackwell", "sm_120"),
    (r"\bG?H(100|200|800|20)\b", "sm_90"),
    (r"\bAda\b|\bL40S?\b|\bL4\b|RTX 40\d\d", "sm_89"),
    (r"\bA(100|30|800)\b", "sm_80"),
    (r"\bA(10G?|16|40|2)\b|RTX 30\d\d|RTX A\d{4}", "sm_86"),
    (r"\bOrin\b", "sm_87"),
    (r"\bT4\b|RTX 20\d\d|Quadro RTX|TITAN RTX|GTX 16\d\d", "sm_75"),
    (r"\bV100\b|TITAN V\b|Quadro GV100", "sm_70"),
)


def arch_of(device) -> str:
    """The architecture name ("sm_80") of a GPU name, a capability, or torch device properties.

    Accepts "NVIDIA A100-SXM4-80GB", "NVIDIA H200", (8, 6), "8.9", "sm_90a", or the
    object ``torch.cuda.get_device_properties(i)`` returns (it has .major and .minor).
    """
    if hasattr(device, "major") and hasattr(device, "minor"):
        return _limits((int(device.major), int(device.minor))).name
    if _parse_capability(device) is not None or isinstance(device, (tuple, list, ArchLimits)):
        return _limits(device).name
    if isinstance(device, str):
        for pattern, name in _GPU_NAMES:
            if re.search(pattern, device, flags=re.IGNORECASE):
                return name
    raise ValueError(f"cannot tell the architecture of {device!r}; pass a compute capability "
                     f"such as (8, 0) or one of: {_known()}")


# --------------------------------------------------------------------------- the result

@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel footprint on one architecture."""

    arch: str
    threads_per_block: int
    registers_per_thread: int
    shared_mem_per_block: int           # bytes the kernel asks for (static + dynamic)
    warps_per_block: int
    registers_per_warp: int             # as allocated: rounded up to the register unit
    shared_mem_allocated_per_block: int  # bytes, with the reserved KB and the rounding
    blocks_by_registers: Optional[int]  # None: this resource sets no limit
    blocks_by_shared_memory: Optional[int]
    blocks_by_warps: int
    blocks_by_blocks: int
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limited_by: str                     # one of LIMITS
    limiters: tuple                     # every limit that allows only blocks_per_sm

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's warp slots, 0..1."""
        return self.warps_per_sm / self.max_warps_per_sm

    @property
    def percent(self) -> float:
        return 100.0 * self.fraction

    @property
    def blocks_by(self) -> dict:
        """Blocks each limit allows on its own ({"registers": 2, ...}; None = no limit)."""
        return {"registers": self.blocks_by_registers,
                "shared_memory": self.blocks_by_shared_memory,
                "warps": self.blocks_by_warps, "blocks": self.blocks_by_blocks}

    def explain(self) -> str:
        """The arithmetic in words, one line per limit, as a reader would check it by hand."""
        return "\n".join(_explain(self, ARCHES[self.arch]))


# --------------------------------------------------------------------------- the arithmetic

def occupancy(threads_per_block: int, registers_per_thread: int, shared_mem_per_block: int = 0,
              arch: ArchLike = "sm_80") -> Occupancy:
    """Theoretical occupancy of a kernel footprint, as the CUDA Occupancy Calculator gives it.

    ``shared_mem_per_block`` is the kernel's own static + dynamic shared memory in bytes
    (what a trace's "shared memory" field and ``ptxas -v`` report); the driver's reserved
    kilobyte is added here. The SM is assumed to use its largest shared-memory carveout,
    the calculator's default. A footprint whose registers cannot fit one block gives 0
    blocks (the launch would fail with "too many resources requested"), as in CUDA.
    """
    lim = _limits(arch)
    _check(lim, threads_per_block, registers_per_thread, shared_mem_per_block)
    warps = math.ceil(threads_per_block / lim.warp_size)
    regs_per_warp = _round_up(registers_per_thread * lim.warp_size, lim.register_granularity)
    smem_alloc = _round_up(shared_mem_per_block + lim.reserved_shared_mem_per_block,
                           lim.shared_mem_granularity)
    by_registers = _blocks_by_registers(lim, warps, regs_per_warp)
    by_shared = lim.shared_mem_per_sm // smem_alloc if smem_alloc else None
    by_warps = lim.max_warps_per_sm // warps
    by_blocks = lim.max_blocks_per_sm
    by = {"registers": by_registers, "shared_memory": by_shared, "warps": by_warps, "blocks": by_blocks}
    blocks = min(n for n in by.values() if n is not None)
    limiters = tuple(k for k in LIMITS if by[k] == blocks)
    return Occupancy(
        arch=lim.name, threads_per_block=threads_per_block,
        registers_per_thread=registers_per_thread, shared_mem_per_block=shared_mem_per_block,
        warps_per_block=warps, registers_per_warp=regs_per_warp,
        shared_mem_allocated_per_block=smem_alloc,
        blocks_by_registers=by_registers, blocks_by_shared_memory=by_shared,
        blocks_by_warps=by_warps, blocks_by_blocks=by_blocks,
        blocks_per_sm=blocks, warps_per_sm=blocks * warps, max_warps_per_sm=lim.max_warps_per_sm,
        limited_by=limiters[0], limiters=limiters,
    )


def _blocks_by_registers(lim: ArchLimits, warps: int, regs_per_warp: int) -> Optional[int]:
    if regs_per_warp == 0:
        return None
    # The launch check assumes a block's warps are spread over all sub-partitions at once,
    # so it rounds the warp count up to a multiple of 4 before comparing with 64K.
    if regs_per_warp * _round_up(warps, lim.sub_partitions) > lim.max_registers_per_block:
        return 0
    # A warp lives on one scheduler and takes its registers from that scheduler's quarter.
    warps_per_partition = (lim.registers_per_sm // lim.sub_partitions) // regs_per_warp
    return warps_per_partition * lim.sub_partitions // warps


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _check(lim: ArchLimits, threads: int, registers: int, shared: int) -> None:
    for name, value in (("threads_per_block", threads), ("registers_per_thread", registers),
                        ("shared_mem_per_block", shared)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= threads <= lim.max_threads_per_block:
        raise ValueError(f"threads_per_block={threads}: a block holds 1 to "
                         f"{lim.max_threads_per_block} threads")
    if not 0 <= registers <= lim.max_registers_per_thread:
        raise ValueError(f"registers_per_thread={registers}: a thread may use 0 to "
                         f"{lim.max_registers_per_thread} registers on {lim.name}")
    if not 0 <= shared <= lim.max_shared_mem_per_block:
        raise ValueError(f"shared_mem_per_block={shared:,} B: a block may use 0 to "
                         f"{lim.max_shared_mem_per_block:,} B "
                         f"({lim.max_shared_mem_per_block // KB} KB) on {lim.name}")


# ------------------------------------------------------------------- what Kineto writes

# The per-block shared-memory limit Kineto's estimate assumes: CUDA's default, without the
# opt-in to more that big kernels use (FUNC_SHMEM_LIMIT_DEFAULT, maxDynamicSharedSizeBytes 0).
KINETO_SHARED_MEM_LIMIT = 48 * KB


def kineto_estimate(threads_per_block: int, registers_per_thread: int, shared_mem_per_block: int,
                    grid_blocks: int, sm_count: int, arch: ArchLike) -> float:
    """The trace's "est. achieved occupancy %" as Kineto computes it, from the same footprint.

    Kineto (pytorch/kineto, ``libkineto/src/CudaDeviceProperties.cpp``, ``kernelOccupancy``)
    asks CUDA's occupancy calculator how many blocks fit one SM with the *default* 48 KiB of
    shared memory per block, caps that at the grid's blocks per SM (grid / SMs, an average),
    and divides the threads by the SM's maximum. So a kernel that opts into more than 48 KiB
    reads 0% whatever its real occupancy, and a small grid reads low because it is small.
    """
    if shared_mem_per_block > KINETO_SHARED_MEM_LIMIT:
        return 0.0
    lim = _limits(arch)
    fits = occupancy(threads_per_block, registers_per_thread, shared_mem_per_block, arch).blocks_per_sm
    blocks = min(fits, grid_blocks / sm_count)
    return 100.0 * blocks * threads_per_block / (lim.max_warps_per_sm * lim.warp_size)


# ------------------------------------------------------------ a kernel as a trace recorded it

@dataclass(frozen=True)
class TraceKernel:
    """One kernel's footprint as a Kineto trace recorded it, on the GPU its trace describes,
    with the occupancy it allows and the profiler's estimate recomputed."""

    name: str
    grid: tuple
    block: tuple
    registers_per_thread: int
    shared_mem_per_block: int
    recorded_percent: Optional[float]   # the trace's "est. achieved occupancy %"
    sm_count: int                       # the trace's deviceProperties numSms
    occupancy: Occupancy                # what the footprint allows (resident blocks and warps)

    @property
    def grid_blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)

    @property
    def kineto_percent(self) -> float:
        """Kineto's estimate recomputed from the footprint (``kineto_estimate``), unrounded."""
        return kineto_estimate(self.threads_per_block, self.registers_per_thread, self.shared_mem_per_block,
                               self.grid_blocks, self.sm_count, self.occupancy.arch)

    @property
    def kineto_rounded(self) -> int:
        """As the trace writes it: a whole number, halves rounded up (``std::lround``)."""
        return math.floor(self.kineto_percent + 0.5)

    @property
    def resident_blocks(self) -> int:
        """Blocks the whole GPU holds at once: resident blocks per SM x SMs."""
        return self.occupancy.blocks_per_sm * self.sm_count

    @property
    def waves(self) -> float:
        """The grid over what the GPU holds at once (5.0: five full rounds of blocks)."""
        return self.grid_blocks / self.resident_blocks if self.resident_blocks else math.inf

    def summary(self) -> dict:
        """The footprint as the trace recorded it, and what it allows, for a table."""
        return {"kernel": re.split(r"[<(]", self.name.removeprefix("void "), maxsplit=1)[0],
                "grid": list(self.grid), "block (threads)": list(self.block),
                "registers per thread": self.registers_per_thread,
                "shared memory (KiB)": self.shared_mem_per_block / KB,
                "est. achieved occupancy % (the trace's)": self.recorded_percent,
                "Kineto's estimate, recomputed %": round(self.kineto_percent, 2),
                "resident blocks per SM": self.occupancy.blocks_per_sm, "limited by": self.occupancy.limited_by,
                "SMs (numSms)": self.sm_count, "waves": round(self.waves, 2)}


# deviceProperties field -> the calculator's table, for the limits a trace records
_DEVICE_FIELDS = {"regsPerMultiprocessor": "registers_per_sm", "sharedMemPerMultiprocessor": "shared_mem_per_sm",
                  "sharedMemPerBlockOptin": "max_shared_mem_per_block", "warpSize": "warp_size"}


def device_limits_table(props: Mapping):
    """The SM limits a trace's ``deviceProperties`` entry records, threads per SM included, as a
    table indexed by deviceProperties field: the trace's value, then the occupancy table's for
    the architecture the trace records."""
    import pandas as pd

    lim = _limits((int(props["computeMajor"]), int(props["computeMinor"])))
    rows = [(f, props[f], getattr(lim, attr)) for f, attr in _DEVICE_FIELDS.items() if f in props]
    if "maxThreadsPerMultiProcessor" in props or "maxThreadsPerMultiprocessor" in props:
        threads = props.get("maxThreadsPerMultiProcessor", props.get("maxThreadsPerMultiprocessor"))
        rows.append(("maxThreadsPerMultiprocessor", threads, lim.max_warps_per_sm * lim.warp_size))
    columns = ["deviceProperties field", "the trace", f"kernels.hw.occupancy's {lim.name} table"]
    return pd.DataFrame(rows, columns=columns).set_index(columns[0])


def trace_kernel(kernel: Mapping, device_properties: list) -> TraceKernel:
    """A kernel row of ``Step.gpu_work`` (or a Kineto kernel event's ``args``) read with the
    ``deviceProperties`` of its trace: the architecture from the recorded compute capability,
    the SM count from ``numSms``. A ValueError names what the trace did not record (ROCm traces
    record no registers or shared memory)."""
    args = kernel.get("args", kernel)
    get = {"registers_per_thread": "registers per thread", "shared_memory": "shared memory",
           "occupancy_pct": "est. achieved occupancy %"}
    value = {k: args.get(k, args.get(alias)) for k, alias in get.items()}
    missing = [k for k in ("grid", "block", "registers_per_thread", "shared_memory")
               if _absent(args.get(k, value.get(k)))]
    if missing:
        raise ValueError(f"the trace recorded no {', '.join(missing)} for {str(kernel.get('name', 'this kernel'))[:60]!r}"
                         " (CUDA traces do; ROCm traces record grid and block only)")
    device = str(args.get("device", 0))
    props = next((p for p in device_properties if str(p.get("id", 0)) == device), None)
    if props is None or "computeMajor" not in props or "numSms" not in props:
        raise ValueError(f"the trace's deviceProperties say nothing of device {device} "
                         "(its compute capability and SM count are needed)")
    occ = occupancy(threads_per_block=math.prod(int(x) for x in args["block"]),
                    registers_per_thread=int(value["registers_per_thread"]),
                    shared_mem_per_block=int(value["shared_memory"]),
                    arch=(int(props["computeMajor"]), int(props["computeMinor"])))
    pct = value["occupancy_pct"]
    return TraceKernel(name=str(kernel.get("name", "")), grid=tuple(int(x) for x in args["grid"]),
                       block=tuple(int(x) for x in args["block"]),
                       registers_per_thread=int(value["registers_per_thread"]),
                       shared_mem_per_block=int(value["shared_memory"]),
                       recorded_percent=None if _absent(pct) else float(pct),
                       sm_count=int(props["numSms"]), occupancy=occ)


def _absent(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# --------------------------------------------------------------------------- the words

def _explain(o: Occupancy, lim: ArchLimits) -> list:
    lines = [
        f"{lim.name} ({lim.gpus}): per SM {lim.max_warps_per_sm} warps, "
        f"{lim.max_blocks_per_sm} blocks, {lim.registers_per_sm:,} registers, "
        f"{lim.shared_mem_per_sm // KB} KiB shared memory.",
        f"Block: {o.threads_per_block} threads = {_n(o.warps_per_block, 'warp')}.",
    ]
    lines += _explain_registers(o, lim)
    lines.append(_explain_shared(o, lim))
    lines.append(f"Warp slots: {lim.max_warps_per_sm} // {o.warps_per_block} = "
                 f"{_n(o.blocks_by_warps, 'block')}. Block slots: {_n(o.blocks_by_blocks, 'block')}.")
    lines.append(f"Result: {_n(o.blocks_per_sm, 'block')} (limited by {_words(o.limiters)}) x "
                 f"{_n(o.warps_per_block, 'warp')} = {o.warps_per_sm} warps of {o.max_warps_per_sm} "
                 f"-> {_pct(o.fraction)}.")
    return lines


def _explain_registers(o: Occupancy, lim: ArchLimits) -> list:
    r = o.registers_per_thread
    if r == 0:
        return ["Registers: none reported -> no limit."]
    per_block = o.threads_per_block * r
    quarter = lim.registers_per_sm // lim.sub_partitions
    naive = (f"Registers: {o.threads_per_block} threads x {r} registers = {per_block:,} "
             f"registers per block -> {lim.registers_per_sm:,} // {per_block:,} = "
             f"{_n(lim.registers_per_sm // per_block, 'block')}.")
    rounded = ("" if o.registers_per_warp == r * lim.warp_size else
               f", rounded up to {o.registers_per_warp:,} (units of {lim.register_granularity})")
    if o.blocks_by_registers == 0:
        detail = (f"  As allocated: {r} x {lim.warp_size} = {r * lim.warp_size:,} per warp"
                  f"{rounded}; {o.warps_per_block} warps do not fit in {lim.max_registers_per_block:,}"
                  " registers: 0 blocks, the launch fails.")
        return [naive, detail]
    assert o.blocks_by_registers is not None, "registers per thread > 0 give registers a limit"
    per_quarter = quarter // o.registers_per_warp
    detail = (f"  As allocated: {r} x {lim.warp_size} = {r * lim.warp_size:,} per warp{rounded}; "
              f"each of {lim.sub_partitions} schedulers holds {quarter:,} registers = "
              f"{_n(per_quarter, 'warp')} -> {per_quarter * lim.sub_partitions} warps per SM -> "
              f"{per_quarter * lim.sub_partitions} // {o.warps_per_block} = "
              f"{_n(o.blocks_by_registers, 'block')}.")
    return [naive, detail]


def _explain_shared(o: Occupancy, lim: ArchLimits) -> str:
    if o.shared_mem_allocated_per_block == 0:
        return "Shared memory: none used -> no limit."
    assert o.blocks_by_shared_memory is not None, "allocated shared memory > 0 gives it a limit"
    reserved = (f" + {lim.reserved_shared_mem_per_block:,} B reserved"
                if lim.reserved_shared_mem_per_block else "")
    return (f"Shared memory: {o.shared_mem_per_block:,} B{reserved}, in units of "
            f"{lim.shared_mem_granularity} B = {o.shared_mem_allocated_per_block:,} B per block -> "
            f"{lim.shared_mem_per_sm:,} // {o.shared_mem_allocated_per_block:,} = "
            f"{_n(o.blocks_by_shared_memory, 'block')}.")


_LIMIT_WORDS = {"registers": "registers", "shared_memory": "shared memory",
                "warps": "warp slots", "blocks": "block slots"}


def _words(limiters: tuple) -> str:
    return " and ".join(_LIMIT_WORDS[k] for k in limiters)


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.2f}".rstrip("0").rstrip(".") + "%"



# --------------------------------------------------------------------------- a launch

@dataclass(frozen=True)
class Launch:
    """One kernel launch: its grid and footprint, and where they were read or computed from.

    ``registers_per_thread`` is None where only a compile can tell (a Triton config before it
    is compiled): occupancy then counts shared memory, warps and block slots only, an upper bound.
    """

    kernel: str
    grid: tuple
    threads_per_block: int
    registers_per_thread: Optional[int]
    shared_mem_per_block: int
    source: str

    @property
    def blocks(self) -> int:
        return math.prod(int(x) for x in self.grid)

    def occupancy(self, arch: ArchLike) -> Occupancy:
        return occupancy(self.threads_per_block, self.registers_per_thread or 0, self.shared_mem_per_block, arch)

    def waves(self, arch: ArchLike, sm_count: int) -> float:
        """Blocks over what all SMs hold at once: 1.0 fills the GPU exactly once."""
        if sm_count < 1:
            raise ValueError(f"sm_count must be at least 1, got {sm_count}")
        per_sm = self.occupancy(arch).blocks_per_sm
        if per_sm == 0:
            raise ValueError(f"{self.kernel}: no block of this footprint fits one SM of {_limits(arch).name}")
        return self.blocks / (per_sm * sm_count)


def launch_from_footprint(kernel: str, footprint: Mapping, source: str) -> Launch:
    """A Launch from a trace's footprint (``AttentionCall.footprint()``: grid, block,
    registers_per_thread, shared_memory)."""
    missing = [k for k in ("grid", "block", "registers_per_thread", "shared_memory") if footprint.get(k) is None]
    if missing:
        raise ValueError(f"the footprint has no {', '.join(missing)}: only GPU kernel events carry one")
    return Launch(kernel, tuple(int(x) for x in footprint["grid"]), math.prod(int(x) for x in footprint["block"]),
                  int(footprint["registers_per_thread"]), int(footprint["shared_memory"]), source)


def launch_table(launches, arch: ArchLike, sm_count: int):
    """One row per launch: grid, block, footprint, CTAs per SM, occupancy and waves on ``sm_count`` SMs."""
    import pandas as pd

    rows = []
    for launch in launches:
        occ = launch.occupancy(arch)
        bound = launch.registers_per_thread is None
        rows.append({"kernel": launch.kernel, "grid": " x ".join(map(str, launch.grid)), "blocks": launch.blocks,
                     "threads per block": launch.threads_per_block,
                     "registers": "?" if bound else launch.registers_per_thread,
                     "shared KiB": round(launch.shared_mem_per_block / KB, 1),
                     "CTAs per SM": f"<= {occ.blocks_per_sm}" if bound else occ.blocks_per_sm,
                     "occupancy %": f"<= {occ.percent:g}" if bound else round(occ.percent, 2),
                     "limited by": " and ".join(_LIMIT_WORDS[k] for k in occ.limiters),
                     "waves": f">= {launch.waves(arch, sm_count):.2f}" if bound else round(launch.waves(arch, sm_count), 2),
                     "from": launch.source})
    return pd.DataFrame(rows).set_index("kernel")


__all__ = ["ARCHES", "ArchLimits", "KINETO_SHARED_MEM_LIMIT", "LIMITS", "Launch", "Occupancy", "TraceKernel", "arch_of", "device_limits_table", "kineto_estimate", "launch_from_footprint", "launch_table", "occupancy", "trace_kernel"]
