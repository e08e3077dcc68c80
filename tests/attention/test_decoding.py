"""kernels.attention.decoding (the KV cache, decode-step counts and tables, ConcatCache) and the checks of
kernels.exercises.backward and kernels.exercises.decoding (chapters 9 and 10's exercises)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import reference
from kernels.attention import decoding
from kernels.attention.decoding import KVCache
from kernels.exercises import ExerciseFailed
from kernels.exercises.backward import check_kept_for_backward, check_training_flops
from kernels.exercises.decoding import check_decode_intensity, check_decode_token

# ------------------------------------------------------------------------- the KV cache


def test_cache_appends_and_returns_views_of_the_filled_part():
    cache = KVCache(batch=2, kv_heads=3, max_seq=10, head_dim=4)
    k1, v1 = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    keys, values = cache.append(k1, v1)
    assert cache.length == 6 and keys.shape == (2, 3, 6, 4)
    assert torch.equal(keys, k1) and torch.equal(values, v1)
    assert keys.data_ptr() == cache.k.data_ptr()            # a view of the buffer, not a copy
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    keys, values = cache.append(k2, v2)
    assert cache.length == 7 and torch.equal(keys[:, :, -1:], k2) and torch.equal(values[:, :, :6], v1)
    assert cache.nbytes == 2 * 2 * 3 * 10 * 4 * 4


@pytest.mark.parametrize("k_shape, words", [((1, 2, 3, 4), "past the cache's max_seq"),
                                            ((1, 3, 1, 4), "this cache holds"),
                                            ((1, 2, 1, 5), "this cache holds")])
def test_cache_refuses_in_words(k_shape, words):
    cache = KVCache(batch=1, kv_heads=2, max_seq=4, head_dim=4)
    cache.append(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match=words):
        cache.append(torch.randn(k_shape), torch.randn(k_shape))


def test_cache_refuses_bad_sizes_and_mismatched_lengths():
    with pytest.raises(ValueError, match="max_seq must be a positive int"):
        KVCache(1, 2, 0, 4)
    cache = KVCache(1, 2, 8, 4)
    with pytest.raises(ValueError, match="they must agree"):
        cache.append(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 3, 4))


# ------------------------------------------------------------------------- counts, by hand


def test_decode_intensity_tends_to_the_group_size_per_byte():
    for h, hkv, elem, dtype in ((32, 32, 2, torch.bfloat16), (32, 8, 2, torch.bfloat16), (16, 16, 4, torch.float32)):
        got = decoding.intensity(1, h, 1, 1 << 16, 128, hkv, dtype)
        assert got == pytest.approx(2 * (h / hkv) / elem, rel=1e-2)
        assert got < 2 * (h / hkv) / elem                    # q and o cost a little on top
    assert decoding.intensity(1, 8, 4096, 4096, 64, dtype=torch.bfloat16) == pytest.approx(4096 / 4)


def test_cache_bytes_by_hand():
    # 32 layers, 8 K/V heads, D = 128, bf16, 8192 tokens: 2 (K, V) x 32 x 8 x 8192 x 128 x 2 bytes = 1 GiB
    assert decoding.cache_bytes(8192, 8, 128, torch.bfloat16, layers=32) == 2**30
    assert decoding.cache_bytes(10, 2, 4, torch.float32, batch=3) == 2 * 3 * 2 * 10 * 4 * 4
    assert decoding.cache_bytes(16, 2, 8) == KVCache(1, 2, 16, 8, dtype=torch.bfloat16).nbytes


def test_counts_table_holds_both_phases_by_hand():
    table = decoding.counts_table((64, 128), heads=4, head_dim=8, dtype=torch.float32)
    assert table.loc[128, ("FLOPs", "decode")] == 4 * 4 * 128 * 8                    # every key, no half
    assert table.loc[128, ("FLOPs", "prefill")] == 2 * 4 * 128 * 128 * 8             # causal half
    assert table.loc[64, ("bytes (float32)", "decode")] == (2 * 4 * 8 + 2 * 4 * 64 * 8) * 4
    assert table.loc[128, ("FLOP/byte", "prefill")] == pytest.approx(2 * table.loc[64, ("FLOP/byte", "prefill")])


def test_sharing_table_divides_the_cache_by_the_group_size_and_refuses_a_bad_group():
    table = decoding.sharing_table(2, 8, {"mha": 8, "gqa": 2}, 16, 100)
    assert table.loc["mha", "KV cache (MiB)"] == 4 * table.loc["gqa", "KV cache (MiB)"]
    assert table.loc["gqa", "KV cache (MiB)"] == 2 * 2 * 2 * 100 * 16 * 2 / 2**20
    assert table.loc["gqa", "FLOP/byte"] > table.loc["mha", "FLOP/byte"]
    with pytest.raises(ValueError, match="must divide the 8 query heads"):
        decoding.sharing_table(2, 8, {"odd": 3}, 16, 100)


def test_concat_cache_copies_the_history_where_the_kv_cache_does_not():
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    concat, kv = decoding.ConcatCache(k, v), KVCache(1, 2, 8, 4)
    kv.append(k, v)
    before = concat.k.data_ptr(), kv.k.data_ptr()
    k1, v1 = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    (ck, cv), (kk, kv_v) = concat.append(k1, v1), kv.append(k1, v1)
    assert torch.equal(ck, kk) and torch.equal(cv, kv_v) and concat.length == kv.length == 6
    assert ck.data_ptr() != before[0]                 # a new tensor: the history was copied
    assert kk.data_ptr() == before[1]                 # a view of the same buffer
    with pytest.raises(ValueError, match="of one shape"):
        decoding.ConcatCache(k, torch.randn(1, 2, 4, 4))


def test_decode_step_appends_then_attends_over_everything_cached():
    q, k, v = (torch.randn(1, 4, 9, 8) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    cache = KVCache(1, 2, 9, 8)
    cache.append(k[:, :, :8], v[:, :, :8])
    step = decoding.decode_step(cache, kernels.get("naive"))
    out = step(q[:, :, 8:], k[:, :, 8:], v[:, :, 8:])
    assert cache.length == 9
    assert reference.max_rel_error(out, reference.attention(q, k, v, causal=True)[:, :, 8:]) < 1e-5


# ------------------------------------------------------------------------- exercise checks


def kept_solution(step, nbytes):
    ops, memory = step.ops, step.memory
    start = ops.loc[ops["name"].str.startswith("autograd::engine"), "ts"].min()
    before = memory[memory["ts"] < start]
    return int((before["bytes"] == nbytes).sum() - (before["bytes"] == -nbytes).sum())


def kept_allocations_only(step, nbytes):
    ops, memory = step.ops, step.memory
    start = ops.loc[ops["name"].str.startswith("autograd::engine"), "ts"].min()
    return int((memory[memory["ts"] < start]["bytes"] == nbytes).sum())


def test_kept_for_backward_check_names_counting_allocations_without_frees():
    # (the notebook's stub and solution run in tests/exercises/test_exercises.py)
    with pytest.raises(ExerciseFailed, match="you counted every S×S allocation of the forward"):
        check_kept_for_backward(kept_allocations_only, seed=3)


def test_the_traced_training_steps_keep_what_chapter_9_says():
    from kernels.exercises.backward import training_step_traces

    shape = (1, 2, 48, 16)
    steps = training_step_traces({"naive": shape, "sdpa_flash": shape}, seed=0)
    square = 2 * 48 * 48 * 4
    assert kept_solution(steps["naive"], square) == 1 and kept_solution(steps["sdpa_flash"], square) == 0
    assert kept_allocations_only(steps["naive"], square) > 1     # the scores and the clone were freed


def flops_solution(b, h, s, d, causal):
    return 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)


@pytest.mark.parametrize("wrong, words", [
    (lambda b, h, s, d, c: flops_solution(b, h, s, d, c) / 3.5, "that is the forward only"),
    (lambda b, h, s, d, c: flops_solution(b, h, s, d, c) * 3 / 3.5, "four matmuls"),
    (lambda b, h, s, d, c: 3.5 * 4 * b * h * s * s * d, "halve the FLOPs when causal"),
])
def test_training_flops_check_names_the_mistake(wrong, words):
    with pytest.raises(ExerciseFailed, match=words):
        check_training_flops(wrong, seed=5)


def decode_before_append(cache, q, k_new, v_new):
    out = kernels.get("sdpa_math")(q, cache.keys(), cache.values(), causal=True)
    cache.append(k_new, v_new)
    return out


def decode_whole_buffer(cache, q, k_new, v_new):
    cache.append(k_new, v_new)
    return kernels.get("sdpa_math")(q, cache.k, cache.v, causal=True)


def decode_top_left(cache, q, k_new, v_new):
    keys, values = cache.append(k_new, v_new)
    return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=q.shape[1] != keys.shape[1])


def decode_no_append(cache, q, k_new, v_new):
    return kernels.get("sdpa_math")(q, cache.keys(), cache.values(), causal=True)


@pytest.mark.parametrize("wrong, words", [(decode_before_append, "before this token"),
                                          (decode_whole_buffer, "zeros of the empty slots"),
                                          (decode_top_left, "top-left"),
                                          (decode_no_append, "append the new token")])
def test_decode_token_check_names_the_mistake(wrong, words):
    with pytest.raises(ExerciseFailed, match=words):
        check_decode_token(wrong, seed=7)


def intensity_solution(h, hkv, sk, d, elem):
    return 4 * h * sk * d / ((2 * h * d + 2 * hkv * sk * d) * elem)


@pytest.mark.parametrize("wrong, words", [
    (lambda h, hkv, sk, d, e: intensity_solution(h, h, sk, d, e), "kv_heads heads"),
    (lambda h, hkv, sk, d, e: intensity_solution(h, hkv, sk, d, e) / 2, "no causal half"),
    (lambda h, hkv, sk, d, e: 4 * h * sk * d / (2 * hkv * sk * d * e), "you counted the cache only"),
])
def test_decode_intensity_check_names_the_mistake(wrong, words):
    with pytest.raises(ExerciseFailed, match=words):
        check_decode_intensity(wrong, seed=11)


def test_prefill_then_decode_gives_the_rows_of_one_causal_pass_with_shared_heads():
    q, k, v = (torch.randn(1, 4, 12, 8) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    out, cache = decoding.prefill_then_decode(kernels.get("naive"), q, k, v, prompt=9)
    assert cache.length == 12 and out.shape == q.shape
    assert reference.max_rel_error(out, reference.attention(q, k, v, causal=True)) < 1e-5


def test_filled_caches_hold_the_same_history_and_the_kv_cache_keeps_room():
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    kv, concat = decoding.filled_caches(k, v, room=3)
    assert kv.length == concat.length == 5 and kv.max_seq == 8
    assert torch.equal(kv.keys(), concat.k) and concat.k.data_ptr() != k.data_ptr()


def test_profile_cache_steps_refuses_a_cache_without_values(tmp_path):
    # What the two steps allocate (the whole cache again for torch.cat) is chapter 10's lessons.
    cached = [torch.randn(1, 2, 256, 16) for _ in range(2)]
    q, k, v = (torch.randn(1, 2, 1, 16) for _ in range(3))
    with pytest.raises(ValueError, match="keys, values"):
        decoding.profile_cache_steps(cached[:1], kernels.get("naive"), q, k, v, tmp_path)


def test_decode_backends_on_a_cpu_and_a_group_that_does_not_divide():
    assert decoding.decode_backends(1, 8, 64, 16, torch.float32, "cpu") == ("sdpa_flash", "sdpa_flash")
    with pytest.raises(ValueError, match="evenly"):
        decoding.decode_backends(1, 9, 64, 16, torch.float32, "cpu")
