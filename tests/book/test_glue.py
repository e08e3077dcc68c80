"""What ``{glue:text}`` makes of what ``kernels.notebook.glue`` records: read back through
myst-nb's own formatting (``format_plain_text``, what the glue role runs in the book build),
every glued string reads as it was written and every number takes the prose's format."""
from __future__ import annotations

import pytest

from kernels import notebook

# Strings that Python would parse as something else if myst-nb's literal_eval saw them unquoted.
TRICKY = ["134,217,728", "27,648 → 36,864", "1_000", "None", "True", "0x10", "1e3", "it's \"quoted\"",
          "two\nlines", "(not a tuple)", ""]


def rendered(value, fmt: str = "") -> str:
    """The text the book shows for ``{glue:text}`name:fmt``` after ``glue("name", value)``."""
    from myst_nb.core.variables import format_plain_text

    bundle, metadata = notebook.glue_bundle("name", value)
    assert metadata["scrapbook"] == {"name": "name", "mime_prefix": notebook.GLUE_PREFIX}
    return format_plain_text(bundle[notebook.GLUE_PREFIX + "text/plain"], fmt)


@pytest.mark.parametrize("text", TRICKY)
def test_a_glued_string_reads_as_written(text):
    assert rendered(text) == text


def test_a_number_with_thousands_separators_is_not_a_tuple():
    assert rendered(f"{134217728:,}") == "134,217,728"
    assert rendered(134217728, ",d") == "134,217,728", "or glue the number and format it in the prose"


def test_numbers_take_the_prose_format():
    import numpy as np
    import torch

    assert rendered(3.14159, ".2f") == "3.14"
    assert rendered(np.float32(2.5), ".1f") == "2.5"
    assert rendered(torch.tensor(7), "d") == "7"


def test_glue_all_glues_each_name_as_glue_would(monkeypatch):
    seen = []
    monkeypatch.setattr(notebook, "glue", lambda name, value: seen.append((name, value)))
    notebook.glue_all(peak_mib=1.5, label="1,024")
    assert seen == [("peak_mib", 1.5), ("label", "1,024")]
    with pytest.raises(ValueError, match="at least one"):
        notebook.glue_all()
