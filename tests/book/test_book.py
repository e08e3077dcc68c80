"""The runner and the book: notebooks are clean sources, execute with the cpu preset, build with -W."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kernels.presets import bench_defaults, chapter_parameters, load_presets, resolve_preset
from tools.book import cache, execute, layout
from tests.helpers import ROOT

NOTEBOOKS = layout.notebooks(ROOT)
REPO_URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_source_notebooks_are_clean(path):
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    nb = nbformat.read(ROOT / path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "commit notebooks without outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    install = next(c for c in nb.cells if c.cell_type == "code")
    assert "import kernels" in install.source and f"git+{REPO_URL}" in install.source, \
        "the first code cell installs the course from the repository URL in _config.yml"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cover_every_preset(path):
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    nb = nbformat.read(ROOT / path, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = set(re.findall(r"^(\w+)\s*=", params.source, flags=re.M))
    for preset, values in load_presets().items():
        values = chapter_parameters(values)
        assert set(values) <= names, f"{path.name} lacks parameters {set(values) - names} of preset {preset}"


def test_presets_resolve():
    presets = load_presets()
    assert resolve_preset("auto", presets, cuda_available=False)[0] == "cpu"
    assert resolve_preset("auto", presets, cuda_available=True)[0] == "cuda"
    assert resolve_preset("cuda", presets)[1]["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="unknown preset 'tpu'"):
        resolve_preset("tpu", presets)
    with pytest.raises(SystemExit, match="unknown preset 'tpu'"):
        execute.book_preset("tpu", ROOT)


def test_the_chapters_and_the_benchmark_read_one_preset():
    """A preset's chapter parameters leave its bench block out; the bench's defaults are its
    sweep at the preset's own dtype, batch and heads."""
    cpu = load_presets()["cpu"]
    assert "bench" not in chapter_parameters(cpu) and execute.book_preset("cpu", ROOT)[1] == chapter_parameters(cpu)
    defaults = bench_defaults(cpu)
    assert defaults["dtype"] == [cpu["dtype"]] and (defaults["batch"], defaults["heads"]) == (cpu["batch"], cpu["heads"])
    assert cpu["seq"] in defaults["seq"] and cpu["head_dim"] in defaults["head_dim"], \
        "the bench's CPU sweep includes the chapters' own shape"


def test_the_runner_reads_the_presets_of_the_checkout_it_builds(tmp_path):
    root = _tiny_book(tmp_path, {"a": "pass"}, params="cpu:\n  seq: 4\n  bench:\n    seq: [4]\n    head_dim: [2]\n")
    assert execute.book_preset("cpu", root) == ("cpu", {"seq": 4})


def test_only_selects_by_name():
    assert [p.as_posix() for p in layout.select(NOTEBOOKS, ["book/01"])] == ["book/01_naive.ipynb"]
    assert [p.as_posix() for p in layout.select(NOTEBOOKS, ["exercises/01"])] == ["book/exercises/01_naive.ipynb"]
    with pytest.raises(SystemExit, match="matches none"):
        layout.select(NOTEBOOKS, ["zzz"])


def _tiny_book(tmp_path: Path, notebooks: dict, params: str = "cpu:\n  seq: 4\n") -> Path:
    """A book of quick notebooks (no torch): {name: body of the cell after the parameters}."""
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    root = tmp_path / "src"
    (root / "book").mkdir(parents=True)
    first, *rest = notebooks
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/{first}\n"
                                   + ("chapters:\n" + "".join(f"  - file: book/{n}\n" for n in rest) if rest else ""))
    (root / "_config.yml").write_text("title: a tiny book\n")
    (root / "kernels").mkdir()
    (root / "kernels" / "presets.yml").write_text(params)
    for name, body in notebooks.items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell("seq = 1\ndtype = 'x'\ntrace_dir = 't'", metadata={"tags": ["parameters"]}),
                    nbformat.v4.new_code_cell(body)]
        nbformat.write(nb, root / "book" / f"{name}.ipynb")
    return root


def _broken_book(tmp_path: Path) -> Path:
    return _tiny_book(tmp_path, {"boom": "assert seq == 4\nraise ValueError('the planted failure')"})


@pytest.mark.slow
def test_runner_reports_a_failing_notebook(tmp_path, capsys):
    root = _broken_book(tmp_path)
    out = tmp_path / "out"
    report = execute.run("cpu", out=out, root=root)
    row = report["notebooks"][0]
    assert row["status"] == "failed" and "ValueError: the planted failure" in row["error"]
    assert "failed" in (out / "report.md").read_text()
    source = json.loads((root / "book" / "boom.ipynb").read_text())
    assert all(not c.get("outputs") for c in source["cells"]), "the source notebook is left without outputs"
    printed = capsys.readouterr().out
    assert "[1/1] book/boom.ipynb" in printed and "0 executed ok, 1 failed" in printed


@pytest.mark.slow
def test_every_chapter_executes_on_cpu(built_book):
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    report, out, _ = built_book
    failed = [r for r in report["notebooks"] if r["status"] != "ok"]
    assert not failed, failed
    assert report["preset"] == "cpu" and report["environment"]["torch"]
    assert json.loads((out / "report.json").read_text())["notebooks"] == report["notebooks"]
    # traces land beside their notebook even when notebooks run two at a time (a shared
    # working directory once sent a chapter's traces elsewhere)
    rows = {r["notebook"]: r for r in report["notebooks"]}
    for chapter in ("book/00_profiler_primer.ipynb", "book/01_naive.ipynb", "book/02_inplace.ipynb"):
        assert rows[chapter]["traces"], f"{chapter} recorded no trace in its own folder"
        assert all((out / t["path"]).exists() for t in rows[chapter]["traces"])
    for path in NOTEBOOKS:
        nb = nbformat.read(out / path, as_version=4)
        text = "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
                       for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert "✔" in text, f"{path.name} asserted no lesson"
        assert "USDT" not in text, "profiler noise leaked into the book"
        shown_as_text = [c.source[:60] for c in nb.cells if c.cell_type == "code" for o in c.outputs
                         if "<Figure size" in "".join(o.get("data", {}).get("text/plain", ""))
                         and "image/png" not in o.get("data", {})]
        assert not shown_as_text, f"{path}: figures displayed as text, not drawn: {shown_as_text}"


@pytest.mark.slow
def test_book_builds_with_glued_numbers_and_figures(built_book):
    _, _, html = built_book
    for f in layout.toc_files(ROOT / "_toc.yml"):
        page = html / Path(f).with_suffix(".html")
        assert page.exists(), page
    naive = (html / "book" / "01_naive.html").read_text()
    assert re.search(r"The copy moves\s*(<[^>]+>\s*)*[\d.]+", naive), "glued numbers are rendered"
    assert naive.count("<img") >= 1 and list((html / "_images").glob("*.png"))
    info = (html / "book" / "build_info.html").read_text()
    assert "CPU" in info and "cpu" in info and "torch" in info
    assert (html / "index.html").exists()


def _two_notebook_book(tmp_path: Path) -> Path:
    """Two quick notebooks, each printing its seq, for the runner's cache."""
    return _tiny_book(tmp_path, {"a": "print('a', seq)", "b": "print('b', seq)"},
                      params="cpu:\n  seq: 4\n  dtype: float32\n")


def _executed(report) -> list[str]:
    return [r["notebook"] for r in report["notebooks"] if r["status"] == "ok" and not r.get("cached")]


@pytest.mark.slow
def test_a_second_run_with_nothing_changed_executes_nothing(tmp_path, monkeypatch):
    # The library's part of the key has its own test below; fixed here, so the test does not
    # depend on nobody editing kernels/ while it runs.
    monkeypatch.setattr(execute, "library_digest", lambda root: "the library")
    root, out, cache = _two_notebook_book(tmp_path), tmp_path / "out", tmp_path / "cache"
    first = execute.run("cpu", out=out, root=root, cache=cache, progress=False)
    assert _executed(first) == ["book/a.ipynb", "book/b.ipynb"]
    second = execute.run("cpu", out=out, root=root, cache=cache, progress=False)
    assert _executed(second) == [] and all(r["cached"] for r in second["notebooks"]), \
        "a notebook whose source, parameters and library are unchanged is restored, not executed"
    assert "b 4" in (out / "book" / "b.ipynb").read_text(), "the restored notebook holds its outputs"
    (root / "book" / "b.ipynb").write_text((root / "book" / "b.ipynb").read_text().replace("print('b', seq)", "print('b!', seq)"))
    assert _executed(execute.run("cpu", out=out, root=root, cache=cache, progress=False)) == ["book/b.ipynb"]
    assert _executed(execute.run("cpu", out=out, root=root, cache=cache, overrides={"seq": 8}, progress=False)) == \
        ["book/a.ipynb", "book/b.ipynb"], "other parameters are another result"
    forced = execute.run("cpu", only=["book/a"], out=out, root=root, cache=cache, force=True, progress=False)
    assert _executed(forced) == ["book/a.ipynb"] and [r["notebook"] for r in forced["notebooks"]] == \
        ["book/a.ipynb", "book/b.ipynb"], "--only re-runs its notebook and keeps the others' cached results"
    assert "b! 4" in (out / "book" / "b.ipynb").read_text(), "the kept result is the one for these parameters"


def test_set_is_checked_against_the_preset_before_anything_runs(tmp_path):
    root = _two_notebook_book(tmp_path)
    with pytest.raises(SystemExit, match="has no parameter 'sequence'; it has: seq, dtype"):
        execute.run("cpu", out=tmp_path / "out", root=root, overrides={"sequence": 1024})
    with pytest.raises(SystemExit, match="seq is a int in the 'cpu' preset .* not a str"):
        execute.run("cpu", out=tmp_path / "out", root=root, overrides={"seq": "abc"})
    assert not (tmp_path / "out").exists(), "nothing was staged or executed"


def test_build_refuses_a_partial_execution(tmp_path, capsys):
    root = _two_notebook_book(tmp_path)
    assert execute.main(["--preset", "cpu", "--only", "book/a", "--build", "--no-cache", "--out", str(tmp_path / "o")],
                        root=root) == 1
    assert "publishes the whole book" in capsys.readouterr().err


def test_notebooks_match_their_sources():
    """book/**/*.ipynb are written from notebooks/**/*.py; an edit to one alone is caught here."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tools.book.convert", "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    sources = {p.relative_to(ROOT / "notebooks").with_suffix(".ipynb").as_posix()
               for p in (ROOT / "notebooks").rglob("*.py")}
    in_toc = {p.relative_to("book").as_posix() for p in NOTEBOOKS}
    assert in_toc <= sources, f"notebooks without a source: {in_toc - sources}"


def test_reveal_lists_each_difference_and_never_calls_a_missing_guess_right(capsys):
    from kernels.notebook import reveal

    table = reveal(["aten::matmul", "aten::relu"], ["aten::matmul", "aten::mm", "aten::relu"])
    assert table["in the trace?"].tolist() == ["✔", "yes, at #3", ""], table
    assert table["in your guess?"].tolist() == ["✔", "no", "yes, your #2"], "the extra op in the trace is named as not guessed"
    assert reveal(None, ["aten::matmul"]) is None and "No guess written" in capsys.readouterr().out
    assert reveal(10, 13, "work ops") == 3 and "work ops: you guessed 10; in the trace: 13 (3 higher)" in capsys.readouterr().out


def test_reveal_reports_an_item_the_trace_has_elsewhere_as_present_not_missing(capsys):
    """What the trace holds and where are told apart, place by place: the guess's matmul is in the
    trace at #3, not where it was guessed, so it is present at another position; only an op the
    trace lacks is "no"; an item at the same place is ✔ even when others moved around it."""
    from kernels.notebook import reveal

    table = reveal(["aten::matmul", "aten::softmax", "aten::bmm", "aten::relu"],
                   ["aten::softmax", "aten::softmax", "aten::bmm", "aten::matmul"])
    said = dict(zip(table["you guessed"], table["in the trace?"]))
    assert said["aten::matmul"] == "yes, at #4", table
    assert said["aten::softmax"] == "✔" and said["aten::bmm"] == "✔", "same place, same item: ✔"
    assert said["aten::relu"] == "no", table
    on_trace_side = table["in your guess?"].tolist()
    assert on_trace_side == ["not that many times", "✔", "✔", "yes, your #1"], \
        "softmax was guessed once, and that one is #2"
    out = capsys.readouterr().out
    assert "of your 4, 2 where you put them, 1 at another place, 1 not in the trace; 1 of its 4 you did not guess" in out, out
    ranking = reveal(["GEMM", "attention"], ["elementwise", "GEMM", "copy", "attention"], "parts")
    assert ranking["in the trace?"].tolist() == ["yes, at #2", "yes, at #4", "", ""], \
        "a ranking's items are at another place even where their relative order holds"
    table = reveal(["aten::mm", "aten::mm"], ["aten::mm"])
    assert table["in the trace?"].tolist() == ["✔", "not that many times"], \
        "an op guessed twice and recorded once is still in the trace"


def test_timed_says_how_long_the_step_took_and_returns_its_result(capsys):
    from kernels.notebook import timed

    assert timed(lambda: 42, "extension ready") == 42
    assert re.fullmatch(r"extension ready in \d+\.\d s\n", capsys.readouterr().out)


def test_a_reader_outside_the_runner_gets_the_gpu_and_the_install_cell_the_page_leaves_out():
    """Opened in Colab, a notebook's own defaults apply: device and dtype "auto", and the install
    cell runs first; the book's page leaves both cells out (remove-cell), its setup box names them.
    (That the install cell pins this version's release is tools/release_check.py's,
    tests/tools/test_release.py.)"""
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    for path in NOTEBOOKS:
        cells = nbformat.read(ROOT / path, as_version=4).cells
        params = next(c for c in cells if "parameters" in c.metadata.get("tags", []))
        assert 'device = "auto"' in params.source and 'dtype = "auto"' in params.source, path
        install = next(c for c in cells if c.cell_type == "code")
        assert "pip install" in install.source, f"{path}: the notebook a reader opens installs the course first"
        for cell in (install, params):
            assert "remove-cell" in cell.metadata["tags"], f"{path}: {cell.source[:40]!r} is left off the page"


def test_papermills_injected_parameters_and_colabs_title_lines_are_left_off_the_page(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("seq = 512", metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("#@title A solution (double-click to show it)\ndef f():\n    return 1",
                                          metadata={"tags": ["solution", "hide-input"]})]
    nbformat.write(nb, tmp_path / "page.ipynb")
    execute.off_the_page(tmp_path / "page.ipynb")
    cells = nbformat.read(tmp_path / "page.ipynb", as_version=4).cells
    assert cells[0].metadata["tags"] == ["injected-parameters", "remove-cell"] and cells[0].source == "seq = 512", \
        "off the page, still in the executed notebook a reader downloads"
    assert "tags" not in cells[1].metadata or cells[1].metadata["tags"] == []
    assert cells[2].source == "def f():\n    return 1", "the page folds a solution itself: Colab's title line goes"


def test_an_exercise_check_reads_check_of_the_learners_answer():
    """The book runs the course's solutions (``solutions = True``) through the same check cells a
    learner runs: the switch is a hidden cell before the check, and the learner's copy has none."""
    import nbformat

    for path in NOTEBOOKS:
        if "exercises" not in str(path):
            continue
        cells = nbformat.read(ROOT / path, as_version=4).cells
        shown = [c.source for c in cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])]
        assert not any("if solutions else" in source for source in shown), f"{path}: a check shows the switch"
        switches = [c for c in cells if "solution-switch" in c.metadata.get("tags", [])]
        assert all(c.source.startswith("if solutions:") and "remove-cell" in c.metadata["tags"] for c in switches), path
        learner = nbformat.read(ROOT / path.parent / "unsolved" / path.name, as_version=4).cells
        assert not any("solution_" in c.source for c in learner if c.cell_type == "code"), \
            f"{path.parent / 'unsolved' / path.name}: the learner's copy names a solution"


def test_solutions_fold_in_colab_too():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack
    solutions = [c for path in NOTEBOOKS if "exercises" in str(path)
                 for c in nbformat.read(ROOT / path, as_version=4).cells if "solution" in c.metadata.get("tags", [])]
    assert solutions and all(c.metadata.get("cellView") == "form" and c.source.startswith("#@title") for c in solutions), \
        "Colab does not honour hide-input; a solution cell is a form that shows only its title"


def test_the_runner_finds_its_checkout_or_says_it_needs_one(tmp_path, monkeypatch):
    (tmp_path / "course" / "book").mkdir(parents=True)
    (tmp_path / "course" / "_toc.yml").write_text("format: jb-book\nroot: book/intro\n")
    assert layout.find_root(tmp_path / "course" / "book") == tmp_path / "course", "the nearest _toc.yml upwards"
    monkeypatch.setattr(layout, "ROOT", tmp_path / "not-a-checkout")  # the tools copied out of their checkout
    with pytest.raises(SystemExit, match="no course checkout here: no _toc.yml in"):
        layout.find_root(tmp_path / "elsewhere")


def test_the_cache_key_follows_the_library_and_the_recordings(tmp_path):
    package, root = tmp_path / "kernels", tmp_path / "course"
    (package / "csrc").mkdir(parents=True)
    (package / "naive.py").write_text("x = 1\n")
    (root / "book" / "data").mkdir(parents=True)
    before = cache.library_digest(root, package)
    (package / "naive.py").write_text("x = 2\n")
    after_code = cache.library_digest(root, package)
    (root / "book" / "data" / "meta.json").write_text("{}")
    after_data = cache.library_digest(root, package)
    assert len({before, after_code, after_data}) == 3, "an edit to the library or a new recording re-executes"


def test_glue_records_what_myst_nb_glue_records(monkeypatch):
    """kernels.notebook.glue writes myst_nb's glue output itself (importing myst_nb's glue costs seconds
    per notebook); the book build must read it the same way."""
    import IPython.display
    from myst_nb.ext import glue as myst_glue

    from kernels import notebook

    shown = []
    record = lambda obj, raw=False, metadata=None: shown.append((obj, raw, metadata))  # noqa: E731
    monkeypatch.setattr(myst_glue, "ipy_display", record)
    monkeypatch.setattr(IPython.display, "display", record)
    for value in ("a sentence", "134,217,728", 3.25, 7):
        shown.clear()
        myst_glue.glue("name", value, display=False)
        notebook.glue("name", value)
        assert len(shown) == 2 and shown[0] == shown[1], shown


def test_the_cli_runs_two_cpu_notebooks_at_once_and_gpu_notebooks_alone(monkeypatch):
    monkeypatch.setattr(execute.os, "cpu_count", lambda: 2)
    assert execute.default_jobs({"device": "cuda"}) == 1, "GPU timings need the device to themselves"
    assert execute.default_jobs({"device": "cpu"}) == 2, "on two cores the CPU book executes two notebooks at a time"
    monkeypatch.setattr(execute.os, "cpu_count", lambda: 1)
    assert execute.default_jobs({"device": "cpu"}) == 1, "one core: one notebook at a time"


def test_inductor_cache_goes_beside_the_executed_book(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    out = tmp_path / "_build" / "executed"
    assert execute.keep_inductor_cache(out) == str((tmp_path / "_build" / "inductor-cache").resolve())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "mine")
    assert execute.keep_inductor_cache(out) == "mine", "a caller's own setting wins"
