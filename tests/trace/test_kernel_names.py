"""The kernel-name rules (kernels.trace.fingerprints) against every kernel name the tests hold.

Every GPU kernel a chapter classifies goes through kernels.trace.fingerprints. Here its rules meet
every kernel of the shared real traces (tests/data/real_traces, and ../shared/traces where a
checkout has it) and of the fixtures (tests/hopper_trace.py, tests/gpu_trace.py), and every
GEMM among them must come out as "gemm". Which kernels are GEMMs is decided without the rules:

- in a real trace, a kernel launched by a matrix-multiply op (aten::mm, addmm, bmm, matmul,
  linear, ...: what the CPU side of the trace says it asked for) is a GEMM, except cuBLAS's
  helpers listed in HELPERS, which run beside a GEMM but multiply nothing;
- GEMMs launched by other ops are listed by hand in OTHER_GEMMS, each with why;
- in the fixtures, the GEMMs are the names each fixture declares as GEMMs.
"""
import warnings

import pytest

from kernels.trace import reader
from kernels.trace import fingerprints
from tests import gpu_trace, hopper_trace
from tests.helpers import ROOT

TRACE_DIRS = [ROOT / "tests" / "data" / "real_traces", ROOT.parent / "shared" / "traces"]

# Launched inside a matmul op, but not a matrix product (checked by hand against cuBLAS's names).
HELPERS = {
    "splitKreduce_kernel": "sums the partial products of a GEMM that split its K dimension",
    "epilogue::impl::globalKernel": "cuBLASLt's epilogue pass (bias, activation) after the GEMM",
    "scal_kernel": "scales C by beta before an addmm's GEMM accumulates into it",
    "copy_device_to_device": "addmm copying its bias into the output before the GEMM accumulates onto it "
                             "(Kineto's torch 1.8 sample records no copy_ op under addmm for it)",
}
# GEMMs that ops other than a matmul launched: prefix -> why it is a GEMM.
OTHER_GEMMS = {
    "ampere_gcgemm_": "a complex cuBLAS GEMM (gc/c: complex single); cuDNN's FFT convolution multiplies "
                      "in the frequency domain with it",
    "volta_sgemm_": "cuBLAS fp32 GEMMs that cuDNN's GEMM-based convolution algorithms call",
}


def real_kernels() -> dict[str, set[str]]:
    """Every kernel name of the real traces here -> the ops that launched it."""
    found: dict[str, set[str]] = {}
    paths = [p for d in TRACE_DIRS if d.is_dir() for p in sorted(d.glob("*.json*"))]
    assert paths, "the shared real traces are in tests/data/real_traces"
    for path in paths:
        with warnings.catch_warnings():  # one trace holds CUPTI range-profiler events the reader says it skips
            warnings.simplefilter("ignore", UserWarning)
            kernels = reader.load_trace(path).whole().gpu_work
        launched = kernels[kernels["cat"] == "kernel"]
        for name, op in zip(launched["name"], launched["op"]):
            found.setdefault(name, set()).add(str(op))
    return found


@pytest.fixture(scope="module")
def real():
    return real_kernels()


def is_helper(name: str) -> bool:
    return any(h in name for h in HELPERS)


def test_every_gemm_of_the_real_traces_is_classified_as_one(real):
    by_op = {n for n, ops in real.items() if ops & fingerprints.MATMUL_OPS and not is_helper(n)}
    by_hand = {n for n in real if any(n.startswith(p) for p in OTHER_GEMMS)}
    assert len(by_op) >= 60 and by_hand, f"the real traces hold {len(by_op)} GEMMs under matmul ops"
    missed = sorted(n for n in by_op | by_hand if not fingerprints.is_gemm(n))
    assert not missed, f"GEMMs the fingerprint rules do not call gemm: {missed}"


def test_the_helpers_beside_a_gemm_are_not_called_gemms(real):
    helpers = [n for n in real if is_helper(n)]
    assert helpers, "the real traces hold cuBLAS's split-K and epilogue helpers"
    wrong = [n for n in helpers if fingerprints.is_gemm(n)]
    assert not wrong, f"helpers that multiply nothing, classified as GEMMs: {wrong}"


def fixture_kernels() -> dict[str, bool]:
    """Every kernel name of the fixtures -> whether the fixture declares it a GEMM."""
    hopper_gemms = {hopper_trace.GEMM_NNT, hopper_trace.GEMM_TNN, hopper_trace.GEMM_TNT, hopper_trace.GEMM_XMMA,
                    hopper_trace.SGEMM}
    rows = [*hopper_trace.NAIVE, *hopper_trace.MATH, *sum(hopper_trace.FUSED.values(), []),
            *hopper_trace.COMPILED_NAIVE, *hopper_trace.COMPILED_FLEX, *hopper_trace.COMPILED_BLOCK,
            *hopper_trace.EAGER_BLOCK_MLP, *sum(hopper_trace.BACKWARD.values(), []),
            *hopper_trace.triton_forward_backward(1, 1, 128)]
    found = {r.kernel: r.kernel in hopper_gemms for r in rows if r.kernel and r.cat == "kernel"}
    found.update({n: False for n in (hopper_trace.CUDA_V1, hopper_trace.CUDA_V2)})
    for rows in gpu_trace.VARIANTS.values():
        for _, _, name, cat, *_ in rows:
            if name and cat == "kernel":  # the A100 fixture's GEMMs: cuBLAS's ampere_*gemm_* names
                found[name] = name.startswith(("ampere_bf16_s16816gemm", "ampere_sgemm"))
    return found


def test_the_fixtures_gemms_and_only_they_are_gemms():
    found = fixture_kernels()
    assert sum(found.values()) >= 7 and len(found) >= 25, found
    wrong = {n: g for n, g in found.items() if fingerprints.is_gemm(n) != g}
    assert not wrong, f"fixture kernels the rules classify wrongly (True: should be a GEMM): {wrong}"


def test_every_fixture_kernel_has_a_kind():
    """The fixtures' other kernels are read too: attention, softmax, elementwise, copies."""
    kinds = {n: fingerprints.kind_of(n) for n in fixture_kernels()}
    assert [n for n, k in kinds.items() if k == "other" and fingerprints.inductor_style(n) != "tem"] == []
    assert kinds[hopper_trace.CUDNN] == kinds[hopper_trace.FLASH] == kinds[hopper_trace.TRITON_FWD] \
        == "fused_attention"
    assert fingerprints.kind_of(hopper_trace.DTOD) == "copy" and fingerprints.kind_of(hopper_trace.MEMSET) == "memset"
