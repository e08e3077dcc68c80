"""The launches chapters 4 and 5 set beside torch's flash kernel, on the borrowed H100 trace of Qwen."""
import math

import pytest

from kernels.borrowed import TRACELENS
from kernels.cuda import flash as cuda_flash, resources
from kernels.hw import occupancy
from kernels.trace.attention import find_attention
from kernels.triton import configs


@pytest.fixture(scope="module")
def qwen():
    borrowed = TRACELENS["h100_qwen"]
    trace = borrowed.trace()
    call = find_attention(borrowed.step(trace=trace)).calls[0]
    props = trace.device_properties[0]
    return call, props, occupancy.arch_of((props["computeMajor"], props["computeMinor"]))


def test_triton_forward_launches_follow_the_pruning(qwen):
    call, props, arch = qwen
    launches = configs.forward_launches(call.batch_heads, call.sq, call.d, 2, (9, 0), props["sharedMemPerBlockOptin"])
    assert launches and all(l.kernel.startswith("attn_fwd ") for l in launches)
    kept = configs.fitting_configs(configs.GPU_CONFIGS, call.sq, 64, 2, props["sharedMemPerBlockOptin"],
                                   kernel="fwd", capability=(9, 0))
    assert {(l.grid[1], l.threads_per_block) for l in launches} == {(math.ceil(call.sq / m), 32 * w)
                                                                    for m, n, w, s in kept}
    assert all(l.grid[0] == call.batch_heads and l.registers_per_thread is None for l in launches)
    on_ampere = configs.forward_launches(call.batch_heads, call.sq, call.d, 2, (8, 0), 163 * 1024)
    assert all(l.kernel.startswith("attn_fwd ") for l in on_ampere)


def test_cuda_v2_launch_from_the_snapshot(qwen):
    call, props, arch = qwen
    launch = resources.v2_launch(call.batch_heads, call.sq, call.d, call.dtype, arch)
    cfg = cuda_flash.launch_config("v2", call.d)
    assert launch.grid == (call.batch_heads, math.ceil(call.sq / cfg.block_m), 1)
    assert launch.registers_per_thread == resources.find_kernel(resources.snapshot_kernels(), arch, "v2", "bf16", 64).registers
    table = occupancy.launch_table([launch], arch, props["numSms"])
    assert table.loc[launch.kernel, "CTAs per SM"] == launch.occupancy(arch).blocks_per_sm


def test_bad_launch_input_is_named():
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy.launch_from_footprint("k", {"grid": [1, 1, 1], "block": [32, 1, 1], "shared_memory": 0}, "x")
    with pytest.raises(ValueError, match="sm_count"):
        occupancy.Launch("k", (1, 1, 1), 32, 32, 0, "x").waves("sm_90", 0)
    with pytest.raises(ValueError, match="batch_heads"):
        configs.forward_launches(0, 10, 64, 2, (9, 0), 1 << 17)
