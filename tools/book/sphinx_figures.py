"""A Sphinx extension of the book's build: a figure caption belongs to the cell's image only.

A chapter captions a figure with ``#| caption:`` (``tools/book/convert.py`` writes it as
myst-nb's ``figure`` cell metadata). myst-nb then wraps *every* display output of that cell in
a figure with the caption, so a lesson, a glued number or a table shown by the same cell
would become a numbered figure too. This transform unwraps each such figure that holds no
image, before Sphinx numbers the figures, so the numbers count the images alone.

Listed in ``_config.yml`` under ``sphinx: extra_extensions``.
"""
from __future__ import annotations

from docutils import nodes
from sphinx.transforms import SphinxTransform


def _is_notebook_output(figure: nodes.figure) -> bool:
    return any(n.get("nb_element") == "mime_bundle" for n in figure.findall(nodes.container))


def _holds_an_image(figure: nodes.figure) -> bool:
    return any(str(n.get("mime_type", "")).startswith("image/") for n in figure.findall(nodes.container)) \
        or any(True for _ in figure.findall(nodes.image))


class CaptionOnlyImages(SphinxTransform):
    """Unwrap the figures myst-nb made around a captioned cell's outputs that are not images."""

    # Before sphinx.transforms.AutoNumbering (999), which gives each figure the id it is numbered by.
    default_priority = 500

    def apply(self, **kwargs) -> None:
        for figure in list(self.document.findall(nodes.figure)):
            if _is_notebook_output(figure) and not _holds_an_image(figure):
                figure.replace_self([c for c in figure.children if not isinstance(c, (nodes.caption, nodes.legend))])


def setup(app):
    app.add_transform(CaptionOnlyImages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
