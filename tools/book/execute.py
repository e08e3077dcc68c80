"""Execute the book: every notebook of ``_toc.yml``, in order, with papermill.

    python -m tools.book.execute                   # preset "auto": cuda if a GPU is visible, else cpu
    python -m tools.book.execute --preset cpu --only book/01 book/02   # some chapters
    python -m tools.book.execute --jobs 1          # one notebook at a time (default: 2 on a CPU, 1 on a GPU)
    python -m tools.book.execute --build           # then build the HTML with Jupyter Book

The runner copies the book into ``--out`` (default ``_build/executed``; the sources are never
written to), executes each notebook there with a preset's chapter parameters (the checkout's
``kernels/presets.yml``) and its own ``trace_dir``, fails a notebook whose traces break their
budget (``tools.book.publish``), and writes ``report.json`` and ``report.md`` (device,
versions, seconds and status per notebook). With ``--cache`` an unchanged notebook is restored
instead of executed (``tools.book.cache``); ``--build`` is ``tools.book.html.build``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from kernels.presets import chapter_parameters, load_presets, resolve_preset
from tools.book import publish
from tools.book.cache import cache_key, cache_restore, cache_store, library_digest
from tools.book.html import build
from tools.book.layout import COPIED, ROOT, UNSOLVED, find_root, notebooks, select


# ---------------------------------------------------------------------------------- presets

def book_preset(name: str, root: Path = ROOT, cuda_available: bool | None = None) -> tuple[str, dict]:
    """The preset's name and chapter parameters, from the presets of the checkout being built
    (``root/kernels/presets.yml``, so a test's book can bring its own); an unknown name exits."""
    try:
        name, preset = resolve_preset(name, load_presets(root / "kernels" / "presets.yml"), cuda_available)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    return name, chapter_parameters(preset)


def default_jobs(params: dict) -> int:
    """Notebooks executed at once when ``--jobs`` is not given: one on a GPU, whose timings
    need the device to themselves, and on a CPU two where there are two cores (README gives
    the measured times). Two CPU notebooks share the
    machine, so their timings are noisier; the chapters' timing lessons check their spread
    and say so when it was too noisy to tell."""
    if params.get("device") == "cuda":
        return 1
    return max(1, min(2, os.cpu_count() or 1))


def threads_per_job(jobs: int) -> int:
    """Each of ``jobs`` processes sharing this machine's cores gets this many threads."""
    return max(1, (os.cpu_count() or 1) // jobs)


def share_cores(jobs: int) -> None:
    """Give each of ``jobs`` notebooks executing at once its share of the cores. The kernels
    papermill starts inherit this environment; left alone, each torch would start one thread
    per core, the notebooks' threads would outnumber the cores, and every large op would wait
    for a descheduled thread (seen as noise in the timings)."""
    threads = str(threads_per_job(jobs))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = threads


def keep_inductor_cache(out: Path) -> str:
    """Point Inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR, inherited by the kernels papermill
    starts) at ``inductor-cache`` beside ``out``, so a rebuild of the book loads what the last build
    compiled instead of compiling again (chapters 7 and 8 compile). Unset only: a caller's own
    setting wins. Returns the folder Inductor will use."""
    return os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(out).resolve().parent / "inductor-cache"))


def environment() -> dict:
    """What executed the book: recorded in the report and shown on the book's build page.
    The device and versions come from ``kernels.hw.devices``, as a benchmark's do."""
    import torch  # here: the runner answers --help and stages the book without loading torch

    from kernels.hw import devices

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = devices.device_name(device)
    if device.type == "cpu":
        name = f"{name.removeprefix('CPU: ')} (CPU, {os.cpu_count()} cores)"
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **devices.versions(),
        "device": name,
        "capability": list(torch.cuda.get_device_capability(0)) if device.type == "cuda" else None,
        "torch_threads": torch.get_num_threads(),
    }


# -------------------------------------------------------------------------------- execution

def stage(root: Path, out: Path) -> None:
    """Copy the book's sources into ``out`` (fresh), where notebooks will be executed."""
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src, dst = root / name, out / name
        if dst.is_dir():
            shutil.rmtree(dst)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "traces"))
        else:
            shutil.copy2(src, dst)
    # The executed exercise notebooks carry `solutions = True` and the solutions; the pages'
    # downloads serve the learner's copies instead (no solutions: tools/book/convert.py).
    if (out / UNSOLVED).is_dir():
        shutil.rmtree(out / UNSOLVED)
    for notebook in (root / "book" / "exercises" / UNSOLVED).glob("*.ipynb"):
        target = out / UNSOLVED / "book" / "exercises" / notebook.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, target)


def notebook_parameters(path: Path, params: dict) -> dict:
    """The preset's parameters, plus ``solutions=True`` for exercise notebooks: the book is
    built with every exercise solved, so the checks themselves are executed and tested."""
    if "exercises" in path.parts:
        return {**params, "solutions": True}
    return params


def ipc_kernel_manager():
    """A kernel manager whose kernel talks over local sockets in a temporary folder.

    ipykernel warns on every start that TCP carries the session unencrypted; a kernel that
    only this process talks to needs no network at all, and the warning (15 per build) goes.
    """
    import tempfile
    import uuid

    from jupyter_client.manager import KernelManager

    class IPCKernelManager(KernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", str(Path(tempfile.gettempdir()) / f"ap-kernel-{uuid.uuid4().hex[:12]}"))
            super().__init__(**kwargs)

    return IPCKernelManager


def execute_one(path: Path, out: Path, params: dict, progress: bool) -> dict:
    """Run one staged notebook in place; return its row of the report."""
    import papermill as pm

    nb = out / path
    start = time.perf_counter()
    row: dict[str, object] = {"notebook": str(path), "status": "ok", "seconds": None, "error": None}
    try:
        pm.execute_notebook(str(nb), str(nb), parameters=params, cwd=str(nb.parent),
                            progress_bar=progress, log_output=False, report_mode=False,
                            kernel_manager_class=ipc_kernel_manager())
    except pm.PapermillExecutionError as err:
        row.update(status="failed", error=f"cell {err.exec_count}: {err.ename}: {err.evalue}")
    except Exception as err:  # a kernel that died, a missing kernel spec...: still a report row
        row.update(status="failed", error=f"{type(err).__name__}: {err}")
    row["seconds"] = round(time.perf_counter() - start, 1)
    off_the_page(nb)
    return row


def staged_parameters(path: Path, params: dict) -> dict:
    """Everything papermill injects into one notebook: the preset's parameters, its own trace folder."""
    return {**notebook_parameters(path, params), "trace_dir": publish.trace_dir_for(path)}


def execute_staged(path: Path, out: Path, params: dict, progress: bool) -> dict:
    """Execute one staged notebook with its own parameters and trace folder, then check the
    traces it wrote against the budgets; returns its report row."""
    return publish.enforce_budget(execute_one(path, out, staged_parameters(path, params), progress), out, path)


COLAB_TITLE = "#@title"


def off_the_page(nb_path: Path) -> None:
    """Take papermill's injected-parameters cell off the built page (tag remove-cell), as the
    parameters cell it overrides is: the page's setup box prints the values it ran with
    (``kernels.notebook.ran_with``), and the executed notebook a reader downloads keeps the cell.
    A solution's Colab title line (``#@title``: Colab folds the cell to it) leaves the page too,
    and the page's reading time counts what the run printed (``convert.restate_reading_time``)."""
    import nbformat

    from tools.book import convert

    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
        if "solution" in tags and cell.source.startswith(COLAB_TITLE):
            # Colab's title line folds a solution there; the page folds it itself, and shows code
            cell.source = cell.source.split("\n", 1)[1] if "\n" in cell.source else ""
    convert.restate_reading_time(nb.cells)
    nbformat.write(nb, nb_path)


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2))
    env = report["environment"]
    lines = [
        f"This copy of the book was executed on **{env['device']}** with the `{report['preset']}` preset, "
        f"on {env['date']}: torch {env['torch']}, Triton {env['triton'] or 'not installed'}, "
        f"CUDA {env['cuda'] or 'none (CPU build)'}, Python {env['python']}.",
        "",
        "| notebook | status | seconds |",
        "|---|---|---|",
    ]
    for r in report["notebooks"]:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error']}"
        if r.get("cached"):
            status += " (unchanged: restored from the execution cache)"
        lines.append(f"| `{r['notebook']}` | {status} | {r['seconds']} |")
    lines += ["", "Parameters of the preset:", "", "```yaml", yaml.safe_dump(report["parameters"]).strip(), "```"]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    (out / "book" / "execution_report.md").write_text(text)


def check_overrides(overrides: dict, params: dict, preset: str) -> dict:
    """``--set`` values, checked against the preset before anything runs: known keys only,
    each of the type the preset gives it (an int may stand for a float)."""
    for key, value in overrides.items():
        if key not in params:
            raise SystemExit(f"--set {key}=...: the {preset!r} preset has no parameter {key!r}; "
                             f"it has: {', '.join(params)}")
        want = type(params[key])
        ok = isinstance(value, want) and not (isinstance(value, bool) and want is not bool)
        if not ok and not (want is float and isinstance(value, int) and not isinstance(value, bool)):
            raise SystemExit(f"--set {key}={value!r}: {key} is a {want.__name__} in the {preset!r} preset "
                             f"(there it is {params[key]!r}), not a {type(value).__name__}")
    return overrides


def run(preset: str = "auto", only=None, out: Path = ROOT / "_build" / "executed",
        root: Path = ROOT, progress: bool | None = None, overrides: dict | None = None,
        jobs: int = 1, cache: Optional[Path] = None, force: bool = False) -> dict:
    """Stage, execute and report; returns the report (also written to ``out``).

    ``jobs > 1`` executes that many notebooks at once: faster, but the timings the chapters
    quote then share the machine (the CLI's default is ``default_jobs``: 1 on a GPU).

    ``cache`` (a folder; ``make book`` uses ``_build/cache``) keeps each executed notebook
    with its traces under a key of its source, its parameters, the library's source, the
    recordings and the machine's versions: a notebook whose key is unchanged is restored
    instead of executed (``force=True`` executes the chosen ones anyway), and with ``only``
    the others keep their cached results instead of becoming unexecuted copies.
    """
    name, params = book_preset(preset, root)
    params.update(check_overrides(overrides or {}, params, name))
    every = notebooks(root)
    chosen = select(every, only)
    progress = sys.stderr.isatty() if progress is None and jobs == 1 else bool(progress)
    stage(root, out)
    publish.stage_recorded(root, out)
    keep_inductor_cache(out)
    report: dict[str, Any] = {"preset": name, "parameters": params, "jobs": jobs, "environment": environment(),
                              "notebooks": []}
    if jobs > 1:  # each notebook's torch gets its share of the cores (share_cores)
        report["environment"]["torch_threads"] = threads_per_job(jobs)
    keys: dict[Path, str] = {}
    rows = {}
    if cache is not None:
        library = library_digest(root)
        keys = {path: cache_key(root, path, staged_parameters(path, params), library, report["environment"])
                for path in every}
        for path in every:
            if path not in chosen or not force:
                row = cache_restore(cache, keys[path], out, path)
                if row is not None:
                    rows[path] = row
    todo = [path for path in chosen if path not in rows]
    print(f"Executing {len(todo)} notebook(s) with the {name!r} preset on {report['environment']['device']}"
          + (f", {jobs} at a time" if jobs > 1 else "")
          + (f"; {len(rows)} unchanged since a cached run, restored" if rows else ""), flush=True)

    def show(i: int, row: dict) -> None:
        print(f"[{i}/{len(todo)}] {row['notebook']}: {row['status']} in {row['seconds']} s"
              + (f": {row['error']}" if row["error"] else ""), flush=True)

    if jobs <= 1:
        for i, path in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {path} ...", flush=True)
            rows[path] = execute_staged(path, out, params, progress)
            show(i, rows[path])
    else:
        # Processes, not threads: papermill runs each kernel from the notebook's folder by
        # changing the *process's* working directory, which threads would share and race on.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=share_cores, initargs=(jobs,)) as pool:
            futures = {pool.submit(execute_staged, path, out, params, False): path for path in todo}
            for i, done in enumerate(as_completed(futures), 1):
                rows[futures[done]] = done.result()
                show(i, rows[futures[done]])
    for path in todo:
        if cache is not None and rows[path]["status"] == "ok":
            cache_store(cache, keys[path], out, path, rows[path])
    report["notebooks"] = [rows.get(path) or {"notebook": str(path), "status": "not executed", "seconds": None,
                                               "error": "not chosen by --only, and no cached result"}
                           for path in every if path in rows or path in chosen or cache]
    write_report(out, report)
    failed = [r for r in report["notebooks"] if r["status"] == "failed"]
    print(f"{len(todo) - len(failed)} executed ok, {len(failed)} failed; report: {out / 'report.md'}", flush=True)
    return report


def main(argv=None, root: Optional[Path] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if root is None:
        given = argv[argv.index("--root") + 1] if "--root" in argv[:-1] else None
        root = find_root(Path(given) if given else None)
    ap = argparse.ArgumentParser(prog="python -m tools.book.execute", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, help="the course checkout (default: found from the working directory up)")
    ap.add_argument("--preset", default="auto", help="preset from kernels/presets.yml: cpu, cuda or auto")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="execute only notebooks whose name contains NAME")
    ap.add_argument("--out", type=Path, default=root / "_build" / "executed", help="where executed copies go")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="override a preset's parameter (YAML value), e.g. --set seq=256")
    ap.add_argument("--build", action="store_true", help="then build the HTML into _build/html")
    ap.add_argument("--jobs", type=int, default=None,
                    help="notebooks executed at once (default: 1 with the cuda preset, 2 on a CPU with two cores; "
                         "1 gives every timing the machine to itself)")
    ap.add_argument("--cache", type=Path, default=root / "_build" / "cache",
                    help="the execution cache (default _build/cache): unchanged notebooks are restored, not re-run")
    ap.add_argument("--no-cache", action="store_true", help="execute without reading or writing the cache")
    ap.add_argument("--force", action="store_true", help="execute the chosen notebooks even if the cache has them")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set takes KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    jobs = args.jobs if args.jobs is not None else default_jobs(book_preset(args.preset, root)[1])
    report = run(args.preset, args.only, args.out.resolve(), root=root, overrides=overrides, jobs=jobs,
                 cache=None if args.no_cache else args.cache.resolve(), force=args.force)
    if any(r["status"] == "failed" for r in report["notebooks"]):
        return 1
    if args.build:
        missing = [r["notebook"] for r in report["notebooks"] if r["status"] != "ok"]
        if missing or len(report["notebooks"]) < len(notebooks(root)):
            print(f"--build publishes the whole book, and {len(missing) or 'some'} notebook(s) have no executed "
                  f"result ({', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}): run without --only, "
                  "or with the cache", file=sys.stderr)
            return 1
        html = build(args.out.resolve(), html_parent=root)
        print(f"HTML: {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
