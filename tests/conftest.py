"""pytest's hooks and fixtures for the suite: the GPU marker, the built book. What tests
share otherwise lives in tests/helpers.py."""
from __future__ import annotations

import pytest

from tests.helpers import (LAYOUTS, ROOT, covering, has_cuda, laid_out,  # noqa: F401  (re-exported for
                           make_attention_inputs, make_qkv)              # modules not yet moved to helpers)


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); `.ci/device-run` runs these on a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
