"""Does a release agree with itself? The version in pyproject.toml, the release the notebooks'
install cells name, the changelog's newest entry and (in the release workflow) the pushed tag.

    python tools/release_check.py             # the checkout: version, notebooks, changelog
    python tools/release_check.py --tag v0.1.0  # also the tag being released

Prints one line per disagreement and exits 1, or prints the version and exits 0.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "attention-profiled"


def version(root: Path = ROOT) -> str:
    found = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    if found is None:
        raise ValueError("pyproject.toml has no version = \"...\" line")
    return found.group(1)


def changelog_versions(root: Path = ROOT) -> list[str]:
    """The versions the changelog has entries for, newest first (``## [0.1.0] - date`` headings)."""
    path = root / "CHANGELOG.md"
    return re.findall(r"^## \[(\d[^\]]*)\]", path.read_text(), re.M) if path.exists() else []


def install_cells(root: Path = ROOT) -> dict[str, str]:
    """Each notebook's install cell (its first code cell), by path."""
    cells = {}
    for path in sorted((root / "book").rglob("*.ipynb")):
        code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        if code:
            cells[path.relative_to(root).as_posix()] = "".join(code[0]["source"])
    return cells


def problems(root: Path = ROOT, tag: str | None = None) -> list[str]:
    """What disagrees, one sentence each (empty: the release is consistent)."""
    v, found = version(root), []
    if tag is not None and tag != f"v{v}":
        found.append(f"the tag {tag} is not v{v}, the version in pyproject.toml")
    entries = changelog_versions(root)
    if tag is not None and entries and entries[0] == v and not re.search(
            rf"^## \[{re.escape(v)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", (root / "CHANGELOG.md").read_text(), re.M):
        found.append(f"CHANGELOG.md's entry for {v} has no release date (## [{v}] - YYYY-MM-DD)")
    if not entries:
        found.append("CHANGELOG.md has no '## [version]' entry")
    elif entries[0] != v:
        found.append(f"CHANGELOG.md's newest entry is {entries[0]}, not {v}")
    for path, source in install_cells(root).items():
        if f'"{PACKAGE}=={v}"' not in source or f"@v{v}\"" not in source:
            found.append(f"{path}'s install cell does not install {PACKAGE} {v} (by name, the tag v{v} as fallback)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", help="the git tag being released, e.g. v0.1.0")
    args = parser.parse_args(argv)
    found = problems(tag=args.tag)
    for line in found:
        print(line)
    if not found:
        print(f"release {version()} agrees: pyproject.toml, CHANGELOG.md, the notebooks' install cells"
              + (f", the tag {args.tag}" if args.tag else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
