"""The readers' stacks: torch 2.11 to 2.15, Triton 3.6 to 3.9 (kernels/compat.py, README
"Supported versions").

CI's ``compat`` matrix runs the whole suite on the newest and the oldest stack; these tests hold
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
    assert ti.unfixable_reason() is None and kernels.available("cpu")["triton"] is None


def test_the_tested_range_is_maintainings():
    from tests.helpers import ROOT

    readme = (ROOT / "MAINTAINING.md").read_text(encoding="utf-8")
    section = readme.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    for package, (oldest, newest) in compat.TESTED.items():
        assert oldest in section and newest in section, f"MAINTAINING.md's supported versions omit {package} {oldest}-{newest}"


