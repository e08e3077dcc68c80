"""How much of the chapters' GPU branches a CPU test executes.

    python tools/gpu_branch_coverage.py      # needs coverage.py (requirements-test.txt); exit 1 on a gap

A GPU branch is the body of ``if on_gpu:`` / ``if device.type == "cuda":`` in a chapter source
(notebooks/04 and up), or the ``else:`` of ``if not on_gpu:``. A chapter executed on a CPU skips
them all. Every simple statement in them (for, if, with and def are walked into) is one of:

- **launch**: it launches work on the device, or asks the device something: it calls or hands
  on one of ``LAUNCHES`` or anything under ``torch.cuda``, an implementation (``kernels.get(...)``
  or a name the chapter binds to one), ``inputs(..., device=...)`` or ``.to(device, ...)``; or it
  binds names that only launches read (a launch's arguments on a line of their own). It needs a
  GPU and stays in the chapter; the type checker covers it (tools/typecheck.py).
- **plain**: it binds names to plain values (literals and names, builtins such as ``sorted``
  over them, no call into the library) or prints a fixed sentence (string literals only).
  Nothing is computed there that a test could check; it stays, and is counted apart.
- **library**: it hands what the device produced to a library function (``gpu_lessons.x(...)``,
  ``display(plots.y(...))``), its arguments only naming values (names, attributes, items). A
  CPU test executes it when coverage.py sees every such function run under ``TESTS``, on
  fixture steps and benchmark points shaped like an H100's run (tests/hopper_trace.py).
- **chapter**: anything else: it reads or shows results in the chapter, where no CPU test runs it.

A header (``for ...:``, ``if ...:``, ``def ...:``) is a launch where its body launches, else
chapter code. The script prints the share of GPU-branch lines that are neither launches nor
plain that CPU tests execute, the share of all non-launch lines, and every statement that
stays with its reason; it exits 1 if a chapter statement is left, or if a library function
a GPU branch calls is not run by the tests.
"""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [p for p in sorted((ROOT / "notebooks").glob("*.py")) if p.name[:2].isdigit() and int(p.name[:2]) >= 4]
# The CPU tests that run what GPU branches hand to the library (fast: no sweep, no chapter).
TESTS = ("tests/trace/test_gpu_lessons.py", "tests/bench/test_results.py", "tests/bench/test_plots.py")
# Calls that launch work on the device or ask it something, as the chapters write them.
LAUNCHES = {
    "record.profile": "profiles a call on the device",
    "sweep.sweep": "benchmarks on the device",
    "cuda_flash.extension": "builds and loads the CUDA extension",
    "torch.autograd.grad": "runs a backward on the device",
    "torch.randn_like": "makes a tensor on its argument's device",
    "kernels.attention.sdpa.predicted_backend_here": "asks the device its capability",
}
PLAIN_BUILTINS = {"sorted", "set", "dict", "list", "tuple", "min", "max", "range", "len", "abs"}
SHOW = {"display", "print"}   # hands a library function's result to the page
LAUNCH, PLAIN, LIBRARY, CHAPTER = "launch", "plain", "library", "chapter"


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


def gpu_statements(tree: ast.Module) -> list[ast.stmt]:
    """The top-level statements of every GPU branch of one chapter."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            kind = _is_gpu_test(node.test)
            body = node.body if kind else node.orelse if kind is False else []
            found += [s for s in body if not isinstance(s, ast.If) or _is_gpu_test(s.test) is None]
    return found


def dotted(node: ast.expr) -> Optional[str]:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


@dataclass
class Verdict:
    chapter: str
    line: int
    end: int
    kind: str
    reason: str
    text: str
    functions: tuple = ()          # (module, function) a library statement calls

    @property
    def lines(self) -> int:
        return self.end - self.line + 1


class Chapter:
    """One chapter source: its imports, the names it binds to implementations, its GPU branches."""

    def __init__(self, path: Path, source: Optional[str] = None):
        self.path = path
        self.tree = ast.parse(_magic_free(path.read_text() if source is None else source))
        self.modules: dict[str, str] = {}                  # name in the chapter -> library module
        self.functions: dict[str, tuple[str, str]] = {}    # name in the chapter -> (module, function)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "kernels":  # `import kernels.x` binds kernels; `as y`, x
                        self.modules[alias.asname or "kernels"] = alias.name if alias.asname else "kernels"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kernels":
                for alias in node.names:
                    name = alias.asname or alias.name
                    if module_file(f"{node.module}.{alias.name}") is not None:
                        self.modules[name] = f"{node.module}.{alias.name}"
                    else:
                        self.functions[name] = (node.module or "", alias.name)
        self.implementations = {t.id for node in ast.walk(self.tree) if isinstance(node, ast.Assign)
                                and self._gets_implementation(node.value) for t in node.targets
                                if isinstance(t, ast.Name)}

    @staticmethod
    def _gets_implementation(node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and dotted(node.func) == "kernels.get"

    def library_function(self, func: ast.expr) -> Optional[tuple[str, str]]:
        """(module, function) of the library that ``func`` names in this chapter, or None."""
        if isinstance(func, ast.Name):
            return self.functions.get(func.id)
        name = dotted(func)
        if name is None or "." not in name:
            return None
        head, *rest = name.split(".")
        if head not in self.modules:
            return None
        module = self.modules[head]
        while len(rest) > 1 and module_file(f"{module}.{rest[0]}") is not None:
            module = f"{module}.{rest.pop(0)}"
        return (module, rest[0]) if len(rest) == 1 and defines(module, rest[0]) else None

    # ---- the rules ----------------------------------------------------------------------------

    def launch_reason(self, stmt: ast.AST) -> Optional[str]:
        """Why ``stmt`` launches device work (see the module's docstring), or None."""
        for node in ast.walk(stmt):
            name = dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            if name in LAUNCHES:
                return f"{name}: {LAUNCHES[name]}"
            if name is not None and name.startswith("torch.cuda."):
                return f"{name}: asks the device"
            if isinstance(node, ast.Name) and node.id in self.implementations:
                return f"{node.id}: runs an implementation on the device"
            if isinstance(node, ast.Call):
                if self._gets_implementation(node):
                    return "kernels.get(...): an implementation, run on the device"
                if dotted(node.func) == "inputs" and any(k.arg == "device" for k in node.keywords):
                    return "inputs(..., device=...): makes tensors on the device"
                if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and (
                        any(isinstance(a, ast.Name) and a.id == "device" for a in node.args)
                        or any(k.arg == "device" for k in node.keywords)):
                    return ".to(device): copies to the device"
        return None

    def plain(self, stmt: ast.stmt) -> Optional[str]:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and _plain_value(stmt.value):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if all(isinstance(n, ast.Name) for t in targets for n in ast.walk(t) if not isinstance(n, (ast.Tuple, ast.Store))):
                return "plain values"
        if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and dotted(stmt.value.func) in ("print", "say")
                and not stmt.value.keywords
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in stmt.value.args)):
            return "a fixed sentence"
        return None

    def library_calls(self, stmt: ast.stmt) -> Optional[list[tuple[str, str]]]:
        """The library functions a statement hands results to, when that is all it does."""
        if isinstance(stmt, ast.Expr):
            value = stmt.value
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, (ast.Name, ast.Subscript, ast.Tuple)) for t in stmt.targets):
            value = stmt.value
        else:
            return None
        if (isinstance(value, ast.Call) and dotted(value.func) in SHOW and len(value.args) == 1
                and not value.keywords):
            value = value.args[0]
        found: list[tuple[str, str]] = []
        return found if self._library_call(value, found) else None

    def _library_call(self, node: ast.expr, found: list) -> bool:
        if not isinstance(node, ast.Call):
            return False
        target = self.library_function(node.func)
        if target is None:
            return False
        found.append(target)
        return all(self._names_a_value(a, found) for a in [*node.args, *(k.value for k in node.keywords)])

    def _names_a_value(self, node: ast.expr, found: list) -> bool:
        if isinstance(node, (ast.Constant, ast.Name)):
            return True
        if isinstance(node, ast.Attribute):
            return self._names_a_value(node.value, found)
        if isinstance(node, ast.Subscript):
            return self._names_a_value(node.value, found) and self._names_a_value(node.slice, found)
        if isinstance(node, (ast.Tuple, ast.List)):
            return all(self._names_a_value(e, found) for e in node.elts)
        return self._library_call(node, found)

    # ---- the statements -------------------------------------------------------------------------

    def verdicts(self) -> list[Verdict]:
        out: list[Verdict] = []
        for stmt in gpu_statements(self.tree):
            out += self._classify(stmt)
        self._prepared(out)
        return sorted(out, key=lambda v: v.line)

    def _verdict(self, node: ast.stmt, kind: str, reason: str, end: Optional[int] = None, functions=()) -> Verdict:
        text = ast.unparse(node).splitlines()[0]
        return Verdict(self.path.name, node.lineno, end or node.end_lineno or node.lineno, kind, reason, text,
                       tuple(functions))

    def _classify(self, stmt: ast.stmt) -> list[Verdict]:
        if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef)):
            inner = [s for block in (stmt.body, getattr(stmt, "orelse", [])) for s in block
                     if not (isinstance(s, ast.If) and _is_gpu_test(s.test) is not None)]
            children = [v for s in inner for v in self._classify(s)]
            header_end = stmt.body[0].lineno - 1
            head = ast.unparse(stmt).splitlines()[0]
            if any(v.kind == LAUNCH for v in children):
                header = Verdict(self.path.name, stmt.lineno, header_end, LAUNCH, "its body launches", head)
            else:
                header = Verdict(self.path.name, stmt.lineno, header_end, CHAPTER, "a loop or test in the chapter", head)
            return [header, *children]
        reason = self.launch_reason(stmt)
        if reason:
            return [self._verdict(stmt, LAUNCH, reason)]
        calls = self.library_calls(stmt)
        if calls:
            return [self._verdict(stmt, LIBRARY, ", ".join(f"{m}.{f}" for m, f in calls), functions=calls)]
        reason = self.plain(stmt)
        if reason:
            return [self._verdict(stmt, PLAIN, reason)]
        return [self._verdict(stmt, CHAPTER, "reads or shows results in the chapter")]

    def _prepared(self, verdicts: list[Verdict]) -> None:
        """Mark as launches the statements whose bound names only launches read."""
        stmts = {(n.lineno, n.end_lineno): n for n in ast.walk(self.tree) if isinstance(n, (ast.Assign, ast.AnnAssign))}
        loads = [n for n in ast.walk(self.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        changed = True
        while changed:
            changed = False
            launches = [(v.line, v.end) for v in verdicts if v.kind == LAUNCH]
            for v in verdicts:
                node = stmts.get((v.line, v.end))
                if v.kind == LAUNCH or node is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                reads = [n for n in loads if n.id in bound and n.lineno > v.end]
                if reads and all(any(a <= n.lineno <= b for a, b in launches) for n in reads):
                    v.kind, v.reason, changed = LAUNCH, "binds what only launches read", True


def _plain_value(node: ast.expr) -> bool:
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_plain_value(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _plain_value(k) for k in node.keys) and all(_plain_value(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _plain_value(node.left) and _plain_value(node.right)
    if isinstance(node, ast.UnaryOp):
        return _plain_value(node.operand)
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in PLAIN_BUILTINS
                and all(_plain_value(a) for a in node.args) and all(_plain_value(k.value) for k in node.keywords))
    return False


def module_file(module: str) -> Optional[Path]:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache   # asked once per statement that names the function, and again by ran(): parse once
def function_lines(module: str, function: str) -> Optional[frozenset[int]]:
    """The lines of ``function``'s body in ``module`` (its docstring left out), or None."""
    path = module_file(module)
    if path is None:
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            body = node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
            return frozenset(line for s in body for line in range(s.lineno, (s.end_lineno or s.lineno) + 1))
    return None


def defines(module: str, function: str) -> bool:
    return function_lines(module, function) is not None


def executed_lines(tests=TESTS) -> dict[str, set[int]]:
    """Every line of kernels/ that ``tests`` execute, by module, under coverage.py."""
    with tempfile.TemporaryDirectory() as tmp:
        data, report = Path(tmp) / ".coverage", Path(tmp) / "cov.json"
        run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", "--source=kernels",
               "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(tests)} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report)],
                       cwd=ROOT, check=True, capture_output=True)
        files = json.loads(report.read_text())["files"]
    out = {}
    for name, f in files.items():
        parts = Path(name).resolve().with_suffix("").parts
        parts = parts[len(parts) - 1 - parts[::-1].index("kernels"):]   # from the package down
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = set(f["executed_lines"])
    return out


def ran(functions: tuple, executed: dict[str, set[int]]) -> list[str]:
    """The functions of ``functions`` that the tests did not run (empty: all ran)."""
    missing = []
    for module, function in functions:
        lines = function_lines(module, function) or frozenset()
        if not lines & executed.get(module, set()):
            missing.append(f"{module}.{function}")
    return missing


def report(verdicts: list[Verdict], executed: dict[str, set[int]]) -> tuple[list[str], bool]:
    """The report's lines, and whether every GPU-branch line that can run on a CPU is run by a test."""
    lines_of = {k: sum(v.lines for v in verdicts if v.kind == k) for k in (LAUNCH, PLAIN, LIBRARY, CHAPTER)}
    untested = {id(v): ran(v.functions, executed) for v in verdicts if v.kind == LIBRARY}
    tested = sum(v.lines for v in verdicts if v.kind == LIBRARY and not untested[id(v)])
    reading = lines_of[LIBRARY] + lines_of[CHAPTER]
    non_launch = reading + lines_of[PLAIN]
    out = [f"chapters 04+: {len(verdicts)} statements ({sum(lines_of.values())} lines) in GPU branches:",
           f"  launch device work: {lines_of[LAUNCH]} lines (stay; the type checker covers them)",
           f"  plain values or a fixed sentence: {lines_of[PLAIN]} lines (stay; nothing computed to test)",
           f"  read or show results through the library: {lines_of[LIBRARY]} lines, "
           f"{tested} of them run by CPU tests ({', '.join(TESTS)})",
           f"  read or show results in the chapter: {lines_of[CHAPTER]} lines",
           f"lines that read or show results, executed by CPU tests: {tested} of {reading}"
           + (f" ({100 * tested / reading:.0f}%)" if reading else ""),
           f"non-launch lines executed by CPU tests: {tested} of {non_launch}"
           + (f" ({100 * tested / non_launch:.0f}%; the rest are plain)" if non_launch else ""),
           "statements that stay in the chapters:"]
    for v in verdicts:
        if v.kind != LIBRARY:
            out.append(f"  {v.chapter}:{v.line}: [{v.kind}: {v.reason}] {v.text[:90]}")
    gaps = [f"  {v.chapter}:{v.line}: not run by the tests: {', '.join(m)}" for v in verdicts
            if v.kind == LIBRARY and (m := untested[id(v)])]
    if gaps:
        out += ["library calls the tests do not run:", *gaps]
    return out, not gaps and lines_of[CHAPTER] == 0


def all_verdicts(chapters=CHAPTERS) -> list[Verdict]:
    return [v for path in chapters for v in Chapter(path).verdicts()]


def main() -> int:
    lines, complete = report(all_verdicts(), executed_lines())
    print("\n".join(lines))
    if not complete:
        print("GPU branches hold code no CPU test runs: move it into the library (kernels.gpu_lessons, "
              "kernels.bench) and test it on fixture data", file=sys.stderr)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
