"""The one-call GPU run: its archive, the import that refuses what it must, and the wheels."""
from __future__ import annotations

from kernels.trace import reader
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

from tests.helpers import ROOT
from tests.gpu_trace import fixture_archive, forward_trace
from tools import gpu_plan, gpu_run

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

def device_run(*args, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / ".ci" / "device-run"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole dry run, as a lease would run it in two calls: every chapter and then the bench.

    The first call stops after the chapters phase; the second resumes its archive and runs only
    the bench. Each must finish within its limits (the plan's dry-run limits, this CPU's).
    """
    folder = tmp_path_factory.mktemp("dry")
    limits = sum(gpu_run.plan_limits(gpu_run.PLAN, dry_run=True)[0].values()) + 120
    first = device_run("--dry-run", "--stop-after", "chapters", folder / "first", timeout=limits)
    second = device_run("--dry-run", "--resume", folder / "first" / gpu_run.ARCHIVE_NAME, folder / "out",
                        timeout=limits)
    return folder / "out", second, folder / "first", first


@pytest.mark.slow
@pytest.mark.book  # the dry run executes every chapter: `make test-book`
def test_dry_run_first_call_runs_every_chapter_within_its_limits(dry_run):
    _, _, first_out, first = dry_run
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    manifest, members = gpu_run.read_archive(first_out / gpu_run.ARCHIVE_NAME)
    status = {p["name"]: p["status"] for p in manifest["phases"]}
    assert status == {"environment": "ok", "gpu-tests": "dry run", "chapters": "dry run", "bench": "not run"}, status
    rows = json.loads(members["chapters.json"])
    assert [r["notebook"] for r in rows] == [f"book/{c}.ipynb" for c in gpu_run.CHAPTERS]
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    limits = gpu_run.plan_limits(gpu_run.PLAN, dry_run=True)[0]
    for p in manifest["phases"]:
        assert p["seconds"] <= limits[p["name"]], f"{p['name']} took {p['seconds']} s, over its {limits[p['name']]} s"
    assert "lacks the bench phase (not run)" in first.stdout


@pytest.mark.slow
@pytest.mark.book
def test_dry_run_writes_exactly_one_archive_and_a_summary(dry_run):
    out, done, _, _ = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [gpu_run.ARCHIVE_NAME, gpu_run.SUMMARY_NAME], \
        "a GPU run leaves exactly the archive and the summary (the device tool brings back 8 files at most)"
    assert (out / gpu_run.ARCHIVE_NAME).stat().st_size <= gpu_run.ARCHIVE_BUDGET
    summary = (out / gpu_run.SUMMARY_NAME).read_text()
    assert "DRY RUN" in summary and summary == done.stdout, "the summary holds what the run printed"


@pytest.mark.slow
@pytest.mark.book
def test_the_resumed_call_runs_only_the_bench_and_packs_both(dry_run):
    out, done, _, _ = dry_run
    manifest, members = gpu_run.read_archive(out / gpu_run.ARCHIVE_NAME)
    assert manifest["format"] == gpu_run.FORMAT and manifest["version"] == gpu_run.VERSION
    assert manifest["dry_run"] is True and manifest["device"] == "CPU (dry run)"
    assert [p["name"] for p in manifest["phases"]] == list(gpu_run.LIMITS)
    assert all(p["status"] in ("ok", "dry run") for p in manifest["phases"]), manifest["phases"]
    assert [c["ran"] for c in manifest["calls"]] == [["environment", "gpu-tests", "chapters"], ["environment", "bench"]]
    assert "chapter 01_naive" not in done.stdout, "the second call executes no chapter"
    traces = {p.split("/")[1] for p in members if p.startswith("traces/")}
    assert {"01_naive", "02_inplace", "03_sdpa"} <= traces, "the first call's traces are in the merged archive"
    assert {"environment.json", "bench.json", "chapters.json", "traces/01_naive/naive.json.gz"} <= set(members)
    env = manifest["environment"]
    assert {"torch", "triton", "python", "commit", "date"} <= set(env) and env["commit"] != "unknown"
    bench = json.loads(members["bench.json"])
    assert sorted(r["impl"] for r in bench["results"]) == ["naive", "sdpa_flash"], "one process per impl, merged"
    trace = reader.Trace(json.loads(gzip.decompress(members["traces/01_naive/naive.json.gz"])))
    assert trace.labels() == ["naive"] and len(trace.steps("naive")) == 2, "the trace keeps its labelled steps"
    assert gpu_run.lacking(manifest, members) == ""
    # Only its dry-run flag keeps the merged archive from importing: every phase is done and every
    # file is listed with its hash (read_archive above checked them).
    real = {**manifest, "dry_run": False, "environment": {**manifest["environment"], "gpu": "a stand-in"},
            "phases": [{**p, "status": "ok" if p["status"] == "dry run" else p["status"]} for p in manifest["phases"]]}
    gpu_run.check_importable(real)


@pytest.mark.slow
@pytest.mark.book
def test_import_refuses_a_dry_run(dry_run, tmp_path):
    out, _, _, _ = dry_run
    with pytest.raises(gpu_run.Refused, match="dry run"):
        gpu_run.import_archive(out / gpu_run.ARCHIVE_NAME, tmp_path / "data")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_run.py"), "import",
                           str(out / gpu_run.ARCHIVE_NAME), "--data", str(tmp_path / "data")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is a dry run" in done.stderr
    assert not (tmp_path / "data").exists(), "a refused import writes nothing"


# ------------------------------------------------------------------------- plan and resume

def test_the_plan_is_computed_from_the_current_spaces_and_chapters():
    plan = gpu_plan.load()
    assert plan["computed"] == gpu_plan.compute(plan), "tools/gpu_plan.json is stale: python tools/gpu_plan.py --write"
    assert list(plan["computed"]["chapters"]) == list(gpu_run.CHAPTERS)


def test_the_plan_prunes_by_the_gpu_images_triton_not_the_installed_one(monkeypatch):
    # Compatibility matrix, newest stack: Triton 3.9's table spills configs the GPU image's 3.6
    # holds, and the plan (the GPU image's compiles) must not change with the Triton here.
    import kernels.triton.tiles as tiles

    plan = gpu_plan.load()
    monkeypatch.setattr(tiles, "SPILLS", tiles.spilling_configs("3.9.0"))
    assert gpu_plan.compute(plan) == plan["computed"], "the plan follows the Triton installed here"


def test_every_device_call_of_the_plan_fits_its_budget():
    calls = gpu_plan.load()["computed"]["calls"]
    assert calls[0]["budget_s"] <= gpu_run.TOTAL_SECONDS <= 8 * 60, "one command, two of its ten minutes to spare"
    for call in calls:
        assert call["expected_s"] <= call["budget_s"], call
    done = [piece for call in calls for piece in call["does"] if piece != "environment"]
    assert done == ["gpu-tests", *gpu_run.CHAPTERS, "bench"], "the calls together do everything once, in order"


def test_the_run_takes_its_limits_from_the_plan():
    computed = gpu_plan.load()["computed"]
    assert gpu_run.LIMITS == {p: computed["phases"][p]["limit_s"] for p in gpu_run.PHASES}
    margin = gpu_plan.load()["margin"]
    for name, row in computed["chapters"].items():
        assert row["limit_s"] >= row["expected_s"] * margin and gpu_run.CHAPTER_LIMITS[name] == row["limit_s"]


def test_compiles_are_counted_per_specialization_and_config():
    plan, target = gpu_plan.load(), gpu_plan.load()["target"]
    params = gpu_plan.cuda_parameters()
    use = {"kernels": ["fwd_tma"], "causal": True, "sq": "seq", "sk": "seq"}
    compiled: set = set()
    first = gpu_plan.triton_work([use], params, target, compiled)
    kept = gpu_plan.kept_configs("fwd_tma", use, params, target)
    assert first == {"triton_compiles": len(kept), "triton_timed_configs": len(kept)} and len(kept) > 1
    longer = {**use, "sq": "2 * seq", "sk": "2 * seq"}   # a new autotune key, the same specialization
    assert gpu_plan.triton_work([longer], params, target, compiled)["triton_compiles"] == 0
    decode = {**use, "sq": 1}                           # SQ = 1 is its own specialization
    assert gpu_plan.triton_work([decode], params, target, compiled)["triton_compiles"] >= 1


def test_a_partial_archive_imports_and_says_what_it_lacks(tmp_path):
    phases = [{"name": "environment", "status": "ok", "seconds": 9.0, "detail": ""},
              {"name": "gpu-tests", "status": "ok", "seconds": 90.0, "detail": "12 passed"},
              {"name": "chapters", "status": "partial", "seconds": 200.0,
               "detail": "4 of 5 chapters ok; book/02_inplace.ipynb: not run: left for a later call"},
              {"name": "bench", "status": "not run", "seconds": 0.0, "detail": "left for a later call"}]
    archive = fixture_archive(tmp_path, phases=phases)
    gpu_run.import_archive(archive, tmp_path / "data")
    meta = json.loads((tmp_path / "data" / "recorded" / "nvidia-a100-sxm4-80gb" / "meta.json").read_text())
    assert "the bench phase (not run)" in meta["lacks"]
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_run.py"), "import", str(archive),
                           "--data", str(tmp_path / "data2")], capture_output=True, text=True)
    assert done.returncode == 0 and "partial:" in done.stdout and "bench" in done.stdout, done.stdout + done.stderr


def test_a_timed_out_gpu_tests_phase_still_needs_accepting(tmp_path):
    phases = [{"name": n, "status": "timed out" if n == "gpu-tests" else "ok", "seconds": 1.0, "detail": ""}
              for n in gpu_run.LIMITS]
    with pytest.raises(gpu_run.Refused, match="gpu-tests timed out"):
        gpu_run.import_archive(fixture_archive(tmp_path, phases=phases), tmp_path / "data")


def test_lacking_names_the_chapters_not_ok():
    manifest = {"phases": [{"name": "chapters", "status": "timed out", "detail": ""},
                           {"name": "bench", "status": "ok", "detail": ""}]}
    rows = [{"notebook": "book/01_naive.ipynb", "status": "ok"}, {"notebook": "book/07_compiled.ipynb", "status": "timed out"}]
    assert gpu_run.lacking(manifest, {"chapters.json": json.dumps(rows).encode()}) == "chapters 07_compiled"


def test_a_resume_on_another_gpu_or_commit_is_refused():
    prior = {"environment": {"gpu": "NVIDIA H200", "commit": "abc", "torch": "2.11.0", "triton": "3.6.0"}}
    assert gpu_run.same_machine(prior, dict(prior["environment"])) is None
    assert "GPU" in gpu_run.same_machine(prior, {**prior["environment"], "gpu": "NVIDIA H100"})
    assert "commit" in gpu_run.same_machine(prior, {**prior["environment"], "commit": "def"})


def test_a_chapter_may_use_what_earlier_ones_left_but_not_what_later_ones_need():
    run = gpu_run.Run(out=Path("."), work=Path("."), python="python", dry_run=False, deadline=0.0,
                      log=io.StringIO(), chapter_limits={"a": 30, "b": 30, "c": 30})
    now = __import__("time").monotonic()
    margin = gpu_run.PLAN["margin"]
    # 200 s left: "a" may take all but what b and c are expected to need
    assert gpu_run.chapter_limit(run, "a", ["b", "c"], now + 200) == pytest.approx(200 - 60 / margin, abs=1)
    # 40 s left: "a" keeps its own limit (capped by what is left), later ones get what remains
    assert gpu_run.chapter_limit(run, "a", ["b", "c"], now + 40) == pytest.approx(30, abs=1)


def test_stop_after_names_a_phase_or_a_chapter(tmp_path):
    with pytest.raises(SystemExit, match="--stop-after takes a phase"):
        gpu_run.run_all(tmp_path, True, list(gpu_run.CHAPTERS), [], sys.executable, stop_after="nonsense")


def test_the_carried_cache_is_judged_by_its_stamp(tmp_path, monkeypatch):
    stamp = {"triton": "3.6.0", "triton_key": "k", "ptxas_sm90": "V12.8", "capability": [9, 0], "entries": 3}
    (tmp_path / "attention-profiled.json").write_text(json.dumps(stamp))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    env = {"triton": "3.6.0", "triton_key": "k", "ptxas_sm90": "V12.8", "capability": [9, 0]}
    assert "can be hits" in gpu_run.carried_cache_verdict(env)
    assert "expect no hits" in gpu_run.carried_cache_verdict({**env, "triton_key": "other"})
    assert "expect no hits" in gpu_run.carried_cache_verdict({**env, "capability": [8, 0]})


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
    before, after = reader.Trace(raw).steps("naive"), reader.Trace(trimmed).steps("naive")
    assert [len(s.gpu_work) for s in after] == [len(s.gpu_work) for s in before] == [6, 6]
    assert [len(s.ops) for s in after] == [len(s.ops) for s in before]
    kept = [e.get("name") for e in trimmed["traceEvents"]]
    assert kept.count("cudaDeviceSynchronize") == 2 and kept.count("Activity Buffer Request") == 1, \
        "a recorded step's synchronize and the profiler's buffer request stay, though outside the label"


def test_the_gpu_run_executes_every_chapter_of_the_toc_in_order():
    from tools.book import layout

    chapters = [p.stem for p in layout.notebooks(ROOT) if p.parent == Path("book")]
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
