"""The library's layout: modules import downwards, each name from its one home.

Read with ``ast`` from the sources of kernels/ and tools/ (nothing is imported), these tests
hold three rules of the package layout:

- no import cycle between modules, counting every import of a project module, at module
  level or inside a function alike (a function-level import is still a dependency);
- no module re-exports a name it imports from another project module (package ``__init__``
  files excepted): a name is imported from where it is defined;
- no cycle between the packages of kernels/ (attention, triton, cuda, trace, bench, hw,
  parallel, exercises): a package never imports one that imports it back.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import ROOT

TOP_PACKAGES = ("kernels", "tools")


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: dict[str, int] = field(default_factory=dict)   # project module -> first line importing it


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_modules() -> dict[str, Module]:
    modules = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name = module_name(path)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)), path.name == "__init__.py")
    for module in modules.values():
        module.imports = project_imports(module, modules)
    return modules


def script_sibling(module: Module, name: str, modules: dict) -> str | None:
    """tools/*.py run as scripts (``python tools/gpu_run.py``) with tools/ on sys.path, so
    there a bare ``import gpu_run`` is tools/gpu_run.py."""
    if module.name.count(".") == 1 and module.name.startswith("tools.") and f"tools.{name}" in modules:
        return f"tools.{name}"
    return None


def resolve(module: Module, name: str, modules: dict) -> str | None:
    """The project module ``name`` (as written in ``module``) stands for, or None."""
    if name in modules:
        return name
    return script_sibling(module, name.split(".")[0], modules)


def project_imports(module: Module, modules: dict) -> dict[str, int]:
    """Every project module ``module`` imports, anywhere in its body, with the first line."""
    found: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target and target != module.name:
            found.setdefault(target, line)

    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(resolve(module, alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.name if module.is_package else module.name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            source = resolve(module, base, modules)
            for alias in node.names:
                submodule = f"{source or base}.{alias.name}"
                add(submodule if submodule in modules else source, node.lineno)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one node (Tarjan), as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [cycle_through(group, graph) for group in groups]


def cycle_through(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected group, from its first node back to it (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, ()) & group):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    raise AssertionError(f"{group} is not strongly connected")


def describe(cycle: list[str], modules: dict[str, Module]) -> str:
    return " -> ".join(cycle) + "  (" + ", ".join(
        f"{modules[a].path.relative_to(ROOT)}:{modules[a].imports[b]}" for a, b in zip(cycle, cycle[1:])) + ")"


MODULES = read_modules()


def test_no_module_imports_one_that_imports_it_back():
    graph = {name: set(m.imports) for name, m in MODULES.items()}
    found = cycles(graph)
    assert not found, "import cycles (every import counts, in a function or not; the first import line of each step):\n" \
        + "\n".join(describe(c, MODULES) for c in found)


def imported_names(module: Module) -> dict[str, tuple[str, int, bool]]:
    """Names bound at module level by ``from <project module> import name``: name -> (source,
    line, marked ``# noqa: F401``)."""
    lines = module.path.read_text().splitlines()
    names = {}
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            source = resolve(module, node.module, MODULES)
            if source is None:
                continue
            text = "\n".join(lines[node.lineno - 1:(node.end_lineno or node.lineno)])
            for alias in node.names:
                names[alias.asname or alias.name] = (source, node.lineno, "noqa: F401" in text)
    return names


def declared_all(module: Module) -> set[str]:
    for node in module.tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def used_names(module: Module) -> set[str]:
    """Every name the module reads, in code or in a string annotation."""
    used = {n.id for n in ast.walk(module.tree) if isinstance(n, ast.Name)}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            used.update(re.findall(r"[A-Za-z_]\w*", node.value))  # "Step" in a quoted annotation
    return used


def test_no_module_re_exports_a_name_of_another_module():
    found = []
    for module in MODULES.values():
        if module.is_package:
            continue
        listed, used = declared_all(module), used_names(module)
        for name, (source, line, noqa) in imported_names(module).items():
            where = f"{module.path.relative_to(ROOT)}:{line}: {name} (from {source})"
            if name in listed:
                found.append(f"{where} is listed in __all__")
            elif noqa:
                found.append(f"{where} is imported with '# noqa: F401'")
            elif name not in used:
                found.append(f"{where} is imported and never used")
    assert not found, "each name is imported from its own module, not through another one:\n" + "\n".join(found)


def kernels_package(name: str) -> str | None:
    """The package of kernels/ a module belongs to (kernels.trace.reader -> kernels.trace);
    None for the top-level modules (kernels.registry, kernels.notebook, ...)."""
    parts = name.split(".")
    if parts[0] != "kernels" or len(parts) < 2:
        return None
    package = ".".join(parts[:2])
    return package if MODULES.get(package) and MODULES[package].is_package else None


def test_no_package_of_kernels_imports_one_that_imports_it_back():
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for module in MODULES.values():
        here = kernels_package(module.name)
        if here is None:
            continue
        for target, line in module.imports.items():
            there = kernels_package(target)
            if there and there != here:
                graph.setdefault(here, set()).add(there)
                why.setdefault((here, there), f"{module.path.relative_to(ROOT)}:{line} imports {target}")
    found = cycles(graph)
    assert not found, "packages of kernels/ that import each other (one import of each step):\n" + "\n".join(
        " -> ".join(c) + "  (" + "; ".join(why[a, b] for a, b in zip(c, c[1:])) + ")" for c in found)


def test_the_layout_rules_can_fail(tmp_path):
    """The readers above see what they must: a function-level import, a relative one, a
    script's bare sibling import, and a cycle through them."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    script = Module("tools.x", ROOT / "tools/x.py", ast.parse("def f():\n    from gpu_run import pack\n"), False)
    assert set(project_imports(script, MODULES)) == {"tools.gpu_run"}, "a script's function-level sibling import counts"
    relative = Module("kernels.trace.x", ROOT / "kernels/trace/x.py",
                      ast.parse("def f():\n    from .reader import Step\n    from .. import registry\n"), False)
    assert set(project_imports(relative, MODULES)) == {"kernels.trace.reader", "kernels.registry"}
