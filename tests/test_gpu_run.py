"""The one-call GPU run: its archive, the import that refuses what it must, and the wheels."""
from __future__ import annotations

import gzip
import io
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kernels import profiling
from tests.helpers import ROOT
from tests.gpu_trace import fixture_archive, forward_trace
from tools import gpu_run

BOOK_STACK = ("nbformat", "papermill", "jupyter_book", "nbclient")


def tree_digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def collect_gpu_tests(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_gpu_tests_collect_without_the_book_stack(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for name in BOOK_STACK:  # importing any of these now raises, as on the GPU image
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not installed on the GPU image')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), str(ROOT)])}
    without = collect_gpu_tests(env)
    assert without.returncode == 0, f"GPU tests must collect without {BOOK_STACK}:\n{without.stdout[-3000:]}"
    with_stack = collect_gpu_tests({**os.environ, "PYTHONPATH": str(ROOT)})
    count = lambda out: [l for l in out.splitlines() if "::" in l]
    assert count(without.stdout) == count(with_stack.stdout) and count(without.stdout), \
        "every GPU test is collected without the book stack, the same tests as with it"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message given without a GPU")
def test_a_real_run_without_a_gpu_says_what_it_needs(tmp_path):
    done = subprocess.run(["bash", str(ROOT / ".ci" / "device-run"), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout
    assert "needs a CUDA GPU" in done.stdout and "--dry-run" in done.stdout
    assert not (tmp_path / "out" / gpu_run.ARCHIVE_NAME).exists(), "no archive without a GPU"


# ------------------------------------------------------------------------------- the dry run

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dry") / "out"
    done = subprocess.run(["bash", str(ROOT / ".ci" / "device-run"), "--dry-run", str(out),
                           "--chapters", "01_naive", "--set", "seq=64", "active_steps=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    return out, done


@pytest.mark.slow
@pytest.mark.book  # the dry run executes a chapter: `make test-book`
def test_dry_run_writes_exactly_one_archive_and_a_summary(dry_run):
    out, done = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [gpu_run.ARCHIVE_NAME, gpu_run.SUMMARY_NAME], \
        "a GPU run leaves exactly the archive and the summary (the device tool brings back 8 files at most)"
    assert (out / gpu_run.ARCHIVE_NAME).stat().st_size <= gpu_run.ARCHIVE_BUDGET
    summary = (out / gpu_run.SUMMARY_NAME).read_text()
    assert "DRY RUN" in summary and summary == done.stdout, "the summary holds what the run printed"


@pytest.mark.slow
@pytest.mark.book  # the dry run executes a chapter: `make test-book`
def test_dry_run_manifest_lists_every_file_with_its_hash(dry_run):
    out, _ = dry_run
    manifest, members = gpu_run.read_archive(out / gpu_run.ARCHIVE_NAME)
    assert manifest["format"] == gpu_run.FORMAT and manifest["version"] == gpu_run.VERSION
    assert manifest["dry_run"] is True and manifest["device"] == "CPU (dry run)"
    assert [p["name"] for p in manifest["phases"]] == list(gpu_run.LIMITS)
    assert all(p["status"] in ("ok", "dry run") for p in manifest["phases"]), manifest["phases"]
    assert {"environment.json", "bench.json", "chapters.json", "traces/01_naive/naive.json.gz"} <= set(members)
    env = manifest["environment"]
    assert {"torch", "triton", "python", "commit", "date"} <= set(env) and env["commit"] != "unknown"
    bench = json.loads(members["bench.json"])
    assert sorted(r["impl"] for r in bench["results"]) == ["naive", "sdpa_flash"], "one process per impl, merged"
    trace = profiling.Trace(json.loads(gzip.decompress(members["traces/01_naive/naive.json.gz"])))
    assert trace.labels() == ["naive"] and len(trace.steps("naive")) == 1, "the trace keeps its labelled step"


@pytest.mark.slow
@pytest.mark.book  # the dry run executes a chapter: `make test-book`
def test_import_refuses_a_dry_run(dry_run, tmp_path):
    out, _ = dry_run
    with pytest.raises(gpu_run.Refused, match="dry run"):
        gpu_run.import_archive(out / gpu_run.ARCHIVE_NAME, tmp_path / "data")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_run.py"), "import",
                           str(out / gpu_run.ARCHIVE_NAME), "--data", str(tmp_path / "data")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is a dry run" in done.stderr
    assert not (tmp_path / "data").exists(), "a refused import writes nothing"


# ------------------------------------------------------------------------------- the import

def test_a_real_archive_imports_into_recorded_and_bench(tmp_path):
    written = gpu_run.import_archive(fixture_archive(tmp_path), tmp_path / "data")
    folder = tmp_path / "data" / "recorded" / "nvidia-a100-sxm4-80gb"
    assert folder / "01_naive" / "naive.json.gz" in written and folder / "meta.json" in written
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["gpu"] == "NVIDIA A100-SXM4-80GB" and meta["capability"] == [8, 0]
    assert meta["commit"] == "0123456789abcdef" and meta["date"] == "2026-11-30 04:00 UTC"
    bench = json.loads((tmp_path / "data" / "bench" / "nvidia-a100-sxm4-80gb.json").read_text())
    assert bench["meta"]["recorded"]["gpu"] == "NVIDIA A100-SXM4-80GB"


def test_importing_the_same_run_twice_changes_nothing(tmp_path):
    archive = fixture_archive(tmp_path)
    gpu_run.import_archive(archive, tmp_path / "data")
    first = tree_digest(tmp_path / "data")
    gpu_run.import_archive(archive, tmp_path / "data")
    assert tree_digest(tmp_path / "data") == first


def rewrite(archive: Path, change) -> Path:
    """The archive with ``change(members)`` applied to its {name: bytes}, manifest included."""
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    change(members)
    out = archive.with_name("changed.tar.gz")
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def edit_manifest(**fields):
    def change(members):
        members["manifest.json"] = json.dumps({**json.loads(members["manifest.json"]), **fields}).encode()
    return change


@pytest.mark.parametrize("change, reason", [
    (lambda m: m.__setitem__("bench.json", b'{"altered": true}'), "altered since the run"),
    (lambda m: m.pop("traces/01_naive/naive.json.gz"), "lacks files its manifest lists"),
    (lambda m: m.__setitem__("extra.txt", b"?"), "does not list: extra.txt"),
    (edit_manifest(version=99), "version 99"),
    (edit_manifest(format="something-else"), "not a attention-profiled/gpu-run manifest"),
    (lambda m: m.pop("manifest.json"), "no manifest.json"),
], ids=["altered", "missing", "unlisted", "version", "format", "no-manifest"])
def test_import_refuses_an_archive_it_cannot_trust(tmp_path, change, reason):
    with pytest.raises(gpu_run.Refused, match=reason):
        gpu_run.import_archive(rewrite(fixture_archive(tmp_path), change), tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_import_refuses_a_failed_phase_unless_accepted(tmp_path):
    phases = [{"name": n, "status": "failed" if n == "gpu-tests" else "ok", "seconds": 1.0, "detail": "2 failed"}
              for n in gpu_run.LIMITS]
    archive = fixture_archive(tmp_path, phases=phases)
    with pytest.raises(gpu_run.Refused, match="gpu-tests failed"):
        gpu_run.import_archive(archive, tmp_path / "data")
    gpu_run.import_archive(archive, tmp_path / "data", accept_failed=("gpu-tests",))
    meta = json.loads((tmp_path / "data" / "recorded" / "nvidia-a100-sxm4-80gb" / "meta.json").read_text())
    assert meta["accepted_failed"] == ["gpu-tests"], "an accepted failure stays visible in the recording"


def test_a_dry_run_flag_alone_is_refused(tmp_path):
    with pytest.raises(gpu_run.Refused, match="dry run"):
        gpu_run.import_archive(fixture_archive(tmp_path, dry_run=True), tmp_path / "data")


# ------------------------------------------------------------------------ archive mechanics

def test_trim_keeps_the_labelled_steps_and_their_gpu_work():
    raw = forward_trace("naive", steps=2)
    stray = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 4242, "tid": 4242, "ts": 10.0, "dur": 1.0},
             {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242, "ts": 12.0,
              "dur": 1.0, "args": {"correlation": 1}},
             {"ph": "X", "cat": "kernel", "name": "warmup_kernel", "pid": 0, "tid": 7, "ts": 14.0, "dur": 1.0,
              "args": {"correlation": 1}}]
    raw["traceEvents"] = stray + raw["traceEvents"]
    trimmed = gpu_run.trim_trace(raw)
    names = {e.get("name") for e in trimmed["traceEvents"]}
    assert "warmup_kernel" not in names and "aten::empty" not in names, "work outside the labels goes"
    before, after = profiling.Trace(raw).steps("naive"), profiling.Trace(trimmed).steps("naive")
    assert [len(s.kernels) for s in after] == [len(s.kernels) for s in before] == [6, 6]
    assert [len(s.ops) for s in after] == [len(s.ops) for s in before]
    kept = [e.get("name") for e in trimmed["traceEvents"]]
    assert kept.count("cudaDeviceSynchronize") == 2 and kept.count("Activity Buffer Request") == 1, \
        "a recorded step's synchronize and the profiler's buffer request stay, though outside the label"


def test_the_gpu_run_executes_every_chapter_of_the_toc_in_order():
    from kernels import execute

    chapters = [p.stem for p in execute.notebooks(ROOT) if p.parent == Path("book")]
    assert list(gpu_run.CHAPTERS) == chapters, "tools/gpu_run.py CHAPTERS must follow _toc.yml's chapters"


def test_pack_drops_notebooks_first_to_fit_the_budget(tmp_path):
    work = tmp_path / "work"
    (work / "notebooks").mkdir(parents=True)
    (work / "notebooks" / "big.ipynb").write_bytes(os.urandom(300_000))
    (work / "bench.json").write_text("{}")
    manifest = gpu_run.pack(work, tmp_path / "a.tar.gz", {"format": gpu_run.FORMAT}, budget=100_000)
    assert manifest["dropped"] == ["notebooks/big.ipynb"] and [f["path"] for f in manifest["files"]] == ["bench.json"]
    assert (tmp_path / "a.tar.gz").stat().st_size <= 100_000


def test_wheels_keep_one_version_of_what_the_image_lacks(tmp_path, monkeypatch):
    def fake_download(cmd, check):
        dest = Path(cmd[cmd.index("--dest") + 1])
        for name in ("papermill-2.7.0-py3-none-any.whl", "numpy-2.3.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                     "nbformat-5.10.0-py3-none-any.whl", "nbformat-5.11.1-py3-none-any.whl"):
            (dest / name).write_bytes(b"x" * 1000)
    monkeypatch.setattr(gpu_run.subprocess, "run", fake_download)
    kept = gpu_run.wheels(tmp_path)
    assert sorted(w.name for w in kept) == ["nbformat-5.11.1-py3-none-any.whl", "papermill-2.7.0-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(w.name for w in kept)
    with pytest.raises(SystemExit, match="over the 0 MiB"):
        gpu_run.wheels(tmp_path, budget=100)


def test_the_wheel_target_is_the_gpu_image():
    cmd = " ".join(gpu_run.WHEEL_TARGET)
    assert "--python-version 3.12" in cmd and "--abi cp312" in cmd and "x86_64" in cmd
    assert set(gpu_run.BOOK_STACK) <= {w.replace("-", "_") for w in gpu_run.GPU_WHEELS}
