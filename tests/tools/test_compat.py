"""The readers' stacks: torch 2.11 to 2.15, Triton 3.6 to 3.9 (kernels/compat.py, README
"Supported versions").

``make test-compat`` runs the whole suite on the newest and the oldest stack; these tests hold
the pieces that differ between them to their contract on whatever stack runs them: the fix for
Triton 3.6's interpreter with NumPy 2.4 is applied exactly where it is needed and does what
Triton 3.7 does, and a combination the library cannot fix is reported by ``available()`` in words.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from kernels import compat
from kernels.triton import interpreter as ti

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("triton_version, numpy_version, broken", [
    ("3.6.0", "2.4.0", True), ("3.6.0", "2.3.5", False), ("3.7.1", "2.4.6", False), ("3.9.0", "2.5.0", False),
    ("3.6.1", "3.0.0", True)])
def test_the_interpreter_fix_is_needed_exactly_for_triton_before_3_7_with_numpy_2_4(
        monkeypatch, triton_version, numpy_version, broken):
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(np, "__version__", numpy_version)
    assert ti.scalar_index_broken() is broken


class _Scope:
    """Triton's patch scope, as far as _patch_lang_tensor uses it: records what it sets."""

    def set_attr(self, obj, name, value):
        setattr(obj, name, value)


class _Handle:
    def __init__(self, data):
        self.data = data


def test_the_fix_makes_a_one_element_array_an_index_as_triton_3_7_does(monkeypatch):
    from triton.runtime import interpreter

    def triton_3_6_patch(tensor, scope):   # what Triton 3.6 sets: int() of a 1-D array
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton_3_6_patch)
    monkeypatch.setattr(ti, "scalar_index_broken", lambda: True)
    assert ti.squeeze_scalar_index()
    patched = interpreter._patch_lang_tensor
    assert patched is not triton_3_6_patch and ti.squeeze_scalar_index() and interpreter._patch_lang_tensor is patched, \
        "applied once, then kept"

    class Tensor:
        def __init__(self, data):
            self.handle = _Handle(data)

    interpreter._patch_lang_tensor(Tensor, _Scope())
    assert list(range(Tensor(np.array([5], dtype=np.int32)))) == [0, 1, 2, 3, 4]
    assert [0, 10, 20][Tensor(np.array([2]))] == 20 and Tensor(np.array(7)).__index__() == 7


def test_nothing_is_patched_where_the_interpreter_is_fine(monkeypatch):
    from triton.runtime import interpreter

    before = interpreter._patch_lang_tensor
    monkeypatch.setattr(ti, "scalar_index_broken", lambda: False)
    assert ti.squeeze_scalar_index() and interpreter._patch_lang_tensor is before


def test_an_unfixable_interpreter_is_reported_by_available_in_words(monkeypatch):
    monkeypatch.setattr(ti, "asked", lambda: True)
    monkeypatch.setattr(ti, "squeeze_scalar_index", lambda: False)
    reason = kernels.available("cpu")["triton"]
    assert reason and "NumPy" in reason and "numpy<2.4" in reason and triton.__version__ in reason, reason
    assert kernels.available("cpu")["naive"] is None, "only the interpreted Triton kernels are stopped"
    q = k = v = torch.randn(1, 1, 8, 16)
    with pytest.raises(kernels.registry.CannotRun, match="numpy<2.4"):
        kernels.get("triton")(q, k, v)


def test_this_stack_has_no_known_problem():
    """Run on each stack of the matrix: the library's fixes cover every combination it knows."""
    assert compat.known_problem_reason("triton", torch.device("cpu")) is None


def test_the_tested_range_is_the_readmes():
    from tests.helpers import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    for package, (oldest, newest) in compat.TESTED.items():
        assert oldest in section and newest in section, f"README's supported versions omit {package} {oldest}-{newest}"


def _matrix():
    """tools/compat_matrix.py (a script, not part of the package), imported once."""
    import importlib.util
    import sys

    from tests.helpers import ROOT

    if "compat_matrix" not in sys.modules:
        spec = importlib.util.spec_from_file_location("compat_matrix", ROOT / "tools" / "compat_matrix.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module   # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["compat_matrix"]


def test_the_matrix_executes_one_chapter_of_each_part_of_the_book():
    import yaml

    from tests.helpers import ROOT

    parts = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))["parts"]
    chosen = _matrix().CHAPTERS
    for part in parts:
        files = [c["file"] for c in part["chapters"]]
        picked = [c for c in chosen if c in files]
        assert len(picked) == 1, f"part {part['caption']!r}: the matrix executes {picked}, want one of {files}"
    assert len(chosen) == len(parts)


def test_the_matrix_reads_pytests_closing_line():
    text = "....\n=== short test summary info ===\nFAILED tests/test_x.py::test_y\n" \
           "5 failed, 1067 passed, 12 skipped, 90 deselected in 301.2s\n"
    assert _matrix().pytest_counts(text) == {"failed": 5, "passed": 1067, "skipped": 12, "deselected": 90}
    assert _matrix().pytest_counts("no tests ran") == {}


def test_the_matrixs_pip_calls_clear_the_constraint_file(monkeypatch):
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/some/constraints.txt")
    assert _matrix().pip_environment()["PIP_CONSTRAINT"] == "/dev/null"
    cells = _matrix().CELLS
    assert cells["newest"].upgrade and all("==" not in p for p in cells["newest"].packages), \
        "the newest cell takes whatever is newest on the index"
    assert set(cells["oldest"].packages) == {f"torch=={compat.TESTED['torch'][0]}.0",
                                             f"triton=={compat.TESTED['triton'][0]}.0"}


def test_the_matrixs_report_says_whether_make_book_built_the_html():
    matrix = _matrix()
    built = matrix.Result("newest", tests={"passed": 3}, tests_ok=True, book={"book/00.ipynb": "ok"}, html="built")
    broken = matrix.Result("oldest", tests={"passed": 3}, tests_ok=True, book={"book/00.ipynb": "ok"},
                           book_ok=False, html="not built")
    rows = matrix.table([built, broken]).splitlines()[2:]
    assert "1 of 1 ok, HTML built" in rows[0] and "FAILED" not in rows[0], rows[0]
    assert "HTML not built" in rows[1] and "FAILED" in rows[1], "a book without its HTML fails the cell"


def test_the_matrix_names_a_missing_interpreter(monkeypatch):
    matrix = _matrix()
    monkeypatch.setattr(matrix.shutil, "which", lambda name: None)   # neither python3.99 nor pyenv
    with pytest.raises(RuntimeError, match="no working python3.99"):
        matrix.find_python("python3.99")


def test_the_matrix_reads_the_test_run_after_non_ascii_install_output(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("pip: ━━━━━━━━━━ 526.6/526.6 MB ✓\n" * 50, encoding="utf-8")
    start = log.stat().st_size
    with open(log, "a", encoding="utf-8") as out:
        out.write("....\n== 1246 passed, 108 skipped, 17 warnings in 321.88s ==\n")
    assert _matrix().pytest_counts(_matrix().log_since(log, start)) == {"passed": 1246, "skipped": 108}
