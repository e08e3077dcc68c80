"""The GPU run: the GPU tests, the benchmark and the book on the ``cuda`` preset, inside a time budget, in one archive.

    python tools/gpu_run.py run OUT [--budget S] [--dry-run]   # make gpu-run: OUT/gpu-run.tar.gz
    python tools/gpu_run.py import ARCHIVE [--data D]  # make gpu-import: book/data/recorded/, book/data/bench/

``run`` needs a CUDA GPU. Phases run in order of value (the GPU tests, the benchmark's core
points, the chapters one by one on the ``cuda`` preset, the full benchmark, the HTML), each in
its own process under a time limit, until ``--budget`` seconds are spent; the archive is
rewritten after each phase with what finished (the chapters' traces, the benchmark, every
phase's log) and a manifest naming the GPU, the versions, the commit, the date, the budget, how
each phase ended and which were left out. ``--dry-run``
goes through the same packing on a CPU with tiny stand-ins (no GPU tests, one small trace, a
one-point benchmark) and marks the archive as a dry run, which ``import`` writes only into a
folder other than book/data. ``import`` accepts a partial archive and says what it lacks.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "book" / "data"
FORMAT, VERSION = "attention-profiled/gpu-run", 2
ARCHIVE_NAME = "gpu-run.tar.gz"
# The budget a lent GPU machine allows (about 10 minutes a command, 15 in all): phases run in
# order of value until it is spent, each packed as it finishes. The A100 workflow passes a
# budget that covers every phase.
DEFAULT_BUDGET = 540
MIN_PHASE = 20   # seconds: a phase with less left than this is left out, not started to be killed
# The chapters on the cuda preset, most GPU-specific first: our kernels (4, 5), the showdown,
# then SDPA's backends, the CPU-story chapters, and the rest.
CHAPTERS = ("04_triton", "05_cuda", "06_showdown", "03b_sdpa_fused", "03_sdpa", "01_naive", "02_inplace",
            "00_profiler_primer", "07_compiled", "08_block", "09_backward", "10_decoding", "12_real_models")
# Seconds each phase may take at most (the budget may cut it shorter).
LIMITS = {"gpu-tests": 240, "bench-core": 150, "chapter": 240, "bench": 20 * 60, "html": 60 * 60}
TRACE = re.compile(r"^traces/[\w.-]+/[\w.-]+\.json\.gz$")             # traces/<notebook>/<variant>.json.gz
# The benchmark's core points: our Triton and CUDA kernels against SDPA's flash backend.
CORE_BENCH = "--impls triton cuda_v1 cuda_v2 sdpa_flash --seq 1024 4096 --head-dim 64 128 --no-memory".split()

# The dry run's book: one tiny profiled call, written where the runner puts a chapter's traces.
DRY_BOOK = ("import sys, torch; from kernels.trace.record import profile; from kernels.attention.naive import naive;"
            "q = torch.randn(1, 1, 8, 8); profile(naive, q, q, q, label='naive', trace_dir=sys.argv[1], active=1)")
DRY_BENCH = "--device cpu --impls naive --seq 16 --head-dim 8 --batch 1 --heads 1 --reps 5 --warmup 1 --no-memory".split()


class Refused(Exception):
    """An archive ``import`` will not write; the message says why."""


def phase_commands(python: str, work: Path, dry_run: bool) -> dict:
    """Each phase's command line (None: skipped), in order of value: what a short budget runs."""
    if dry_run:
        return {"gpu-tests": None,
                "bench-core": [python, "-m", "kernels.bench", *DRY_BENCH, "--out", str(work / "bench-core")],
                "chapter dry_run": [python, "-c", DRY_BOOK, str(work / "executed-dry_run" / "book" / "traces" / "dry_run")]}
    phases = {"gpu-tests": [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
              "bench-core": [python, "-m", "kernels.bench", "--device", "cuda", *CORE_BENCH,
                             "--out", str(work / "bench-core")]}
    for chapter in CHAPTERS:   # each into its own folder (the runner stages its --out afresh), kept in one cache
        phases[f"chapter {chapter}"] = [python, "-m", "tools.book.execute", "--preset", "cuda", "--jobs", "1",
                                        "--only", f"book/{chapter}", "--cache", str(work / "cache"),
                                        "--out", str(work / f"executed-{chapter}")]
    phases["bench"] = [python, "-m", "kernels.bench", "--device", "cuda", "--out", str(work / "bench")]
    # The HTML from the chapters above (restored from the cache; a chapter left out executes here).
    phases["html"] = [python, "-m", "tools.book.execute", "--preset", "cuda", "--jobs", "1", "--build",
                      "--cache", str(work / "cache"), "--out", str(work / "executed")]
    return phases


def phase_limit(name: str) -> int:
    return LIMITS["chapter" if name.startswith("chapter ") else name]


def run_phase(name: str, argv, limit: float, log: Path) -> dict:
    """Run one phase, its output into ``log``; a phase past its limit is killed with its children."""
    if argv is None:
        return {"name": name, "status": "skipped", "seconds": 0, "detail": "dry run: nothing to run without a GPU"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the whole group: papermill's kernels too
            proc.wait()
            rc = None
    if rc is None:
        status, detail = "timed out", f"killed after {limit:g} s"
    else:
        status, detail = ("ok", "") if rc == 0 else ("failed", f"exit {rc}; see logs/{log.name}")
    return {"name": name, "status": status, "seconds": round(time.monotonic() - start, 1), "detail": detail}


def environment() -> dict:
    """The GPU (None without one) and the versions this run executes with."""
    import torch

    env = {"gpu": None, "capability": None, "sm_count": None, "driver": None, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0],
           "triton": importlib.metadata.version("triton") if importlib.util.find_spec("triton") else None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=[p.major, p.minor], sm_count=p.multi_processor_count,
                   driver=command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    return env


def command_output(argv) -> str | None:
    """What a command printed, or None where it is missing or says nothing (no nvidia-smi, no git)."""
    try:
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run(out: Path, dry_run: bool, budget: float = DEFAULT_BUDGET) -> int:
    """The phases in order of value until ``budget`` seconds are spent, the archive rewritten after
    each, so a run stopped from outside still leaves what finished; exit 0 only when every phase
    ran and went well."""
    started = time.monotonic()
    env = environment()
    if env["gpu"] is None and not dry_run:
        print("gpu-run: no GPU visible (torch.cuda.is_available() is False), so there is nothing to record here; "
              "`python tools/gpu_run.py run OUT --dry-run` packs stand-ins on a CPU", file=sys.stderr)
        return 2
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    manifest = {"format": FORMAT, "version": VERSION, "dry_run": dry_run, **env,
                "device": env["gpu"] or "CPU (dry run)", "budget_s": budget, "left_out": [],
                "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "commit": command_output(["git", "rev-parse", "HEAD"]) or "unknown", "phases": []}
    for name, argv in phase_commands(sys.executable, work, dry_run).items():
        left = budget - (time.monotonic() - started)
        if left < MIN_PHASE:
            manifest["left_out"].append(name)
            print(f"gpu-run: {name}: left out ({left:.0f} s of the {budget:g} s budget left)", flush=True)
            continue
        limit = min(phase_limit(name), left)
        print(f"gpu-run: {name} (limit {limit:.0f} s)", flush=True)
        log = work / "logs" / f"{name.replace(' ', '-')}.log"
        manifest["phases"].append(run_phase(name, argv, limit, log))
        phase = manifest["phases"][-1]
        print(f"gpu-run: {name}: {phase['status']} in {phase['seconds']} s {phase['detail']}", flush=True)
        pack(out / ARCHIVE_NAME, manifest, finished_files(work))
    pack(out / ARCHIVE_NAME, manifest, finished_files(work))
    print(f"gpu-run: wrote {out / ARCHIVE_NAME} in {time.monotonic() - started:.0f} s"
          + (f"; left out for the budget: {', '.join(manifest['left_out'])}" if manifest["left_out"] else "")
          + f"; then `make gpu-import ARCHIVE={out / ARCHIVE_NAME}`")
    ran_well = all(p["status"] in ("ok", "skipped") for p in manifest["phases"])
    return 0 if ran_well and not manifest["left_out"] else 1


def finished_files(work: Path) -> dict:
    """Archive name -> file, for what the phases left: traces, the benchmark (the full sweep's when
    it finished, else the core points'), each chapter's report, logs."""
    files = {f"logs/{p.name}": p for p in sorted((work / "logs").glob("*.log"))}
    for traces in sorted(work.glob("executed*/book/traces")):
        files.update({f"traces/{p.relative_to(traces).as_posix()}": p for p in sorted(traces.glob("*/*.json.gz"))})
    for report in sorted(work.glob("executed*/report.json")):
        files[f"reports/{report.parent.name}.json"] = report
    bench = next((p for p in (work / "bench.json", work / "bench-core.json") if p.exists()), None)
    if bench is not None:
        files["bench.json"] = bench
    return files


def pack(archive: Path, manifest: dict, files: dict) -> None:
    """Write ``archive``: manifest.json (listing the files) first, then the files."""
    manifest = {**manifest, "files": sorted(files)}
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for name, path in sorted(files.items()):
            tar.add(path, arcname=name)


def read_archive(archive: Path) -> tuple[dict, dict]:
    """The manifest and every regular file's bytes."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = {m.name: f.read() for m in tar.getmembers() if m.isfile() and (f := tar.extractfile(m))}
    except (OSError, tarfile.TarError) as err:
        raise Refused(f"{archive} is not a readable .tar.gz ({err})") from err
    if "manifest.json" not in members:
        raise Refused(f"{archive} has no manifest.json: `make gpu-run` did not write it")
    manifest = json.loads(members.pop("manifest.json"))
    if (manifest.get("format"), manifest.get("version")) != (FORMAT, VERSION):
        raise Refused(f"{archive}'s manifest says format {manifest.get('format')!r} version "
                      f"{manifest.get('version')!r}; this import reads {FORMAT!r} version {VERSION}")
    return manifest, members


def slug(name: str) -> str:
    """A folder name for a device: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def lacking(manifest: dict, members: dict) -> list[str]:
    """What a partial archive lacks, one phrase each."""
    missing = [f"{p['name']} ({p['status']}{': ' + p['detail'] if p['detail'] else ''})"
               for p in manifest["phases"] if p["status"] != "ok" and not (manifest["dry_run"] and p["status"] == "skipped")]
    missing += [f"{name} (left out for the {manifest.get('budget_s'):g} s budget)" for name in manifest.get("left_out", [])]
    if not any(TRACE.match(name) for name in members):
        missing.append("traces (no chapter phase wrote any)")
    if "bench.json" not in members:
        missing.append("the benchmark (no bench.json)")
    return missing


def import_archive(archive: Path, data_root: Path = DATA) -> tuple[list[Path], list[str]]:
    """Write the recording and the benchmark an archive holds; returns (paths written, what it lacks)."""
    manifest, members = read_archive(Path(archive))
    if manifest["dry_run"] and Path(data_root).resolve() == DATA.resolve():
        raise Refused(f"{archive} is a dry run's archive (stand-ins, no GPU data): it imports only into another "
                      "folder (--data), never into book/data")
    traces = {name.removeprefix("traces/"): data for name, data in members.items() if TRACE.match(name)}
    missing = lacking(manifest, members)
    if not traces and "bench.json" not in members:
        raise Refused(f"{archive} holds neither traces nor a benchmark, so there is nothing to import: "
                      f"{'; '.join(missing)}")
    keys = ("capability", "sm_count", "driver", "torch", "cuda", "cudnn", "triton", "python", "date", "commit",
            "dry_run", "phases")
    meta = {"gpu": manifest["device"], **{k: manifest.get(k) for k in keys}, "lacks": missing}
    name = slug(manifest["device"])
    written = write_recording(Path(data_root) / "recorded" / name, meta, traces) if traces else []
    if "bench.json" in members:
        written.append(write_bench(Path(data_root) / "bench" / f"{name}.json", meta, members["bench.json"]))
    return written, missing


def write_recording(folder: Path, meta: dict, traces: dict) -> list[Path]:
    """``folder``/meta.json and ``folder``/<notebook>/<variant>.json.gz, as kernels.recorded reads them."""
    shutil.rmtree(folder, ignore_errors=True)   # a new recording of the same GPU replaces the old one
    written = []
    for path, data in sorted(traces.items()):
        written.append(folder / path)
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        written[-1].write_bytes(data)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return [*written, folder / "meta.json"]


def write_bench(target: Path, meta: dict, data: bytes) -> Path:
    """The benchmark in kernels.bench's format, its meta labelled with the run that measured it."""
    bench = json.loads(data)
    bench.setdefault("meta", {})["recorded"] = {k: meta[k] for k in ("gpu", "date", "commit")}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(bench, indent=1, sort_keys=True) + "\n")
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/gpu_run.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="on a GPU machine: OUT/gpu-run.tar.gz")
    r.add_argument("out", type=Path)
    r.add_argument("--dry-run", action="store_true", help="no GPU: stand-ins through the same packing, marked dry")
    r.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"stop starting phases once this is spent (default {DEFAULT_BUDGET}: a lent GPU machine's "
                        "10-minute command); what was left out is written in the manifest")
    i = sub.add_parser("import", help="an archive -> book/data/recorded/<gpu>/ and book/data/bench/<gpu>.json")
    i.add_argument("archive", type=Path)
    i.add_argument("--data", type=Path, default=DATA, help="where recorded/ and bench/ go (default book/data)")
    args = ap.parse_args(argv)
    if args.what == "run":
        return run(args.out.resolve(), args.dry_run, args.budget)
    try:
        written, missing = import_archive(args.archive, args.data)
    except Refused as err:
        print(f"gpu-import: {err}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {path}" for path in written))
    if missing:
        print(f"partial: {args.archive} lacks {'; '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
