"""How much of the chapters' GPU branches a CPU test executes.

    python tools/gpu_branch_coverage.py      # needs coverage.py (requirements-test.txt)

A GPU branch is the body of ``if on_gpu:`` / ``if device.type == "cuda":`` in a chapter source
(notebooks/04..10), or the ``else:`` of ``if not on_gpu:``. A chapter executed on a CPU skips
them all; what CI runs of them is the read-and-assert half, moved into ``kernels.gpu_lessons``
and run by tests/trace/test_gpu_lessons.py on fixture steps. This script

1. finds every statement of every GPU branch (with ast) and sorts it: a call into
   ``gpu_lessons`` (its body is what the tests run), or a statement that stays in the chapter
   (the GPU part: it launches or reads device work, or shows what that produced);
2. runs tests/trace/test_gpu_lessons.py under coverage.py and counts the lines of
   kernels/gpu_lessons.py it executed;
3. prints both, and every statement that stays in a chapter, so each can be read as
   "launches device work" or not.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [p for p in sorted((ROOT / "notebooks").glob("*.py")) if p.name[:2].isdigit() and int(p.name[:2]) >= 4]


def _is_gpu_test(test: ast.expr) -> bool | None:
    """True for `on_gpu` / `device.type == "cuda"`, False for `not on_gpu`, None otherwise."""
    text = ast.unparse(test)
    if text in ("on_gpu", "device.type == 'cuda'"):
        return True
    if text == "not on_gpu":
        return False
    return None


def _magic_free(source: str) -> str:
    return "\n".join("# " + line if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def gpu_statements(path: Path) -> list[ast.stmt]:
    """The top-level statements of every GPU branch of one chapter."""
    tree = ast.parse(_magic_free(path.read_text()))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            kind = _is_gpu_test(node.test)
            body = node.body if kind else node.orelse if kind is False else []
            found += [s for s in body if not isinstance(s, ast.If) or _is_gpu_test(s.test) is None]
    return found


def calls_gpu_lessons(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "gpu_lessons"
               for n in ast.walk(stmt))


def lesson_module_coverage() -> tuple[int, int, list[int]]:
    """(lines executed, lines in all, missing line numbers) of kernels/gpu_lessons.py under its tests."""
    with tempfile.TemporaryDirectory() as tmp:
        data, report = Path(tmp) / ".coverage", Path(tmp) / "cov.json"
        run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", "--include=*/kernels/gpu_lessons.py",
               "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "tests/trace/test_gpu_lessons.py"]
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"tests/trace/test_gpu_lessons.py failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report)],
                       cwd=ROOT, check=True, capture_output=True)
        files = json.loads(report.read_text())["files"]
    (summary,) = [f["summary"] for name, f in files.items() if name.endswith("gpu_lessons.py")]
    (missing,) = [f["missing_lines"] for name, f in files.items() if name.endswith("gpu_lessons.py")]
    return summary["covered_lines"], summary["num_statements"], missing


def main() -> int:
    kept = []
    lesson_calls = 0
    for path in CHAPTERS:
        for stmt in gpu_statements(path):
            if calls_gpu_lessons(stmt) and not isinstance(stmt, (ast.For, ast.Try, ast.With, ast.If)):
                lesson_calls += 1
            else:
                kept.append((path.name, stmt))
    covered, total, missing = lesson_module_coverage()
    kept_lines = sum((s.end_lineno or s.lineno) - s.lineno + 1 for _, s in kept)
    print(f"kernels/gpu_lessons.py: {covered} of {total} statements executed by tests/trace/test_gpu_lessons.py"
          + (f" (missing lines {missing})" if missing else ""))
    print(f"chapters 04-10: {lesson_calls} GPU-branch statements hand their steps to gpu_lessons; "
          f"{len(kept)} statements ({kept_lines} lines) stay in the chapters' GPU parts:")
    for name, stmt in kept:
        first = ast.unparse(stmt).splitlines()[0]
        print(f"  {name}:{stmt.lineno}: {first[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
