"""What kernels.attention.sdpa reads that a trace can check: the priority order of an older torch,
and FlashAttention-2's tiles from its kernel's name, checked against a real H100 trace
(book/data/borrowed: Qwen1.5-0.5B), recounted from the raw JSON with plain ``json``. Reading SDPA
calls out of a trace is chapter 3's (tests/book/test_ch03_sdpa.py).
"""
from __future__ import annotations

import gzip
import json

import pytest

from kernels import borrowed
from kernels.attention import sdpa


def raw(key: str) -> dict:
    with gzip.open(borrowed.root() / borrowed.TRACELENS[key].file, "rt") as f:
        return json.load(f)


def raw_sdpa_calls(events: list) -> list:
    return sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] == sdpa.SDPA_OP), key=lambda e: e["ts"])


def raw_kernels_under(events: list, op: dict) -> list:
    """Kernels whose launch (same correlation id) lies inside ``op`` on its thread."""
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"
                and e["tid"] == op["tid"] and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]}
    return [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in launches]


def test_priority_before_torch_2_9_keeps_the_default_order_and_2_5_0_is_refused():
    assert sdpa.priority((9, 0), 92000, torch_version="2.6.0+cu124") == list(sdpa.DEFAULT_PRIORITY)
    assert sdpa.priority((9, 0), 92000, torch_version="2.11.0")[0] == "sdpa_cudnn"
    with pytest.raises(ValueError, match="2.5.0"):
        sdpa.priority((9, 0), 92000, torch_version="2.5.0")


def test_flash_tiles_of_the_h100_kernel_give_its_recorded_shared_memory_and_grid():
    events = raw("h100_qwen")["traceEvents"]
    call = raw_sdpa_calls(events)[0]
    q_dims = call["args"]["Input Dims"][0]
    kernel = next(e for e in raw_kernels_under(events, call) if "flash_fwd" in e["name"])
    tiles = sdpa.flash_tiles(kernel["name"])
    assert tiles.head_dim == q_dims[-1]
    assert tiles.threads == kernel["args"]["block"][0]
    assert tiles.shared_bytes() == kernel["args"]["shared memory"]
    batch, heads, seq = q_dims[0], q_dims[1], q_dims[2]
    assert tiles.grid(batch, heads, seq) == kernel["args"]["grid"]
    with pytest.raises(ValueError, match="FlashAttention-2"):
        sdpa.flash_tiles("attn_fwd")
