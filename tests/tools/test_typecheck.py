"""The static gate (tools/typecheck.py): mypy over kernels/, tools/ and every chapter source.

It runs in `make test`; mypy's cache (_build/mypy-cache) makes a warm run take seconds.
"""
import textwrap

import pytest

from tools import typecheck


def test_library_tools_and_every_chapter_type_check():
    sources = typecheck.chapter_sources()
    assert len(sources) >= 20, f"the gate reads every chapter and exercise source, found {len(sources)}"
    code, report = typecheck.run(sources)
    assert code == 0, f"mypy found errors (fix them, or see pyproject.toml's [tool.mypy]):\n{report}"
    assert "Success: no issues found" in report, report


BROKEN = '''\
# %% [markdown]
# # A chapter that shadows a parameter

# %% [parameters]

# %%
import torch
from kernels.trace import record

active_steps = [step for step in ("tile", "mask", "exp2")]  # the design steps, under the parameter's name
run = record.profile(torch.mm, torch.ones(2, 2), torch.ones(2, 2), label="mm", active=active_steps,
                        trace_dir=trace_dir)
'''


@pytest.fixture
def broken_chapter(tmp_path):
    path = tmp_path / "99_broken.py"
    path.write_text(textwrap.dedent(BROKEN))
    return path


def test_a_shadowed_parameter_fails_the_gate_at_its_line(broken_chapter):
    code, report = typecheck.run([broken_chapter])
    assert code != 0, f"the gate passed a chapter that rebinds active_steps to a list:\n{report}"
    lines = broken_chapter.read_text().splitlines()
    rebinds = 1 + next(i for i, line in enumerate(lines) if line.startswith("active_steps = "))
    assert f"{broken_chapter}:{rebinds}: error: Incompatible types in assignment" in report, (
        f"the report names the line that rebinds the parameter ({rebinds}):\n{report}")


def test_the_broken_chapter_passes_once_it_uses_its_own_name(broken_chapter):
    """The failure above is the shadowing, not something else in the file."""
    fixed = broken_chapter.read_text().replace("active_steps = [", "design_revisions = [")
    broken_chapter.write_text(fixed)
    code, report = typecheck.run([broken_chapter])
    assert f"{broken_chapter}:" not in report, report  # (the library's own errors, if any, fail the test above)
