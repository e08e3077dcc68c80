"""The CUDA kernels compile, fit the GPUs they are for, and launch what they should.

Needs nvcc, not a GPU: every torch-free .cu in kernels/cuda/csrc is compiled once for sm_80 (A100)
and sm_90 (H100/H200) with ``-Xptxas -v`` (the compile is shared with tests/cuda/test_cuda_resources.py
within a run). The host objects of that compile, launchers included, are linked against a
stand-in CUDA runtime (tests/cuda/launch_stub.cpp) that records each launch instead of running
it, so grids, blocks, shared memory and the opt-in above 48 KiB are checked on a CPU. The
tile schedule of flash_api.h is checked against the float64 reference's mask. The torch
binding is not compiled here (it takes over a minute against torch's headers); set
ATTN_CHECK_BINDING=1 to syntax-check it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest

import kernels.cuda.flash as cf
from kernels import reference
from kernels.hw import occupancy
from kernels.cuda import ptxas

ARCHS = ("sm_80", "sm_90")
needs_nvcc = pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs the CUDA compiler nvcc (not on PATH)")


def test_parse_ptxas_reads_every_kernel_once_per_arch():
    found = ptxas.parse_ptxas(ptxas.SAMPLE_PTXAS_LOG, demangle=False)
    assert [(k.mangled, k.arch) for k in found] == [
        ("_Z4manyILi64EEvPKfPfi", "sm_80"), ("_Z8tile_sumPKfPf", "sm_80"),
        ("_Z4manyILi64EEvPKfPfi", "sm_90"), ("_Z8tile_sumPKfPf", "sm_90")]
    many80, tile80, many90, tile90 = found
    # Numbers as the sample's lines state them.
    assert (many80.registers, many80.stack_frame_bytes, many80.spill_store_bytes, many80.spill_load_bytes,
            many80.barriers, many80.shared_bytes, many80.constant_bytes) == (32, 1072, 880, 924, 0, 0, 372)
    assert many80.spills and not tile80.spills
    # 256 floats x 4 bytes = 1024 bytes of static shared memory.
    assert (tile80.registers, tile80.shared_bytes, tile80.barriers, tile80.constant_bytes) == (18, 1024, 1, 368)
    assert tile80.stack_frame_bytes == 32  # the kernel's own frame, not helper's 0 that follows
    # sm_90's ptxas prints no cmem: unknown, not zero.
    assert many90.constant_bytes is None and tile90.constant_bytes is None
    assert (many90.stack_frame_bytes, many90.spill_load_bytes) == (1056, 948)
    assert tile90.total_shared_bytes == 1024  # no launcher info: dynamic counts as 0


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt to demangle")
def test_parse_ptxas_demangles_names_and_keeps_the_mangled_ones():
    found = ptxas.parse_ptxas(ptxas.SAMPLE_PTXAS_LOG)
    assert found[0].name == "void many<64>(float const*, float*, int)"
    assert found[0].mangled == "_Z4manyILi64EEvPKfPfi"
    assert found[1].name == "tile_sum(float const*, float*)"


def test_parse_ptxas_of_nothing_is_empty():
    assert ptxas.parse_ptxas("") == []


def test_arch_names_have_one_pattern():
    # One rule for every caller (compile_cuda, the chapter's PTX compile): plain, arch-specific
    # ("a") and family ("f") targets pass; anything else is refused before nvcc runs.
    assert ptxas.check_archs("sm_90a") == ["sm_90a"]
    assert ptxas.gencode_flags(["sm_80", "sm_100f"]) == ["-gencode=arch=compute_80,code=sm_80",
                                                         "-gencode=arch=compute_100f,code=sm_100f"]
    for bad in ("80", "compute_80", "sm90", "sm_90ab", ""):
        with pytest.raises(ValueError, match="arch must look like"):
            ptxas.check_archs([bad])


def test_compile_cuda_without_nvcc_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: None)
    assert not ptxas.nvcc_available()
    assert ptxas.nvcc_version() is None
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k() {}\n")
    with pytest.raises(RuntimeError, match="needs the CUDA compiler nvcc"):
        ptxas.compile_cuda(source)


def test_launch_config_follows_the_formulas():
    # v1, D=64: 4 bytes x (32*64 + 32*65 + 32*64 + 32*33 + 32) floats = 4 x 7264 = 29056.
    assert cf.launch_config("v1", 64).dynamic_shared_bytes == 29056
    # v2, D=128: 2 bytes x (128 K/V rows + 128 rows of Q, then of the second K/V buffer)
    # x (128 + 8) = 2 x 256 x 136 = 69632.
    assert cf.launch_config("v2", 128).dynamic_shared_bytes == 69632
    # The first version's layout (64 rows of Q beside one K/V buffer): 2 x 192 x 136.
    assert cf.v2_shared_bytes(128, block_m=64, double_buffer=False) == 52224
    assert (cf.launch_config("cuda_v2", 64).threads, cf.launch_config("cuda_v2", 64).block_m) == (256, 128)
    # v2 puts batch * heads on grid.x (limit 2^31 - 1), v1 on grid.y (65,535).
    assert cf.launch_config("v2", 64).grid(2, 3, 129) == (6, 2, 1)
    assert cf.launch_config("v1", 64).grid(2, 3, 129) == (5, 6, 1)
    with pytest.raises(ValueError, match="head_dim"):
        cf.launch_config("v1", 96)
    with pytest.raises(ValueError, match="version"):
        cf.launch_config("v3", 64)


# ---- with nvcc ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    return cf.kernel_resources(ARCHS)


@pytest.fixture(scope="module")
def compiled(kernels):
    return cf.compile_sources(ARCHS)  # the compile kernel_resources just did (remembered per process)


def by_file(kernels, version):
    return [k for k in kernels if f"flash_{version}_kernel<" in k.name]


@needs_nvcc
def test_torch_flags_are_mirrored():
    """kernel_resources compiles under the flags the extension build uses; keep them the same."""
    from torch.utils import cpp_extension

    assert set(cpp_extension.COMMON_NVCC_FLAGS) <= set(cf.TORCH_NVCC_FLAGS)


@needs_nvcc
def test_every_cu_file_is_compiled():
    torch_free = sorted(p.name for p in cf.CSRC.glob("*.cu"))
    assert torch_free == sorted(cf.KERNEL_SOURCES), "kernel_resources must cover every .cu in csrc"


@needs_nvcc
def test_every_instantiation_compiles_for_both_archs(kernels):
    expected = {
        "v1": {f"<{t}, {d}>" for t in ("float", "__half", "__nv_bfloat16") for d in (64, 128)},
        "v2": {f"<{t}, {d}>" for t in ("__half", "__nv_bfloat16") for d in (64, 128)},
    }
    for version, templates in expected.items():
        for arch in ARCHS:
            names = {k.name for k in by_file(kernels, version) if k.arch == arch}
            assert {n[n.index("<"):n.index(">") + 1] for n in names} == templates, (version, arch)


@needs_nvcc
def test_no_kernel_spills_or_keeps_a_stack(kernels):
    spilled = [(k.arch, k.name, k.spill_store_bytes, k.spill_load_bytes, k.stack_frame_bytes) for k in kernels
               if k.spills or k.stack_frame_bytes]
    assert not spilled, f"kernels spill registers or keep arrays in local memory: {spilled}"


@needs_nvcc
def test_header_and_python_agree_on_launch_sizes(tmp_path):
    """Compile a tiny host program against flash_api.h and compare its numbers with Python's."""
    program = tmp_path / "sizes.cpp"
    program.write_text(textwrap.dedent("""\
        #include <cstdio>
        #include "flash_api.h"
        int main() {
          const int dims[] = {64, 128};
          for (int d : dims)
            std::printf("%d %zu %zu %d %d %d %d %zu %zu\\n", d, flash::v1_smem_bytes(d), flash::v2_smem_bytes(d),
                        flash::kV1Threads, flash::kV1BlockM, flash::v2_threads(d), flash::v2_block_m(d),
                        flash::v2_design_smem_bytes(d, 64, false), flash::v2_design_smem_bytes(d, 128, false));
        }
        """))
    exe = tmp_path / "sizes"
    built = subprocess.run([ptxas.nvcc_path(), "-x", "c++", "-std=c++17", f"-I{cf.CSRC}", str(program),
                            "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        d, v1_smem, v2_smem, v1_threads, v1_m, v2_threads, v2_m, first_smem, single_smem = map(int, line.split())
        v1, v2 = cf.launch_config("v1", d), cf.launch_config("v2", d)
        assert (v1.dynamic_shared_bytes, v1.threads, v1.block_m) == (v1_smem, v1_threads, v1_m)
        assert (v2.dynamic_shared_bytes, v2.threads, v2.block_m) == (v2_smem, v2_threads, v2_m)
        assert cf.v2_shared_bytes(d, 64, double_buffer=False) == first_smem
        assert cf.v2_shared_bytes(d, 128, double_buffer=False) == single_smem


@needs_nvcc
def test_compile_errors_carry_nvcc_message(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    with pytest.raises(RuntimeError, match="undefined_name"):
        ptxas.compile_cuda(broken)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ATTN_CHECK_BINDING") != "1",
                    reason="syntax-checking binding.cpp against torch's headers takes ~70 s; set ATTN_CHECK_BINDING=1")
def test_binding_parses_against_torch_headers(tmp_path):
    """g++ -fsyntax-only on binding.cpp. The CPU wheel lacks one generated CUDA header
    (c10/cuda/impl/cuda_cmake_macros.h); an empty stand-in is enough to parse."""
    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    # nvcc knows where its headers are: ask it (INCLUDES="-I..." in its dry run).
    dry = subprocess.run([ptxas.nvcc_path(), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", str(tmp_path / "n.o")],
                         capture_output=True, text=True)
    cuda_includes = re.findall(r'-I"?([^"\s]+)', " ".join(l for l in dry.stderr.splitlines() if "INCLUDES=" in l))
    cmd = ["g++", f"-std={cf.TORCH_STD}", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=check", f"-I{tmp_path}",
           *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}",
           *(f"-I{p}" for p in cuda_includes), f"-I{cf.CSRC}", str(cf.CSRC / "binding.cpp")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


# ---- the tile schedule, against the reference's mask ---------------------------------------------

# Odd lengths, and Sk - Sq near multiples of the tile sizes (32 and 64 keys) either way, where
# the causal boundary of a block's first row falls on, just before or just after a tile's end.
SCHEDULE_SHAPES = ([(sq, sk) for sq in (1, 7, 64, 129, 300) for sk in (1, 5, 64, 128, 200, 333)]
                   + [(sq, sq + off) for sq in (33, 129, 300)
                      for off in (-65, -64, -63, -33, -32, -31, -2, -1, 1, 2, 30, 31, 33, 62, 63, 65) if sq + off >= 1])


@needs_nvcc
def test_key_tiles_and_visibility_agree_with_the_reference_mask(tmp_path):
    """flash_api.h's visible() is the reference's mask, and key_tiles() never skips a visible
    key, never lets a hidden one into an unmasked tile, and masks only tiles that hold both."""
    import numpy as np

    program = tmp_path / "schedule.cpp"
    program.write_text(textwrap.dedent("""\
        #include <cstdio>
        #include "flash_api.h"
        int main(int argc, char** argv) {
          int sq, sk, causal, m, n;
          while (std::scanf("%d %d %d %d %d", &sq, &sk, &causal, &m, &n) == 5) {
            std::printf("shape %d %d %d %d %d\\n", sq, sk, causal, m, n);
            for (int q = 0; q < sq; ++q) {
              for (int k = 0; k < sk; ++k) std::putchar(flash::visible(q, k, sq, sk, causal) ? '1' : '0');
              std::putchar('\\n');
            }
            for (int first = 0; first < sq; first += m) {
              const flash::KeyTiles t = flash::key_tiles(first, m, n, sq, sk, causal);
              std::printf("%d %d %d\\n", first, t.unmasked, t.total);
            }
          }
        }
        """))
    exe = tmp_path / "schedule"
    built = subprocess.run([ptxas.nvcc_path(), "-x", "c++", "-std=c++17", f"-I{cf.CSRC}", str(program), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    tiles = {"v1": (32, 32), "v2": (cf.launch_config("v2", 64).block_m, cf.launch_config("v2", 64).block_n)}
    cases = [(sq, sk, c, m, n) for sq, sk in SCHEDULE_SHAPES for c in (0, 1) for m, n in tiles.values()]
    out = subprocess.run([str(exe)], input="\n".join(" ".join(map(str, c)) for c in cases), check=True,
                         capture_output=True, text=True).stdout.splitlines()
    i = 0
    for sq, sk, causal, m, n in cases:
        assert out[i] == f"shape {sq} {sk} {causal} {m} {n}"
        seen = np.array([[ch == "1" for ch in row] for row in out[i + 1:i + 1 + sq]])
        i += 1 + sq
        expected = ~reference.future_mask(sq, sk).numpy() if causal else np.ones((sq, sk), bool)
        assert (seen == expected).all(), f"visible() differs from the reference mask at Sq={sq} Sk={sk} causal={causal}"
        for first in range(0, sq, m):
            got_first, unmasked, total = map(int, out[i].split())
            i += 1
            assert got_first == first
            rows = expected[first:first + m]          # the block's real rows
            for j in range(-(-sk // n)):
                tile = np.zeros_like(rows)
                tile[:, j * n:(j + 1) * n] = True     # keys of tile j (only those < Sk exist)
                full = (j + 1) * n <= sk and rows[:, j * n:(j + 1) * n].all()
                anything = (rows & tile).any()
                where = f"Sq={sq} Sk={sk} causal={causal} tile {m}x{n} rows {first}+, key tile {j}"
                if j < unmasked:
                    assert full, f"an unmasked tile holds a hidden or missing key: {where}"
                elif j < total:
                    assert anything and not full, f"a masked tile that needs no mask, or sees nothing: {where}"
                else:
                    assert not anything, f"a skipped tile holds a visible key: {where}"


# ---- the launchers, linked against a recording stand-in runtime ---------------------------------

FP32, FP16, BF16 = 0, 1, 2
TYPE = {FP32: "float", FP16: "__half", BF16: "__nv_bfloat16"}
# cudaErrorInvalidValue, cudaErrorInvalidConfiguration (driver_types.h)
INVALID_VALUE, INVALID_CONFIGURATION = 1, 9


@pytest.fixture(scope="module")
def launch(compiled, tmp_path_factory):
    """launch(version, dtype, B, H, Hkv, Sq, Sk, D, causal, layout) -> (status, attrs, launches)
    as the launchers of the compiled objects would do it; nothing runs on a GPU."""
    if shutil.which("c++filt") is None and shutil.which("cu++filt") is None:
        pytest.skip("needs c++filt to read the launched kernels' names")
    tmp = tmp_path_factory.mktemp("launch")
    objects = []
    for source, result in compiled.items():
        objects.append(tmp / f"{source}.o")
        objects[-1].write_bytes(result.object_code)
    nvcc = ptxas.nvcc_path()
    stub = tmp / "launch_stub.o"
    for cmd in ([nvcc, "-x", "c++", "-std=c++17", "-c", f"-I{cf.CSRC}", str(Path(__file__).with_name("launch_stub.cpp")),
                 "-o", str(stub)],
                [nvcc, "-cudart", "none", str(stub), *map(str, objects), "-o", str(tmp / "launch")]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]

    def run(*problem):
        out = subprocess.run([str(tmp / "launch")], input=" ".join(map(str, problem)) + "\n", check=True,
                             capture_output=True, text=True, timeout=60).stdout.split()
        calls, words = [], iter(out)
        for word in words:
            if word == "attr":
                calls.append(("attr", next(words), next(words), int(next(words))))
            elif word == "launch":
                name = next(words)
                grid, block = tuple(int(next(words)) for _ in range(3)), tuple(int(next(words)) for _ in range(3))
                calls.append(("launch", name, grid, block, *(int(next(words)) for _ in range(5))))
            elif word == "status":
                status = int(next(words))
            elif word == "end":
                break
        names = ptxas.demangle_names({c[1] for c in calls})
        return status, [(c[0], names[c[1]], *c[2:]) for c in calls]

    return run


LAUNCH_SHAPES = [  # (B, H, Hkv, Sq, Sk, causal): odd lengths, Sq != Sk both ways, decoding, GQA
    (2, 8, 2, 1000, 1200, 1), (1, 3, 3, 1, 4096, 1), (3, 4, 1, 300, 77, 0), (1, 2, 2, 129, 129, 1), (2, 6, 3, 77, 5, 1),
]


@needs_nvcc
@pytest.mark.parametrize("version, dtype", [("v1", FP32), ("v1", BF16), ("v2", FP16), ("v2", BF16)])
@pytest.mark.parametrize("d", cf.HEAD_DIMS)
def test_launchers_launch_what_launch_config_says(launch, version, dtype, d):
    cfg = cf.launch_config(version, d)
    for b, h, hkv, sq, sk, causal in LAUNCH_SHAPES:
        status, calls = launch(version, dtype, b, h, hkv, sq, sk, d, causal, "aligned")
        where = f"{version} {TYPE[dtype]} D={d} B={b} H={h} Hkv={hkv} Sq={sq} Sk={sk} causal={causal}"
        assert status == 0, where
        launches = [c for c in calls if c[0] == "launch"]
        assert len(launches) == 1, f"one kernel per forward: {where}: {calls}"
        _, name, grid, block, smem, vec, seq_q, seq_k, kv_heads = launches[0]
        assert f"flash_{version}_kernel<{TYPE[dtype]}, {d}>" in name, (where, name)
        assert grid == cfg.grid(b, h, sq) and block == (cfg.threads, 1, 1), (where, grid, block)
        assert smem == cfg.dynamic_shared_bytes, where
        assert (seq_q, seq_k, kv_heads) == (sq, sk, hkv), "the problem reaches the kernel as described"
        assert vec == (1 if version == "v2" else -1), "aligned contiguous inputs take v2's 16-byte copies"


@needs_nvcc
def test_launchers_opt_in_to_their_shared_memory_above_48_kib(launch):
    """Above 48 KiB of dynamic shared memory a launch fails unless the kernel was given
    cudaFuncAttributeMaxDynamicSharedMemorySize first; check every instantiation."""
    above = []
    for version, dtypes in (("v1", (FP32, FP16, BF16)), ("v2", (FP16, BF16))):
        for dtype in dtypes:
            for d in cf.HEAD_DIMS:
                _, calls = launch(version, dtype, 1, 2, 2, 300, 300, d, 1, "aligned")
                (index, launched), = [(i, c) for i, c in enumerate(calls) if c[0] == "launch"]
                smem = launched[4]
                opt_in = [c for c in calls[:index] if c[:3] == ("attr", launched[1], "max_dynamic_shared")]
                if smem > occupancy.KINETO_SHARED_MEM_LIMIT:
                    above.append((version, dtype, d))
                    assert opt_in and opt_in[-1][3] >= smem, (
                        f"{launched[1]} launches with {smem} B of shared memory without opting in first: {calls}")
    assert ("v2", BF16, 128) in above, "the test must meet a kernel above 48 KiB"


@needs_nvcc
@pytest.mark.parametrize("layout", ["offset", "dstride"])
def test_v2_takes_its_scalar_path_when_16_byte_copies_cannot_work(launch, layout):
    status, calls = launch("v2", BF16, 1, 2, 2, 100, 100, 64, 1, layout)
    (_, _, _, _, _, vec, *_), = [c for c in calls if c[0] == "launch"]
    assert status == 0 and vec == 0, f"{layout} inputs must not use 16-byte cp.async"


@needs_nvcc
@pytest.mark.parametrize("problem, status", [
    (("v2", BF16, 1, 2, 2, 64, 64, 96, 1), INVALID_VALUE),               # no kernel for head_dim 96
    (("v1", FP32, 1, 2, 2, 64, 64, 80, 1), INVALID_VALUE),
    (("v2", FP32, 1, 2, 2, 64, 64, 64, 1), INVALID_VALUE),               # tensor cores: 16-bit only
    (("v2", BF16, 1, 4, 3, 64, 64, 64, 1), INVALID_VALUE),               # H not a multiple of Hkv
    (("v1", FP16, 1, 3, 2, 64, 64, 64, 0), INVALID_VALUE),
    (("v2", BF16, 1, 1, 1, 65535 * 128 + 1, 8, 64, 1), INVALID_CONFIGURATION),  # query tiles past grid.y
    (("v1", BF16, 65536, 1, 1, 8, 8, 64, 1), INVALID_CONFIGURATION),     # B * H past v1's grid.y
])
def test_launchers_refuse_what_they_cannot_run(launch, problem, status):
    got, calls = launch(*problem, "aligned")
    assert got == status and not [c for c in calls if c[0] == "launch"], (problem, got, calls)


@needs_nvcc
def test_v2_takes_batch_times_heads_past_65535(launch):
    # v2 puts B * H on grid.x, so a large decoding batch still launches.
    status, calls = launch("v2", BF16, 65536, 2, 1, 1, 64, 64, 1, "aligned")
    (_, _, grid, *_), = [c for c in calls if c[0] == "launch"]
    assert status == 0 and grid == (131072, 1, 1)
