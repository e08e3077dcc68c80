"""The executed book as HTML: Jupyter Book builds the runner's executed copy, nothing re-runs.

``python -m tools.book.execute --build`` (``make book``) and the book's tests call ``build(out)``
once ``tools.book.execute`` has executed every notebook into ``out``. The build runs with
execution off and warnings as errors, so the pages show exactly what that run computed, and
then completes what the pages link to:

* ``stage_mathjax(out)``: MathJax copied into the book's static files, so pages typeset
  math without a network;
* the traces each notebook wrote, published beside the pages (``tools.book.publish.publish``);
* ``serve_unsolved(out, html)``: each exercise page's download button serves the exercise
  unsolved, from the copies ``tools.book.execute.stage`` keeps;
* ``serve_phone_figures(out, html)``: a phone's browser shows each figure's narrower copy
  (``kernels.figures.phone_copy``), its text as large as on a laptop.
"""
from __future__ import annotations

import base64
import hashlib
import re
import shutil
import sys
from pathlib import Path

from tools.book import publish
from tools.book.layout import ROOT, UNSOLVED


def stage_mathjax(out: Path) -> Path:
    """Copy MathJax (from the jupyter-server-mathjax package) into the book's static files,
    where ``mathjax_path`` in _config.yml finds it: pages then typeset math offline."""
    try:
        import jupyter_server_mathjax
    except ImportError as err:
        raise SystemExit("building the book needs MathJax from the jupyter-server-mathjax package: "
                         "pip install -r requirements.txt") from err
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    dst = Path(out) / "book" / "_static" / "mathjax"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("localization", "*.py"))
    return dst


def build(out: Path = ROOT / "_build" / "executed", html_parent: Path = ROOT) -> Path:
    """Build the executed copy with Jupyter Book (execution off, warnings as errors)."""
    import subprocess

    stage_mathjax(out)

    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(out), "--path-output", str(html_parent), "-W", "-n", "--keep-going"]
    print("Building HTML: jupyter-book", " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    html = html_parent / "_build" / "html"
    print(f"Published {len(publish.publish(out, html))} trace(s) with the HTML", flush=True)
    print(f"Exercise downloads: {len(serve_unsolved(out, html))} unsolved notebook(s)", flush=True)
    print(f"Figures with a phone's copy: {serve_phone_figures(out, html)}", flush=True)
    return html


def serve_unsolved(out: Path, html: Path) -> list[Path]:
    """Make each exercise page's download button serve the unsolved notebook.

    The page shows the book as executed, with the hidden solutions run; a learner who
    downloads it should get the exercise itself, where an empty answer fails its check.
    """
    served = []
    for unsolved in sorted((out / UNSOLVED).rglob("*.ipynb")):
        target = html / "_sources" / unsolved.relative_to(out / UNSOLVED)
        if target.exists():
            shutil.copy2(unsolved, target)
            served.append(target)
    return served


# Where a phone's browser takes the narrower copy: the width at which pages.css treats a screen
# as a phone.
PHONE_MEDIA = "(max-width: 600px)"


def figure_notes(notebook) -> dict[str, tuple]:
    """{the file name myst-nb gives a figure's PNG (its SHA-256): (the PNG of its phone's copy or
    None, {"text-px": its smallest text in PNG pixels, "phone-text-px": the copy's})}, for each
    figure of an executed notebook that carries them in its metadata (``kernels.figures.figure_png``)."""
    from kernels.figures import PHONE_METADATA, PHONE_TEXT_METADATA, TEXT_METADATA

    notes = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get("image/png", {})
            if "image/png" in output.get("data", {}) and (PHONE_METADATA in meta or TEXT_METADATA in meta):
                wide = base64.b64decode(output["data"]["image/png"])
                phone = base64.b64decode(meta[PHONE_METADATA]) if PHONE_METADATA in meta else None
                sizes = {"text-px": meta.get(TEXT_METADATA), "phone-text-px": meta.get(PHONE_TEXT_METADATA)}
                notes[hashlib.sha256(wide).hexdigest() + ".png"] = (phone, {k: v for k, v in sizes.items() if v})
    return notes


def with_phone_source(page: str, name: str, phone: bool = True, sizes: dict | None = None) -> str:
    """Each <img> of ``name`` on the page wrapped in a <picture> whose source a phone takes (where
    it has a phone's copy), and marked with its smallest text's sizes (``data-text-px``,
    ``data-phone-text-px``: what ``tools.book.pages`` reads to tell whether a figure's text is
    legible as shown)."""
    copy = name.removesuffix(".png") + "-phone.png"
    marks = "".join(f' data-{key}="{value}"' for key, value in (sizes or {}).items())

    def wrap(m: re.Match) -> str:
        img = m.group(0).replace("<img ", f"<img{marks} ", 1)
        if not phone:
            return img
        return f'<picture><source media="{PHONE_MEDIA}" srcset="{m.group(1).removesuffix(name) + copy}">{img}</picture>'

    return re.sub(r'<img [^>]*src="([^"]*/_images/' + re.escape(name) + r')"[^>]*>', wrap, page)


def serve_phone_figures(out: Path, html: Path) -> int:
    """Write each figure's phone copy beside it in ``_images`` and point the pages at it; mark
    every figure with its smallest text's size. Returns how many figures have a phone's copy."""
    import nbformat

    notes: dict[str, tuple] = {}
    for notebook in sorted(Path(out).rglob("*.ipynb")):
        notes.update(figure_notes(nbformat.read(notebook, as_version=4)))
    images = html / "_images"
    served = {name: note for name, note in notes.items() if (images / name).exists()}
    for name, (phone, _) in served.items():
        if phone:
            (images / (name.removesuffix(".png") + "-phone.png")).write_bytes(phone)
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        changed = text
        for name, (phone, sizes) in served.items():
            if name in changed:
                changed = with_phone_source(changed, name, phone is not None, sizes)
        if changed != text:
            page.write_text(changed, encoding="utf-8")
    return sum(phone is not None for phone, _ in served.values())
