"""What the compiler says a kernel costs: registers, shared memory, spills, from ``ptxas -v``.

Ask ``nvcc`` to be verbose (``-Xptxas -v``) and the assembler logs, per kernel::

    ptxas info    : Compiling entry function '_Z8tile_sumPKfPf' for 'sm_80'
    ptxas info    : Function properties for _Z8tile_sumPKfPf
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]

``parse_ptxas`` turns that log into :class:`KernelResources`; ``compile_cuda`` runs ``nvcc``
on a torch-free ``.cu`` file and parses its log.
Also the one home of the nvcc preamble: ``nvcc_path``, ``nvcc_version``, ``check_archs``,
``gencode_flags``. Needs the CUDA compiler, not a GPU.
"smem" is *static* shared memory; dynamic shared memory is set at launch, so callers that
know the launch add it (``with_launch``).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, NamedTuple, Optional, Union


@dataclass(frozen=True)
class KernelResources:
    name: str                       # demangled when c++filt is available, else the mangled name
    mangled: str
    arch: str                       # e.g. "sm_80"
    registers: int                  # per thread
    shared_bytes: int = 0           # static shared memory per block
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_frame_bytes: int = 0
    constant_bytes: Optional[int] = None  # all cmem banks together; None: ptxas did not say
                                          # (for sm_90 it does not print cmem)
    barriers: int = 0
    # Known only from the launcher, not from ptxas (None when unknown):
    threads_per_block: Optional[int] = None
    dynamic_shared_bytes: Optional[int] = None

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    @property
    def total_shared_bytes(self) -> int:
        """Static plus dynamic shared memory: what one block takes from an SM."""
        return self.shared_bytes + (self.dynamic_shared_bytes or 0)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def parse_ptxas(text: str, demangle: bool = True) -> list[KernelResources]:
    """Every kernel ("entry function") that ``ptxas -v`` logs in ``text``, in order.

    One kernel's entry spans several lines: "Compiling entry function NAME for ARCH",
    then "Function properties for NAME" followed by its stack/spill line, then "Used N
    registers, ...". Device functions that are not kernels also get "Function properties"
    lines; they are skipped because they have no "Compiling entry function" line.
    """
    kernels: list[dict] = []
    current: Optional[dict] = None
    properties_of: Optional[str] = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = {"mangled": m.group(1), "arch": m.group(2)}
            kernels.append(current)
            properties_of = None
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and current is not None and properties_of == current["mangled"]:
            current.update(stack_frame_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                           spill_load_bytes=int(m.group(3)))
        elif (m := _USED.search(line)) and current is not None:
            current["registers"] = int(m.group(1))
            if b := _BARRIERS.search(line):
                current["barriers"] = int(b.group(1))
            if s := _SMEM.search(line):
                current["shared_bytes"] = int(s.group(1))
            if banks := _CMEM.findall(line):
                current["constant_bytes"] = sum(int(c) for c in banks)
            current = None  # "Used ..." closes a kernel's entry
    names = demangle_names([k["mangled"] for k in kernels]) if demangle else {}
    return [KernelResources(name=names.get(k["mangled"], k["mangled"]), registers=k.get("registers", 0),
                            **{key: val for key, val in k.items() if key != "registers"})
            for k in kernels]


def demangle_names(mangled: Iterable[str]) -> dict[str, str]:
    """``{mangled: readable}`` through ``c++filt``; names stay as they are without it."""
    mangled = list(dict.fromkeys(mangled))
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not mangled or tool is None:
        return {m: m for m in mangled}
    done = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True)
    readable = done.stdout.splitlines()
    if done.returncode != 0 or len(readable) != len(mangled):
        return {m: m for m in mangled}
    return dict(zip(mangled, readable))


def nvcc_path() -> Optional[str]:
    """The nvcc that would run: on PATH, else under $CUDA_HOME or $CUDA_PATH."""
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def nvcc_available() -> bool:
    return nvcc_path() is not None


@functools.lru_cache(maxsize=None)
def _version_of(nvcc: str) -> Optional[str]:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"release (\S+ V\S+)", done.stdout)
    return m.group(1) if m else None


def nvcc_version() -> Optional[str]:
    """"13.0, V13.0.88" (nvcc's own words after "release"), or None without nvcc."""
    nvcc = nvcc_path()
    return None if nvcc is None else _version_of(nvcc)


# A real architecture nvcc can generate machine code for: sm_80, sm_90, and the suffixed
# variants (sm_90a: Hopper's arch-specific features such as wgmma; sm_100f: family code).
ARCH = re.compile(r"sm_\d+[a-z]?")


def check_archs(arch: Union[str, Iterable[str]]) -> list[str]:
    """``arch`` as a list of names like "sm_80"; ValueError for anything else."""
    archs = [arch] if isinstance(arch, str) else list(arch)
    if not archs:
        raise ValueError("no architecture given; pass e.g. 'sm_80' or ['sm_80', 'sm_90']")
    for a in archs:
        if not isinstance(a, str) or not ARCH.fullmatch(a):
            raise ValueError(f"arch must look like 'sm_80' or 'sm_90a', got {a!r}")
    return archs


def gencode_flags(archs: Iterable[str]) -> list[str]:
    """One ``-gencode`` per architecture: PTX for its virtual architecture (compute_80), and
    machine code (SASS) for the real one (sm_80), whose resources ptxas logs."""
    return [f"-gencode=arch=compute_{a[3:]},code={a}" for a in check_archs(archs)]


class Compiled(NamedTuple):
    kernels: list          # [KernelResources], each kernel once per architecture
    ptx: dict              # {arch: PTX text}, with keep_ptx (else empty)
    object_code: bytes     # the host object nvcc wrote (launchers and embedded device code)


_KEPT_PTX = re.compile(r"\.compute_(\d+[a-z]?)\.ptx$")


def compile_cuda(source: Union[str, Path], arch: Union[str, Iterable[str]] = "sm_80",
                 extra_flags: Iterable[str] = (), std: str = "c++17", keep_ptx: bool = False,
                 timeout: float = 300) -> Compiled:
    """``nvcc -c -Xptxas -v`` on a torch-free .cu file: its kernels, PTX and object code.

    The one place this package calls nvcc. Every architecture goes to one nvcc call (the
    host code, the launchers included, is compiled once and checked with it), and each
    kernel is listed once per architecture. With ``keep_ptx``, ``-keep`` leaves the PTX
    of every architecture behind and it is returned too (else the dict is empty). The
    object file comes back as bytes (a test links the launchers against a stand-in runtime).
    Raises RuntimeError when nvcc is missing or the compile fails, with nvcc's own message.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("compiling CUDA needs the CUDA compiler nvcc; none is on PATH "
                           "(nor under CUDA_HOME/CUDA_PATH). Install the CUDA toolkit.")
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"no CUDA source at {source}")
    archs = check_archs(arch)
    flags = [f"-std={std}", "-O3", *gencode_flags(archs), "-Xptxas", "-v", *extra_flags]
    return _run_nvcc(nvcc, source, archs, flags, keep_ptx, timeout)


def _run_nvcc(nvcc: str, source: Path, archs: list, flags: list, keep_ptx: bool, timeout: float) -> Compiled:
    with tempfile.TemporaryDirectory() as tmp:
        keep = ["-keep", "--keep-dir", tmp] if keep_ptx else []
        cmd = [nvcc, "-c", *flags, *keep, str(source), "-o", str(Path(tmp) / "kernel.o")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source.name} for {', '.join(archs)} (exit {done.returncode}):\n"
                               f"{done.stderr.strip() or done.stdout.strip()}")
        ptx = {}
        if keep_ptx:
            kept = sorted(Path(tmp).glob("*.ptx"))
            for path in kept:  # one architecture: name.ptx; several: name.compute_80.ptx, ...
                m = _KEPT_PTX.search(path.name)
                ptx[f"sm_{m.group(1)}" if m else archs[0]] = path.read_text()
            if sorted(ptx) != sorted(archs):
                raise RuntimeError(f"expected PTX for {archs} from nvcc -keep, found {[p.name for p in kept]}")
        object_code = (Path(tmp) / "kernel.o").read_bytes()
    return Compiled(parse_ptxas(done.stdout + "\n" + done.stderr), ptx, object_code)


def triton_ptxas(capability: int) -> str:
    """The path of the ptxas Triton itself runs for a GPU of ``capability`` (80, 90, 100, ...).

    Triton ships two ptxas builds and picks one by architecture in
    ``triton.backends.nvidia.compiler.get_ptxas``: up to 3.8 the newer one
    (``knobs.nvidia.ptxas_blackwell``) from sm_100 on, since 3.9 from sm_90 on. The PTX Triton
    writes for a target is only readable by the ptxas it chose (an older one refuses its
    ``.version``), so reading that PTX's resources must run the same one: asked of Triton, not copied.
    """
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:   # a Triton without the chooser: the one ptxas it knows
        return triton.knobs.nvidia.ptxas.path
    return get_ptxas(int(capability)).path


def with_launch(kernel: KernelResources, threads_per_block: int, dynamic_shared_bytes: int) -> KernelResources:
    """The same resources, completed with what only the launcher knows."""
    return replace(kernel, threads_per_block=threads_per_block, dynamic_shared_bytes=dynamic_shared_bytes)


# A real ptxas log, for the tests and the chapter 5 exercise: output of nvcc 13.0
# (`nvcc -c -gencode ...sm_80 -gencode ...sm_90 -maxrregcount=32 -Xptxas -v`, compile-time
# lines removed) for a file with a kernel that spills (`many<64>`,
# 64 floats indexed dynamically with only 32 registers allowed), a kernel with a 256-float
# __shared__ array (`tile_sum`), and a non-inlined device function (`helper`), which is not
# a kernel and must not be listed as one.
SAMPLE_PTXAS_LOG = """\
ptxas info    : Overriding maximum register limit 256 for '_Z4manyILi64EEvPKfPfi' with  32 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z8tile_sumPKfPf' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4manyILi64EEvPKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z4manyILi64EEvPKfPfi
    1072 bytes stack frame, 880 bytes spill stores, 924 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1072 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compiling entry function '_Z8tile_sumPKfPf' for 'sm_80'
ptxas info    : Function properties for _Z8tile_sumPKfPf
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 1 barriers, 32 bytes cumulative stack size, 1024 bytes smem, 368 bytes cmem[0]
ptxas info    : Function properties for _Z6helperPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Overriding maximum register limit 256 for '_Z4manyILi64EEvPKfPfi' with  32 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z8tile_sumPKfPf' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4manyILi64EEvPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z4manyILi64EEvPKfPfi
    1056 bytes stack frame, 880 bytes spill stores, 948 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1056 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z8tile_sumPKfPf' for 'sm_90'
ptxas info    : Function properties for _Z8tile_sumPKfPf
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 1 barriers, 32 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Function properties for _Z6helperPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
