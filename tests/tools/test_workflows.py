"""The GitHub Actions workflows are code too: these tests hold them to the project's rules.

What they check, and why:

- Each workflow validates against GitHub's workflow schema (``check-jsonschema``), so a typo
  fails here rather than on GitHub after a push.
- ``zizmor --offline`` (a static security linter for workflows) reports nothing at its default
  severity. The only finding we silence is listed in ``DELIBERATE_IGNORES`` with its reason.
- The GPU workflow runs on our own machine, and the repository is public: a job on a
  self-hosted runner serves only push, schedule and manual dispatch. A pull request trigger
  would run a stranger's code on that machine.
- Least privilege: every workflow starts from no permissions; a job asks for what it needs, and
  only the Pages deployment may write. Every action is pinned to a commit SHA, checkout never
  leaves the token on disk, and no ``${{ }}`` expression is pasted into a shell script (values
  travel through ``env:``, where the shell cannot mistake them for code).
- Every job has a timeout, so a hung GPU kernel cannot hold a runner for the default six hours.

Both tools are test requirements; a missing one fails the test with the command to install it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.helpers import ROOT, console_script

WORKFLOW_DIR = ROOT / ".github" / "workflows"
DEPENDABOT = ROOT / ".github" / "dependabot.yml"
WORKFLOW_FILES = sorted(WORKFLOW_DIR.glob("*.yml")) + sorted(WORKFLOW_DIR.glob("*.yaml"))

# Triggers that never run code from a fork: the only ones a self-hosted runner may serve.
TRUSTED_TRIGGERS = {"push", "schedule", "workflow_dispatch"}

# (workflow file, job id) -> the write scopes that job may hold. Nothing else writes.
WRITE_ALLOWED = {("pages.yml", "deploy"): {"pages", "id-token"},
                 ("release.yml", "publish"): {"id-token"}}  # trusted publishing's OIDC token, nothing else

# (workflow file, zizmor audit) silenced inline with "# zizmor: ignore[...]", and why.
DELIBERATE_IGNORES = {
    ("pages.yml", "dangerous-triggers"): (
        "workflow_run from gpu.yml, which has no pull request triggers; the job accepts only "
        "successful runs on main of this repository and publishes, never executes, the artifact"
    ),
}

# A pinned reference: owner/repo[/path]@<40 hex digits> followed by "# v<version>".
PINNED_USES = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+)*\b")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def workflow(name: str) -> dict:
    return load(WORKFLOW_DIR / name)


def triggers(wf: dict) -> dict:
    """The ``on:`` block as a dict. PyYAML (YAML 1.1) reads the bare key ``on`` as True."""
    on = wf["on"] if "on" in wf else wf[True]
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on)


def steps(wf: dict):
    for job_id, job in wf["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def runs_on_labels(job: dict) -> list[str]:
    labels = job.get("runs-on", [])
    if isinstance(labels, dict):  # {group: ..., labels: ...}
        labels = labels.get("labels", [])
    return [labels] if isinstance(labels, str) else list(labels)


def run_commands(wf: dict) -> str:
    return "\n".join(step["run"] for _, step in steps(wf) if "run" in step)


def run_tool(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


# --- the files are there and well-formed --------------------------------------------------


def test_workflows_match_githubs_schema():
    result = run_tool(
        [console_script("check-jsonschema", "check-jsonschema"), "--builtin-schema", "vendor.github-workflows"]
        + [str(path) for path in WORKFLOW_FILES]
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dependabot_config_matches_its_schema():
    if not DEPENDABOT.exists():
        pytest.skip("no .github/dependabot.yml")  # optional file
    result = run_tool([console_script("check-jsonschema", "check-jsonschema"), "--builtin-schema", "vendor.dependabot", str(DEPENDABOT)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_finds_nothing():
    # Input .github (workflows and dependabot.yml), not the whole tree: a checkout without .git
    # would otherwise have zizmor walk .venv. --strict-collection: a file zizmor cannot parse is
    # an error, not a silent skip. zizmor exits 0 with no findings and 10 + severity with some.
    result = run_tool([console_script("zizmor", "zizmor"), "--offline", "--strict-collection", "--no-progress", ".github"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_ignores_are_the_deliberate_ones():
    found = set()
    for path in WORKFLOW_FILES:
        for audits in re.findall(r"zizmor:\s*ignore\[([^\]]*)\]", path.read_text(encoding="utf-8")):
            found |= {(path.name, audit.strip()) for audit in audits.split(",")}
    assert found <= set(DELIBERATE_IGNORES), f"undocumented zizmor ignores: {found - set(DELIBERATE_IGNORES)}"
    assert not (ROOT / "zizmor.yml").exists() and not (ROOT / ".github" / "zizmor.yml").exists(), (
        "a zizmor config can disable audits wholesale; record each exception in DELIBERATE_IGNORES"
    )


# --- the self-hosted GPU runner only ever runs our own code -------------------------------


def test_self_hosted_jobs_never_serve_untrusted_triggers():
    for path in WORKFLOW_FILES:
        wf = load(path)
        self_hosted = [job_id for job_id, job in wf["jobs"].items() if "self-hosted" in runs_on_labels(job)]
        if self_hosted:
            untrusted = set(triggers(wf)) - TRUSTED_TRIGGERS
            assert not untrusted, f"{path.name} runs {self_hosted} on our machine for {sorted(untrusted)}"


# --- least privilege and hygiene, every workflow -------------------------------------------


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_every_job_has_a_timeout(path):
    for job_id, job in load(path)["jobs"].items():
        minutes = job.get("timeout-minutes")
        assert isinstance(minutes, int) and 0 < minutes <= 120, f"{path.name}:{job_id} timeout-minutes={minutes!r}"


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_permissions_start_empty_and_only_pages_deploy_writes(path):
    wf = load(path)
    assert wf.get("permissions") == {}, f"{path.name}: set top-level 'permissions: {{}}'"
    for job_id, job in wf["jobs"].items():
        granted = job.get("permissions")
        assert isinstance(granted, dict), f"{path.name}:{job_id} must list its permissions"
        writes = {scope for scope, level in granted.items() if level == "write"}
        allowed = WRITE_ALLOWED.get((path.name, job_id), set())
        assert writes <= allowed, f"{path.name}:{job_id} may not write {sorted(writes - allowed)}"
        assert set(granted.values()) <= {"read", "write", "none"}, granted


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_actions_are_pinned_to_commit_shas(path):
    uses_in_yaml = [step["uses"] for _, step in steps(load(path)) if "uses" in step]
    unpinned = [ref for ref in uses_in_yaml if not ref.startswith("./") and not PINNED_USES.match(ref)]
    assert not unpinned, f"{path.name}: pin to a full commit SHA: {unpinned}"
    # The version comment is what Dependabot updates alongside the SHA and what a reader checks.
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert len(lines) == len(uses_in_yaml)
    uncommented = [line.strip() for line in lines if "@" in line and not VERSION_COMMENT.search(line)]
    assert not uncommented, f"{path.name}: add '# vX.Y.Z' after the SHA: {uncommented}"


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_checkout_does_not_keep_the_token(path):
    for job_id, step in steps(load(path)):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}:{job_id}"


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_no_expressions_inside_run_scripts(path):
    # ${{ }} is substituted into the script text before the shell parses it; pass values via env.
    for job_id, step in steps(load(path)):
        assert "${{" not in step.get("run", ""), f"{path.name}:{job_id} step {step.get('name')!r}"


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_has_a_concurrency_group(path):
    concurrency = load(path).get("concurrency")
    assert isinstance(concurrency, dict) and concurrency.get("group"), path.name


# --- each workflow does its job ------------------------------------------------------------


def python_versions(wf: dict) -> set[str]:
    return {
        str(step["with"]["python-version"])
        for _, step in steps(wf)
        if step.get("uses", "").startswith("actions/setup-python@")
    }


def test_ci_runs_the_compatibility_matrix_on_a_schedule_with_pip_constraints_cleared():
    """The next torch release is found by CI (README "Supported versions"): a scheduled matrix job
    runs make test on the oldest supported stack and the newest on the index, with no pip
    constraint file capping torch."""
    from kernels import compat

    ci = workflow("ci.yml")
    on = triggers(ci)
    assert on["schedule"] and all(set(entry) == {"cron"} for entry in on["schedule"]), on
    assert "workflow_dispatch" in on
    job = ci["jobs"]["compat"]
    assert "schedule" in job["if"] and "schedule" in ci["jobs"]["test-and-book"]["if"], \
        "the schedule runs the matrix, pushes and pull requests the usual tests"
    assert "make test" in run_commands({"jobs": {"compat": job}}).splitlines()
    assert job["env"]["PIP_CONSTRAINT"] == "/dev/null", "a constraint file could cap torch below the newest"
    cells = {cell["cell"]: cell for cell in job["strategy"]["matrix"]["include"]}
    assert (cells["oldest"]["torch"], cells["oldest"]["triton"]) == \
        (f"torch=={compat.TESTED['torch'][0]}.0", f"triton=={compat.TESTED['triton'][0]}.0")
    assert {cell["python"] for cell in cells.values()} == set(compat.TESTED["python"])
    assert (cells["newest"]["torch"], cells["newest"]["triton"]) == ("torch", "triton"), \
        "the newest cell takes whatever is newest on the index"
    assert python_versions({"jobs": {"compat": job}}) == {"${{ matrix.python }}"}
    # make setup installs the cell's stack only if the Makefile lets the environment's specs win.
    assert job["env"]["TORCH_SPEC"] == "${{ matrix.torch }}" and job["env"]["TRITON_SPEC"] == "${{ matrix.triton }}"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TORCH_SPEC \?=", makefile, re.M) and re.search(r"^TRITON_SPEC \?=", makefile, re.M)
