"""pytest's hooks and fixtures for the suite: the GPU marker, the built book. What tests
share otherwise lives in tests/helpers.py."""
from __future__ import annotations

import os

import pytest

from tests.helpers import ROOT, has_cuda


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # pytest-xdist's workers share the cores: each gets its share of torch's threads
        import torch

        from tools.book.execute import threads_per_job
        torch.set_num_threads(threads_per_job(int(workers)))


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the book marker is added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "built_book" in item.fixturenames:
            item.add_marker(pytest.mark.book)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); `make gpu-run` runs these on a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built_book():
    """Every chapter and exercise executed with the cpu preset (two at a time), then built
    with -W, into _build/test-book/.

    It goes through ``make book``'s execution cache (_build/cache): a notebook that
    ``make book`` (cpu preset) or an earlier ``make test-book`` executed with the same
    source, parameters, library and versions is restored; anything else executes now.
    Tests that use it are marked ``book`` (``make test-book``; ``make test`` leaves them out).
    Session-scoped: the book tests and the browser tests read the same build.
    Returns (report, executed folder, html folder).
    """
    from tools.book import html
    from tools.book import execute

    base = ROOT / "_build" / "test-book"
    out = base / "executed"
    report = execute.run("cpu", out=out, root=ROOT, jobs=2, cache=ROOT / "_build" / "cache")
    html = html.build(out, html_parent=base)
    return report, out, html


@pytest.fixture(scope="session")
def book_in_chromium(built_book, tmp_path_factory):
    """The built book served on loopback and one headless Chromium for every test that opens
    its pages (tests/book/test_browser_book.py, tests/trace/test_figures.py): ``(tools, base URL)``."""
    from tests.browser import served_in_chromium

    with served_in_chromium(built_book[2], tmp_path_factory.mktemp("chromium-book")) as site:
        yield site
