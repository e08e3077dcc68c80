"""The compiled implementations (kernels/attention/torch_compile.py) beyond the contract grid
(tests/attention/test_contract.py), and the helpers chapter 7 reads traces with.

Refusals in words, block-mask counts against the dense mask, Inductor's fused-op names, the
ALiBi reference, and a sweep over lengths that compiles at
most twice. Every compile costs seconds on a CPU.
"""
from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import reference
from tests.helpers import make_attention_inputs


@pytest.fixture(scope="module")
def compiled():
    from kernels.attention import torch_compile as module

    with torch.no_grad():  # one grad mode for every call, as Dynamo guards on it
        yield module


def test_refusals_in_words(compiled, monkeypatch):
    q, k, v = make_attention_inputs(1, 2, 2, 17, 17, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="flex: dtype torch.float64 is not supported"):
        kernels.get("flex")(q, k, v)
    assert kernels.available("cpu")["flex"] is None and kernels.available("cpu")["compiled_naive"] is None
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    why = compiled.compiler_reason(torch.device("cpu"))
    assert why and "C++ compiler" in why, "without a C++ compiler the compiled entries must say so"
    assert "mps" in compiled.compiler_reason(torch.device("mps"))


# ------------------------------------------------------------------ helpers (no compile)

@pytest.mark.parametrize("seq", [1, 113, 300, 512])
def test_block_counts_agree_with_the_dense_mask(compiled, seq):
    from torch.nn.attention.flex_attention import create_mask

    mask = compiled.causal_block_mask(seq, seq, "cpu")
    counts = compiled.block_counts(mask)
    dense = create_mask(compiled.causal_mod(0), None, None, seq, seq, device="cpu")[0, 0]
    bq, bk = counts.block
    full = partial = empty = 0
    for i in range(0, seq, bq):
        for j in range(0, seq, bk):
            tile = dense[i:i + bq, j:j + bk]
            full += bool(tile.all())
            partial += bool(tile.any() and not tile.all())
            empty += bool(not tile.any())
    # A tile cut short by the end of the sequence counts as masked (its padding is masked out).
    assert counts.skipped == empty, f"S={seq}: skipped tiles are those the mask hides entirely"
    assert counts.full + counts.partial == full + partial, f"S={seq}: every other tile is computed"
    assert counts.total == math.ceil(seq / bq) * math.ceil(seq / bk)


def test_fused_ops_reads_inductor_names(compiled):
    assert compiled.fused_ops("graph_1_cpp_fused__softmax_masked_fill_mul_view_0") == \
        ["softmax", "masked_fill", "mul", "view"]
    assert compiled.fused_ops("triton_per_fused__softmax_masked_fill_mul_0") == ["softmax", "masked_fill", "mul"]
    assert compiled.fused_ops("aten::bmm") == []


def test_alibi_reference_by_loops(compiled):
    q, k, v = make_attention_inputs(1, 4, 2, 5, 7, 3, seed=2)
    got = compiled.alibi_reference(q, k, v, causal=True)
    slopes = compiled.alibi_slopes(4)
    want = torch.zeros(1, 4, 5, 3, dtype=torch.float64)
    for h in range(4):
        for i in range(5):
            logits = []
            for j in range(7):
                s = float(q[0, h, i].double() @ k[0, h // 2, j].double()) / math.sqrt(3) + slopes[h] * (j - i)
                logits.append(s if j <= i + 2 else -math.inf)
            w = torch.tensor(logits, dtype=torch.float64).softmax(0)
            want[0, h, i] = w @ v[0, h // 2].double()
    assert torch.allclose(got, want, atol=1e-12), "alibi_reference must be ALiBi, bottom-right causal"
    with pytest.raises(ValueError, match="power-of-two"):
        compiled.alibi_slopes(6)


def test_broken_attention_is_naive_attention_eager(compiled):
    from kernels.attention.naive import NaiveAttention

    q, k, v = make_attention_inputs(1, 2, 2, 17, 17, 16)
    assert torch.equal(compiled.BrokenAttention()(q, k, v), NaiveAttention()(q, k, v)), \
        "the graph break changes nothing eager"


def test_compiled_naive_sweeps_lengths_on_at_most_two_compiles_and_never_runs_eager(compiled):
    # The mask cache once lived inside the compiled call: Dynamo guarded on its length, every
    # new length compiled twice, and after recompile_limit (8) compiles the module ran eagerly.
    from torch._dynamo.utils import counters

    from kernels.bench.sweep import no_eager_fallback

    lengths = [17 + 9 * i for i in range(12)]   # 12 lengths: without the fix the limit falls at the 5th
    assert len(lengths) > torch._dynamo.config.recompile_limit
    module = compiled.compiled_module(True, 0.37, "cpu")   # a scale no other test uses: a fresh module
    graphs, given_up = counters["stats"]["unique_graphs"], sum(counters["unimplemented"].values())
    with no_eager_fallback("compiled_naive"):   # a recompile-limit hit raises instead of running eager
        for s in lengths:
            q, k, v = make_attention_inputs(1, 2, 2, s, s, 16, seed=s)
            for _ in range(2):   # the second call at a length used to be the second compile
                out = kernels.get("compiled_naive")(q, k, v, causal=True, scale=0.37)
            reference.judge(out, q, k, v, causal=True, scale=0.37).assert_ok(f"compiled_naive at S={s}")
    compiles = counters["stats"]["unique_graphs"] - graphs
    # Two (static, then dynamic), or one when an earlier test's compile of the same forward
    # already made its sizes dynamic (Dynamo keeps that per code object).
    assert 1 <= compiles <= 2, (f"compiled_naive's docstring: a sweep over lengths pays at most two compiles; "
                                f"{len(lengths)} lengths took {compiles}")
    assert sum(counters["unimplemented"].values()) == given_up, \
        f"Dynamo gave up on nothing (no frame left to run eagerly): {dict(counters['unimplemented'])}"
    assert len(module.module.masks) == 0, "compiled, the module builds its mask in the graph, not in its cache"


# Shape classes and dtypes that each take a graph of their own, more than Dynamo's limit (8).
PAST_THE_LIMIT = [(2, 2, 17, 17), (2, 2, 1, 30), (2, 2, 30, 20), (2, 2, 5, 40), (4, 2, 17, 17), (4, 1, 1, 30),
                  (4, 2, 30, 20), (6, 3, 9, 9), (6, 2, 1, 12), (3, 1, 7, 21)]


def _mode_inputs(requires_grad=False):
    q, k, v = make_attention_inputs(1, 2, 2, 11, 11, 16, dtype=torch.float64, seed=11)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def test_compiled_naive_runs_past_dynamos_recompile_limit_in_every_grad_mode(compiled):
    """Once eight shapes had compiled, every new call used to raise torch's bare
    FailOnRecompileLimitHit ("Hard failure due to fullgraph=True"). Now each call past the limit
    runs (judged) or refuses in words naming compiled_naive with kernels.CannotRun."""
    from torch._dynamo.utils import counters

    scale = 0.29  # a scale no other test uses: a fresh module, whose graphs all count here
    module = compiled.compiled_module(True, scale, "cpu")
    graphs, given_up = counters["stats"]["unique_graphs"], compiled.compile_counts().gave_up
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            for hq, hkv, sq, sk in PAST_THE_LIMIT[:5] if dtype == torch.float64 else PAST_THE_LIMIT:
                q, k, v = make_attention_inputs(1, hq, hkv, sq, sk, 16, dtype=dtype, seed=sq + sk)
                out = kernels.get("compiled_naive")(q, k, v, causal=True, scale=scale)
                reference.judge(out, q, k, v, causal=True, scale=scale).assert_ok(f"{(hq, hkv, sq, sk, dtype)}")
    assert counters["stats"]["unique_graphs"] - graphs > torch._dynamo.config.recompile_limit
    assert module.restarts >= 1, "the limit was reached, and the module compiled afresh instead of failing"
    assert compiled.compile_counts().gave_up == given_up, "nothing ran eagerly, and Dynamo's counters say so"

    q, k, v = _mode_inputs(requires_grad=True)
    with torch.enable_grad():
        out = kernels.get("compiled_naive")(q, k, v, causal=True, scale=scale)
        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        reference.judge(out.detach(), q.detach(), k.detach(), v.detach(), causal=True, scale=scale, grads=grads,
                        grad_out=grad_out).assert_ok("requires_grad, with gradients")
    for mode in (torch.inference_mode, torch.no_grad):
        q, k, v = _mode_inputs()
        with mode():
            out = kernels.get("compiled_naive")(q, k, v, causal=True, scale=scale)
        reference.judge(out, q, k, v, causal=True, scale=scale).assert_ok(mode.__name__)

    q, k, v = _mode_inputs(requires_grad=True)
    with torch.enable_grad():
        out = kernels.get("compiled_naive")(q, k, v, causal=True, scale=scale)
        with pytest.raises(kernels.CannotRun, match="compiled_naive: double backward"):
            torch.autograd.grad(out.sum(), q, create_graph=True)


def test_score_buffers_and_memory_table_count_exact_scores_buffers(compiled):
    import pandas as pd
    from types import SimpleNamespace

    nbytes = 4 * 64 * 64
    step = SimpleNamespace(memory=pd.DataFrame({"bytes": [nbytes, nbytes, nbytes - 4, -nbytes, 2 * nbytes]}),
                           peak_bytes=2 * nbytes, allocated_bytes=4 * nbytes,
                           copies=lambda min_bytes: pd.DataFrame({"bytes": [min_bytes]}))
    assert compiled.score_buffers(step, nbytes) == 2, "only allocations of exactly one S×S buffer count"
    row = compiled.memory_table({"eager": step}, nbytes).loc["eager"]
    assert row["S×S buffers allocated"] == 2 and row["copies of S×S"] == 1
    assert row["peak (MiB)"] == round(2 * nbytes / 2**20, 2)
    with pytest.raises(ValueError, match="scores_bytes"):
        compiled.score_buffers(step, 0)


def test_compiled_call_credits_the_borrowed_a100_trace_and_refuses_an_eager_step():
    # What the call holds (one pointwise Triton kernel, its region, the GPU's busy share) is
    # chapter 7's lessons, asserted when the chapter executes.
    from kernels.attention import torch_compile
    from kernels.borrowed import COMPILED_POINTWISE, TRAINING_STEP

    assert "not this book's run" in torch_compile.compiled_call(COMPILED_POINTWISE).credit
    with pytest.raises(ValueError, match="Torch-Compiled Region"):
        torch_compile.compiled_call(TRAINING_STEP)  # an eager training step has no compiled region


def test_compiled_once_and_block_counts_table():
    from kernels.attention.torch_compile import BlockCounts, Compiles, FirstAndSteady

    one, none = Compiles(1, 0, 1, 0), Compiles(0, 0, 0, 0)
    assert FirstAndSteady(1.0, 0.1, one, none).compiled_once
    assert not FirstAndSteady(1.0, 0.1, one, one).compiled_once  # a recompile on a later call
    assert not FirstAndSteady(1.0, 0.1, Compiles(1, 0, 1, 1), none).compiled_once  # Dynamo gave up
    table = BlockCounts((128, 128), 6, 4, 6).table()["causal block mask"]
    assert table["tiles"] == 16 and table["skipped"] == 6 and table["skipped share"] == "37.5%"
