"""The Binder launch: the environment Binder builds (``binder/``) installs what the chapters and
the library import, with the torch and Triton that ``make setup`` pins where there is no GPU.
(That every notebook page offers a Binder launch link is checked on the built pages:
tests/book/test_browser_book.py.)"""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import ROOT

BINDER = ROOT / "binder"


def binder_requirements() -> tuple[list[Requirement], list[str]]:
    """binder/requirements.txt: its requirements, and what it installs editable."""
    lines = [line.split("#")[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    editable = [line.removeprefix("-e").strip() for line in lines if line.startswith("-e")]
    return [Requirement(line) for line in lines if line and not line.startswith("-")], editable


def makefile_spec(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"the Makefile has no {name}"
    return match.group(1)


def test_binder_pins_the_torch_and_triton_of_make_setup():
    pinned = {str(r) for r in binder_requirements()[0]}
    assert {makefile_spec("TORCH_SPEC"), makefile_spec("TRITON_SPEC")} <= pinned, pinned
    assert re.fullmatch(r"python-3\.\d+", (BINDER / "runtime.txt").read_text().strip())


def test_binder_installs_the_course_from_the_checkout_with_the_book_extra():
    _, editable = binder_requirements()
    assert editable == [".[book]"], "the course from this checkout (no release needed), with the book's stack"


def imported_packages(files: list[Path]) -> set[str]:
    """The top-level names the files import, bar the standard library and the course itself."""
    names = set()
    for path in files:
        # a notebook source's shell and magic lines (!pip, %matplotlib) are not Python
        source = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith(("!", "%")))
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("kernels", "tools", "tests")}


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution those requirements bring, read from this environment's metadata
    (which holds the same stack): the names, canonicalized."""
    seen, todo = set(), list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            if not sub.marker or sub.marker.evaluate({"extra": ""}) or any(
                    sub.marker.evaluate({"extra": e}) for e in req.extras):
                todo.append(sub)
    return seen


def project_requirements(extras: set[str]) -> list[Requirement]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]
    return [Requirement(line) for line in lines]


def test_binder_installs_what_the_chapters_and_the_library_import():
    pinned, editable = binder_requirements()
    extras = {e.strip() for spec in editable for listed in re.findall(r"\[(.*)\]", spec) for e in listed.split(",")}
    installs = installed_closure(pinned + project_requirements(extras))
    sources = sorted((ROOT / "notebooks").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    imported = imported_packages(sources)
    assert {"torch", "pandas", "matplotlib"} <= imported, f"the import scan found too little: {imported}"
    by_module = metadata.packages_distributions()
    missing = {m: by_module.get(m) for m in imported
               if not any(canonicalize_name(d) in installs for d in by_module.get(m, []))}
    assert not missing, f"Binder's environment would not install what these imports need: {missing}"
