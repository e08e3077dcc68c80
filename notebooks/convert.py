"""Write every notebook of the book from its source here, a plain Python file in percent format.

    python notebooks/convert.py           # notebooks/**/*.py -> book/**/*.ipynb
    python notebooks/convert.py --check   # exit 1 if a book notebook differs from its source

Why sources: a reviewable diff, no outputs to strip, and one place for the conventions every
notebook shares (Colab asks for a GPU runtime; the install and parameters cells fold behind a
toggle in the book). Edit the .py, then convert; `make test` fails if the two disagree.

Format: ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines start
with ``# ``, and ``tags=[...]`` after ``# %%`` tags the cell. Two cells every notebook shares
are written here, not in each source:

- ``# %% [install]``: installs the course in Colab, from the repository URL of ``_config.yml``.
- ``# %% [parameters]``: the cell papermill replaces, with the defaults of the ``cpu`` profile
  of ``book/params.yml`` and ``trace_dir``; lines under the marker are added to it (an
  exercise's ``solutions = False``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

HERE = Path(__file__).resolve().parent
BOOK = HERE.parent / "book"
REPOSITORY = yaml.safe_load((HERE.parent / "_config.yml").read_text())["repository"]["url"]
VERSION = re.search(r'^version = "([^"]+)"', (HERE.parent / "pyproject.toml").read_text(), re.M).group(1)
RELEASE = f"v{VERSION}"  # the tag of this version's release: what a reader's install gets, not main
INSTALL = f"""# In Colab, or anywhere the course is not installed yet, install its release {RELEASE}.
try:
    import kernels.profiling
except ImportError:
    %pip install --quiet "attention-profiled @ git+{REPOSITORY}@{RELEASE}\""""
# The parameters a reader gets outside the runner: the GPU when there is one (Colab), else the CPU.
READER_DEFAULTS = {"device": "auto", "dtype": "auto"}
# How the book labels the shared cells it folds away (myst-nb's code_prompt_show).
PROMPTS = {"install": "Show how this page installs the course", "parameters": "Show this page's parameters"}
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    # Colab opens the notebook on a GPU runtime when one is free (the GPU lane of the traces).
    "accelerator": "GPU",
    "colab": {"gpuType": "T4", "provenance": []},
}


def parameters(extra: str) -> str:
    """The parameters cell: the cpu profile's values, as the runner would inject them."""
    defaults = {**yaml.safe_load((BOOK / "params.yml").read_text())["cpu"], **READER_DEFAULTS}
    lines = ["# Parameters: the runner (python -m kernels.execute) replaces these with a device profile;",
             '# run by hand, "auto" takes the GPU when there is one.']
    lines += [f"{name} = {value!r}".replace("'", '"') for name, value in defaults.items()]
    lines += ['trace_dir = "traces"'] + ([extra] if extra else [])
    return "\n".join(lines)


def cell_from(header: str, body: str):
    body = body.strip("\n")
    if "[install]" in header:
        body = INSTALL
    elif "[parameters]" in header:
        body, header = parameters(body), header + ' tags=["parameters"]'
    found = re.findall(r"tags=\[([^\]]*)\]", header)
    tags = [t.strip().strip("\"'") for t in found[0].split(",")] if found else []
    if "[markdown]" in header:
        lines = (line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line
                 for line in body.splitlines())
        cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    else:
        if "solution" in tags:  # Colab ignores hide-input but folds a form cell to its title
            body = "#@title A solution (double-click to show it)\n" + body
        cell = nbformat.v4.new_code_cell(body)
        if "solution" in tags:
            cell.metadata["cellView"] = "form"
        shared = "install" if "%pip install" in body else "parameters" if "parameters" in tags else None
        if shared:
            tags.append("hide-cell")  # collapsed behind a labelled toggle in the book; as is in Jupyter
            cell.metadata["mystnb"] = {"code_prompt_show": PROMPTS[shared], "code_prompt_hide": "Hide"}
    if tags:
        cell.metadata["tags"] = tags
    return cell


def notebook(source: Path) -> str:
    """The notebook ``source`` becomes, as the exact text written to disk."""
    parts = re.split(r"^# %%(.*)$", source.read_text(), flags=re.M)
    nb = nbformat.v4.new_notebook(metadata=METADATA)
    nb.cells = [cell_from(h, b) for h, b in zip(parts[1::2], parts[2::2])]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:02d}"
    return nbformat.writes(nb) + "\n"


def pairs():
    """(source, notebook path) for every source under notebooks/."""
    for source in sorted(HERE.rglob("*.py")):
        if source.name != Path(__file__).name:
            yield source, BOOK / source.relative_to(HERE).with_suffix(".ipynb")


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for source, target in pairs():
        text = notebook(source)
        if check:
            if not target.exists() or target.read_text() != text:
                stale.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print("wrote", target.relative_to(BOOK.parent))
    for target in stale:
        print(f"{target.relative_to(BOOK.parent)} differs from its source: run `python notebooks/convert.py`")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
