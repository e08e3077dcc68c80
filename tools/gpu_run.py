"""One GPU run, one archive: what ``.ci/device-run`` does on a GPU and ``make gpu-import`` undoes.

GPU machines are lent to this project rarely and briefly (minutes, no network, a handful of
files back), so a GPU run is one call that returns one archive, and everything else happens
on a CPU afterwards::

    python tools/gpu_run.py run OUT [--dry-run]   # the GPU run -> OUT/gpu-run.tar.gz + OUT/summary.txt
    python tools/gpu_run.py import ARCHIVE        # -> book/data/recorded/<gpu>/, book/data/bench/<gpu>.json
    python tools/gpu_run.py wheels [DEST]         # what the GPU image lacks, as wheels, into .wheels/

``run`` goes through four phases, each in its own process with its own time limit, so a
phase that hangs or runs out of time is written down as such and the next one still runs:

    environment   the GPU, its clocks and driver, torch / Triton / CUDA / cuDNN, the commit
    gpu-tests     the GPU-marked tests (pytest -m gpu), collected without the book stack
    chapters      chapters 00-10 executed by papermill with the ``cuda`` preset, traces kept
    bench         causal bf16 forward, training step and decode token of the fused implementations

``--dry-run`` runs the same pipeline on a CPU, each GPU phase replaced by a small stand-in,
and says so in the manifest: CI proves the archive's layout and limits with it, and
``import`` refuses it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
FORMAT = "attention-profiled/gpu-run"
VERSION = 1
ARCHIVE_NAME, SUMMARY_NAME = "gpu-run.tar.gz", "summary.txt"
ARCHIVE_BUDGET = 15 * 2**20      # the device tool brings back files of at most 16 MiB
WHEELS_BUDGET = 40 * 2**20
TOTAL_SECONDS = 8 * 60           # one device call (10 minutes at most a command, 2 to spare)


def toc_chapters(root: Path = ROOT) -> tuple:
    """The book's chapters in _toc.yml's order (which is also their order of value for a GPU run:
    01-03's recordings are asserted today, 04-06 hold the kernels and the benchmark's ratios, 07 on
    build on them), those whose notebook exists. Read without yaml: the run starts before any import."""
    toc = (root / "_toc.yml").read_text()
    names = re.findall(r"^\s*- file: book/(\d\w*)\s*$", toc, re.M)
    return tuple(n for n in names if (root / "book" / f"{n}.ipynb").exists())


CHAPTERS = toc_chapters()
BOOK_STACK = ("papermill", "nbclient", "nbformat", "ipykernel", "jupyter_client")

PHASES = ("environment", "gpu-tests", "chapters", "bench")   # in order of value: what runs first
PLAN_PATH = ROOT / "tools" / "gpu_plan.json"
# The GPU tests, those that guard the book's GPU lessons first (chapters 3-3b's backends, chapter
# 4's kernel, chapter 5's), then any other; pytest collects a module named twice once.
GPU_TEST_ORDER = ("tests/attention/test_sdpa_priority.py", "tests/attention/test_sdpa_rules.py",
                  "tests/triton/test_triton_flash.py", "tests/cuda/test_cuda_flash.py", "tests")
DONE = ("ok", "dry run")         # a phase or chapter with this status is not run again by --resume
PARTIAL = ("not run", "partial", "timed out")   # what a partial archive may hold for chapters and bench


def load_plan(path: Path = PLAN_PATH) -> dict:
    """tools/gpu_plan.json: the expected seconds and limits (tools/gpu_plan.py computes them)."""
    return json.loads(path.read_text())


def plan_limits(plan: dict, dry_run: bool) -> tuple[dict, dict]:
    """(phase -> limit s, chapter -> limit s): the GPU run's from the plan's computed expectations
    times its margin; the dry run's from this CPU's measured times (the plan's ``dry_run``)."""
    if dry_run:
        d = plan["dry_run"]
        return dict(d["phase_limits_s"]), dict(d["chapter_limits_s"])
    c = plan["computed"]
    return ({p: c["phases"][p]["limit_s"] for p in PHASES},
            {name: row["limit_s"] for name, row in c["chapters"].items()})


PLAN = load_plan()
LIMITS, CHAPTER_LIMITS = plan_limits(PLAN, dry_run=False)

BENCH_ARGS = ["--impls", "sdpa_flash", "sdpa_cudnn", "triton", "cuda_v2", "--seq", "1024", "2048", "4096",
              "16384", "--head-dim", "64", "128", "--dtype", "bf16", "--batch", "4", "--heads", "16",
              "--mode", "forward", "training", "decode", "--reps", "20", "--warmup", "3", "--max-seconds", "0.25", "--warm-gpu", "3"]
DRY_BENCH_ARGS = ["--impls", "naive", "sdpa_flash", "--seq", "64", "--head-dim", "16", "--batch", "1",
                  "--heads", "2", "--reps", "5", "--warmup", "1", "--max-seconds", "0.1", "--no-memory"]


class Refused(Exception):
    """An archive that ``import`` will not turn into a recording; the message says why."""


# ------------------------------------------------------------------------------ the phases

@dataclass
class Phase:
    name: str
    status: str = "not run"      # ok | failed | timed out | partial | skipped | dry run | not run
    seconds: float = 0.0
    detail: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 1), "detail": self.detail}


@dataclass
class Run:
    out: Path
    work: Path
    python: str
    dry_run: bool
    deadline: float
    log: io.TextIOBase
    phases: list = field(default_factory=list)
    limits: dict = field(default_factory=lambda: dict(LIMITS))
    chapter_limits: dict = field(default_factory=lambda: dict(CHAPTER_LIMITS))
    chapter_set: dict = field(default_factory=dict)    # chapter -> extra --set values (the dry run's stand-ins)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def command(self, phase: Phase, argv: list, limit: float, log_name: str, env: Optional[dict] = None) -> int:
        """Run one command of a phase with a time limit; its output goes to work/logs/<log_name>."""
        limit = max(1.0, min(limit, self.seconds_left()))
        log_path = self.work / "logs" / log_name
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log_path, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env or phase_env(),
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                code = None
        phase.seconds += time.monotonic() - start
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        for line in tail:
            self.say(f"    | {line[:200]}")
        if code is None:
            self.say(f"    {log_name}: timed out after {limit:.0f} s")
            return 124
        return code


def phase_env() -> dict:
    """The environment of every phase: the checkout importable, nothing set that changes kernels."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def book_stack_missing(python: str) -> list[str]:
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    done = subprocess.run([python, "-c", probe, *BOOK_STACK], capture_output=True, text=True, env=phase_env())
    return done.stdout.split()


ENVIRONMENT_SCRIPT = r"""
import json, os, platform, subprocess, sys
import torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count()}
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
try:  # what Triton's cache key holds of this installation (tools/triton_cache.py compares it)
    import hashlib
    from triton.runtime.cache import triton_key
    from triton.backends.nvidia.compiler import get_ptxas_version
    info["triton_key"] = hashlib.sha256(triton_key().encode()).hexdigest()
    info["ptxas_sm90"] = get_ptxas_version(90).strip().splitlines()[-1]
except Exception as err:
    info["triton_key"] = f"unavailable: {type(err).__name__}: {err}"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=[p.major, p.minor], sm_count=p.multi_processor_count,
                memory_gib=round(p.total_memory / 2**30, 1), device_count=torch.cuda.device_count())
    query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.splitlines()[0]
        info.update(zip(["driver", "clock_sm", "clock_sm_max", "clock_mem", "clock_mem_max", "power_limit"],
                        [v.strip() for v in smi.split(",")]))
    except Exception as err:
        info["nvidia_smi"] = f"unavailable: {err}"
else:
    info.update(gpu=None, capability=None, cpu=platform.processor() or platform.machine())
print(json.dumps(info))
"""


def commit() -> str:
    """The commit this run executes: git where the checkout has it, else what the caller passed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if sha:
            return sha + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GPU_RUN_COMMIT", "unknown")


def carried_cache_verdict(env: dict) -> str:
    """Whether the Triton cache carried in TRITON_CACHE_DIR was compiled by this very Triton
    build (its stamp, written by tools/triton_cache.py, against this machine's key), in words."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    stamp = Path(folder) / "attention-profiled.json" if folder else None
    if stamp is None or not stamp.exists():
        return ""
    carried = json.loads(stamp.read_text())
    checks = [("triton", "Triton version"), ("triton_key", "Triton build (triton_key)"), ("ptxas_sm90", "ptxas")]
    differ = [what for key, what in checks if carried.get(key) != env.get(key)]
    if env.get("capability") and list(env["capability"]) != carried.get("capability"):
        differ.append(f"GPU capability (carried {carried.get('capability')})")
    entries = f"{carried.get('entries')} kernels compiled for sm_{''.join(map(str, carried.get('capability', [])))}"
    if differ:
        return f"carried ({entries}), but compiled by another {', '.join(differ)}: expect no hits"
    return f"carried ({entries}), same Triton build and ptxas: its entries can be hits"


def phase_environment(run: Run) -> tuple[Phase, dict]:
    phase = Phase("environment")
    code = run.command(phase, [run.python, "-c", ENVIRONMENT_SCRIPT], run.limits["environment"], "environment.log")
    env = {}
    if code == 0:
        env = json.loads((run.work / "logs" / "environment.log").read_text().strip().splitlines()[-1])
    env["commit"] = commit()
    env["triton_cache"] = carried_cache_verdict(env)
    if env["triton_cache"]:
        run.say(f"   Triton cache: {env['triton_cache']}")
    env["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if code == 0 and not env.get("cuda_available") and not run.dry_run:
        phase.status, phase.detail = "failed", "torch sees no CUDA GPU (torch.cuda.is_available() is False)"
    elif code == 0:
        phase.status = "ok"
        phase.detail = env.get("gpu") or f"CPU ({env.get('cpu')}, {env.get('cpu_count')} cores)"
    else:
        phase.status = "timed out" if code == 124 else "failed"
        phase.detail = "the environment probe did not finish; see logs/environment.log"
    (run.work / "environment.json").write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    return phase, env


def phase_gpu_tests(run: Run) -> Phase:
    phase = Phase("gpu-tests")
    if run.dry_run:
        # The stand-in: collect the GPU tests, which proves they import without the book stack.
        argv = [run.python, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                *GPU_TEST_ORDER]
        code = run.command(phase, argv, run.limits["gpu-tests"], "gpu-tests.log")
        phase.status = "dry run" if code == 0 else ("timed out" if code == 124 else "failed")
        phase.detail = "collected only (no GPU)"
        return phase
    argv = [run.python, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-rfE",
            f"--junitxml={run.work / 'gpu-tests.xml'}", *GPU_TEST_ORDER]
    code = run.command(phase, argv, run.limits["gpu-tests"], "gpu-tests.log")
    phase.status = {0: "ok", 124: "timed out"}.get(code, "failed")
    phase.detail = pytest_counts((run.work / "logs" / "gpu-tests.log").read_text(errors="replace"))
    return phase


def verbose_counts(text: str) -> str:
    """What ``pytest -v`` had printed when it was stopped: each finished test's verdict, counted."""
    verdicts = re.findall(r"::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text)
    return ", ".join(f"{verdicts.count(v)} {v.lower()}" for v in dict.fromkeys(verdicts)) or "no test finished"


def pytest_counts(text: str) -> str:
    """pytest's closing line (``12 passed, 1 failed in 3.2s``), or what is known without it."""
    lines = [l.strip("= ") for l in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", l)]
    return lines[-1] if lines else f"stopped before pytest's summary: {verbose_counts(text)} (see logs/gpu-tests.log)"


def chapter_limit(run: Run, chapter: str, later: list[str], phase_end: float) -> float:
    """A chapter's time: its own limit, or more when earlier chapters left time over, but never the
    time the chapters after it are expected to need (their limits over the plan's margin)."""
    left = phase_end - time.monotonic()
    own = run.chapter_limits.get(chapter, left)
    margin = 1.0 if run.dry_run else PLAN["margin"]
    reserve = sum(run.chapter_limits.get(c, 0) / margin for c in later)
    return max(0.0, min(left, max(own, left - reserve)))


def phase_chapters(run: Run, chapters: list[str], overrides: list[str], stop_after: Optional[str] = None,
                   prior: Optional[list] = None) -> tuple[Phase, list]:
    """Each chapter in its own runner process and folder, so one that hangs costs only itself.

    ``prior``: the rows of an earlier call (--resume); its ok chapters are kept, not run again.
    ``stop_after``: the last chapter this call executes; the ones after it are left "not run".
    """
    phase = Phase("chapters")
    kept = {r["notebook"]: r for r in (prior or []) if r["status"] == "ok"}
    missing = book_stack_missing(run.python)
    if missing:
        phase.status = "skipped"
        phase.detail = f"the book stack is not importable ({', '.join(missing)}): run `make gpu-wheels` and carry .wheels"
        return phase, list(kept.values())
    preset = "cpu" if run.dry_run else "cuda"
    rows, phase_end = [], time.monotonic() + run.limits["chapters"]
    todo = [c for c in chapters if f"book/{c}.ipynb" not in kept]
    if stop_after in todo:
        todo = todo[:todo.index(stop_after) + 1]
    for chapter in chapters:
        name = f"book/{chapter}.ipynb"
        if name in kept:
            rows.append(kept[name])
            continue
        if chapter not in todo:
            rows.append({"notebook": name, "status": "not run", "seconds": None,
                         "error": f"left for a later call (--stop-after {stop_after})"})
            continue
        later = todo[todo.index(chapter) + 1:]
        limit = chapter_limit(run, chapter, later, phase_end)
        if limit < 5:
            rows.append({"notebook": name, "status": "timed out", "seconds": 0,
                         "error": "the chapters phase ran out of time before this chapter started"})
            continue
        run.say(f"  chapter {chapter} (limit {limit:.0f} s, {phase_end - time.monotonic():.0f} s left in this phase)")
        out = run.work / "executed" / chapter
        shutil.rmtree(run.work / "traces" / chapter, ignore_errors=True)   # a rerun replaces what failed
        sets = [*overrides, *run.chapter_set.get(chapter, [])]
        # A GPU run executes every chapter afresh: no execution cache.
        argv = [run.python, "-m", "tools.book.execute", "--preset", preset, "--only", name,
                "--out", str(out), "--no-cache"] + (["--set", *sets] if sets else [])
        code = run.command(phase, argv, limit, f"chapter-{chapter}.log")
        report = out / "report.json"
        if report.exists():
            rows.extend(json.loads(report.read_text())["notebooks"])
        else:
            rows.append({"notebook": name, "status": "timed out" if code == 124 else "failed",
                         "seconds": None, "error": f"the runner exited with {code}; see logs/chapter-{chapter}.log"})
        collect(run, [chapter])
    phase.status, phase.detail = chapters_verdict(rows, preset, run.dry_run)
    (run.work / "chapters.json").write_text(json.dumps(rows, indent=2) + "\n")
    return phase, rows


def chapters_verdict(rows: list, preset: str, dry_run: bool) -> tuple[str, str]:
    """The chapters phase's status and detail from its rows (this call's and a resumed one's)."""
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        status = "dry run" if dry_run else "ok"
    elif any(r["status"] not in PARTIAL for r in bad):
        status = "failed"
    elif any(r["status"] == "timed out" for r in bad):
        status = "timed out"
    else:
        status = "partial"
    detail = f"{len(rows) - len(bad)} of {len(rows)} chapters ok, {preset} preset" + (
        "; " + "; ".join(f"{r['notebook']}: {r['status']}: {r['error']}" for r in bad) if bad else "")
    return status, detail


def phase_bench(run: Run) -> Phase:
    """One benchmark process per implementation, so a slow compile costs only its own rows."""
    phase = Phase("bench")
    device, args = ("cpu", DRY_BENCH_ARGS) if run.dry_run else ("cuda", BENCH_ARGS)
    impls = args[args.index("--impls") + 1:args.index("--seq")]
    common = args[:args.index("--impls")] + args[args.index("--seq"):]
    merged: dict[str, dict] = {"meta": {}}
    results: list[dict] = []
    outcomes: list[str] = []
    budget_end = time.monotonic() + run.limits["bench"]
    for i, impl in enumerate(impls):
        share = (budget_end - time.monotonic()) / (len(impls) - i)  # what the fast ones leave, the slow ones get
        stem = run.work / "logs" / f"bench-{impl}"
        argv = [run.python, "-m", "kernels.bench", "--device", device, "--impls", impl, *common, "--out", str(stem)]
        code = run.command(phase, argv, share, f"bench-{impl}.log")
        outcomes.append(f"{impl}: {'ok' if code == 0 else 'timed out' if code == 124 else f'exit {code}'}")
        if code == 0:
            part = json.loads(stem.with_suffix(".json").read_text())
            merged["meta"] = merged["meta"] or part["meta"]
            merged["meta"].setdefault("commands", []).append(part["meta"].get("command"))
            results.extend(part["results"])
        for leftover in stem.parent.glob(stem.name + ".*"):
            leftover.unlink()
    (run.work / "bench.json").write_text(json.dumps({**merged, "results": results}, indent=1) + "\n")
    bad = [o for o in outcomes if not o.endswith(": ok")]
    phase.status = "ok" if not bad else ("timed out" if all("timed out" in o for o in bad) else "failed")
    if run.dry_run and not bad:
        phase.status = "dry run"
    phase.detail = f"{len(results)} points; " + ", ".join(outcomes)
    return phase


# ------------------------------------------------------------------- traces, archive, manifest

def trim_trace(raw: dict) -> dict:
    """Only what the book reads: the labelled steps, and the GPU work launched inside them.

    A label is a ``user_annotation`` other than ``ProfilerStep#N``. CPU events are kept when
    they overlap a label; GPU events when their correlation id is one a kept launch carries.
    Runtime, driver and profiler-overhead rows are also kept inside a recorded step
    (``ProfilerStep#N``) outside its label: the synchronize that ends each step and the
    profiler's own activity-buffer requests, which chapter 0 reads.
    """
    events = raw.get("traceEvents", [])
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in annotations
             if not str(e.get("name", "")).startswith("ProfilerStep#")]
    steps = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in annotations
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_cats = {"cuda_runtime", "cuda_driver", "overhead", "Runtime", "Driver"}

    def overlaps(e, ranges) -> bool:
        ts = e.get("ts")
        if ts is None:
            return False
        end = ts + e.get("dur", 0)
        return any(ts <= b and end >= a for a, b in ranges)

    def inside(e) -> bool:
        return overlaps(e, spans) or (e.get("cat") in step_cats and overlaps(e, steps))

    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"}
    kept, correlations = [], set()
    for e in events:
        if e.get("ph") == "M" or (e.get("cat") not in gpu_cats and inside(e)):
            kept.append(e)
            if "correlation" in e.get("args", {}):
                correlations.add(e["args"]["correlation"])
    for e in events:
        if e.get("cat") in gpu_cats and e.get("args", {}).get("correlation") in correlations:
            kept.append(e)
        elif e.get("ph") in ("s", "f") and e.get("id") in correlations:
            kept.append(e)
    return {**raw, "traceEvents": kept}


def gzip_json(data: dict) -> bytes:
    """Deterministic gzip (no timestamp), so the same run archived twice has the same bytes."""
    return gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)


def collect(run: Run, chapters: list[str]) -> None:
    """Move what the chapters wrote into the archive's layout: trimmed traces, executed notebooks."""
    for chapter in chapters:
        executed = run.work / "executed" / chapter / "book"
        for trace in sorted((executed / "traces" / chapter).glob("*.json.gz")):
            target = run.work / "traces" / chapter / trace.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(trace, "rt") as f:
                target.write_bytes(gzip_json(trim_trace(json.load(f))))
        notebook = executed / f"{chapter}.ipynb"
        if notebook.exists():
            (run.work / "notebooks").mkdir(exist_ok=True)
            shutil.copy2(notebook, run.work / "notebooks" / notebook.name)
    shutil.rmtree(run.work / "executed", ignore_errors=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# What goes first when the archive would be too big: notebooks (their outputs can be redone),
# then logs; traces, the manifest and the benchmark are what the recording is made of.
DROP_ORDER = ("notebooks/", "logs/")


def pack(work: Path, archive: Path, manifest: dict, budget: int = ARCHIVE_BUDGET) -> dict:
    """Write ``archive`` from the files under ``work`` plus a manifest listing each with its hash."""
    files = sorted(p for p in work.rglob("*") if p.is_file())
    dropped: list[str] = []
    while True:
        listed = [{"path": p.relative_to(work).as_posix(), "bytes": p.stat().st_size,
                   "sha256": sha256(p.read_bytes())} for p in files]
        manifest = {**manifest, "files": listed, "dropped": dropped}
        write_tar(archive, work, files, manifest)
        if archive.stat().st_size <= budget:
            return manifest
        victims = [p for prefix in DROP_ORDER for p in files if p.relative_to(work).as_posix().startswith(prefix)]
        if not victims:
            raise SystemExit(f"{archive} is {archive.stat().st_size / 2**20:.1f} MiB, over the "
                             f"{budget / 2**20:.0f} MiB budget, with nothing left to drop")
        biggest = max(victims, key=lambda p: p.stat().st_size)
        files.remove(biggest)
        dropped.append(biggest.relative_to(work).as_posix())


def write_tar(archive: Path, work: Path, files: list[Path], manifest: dict) -> None:
    def add(tar, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(archive, "w:gz") as tar:
        add(tar, "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        for p in files:
            add(tar, p.relative_to(work).as_posix(), p.read_bytes())


def stand_in_sets(sets: list[str]) -> list[str]:
    """The dry run's --set values, with ``steps`` written as the presets now spell it
    (``active_steps`` after its rename), so the stand-in's shapes stay the plan's."""
    presets = (ROOT / "kernels" / "presets.yml").read_text()
    if "steps" in [s.split("=")[0] for s in sets] and not re.search(r"^\s+steps:", presets, re.M) \
            and re.search(r"^\s+active_steps:", presets, re.M):
        return [("active_" + s) if s.startswith("steps=") else s for s in sets]
    return sets


def unpack_prior(archive: Path, work: Path, dry_run: bool) -> dict:
    """An earlier call's archive (--resume), checked like an import, unpacked into ``work``."""
    manifest, members = read_archive(archive)
    if bool(manifest.get("dry_run")) != dry_run:
        raise Refused(f"{archive} is {'a dry run' if manifest.get('dry_run') else 'a GPU run'}: it resumes only as one "
                      f"({'with' if manifest.get('dry_run') else 'without'} --dry-run)")
    for path, data in members.items():
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return manifest


def same_machine(prior: dict, env: dict) -> Optional[str]:
    """Why this call may not add to ``prior``'s archive (another GPU, another commit), or None."""
    before = prior.get("environment", {})
    for key, what in (("gpu", "GPU"), ("commit", "commit"), ("torch", "torch"), ("triton", "Triton")):
        if before.get(key) != env.get(key):
            return f"the first call ran with {what} {before.get(key)!r}, this one with {env.get(key)!r}"
    return None


def prior_phase(prior: Optional[dict], name: str) -> Optional[Phase]:
    """The earlier call's result of a phase it finished, kept as it was."""
    for p in (prior or {}).get("phases", []):
        if p["name"] == name and p["status"] in DONE + ("skipped",):
            return Phase(p["name"], p["status"], p["seconds"], p["detail"])
    return None


def run_all(out: Path, dry_run: bool, chapters: list[str], overrides: list[str], python: str,
            stop_after: Optional[str] = None, resume: Optional[Path] = None) -> int:
    """One device call: the phases in order of value, each within its limit, packed into one archive.

    ``stop_after`` (a phase or a chapter) ends the call there, the rest left "not run" in the
    manifest; ``resume`` (an earlier call's archive) runs only what that one did not finish and
    packs both into this call's archive.
    """
    if stop_after is not None and stop_after not in PHASES and stop_after not in chapters:
        raise SystemExit(f"--stop-after takes a phase ({', '.join(PHASES)}) or a chapter of the run, got {stop_after!r}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / ARCHIVE_NAME, out / SUMMARY_NAME):
        stale.unlink(missing_ok=True)
    start = time.monotonic()
    limits, chapter_limits = plan_limits(PLAN, dry_run)
    total = sum(limits.values()) + 60 if dry_run else TOTAL_SECONDS
    if dry_run:
        overrides = [*stand_in_sets(PLAN["dry_run"]["set"]), *overrides]
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp, open(out / SUMMARY_NAME, "w") as log:
        run = Run(out=out, work=Path(tmp), python=python, dry_run=dry_run, deadline=start + total - 30, log=log,
                  limits=limits, chapter_limits=chapter_limits,
                  chapter_set=dict(PLAN["dry_run"]["chapter_set"]) if dry_run else {})
        run.say(f"GPU run{' (DRY RUN: no GPU, stand-ins only)' if dry_run else ''}: python {python}, "
                f"at most {total / 60:.0f} min; results in {out / ARCHIVE_NAME}")
        prior = None
        if resume is not None:
            try:
                prior = unpack_prior(Path(resume), run.work, dry_run)
            except Refused as err:
                run.say(f"device-run: cannot resume: {err}")
                return 2
            run.say(f"resuming {resume}: it finished " + (", ".join(
                p["name"] for p in prior["phases"] if p["status"] in DONE) or "nothing"))
        prior_rows = json.loads((run.work / "chapters.json").read_text()) if (run.work / "chapters.json").exists() else []
        env: dict = {}
        stopped, ran = False, []
        for i, name in enumerate(PHASES, 1):
            kept = prior_phase(prior, name) if name != "environment" else None
            if stopped or kept:
                phase = kept or Phase(name, "not run", 0.0, f"left for a later call (--stop-after {stop_after})")
                run.phases.append(phase)
                run.say(f"== {i}/{len(PHASES)} {name}: {'kept from the first call' if kept else 'not run'}")
                continue
            run.say(f"== {i}/{len(PHASES)} {name} (limit {run.limits[name]} s, {run.seconds_left():.0f} s left in all)")
            if name == "environment":
                phase, env = phase_environment(run)
                if not dry_run and not env.get("cuda_available"):
                    run.say(f"   environment: {phase.status}: {phase.detail}")
                    run.say("device-run needs a CUDA GPU, and torch sees none here; on a machine without one, "
                            "`.ci/device-run --dry-run OUT` runs the same pipeline with stand-ins")
                    return 2
                why = same_machine(prior, env) if prior else None
                if why:
                    run.say(f"device-run: cannot resume {resume}: {why}; run the whole plan again instead")
                    return 2
            elif name == "gpu-tests":
                phase = phase_gpu_tests(run)
            elif name == "chapters":
                phase, _ = phase_chapters(run, chapters, overrides, stop_after if stop_after in chapters else None,
                                          prior_rows)
                stopped = stop_after in chapters
            else:
                phase = phase_bench(run)
            run.phases.append(phase)
            ran.append(name)
            run.say(f"   {name}: {phase.status} in {phase.seconds:.0f} s" + (f": {phase.detail}" if phase.detail else ""))
            stopped = stopped or stop_after == name
        calls = list(prior.get("calls") or [call_record(prior)]) if prior else []
        calls.append({"date": env.get("date"), "commit": env.get("commit"), "seconds": round(time.monotonic() - start, 1),
                      "ran": ran, "stop_after": stop_after})
        manifest = {"format": FORMAT, "version": VERSION, "dry_run": dry_run, "date": env.get("date"),
                    "commit": env.get("commit"), "device": env.get("gpu") or "CPU (dry run)",
                    "environment": env, "phases": [p.as_dict() for p in run.phases], "calls": calls}
        manifest = pack(run.work, out / ARCHIVE_NAME, manifest)
        size = (out / ARCHIVE_NAME).stat().st_size
        run.say(f"archive: {out / ARCHIVE_NAME}, {size / 2**20:.2f} MiB, {len(manifest['files'])} files"
                + (f", dropped to fit: {', '.join(manifest['dropped'])}" if manifest["dropped"] else ""))
        for p in run.phases:
            run.say(f"  {p.name:<12} {p.status:<10} {p.seconds:6.0f} s  {p.detail}")
        lacks = lacking(manifest)
        if lacks:
            run.say(f"this archive lacks {lacks}: `.ci/device-run --resume {out / ARCHIVE_NAME} OUT2` runs only that")
        run.say(f"finished in {time.monotonic() - start:.0f} s")
    bad = [p for p in run.phases if p.status not in DONE + ("skipped", "not run", "partial")]
    return 1 if bad else 0


def call_record(manifest: dict) -> dict:
    """A call's entry for an archive written before manifests listed their calls."""
    return {"date": manifest.get("date"), "commit": manifest.get("commit"), "seconds": None,
            "ran": [p["name"] for p in manifest.get("phases", []) if p["status"] != "not run"], "stop_after": None}


def lacking(manifest: dict, members: Optional[dict] = None) -> str:
    """What a partial archive lacks, in words ("" when nothing): chapters not ok, phases not done."""
    rows = None
    if members is not None and "chapters.json" in members:
        rows = json.loads(members["chapters.json"])
    parts = []
    chapters = next((p for p in manifest.get("phases", []) if p["name"] == "chapters"), None)
    if chapters and chapters["status"] not in DONE + ("skipped",):
        names = ([r["notebook"].removeprefix("book/").removesuffix(".ipynb") for r in rows if r["status"] != "ok"]
                 if rows is not None else re.findall(r"book/(\S+)\.ipynb", chapters["detail"]))
        parts.append("chapters " + (", ".join(names) or "(all)"))
    parts += [f"the {p['name']} phase ({p['status']})" for p in manifest.get("phases", [])
              if p["name"] not in ("chapters",) and p["status"] not in DONE + ("skipped",)]
    return "; ".join(parts)


# ---------------------------------------------------------------------------------- import

def read_archive(archive: Path) -> tuple[dict, dict]:
    """The manifest and every member's bytes, after checking the format, version and hashes."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = {}
            for member in tar.getmembers():
                # extractfile gives None for what is no regular file (a link, a folder): skipped.
                data = tar.extractfile(member) if member.isfile() else None
                if data is not None:
                    members[member.name] = data.read()
    except (OSError, tarfile.TarError) as err:
        raise Refused(f"{archive} is not a readable .tar.gz ({err})") from err
    if "manifest.json" not in members:
        raise Refused(f"{archive} has no manifest.json: it was not made by .ci/device-run")
    manifest = json.loads(members.pop("manifest.json"))
    if manifest.get("format") != FORMAT:
        raise Refused(f"{archive}'s manifest is not a {FORMAT} manifest (format {manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise Refused(f"{archive}'s manifest has version {manifest.get('version')!r}; this import reads version "
                      f"{VERSION} only: update tools/gpu_run.py to read it")
    listed = {f["path"]: f for f in manifest.get("files", [])}
    missing = sorted(set(listed) - set(members))
    if missing:
        raise Refused(f"{archive} lacks files its manifest lists: {', '.join(missing)}")
    unlisted = sorted(set(members) - set(listed))
    if unlisted:
        raise Refused(f"{archive} holds files its manifest does not list: {', '.join(unlisted)}")
    altered = sorted(p for p, f in listed.items() if sha256(members[p]) != f["sha256"] or len(members[p]) != f["bytes"])
    if altered:
        raise Refused(f"{archive} holds files altered since the run (hash mismatch): {', '.join(altered)}")
    return manifest, members


def check_importable(manifest: dict, accept_failed: tuple = ()) -> None:
    if manifest.get("dry_run"):
        raise Refused("this archive is a dry run (.ci/device-run --dry-run on a machine without a GPU): "
                      "it holds stand-ins, not GPU data, so there is nothing to record")
    # A partial archive (chapters or the bench stopped, or out of time) imports what it holds;
    # the GPU tests guard the lessons, so a run whose tests did not all finish needs --accept-failed.
    bad = [p for p in manifest["phases"] if p["status"] not in ("ok", "skipped") and p["name"] not in accept_failed
           and not (p["name"] in ("chapters", "bench") and p["status"] in PARTIAL)]
    if bad:
        listing = "; ".join(f"{p['name']} {p['status']} ({p['detail']})" for p in bad)
        raise Refused(f"the GPU run had phases that did not pass: {listing}. Fix and rerun, or import what "
                      f"is there with --accept-failed {' '.join(p['name'] for p in bad)} (recorded in meta.json)")
    if not manifest["environment"].get("gpu"):
        raise Refused("the manifest names no GPU: the run did not execute on one")


def slug(gpu_name: str) -> str:
    """A folder name for a GPU: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def import_archive(archive: Path, data_root: Path = ROOT / "book" / "data", accept_failed: tuple = ()) -> list[Path]:
    """Write the recording and the benchmark of a real GPU run; returns the paths written.

    The same archive imported twice writes the same bytes: the traces are copied as they
    are, and meta.json holds only what the manifest says.
    """
    manifest, members = read_archive(Path(archive))
    check_importable(manifest, accept_failed)
    env = manifest["environment"]
    name = slug(env["gpu"])
    folder = data_root / "recorded" / name
    if folder.exists():
        shutil.rmtree(folder)
    written = []
    for path, data in sorted(members.items()):
        if path.startswith("traces/") and path.endswith(".json.gz"):
            target = folder / path.removeprefix("traces/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
    chapters = json.loads(members["chapters.json"]) if "chapters.json" in members else []
    meta = {"gpu": env["gpu"], "capability": env.get("capability"), "sm_count": env.get("sm_count"),
            "torch": env.get("torch"), "cuda": env.get("cuda"), "cudnn": env.get("cudnn"),
            "triton": env.get("triton"), "driver": env.get("driver"), "date": manifest["date"],
            "commit": manifest["commit"], "preset": "cuda", "source": ".ci/device-run",
            "phases": manifest["phases"], "accepted_failed": sorted(accept_failed),
            "lacks": lacking(manifest, members), "calls": manifest.get("calls", []),
            "chapters": [{k: r.get(k) for k in ("notebook", "status", "seconds", "error")} for r in chapters]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    written.append(folder / "meta.json")
    if "bench.json" in members:
        bench = json.loads(members["bench.json"])
        bench.setdefault("meta", {})["recorded"] = {"gpu": env["gpu"], "date": manifest["date"],
                                                    "commit": manifest["commit"], "source": ".ci/device-run"}
        target = data_root / "bench" / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(bench, indent=2, sort_keys=True) + "\n")
        written.append(target)
    return written


# ---------------------------------------------------------------------------------- wheels

# What the GPU image already has (the lent machine's Python: torch, Triton, numpy, pandas, matplotlib,
# pyyaml, pytest, jinja2) and what those bring with them: not downloaded again.
IMAGE_HAS = {
    "torch", "triton", "numpy", "pandas", "matplotlib", "pyyaml", "pytest", "jinja2", "markupsafe",
    "filelock", "fsspec", "networkx", "sympy", "mpmath", "typing-extensions", "setuptools",
    "python-dateutil", "six", "pytz", "tzdata", "contourpy", "cycler", "fonttools", "kiwisolver",
    "packaging", "pillow", "pyparsing", "iniconfig", "pluggy", "pygments",
}
GPU_WHEELS = ("papermill", "nbclient", "nbformat", "ipykernel", "jupyter_client", "ninja")
WHEEL_TARGET = ["--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]


def wheel_project(filename: str) -> str:
    return re.sub(r"[-_.]+", "-", filename.split("-")[0]).lower()


def wheels(dest: Path, budget: int = WHEELS_BUDGET) -> list[Path]:
    """Download the book stack's wheels for the GPU image (CPython 3.12, manylinux x86-64)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(dest), *WHEEL_TARGET, *GPU_WHEELS]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    kept = []
    for wheel in sorted(dest.glob("*.whl")):
        if wheel_project(wheel.name) in IMAGE_HAS:
            wheel.unlink()
        else:
            kept.append(wheel)
    by_project: dict[str, list[Path]] = {}
    for wheel in kept:  # one version of each project: the newest file name wins
        by_project.setdefault(wheel_project(wheel.name), []).append(wheel)
    for project, found in by_project.items():
        for old in sorted(found)[:-1]:
            old.unlink()
            kept.remove(old)
    total = sum(w.stat().st_size for w in kept)
    if total > budget:
        raise SystemExit(f"{dest} holds {total / 2**20:.1f} MiB of wheels, over the {budget / 2**20:.0f} MiB "
                         f"the device run may carry; biggest: "
                         + ", ".join(w.name for w in sorted(kept, key=lambda w: -w.stat().st_size)[:3]))
    print(f"{len(kept)} wheels, {total / 2**20:.1f} MiB, in {dest}", flush=True)
    return kept


# ------------------------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/gpu_run.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="the GPU run: OUT/gpu-run.tar.gz and OUT/summary.txt")
    r.add_argument("out", type=Path)
    r.add_argument("--dry-run", action="store_true", help="no GPU: stand-ins for the GPU phases, marked as such")
    r.add_argument("--chapters", nargs="+", default=list(CHAPTERS), help="chapters to execute (default: 00-10)")
    r.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="override a preset's parameter")
    r.add_argument("--python", default=sys.executable, help="the Python every phase runs with")
    r.add_argument("--stop-after", metavar="PHASE_OR_CHAPTER",
                   help="end this call after a phase (environment, gpu-tests, chapters, bench) or a chapter")
    r.add_argument("--resume", type=Path, metavar="ARCHIVE",
                   help="an earlier call's gpu-run.tar.gz: run only what it lacks, pack one archive of both")
    i = sub.add_parser("import", help="an archive from a GPU run -> book/data/recorded/ and book/data/bench/")
    i.add_argument("archive", type=Path)
    i.add_argument("--data", type=Path, default=ROOT / "book" / "data", help="where recorded/ and bench/ go")
    i.add_argument("--accept-failed", nargs="+", default=[], metavar="PHASE",
                   help="import although these phases failed (kept in meta.json)")
    w = sub.add_parser("wheels", help="download the wheels the GPU image lacks")
    w.add_argument("dest", type=Path, nargs="?", default=ROOT / ".wheels")
    args = ap.parse_args(argv)
    if args.what == "run":
        return run_all(args.out.resolve(), args.dry_run, args.chapters, args.set, args.python, args.stop_after,
                       args.resume.resolve() if args.resume else None)
    if args.what == "import":
        try:
            written = import_archive(args.archive, args.data, tuple(args.accept_failed))
        except Refused as err:
            print(f"gpu-import refused {args.archive}: {err}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path.relative_to(args.data.parent) if args.data.parent in path.parents else path}")
        manifest, members = read_archive(args.archive)
        lacks = lacking(manifest, members)
        if lacks:
            print(f"partial: {args.archive} lacks {lacks} (a later call with --resume adds them)")
        return 0
    wheels(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
