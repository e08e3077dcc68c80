"""The wheel, built from the repository as a release builds it: the library and its data, no tools.

pyproject.toml lists the packages and package data the wheel carries. These tests build the
wheel from a copy of every file git knows of (the checkout as committed, with this session's
edits), so a new module of tools/ or a new kind of data file is caught when the list misses
it, then install it outside the checkout and execute a chapter with it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernels.presets import chapter_parameters, load_presets
from tests.helpers import ROOT

CHAPTER = "book/00_profiler_primer.ipynb"


def repository_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    return [f for f in listed if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel --no-deps`` builds from a copy of the repository."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in repository_files():
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / name).read_bytes())
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                           "-w", str(tmp / "dist")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return next((tmp / "dist").glob("*.whl"))


@pytest.mark.slow
def test_the_wheel_holds_the_library_and_its_data_and_no_tools(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tools = sorted(n for n in names if n.startswith("tools/") or n.split("/")[0] in {"tests", "notebooks", "book"})
    assert not tools, f"the wheel is the library only (no runner, cache, HTML build, publish or converter): {tools}"
    library = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kernels").rglob("*.py") if "__pycache__" not in p.parts}
    assert library <= names, f"every module of kernels/ is in the wheel; missing: {sorted(library - names)}"
    sources = {f"kernels/cuda/csrc/{p.name}" for p in (ROOT / "kernels" / "cuda" / "csrc").iterdir()
               if p.suffix in {".cu", ".cpp", ".h", ".cuh"}}
    assert {s for s in sources if s.endswith(".cu")} and sources <= names, \
        f"the CUDA sources ship (the extension builds from them): missing {sorted(sources - names)}"
    assert "kernels/presets.yml" in names, "the presets ship: python -m kernels.bench reads its defaults there"
    data = {f"kernels/data/{p.relative_to(ROOT / 'book' / 'data').as_posix()}"
            for p in (ROOT / "book" / "data").rglob("*") if p.is_file() and p.name != "README.md"}
    assert data <= names, f"book/data ships as kernels/data (recorded runs, benchmarks): missing {sorted(data - names)}"


@pytest.mark.slow
def test_an_installed_wheel_executes_a_chapter_outside_the_checkout(wheel, tmp_path):
    """A chapter executed with papermill by a Python that sees the installed wheel and not the
    checkout: its cells import the library from the wheel and its presets come from there."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    work = tmp_path / "reader"
    work.mkdir()
    notebook = work / Path(CHAPTER).name
    chapter = json.loads((ROOT / CHAPTER).read_text())
    chapter["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                             "source": "import kernels\nprint('kernels from', kernels.__file__)"})
    notebook.write_text(json.dumps(chapter))
    params = {**chapter_parameters(load_presets()["cpu"]), "trace_dir": "traces"}
    run = ("import json, sys, papermill\n"
           "import kernels, kernels.presets\n"
           "print(json.dumps({'kernels': kernels.__file__, 'presets': str(kernels.presets.PRESETS_PATH)}))\n"
           f"papermill.execute_notebook({str(notebook)!r}, {str(work / 'executed.ipynb')!r}, "
           f"parameters=json.loads({json.dumps(params)!r}), cwd={str(work)!r}, progress_bar=False)\n")
    done = subprocess.run([sys.executable, "-c", run], cwd=work, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    where = json.loads(done.stdout.splitlines()[0])
    assert where["kernels"].startswith(str(site)) and where["presets"].startswith(str(site)), \
        f"the library and its presets are the installed wheel's, not the checkout's: {where}"
    executed = json.loads((work / "executed.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                      for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
    assert "✔" in printed, "the chapter ran to its lessons and asserted them"
    assert f"kernels from {site}" in printed, "the notebook's kernel imported the library from the wheel"
    assert list((work / "traces").rglob("*.json*")), "the chapter wrote its traces beside itself"
