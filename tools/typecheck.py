"""The static gate: mypy over the library, the tools and every chapter and exercise source.

    python tools/typecheck.py                 # kernels/, tools/, notebooks/**/*.py; exit 1 on any error
    python tools/typecheck.py notebooks/05_cuda.py other.py   # the library and tools, and just these sources

The notebooks' sources (percent format, see tools/book/convert.py) are not quite Python: IPython
magics (``%matplotlib inline``, ``!pip ...``) are commented out, and the ``# %% [parameters]``
marker, which convert.py fills with the ``cpu`` preset of ``kernels/presets.yml``, becomes one line
of annotated assignments with the types of that preset (``active_steps: int = 5; ...``). So a
chapter that rebinds a parameter to something else (a list, as chapter 5 once did with
``steps``) fails here, at the line that rebinds it. Every rewrite keeps the line count, so the
errors are reported at the source's own path and line. mypy's settings are in pyproject.toml;
its cache lives in ``_build/mypy-cache``.
"""
from __future__ import annotations

import contextlib
import fcntl
import re
import subprocess
import sys
from pathlib import Path

from kernels.presets import chapter_parameters, load_presets

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# A package, so that pyproject.toml can give the chapters their own settings (book_sources.*).
STAGE = ROOT / "_build" / "typecheck" / "book_sources"
CACHE = ROOT / "_build" / "mypy-cache"
MAGIC = re.compile(r"^(\s*)([%!])")
# Names IPython gives every notebook without an import (mypy would call them undefined).
PRELUDE = "from IPython.display import display; "
# What the runner injects beside the preset's values (tools.book.execute.staged_parameters).
INJECTED = {"trace_dir": "traces"}
# Parameters every chapter turns into torch objects on purpose (`device, dtype = setup(device,
# dtype)`: "auto" or "cuda" becomes a torch.device): typed Any, the others by their values.
RESOLVED = {"device", "dtype"}


def chapter_sources() -> list[Path]:
    """Every chapter, appendix and exercise source (convert.py's own file is no notebook)."""
    return [p for p in sorted(NOTEBOOKS.rglob("*.py")) if p.name != "convert.py"]


def parameters_line(presets_yml: Path = ROOT / "kernels" / "presets.yml") -> str:
    """The parameters cell as one line of annotated assignments, typed from the cpu preset.

    Every preset must give a parameter the same type: a chapter is checked once, for all."""
    presets = {name: chapter_parameters(preset) for name, preset in load_presets(presets_yml).items()}
    types: dict[str, type] = {}
    for preset, params in presets.items():
        for name, value in params.items():
            if types.setdefault(name, type(value)) is not type(value):
                raise SystemExit(f"kernels/presets.yml: {name!r} is a {types[name].__name__} in one preset "
                                 f"and a {type(value).__name__} in {preset!r}; give it one type")
    values = {**presets["cpu"], **INJECTED}
    return "from typing import Any; " + "; ".join(
        f"{name}: {'Any' if name in RESOLVED else type(value).__name__} = {value!r}" for name, value in values.items())


def staged_text(source: Path, params: str) -> str:
    """``source`` as plain Python, line for line: magics commented out, parameters typed."""
    lines = source.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("# %% [parameters]"):
            line = f"{params}  {line}"
        elif MAGIC.match(line):
            line = MAGIC.sub(r"\1# \2", line)
        out.append(line)
    if out:
        out[0] = PRELUDE + out[0]
    return "\n".join(out) + "\n"


def staged_name(source: Path) -> str:
    """A unique, importable module name per source (chapters and exercises share file names)."""
    try:
        rel = source.resolve().relative_to(NOTEBOOKS)
        parts = rel.with_suffix("").parts
    except ValueError:
        parts = ("outside", source.stem)
    return "nb_" + "_".join(re.sub(r"\W", "_", p) for p in parts) + ".py"


def stage(sources: list[Path], params: str) -> dict[str, Path]:
    """Write each source's plain-Python form under _build/typecheck; staged name -> source."""
    STAGE.mkdir(parents=True, exist_ok=True)
    for old in STAGE.glob("nb_*.py"):
        old.unlink()
    (STAGE / "__init__.py").write_text("")
    staged = {}
    for source in sources:
        name = staged_name(source)
        (STAGE / name).write_text(staged_text(source, params))
        staged[name] = source
    return staged


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


@contextlib.contextmanager
def _alone():
    """One gate at a time per checkout: runs share the staged folder and mypy's cache."""
    STAGE.parent.mkdir(parents=True, exist_ok=True)
    with open(STAGE.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run(sources: list[Path]) -> tuple[int, str]:
    """mypy over kernels/, tools/ and ``sources``; its exit status and its report, with each
    staged file's errors given at the source's path (the line numbers are the source's)."""
    with _alone():
        staged = stage(sources, parameters_line())
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE),
             "kernels", "tools", *(str(STAGE / name) for name in staged)],
            cwd=ROOT, capture_output=True, text=True)
    report = done.stdout + done.stderr
    for name, source in staged.items():
        report = report.replace(f"{shown(STAGE / name)}:", f"{shown(source)}:")
    return done.returncode, report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    code, report = run([Path(a) for a in args] if args else chapter_sources())
    print(report, end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
