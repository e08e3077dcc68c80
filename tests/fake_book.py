"""A tiny fake book, built once per session through the real runner and build
(``tools.book.execute.run`` then ``tools.book.html.build``, with the real ``_config.yml`` and
``book/_static``): one notebook that profiles a matmul and shows ``kernels.trace.links.links`` for it and
for a recorded GPU trace. tests/trace/test_traces.py and tests/book/test_browser.py read it."""
from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

from tools.book import html
from tools.book import execute
from tests.gpu_trace import naive_a100_trace
from tests.helpers import ROOT

FAKE_CHAPTER = "01_fake"
RECORDED = "a100_fake.json.gz"


# --------------------------------------------------------------------------- the fake book

def _fake_source(root: Path) -> None:
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    (root / "book").mkdir(parents=True)
    shutil.copy2(ROOT / "_config.yml", root / "_config.yml")
    shutil.copytree(ROOT / "book" / "_static", root / "book" / "_static")
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n  - file: book/{FAKE_CHAPTER}\n")
    (root / "book" / "intro.md").write_text("# A fake book\n\nOne chapter that records a trace.\n")
    (root / "kernels").mkdir()
    (root / "kernels" / "presets.yml").write_text("cpu:\n  device: cpu\n  active_steps: 2\n")
    (root / "book" / "data" / "recorded").mkdir(parents=True)
    with gzip.open(root / "book" / "data" / "recorded" / RECORDED, "wt") as f:
        json.dump(naive_a100_trace(steps=1), f)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A fake chapter"),
        nbformat.v4.new_code_cell('device = "cpu"\nactive_steps = 1\ntrace_dir = "traces"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import torch\nfrom kernels.trace.links import links\nfrom kernels.trace.record import profile\n"
            "x = torch.randn(32, 32)\n"
            'run = profile(torch.mm, x, x, label="mm", active=active_steps, trace_dir=trace_dir)\n'
            "links(run)"),
        nbformat.v4.new_markdown_cell("A recorded GPU trace:"),
        nbformat.v4.new_code_cell(f'links("data/recorded/{RECORDED}")'),
    ]
    nbformat.write(nb, root / "book" / f"{FAKE_CHAPTER}.ipynb")


def build_fake_book(tmp_path_factory) -> SimpleNamespace:
    """Execute and build the fake book once per session (a marker file says it is done).

    Under pytest-xdist every worker has its own temporary folder below a shared one: the book
    is built there once, by whichever worker asks first, while the others wait on the lock.
    """
    temp = tmp_path_factory.getbasetemp()
    shared = temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else temp
    base = shared / "fake_book"
    done = base / "built.json"
    with open(shared / "fake_book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(base, ignore_errors=True)
            _fake_source(base / "src")
            report = execute.run("cpu", out=base / "executed", root=base / "src", progress=False)
            html.build(base / "executed", html_parent=base)
            done.write_text(json.dumps(report))
    return SimpleNamespace(src=base / "src", out=base / "executed", html=base / "_build" / "html",
                           report=json.loads(done.read_text()))


class TraceBoxes(HTMLParser):
    """The ``.ap-trace`` boxes of a page: their data attributes and their links' attributes."""

    def __init__(self):
        super().__init__()
        self.boxes, self.scripts = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        if tag == "div" and "ap-trace" in (a.get("class") or "").split():
            self.boxes.append({"box": a, "links": {}})
        if tag == "a" and self.boxes and (a.get("class") or "").startswith("ap-trace-"):
            self.boxes[-1]["links"][a["class"]] = a


def page_boxes(html_dir: Path, page: str) -> TraceBoxes:
    parser = TraceBoxes()
    parser.feed((html_dir / page).read_text())
    return parser
