"""Headless Chromium for the tests: the DevTools client and file server of
``tools.book.browser``, and Chromium itself, found on PATH or installed with
``apt-get install -y chromium`` where the tests run as root; elsewhere a test that needs it is
skipped with the command to run."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from tools.book.browser import (INSTALL, DevTools, QuietFiles, close_page, find_chromium, open_page_at,  # noqa: F401
                                serve, served)


def find_or_install_chromium() -> str:
    """A Chromium executable; installs the Debian package where it can, else skips."""
    if find_chromium():
        return find_chromium()
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip(f"no Chromium on PATH and no way to install it here (needs root and apt-get): run `{INSTALL}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # pytest-xdist may run two browser test modules at once: one installs, the other waits
    # for it (apt-get holds a lock and fails instead of waiting).
    with open(Path(tempfile.gettempdir()) / "attention-profiled-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            if shutil.which("chromium"):
                break
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"`{' '.join(cmd)}` failed, so Chromium is unavailable: {done.stderr.strip()[-300:]}")
    if not shutil.which("chromium"):
        pytest.skip("apt-get installed chromium but it is not on PATH")
    return shutil.which("chromium")


@contextmanager
def served_in_chromium(html: Path, profile: Path):
    """The folder ``html`` served on loopback and a headless Chromium: ``(tools, base URL)``."""
    with served(html, find_or_install_chromium(), profile) as site:
        yield site
