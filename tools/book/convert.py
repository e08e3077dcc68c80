"""Write every notebook of the book from its source: a plain Python file in percent format.

    python -m tools.book.convert           # notebooks/**/*.py -> book/**/*.ipynb
    python -m tools.book.convert --check   # exit 1 if a book notebook differs from its source

jupytext reads the sources (``# %%`` a code cell, ``# %% [markdown]`` a markdown cell,
``tags=[...]`` its tags). What is the course's own is written here: two cells every notebook
shares, ``# %% [install]`` (installs the course's release in Colab) and ``# %% [parameters]``
(the cell papermill replaces: the ``cpu`` preset's chapter parameters, ``kernels/presets.yml``,
and ``trace_dir``; lines under the marker are added to it). Each cell's conventions (hint
dropdowns as ``<details>``, ``#| caption:`` figures, folded solutions and setup) are applied
by ``cell_from`` and ``fold_setup`` (the page shows one folded setup box; the install and
parameters cells stay in the notebook, off the page); ``{reading_minutes}`` in markdown becomes the page's
reading time (``fill_reading_time``). Each exercise is also written as a learner's copy,
``book/exercises/unsolved/NN.ipynb``, its solutions replaced by a link to the page showing them.
"""
from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

from kernels.presets import chapter_parameters, load_presets
from tools.book.layout import ROOT, UNSOLVED

SOURCES = ROOT / "notebooks"
BOOK = ROOT / "book"
REPOSITORY = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
if _VERSION is None:
    raise SystemExit("pyproject.toml has no version line: the install cell names the release by it")
VERSION = _VERSION.group(1)
RELEASE = f"v{VERSION}"  # the tag of this version's release: what a reader's install gets, not main
PACKAGE = "attention-profiled"
# By name from the package index first; from the release's tag in the repository when the index
# does not have it (a tag whose upload has not happened: .github/workflows/release.yml).
INSTALL = f"""# In Colab, or anywhere the course is not installed yet, install its release {RELEASE}.
import sys
try:
    import kernels.trace.record
except ImportError:
    !{{sys.executable}} -m pip install --quiet "{PACKAGE}=={VERSION}" || {{sys.executable}} -m pip install --quiet "{PACKAGE} @ git+{REPOSITORY}@{RELEASE}\""""
# The parameters a reader gets outside the runner: the GPU when there is one (Colab), else the CPU.
READER_DEFAULTS = {"device": "auto", "dtype": "auto"}
# How the book labels the cells it folds away (myst-nb's code_prompt_show): the page's one setup
# box (the install and parameters cells are removed from the page, so its label names them too:
# a reader finds all three in the notebook opened in Colab or downloaded) and the solutions.
PROMPTS = {"setup": "Setup: install, parameters, imports", "solution": "Solution"}
HIDE_PROMPTS = {"solution": "Hide the solution"}
# A chapter's first screen says how long it takes to read (fill_reading_time).
READING_TIME = "{reading_minutes}"
READING_WORDS_PER_MINUTE = 200
READING_CODE_LINES_PER_MINUTE = 15
# MyST's dropdown renders only in the built book; HTML <details> folds in Jupyter and Colab too.
DROPDOWN = re.compile(r"^:::\{dropdown\}[ \t]*(.*?)\n(.*?)\n:::[ \t]*$", re.M | re.S)
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    # Colab opens the notebook on a GPU runtime when one is free (the GPU track of the traces).
    "accelerator": "GPU",
    "colab": {"gpuType": "T4", "provenance": []},
}


def parameters(extra: str) -> str:
    """The parameters cell: the cpu preset's values, as the runner would inject them."""
    defaults = {**chapter_parameters(load_presets(ROOT / "kernels" / "presets.yml")["cpu"]), **READER_DEFAULTS}
    lines = ["# Parameters: the runner (python -m tools.book.execute) replaces these with a preset's values;",
             '# run by hand, "auto" takes the GPU when there is one.']
    lines += [f"{name} = {value!r}".replace("'", '"') for name, value in defaults.items()]
    lines += ['trace_dir = "traces"'] + ([extra] if extra else [])
    return "\n".join(lines)


def details(markdown: str) -> str:
    """Each MyST dropdown in ``markdown`` as an HTML <details>: folded in the book, Jupyter and Colab."""
    return DROPDOWN.sub(lambda m: f'<details class="ap-hint">\n<summary>{m.group(1).strip()}</summary>\n\n'
                                  f"{m.group(2).strip()}\n\n</details>", markdown)


def caption_options(body: str) -> tuple[str, dict]:
    """A figure cell's ``#| caption: ...`` and ``#| alt: ...`` lines, taken out of its code.

    They become myst-nb's cell metadata: the figure drawn by the cell is shown as a numbered
    figure with that caption (what to see in it) and that alt text (what it shows, for a reader
    who cannot see it).
    """
    options, kept = {}, []
    for line in body.splitlines():
        found = re.match(r"^#\|\s*(caption|alt|name):\s*(.+)$", line)
        if found:
            options[found.group(1)] = found.group(2).strip()
        else:
            kept.append(line)
    if options and not {"caption", "alt"} <= set(options):
        raise SystemExit(f"a figure cell needs both '#| caption:' and '#| alt:' lines: {body[:80]!r}")
    return "\n".join(kept), options


# jupytext reads ``# %% [install]`` as a code cell titled "[install]": the course's shared cells.
SHARED_CELLS = ("[install]", "[parameters]")


def cell_from(source_cell):
    """The book's cell for one source cell as jupytext read it, with the course's conventions."""
    body = source_cell.source.strip("\n")
    tags = list(source_cell.metadata.get("tags", []))
    shared_as = source_cell.metadata.get("title")
    if shared_as == "[install]":
        body = INSTALL
    elif shared_as == "[parameters]":
        body, tags = parameters(body), tags + ["parameters"]
    if source_cell.cell_type == "markdown":
        cell = nbformat.v4.new_markdown_cell(details(body))
    else:
        body, figure = caption_options(body)
        if "solution" in tags:  # Colab ignores hide-input but folds a form cell to its title
            body = "#@title A solution (double-click to show it)\n" + body
        cell = nbformat.v4.new_code_cell(body)
        if "solution" in tags:
            cell.metadata["cellView"] = "form"
        if shared_as in SHARED_CELLS:
            tags.append("remove-cell")  # off the book's page; as is in Colab, Binder and the download
        if "solution" in tags:
            cell.metadata["mystnb"] = {"code_prompt_show": PROMPTS["solution"],
                                       "code_prompt_hide": HIDE_PROMPTS["solution"]}
        if figure:
            cell.metadata.setdefault("mystnb", {}).update(
                {"figure": {"caption": figure["caption"], **({"name": figure["name"]} if "name" in figure else {})},
                 "image": {"alt": figure["alt"]}})
    if tags:
        cell.metadata["tags"] = tags
    return cell


def source_cells(source: Path):
    """The cells of ``source`` as jupytext reads them; a ``# %% [name]`` that is not a shared
    cell (a misspelt ``[parameters]``) is refused rather than written as plain code."""
    cells = jupytext.read(source, fmt="py:percent").cells
    for cell in cells:
        title = cell.metadata.get("title")
        if title is not None and title not in SHARED_CELLS:
            raise SystemExit(f"{source}: '# %% {title}' is not a cell this book knows; "
                             f"the shared cells are {', '.join(SHARED_CELLS)}")
    return cells


HIDDEN_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell", "parameters"}


def shown_code_lines(cells) -> int:
    """Non-blank lines of the code a reader sees on the page: not the cells removed or folded
    (the install and parameters cells, the setup box ``fold_setup`` folds, solutions)."""
    code = [c for c in cells if c.cell_type == "code" and not HIDDEN_TAGS & set(c.metadata.get("tags", []))]
    return sum(1 for c in code for line in c.source.splitlines() if line.strip())


def prose_words(cells) -> int:
    """Words of the page's markdown cells, a folded note (a MyST dropdown or a <details>) counted
    by its title alone, as a folded output is: read only by who opens it."""
    words = 0
    for cell in cells:
        if cell.cell_type == "markdown":
            text = FOLDED_HTML.sub(r"\1", DROPDOWN.sub(r"\1", cell.source))
            words += len(re.sub(r"</?(?:details|summary)[^>]*>", " ", text).split())
    return words


def fill_reading_time(cells) -> None:
    """Write the page's reading time where its markdown says ``{reading_minutes}``.

    The rule: the words of the page's markdown cells (``prose_words``) at 200 a minute, plus the lines of code it
    shows (``shown_code_lines``: run after ``fold_setup``) at 15 a minute, rounded up to whole
    minutes, at least 1. Tables, figures and the sentences cells print are not counted here (the
    notebook is not run yet): the executed page's time counts them (``restate_reading_time``).
    Only that exact placeholder is replaced: MyST's glue roles ({glue:text}`name`)
    and any other braces are left as they are.
    """
    words = prose_words(cells)
    read = words / READING_WORDS_PER_MINUTE + shown_code_lines(cells) / READING_CODE_LINES_PER_MINUTE
    minutes = str(max(1, math.ceil(read)))
    for cell in cells:
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace(READING_TIME, minutes)


# What the executed page shows besides its prose and code, in minutes of reading: a figure, a
# table (scanned for the row the prose reads, not read cell by cell).
READING_FIGURE_MINUTES = 0.5
READING_TABLE_MINUTES = 1 / 3
STATED_TIME = re.compile(r"(\*\*Time:\*\* about )(\d+)( min)")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
FOLDED_HTML = re.compile(r"<details[^>]*>\s*<summary>(.*?)</summary>.*?</details>", re.S)
FOLDED_OUTPUT_TAGS = {"remove-cell", "remove-output", "hide-output", "hide-cell", "parameters", "injected-parameters"}


def shown_output_reading(cells) -> tuple[int, int, int, int]:
    """(words, code lines, tables, figures) of the outputs an executed page shows unfolded: the
    sentences and ✔ lines cells print or display as Markdown, the source a cell shows
    (``show_lines``: a fenced block, read as code), their tables and their figures (the traces
    box is read as words, but for its folded part: a <details> counts its summary only)."""
    import html as html_lib

    words = code = tables = figures = 0
    for cell in cells:
        if cell.cell_type != "code" or FOLDED_OUTPUT_TAGS & set(cell.metadata.get("tags", [])):
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            rich = "".join(data.get("text/html", "")) if "text/html" in data else ""
            if "image/png" in data:
                figures += 1
            elif "<table" in rich and "ap-traces" not in rich:
                tables += rich.count("<table")
            elif "text/markdown" in data and not rich:
                text = "".join(data["text/markdown"])
                fenced = FENCED.findall(text)
                code += sum(1 for block in fenced for line in block.splitlines() if line.strip())
                words += len(FENCED.sub(" ", text).split())
            else:
                text = rich or "".join(data.get("text/plain", "")) or "".join(output.get("text", ""))
                text = FOLDED_HTML.sub(r"\1", text)  # a folded part is read only by who opens it
                words += len(html_lib.unescape(re.sub(r"<style.*?</style>|<[^>]+>", " ", text, flags=re.S)).split())
    return words, code, tables, figures


def restate_reading_time(cells) -> None:
    """On an executed page, "**Time:** about N min" counts what the run printed too: the prose
    and shown code as ``fill_reading_time`` counts them, plus the outputs shown unfolded
    (``shown_output_reading``): their words at the same 200 a minute, the source they show at 15
    lines a minute, a third of a minute a table and half a minute a figure, rounded up."""
    prose = prose_words(cells)
    words, code, tables, figures = shown_output_reading(cells)
    read = ((prose + words) / READING_WORDS_PER_MINUTE + (shown_code_lines(cells) + code) / READING_CODE_LINES_PER_MINUTE
            + tables * READING_TABLE_MINUTES + figures * READING_FIGURE_MINUTES)
    minutes = str(max(1, math.ceil(read)))
    for cell in cells:
        if cell.cell_type == "markdown" and STATED_TIME.search(cell.source):
            cell.source = STATED_TIME.sub(lambda m: m.group(1) + minutes + m.group(3), cell.source, count=1)
            return


# The setup call every page makes; the line after it prints what the page runs with.
SETUP_CALL = "setup(device, dtype)"


def ran_with_lines(indent: str, exercise: bool = False) -> list[str]:
    """The lines ``fold_setup`` adds after the setup call: one printed line naming the preset's
    parameters as this run has them, since the parameters cell is off the page. An exercise's
    checks (and an appendix's demonstrations) draw their own shapes, so its line names the device
    and dtype only."""
    names = ("device", "dtype") if exercise else chapter_parameters(load_presets(ROOT / "kernels" / "presets.yml")["cpu"])
    return [f"{indent}from kernels.notebook import ran_with",
            f"{indent}print(ran_with({', '.join(f'{n}={n}' for n in names)}))"]


def fold_setup(cells, exercise: bool = False) -> None:
    """Make the page's first code cell after the parameters (imports and ``setup(device, dtype)``:
    the course's bookkeeping, not what the page teaches) its one setup box: folded behind
    "Setup: install, parameters, imports" in the book, its output (the device note, and the
    line ``ran_with`` prints) visible. The install and parameters cells are removed from the
    page (``cell_from``), so this is the only box a page opens with."""
    after = next((i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])), None)
    first = next((c for c in cells[after + 1:] if c.cell_type == "code"), None) if after is not None else None
    if first is None or SETUP_CALL not in first.source:
        return
    lines = first.source.splitlines()
    at = next(i for i, line in enumerate(lines) if SETUP_CALL in line)
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    first.source = "\n".join(lines[:at + 1] + ran_with_lines(indent, exercise) + lines[at + 1:])
    tags = first.metadata.setdefault("tags", [])
    if "hide-input" not in tags:
        tags.append("hide-input")
    first.metadata["mystnb"] = {"code_prompt_show": PROMPTS["setup"], "code_prompt_hide": "Hide the setup"}


def github(path: str) -> str:
    """The repository's page for ``path`` (relative to the repository's root)."""
    return f"{REPOSITORY}/blob/main/{path}"


def colab(path: str) -> str:
    return "https://colab.research.google.com/github/" + github(path).removeprefix("https://github.com/")


def is_exercise(source: Path) -> bool:
    return source.relative_to(SOURCES).parts[0] == "exercises"


def learner_links(where: str) -> str:
    """The exercise page's pointer to its learner copy (``where``: that copy, from the repository's root)."""
    return (f"**To answer it yourself**, take the copy without solutions: [open it in Colab]({colab(where)}), "
            f"[see it on GitHub]({github(where)}), or use this page's download button. This page shows the "
            "course's solutions, folded under each task (**Solution**).")


# How an exercise's check cell runs the course's solution in the book's build: ``check(solution_x
# if solutions else x)``. A reader is shown ``check(x)``; the switch goes to a hidden cell.
SOLUTION_SWITCH = re.compile(r"\b(solution_\w+) if solutions else (\w+)\b")


def solution_switches(cells) -> list:
    """An exercise's cells with each check reading ``check(x)``: the switch to the course's
    solution (``solution_x if solutions else x``) moves to a cell before it, ``if solutions:
    x = solution_x``, off the page (remove-cell) and out of the learner's copy
    (tag ``solution-switch``)."""
    out = []
    for cell in cells:
        pairs = list(dict.fromkeys(SOLUTION_SWITCH.findall(cell.source))) if cell.cell_type == "code" else []
        if pairs:
            switch = nbformat.v4.new_code_cell("if solutions:  # the book runs the course's solutions\n"
                                               + "\n".join(f"    {mine} = {theirs}" for theirs, mine in pairs))
            switch.metadata["tags"] = ["remove-cell", "solution-switch"]
            out.append(switch)
            cell.source = SOLUTION_SWITCH.sub(r"\2", cell.source)
        out.append(cell)
    return out


def learner_cell(cell, page: str):
    """One cell of an exercise's learner copy: a solution becomes a pointer to the page that shows it;
    links relative to the book become links to the repository (the copy is read anywhere)."""
    if "solution" in cell.metadata.get("tags", []):
        return nbformat.v4.new_markdown_cell(f"*The course's solution to this task is on [the exercise's page]({github(page)}).*")
    if "parameters" in cell.metadata.get("tags", []):  # the comment on running the solutions goes with them
        cell = nbformat.from_dict(dict(cell))
        cell.source = "\n".join(line for line in cell.source.splitlines() if "solutions = True" not in line)
        return cell
    if cell.cell_type == "markdown":
        cell = nbformat.from_dict(dict(cell))
        folder = Path(page).parent.as_posix()
        cell.source = re.sub(r"\]\((?!https?:|#)([^)\s]+\.ipynb)\)",
                             lambda m: f"]({github(os.path.normpath(f'{folder}/{m.group(1)}'))})", cell.source)
    return cell


def notebook(source: Path, learner: bool = False) -> str:
    """The notebook ``source`` becomes, as the exact text written to disk; ``learner``: an
    exercise's copy without its solutions (what a learner downloads or opens in Colab)."""
    nb = nbformat.v4.new_notebook(metadata=METADATA)
    nb.cells = [cell_from(cell) for cell in source_cells(source)]
    if is_exercise(source):
        nb.cells = solution_switches(nb.cells)
    fold_setup(nb.cells, exercise=is_exercise(source) or source.relative_to(SOURCES).parts[0] == "appendix")
    fill_reading_time(nb.cells)
    page = (BOOK / source.relative_to(SOURCES).with_suffix(".ipynb")).relative_to(BOOK.parent).as_posix()
    if learner:
        nb.cells = [learner_cell(c, page) for c in nb.cells if "solution-switch" not in c.metadata.get("tags", [])]
    elif is_exercise(source):
        nb.cells.insert(1, nbformat.v4.new_markdown_cell(learner_links(unsolved_path(page))))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:02d}"
    return nbformat.writes(nb) + "\n"


def unsolved_path(page: str) -> str:
    """Where an exercise page's learner copy lives, from the repository's root."""
    return (Path(page).parent / UNSOLVED / Path(page).name).as_posix()


def pairs():
    """(source, notebook path) for every source under notebooks/."""
    for source in sorted(SOURCES.rglob("*.py")):
        yield source, BOOK / source.relative_to(SOURCES).with_suffix(".ipynb")


def written():
    """(source, notebook path, learner) for every notebook written: each source's book notebook,
    and each exercise's learner copy beside it in unsolved/."""
    for source, target in pairs():
        yield source, target, False
        if is_exercise(source):
            yield source, target.parent / UNSOLVED / target.name, True


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for source, target, learner in written():
        text = notebook(source, learner)
        if check:
            if not target.exists() or target.read_text() != text:
                stale.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print("wrote", target.relative_to(BOOK.parent))
    for target in stale:
        print(f"{target.relative_to(BOOK.parent)} differs from its source: run `python -m tools.book.convert`")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
