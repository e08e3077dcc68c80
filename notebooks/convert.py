"""Write every notebook of the book from its source here, a plain Python file in percent format.

    python notebooks/convert.py           # notebooks/**/*.py -> book/**/*.ipynb
    python notebooks/convert.py --check   # exit 1 if a book notebook differs from its source

Why sources: a reviewable diff, no outputs to strip, and one place for the conventions every
notebook shares (Colab asks for a GPU runtime; the install and parameters cells fold behind a
toggle in the book). Edit the .py, then convert; `make test` fails if the two disagree.

Format: ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines start
with ``# ``, and ``tags=["parameters"]`` (or other tags) after ``# %%`` tags the cell.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
BOOK = HERE.parent / "book"
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    # Colab opens the notebook on a GPU runtime when one is free (the GPU lane of the traces).
    "accelerator": "GPU",
    "colab": {"gpuType": "T4", "provenance": []},
}


def cell_from(header: str, body: str):
    body = body.strip("\n")
    found = re.findall(r"tags=\[([^\]]*)\]", header)
    tags = [t.strip().strip("\"'") for t in found[0].split(",")] if found else []
    if "[markdown]" in header:
        lines = (line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line
                 for line in body.splitlines())
        cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    else:
        cell = nbformat.v4.new_code_cell(body)
        if "%pip install" in body or "parameters" in tags:
            tags.append("hide-cell")  # collapsed behind a toggle in the book; as is in Jupyter
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
