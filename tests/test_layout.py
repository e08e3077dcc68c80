"""The library's layout: modules import downwards, each name from its one home.

Read with ``ast`` from the sources of kernels/ and tools/ (nothing is imported), these tests
hold three rules of the package layout:

- no import cycle between modules, counting every import of a project module, at module
  level or inside a function alike (a function-level import is still a dependency);
- no module re-exports a name it imports from another project module (package ``__init__``
  files excepted): a name is imported from where it is defined;
- no cycle between the packages of kernels/ (attention, triton, cuda, trace, bench, hw,
  parallel, exercises): a package never imports one that imports it back;
- boundaries (kernels/, tools/ and the notebooks/ sources): no module takes another module's
  underscore name (``from m import _x`` or ``m._x``), and none reaches a name through a module
  that only imports it (``flash.tl`` when flash imported ``tl``; a package's ``__all__`` excepted).
"""
from __future__ import annotations

import ast
import graphlib
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


def absolute_base(module: Module, node: ast.ImportFrom) -> str:
    """What ``from <base> import ...`` names, a relative base made absolute."""
    base = node.module or ""
    if node.level:
        package = module.name if module.is_package else module.name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return base


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
            base = absolute_base(module, node)
            source = resolve(module, base, modules)
            for alias in node.names:
                submodule = f"{source or base}.{alias.name}"
                add(submodule if submodule in modules else source, node.lineno)
    return found


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (node -> the nodes it imports) from a node back to it, or [] if none.

    graphlib reports a cycle when it cannot order the nodes; its list runs from each node to the
    one that depends on it, so it is reversed to read in the direction of the imports.
    """
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1][::-1]
    return []


def describe(cycle: list[str], modules: dict[str, Module]) -> str:
    return " -> ".join(cycle) + "  (" + ", ".join(
        f"{modules[a].path.relative_to(ROOT)}:{modules[a].imports[b]}" for a, b in zip(cycle, cycle[1:])) + ")"


MODULES = read_modules()


def test_no_module_imports_one_that_imports_it_back():
    graph = {name: set(m.imports) for name, m in MODULES.items()}
    found = cycle_in(graph)
    assert not found, "an import cycle (every import counts, in a function or not; the first import line of each step):\n" \
        + describe(found, MODULES)


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
    found = cycle_in(graph)
    assert not found, "packages of kernels/ that import each other (one import of each step):\n" + \
        " -> ".join(found) + "  (" + "; ".join(why[a, b] for a, b in zip(found, found[1:])) + ")"


def test_the_layout_rules_can_fail(tmp_path):
    """The readers above see what they must: a function-level import, a relative one, a
    script's bare sibling import, and a cycle through them."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    found = cycle_in(graph)
    assert found[0] == found[-1] and set(found) == {"a", "b", "c"}, found
    assert all(b in graph[a] for a, b in zip(found, found[1:])), f"{found} runs along the imports"
    assert cycle_in({"a": {"b"}, "b": set()}) == []
    script = Module("tools.x", ROOT / "tools/x.py", ast.parse("def f():\n    from gpu_run import pack\n"), False)
    assert set(project_imports(script, MODULES)) == {"tools.gpu_run"}, "a script's function-level sibling import counts"
    relative = Module("kernels.trace.x", ROOT / "kernels/trace/x.py",
                      ast.parse("def f():\n    from .reader import Step\n    from .. import registry\n"), False)
    assert set(project_imports(relative, MODULES)) == {"kernels.trace.reader", "kernels.registry"}


# --- Boundaries: a module's underscore names stay in it; a name is reached where it is defined.

def read_notebooks() -> list[Module]:
    """The chapter and exercise sources (notebooks/**/*.py): not importable, but they reach
    into the library like any module."""
    return [Module(".".join(path.relative_to(ROOT).with_suffix("").parts), path,
                   ast.parse(without_magics(path.read_text()), str(path)), False)
            for path in sorted((ROOT / "notebooks").rglob("*.py"))]


def without_magics(source: str) -> str:
    """A notebook source as Python: each IPython line (``%matplotlib inline``, ``!pip ...``)
    becomes ``pass``, so the line numbers stay."""
    return re.sub(r"^(\s*)[%!].*$", r"\1pass", source, flags=re.M)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def import_source(module: Module, node: ast.ImportFrom, modules: dict) -> str | None:
    return resolve(module, absolute_base(module, node), modules)


def module_aliases(module: Module, modules: dict) -> dict[str, str]:
    """Local names bound to a project module anywhere in ``module``: name -> module."""
    aliases = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(module, alias.name if alias.asname else alias.name.split(".")[0], modules)
                if target:
                    aliases[alias.asname or alias.name.split(".")[0]] = target
        elif isinstance(node, ast.ImportFrom):
            source = import_source(module, node, modules)
            for alias in node.names:
                if source and f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    return aliases


def top_level_statements(body: list[ast.stmt]):
    """A module's own statements, into ``if``/``try`` blocks (an optional import is still one)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []), *[h.body for h in getattr(node, "handlers", [])]):
                yield from top_level_statements(block)


def only_imported(module: Module) -> set[str]:
    """Names ``module`` binds by an import and never defines itself (def, class, assignment)."""
    imported, defined = set(), set()
    for node in top_level_statements(module.tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return imported - defined


def reached_names(module: Module, modules: dict):
    """Every name ``module`` takes from another project module: (source module, name, line),
    by ``from source import name`` or as ``source.name``."""
    aliases = module_aliases(module, modules)

    def module_of(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return aliases.get(expr.id)
        if isinstance(expr, ast.Attribute):
            outer = module_of(expr.value)
            return f"{outer}.{expr.attr}" if outer and f"{outer}.{expr.attr}" in modules else None
        return None

    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            source = import_source(module, node, modules)
            for alias in node.names:
                if source and f"{source}.{alias.name}" not in modules:
                    yield source, alias.name, node.lineno
        elif isinstance(node, ast.Attribute):
            source = module_of(node.value)
            if source and f"{source}.{node.attr}" not in modules:
                yield source, node.attr, node.lineno


def boundary_breaches(module: Module, modules: dict) -> dict[str, str]:
    """Each name ``module`` takes across a boundary, ``"path: source.name"`` -> what is wrong
    (with the first line that does it)."""
    found: dict[str, str] = {}
    for source, name, line in reached_names(module, modules):
        if source == module.name:
            continue
        key = f"{module.path.relative_to(ROOT)}: {source}.{name}"
        if is_private(name):
            found.setdefault(key, f"line {line}: another module's underscore name")
        elif name in only_imported(modules[source]) and not (
                modules[source].is_package and name in declared_all(modules[source])):
            found.setdefault(key, f"line {line}: only imported there, take it from where it is defined")
    return found


def test_no_module_reaches_into_another():
    found: dict[str, str] = {}
    for module in [*MODULES.values(), *read_notebooks()]:
        found.update(boundary_breaches(module, MODULES))
    new = [f"{key} ({why})" for key, why in found.items()]
    assert not new, "a module takes another's public names, from where they are defined:\n" + "\n".join(new)


def test_the_boundary_rules_can_fail():
    """Planted breaches, each of one kind, are found; their legal forms are not."""
    launch = Module("kernels.x.launch", ROOT / "kernels/x/launch.py", ast.parse(
        "import triton.language as tl\nfrom kernels.reference import attention\n"
        "def _tile(n):\n    return n\nTILE = 16\n"), False)
    package = Module("kernels.x", ROOT / "kernels/x/__init__.py", ast.parse(""), True)
    modules = {**MODULES, package.name: package, launch.name: launch}

    def breaches(source: str) -> dict[str, str]:
        user = Module("kernels.x.user", ROOT / "kernels/x/user.py", ast.parse(source), False)
        return boundary_breaches(user, {**modules, user.name: user})

    assert list(breaches("from kernels.x.launch import _tile\n")) == ["kernels/x/user.py: kernels.x.launch._tile"]
    assert list(breaches("from kernels.x import launch\nlaunch._tile(3)\n")) == \
        ["kernels/x/user.py: kernels.x.launch._tile"]
    assert list(breaches("import kernels.x.launch\nkernels.x.launch._tile(3)\n")) == \
        ["kernels/x/user.py: kernels.x.launch._tile"]
    assert list(breaches("from kernels.x import launch as l\nl.tl.dot\n")) == ["kernels/x/user.py: kernels.x.launch.tl"]
    assert list(breaches("from kernels.x.launch import attention\n")) == \
        ["kernels/x/user.py: kernels.x.launch.attention"]
    assert breaches("from kernels.x.launch import TILE\nfrom kernels.x import launch\nlaunch.TILE\n"
                    "import triton.language as tl\ntl.dot\nlaunch.__name__\n") == {}
    notebook = without_magics("%matplotlib inline\nif True:\n    !ls\n")
    assert ast.parse(notebook) and notebook.splitlines()[2] == "    pass"
