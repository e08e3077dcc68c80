"""Theoretical occupancy: hand-computed cases, the article's numbers, and NVIDIA's own header.

Every expected number below is worked out in the comment above it from the rules in
kernels/hw/occupancy.py's docstring (registers per warp rounded up to 256; 16,384 registers
per scheduler, 4 schedulers; shared memory + 1 KB reserved on sm_80+, rounded to 128 B,
256 B on sm_75). The last test compiles cuda_occupancy.h (the CUDA toolkit's header-only
calculator, also bundled with Triton) and compares a sweep over every architecture of the
table, where a C++ compiler exists: that sweep, not a hand-worked case per architecture, holds
the newer tables (Volta, Orin, Blackwell) to NVIDIA's numbers, and the blocks per SM of each
rule's own footprints (register rounding at 128 x 100, the per-scheduler split at 96 x 192,
sm_75's 256-B units at 10,800 B, a partial warp at 33 x 255, warp slots at 1,024 x 16).
"""
from __future__ import annotations

import importlib.util
import itertools
import os
import pathlib
import shutil
import subprocess

import pytest

from kernels.hw.occupancy import ARCHES, LIMITS, arch_of, occupancy


# --------------------------------------------------------------------------- the article

def test_article_flash_kernel_128_threads_255_registers():
    # 128 threads = 4 warps. 255 x 32 = 8,160 registers per warp -> rounded up to 8,192.
    # 16,384 // 8,192 = 2 warps per scheduler -> 8 warps per SM -> 8 // 4 = 2 blocks.
    # (The article's shortcut agrees: 128 x 255 = 32,640; 65,536 // 32,640 = 2.)
    # 2 blocks x 4 warps = 8 warps of 64 = 12.5%.
    occ = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_80")
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.max_warps_per_sm) == (2, 8, 64)
    assert occ.fraction == pytest.approx(0.125)
    assert occ.limited_by == "registers"
    assert occ.registers_per_warp == 8192
    # the other limits, each on its own: warps 64 // 4 = 16; block slots 32;
    # shared memory: only the reserved 1,024 B -> 167,936 // 1,024 = 164.
    assert occ.blocks_by == {"registers": 2, "shared_memory": 164, "warps": 16, "blocks": 32}


def test_explain_shows_the_article_arithmetic():
    text = occupancy(threads_per_block=128, registers_per_thread=255, arch="sm_80").explain()
    for piece in ("128 threads x 255 registers = 32,640", "65,536 // 32,640 = 2 blocks",
                  "8,160 per warp, rounded up to 8,192", "8 warps of 64", "12.5%",
                  "limited by registers"):
        assert piece in text, piece


# --------------------------------------------------------------------------- each limit

def test_shared_memory_limited_with_the_reserved_kilobyte():
    # 32 KB = 32,768 B + 1,024 reserved = 33,792 B (a multiple of 128) per block;
    # 167,936 // 33,792 = 4 blocks (without the reserved KB it would be 5).
    # Registers: 32 x 32 = 1,024 per warp -> 16 per scheduler -> 64 warps -> 16 blocks.
    # 4 blocks x 4 warps = 16 of 64 = 25%.
    occ = occupancy(threads_per_block=128, registers_per_thread=32,
                    shared_mem_per_block=32 * 1024, arch="sm_80")
    assert occ.shared_mem_allocated_per_block == 33792
    assert occ.blocks_by_shared_memory == 4
    assert (occ.blocks_per_sm, occ.warps_per_sm) == (4, 16)
    assert occ.fraction == pytest.approx(0.25)
    assert occ.limited_by == "shared_memory"


def test_block_slot_limited_on_sm86():
    # 32 threads = 1 warp, 16 registers (512 per warp -> 32 per scheduler -> 128 blocks),
    # shared memory 102,400 // 1,024 = 100, warp slots 48 // 1 = 48, block slots 16.
    # 16 blocks x 1 warp = 16 warps of 48 = 1/3.
    occ = occupancy(threads_per_block=32, registers_per_thread=16, arch="sm_86")
    assert occ.blocks_by == {"registers": 128, "shared_memory": 100, "warps": 48, "blocks": 16}
    assert (occ.blocks_per_sm, occ.warps_per_sm) == (16, 16)
    assert occ.fraction == pytest.approx(16 / 48)
    assert occ.limited_by == "blocks"


def test_ties_name_every_limit():
    # 64 threads x 32 registers: warp slots 64 // 2 = 32, block slots 32, registers
    # 1,024 per warp -> 64 warps -> 32 blocks. Three limits allow exactly 32 blocks.
    occ = occupancy(threads_per_block=64, registers_per_thread=32, arch="sm_80")
    assert occ.blocks_per_sm == 32
    assert occ.limiters == ("registers", "warps", "blocks")
    assert occ.limited_by == "registers"  # the first, in LIMITS order
    assert set(occ.limiters) <= set(LIMITS)


def test_registers_that_cannot_fit_one_block_give_zero():
    # 1,024 threads x 255 registers: 8,192 per warp x 32 warps = 262,144 > 65,536 per
    # block, so the launch would fail; the calculator reports 0 blocks, not an error.
    occ = occupancy(threads_per_block=1024, registers_per_thread=255, arch="sm_80")
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.fraction) == (0, 0, 0.0)
    assert occ.limited_by == "registers"
    assert "the launch fails" in occ.explain()


# --------------------------------------------------------------------------- inputs

@pytest.mark.parametrize("spelling", ["sm_80", "sm80", "SM_80", "8.0", (8, 0), [8, 0], "sm_80a",
                                      "compute_80"])
def test_arch_spellings_agree(spelling):
    assert occupancy(128, 255, arch=spelling) == occupancy(128, 255, arch="sm_80")


def test_unknown_arch_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        occupancy(128, 32, arch="sm_60")
    for name in ARCHES:
        assert name in str(err.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(threads_per_block=0, registers_per_thread=32), "threads_per_block"),
    (dict(threads_per_block=1025, registers_per_thread=32), "threads_per_block"),
    (dict(threads_per_block=128, registers_per_thread=256), "registers_per_thread"),
    (dict(threads_per_block=128, registers_per_thread=-1), "registers_per_thread"),
    (dict(threads_per_block=128, registers_per_thread=32, shared_mem_per_block=163 * 1024 + 1),
     "shared_mem_per_block"),
    (dict(threads_per_block=128, registers_per_thread=32, shared_mem_per_block=-4),
     "shared_mem_per_block"),
])
def test_bad_footprints_raise_value_error_naming_the_problem(kwargs, words):
    with pytest.raises(ValueError, match=words):
        occupancy(arch="sm_80", **kwargs)


def test_shared_memory_limit_depends_on_arch():
    # 100 KB fits a block on sm_80 (max 163 KB) but not on sm_86 (max 99 KB).
    assert occupancy(128, 32, 100 * 1024, arch="sm_80").blocks_per_sm == 1
    with pytest.raises(ValueError, match="101,376"):
        occupancy(128, 32, 100 * 1024, arch="sm_86")


def test_non_integers_raise_type_error():
    with pytest.raises(TypeError):
        occupancy(128.0, 32)
    with pytest.raises(TypeError):
        occupancy(128, True)


def test_result_is_frozen():
    occ = occupancy(128, 32)
    with pytest.raises(AttributeError):
        occ.blocks_per_sm = 5


@pytest.mark.parametrize("device, arch", [
    ("NVIDIA A100-SXM4-80GB", "sm_80"), ("NVIDIA A100 80GB PCIe", "sm_80"),
    ("NVIDIA H100 80GB HBM3", "sm_90"), ("NVIDIA H200", "sm_90"), ("NVIDIA GH200 480GB", "sm_90"),
    ("NVIDIA A10G", "sm_86"), ("NVIDIA GeForce RTX 3090", "sm_86"), ("NVIDIA RTX A6000", "sm_86"),
    ("NVIDIA L4", "sm_89"), ("NVIDIA L40S", "sm_89"), ("NVIDIA GeForce RTX 4090", "sm_89"),
    ("NVIDIA RTX 6000 Ada Generation", "sm_89"), ("Tesla T4", "sm_75"), ("Quadro RTX 6000", "sm_75"),
    ((8, 6), "sm_86"), ("9.0", "sm_90"), ("sm_90a", "sm_90"),
    ("Tesla V100-SXM2-16GB", "sm_70"), ("NVIDIA TITAN V", "sm_70"), ((7, 0), "sm_70"),
    ("Orin", "sm_87"), ("NVIDIA Jetson AGX Orin", "sm_87"), ((8, 7), "sm_87"),
    ("NVIDIA B200", "sm_100"), ("NVIDIA GB200", "sm_100"), ("sm_100a", "sm_100"), ((10, 0), "sm_100"),
    ("NVIDIA GeForce RTX 5090", "sm_120"), ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "sm_120"),
    ("12.0", "sm_120"),
])
def test_arch_of(device, arch):
    assert arch_of(device) == arch


def test_arch_of_device_properties_and_unknowns():
    class Props:  # the shape of torch.cuda.get_device_properties(i)
        major, minor, name = 8, 9, "NVIDIA L4"

    assert arch_of(Props()) == "sm_89"
    for unknown in ("AMD Instinct MI300X", "Tesla P100-PCIE-16GB", (6, 0), (10, 3)):
        with pytest.raises(ValueError, match="sm_80"):
            arch_of(unknown)


# --------------------------------------------------------------------------- NVIDIA's header

_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "cuda_occupancy.h"
int main(int argc, char** argv) {
  cudaOccDeviceProp p;
  p.computeMajor = atoi(argv[1]); p.computeMinor = atoi(argv[2]);
  p.sharedMemPerMultiprocessor = atol(argv[3]); p.sharedMemPerBlockOptin = atol(argv[4]);
  p.reservedSharedMemPerBlock = atol(argv[5]); p.maxThreadsPerMultiprocessor = atoi(argv[6]);
  p.maxThreadsPerBlock = 1024; p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536;
  p.warpSize = 32; p.sharedMemPerBlock = 48 * 1024; p.numSms = 1;
  int t, r; long s;
  while (scanf("%d %d %ld", &t, &r, &s) == 3) {
    cudaOccFuncAttributes a;
    a.maxThreadsPerBlock = 1024; a.numRegs = r; a.sharedSizeBytes = 0; a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
    a.maxDynamicSharedSizeBytes = p.sharedMemPerBlockOptin;
    cudaOccDeviceState st; cudaOccResult res;
    int err = cudaOccMaxActiveBlocksPerMultiprocessor(&res, &p, &a, &st, t, s);
    printf("%d %d\n", err, res.activeBlocksPerMultiprocessor);
  }
}
"""


def _occupancy_header():
    spec = importlib.util.find_spec("triton")  # its NVIDIA backend bundles the header
    if spec is not None and spec.origin:
        yield pathlib.Path(spec.origin).parent / "backends" / "nvidia" / "include"
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root:
            yield pathlib.Path(root) / "include"
    nvcc = shutil.which("nvcc")
    if nvcc:
        yield pathlib.Path(nvcc).resolve().parent.parent / "include"


def test_matches_cuda_occupancy_header(tmp_path):
    include = next((d for d in _occupancy_header() if (d / "cuda_occupancy.h").exists()), None)
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if include is None or compiler is None:
        pytest.skip("needs a C++ compiler and cuda_occupancy.h (from triton or a CUDA toolkit)")
    (tmp_path / "occ.cpp").write_text(_HARNESS)
    built = subprocess.run([compiler, "-O0", f"-I{include}", str(tmp_path / "occ.cpp"),
                            "-o", str(tmp_path / "occ")], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"cuda_occupancy.h did not compile here: {built.stderr[:300]}")
    checked = 0
    for lim in ARCHES.values():
        cases = [(t, r, s) for t, r, s in itertools.product(
            (1, 32, 33, 96, 128, 192, 256, 384, 640, 1024),
            (0, 16, 32, 40, 64, 72, 100, 128, 168, 192, 232, 240, 255),
            (0, 1, 10_800, 32 * 1024, 49_152, 100_000, lim.max_shared_mem_per_block))
            if s <= lim.max_shared_mem_per_block]
        out = subprocess.run(
            [str(tmp_path / "occ"), str(lim.capability[0]), str(lim.capability[1]),
             str(lim.shared_mem_per_sm), str(lim.max_shared_mem_per_block),
             # the driver's reserved KB per block, from Ampere on (cuda_occupancy.h's comment)
             str(1024 if lim.capability >= (8, 0) else 0), str(lim.max_warps_per_sm * lim.warp_size)],
            input="".join(f"{t} {r} {s}\n" for t, r, s in cases),
            capture_output=True, text=True, check=True).stdout.split()
        for (t, r, s), err, blocks in zip(cases, out[0::2], out[1::2]):
            assert err == "0", (lim.name, t, r, s)
            assert occupancy(t, r, s, arch=lim.name).blocks_per_sm == int(blocks), (lim.name, t, r, s)
            checked += 1
    assert checked > 2000



def test_kineto_estimate_reads_zero_above_the_default_shared_memory_limit():
    from kernels.hw.occupancy import KINETO_SHARED_MEM_LIMIT, kineto_estimate

    big_grid = dict(grid_blocks=10_000, sm_count=108, arch="sm_80")
    # The article's flash footprint: 128 threads x 255 registers -> 2 blocks -> 12.5%, as its trace said.
    assert kineto_estimate(128, 255, 32 * 1024, **big_grid) == occupancy(128, 255, 32 * 1024, "sm_80").percent == 12.5
    # One byte over 48 KiB and Kineto's calculator fits no block: 0%, though the real kernel runs.
    assert kineto_estimate(128, 128, KINETO_SHARED_MEM_LIMIT + 1, **big_grid) == 0.0
    assert occupancy(128, 128, KINETO_SHARED_MEM_LIMIT + 1, "sm_80").blocks_per_sm > 0
    # A grid smaller than the SMs can hold caps the estimate: 54 blocks on 108 SMs is half a block per SM.
    assert kineto_estimate(128, 32, 0, grid_blocks=54, sm_count=108, arch="sm_80") == pytest.approx(100 * 0.5 * 128 / 2048)
