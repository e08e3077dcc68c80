"""What each rank runs in chapter 11 and its tests.

Every function here is a rank program for ``kernels.parallel.ranks.Ranks(world).run(fn, case, ...)``: it
is called as ``fn(rank, world, case, ...)`` inside a joined process group, draws the same whole
inputs on every rank from ``case.seed``, takes its own shard, and returns plain data (shards,
trace paths) for the parent to gather. ``Case`` says the shapes; ``gather`` puts the
ranks' shards back in sequence order; ``judge_ring`` / ``judge_ulysses`` gather and judge them
against the float64 reference (``kernels.reference.judge``: fp32 within ~1e-5, 16-bit by
FlashAttention's rule).

PyTorch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
shards SDPA over a DTensor device mesh; on a CPU it refuses (torch 2.13: the CPU flash
operator has no sharding strategy registered), so ``torch_context_parallel`` runs only where
each rank has a GPU, and says why otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from kernels import reference
from kernels.dtypes import parse_dtype
from kernels.parallel import ring
from kernels.parallel import ulysses
from kernels.trace.record import quiet_kineto

SCHEMES = ("ring", "ulysses")


@dataclass(frozen=True)
class Case:
    """One attention problem, split over the ranks."""

    batch: int = 1
    heads: int = 4
    kv_heads: int = 4
    seq: int = 256
    head_dim: int = 32
    dtype: str = "float32"
    causal: bool = True
    layout: str = "zigzag"
    seed: int = 0
    device: str = "cpu"

    def whole(self):
        """The whole q, k, v (and a gradient of the output), the same on every rank."""
        g = torch.Generator().manual_seed(self.seed)
        dt = parse_dtype(self.dtype)

        def draw(heads):
            return torch.randn(self.batch, heads, self.seq, self.head_dim, generator=g).to(self.device, dt)

        return draw(self.heads), draw(self.kv_heads), draw(self.kv_heads), draw(self.heads)

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)


def _device(case: Case, rank: int) -> Case:
    """On GPUs each rank uses its own device (kernels.parallel.ranks set it as current)."""
    return case.with_(device=f"cuda:{torch.cuda.current_device()}") if case.device.startswith("cuda") else case


# ----------------------------------------------------------------------------- correctness

def ring_check(rank: int, world: int, case: Case, backward: bool = True) -> dict:
    """This rank's output shard (and its shards of dq, dk, dv) for ``case``."""
    case = _device(case, rank)
    q, k, v, grad_out = case.whole()
    mine = [ring.shard(t, rank, world, case.layout).requires_grad_(backward) for t in (q, k, v)]
    out = ring.ring_attention(*mine, seq_len=case.seq, causal=case.causal, layout=case.layout, timeout_s=60)
    result = {"out": out.detach().cpu()}
    if backward:
        out.backward(ring.shard(grad_out, rank, world, case.layout))
        grads = [t.grad for t in mine]
        assert all(g is not None for g in grads), "backward reached every input shard"
        result.update({name: g.cpu() for name, g in zip(("dq", "dk", "dv"), grads) if g is not None})
    return result


def ulysses_check(rank: int, world: int, case: Case) -> dict:
    case = _device(case, rank)
    q, k, v, _ = case.whole()
    with torch.no_grad():
        out = ulysses.ulysses_attention(*(ring.shard(t, rank, world, "contiguous") for t in (q, k, v)),
                                        seq_len=case.seq, causal=case.causal)
    return {"out": out.cpu()}


def gather(results: list[dict], name: str, layout: str) -> torch.Tensor:
    """The whole tensor ``name`` from every rank's result, in sequence order."""
    return ring.unshard([r[name] for r in results], layout)


def judge_ring(results: list[dict], case: Case) -> reference.Judgement:
    """Every rank's shards gathered and judged against the float64 reference (output and gradients)."""
    q, k, v, grad_out = case.with_(device="cpu").whole()
    grads = tuple(gather(results, n, case.layout) for n in ("dq", "dk", "dv")) if "dq" in results[0] else None
    return reference.judge(gather(results, "out", case.layout), q, k, v, causal=case.causal,
                           grads=grads, grad_out=grad_out if grads else None)


def judge_ulysses(results: list[dict], case: Case) -> reference.Judgement:
    q, k, v, _ = case.with_(device="cpu").whole()
    return reference.judge(gather(results, "out", "contiguous"), q, k, v, causal=case.causal)


def check_cases(group, cases: list[Case], device: str, dtype: str):
    """Run ``ring_check`` (forward and backward) for each case on ``group`` (a
    ``kernels.parallel.ranks.Ranks``), gather and judge every rank's shards: one row per case
    with its shape, each tensor's error / bound, and whether all passed."""
    import pandas as pd

    rows = []
    for case in cases:
        judged = judge_ring(group.run(ring_check, case.with_(device=device, dtype=dtype)), case.with_(dtype=dtype))
        rows.append({"layout": case.layout, "causal": case.causal, "S": case.seq, "Hq:Hkv": f"{case.heads}:{case.kv_heads}",
                     **{name: f"{v.error:.1e} / {v.bound:.1e}" for name, v in judged.items()}, "ok": judged.ok})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- one forward, each scheme

def _forward(scheme: str, rank: int, world: int, case: Case):
    """A function running one forward of ``scheme`` on this rank's shard (inputs drawn once)."""
    q, k, v, _ = case.whole()
    if scheme == "ring":
        mine = [ring.shard(t, rank, world, case.layout) for t in (q, k, v)]
        return lambda: ring.ring_attention(*mine, seq_len=case.seq, causal=case.causal, layout=case.layout,
                                           timeout_s=60)
    if scheme == "ulysses":
        mine = [ring.shard(t, rank, world, "contiguous") for t in (q, k, v)]
        return lambda: ulysses.ulysses_attention(*mine, seq_len=case.seq, causal=case.causal)
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def profile_scheme(rank: int, world: int, case: Case, scheme: str, trace_dir: str, active: int = 5,
                   warmup: int = 1) -> dict:
    """Profile ``active`` forwards of ``scheme`` on this rank, each started after a barrier and
    ended, inside its ``<scheme> forward`` label, by another in a ``step:wait barrier`` range (where
    an early rank waits for the slowest); the trace goes to ``trace_dir/rank-<rank>.json.gz``."""
    import torch.distributed as dist

    case = _device(case, rank)
    step = _forward(scheme, rank, world, case)
    path = Path(trace_dir) / f"rank-{rank}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device.startswith("cuda") else [])
    with quiet_kineto(), torch.no_grad(), torch.profiler.profile(
            activities=activities, schedule=schedule(wait=0, warmup=warmup, active=active, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)), record_shapes=True) as prof:
        for _ in range(warmup + active):
            dist.barrier()  # outside the label: every rank starts the step together
            with record_function(f"{scheme} forward"):
                step()
                if case.device.startswith("cuda"):
                    torch.cuda.synchronize()
                # The step ends at a barrier, as a training step ends at its next collective: a
                # rank that finished early waits here, inside the step, where the trace shows it.
                with record_function("step:wait barrier"):
                    dist.barrier()
            prof.step()
    return {"rank": rank, "trace": str(path)}


# ----------------------------------------------------------------------------- PyTorch's own

def torch_context_parallel_reason(device: str) -> Optional[str]:
    """None where PyTorch's context_parallel can run the comparison, else why not, in words."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return ("PyTorch's context_parallel shards SDPA's CUDA kernels over a DTensor mesh; on a CPU it refuses "
                "(the CPU flash operator, aten._scaled_dot_product_flash_attention_for_cpu, has no sharding "
                "strategy registered), so the comparison needs one GPU per rank")
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as err:
        return f"this torch has no torch.distributed.tensor.experimental.context_parallel ({err})"
    return None


def torch_context_parallel(rank: int, world: int, case: Case) -> dict:
    """PyTorch's context_parallel on this rank's GPU, for the same case: its output shard, in its
    own (round-robin) layout put back in sequence order by PyTorch. Only where each rank has a GPU."""
    reason = torch_context_parallel_reason(case.device)
    if reason is not None:
        raise RuntimeError(reason)
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    case = _device(case, rank)
    q, k, v, _ = case.whole()
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    with torch.no_grad(), context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
    (whole,) = context_parallel_unshard(mesh, [out], [2])
    return {"out": whole.cpu()}


def profiled(group, case: Case, scheme: str, folder: str, active: int):
    """Profile ``scheme`` ("ring" or "ulysses") on every rank of ``group`` (``profile_scheme``,
    ``active`` forwards) and load the rank traces it wrote to ``folder``."""
    from kernels.parallel import rank_traces

    group.run(profile_scheme, case, scheme, folder, active)
    return rank_traces.load_ranks(folder)


def sent_bytes(case: Case, world: int, totals: dict, active: int):
    """Bytes one rank sends per forward, for the ring and Ulysses: predicted from ``case``'s shapes
    (``ring_bytes_per_rank``, ``ulysses_bytes_per_rank``) and summed from the traces (``totals``: {"ring": ..., "ulysses": ...},
    ``rank_traces.step_totals`` over ``active`` steps; the median rank)."""
    import pandas as pd

    if set(totals) != {"ring", "ulysses"}:
        raise ValueError(f"totals must hold 'ring' and 'ulysses', got {sorted(totals)}")
    element = parse_dtype(case.dtype).itemsize
    shape = (case.batch, case.kv_heads, case.seq, case.head_dim, world, element)
    predicted = {"ring": ring.ring_bytes_per_rank(*shape),
                 "ulysses": ulysses.ulysses_bytes_per_rank(case.batch, case.heads, case.kv_heads, *shape[2:])}
    measured = {s: int(t["sent_bytes"].median()) // active for s, t in totals.items()}
    return pd.DataFrame({"from the shapes (bytes)": predicted, "in the traces (bytes)": measured})
