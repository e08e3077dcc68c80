"""Traces as reader artifacts (kernels.trace.links) and the step diff (kernels.trace.record.diff).

The book-level tests build a tiny fake book through the real runner and build code path
(``tools.book.execute.run`` then ``build``, with the real ``_config.yml`` and ``book/_static``):
one notebook that profiles a matmul and shows ``links.links`` for it and for a recorded GPU
trace (tests/fake_book.py). It is built once per session, on disk, and test_browser.py reuses it.
"""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import pytest
import torch

from kernels.trace import diff as tracediff
from kernels.trace import events, reader
from kernels.trace import record
import kernels
from tools.book import execute
from kernels.trace import links
from tools.book import publish
from tests.helpers import ROOT, make_qkv
from tests.gpu_trace import naive_a100_trace
from tests.fake_book import FAKE_CHAPTER, RECORDED, build_fake_book, page_boxes

matplotlib.use("Agg")


@pytest.fixture(scope="session")
def fake_book(tmp_path_factory):
    return build_fake_book(tmp_path_factory)


# ------------------------------------------------------------------- runner and published book

@pytest.mark.slow
def test_pages_link_to_published_traces_that_exist_and_parse(fake_book):
    page = page_boxes(fake_book.html, f"book/{FAKE_CHAPTER}.html")
    assert len(page.boxes) == 2, "one box per links.links() output"
    own, recorded = page.boxes
    for box in page.boxes:
        href = box["links"]["ap-trace-download"]["href"]
        assert href == box["box"]["data-trace-url"] and "ap-trace-perfetto" in box["links"]
        published = (fake_book.html / "book" / href).resolve()
        assert published.is_file(), f"{href} is not published"
        assert events.read_events(published)["traceEvents"], f"{href} does not parse"
    own_href = own["links"]["ap-trace-download"]["href"]
    assert own_href == f"traces/{FAKE_CHAPTER}/mm.json.gz"
    executed = fake_book.out / "book" / own_href
    assert (fake_book.html / "book" / own_href).read_bytes() == executed.read_bytes()
    assert reader.load_trace(fake_book.html / "book" / own_href).labels() == ["mm"]
    assert own["box"]["data-trace-title"] == f"{FAKE_CHAPTER} · mm · CPU"
    # the recorded GPU trace is published at the repository's layout, beside the pages
    assert recorded["links"]["ap-trace-download"]["href"] == f"data/recorded/{RECORDED}"
    published = fake_book.html / "book" / "data" / "recorded" / RECORDED
    assert published.read_bytes() == (fake_book.src / "book" / "data" / "recorded" / RECORDED).read_bytes()
    assert "NVIDIA A100-SXM4-80GB" in recorded["box"]["data-trace-title"]
    # the page loads the script that drives "Open in Perfetto", and the build ships it
    assert any(src.split("?")[0].endswith("_static/perfetto.js") for src in page.scripts), page.scripts
    assert (fake_book.html / "_static" / "perfetto.js").read_text() == (ROOT / "book/_static/perfetto.js").read_text()


def _over_budget_run(monkeypatch, tmp_path, sizes: dict[str, int]) -> dict:
    """Run the real runner on a book whose notebooks "write" traces of the given sizes
    (execute_one is replaced: papermill is not what is tested here)."""
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    root = tmp_path / "src"
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    chapters = "".join(f"  - file: book/{name}\n" for name in sizes)
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n{chapters}")
    (root / "book" / "intro.md").write_text("# t\n")
    (root / "kernels").mkdir()
    (root / "kernels" / "presets.yml").write_text("cpu:\n  active_steps: 1\n")
    for name in sizes:
        nbformat.write(nbformat.v4.new_notebook(), root / "book" / f"{name}.ipynb")

    def fake_execute(path, out, params, progress):
        trace = out / path.parent / params["trace_dir"] / "big.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_bytes(os.urandom(sizes[path.stem]))
        return {"notebook": str(path), "status": "ok", "seconds": 0.0, "error": None}

    monkeypatch.setattr(execute, "execute_one", fake_execute)
    return execute.run("cpu", out=tmp_path / "out", root=root, progress=False)


def test_runner_fails_a_notebook_whose_trace_is_over_budget(monkeypatch, tmp_path):
    report = _over_budget_run(monkeypatch, tmp_path, {"01_small": 1000, "02_big": publish.PER_TRACE_BUDGET + 1})
    small, big = report["notebooks"]
    assert small["status"] == "ok"
    assert big["status"] == "failed"
    message = big["error"]
    assert "book/traces/02_big/big.json.gz" in message, "names the trace"
    assert f"{(publish.PER_TRACE_BUDGET + 1) / 2**20:.2f} MiB" in message, "says its size"
    assert f"per-trace budget of {publish.PER_TRACE_BUDGET / 2**20:.2f} MiB" in message, "says the budget"
    assert "fewer active steps" in message, "says how to shrink it"
    assert "02_big" in (tmp_path / "out" / "report.md").read_text()


def test_runner_fails_the_notebook_that_takes_the_book_over_its_budget(monkeypatch, tmp_path):
    monkeypatch.setattr(publish, "BOOK_BUDGET", 5000)  # each trace is fine; together they are not
    report = _over_budget_run(monkeypatch, tmp_path, {"01_a": 3000, "02_b": 3000})
    first, second = report["notebooks"]
    assert first["status"] == "ok" and second["status"] == "failed"
    assert "the book's traces total" in second["error"] and "book/traces/02_b/big.json.gz" in second["error"]


def test_budget_leaves_small_traces_alone(tmp_path):
    trace = tmp_path / "book" / "traces" / "01_x" / "t.json.gz"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(b"x" * 100)
    row = publish.enforce_budget({"status": "ok", "error": None}, tmp_path, Path("book/01_x.ipynb"))
    assert row["status"] == "ok" and row["traces"] == [{"path": "book/traces/01_x/t.json.gz", "bytes": 100}]
    assert publish.budget_problems([trace], tmp_path, 100, per_trace=99)  # one byte over fails


def test_links_point_at_the_trace_relative_to_the_notebook(tmp_path, monkeypatch):
    folder = tmp_path / "traces" / "03_demo"
    folder.mkdir(parents=True)
    x = torch.randn(8, 8)
    run = record.profile(torch.mm, x, x, label="mm", active=1, trace_dir=folder)
    monkeypatch.chdir(tmp_path)
    for source in (run, run.step(0), run.trace_path, str(run.trace_path)):
        link = links.links(source)
        assert link.url == "traces/03_demo/mm.json.gz" and link.title == "03_demo · mm · CPU"
    html = link._repr_html_()
    assert 'href="traces/03_demo/mm.json.gz"' in html and 'class="ap-trace-perfetto"' in html
    assert links.links(run, title='a "quoted" <title>')._repr_html_().count("&quot;quoted&quot; &lt;title&gt;") == 2
    assert "traces/03_demo/mm.json.gz" in repr(link)
    # a trace read from outside the notebook's folder (a borrowed one, from the checkout) links to
    # its copy published beside the page, never above the site's root
    elsewhere = tmp_path / "checkout" / "book" / "data" / "borrowed" / "mm.json.gz"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_bytes(run.trace_path.read_bytes())
    (tmp_path / "page").mkdir()
    monkeypatch.chdir(tmp_path / "page")
    assert links.links(elsewhere).url.startswith("../"), "no copy beside the page: the path as it is"
    (tmp_path / "page" / "data" / "borrowed").mkdir(parents=True)
    (tmp_path / "page" / "data" / "borrowed" / "mm.json.gz").write_bytes(run.trace_path.read_bytes())
    assert links.links(elsewhere).url == "data/borrowed/mm.json.gz"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no trace"):
        links.links("traces/none.json.gz")
    with pytest.raises(TypeError, match="ProfiledRun"):
        links.links(42)


def test_publish_copies_traces_at_their_relative_paths(tmp_path):
    executed, html = tmp_path / "executed", tmp_path / "html"
    for rel in ("book/traces/01/a.json.gz", "recorded/g.json.gz", "_build/stale.json.gz"):
        (executed / rel).parent.mkdir(parents=True, exist_ok=True)
        (executed / rel).write_bytes(rel.encode())
    published = publish.publish(executed, html)
    assert sorted(p.relative_to(html).as_posix() for p in published) == ["book/traces/01/a.json.gz", "recorded/g.json.gz"]
    assert (html / "recorded/g.json.gz").read_bytes() == b"recorded/g.json.gz"


# --------------------------------------------------------------------------------- the diff

B, H, S, D = 1, 2, 48, 16
SCORES_BYTES = B * H * S * S * 4  # one fp32 S×S scores tensor


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    q, k, v = make_qkv(B, H, S, D)
    out = tmp_path_factory.mktemp("diff_traces")
    runs = {n: record.profile(kernels.get(n), q, k, v, label=n, active=2, trace_dir=out) for n in ("naive", "inplace")}
    return {n: r.steps() for n, r in runs.items()}


def test_diff_of_inplace_is_the_removed_scores_copy_and_nothing_else(steps):
    d = tracediff.diff(steps["naive"][0], steps["inplace"][0])
    changed = d.changed()
    scores = str(tuple([B, H, S, S]))
    assert set(changed["name"]) == {"aten::masked_fill", "aten::clone", "aten::copy_"}, changed
    assert (changed["only_in"] == "a").all() and d.only_in("inplace").empty
    assert (changed["count_change"] == -1).all()
    copy = changed[changed["name"] == "aten::copy_"]
    assert len(copy) == 1 and copy.iloc[0]["shapes"].startswith(f"{scores} {scores}"), "the S×S copy, not the 4-byte one"
    # the clone owns the buffer its empty_like allocated: exactly one scores tensor
    assert changed["alloc_bytes_change"].sum() == -SCORES_BYTES
    assert changed.loc[changed["name"] == "aten::clone", "alloc_bytes_change"].item() == -SCORES_BYTES
    assert d.totals().loc["allocated_MiB", "change"] * 2**20 == pytest.approx(-SCORES_BYTES)
    # everything else is matched one to one, including the tiny scalar copy_ under mul
    rest = d.ops[~d.ops["substance"]]
    assert (rest["count_a"] == rest["count_b"]).all() and (rest["only_in"] == "").all()
    assert ((rest["name"] == "aten::copy_") & (rest["count_a"] == 1)).sum() == 1


def test_diff_of_two_steps_of_one_run_has_no_substance(steps):
    a, b = steps["naive"]
    d = tracediff.diff(a, b)
    assert d.changed().empty and d.table().empty and len(d.table(everything=True)) == len(d.ops) > 5
    assert d.label_a != d.label_b


def test_diff_table_and_figure(steps):
    d = tracediff.diff(steps["naive"][0], steps["inplace"][0])
    table = d.table()
    assert list(table["only in"]) == ["naive"] * 3 and "count change" in table and "allocated change (KiB)" in table
    assert table["allocated change (KiB)"].sum() == -SCORES_BYTES / 1024
    fig = d.figure()
    ax = fig.axes[0]
    assert any("clone" in t.get_text() for t in ax.get_yticklabels()), "the copy naive makes and inplace does not is a row"
    with pytest.raises(TypeError, match="two Steps"):
        tracediff.diff(steps["naive"][0], "inplace")
    with pytest.raises(ValueError, match="side"):
        d.only_in("sdpa")


def test_diff_of_step_lists_takes_each_rows_median_time_so_one_stalled_step_cannot_rank_it(steps):
    import dataclasses

    inplace = steps["inplace"]
    fill = inplace[0].ops["name"] == "aten::masked_fill_"
    stalled = dataclasses.replace(inplace[0])
    stalled.ops = inplace[0].ops.assign(self_us=inplace[0].ops["self_us"].where(~fill, 1e6))   # its masked_fill_ stalled
    d = tracediff.diff(steps["naive"], [stalled, inplace[0], inplace[1]])
    row = d.ops[d.ops["name"] == "aten::masked_fill_"]
    times = sorted(float(s.ops.loc[s.ops["name"] == "aten::masked_fill_", "self_us"].sum()) for s in (stalled, *inplace))
    assert row["time_us_b"].item() == pytest.approx(times[1]) and row["time_us_b"].item() < 1e6
    assert set(d.changed()["name"]) == {"aten::masked_fill", "aten::clone", "aten::copy_"}   # counts: the median step's
    one = tracediff.diff(steps["naive"][0], stalled)
    assert one.ops.loc[one.ops["name"] == "aten::masked_fill_", "time_us_b"].item() >= 1e6   # a single step keeps its sample
    with pytest.raises(TypeError, match="two Steps"):
        tracediff.diff([], steps["inplace"])


def test_diff_matches_gpu_kernels_by_name_and_launch_shape():
    raw = naive_a100_trace(steps=2)
    # drop the second step's device-to-device copy: what the in-place version does on a GPU
    memcpys = [e for e in raw["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert len(memcpys) == 2
    raw["traceEvents"].remove(max(memcpys, key=lambda e: e["ts"]))
    first, second = reader.load_trace(raw).steps("naive")
    d = tracediff.diff(first, second)
    gone = d.changed()
    assert list(gone["kind"]) == ["GPU"] and gone.iloc[0]["name"].startswith("Memcpy DtoD")
    assert gone.iloc[0]["only_in"] == "a" and (d.gpu_work["count_a"].sum(), d.gpu_work["count_b"].sum()) == (6, 5)
