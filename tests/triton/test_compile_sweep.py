"""The compile sweep: every config the autotuner keeps fits the GPU and spills nothing.

Triton compiles for sm_80 and sm_90 without a GPU (kernels/triton/compile_sweep.py). A compile
takes seconds here, so the default tests compile a covering subset, once per session: for
each kernel the target launches (forward, dK/dV, dQ), the
config the pruning keeps with the largest shared-memory estimate at D = 128 (the one nearest
the limit), the one it keeps with the most values per thread at D = 256 (the one nearest the
register budget), and one config the compiler must show does not fit.
``test_every_kept_config_compiles_within_limits`` (marked ``sweep``: seven to eight minutes of
one core on cold caches, ptxas run once by Triton and once by the sweep, so ``make test-book``
runs it) compiles every kept config of every head dim, as ``python -m
kernels.triton.compile_sweep`` does. The pruning is a rule on the footprint
(``configs.values_per_thread`` within ``configs.VALUES_PER_THREAD``), and these tests hold
it to the compiler: a kept config fits the GPU and ptxas spills none of its registers.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import kernels.triton.flash as tf
import kernels.triton.configs as configs
from kernels.triton import compile_sweep as cr
from kernels.cuda import ptxas
from kernels.hw.occupancy import ARCHES

pytestmark = pytest.mark.skipif(tf.TRITON_MISSING is not None, reason=str(tf.TRITON_MISSING))
TARGETS = cr.TARGETS
BF16 = 2


def _limit(target):
    return ARCHES[target].max_shared_mem_per_block


def kept(kernel, head_dim, target):
    arch = ARCHES[target]
    return configs.fitting_configs(configs.GPU_CONFIGS, 1 << 16, head_dim, BF16, _limit(target),
                              kernel=kernel, capability=arch.capability)


def estimate(kernel, head_dim, config):
    m, n, _, stages = config
    return configs.shared_memory_estimate(m, n, stages, head_dim, BF16, kernel=kernel)


# Configs the compiler must find too large for the target (outside every space on purpose).
TOO_LARGE = {"sm_80": ("fwd", 128, (128, 128, 8, 4)), "sm_90": ("fwd", 128, (128, 128, 8, 4))}


def densest(kernel, head_dim, target):
    """The kept config whose threads hold the most values: the one nearest the register budget."""
    return max(kept(kernel, head_dim, target),
               key=lambda c: (configs.values_per_thread(c, head_dim, kernel, BF16), estimate(kernel, head_dim, c)))


def covering_jobs(target):
    jobs = [(k, 128, max(kept(k, 128, target), key=lambda c: estimate(k, 128, c)))
            for k in configs.KERNELS]
    jobs += [(k, 256, densest(k, 256, target)) for k in configs.KERNELS]
    return list(dict.fromkeys(jobs)) + [TOO_LARGE[target]]


@pytest.fixture(scope="session")
def swept():
    """{target: rows} for the covering subset, both targets compiled side by side."""
    with ThreadPoolExecutor(max_workers=len(TARGETS)) as pool:
        done = pool.map(lambda t: cr.sweep_configs(t, jobs=covering_jobs(t), cuda=ptxas.nvcc_available()), TARGETS)
        return dict(zip(TARGETS, done))


def triton_rows(rows):
    return [r for r in rows if r["kernel"].startswith("triton")]


def as_config(row):
    c = row["config"]
    return (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"])


def test_rows_have_the_documented_fields(swept):
    for target, rows in swept.items():
        assert rows, target
        for row in rows:
            assert {"kernel", "head_dim", "config", "registers", "shared_bytes", "spills", "fits", "kept"} <= set(row)
            assert row["target"] == target and not row["error"], row


@pytest.mark.parametrize("target", TARGETS)
def test_kept_configs_fit(swept, target):
    for row in triton_rows(swept[target]):
        if row["kept"]:
            assert row["fits"], f"the pruning keeps a config the compiler says does not fit {target}: {row}"
            assert row["shared_bytes"] <= _limit(target), row


@pytest.mark.parametrize("target", TARGETS)
def test_kept_configs_do_not_spill(swept, target):
    for row in triton_rows(swept[target]):
        if row["kept"]:
            assert row["spills"] == 0, (
                f"the pruning keeps a config ptxas spills to local memory on {target}: every kept config "
                f"must hold its values in registers (configs.VALUES_PER_THREAD is too high, or "
                f"configs.values_per_thread counts too little): {row}")


def test_every_kernel_and_head_dim_keeps_a_config():
    """The budget prunes what spills, never a whole (kernel, head dim): ``keep`` itself passes
    a config of every kernel at every head dim but the backward's at D = 256 (over the budget
    in every tile), where ``fitting_configs`` keeps the one holding the fewest values a thread
    (the covering subset compiles it: it must not spill either)."""
    for target in TARGETS:
        arch = ARCHES[target]
        for kernel in configs.KERNELS:
            for head_dim in configs.PADDED_HEAD_DIMS:
                passed = [c for c in configs.GPU_CONFIGS
                          if configs.keep(c, head_dim, BF16, _limit(target), kernel, arch.capability)]
                assert passed or (kernel != "fwd" and head_dim == 256), (target, kernel, head_dim)
                assert kept(kernel, head_dim, target), (target, kernel, head_dim)


@pytest.mark.parametrize("target", TARGETS)
def test_the_estimate_is_never_below_the_compiler(swept, target):
    """kept => fits, for configs the test did not compile too: the estimate bounds the compiler's
    shared memory from above, so estimate <= limit implies shared <= limit."""
    for row in triton_rows(swept[target]):
        kernel = row["kernel"].split()[1]
        assert row["estimate_bytes"] == estimate(kernel, row["head_dim"], as_config(row))
        assert row["estimate_bytes"] >= row["shared_bytes"], \
            f"the shared-memory estimate is below what Triton allocates: {row}"


@pytest.mark.parametrize("target", TARGETS)
def test_a_config_that_does_not_fit_is_not_kept(swept, target):
    kernel, head_dim, config = TOO_LARGE[target]
    row = next(r for r in triton_rows(swept[target]) if as_config(r) == config and r["head_dim"] == head_dim)
    assert row["shared_bytes"] > _limit(target) and not row["fits"], \
        f"expected {config} at D={head_dim} to exceed {target}'s shared memory: {row}"
    # Offered to the pruning next to one that fits, it is dropped.
    small = (64, 32, 4, 2)
    assert configs.fitting_configs([config, small], 4096, head_dim, BF16, _limit(target), kernel=kernel,
                              capability=ARCHES[target].capability) == [small]


@pytest.mark.skipif(not ptxas.nvcc_available(), reason="needs nvcc for the CUDA kernels")
@pytest.mark.parametrize("target", TARGETS)
def test_cuda_kernels_are_in_the_report_and_fit(swept, target):
    cuda = [r for r in swept[target] if r["kernel"].startswith("cuda_")]
    assert {r["kernel"] for r in cuda} == {"cuda_v1", "cuda_v2"}
    for row in cuda:
        assert row["fits"] and row["kept"], row
        assert row["kernel"] != "cuda_v2" or row["spills"] == 0, f"cuda_v2 spills: {row}"


def test_fits_is_the_targets_limits():
    assert cr.fits("sm_80", 163 * 1024, 255, 256)
    assert not cr.fits("sm_80", 163 * 1024 + 1, 32, 128)
    assert cr.fits("sm_90", 227 * 1024, 128, 256) and not cr.fits("sm_90", 227 * 1024 + 1, 128, 256)
    assert not cr.fits("sm_90", 0, 255, 512), "255 registers x 512 threads pass the SM's 65,536"
    with pytest.raises(ValueError, match="unknown target"):
        cr.fits("sm_99", 0, 1, 1)


def test_ptxas_resources_are_remembered_on_disk(monkeypatch, tmp_path):
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    calls = []

    def fake_ptxas(ptx, arch, capability):
        calls.append(arch)
        return ptxas.KernelResources(name="k", mangled="k", arch=arch, registers=100, spill_store_bytes=8)

    monkeypatch.setattr(cr, "ptxas_resources", fake_ptxas)
    first = cr.ptxas_cached("// some ptx", "sm_90a", 90)
    again = cr.ptxas_cached("// some ptx", "sm_90a", 90)
    other = cr.ptxas_cached("// other ptx", "sm_90a", 90)
    assert first == again == ptxas.KernelResources(name="k", mangled="k", arch="sm_90a", registers=100,
                                                   spill_store_bytes=8)
    assert calls == ["sm_90a", "sm_90a"], "the second report of the same PTX comes from disk"
    assert other == first and len(list((tmp_path / "compile_sweep").glob("*.json"))) == 2


def test_the_report_runs_the_ptxas_triton_chooses_for_each_target():
    """Triton picks its ptxas by architecture (since 3.9 its newer build from sm_90 on, before
    only from sm_100): the report must ask Triton, not assume ``knobs.nvidia.ptxas``."""
    from triton.backends.nvidia.compiler import get_ptxas

    for capability in (80, 90, 100):
        assert ptxas.triton_ptxas(capability) == get_ptxas(capability).path, capability


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("target", TARGETS)
def test_every_kept_config_compiles_within_limits(target):
    jobs = [(k, d, c) for k in configs.KERNELS for d in configs.PADDED_HEAD_DIMS
            for c in kept(k, d, target)]
    rows = cr.sweep_configs(target, jobs=jobs, cuda=False, timeout=3000)
    bad = [r for r in rows if not r["fits"] or r["estimate_bytes"] < r["shared_bytes"] or r["spills"]]
    assert not bad, f"kept configs that do not fit, exceed their estimate or spill on {target}: {bad}"
