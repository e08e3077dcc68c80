"""The GPU run's packing and import, through its dry run on a CPU (make gpu-run needs a GPU)."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time

import pytest
import torch

from kernels import recorded
from kernels.bench.results import load_results
from tests.helpers import ROOT
from tools import gpu_run

SCRIPT = [sys.executable, str(ROOT / "tools" / "gpu_run.py")]
BUDGET = 120
DRY = "cpu-dry-run"


@pytest.fixture(scope="module")
def dry_archive(tmp_path_factory):
    """One dry run for the module: tiny stand-ins through the real phases' runner and packing."""
    out = tmp_path_factory.mktemp("gpu-run")
    started = time.monotonic()
    done = subprocess.run([*SCRIPT, "run", str(out), "--dry-run", "--budget", str(BUDGET)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < BUDGET, f"the dry run took longer than its {BUDGET} s budget"
    return out / gpu_run.ARCHIVE_NAME


def members(archive) -> dict:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_run_without_a_gpu_says_no_gpu_visible(tmp_path):
    done = subprocess.run([*SCRIPT, "run", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no GPU visible" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / gpu_run.ARCHIVE_NAME).exists()


def test_the_dry_run_packs_a_manifest_and_what_its_phases_wrote(dry_archive):
    files = members(dry_archive)
    manifest = json.loads(files["manifest.json"])
    assert manifest["format"] == gpu_run.FORMAT and manifest["dry_run"] is True and manifest["gpu"] is None
    assert manifest["torch"] == torch.__version__ and manifest["date"] and manifest["commit"]
    assert [(p["name"], p["status"]) for p in manifest["phases"]] == [
        ("gpu-tests", "skipped"), ("bench-core", "ok"), ("chapter dry_run", "ok")], manifest["phases"]
    assert manifest["budget_s"] == BUDGET and manifest["left_out"] == [], "the budget and what it left out"
    assert {"traces/dry_run/naive.json.gz", "bench.json", "logs/chapter-dry_run.log", "logs/bench-core.log"} <= set(files)
    assert sorted(manifest["files"]) == sorted(set(files) - {"manifest.json"}), "the manifest lists every file"


def test_the_dry_archive_imports_into_a_scratch_folder_in_the_recorded_format(dry_archive, tmp_path):
    written, missing = gpu_run.import_archive(dry_archive, tmp_path)
    assert missing == [] and tmp_path / "bench" / f"{DRY}.json" in written
    rec = recorded.latest(tmp_path / "recorded")
    assert rec.folder.name == DRY and rec.meta["dry_run"] is True
    assert len(rec.trace("dry_run", "naive").steps("naive")) == 1, "the stand-in profiled one active step"
    bench = load_results(tmp_path / "bench" / f"{DRY}.json")
    assert len(bench) == 1 and bench.meta["recorded"]["commit"] == rec.meta["commit"]


def test_a_dry_archive_never_lands_in_book_data(dry_archive):
    before = sorted(p for p in gpu_run.DATA.rglob("*"))
    with pytest.raises(gpu_run.Refused, match="dry run"):
        gpu_run.import_archive(dry_archive)
    assert sorted(p for p in gpu_run.DATA.rglob("*")) == before


def test_a_partial_archive_imports_what_it_holds_and_names_what_it_lacks(dry_archive, tmp_path):
    files = members(dry_archive)
    manifest = json.loads(files.pop("manifest.json"))
    manifest["phases"][1].update(status="timed out", detail="killed after 150 s")
    files.pop("bench.json")
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / "work" / name
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_bytes(data)
    gpu_run.pack(tmp_path / "partial.tar.gz", manifest, paths)
    done = subprocess.run([*SCRIPT, "import", str(tmp_path / "partial.tar.gz"), "--data", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "data" / "recorded" / DRY / "dry_run" / "naive.json.gz").exists()
    assert not (tmp_path / "data" / "bench").exists()
    assert "partial" in done.stdout and "bench-core (timed out: killed after 150 s)" in done.stdout, done.stdout
    assert "the benchmark (no bench.json)" in done.stdout


def test_a_phase_past_its_limit_is_killed_and_recorded_as_timed_out(tmp_path):
    phase = gpu_run.run_phase("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 1, tmp_path / "slow.log")
    assert phase["status"] == "timed out" and phase["seconds"] < 30, phase
    failed = gpu_run.run_phase("bad", [sys.executable, "-c", "raise SystemExit(3)"], 30, tmp_path / "bad.log")
    assert (failed["status"], failed["detail"]) == ("failed", "exit 3; see logs/bad.log")


def test_what_is_no_gpu_run_archive_is_refused_in_words(tmp_path):
    (tmp_path / "junk.tar.gz").write_text("not an archive")
    with pytest.raises(gpu_run.Refused, match="not a readable .tar.gz"):
        gpu_run.import_archive(tmp_path / "junk.tar.gz", tmp_path)
    gpu_run.pack(tmp_path / "other.tar.gz", {"format": "something else"}, {})
    with pytest.raises(gpu_run.Refused, match="this import reads .attention-profiled/gpu-run. version"):
        gpu_run.import_archive(tmp_path / "other.tar.gz", tmp_path)


def test_a_budget_too_small_for_any_phase_leaves_them_out_and_says_so(tmp_path):
    done = subprocess.run([*SCRIPT, "run", str(tmp_path), "--dry-run", "--budget", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, "a run that left phases out is not a complete run"
    manifest = json.loads(members(tmp_path / gpu_run.ARCHIVE_NAME)["manifest.json"])
    assert manifest["phases"] == [] and manifest["budget_s"] == 5
    assert manifest["left_out"] == list(gpu_run.phase_commands(sys.executable, tmp_path, dry_run=True)), manifest
    assert "left out for the budget" in done.stdout, done.stdout


def test_the_phases_run_in_order_of_value_with_every_chapter_on_the_cuda_preset(tmp_path):
    names = list(gpu_run.phase_commands(sys.executable, tmp_path, dry_run=False))
    assert names[:2] == ["gpu-tests", "bench-core"] and names[-2:] == ["bench", "html"], names
    assert names[2:-2] == [f"chapter {c}" for c in gpu_run.CHAPTERS]
    chapters = {p.stem for p in (ROOT / "book").glob("[0-9]*.ipynb")}
    assert set(gpu_run.CHAPTERS) == chapters - {"11_context_parallel"}, "every chapter but 11 (two ranks) has a phase"
