"""The CUDA kernels compile, and the compiler's resource report is read correctly.

Needs nvcc, not a GPU: every torch-free .cu in kernels/csrc is compiled for sm_80 (A100) and
sm_90 (H100/H200) with ``-Xptxas -v``. The torch binding is not compiled here (it takes
over a minute against torch's headers); set ATTN_CHECK_BINDING=1 to syntax-check it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import textwrap

import pytest

import kernels.cuda_flash as cf
from kernels import ptxas

ARCHS = ("sm_80", "sm_90")
needs_nvcc = pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs the CUDA compiler nvcc (not on PATH)")



def test_parse_ptxas_reads_every_kernel_once_per_arch():
    found = ptxas.parse_ptxas(ptxas.SAMPLE_REPORT, demangle=False)
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
    found = ptxas.parse_ptxas(ptxas.SAMPLE_REPORT)
    assert found[0].name == "void many<64>(float const*, float*, int)"
    assert found[0].mangled == "_Z4manyILi64EEvPKfPfi"
    assert found[1].name == "tile_sum(float const*, float*)"


def test_parse_ptxas_of_nothing_is_empty():
    assert ptxas.parse_ptxas("") == []


def test_compile_report_without_nvcc_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(ptxas, "nvcc_path", lambda: None)
    assert not ptxas.nvcc_available()
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k() {}\n")
    with pytest.raises(RuntimeError, match="needs the CUDA compiler nvcc"):
        ptxas.compile_report(source)


def test_launch_config_follows_the_formulas():
    # v1, D=64: 4 bytes x (32*64 + 32*65 + 32*64 + 32*33 + 32) floats = 4 x 7264 = 29056.
    assert cf.launch_config("v1", 64).dynamic_shared_bytes == 29056
    # v2, D=128: 2 bytes x (64 + 2*64) rows x (128 + 8) = 2 x 192 x 136 = 52224.
    assert cf.launch_config("v2", 128).dynamic_shared_bytes == 52224
    assert cf.launch_config("cuda_v2", 64).threads == 128
    with pytest.raises(ValueError, match="head_dim"):
        cf.launch_config("v1", 96)
    with pytest.raises(ValueError, match="version"):
        cf.launch_config("v3", 64)


# ---- with nvcc ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report():
    return cf.kernel_report(ARCHS)


def by_file(report, version):
    return [k for k in report if f"flash_{version}_kernel<" in k.name]


@needs_nvcc
def test_torch_flags_are_mirrored():
    """kernel_report compiles under the flags the extension build uses; keep them in step."""
    from torch.utils import cpp_extension

    assert set(cpp_extension.COMMON_NVCC_FLAGS) <= set(cf.TORCH_NVCC_FLAGS)


@needs_nvcc
def test_every_cu_file_is_compiled():
    torch_free = sorted(p.name for p in cf.CSRC.glob("*.cu"))
    assert torch_free == sorted(cf.KERNEL_SOURCES), "kernel_report must cover every .cu in csrc"


@needs_nvcc
def test_every_instantiation_compiles_for_both_archs(report):
    expected = {
        "v1": {f"<{t}, {d}>" for t in ("float", "__half", "__nv_bfloat16") for d in (64, 128)},
        "v2": {f"<{t}, {d}>" for t in ("__half", "__nv_bfloat16") for d in (64, 128)},
    }
    for version, templates in expected.items():
        for arch in ARCHS:
            names = {k.name for k in by_file(report, version) if k.arch == arch}
            assert {n[n.index("<"):n.index(">") + 1] for n in names} == templates, (version, arch)


@needs_nvcc
def test_v2_does_not_spill(report):
    spilled = [(k.arch, k.name, k.spill_store_bytes, k.spill_load_bytes) for k in by_file(report, "v2") if k.spills]
    assert not spilled, f"v2 kernels spill registers to local memory: {spilled}"


@needs_nvcc
def test_resources_fit_one_sm(report):
    for k in report:
        assert 1 <= k.registers <= 255, k
        assert k.threads_per_block == 128, k
        # Registers of one block must fit an SM's 65,536 (else the launch fails).
        assert k.registers * k.threads_per_block <= 65536, k
        # Opt-in shared memory per block: 163 KiB on sm_80 (A100), 227 KiB on sm_90.
        limit = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}[k.arch]
        assert 0 < k.total_shared_bytes <= limit, k
        assert k.shared_bytes == 0, "the kernels use only dynamic shared memory"
        version, d = ("v1" if "flash_v1" in k.name else "v2"), (128 if ", 128>" in k.name else 64)
        assert k.dynamic_shared_bytes == cf.launch_config(version, d).dynamic_shared_bytes


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
            std::printf("%d %zu %zu %d %d %d %d\\n", d, flash::v1_smem_bytes(d), flash::v2_smem_bytes(d),
                        flash::kV1Threads, flash::kV1BlockM, flash::kV2Threads, flash::kV2BlockM);
        }
        """))
    exe = tmp_path / "sizes"
    built = subprocess.run([ptxas.nvcc_path(), "-x", "c++", "-std=c++17", f"-I{cf.CSRC}", str(program),
                            "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        d, v1_smem, v2_smem, v1_threads, v1_m, v2_threads, v2_m = map(int, line.split())
        v1, v2 = cf.launch_config("v1", d), cf.launch_config("v2", d)
        assert (v1.dynamic_shared_bytes, v1.threads, v1.block_m) == (v1_smem, v1_threads, v1_m)
        assert (v2.dynamic_shared_bytes, v2.threads, v2.block_m) == (v2_smem, v2_threads, v2_m)


@needs_nvcc
def test_compile_errors_carry_nvcc_message(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    with pytest.raises(RuntimeError, match="undefined_name"):
        ptxas.compile_report(broken)


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
