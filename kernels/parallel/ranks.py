"""Run a function on N processes joined in one ``torch.distributed`` process group.

``Ranks(world)`` spawns ``world`` fresh processes (``spawn``, so it works from a notebook),
joins them in one group over a free TCP port (gloo on a CPU, NCCL with one GPU per rank),
and ``ranks.run(fn, *args)`` returns ``fn(rank, world, *args)`` of each rank, in rank order.
Nothing is left hanging: every op of the group has a timeout, each run a deadline
(:class:`RankTimeout`); a rank that raises or dies ends the run with :class:`RankFailed` naming
it; ``close()`` ends every process. ``fn`` must be importable by name, and its result travels
back by ``torch.save``.
"""
from __future__ import annotations

import io
import os
import queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch

STARTUP_S = 60.0  # what a fresh process may take to import torch and join, on top of timeout_s
POLL_S = 0.05
GRACE_S = 1.0  # after a rank's error, how long to look for a rank that died (the real cause)


class RankFailed(RuntimeError):
    """A rank raised, or its process died, before the run finished."""


class RankTimeout(RankFailed):
    """The run passed its deadline with ranks still running."""


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it), for the group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_backend(world: int) -> str:
    """NCCL where every rank can have a GPU of its own, gloo otherwise (NCCL refuses two ranks
    on one GPU)."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"


class Ranks:
    """``world`` rank processes joined in one process group, kept for many ``run`` calls.

    Starting a process that imports torch takes seconds; a chapter that runs a dozen rank
    programs starts its ranks once: ``with Ranks(2) as ranks: ranks.run(fn, *args)``. A run that
    fails (a rank raised, died or timed out) closes the whole group, since a group missing a
    rank, or with messages left in flight, cannot be trusted again: open a new one. ``close()``
    (or leaving the ``with``) ends every process; a rank whose parent has gone exits on its own.
    ``threads`` is each rank's ``torch.set_num_threads`` (one per rank keeps N ranks from
    fighting over N cores).
    """

    def __init__(self, world: int, *, timeout_s: float = 60.0, backend: str | None = None, threads: int = 1):
        if not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be a positive int (the number of ranks), got {world!r}")
        import torch.multiprocessing as mp

        self.world, self.timeout_s = world, float(timeout_s)
        self.backend = backend or default_backend(world)
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world)]
        port = free_port()  # the rendezvous: rank 0 listens there, the others connect
        self._procs = [ctx.Process(target=_rank_main, name=f"rank-{rank}", daemon=True,
                                   args=(rank, world, port, self.backend, self.timeout_s, threads,
                                         self._tasks[rank], self._results))
                       for rank in range(world)]
        self._next_id = 0
        self.closed = False
        try:
            for p in self._procs:
                p.start()
            self._collect(task_id=-1, deadline=time.monotonic() + STARTUP_S + self.timeout_s)  # every rank joined
        except BaseException:
            self.close()
            raise

    def alive(self) -> list[int]:
        """The ranks whose processes are still running (none once the group is closed)."""
        return [rank for rank, p in enumerate(self._procs) if p.is_alive()]

    def run(self, fn: Callable[..., Any], *args, timeout_s: float | None = None) -> list:
        """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each on its rank's process."""
        if self.closed:
            raise RankFailed("this group of ranks is closed (a run failed, or close() was called): open a new Ranks")
        _check_sendable(fn)
        self._next_id += 1
        for tasks in self._tasks:
            tasks.put((self._next_id, fn, args))
        try:
            return self._collect(self._next_id, deadline=time.monotonic() + (timeout_s or self.timeout_s))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ask every rank to leave the group and exit; end by force whatever has not within seconds."""
        if self.closed:
            return
        self.closed = True
        for p, tasks in zip(self._procs, self._tasks):
            if p.is_alive():
                tasks.put(None)
        _end(self._procs, patience_s=2.0)
        for q in self._tasks + [self._results]:
            q.close()
            q.join_thread()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "closed", True):
            self.close()

    def _collect(self, task_id: int, deadline: float) -> list:
        got: dict[int, Any] = {}
        errors: dict[int, str] = {}
        procs = self._procs
        while len(got) < len(procs):
            try:
                tid, rank, status, payload = self._results.get(timeout=POLL_S)
            except queue.Empty:
                dead = _dead(procs, got, errors)
                if dead:
                    raise RankFailed(_died_message(procs, dead, errors))
                if time.monotonic() > deadline:
                    waiting = [r for r in range(len(procs)) if r not in got]
                    what = "to start and join the group" if task_id < 0 else "to finish"
                    raise RankTimeout(f"ranks {waiting} took longer than the {self.timeout_s:g} s timeout {what}: "
                                      "a rank is stuck, or waits on a message nobody sends")
                continue
            if tid != task_id:
                continue  # a late answer to an earlier, failed run
            if status == "ok":
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                continue
            errors[rank] = payload
            # Another rank's death is often the cause of this one's error: give it a moment to show.
            end = time.monotonic() + GRACE_S
            while time.monotonic() < end and not _dead(procs, got, errors):
                time.sleep(POLL_S)
            dead = _dead(procs, got, errors)
            raise RankFailed(_died_message(procs, dead, errors) if dead else _error_message(errors))
        return [got[r] for r in range(len(procs))]


def _check_sendable(fn) -> None:
    if not callable(fn) or getattr(fn, "__qualname__", "<lambda>") != getattr(fn, "__name__", None) \
            or getattr(fn, "__module__", "__main__") in ("__main__", None):
        raise ValueError(f"{fn!r} cannot be sent to a spawned process: pass a module-level function of an "
                         "importable module (not a lambda, a nested function, or one defined in a notebook)")


def _rank_main(rank, world, port, backend, timeout_s, threads, tasks, results) -> None:
    """One rank: join the group, then run tasks until told to stop (None) or the parent is gone."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    parent = os.getppid()
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        results.put((-1, rank, "ok", _dumps(None)))
        while True:
            try:
                task = tasks.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:  # orphaned (the notebook's kernel was killed): leave
                    return
                continue
            if task is None:
                return
            task_id, fn, args = task
            try:
                results.put((task_id, rank, "ok", _dumps(fn(rank, world, *args))))
            except BaseException as err:  # report everything: the parent decides
                results.put((task_id, rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"))
                return  # the group is not to be trusted after a failure
    except BaseException as err:
        results.put((-1, rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _dumps(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _dead(procs, got, errors) -> list[int]:
    """Ranks whose process has exited without reporting."""
    return [r for r, p in enumerate(procs) if p.exitcode is not None and r not in got and r not in errors]


def _died_message(procs, dead, errors) -> str:
    lines = [f"rank {r} died (exit code {procs[r].exitcode}) before finishing its step" for r in dead]
    if errors:
        lines.append("then: " + _error_message(errors))
    return "; ".join(lines)


def _error_message(errors: dict) -> str:
    return "; ".join(f"rank {r} raised {text.strip()}" for r, text in sorted(errors.items()))


def _end(procs, patience_s: float = 0.0) -> None:
    """Stop every process started: wait ``patience_s`` for them to exit, terminate, then kill."""
    end = time.monotonic() + patience_s
    for p in procs:
        if p.pid is not None:
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is None:
            continue
        p.join(timeout=3)
        if p.is_alive():
            p.kill()
            p.join(timeout=3)

