"""A release agrees with itself: pyproject.toml's version, the changelog's newest entry, the
release every notebook's install cell names, and the tag (tools/release_check.py, which the
release workflow runs before it builds anything)."""
from __future__ import annotations

import importlib.util
import shutil

from tests.helpers import ROOT


def release_check():
    spec = importlib.util.spec_from_file_location("release_check", ROOT / "tools" / "release_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_version_the_changelog_and_every_install_cell_agree():
    check = release_check()
    assert check.problems() == [], check.problems()
    assert check.changelog_versions()[0] == check.version()
    cells = check.install_cells()
    assert len(cells) >= 24, "every notebook of the book, exercises and learner copies too"


def copy_of_release_files(tmp_path):
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("data", "_static", "*.md"))
    return tmp_path


def test_each_disagreement_is_named(tmp_path):
    check = release_check()
    root = copy_of_release_files(tmp_path)
    v = check.version(root)
    assert check.problems(root, tag="v9.9.9")[0] == f"the tag v9.9.9 is not v{v}, the version in pyproject.toml"
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace(f'version = "{v}"', 'version = "9.0.0"'))
    found = check.problems(root)
    assert found[0] == f"CHANGELOG.md's newest entry is {v}, not 9.0.0"
    assert any("01_naive.ipynb's install cell does not install attention-profiled 9.0.0" in f for f in found), found


def test_a_tag_needs_a_dated_changelog_entry(tmp_path):
    check = release_check()
    root = copy_of_release_files(tmp_path)
    v = check.version(root)
    changelog = root / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(f"## [{v}] - unreleased", f"## [{v}] - 2026-12-02"))
    assert check.problems(root, tag=f"v{v}") == []
    changelog.write_text(changelog.read_text().replace(f"## [{v}] - 2026-12-02", f"## [{v}] - unreleased"))
    assert check.problems(root, tag=f"v{v}") == [f"CHANGELOG.md's entry for {v} has no release date (## [{v}] - YYYY-MM-DD)"]
