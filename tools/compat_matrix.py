"""The compatibility matrix: the suite and a fast subset of the book on each readers' stack.

    python tools/compat_matrix.py                      # both cells, the report on stdout and in COMPAT_DIR
    python tools/compat_matrix.py --cells oldest       # one cell
    python tools/compat_matrix.py --no-book            # the suite only
    python tools/compat_matrix.py --full-book          # every chapter and the HTML (make book), not the subset

Readers bring their own torch (README, "Supported versions"). Each cell is a stack: a Python,
a torch and a Triton, installed into a virtual environment of its own under ``--dir`` (kept
between runs, outside the checkout) and tested from a fresh clone of this repository's
committed HEAD, as a new reader would: ``make setup test`` with that environment as ``VENV``,
then one chapter per part of the book executed with the cpu preset (``CHAPTERS``), or with
``--full-book`` the reader's first README command, ``make book``: every chapter and the HTML.

- ``newest``: the newest torch on the package index and the Triton it pins (``--upgrade``, no
  version given: the next torch release is found here, not by a reader).
- ``oldest``: the oldest the course supports, the one GPU image seen so far: Python 3.12,
  torch 2.11, Triton 3.6, with whatever NumPy the resolver picks.

pip installs here clear any machine-wide constraint file (``PIP_CONSTRAINT=/dev/null``): a
constraint that caps torch would otherwise make the newest cell quietly test an older torch.
The report names the versions each cell really ran. Standard library only; exits 1 when any
cell fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cell:
    name: str
    python: str            # the interpreter that makes the cell's environment
    packages: tuple        # pip requirements for torch and Triton
    upgrade: bool = False  # take the newest release on the index even if one is installed


CELLS = {
    "newest": Cell("newest", "python3.11", ("torch", "triton"), upgrade=True),
    "oldest": Cell("oldest", "python3.12", ("torch==2.11.0", "triton==3.6.0")),
}

# One chapter per part of the book (_toc.yml), each chosen for what differs between stacks:
# the profiler, Triton's interpreter, the benchmark, torch.compile and FlexAttention, a training
# step, the ranks of chapter 11, exercise 7's FlexAttention checks, the appendix's timing.
CHAPTERS = ("book/00_profiler_primer", "book/04_triton", "book/06_showdown", "book/07_compiled",
            "book/09_backward", "book/11_context_parallel", "book/exercises/07_compiled",
            "book/appendix/measuring")

VERSIONS = ("import sys, torch, numpy; import triton; "
            "print(f'{sys.version.split()[0]} {torch.__version__} {triton.__version__} {numpy.__version__}')")


@dataclass
class Result:
    cell: str
    commit: str = ""                               # the clone's HEAD, short
    versions: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)      # {"passed": n, "failed": n, ...} from pytest's last line
    tests_ok: bool = False
    book: dict = field(default_factory=dict)       # {chapter: "ok" | "failed"}
    book_ok: bool = True
    html: str = ""                                 # "built" | "not built" with --full-book, else ""
    seconds: dict = field(default_factory=dict)    # per stage
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.tests_ok and self.book_ok


def pip_environment() -> dict:
    """The environment for every pip call: no machine-wide constraint file."""
    return {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run(cmd, log, cwd=None, env=None) -> int:
    """``cmd`` with its output appended to ``log``; its exit code."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n")
        out.flush()
        return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def timed(result: Result, stage: str, fn):
    start = time.monotonic()
    try:
        return fn()
    finally:
        result.seconds[stage] = round(time.monotonic() - start)


def _runs(python: str) -> bool:
    return subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0


def find_python(name: str) -> str:
    """A working interpreter called ``name`` ("python3.12"): the one on PATH, or, where that is a
    pyenv shim of a version that is installed but not selected (the shim then refuses to run),
    that version's own binary."""
    found = shutil.which(name)
    if found and _runs(found):
        return found
    if shutil.which("pyenv"):
        wanted = name.removeprefix("python")
        versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
        for version in sorted((v for v in versions if v == wanted or v.startswith(wanted + ".")), reverse=True):
            prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True).stdout.strip()
            candidate = Path(prefix) / "bin" / name
            if prefix and candidate.exists() and _runs(str(candidate)):
                return str(candidate)
    raise RuntimeError(f"no working {name} on PATH (nor a pyenv version of it); the cell needs it")


def make_environment(cell: Cell, venv: Path, log: Path) -> None:
    """The cell's virtual environment with its torch and Triton (kept between runs)."""
    python = find_python(cell.python)
    if not (venv / "bin" / "python").exists():
        if run([python, "-m", "venv", venv], log):
            raise RuntimeError(f"could not create a virtual environment with {cell.python}")
    pip = [venv / "bin" / "python", "-m", "pip", "install", *(["--upgrade"] if cell.upgrade else []), *cell.packages]
    if run(pip, log, env=pip_environment()):
        raise RuntimeError(f"pip could not install {' '.join(cell.packages)} (see {log})")


def fresh_clone(folder: Path, log: Path) -> Path:
    clone = folder / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    if run(["git", "clone", "-q", "--no-hardlinks", ROOT, clone], log):
        raise RuntimeError(f"git clone of {ROOT} failed")
    return clone


def log_since(log: Path, start: int) -> str:
    """The log's text from byte ``start`` on (a size from ``stat``: bytes, and pip's output
    before it is not all ASCII, so slicing the decoded text there would cut in the wrong place)."""
    return log.read_bytes()[start:].decode(errors="replace")


def pytest_counts(text: str) -> dict:
    """{"passed": 1067, "failed": 5, ...} from pytest's closing line."""
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
                                                    lines[-1])} if lines else {}


def executed_statuses(clone: Path) -> dict:
    """{notebook: "ok" | "failed" | ...} from the runner's report, leaving out what it did not execute."""
    report = clone / "_build" / "executed" / "report.json"
    rows = json.loads(report.read_text())["notebooks"] if report.exists() else []
    return {Path(r["notebook"]).as_posix(): r["status"] for r in rows if r["status"] != "not executed"}


def run_book(result: Result, clone: Path, make: list, venv: Path, log: Path, full: bool) -> None:
    """The subset of chapters, or with ``full`` make book itself (every notebook, then the HTML)."""
    if full:
        code = timed(result, "book", lambda: run([*make, "book", "PRESET=cpu"], log, env=pip_environment()))
        result.book = executed_statuses(clone)
        result.html = "built" if code == 0 and (clone / "_build" / "html" / "index.html").exists() else "not built"
        result.book_ok = result.html == "built" and bool(result.book) and all(s == "ok" for s in result.book.values())
        return
    execute = [venv / "bin" / "python", "-m", "tools.book.execute", "--preset", "cpu", "--no-cache",
               "--only", *CHAPTERS]
    timed(result, "book", lambda: run(execute, log, cwd=clone))
    result.book = executed_statuses(clone)
    result.book_ok = len(result.book) == len(CHAPTERS) and all(s == "ok" for s in result.book.values())


def run_cell(cell: Cell, root: Path, book: str, jobs: str) -> Result:
    folder = root / cell.name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "log.txt"
    log.write_text("")
    result = Result(cell.name)
    venv = folder / "venv"
    try:
        timed(result, "install", lambda: make_environment(cell, venv, log))
        clone = fresh_clone(folder, log)
        result.commit = subprocess.run(["git", "-C", clone, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
        make = ["make", "-C", clone, f"VENV={venv}", f"PYTHON={venv / 'bin' / 'python'}", f"TEST_JOBS={jobs}"]
        if timed(result, "setup", lambda: run([*make, "setup"], log, env=pip_environment())):
            raise RuntimeError(f"make setup failed (see {log})")
        found = subprocess.run([venv / "bin" / "python", "-c", VERSIONS], capture_output=True, text=True)
        result.versions = dict(zip(("python", "torch", "triton", "numpy"), found.stdout.split()))
        start = log.stat().st_size
        code = timed(result, "tests", lambda: run([*make, "test"], log, env=pip_environment()))
        result.tests = pytest_counts(log_since(log, start))
        result.tests_ok = code == 0
        if book != "none":
            run_book(result, clone, make, venv, log, full=book == "full")
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        result.error = str(err)
    return result


def table(results: list) -> str:
    lines = ["| cell | commit | Python | torch | Triton | NumPy | make test | book | seconds (install, setup, tests, book) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        v = r.versions
        tests = ", ".join(f"{n} {w}" for w, n in r.tests.items()) or "-"
        book = (f"{sum(s == 'ok' for s in r.book.values())} of {len(CHAPTERS) if not r.html else len(r.book)} ok"
                if r.book else "-") + (f", HTML {r.html}" if r.html else "")
        secs = ", ".join(str(r.seconds.get(s, "-")) for s in ("install", "setup", "tests", "book"))
        status = "" if r.ok else f" **FAILED**{': ' + r.error if r.error else ''}"
        lines.append(f"| {r.cell}{status} | {r.commit or '?'} | {v.get('python', '?')} | {v.get('torch', '?')} | {v.get('triton', '?')} "
                     f"| {v.get('numpy', '?')} | {tests} | {book} | {secs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/compat_matrix.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=list(CELLS))
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("COMPAT_DIR") or
                                                      Path.home() / ".cache" / "attention-profiled" / "compat"),
                    help="where each cell's environment, clone and log live (default: $COMPAT_DIR, else "
                         "~/.cache/attention-profiled/compat)")
    books = ap.add_mutually_exclusive_group()
    books.add_argument("--no-book", action="store_true", help="leave out the book's chapters")
    books.add_argument("--full-book", action="store_true",
                       help="run make book (every chapter, then the HTML) instead of one chapter per part")
    ap.add_argument("--jobs", default="auto", help="pytest-xdist workers for make test (TEST_JOBS)")
    ap.add_argument("--discard", action="store_true",
                    help="remove each cell's environment and clone after it (a CI runner's disk), keeping its log")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    book = "none" if args.no_book else "full" if args.full_book else "subset"
    start = time.monotonic()
    results = []
    for name in args.cells:
        print(f"compat: {name} ...", flush=True)
        results.append(run_cell(CELLS[name], args.dir.resolve(), book, args.jobs))
        if args.discard:
            for kept in ("venv", "clone"):
                shutil.rmtree(args.dir / name / kept, ignore_errors=True)
        print(table(results[-1:]).splitlines()[-1], flush=True)
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    report = f"{table(results)}\n\n{len(results)} cells in {minutes} min {seconds} s\n"
    (args.dir / "report.md").write_text(report)
    (args.dir / "report.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(report)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
