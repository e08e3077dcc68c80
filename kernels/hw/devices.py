"""What a device can do at best: the two ceilings a roofline is drawn from.

Every benchmark number means more next to the ceiling it could have reached. A GPU has
two: how fast it multiplies (peak FLOP/s on its tensor cores) and how fast it moves bytes
to and from its memory (HBM bandwidth). Their ratio, the *ridge point* in FLOP per byte,
says how much work a kernel must do per byte it moves before the arithmetic, not the
memory, becomes the limit.

GPU peaks are the vendors' datasheet figures (dense, no sparsity): NVIDIA's A100 datasheet
(312 TFLOP/s bf16, 2.04 TB/s for the 80 GB SXM), H100/H200 datasheets (989 TFLOP/s;
3.35 TB/s for the H100 SXM, 4.8 TB/s for the H200) and B200 (2.25 PFLOP/s, 8 TB/s), and AMD's
MI300X datasheet (1307.4 TFLOP/s, 5.3 TB/s). A CPU has no datasheet row here, so its ceilings are *measured*
once per process: a matmul for FLOP/s and a tensor copy for bytes/s. Measured ceilings
are lower than a CPU's theoretical ones, which is the honest comparison for PyTorch code.
"""
from __future__ import annotations

import functools
import platform
import time
from dataclasses import asdict, dataclass
from typing import Optional


TERA = 1e12


@dataclass(frozen=True)
class Peaks:
    """Ceilings of one device: FLOP/s of the fastest matmul, bytes/s of its memory."""

    name: str
    flops: float          # FLOP/s
    bandwidth: float      # bytes/s
    flops_dtype: str      # the dtype the FLOP/s ceiling is for
    source: str           # where the numbers come from ("datasheet ..." or "measured ...")

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        return self.flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The roofline: FLOP/s reachable at ``intensity`` FLOP/byte (bandwidth-bound below the ridge)."""
        return min(self.flops, self.bandwidth * intensity)

    def as_dict(self) -> dict:
        return {**asdict(self), "ridge": self.ridge}

    def best_with(self, other: "Peaks") -> "Peaks":
        """Two measurements of one device's ceilings as one: the higher of each. A measured roof
        is the best the device did, so a second measurement, at a quieter moment of a shared
        machine, can only raise it."""
        if (other.name, other.flops_dtype) != (self.name, self.flops_dtype):
            raise ValueError(f"two devices' ceilings do not combine: {self.name} ({self.flops_dtype}) and "
                             f"{other.name} ({other.flops_dtype})")
        first, _, counted = self.source.partition("; the best of ")
        before = int(counted.split()[0]) if counted[:1].isdigit() else 1   # measurements already combined
        return Peaks(self.name, max(self.flops, other.flops), max(self.bandwidth, other.bandwidth), self.flops_dtype,
                     f"{first}; the best of {before + 1} measurements")


# (words the name must have, words it must not have, peaks), matched against the words of
# torch.cuda.get_device_name(). The first matching row wins. PCIe and 40 GB variants have
# other ceilings (lower clocks, slower memory) and are left out rather than guessed.
GPU_TABLE: list[tuple[tuple[str, ...], tuple[str, ...], Peaks]] = [
    # NVIDIA H200 datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s HBM (ridge 206).
    (("h200",), (), Peaks("NVIDIA H200", 989 * TERA, 4.8e12, "bfloat16", "datasheet, dense (no sparsity)")),
    # NVIDIA H100 datasheet: H100 SXM 989 TFLOP/s dense bf16, 3.35 TB/s HBM (ridge 295).
    (("h100",), ("pcie", "nvl"),
     Peaks("NVIDIA H100 SXM", 989 * TERA, 3.35e12, "bfloat16", "datasheet, dense (no sparsity)")),
    # NVIDIA A100 datasheet: 80GB SXM 312 TFLOP/s dense bf16, 2.04 TB/s HBM (ridge 153).
    (("a100",), ("pcie", "40gb"),
     Peaks("NVIDIA A100 80GB SXM", 312 * TERA, 2.04e12, "bfloat16", "datasheet, dense (no sparsity)")),
    # NVIDIA B200 (HGX B200, 1000 W): 2.25 PFLOP/s dense bf16 (the datasheet prints 4.5 PFLOP/s,
    # "with sparsity"), 8 TB/s HBM3e (ridge 281). A GB200's B200 runs at higher power (2.5 PFLOP/s).
    (("b200",), ("gb200",), Peaks("NVIDIA B200", 2250 * TERA, 8.0e12, "bfloat16", "datasheet, dense (no sparsity)")),
    # AMD Instinct MI300X datasheet: 1307.4 TFLOP/s peak dense bf16 (2614.9 with sparsity), 5.3 TB/s
    # HBM3 (ridge 247). A virtual function ("MI300X VF", what a cloud VM sees) is the same chip.
    (("mi300x",), (), Peaks("AMD Instinct MI300X", 1307.4 * TERA, 5.3e12, "bfloat16", "datasheet, dense (no sparsity)")),
    # T4 (sm75) has no bf16 tensor cores: its ceiling is 65 TFLOP/s of fp16 tensor-core
    # math, and 320 GB/s of GDDR6 (NVIDIA T4 datasheet).
    (("t4",), (), Peaks("NVIDIA T4", 65 * TERA, 0.32e12, "float16", "datasheet, fp16 tensor cores")),
]


def match_gpu(device_name: str) -> Optional[Peaks]:
    """The table's peaks for a ``torch.cuda.get_device_name()`` string, or None if unknown.

    >>> match_gpu("NVIDIA A100-SXM4-80GB").name
    'NVIDIA A100 80GB SXM'
    """
    # Whole words, so "t4" matches "Tesla T4" but not a name that merely contains "t4".
    words = set(device_name.lower().replace("-", " ").replace("_", " ").split())
    for required, forbidden, found in GPU_TABLE:
        if words.issuperset(required) and not words.intersection(forbidden):
            return found
    return None


# A trace whose deviceProperties leave the name empty (vLLM's ROCm traces do) can still name its
# GPU where the recorded properties single out one: (computeMajor, computeMinor, numSms, whole GiB
# of totalGlobalMem) -> the GPU_TABLE row. Only combinations no other GPU shares are listed: gfx 9.4
# with 304 compute units and 192 GiB is the MI300X alone (AMD's CDNA 3 datasheets: the MI300A has
# 228 CUs and 128 GB, the MI325X 304 CUs and 256 GB, the MI308X 80 CUs). An H100 SXM's properties
# (sm 9.0, 132 SMs, 79 GiB) are shared by the H800 SXM, whose peaks differ: not listed.
PROPERTY_TABLE: dict[tuple[int, int, int, int], str] = {
    (9, 4, 304, 192): "AMD Instinct MI300X",
}


def properties_key(properties: dict) -> Optional[tuple[int, int, int, int]]:
    """(computeMajor, computeMinor, numSms, GiB) of one ``deviceProperties`` entry; None where one is missing."""
    try:
        return (int(properties["computeMajor"]), int(properties["computeMinor"]), int(properties["numSms"]),
                round(int(properties["totalGlobalMem"]) / 2**30))
    except (KeyError, TypeError, ValueError):
        return None


def match_properties(properties: dict) -> Optional[str]:
    """The GPU's name where its recorded properties single out one (``PROPERTY_TABLE``), else None.

    >>> match_properties({"name": "", "computeMajor": 9, "computeMinor": 4, "numSms": 304,
    ...                   "totalGlobalMem": 206141652992})
    'AMD Instinct MI300X'
    """
    key = properties_key(properties)
    return PROPERTY_TABLE.get(key) if key else None


def properties_text(properties: dict) -> str:
    """The properties a GPU was matched by, in words ("304 compute units, 192 GiB, gfx 9.4")."""
    major, minor, units, gib = properties_key(properties) or (None,) * 4
    return f"{units} compute units, {gib} GiB, compute capability / gfx {major}.{minor}"


def trace_device(properties: list, given: Optional[str] = None) -> tuple[Optional[str], Optional[str], Optional[Peaks]]:
    """(name, how it was known, datasheet peaks) of the GPU a trace's ``deviceProperties`` describe:
    ``given`` by the user first, else the recorded name, else the properties where they single out
    one GPU (``match_properties``); (None, None, None) where nothing says."""
    if given:
        return given, "given with --device", match_gpu(given)
    names = sorted({p.get("name") for p in properties if p.get("name")})
    if names:
        name = " and ".join(names)
        return name, "named in the trace's deviceProperties", match_gpu(name)
    matched = {match_properties(p) for p in properties}
    if len(matched) == 1 and None not in matched:
        found = matched.pop()
        assert found is not None, "None was ruled out of the matches just above"
        words = properties_text(properties[0])
        return found, f"matched by its recorded properties ({words}; the name is empty): only the {found} has them", \
            match_gpu(found)
    return None, None, None


def _best_seconds(fn, repeats: int, sync) -> float:
    """Fastest of ``repeats`` timed calls: the ceiling, not the typical case."""
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


# The size of the copy that measures bandwidth: larger than a CPU's caches, so the roof is
# main memory's; it reads and writes this much (2x bytes move).
COPY_MIB = {"cpu": 32, "cuda": 256}


@functools.lru_cache(maxsize=None)
def measured_peaks(device: str = "cpu", repeats: int = 30) -> Peaks:
    """Measure a device once per process: matmul FLOP/s and copy bytes/s (well under 2 s).

    The best of many runs, not of a few: on a machine whose cores other work shares, a few runs
    can all land in a busy moment and read a roof too low, and honest points then sit above it.

    A square matmul of n does 2·n³ FLOPs. A copy of N bytes reads N and writes N, so it
    moves 2·N bytes. Both take the best of ``repeats`` runs, after one warm-up run. CPUs are
    measured in fp32 (what the course's cpu preset runs); a GPU missing from the
    table in 16-bit, on its tensor cores.
    """
    import torch  # here, not at the top: the trace tools read the peaks without torch
    on_gpu = torch.device(device).type == "cuda"
    n, copy_mib = (4096, COPY_MIB["cuda"]) if on_gpu else (768, COPY_MIB["cpu"])
    # bf16 tensor cores start at sm80 (Ampere); older GPUs get fp16.
    if on_gpu:
        dtype = torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    else:
        dtype = torch.float32
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)
    a, b, out = (torch.randn(n, n, device=device).to(dtype) for _ in range(3))
    src = torch.ones(copy_mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    torch.mm(a, b, out=out)  # warm-up: thread pool or cuBLAS start, first touch of pages
    dst.copy_(src)
    matmul_s = _best_seconds(lambda: torch.mm(a, b, out=out), repeats, sync)
    copy_s = _best_seconds(lambda: dst.copy_(src), repeats, sync)
    what = f"{n}³ {str(dtype).replace('torch.', '')} matmul, {copy_mib} MiB copy, best of {repeats}"
    if not on_gpu:
        threads = torch.get_num_threads()
        what += f", {threads} thread{'s' if threads != 1 else ''}"
    return Peaks(name=device_name(device), flops=2 * n**3 / matmul_s,
                 bandwidth=2 * src.numel() * src.element_size() / copy_s,
                 flops_dtype=str(dtype).replace("torch.", ""),
                 source=f"{'GPU' if on_gpu else 'CPU'}: measured ({what})")


def roof_for_points(points, roof: Peaks, device="cpu", tries: int = 3) -> tuple[Peaks, list]:
    """The roof to draw measured points under, and the points that still sit above it.

    ``points`` are anything with ``tflops`` and ``intensity`` (a sweep's results). A point above
    a measured CPU roof is a roof read low, in a busy moment of a shared machine, rather than a
    kernel beating the hardware: the roof is measured again, up to ``tries`` times (best of 60,
    120, ... runs: each a new measurement, not the cached one) while a point is above it, and the
    higher of each ceiling kept (``Peaks.best_with``). A GPU's datasheet roof is never measured
    again: a point above it stays listed, for the caller's check to fail on."""
    import torch  # here, not at the top: the trace tools read the peaks without torch

    def above(ceiling: Peaks) -> list:
        return [p for p in points if p.tflops * TERA > ceiling.attainable(p.intensity)]

    on_cpu = torch.device(device).type == "cpu"
    for attempt in range(1, tries + 1):
        if not (on_cpu and above(roof)):
            break
        roof = roof.best_with(measured_peaks("cpu", repeats=60 * attempt))
    return roof, above(roof)


def cpu_name() -> str:
    """The CPU's model name where Linux tells it, else the machine type."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def device_name(device) -> str:
    import torch  # here, not at the top: the trace tools read the peaks without torch
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def peaks(device="cpu") -> Optional[Peaks]:
    """Ceilings of ``device``: the table's row for a known GPU, else measured; None if unusable."""
    import torch  # here, not at the top: the trace tools read the peaks without torch
    device = torch.device(device)
    if device.type == "cpu":
        return measured_peaks("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return match_gpu(torch.cuda.get_device_name(device)) or measured_peaks(str(device))
    return None


def roofline_peaks(device="cpu") -> Peaks:
    """``peaks(device)`` where a roofline is drawn: the ceilings, or a ValueError naming the device."""
    found = peaks(device)
    if found is None:
        raise ValueError(f"kernels.hw.devices has no roofline for {device}: it knows CPUs and CUDA GPUs")
    return found


def versions() -> dict:
    """torch, Triton, CUDA and Python versions, as every result of the course records them."""
    import torch  # here, not at the top: the trace tools read the peaks without torch
    try:
        import triton  # optional: not every environment has it
        triton_version = triton.__version__
    except Exception:  # ImportError, or a broken install: report, never fail
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def describe_device(device="cpu") -> dict:
    """Everything a benchmark result should carry about where it ran, as plain data."""
    import torch  # here, not at the top: the trace tools read the peaks without torch
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("describe_device('cuda') needs a CUDA GPU; none is visible "
                               "(torch.cuda.is_available() is False)")
        major, minor = torch.cuda.get_device_capability(device)
        extra = {"capability": f"sm_{major}{minor}",
                 "memory_bytes": torch.cuda.get_device_properties(device).total_memory}
    else:
        extra = {"threads": torch.get_num_threads()}
    found = peaks(device)
    return {"name": device_name(device), "kind": device.type, **extra,
            "peaks": found.as_dict() if found else None, "versions": versions()}


def peaks_from_description(description: Optional[dict]) -> Optional[Peaks]:
    """The Peaks stored in a ``describe_device`` dict (e.g. read back from a JSON file); None
    without a description (results from before descriptions were stored) or without peaks."""
    data = description.get("peaks") if description else None
    if not data:
        return None
    return Peaks(data["name"], data["flops"], data["bandwidth"], data["flops_dtype"], data["source"])


def multiprocessors(properties: dict) -> int:
    """How many SMs (NVIDIA) or compute units (AMD) a GPU has, from one entry of a trace's
    ``deviceProperties`` (Kineto writes ``numSms`` for both vendors; ``multiProcessorCount`` is
    CUDA's own name, as ``torch.cuda.get_device_properties`` spells it)."""
    for key in ("numSms", "multiProcessorCount", "multi_processor_count"):
        if properties.get(key):
            return int(properties[key])
    raise ValueError(f"the device properties of {properties.get('name', 'this GPU')!r} give no SM or CU count "
                     f"(no numSms or multiProcessorCount among {sorted(properties)})")


def run_label(device="cpu") -> str:
    """Where a chapter's numbers were measured, in one line: the device's name and kind, and the
    versions of torch and its companions that are installed."""
    where = describe_device(device)
    return f"{where['name']} ({where['kind']}), " + ", ".join(f"{k} {v}" for k, v in where["versions"].items() if v)
