"""Shared test helpers: random inputs (never zeros), poisoned outputs, the GPU marker."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def has_cuda() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); `make gpu-check` runs these")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def make_qkv(b, h, s, d, dtype=torch.float32, device="cpu", layout="bhsd", seed=0,
             requires_grad=False):
    """Random q, k, v of logical shape [b, h, s, d].

    layout="bshd" returns non-contiguous [b, h, s, d] views of [b, s, h, d] storage,
    the layout a model produces before its transpose.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (3, b, s, h, d) if layout == "bshd" else (3, b, h, s, d)
    qkv = torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    if layout == "bshd":
        qkv = qkv.transpose(2, 3)
    q, k, v = (t.requires_grad_(requires_grad) if requires_grad else t for t in qkv.unbind(0))
    if layout == "bshd":
        assert not q.is_contiguous()
    return q, k, v


@pytest.fixture
def qkv_factory():
    return make_qkv


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Every chapter executed with the cpu profile (two at a time), then built with -W.

    Session-scoped: the book tests and the browser tests read the same build.
    Returns (report, executed folder, html folder).
    """
    from kernels import execute

    tmp = tmp_path_factory.mktemp("book")
    out = tmp / "executed"
    report = execute.run("cpu", out=out, root=ROOT, jobs=2)
    html = execute.build(out, html_parent=tmp)
    return report, out, html
