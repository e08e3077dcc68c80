"""How a page shows numbers and tables (``kernels.notebook.readable`` and ``table_html``): as a
reader reads them, with no float noise, no exponent on a count, no index nobody named."""
from __future__ import annotations

import pandas as pd
import pytest

from kernels.notebook import readable, table_html


@pytest.mark.parametrize("value, shown", [
    (2147483648, "2,147,483,648"), (2.147484e9, "2,147,484,000"), (119.276845, "119.3"), (4.536724, "4.537"),
    (0.01234, "0.01234"), (4.85, "4.85"), (4.0, "4"), (17.0, "17"), (0.7, "0.7"), (1955.0, "1,955"),
    (5.3e-7, "5.3e-07"), (0.0, "0"), (-12.5, "-12.5"), ("n/a", "n/a"), (True, "True")])
def test_a_number_reads_with_four_significant_digits_and_no_trailing_zeros(value, shown):
    assert readable(value) == shown, f"readable({value!r}) must read {shown!r}, not {readable(value)!r}"


def header_rows(html: str) -> int:
    return html.split("</thead>")[0].count("<tr")


def test_a_named_index_puts_its_name_in_the_one_header_row():
    frame = pd.DataFrame({"time (ms)": [1.5, 2.0]}, index=pd.Index(["naive", "sdpa"], name="variant"))
    html = table_html(frame)
    assert header_rows(html) == 1, "pandas gives an index name a header row of its own; the page does not"
    assert "<th>variant</th>" in html and "<th>naive</th>" in html and "<td>1.5</td>" in html


def test_an_unnamed_row_number_is_not_shown():
    frame = pd.DataFrame({"op": ["mm", "softmax", "bmm"]}).iloc[[0, 2]]   # 0, 2: left by a filter
    html = table_html(frame)
    assert header_rows(html) == 1 and "<th>0</th>" not in html and "<th>2</th>" not in html, html
    assert "<td>mm</td>" in html and "<td>bmm</td>" in html


def test_row_labels_and_a_multiindex_are_kept():
    labelled = pd.DataFrame({"x": [1, 2]}, index=["H100", "MI300X"])
    assert "<th>H100</th>" in table_html(labelled), "a label is not a row number"
    multi = pd.DataFrame({"x": [1, 2]}, index=pd.MultiIndex.from_tuples([("a", 1), ("a", 2)], names=["g", "i"]))
    assert table_html(multi) == multi.to_html(notebook=True), "a MultiIndex shows as pandas shows it"
