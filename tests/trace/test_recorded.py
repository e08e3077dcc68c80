"""Recordings of GPU runs: found wherever the library is, read as steps, asserted by the chapters."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from kernels import recorded
from tests.helpers import ROOT
from tests.gpu_trace import NAIVE_A100, fixture_archive
from tools import gpu_run

GPU = "nvidia-a100-sxm4-80gb"


@pytest.fixture
def recording(tmp_path):
    """A fixture GPU run imported the way `make gpu-import` does; returns its recordings root."""
    gpu_run.import_archive(fixture_archive(tmp_path), tmp_path / "data")
    return tmp_path / "data" / "recorded"


def test_the_import_is_what_the_loader_reads(recording):
    rec = recorded.latest(recording)
    assert rec.folder.name == GPU and rec.capability == (8, 0)
    assert rec.label.startswith("recorded on NVIDIA A100-SXM4-80GB on 2026-11-30 04:00 UTC")
    assert "commit 0123456789" in rec.label, "a recording is labelled with its commit"


def test_gpu_steps_on_a_cpu_come_from_the_recording(recording):
    steps, source, capability = recorded.gpu_steps("cpu", {}, "03b_sdpa_fused", ["sdpa_flash", "sdpa_cudnn", "no_such"],
                                                   root=recording)
    assert sorted(steps) == ["sdpa_cudnn", "sdpa_flash"], "variants the recording lacks are left out"
    assert source.startswith("recorded on NVIDIA A100") and capability == (8, 0)
    assert steps["sdpa_cudnn"].gpu_work.iloc[0]["launcher"] == "cuLaunchKernelEx"


def test_no_recording_says_so(tmp_path):
    assert recorded.latest(tmp_path) is None and recorded.recordings(tmp_path) == []
    steps, source, capability = recorded.gpu_steps("cpu", {}, "01_naive", ["naive"], root=tmp_path)
    assert steps == {} and source == recorded.NO_RECORDING and capability is None


def test_a_recording_without_the_chapter_names_what_it_has(recording):
    steps, source, _ = recorded.gpu_steps("cpu", {}, "04_triton", ["triton"], root=recording)
    assert steps == {} and "has no trace of triton from 04_triton" in source
    with pytest.raises(FileNotFoundError, match="01_naive/naive.json.gz"):
        recorded.latest(recording).trace("04_triton", "triton")


def test_the_environment_variable_names_the_root(recording, monkeypatch):
    monkeypatch.setenv(recorded.ENV_VAR, str(recording))
    assert recorded.default_root() == recording and recorded.latest().folder.name == GPU


def test_a_checkout_reads_book_data_recorded(monkeypatch):
    monkeypatch.delenv(recorded.ENV_VAR, raising=False)
    assert recorded.default_root() == ROOT / "book" / "data" / "recorded"


@pytest.mark.slow
def test_an_installed_wheel_finds_recordings_outside_the_checkout(tmp_path):
    """The wheel carries book/data as kernels/data; a reader's pip or Colab install reads it."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "kernels", src / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", src)
    shutil.copy2(ROOT / "README.md", src)
    shutil.copy2(ROOT / "LICENSE", src)
    gpu_run.import_archive(fixture_archive(tmp_path), src / "book" / "data")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                           "-w", str(tmp_path / "dist")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    wheel = next((tmp_path / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names), "the wheel carries the licence"
    probe = ("import kernels.recorded as r; rec = r.latest(); "
             "print(r.default_root()); print(rec.folder.name); print(len(rec.trace('01_naive', 'naive').steps('naive')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    root, name, steps = done.stdout.splitlines()[-3:]
    assert root == str(tmp_path / "site" / "kernels" / "data" / "recorded") and name == GPU and steps == "2"


def printed(notebook) -> str:
    """Everything a notebook's code cells printed or said (kernels.notebook.say displays a lesson
    as HTML with the sentence itself as its plain-text view)."""
    cells = json.loads(notebook.read_text())["cells"]

    def text(output) -> str:
        said = output.get("data", {}).get("text/plain", "") if output.get("output_type") == "display_data" else ""
        return "".join(output.get("text", "")) + "".join(said) + "\n"

    return "".join(text(o) for c in cells if c["cell_type"] == "code" for o in c["outputs"])


def execute_with_recording(tmp_path, only):
    from tools.book import execute

    return execute.run("cpu", only=only, out=tmp_path / "executed", root=ROOT, progress=False,
                       overrides={"seq": 128, "active_steps": 2})


@pytest.mark.slow
@pytest.mark.book  # executes chapters: `make test-book`
def test_chapters_assert_their_gpu_claims_on_a_recording(recording, tmp_path, monkeypatch):
    monkeypatch.setenv(recorded.ENV_VAR, str(recording))
    chapters = ["book/00_profiler_primer", "book/01_naive", "book/02_inplace", "book/03_sdpa", "book/03b_sdpa_fused"]
    report = execute_with_recording(tmp_path, chapters)
    assert [r["status"] for r in report["notebooks"]] == ["ok"] * len(chapters), report["notebooks"]
    text = {r["notebook"]: printed(tmp_path / "executed" / r["notebook"]) for r in report["notebooks"]}
    expected = {
        "book/00_profiler_primer.ipynb": ["each kernel on the GPU track has its launch call on the CPU thread's track",
                                          "the recorded step ends with a cudaDeviceSynchronize after the label",
                                          "every occupancy query (if cuBLAS made one) sits inside aten::mm, before the GEMM's launch"],
        "book/01_naive.ipynb": ["the naive forward runs six GPU activities", "exactly one of them is a copy"],
        "book/02_inplace.ipynb": ["the GPU track goes from 6 activities to 5, as on the article's A100, and the one that "
                                  "went is the copy"],
        "book/03_sdpa.ipynb": ["the math backend launches more GPU kernels per forward",
                               "on the GPU track the mask shows up as a triu_tril kernel",
                               "no GEMM of the math backend runs in 16 bits on the GPU track"],
        "book/03b_sdpa_fused.ipynb": ["sdpa_flash launches exactly one kernel per forward",
                                      "sdpa_cudnn launches exactly one kernel per forward",
                                      "the trace's occupancy is Kineto's estimate",
                                      "sdpa_cudnn: the trace reads 0% exactly when the kernel uses more than 48 KiB",
                                      "cuDNN does not launch through cudaLaunchKernel"],
    }
    for notebook, claims in expected.items():
        for claim in claims:
            assert f"\u2714 {claim}" in text[notebook], f"{notebook} asserts on the recording: {claim!r}"
        assert "recorded on NVIDIA A100-SXM4-80GB" in text[notebook], f"{notebook} labels the recording"


@pytest.mark.slow
@pytest.mark.book  # executes chapters: `make test-book`
def test_a_recording_that_disagrees_fails_the_chapter(tmp_path, monkeypatch):
    wrong = {"02_inplace": {"inplace": NAIVE_A100}}  # an "in-place" recording that still copies
    gpu_run.import_archive(fixture_archive(tmp_path, variants=wrong), tmp_path / "data")
    monkeypatch.setenv(recorded.ENV_VAR, str(tmp_path / "data" / "recorded"))
    report = execute_with_recording(tmp_path, ["book/02_inplace"])
    row = report["notebooks"][0]
    assert row["status"] == "failed" and "6 activities to 5" in row["error"], row
