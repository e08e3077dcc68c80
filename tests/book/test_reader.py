"""What a reader gets from the notebooks' shared machinery: sentences that wrap, learner copies
of the exercises with no solution in them, hints that fold outside the book, figures with
captions (tools/book/convert.py, kernels/notebook.py)."""
from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

EXERCISES = sorted((ROOT / "book" / "exercises").glob("*.ipynb"))


def convert_module():
    from tools.book import convert

    return convert


def test_say_prints_the_line_outside_a_notebook_and_wraps_it_as_html_inside(capsys):
    from kernels import notebook

    notebook.lesson(True, "two matmuls", "2 of 2")
    assert capsys.readouterr().out == "✔ two matmuls (2 of 2)\n", "outside a kernel a lesson is the plain line"
    html = notebook.say_html("uses `aten::bmm` <here> & there", kind="note")
    assert 'class="ap-say ap-note"' in html and "<code>aten::bmm</code>" in html
    assert "&lt;here&gt; &amp; there" in html, "the sentence is escaped, not read as HTML"
    with pytest.raises(ValueError, match="kind must be one of"):
        notebook.say_html("x", kind="shout")


def test_a_lesson_is_one_compact_line_with_its_tick_set_apart():
    """pages.css draws .ap-lesson as a checklist line (a green tick, wrapped lines hanging after
    it); the tick stays the line's first character in plain text (Colab, a terminal)."""
    from kernels import notebook

    html = notebook.say_html("✔ two matmuls (2 of 2)", kind="lesson")
    assert html == ('<div class="ap-say ap-lesson" role="note"><p><span class="ap-tick" title="checked on this run">'
                    "✔ </span>two matmuls (2 of 2)</p></div>")
    assert "ap-tick" not in notebook.say_html("✔ not a lesson", kind="note"), "a notice keeps its box"


def test_a_failed_lesson_still_raises_with_the_claim():
    from kernels import notebook

    with pytest.raises(notebook.LessonFailed, match="The chapter claims: no copies"):
        notebook.lesson(False, "no copies")


def test_timing_claims_assert_refute_and_name_the_undecided_in_one_note(capsys):
    from kernels.notebook import LessonFailed, timing_claims

    assert timing_claims([([True] * 5, "steady claim", "e")]) is True
    assert timing_claims([([True] * 5, "a", ""), ([True, False] * 3, "b", ""), ([False, True] * 3, "c", "")]) is False
    out = capsys.readouterr().out
    assert out.count("Not asserted") == 1 and "b (held in 3 of 6" in out and "c (held in 3 of 6" in out
    with pytest.raises(LessonFailed, match="refuted claim"):
        timing_claims([([False] * 5, "refuted claim", "")])
    with pytest.raises(ValueError, match="at least one"):
        timing_claims([])


def code_lines(cells) -> set[str]:
    return {line.strip() for c in cells if c.cell_type == "code"
            for line in c.source.splitlines() if line.strip() and not line.strip().startswith("#")}


def solution_lines(nb) -> set[str]:
    """The code lines found only in an exercise's solutions (a stub's skeleton, a check's call
    and the solution share some lines: those give nothing away)."""
    solutions = [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]
    return code_lines(solutions) - code_lines([c for c in nb.cells if c not in solutions])


def test_every_learner_copy_has_every_cell_but_no_solution_code():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    assert len(EXERCISES) >= 11
    for full_path in EXERCISES:
        full = nbformat.read(full_path, as_version=4)
        learner_path = full_path.parent / "unsolved" / full_path.name
        assert learner_path.exists(), f"{full_path.name} has no learner copy: run python -m tools.book.convert"
        learner = nbformat.read(learner_path, as_version=4)
        solved = solution_lines(full)
        assert solved, f"{full_path.name} has solutions to leave out"
        for cell in learner.cells:
            assert "solution" not in cell.metadata.get("tags", []), f"{learner_path.name}: a solution cell"
            if cell.cell_type == "code":
                leaked = [line for line in cell.source.splitlines() if line.strip() in solved]
                assert not leaked, f"{learner_path.name}: solution code in a cell: {leaked[:3]}"
        stubs = [c.source for c in full.cells if "stub" in c.metadata.get("tags", [])]
        assert stubs == [c.source for c in learner.cells if "stub" in c.metadata.get("tags", [])], \
            f"{learner_path.name} keeps every task's stub as the page has it"
        params = next(c.source for c in learner.cells if "parameters" in c.metadata.get("tags", []))
        assert re.search(r"^solutions = False$", params, re.M) and "solutions = True" not in params
        links = re.findall(r"\]\(([^)]+\.ipynb)\)", "".join(c.source for c in learner.cells if c.cell_type == "markdown"))
        assert links and all(link.startswith("https://") for link in links), \
            f"{learner_path.name}: a copy read outside the book links the repository, not paths: {links}"


def test_hints_are_html_details_that_fold_in_jupyter():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    for path in EXERCISES:
        markdown = "".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        assert ":::{dropdown}" not in markdown, f"{path.name}: a MyST dropdown is raw text in Jupyter"
        assert markdown.count("<details") == markdown.count("</details>") > 0, path.name


def test_solutions_fold_behind_solution_and_the_page_links_its_learner_copy():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    for path in EXERCISES:
        cells = nbformat.read(path, as_version=4).cells
        solutions = [c for c in cells if "solution" in c.metadata.get("tags", [])]
        assert solutions and all(c.metadata["mystnb"]["code_prompt_show"] == "Solution" for c in solutions)
        intro = cells[1].source
        assert f"blob/main/book/exercises/unsolved/{path.name}" in intro and "colab.research.google.com" in intro


def test_a_half_caption_is_refused():
    # What converted hints and captions become is checked where a reader meets them: hints as
    # <details> in every exercise (above), captions and alt text on every built page (test_browser_book).
    with pytest.raises(SystemExit, match="needs both"):
        convert_module().caption_options("#| caption: no alt\nfig")


def test_a_misspelt_cell_marker_is_refused(tmp_path):
    # The shared cells' conversion is checked on every real notebook: test_book's clean-source,
    # parameters-cover-every-preset and solutions-fold-in-Colab tests.
    source = tmp_path / "page.py"
    source.write_text("# %% [paramters]\nx = 1\n")
    with pytest.raises(SystemExit, match=r"'# %% \[paramters\]' is not a cell this book knows"):
        convert_module().source_cells(source)


def test_the_reading_time_counts_prose_at_200_words_and_shown_code_at_15_lines_a_minute():
    import nbformat

    convert = convert_module()
    prose = " ".join(["word"] * 396)   # with the last line's four words: 400 words, 2 minutes
    setup = nbformat.v4.new_code_cell("\n".join(["import x"] * 50), metadata={"tags": ["hide-input"]})  # the setup box
    hidden = [nbformat.v4.new_code_cell("\n".join(["gpu_only()"] * 50), metadata={"tags": [tag]})
              for tag in ("hide-input", "remove-input", "remove-cell")]   # folded, or off the page: not read
    cells = [nbformat.v4.new_markdown_cell(f"{prose}\n\nTime: {{reading_minutes}} {{glue:text}}`x` {{other}}"),
             setup, *hidden, nbformat.v4.new_code_cell(" ".join(["code"] * 1000))]   # one line of code
    convert.fill_reading_time(cells)
    assert cells[0].source.endswith("Time: 3 {glue:text}`x` {other}"), \
        "400 words (2 min) and one shown line (1/15 min) round up to 3; setup and hidden cells are not read"
    cells = [nbformat.v4.new_markdown_cell(f"{prose} {{reading_minutes}}"), setup,
             nbformat.v4.new_code_cell("\n".join(["y = 1"] * 30))]
    convert.fill_reading_time(cells)
    assert cells[0].source.endswith(" 4"), "400 words and 30 shown lines of code: 2 + 2 minutes"
    cells = [nbformat.v4.new_markdown_cell(" ".join(["w"] * 400) + " {reading_minutes}")]
    convert.fill_reading_time(cells)
    assert cells[0].source.endswith(" 3"), "401 words round up to 3 minutes, never down"
    folded = "\n".join(["w"] * 390) + "\n\n:::{dropdown} Version rules in full\n" + " ".join(["v"] * 500) + "\n:::\n"
    cells = [nbformat.v4.new_markdown_cell(folded + " {reading_minutes}"),
             nbformat.v4.new_markdown_cell('<details class="ap-hint">\n<summary>A hint</summary>\n\n'
                                           + " ".join(["h"] * 500) + "\n\n</details>")]
    convert.fill_reading_time(cells)
    assert cells[0].source.endswith(" 2"), \
        "390 words and two folded notes' titles (6 words): 2 minutes; a folded note is read by who opens it"
    for chapter in sorted((ROOT / "book").glob("[01]*.ipynb")):
        assert "{reading_minutes}" not in chapter.read_text(), f"{chapter.name} shows the placeholder"


def test_an_executed_pages_time_counts_what_the_run_printed():
    import nbformat

    convert = convert_module()
    prose = nbformat.v4.new_markdown_cell("**Time:** about 1 min to read. " + " ".join(["word"] * 194))   # 200 words
    printed = nbformat.v4.new_code_cell("x", metadata={"tags": ["remove-input"]})
    printed.outputs = [nbformat.v4.new_output("stream", text=" ".join(["checked"] * 200))]   # 1 minute
    table = nbformat.v4.new_code_cell("t", metadata={"tags": ["remove-input"]})
    table.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<table><tr><td>1</td></tr></table>"})] * 3
    figure = nbformat.v4.new_code_cell("f", metadata={"tags": ["remove-input"]})
    figure.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBO"})] * 2
    folded = nbformat.v4.new_code_cell("g", metadata={"tags": ["hide-output", "remove-input"]})
    folded.outputs = [nbformat.v4.new_output("stream", text=" ".join(["op"] * 4000))]
    box = nbformat.v4.new_code_cell("b", metadata={"tags": ["remove-input"]})
    box.outputs = [nbformat.v4.new_output("display_data", data={"text/html": (
        "<div><p>Traces</p><details><summary>What each trace recorded</summary>"
        f"<ul><li>{' '.join(['fact'] * 4000)}</li></ul></details></div>")})]
    cells = [prose, printed, table, figure, folded, box]
    convert.restate_reading_time(cells)
    assert cells[0].source.startswith("**Time:** about 5 min"), \
        "200 words of prose and 200 printed (2 min), three tables (1 min) and two figures (1 min); folded output " \
        "unread; a box's five words in view (a sixth of a minute) but not its folded list of 4,000"
    shown = nbformat.v4.new_code_cell("show_lines(f)", metadata={"tags": ["remove-input"]})
    listing = "\n".join(f"x_{i} = {i}" for i in range(30))
    shown.outputs = [nbformat.v4.new_output("display_data", data={
        "text/markdown": f"Where it comes from:\n```python\n{listing}\n```", "text/plain": "<Markdown object>"})]
    cells[0].source = cells[0].source.replace("about 5 min", "about 1 min")
    convert.restate_reading_time(cells + [shown])
    assert cells[0].source.startswith("**Time:** about 7 min"), \
        "a Markdown output is read too: its 30 lines of source at 15 a minute (2 min), its 4 words as words"
    for chapter in sorted((ROOT / "notebooks").glob("[01]*.py")):
        assert convert.STATED_TIME.search(chapter.read_text().replace("{reading_minutes}", "1")), \
            f"{chapter.name} states no '**Time:** about N min' for the executed page to restate"


def test_the_borrowed_gpu_run_says_who_recorded_it_on_which_gpu_from_the_trace_itself():
    from kernels import borrowed

    alexnet = borrowed.ALEXNET_FORWARD
    trace = alexnet.trace()
    credit = alexnet.credit(trace)
    assert "NVIDIA A100" in credit and "HolisticTraceAnalysis" in credit and "MIT" in credit, credit
    assert (borrowed.root() / "LICENSE-HolisticTraceAnalysis").exists(), "the licence notice travels with the trace"
    step = alexnet.step()
    assert len(step.gpu_work) > 0 and step.gpu_work["stream"].nunique() >= 2, "GPU work, on two streams"
    with pytest.raises(KeyError, match="no step labelled 'no such label'"):
        borrowed.Borrowed(alexnet.file, "no such label", "", "", "", "").step()


def test_a_timelines_long_title_never_runs_under_its_legend():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kernels import borrowed
    from kernels.trace import timeline

    step = borrowed.ALEXNET_FORWARD.step()
    fig = timeline.timeline(step, title="a title long enough to reach the legend's side of the figure, " * 2)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    ax = fig.axes[0]
    title, legend = ax.title.get_window_extent(), ax.get_legend().get_window_extent()
    assert title.y0 >= legend.y1 - 1, "the title sits above the legend's row, not beside it"
    tracks = [t.get_text() for t in ax.get_yticklabels()]
    assert all(len(name) <= len("label: ") + timeline.TRACK_NAME_CHARS for name in tracks), tracks


def test_bar_labels_drop_the_prefix_every_backward_bar_shares():
    from kernels.trace.timeline import without_shared_prefix

    assert without_shared_prefix("autograd::engine::evaluate_function: MmBackward0") == "MmBackward0"
    assert without_shared_prefix("aten::softmax") == "softmax" and without_shared_prefix("ProfilerStep#3") == "ProfilerStep#3"


def test_noisy_benchmark_figures_say_so_on_themselves_and_quiet_ones_do_not():
    import dataclasses

    from kernels.bench import plots
    from kernels.bench.results import FORWARD, BenchResults
    from tests.bench.test_plots import DEVICE, row

    quiet = [row(impl, s, FORWARD) for impl in ("naive", "fused") for s in (256, 512, 1024)]
    meta = {"device": {"kind": "cuda", "peaks": DEVICE.as_dict()}}
    busy = quiet[:-1] + [dataclasses.replace(quiet[-1], p10_ms=quiet[-1].median_ms / 10)]  # a 12x spread
    for draw in (plots.time_vs_seq, plots.tflops_vs_seq):
        calm, noisy = (draw(BenchResults(rows, meta=meta)).axes[0] for rows in (quiet, busy))
        assert "NOISY" not in calm.get_title() and not [t for t in calm.texts if "noisy" in t.get_text()]
        warning = [t.get_text() for t in noisy.texts if "Too noisy" in t.get_text()]
        assert warning and "NOISY RUN" in noisy.get_title(), f"{draw.__name__} marks a noisy run on the figure"
        assert "1 of 6 points" in warning[0].replace("\n", " ") and "fused at S=1024" in warning[0].replace("\n", " ")


def test_each_exercise_page_ends_with_links_back_to_its_chapter_and_on_to_the_next():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    from tools.book import layout

    pages = [p for p in layout.notebooks(ROOT) if p.parts[1] == "exercises"]
    for page, following in zip(pages, pages[1:] + [None]):
        cells = nbformat.read(ROOT / page, as_version=4).cells
        last = cells[-1]
        assert last.cell_type == "markdown", f"{page.name}: the way back is a link, not a comment in code"
        assert f"](../{page.name})" in last.source, f"{page.name} links back to its chapter"
        if following is not None:
            assert f"]({following.name})" in last.source, f"{page.name} links on to {following.name}"


def test_the_first_screen_folds_the_imports_but_keeps_their_output():
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    from tools.book import layout

    for page in layout.notebooks(ROOT):
        cells = nbformat.read(ROOT / page, as_version=4).cells
        setup = next(c for c in cells if c.cell_type == "code" and "setup(device, dtype)" in c.source)
        assert "hide-input" in setup.metadata.get("tags", []) and "hide-cell" not in setup.metadata.get("tags", []), \
            f"{page}: the imports fold behind a toggle, the device line they print stays on the page"
        assert setup.metadata["mystnb"]["code_prompt_show"] == "Setup: install, parameters, imports"
        assert "print(ran_with(device=device, dtype=dtype" in setup.source, \
            f"{page}: the setup box prints the parameters the page ran with (their cell is off the page)"


def test_the_setup_box_is_the_one_folded_box_of_code_a_page_shows():
    """Issue #42: code a learner would not type runs in a cell removed from the page (remove-input,
    remove-cell), not folded behind a second toggle; solutions fold on exercise pages. (A long
    output folded by hide-output, such as a listing, is the reader's to open: not counted.)"""
    import nbformat  # here, not at the top: GPU runs collect tests without the book stack

    from tools.book import layout

    extra = {}
    for page in layout.notebooks(ROOT):
        cells = nbformat.read(ROOT / page, as_version=4).cells
        folded = [c.source.splitlines()[0] for c in cells if c.cell_type == "code"
                  and {"hide-input", "hide-cell"} & set(c.metadata.get("tags", []))
                  and "solution" not in c.metadata.get("tags", []) and "setup(device, dtype)" not in c.source]
        if folded:
            extra[page.as_posix()] = folded
    assert not extra, f"folded boxes besides the setup box (first line of each; tag them remove-input or remove-cell): {extra}"
