"""Chapter 9: one training step of attention, and what its trace says about the backward.

``training_step`` makes the profiled function (forward, then ``backward()`` with a fixed output
gradient, gradients dropped first as ``optimizer.zero_grad()`` does). The readers take a
profiled step (``kernels.trace.reader.Step``) apart at the moment the autograd engine started:
``backward_nodes`` lists the engine's nodes, ``threads_table`` the threads on either side,
``kept_table`` the S×S buffers the forward left alive for the backward (from the trace's
memory events and, independently, from autograd's saved-tensor hooks), ``recompute_table`` the
matmuls and S×S allocations of each half.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pandas as pd
import torch

from kernels.registry import get

if TYPE_CHECKING:
    from kernels.trace.reader import Step

# The name the profiler gives each autograd node the engine runs.
NODE_PREFIX = "autograd::engine::evaluate_function: "
# Nodes that move no numbers: views, reshapes, and the AccumulateGrad that stores a leaf's gradient.
BOOKKEEPING = ("View", "Expand", "UnsafeView", "ReshapeAlias", "Transpose", "torch::autograd::AccumulateGrad")
# The node each forward op of chapter 1's module leaves in the autograd graph.
GRAD_FN_OF = {"aten::matmul": "BmmBackward0", "aten::mul": "MulBackward0", "aten::masked_fill": "MaskedFillBackward0",
              "aten::softmax": "SoftmaxBackward0"}


def training_step(name: str, grad_out: torch.Tensor) -> Callable:
    """One forward + backward of the implementation ``name`` (``kernels.get``), with ``grad_out``
    as the output's gradient; each call first drops q, k and v's gradients."""
    attention = get(name)

    def step(q, k, v):
        for t in (q, k, v):
            t.grad = None                 # what optimizer.zero_grad() does
        attention(q, k, v, causal=True).backward(grad_out)

    step.__name__ = f"{name}_training_step"
    return step


def step_inputs(batch: int, heads: int, seq: int, head_dim: int, dtype=torch.float32, device="cpu") -> tuple:
    """q, k, v (requiring grad) and a fixed output gradient, of shape [batch, heads, seq, head_dim]:
    what ``training_step`` is called with (``kernels.notebook.inputs``, seeds 0 and 1)."""
    from kernels.notebook import inputs

    q, k, v = inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
    return q, k, v, inputs(batch, heads, seq, head_dim, dtype=dtype, device=device, seed=1)[0]


def backward_start(step: "Step") -> float:
    """When the backward began: the first op the autograd engine ran, on any thread."""
    ops = step.ops
    engine = ops.loc[ops["name"].str.startswith("autograd::engine"), "ts"]
    if engine.empty:
        raise ValueError(f"{step.label}: no autograd engine op in this step (was backward() called?)")
    return float(engine.min())


def backward_nodes(step: "Step", bookkeeping: bool = False) -> list[str]:
    """The autograd nodes the engine ran, in order, by name; without ``bookkeeping`` only those
    that compute (no views, reshapes or AccumulateGrad)."""
    ops = step.ops
    nodes = ops.loc[ops["name"].str.startswith(NODE_PREFIX), "name"].str.removeprefix(NODE_PREFIX).tolist()
    return nodes if bookkeeping else [n for n in nodes if not n.startswith(BOOKKEEPING)]


def forward_grad_fns(step: "Step") -> list[str]:
    """The nodes the forward's top-level ops imply (``GRAD_FN_OF``), in the reverse of the forward's
    order: what the engine should run if the backward is one node per op, last op first."""
    top = [n for n in step.top_level()["name"] if not n.startswith("autograd::")]
    unknown = sorted(set(top) - set(GRAD_FN_OF))
    if unknown:
        raise ValueError(f"{step.label}: no known autograd node for {unknown}")
    return [GRAD_FN_OF[n] for n in reversed(top)]


def threads_table(steps: Mapping[str, "Step"]) -> pd.DataFrame:
    """Per step: the thread of its label, and the threads its ops ran on before and after the
    backward began."""
    rows = []
    for name, s in steps.items():
        before = s.ops["ts"] < backward_start(s)
        rows.append({"variant": name, "label's thread": s.thread[1],
                     "forward ops' threads": sorted(set(s.ops.loc[before, "tid"])),
                     "backward ops' threads": sorted(set(s.ops.loc[~before, "tid"]))})
    return pd.DataFrame(rows).set_index("variant")


def square_sizes(shape: Sequence[int], element_size: int, upcast: bool = False) -> set[int]:
    """Bytes of one S×S tensor per head of q's ``shape`` [B, H, S, D], in the input's element size
    and, with ``upcast`` (the math backend with 16-bit inputs), in float32 too."""
    b, h, s, _ = shape
    return {b * h * s * s * e for e in {element_size, 4 if upcast else element_size}}


def saved_by_autograd(fn: Callable, q, k, v) -> list[tuple]:
    """What one forward of ``fn`` hands autograd to keep, as ``torch.autograd.graph.saved_tensors_hooks``
    sees it: (shape, dtype, storage pointer, storage bytes) per saved tensor."""
    seen = []

    def pack(t):
        storage = t.untyped_storage()
        seen.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), storage.data_ptr(), storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        fn(q, k, v, causal=True)
    return seen


def _unpack(t):
    return t


def kept_table(steps: Mapping[str, "Step"], inputs_by_name: Mapping[str, tuple]) -> pd.DataFrame:
    """Per variant: the S×S buffers allocated in the forward and not freed when the backward began
    (the trace's memory events), the distinct S×S storages autograd saved (the hooks), the bytes
    alive at the backward, and the shapes saved. ``inputs_by_name[name]`` is that step's (q, k, v, ...)."""
    rows = []
    for name, s in steps.items():
        q, k, v = inputs_by_name[name][:3]
        sizes = square_sizes(q.shape, q.element_size(), upcast=name == "sdpa_math")
        memory = s.memory[s.memory["ts"] < backward_start(s)]
        saved = saved_by_autograd(get(name), q, k, v)
        rows.append({"variant": name,
                     "S×S kept (trace)": int(memory["bytes"].isin(sizes).sum() - (-memory["bytes"]).isin(sizes).sum()),
                     "S×S saved (hooks)": len({(ptr, nb) for _, _, ptr, nb in saved if nb in sizes}),
                     "alive at backward (MiB)": round(int(memory["bytes"].sum()) / 2**20, 3),
                     "shapes saved": sorted({shape for shape, *_ in saved})})
    return pd.DataFrame(rows).set_index("variant")


def per_row_shapes(shapes_saved: Sequence[tuple], q_shape: Sequence[int]) -> list[tuple]:
    """The saved shapes with about one value per query row: at least B·H·S elements, fewer than q
    (the log-sum-exp a fused forward keeps, whatever padding its layout adds)."""
    b, h, s, d = q_shape
    return [shape for shape in shapes_saved if b * h * s <= math.prod(shape) < b * h * s * d]


def recompute_table(steps: Mapping[str, "Step"], inputs_by_name: Mapping[str, tuple]) -> pd.DataFrame:
    """Per variant: ``aten::bmm`` calls in the forward and in the backward, the S×S allocations the
    backward made, and its largest allocation (KiB)."""
    rows = []
    for name, s in steps.items():
        q = inputs_by_name[name][0]
        t0 = backward_start(s)
        fwd, bwd = s.ops[s.ops["ts"] < t0], s.ops[s.ops["ts"] >= t0]
        m_bwd = s.memory[(s.memory["ts"] >= t0) & (s.memory["bytes"] > 0)]
        rows.append({"variant": name, "bmm in forward": int((fwd["name"] == "aten::bmm").sum()),
                     "bmm in backward": int((bwd["name"] == "aten::bmm").sum()),
                     "S×S allocations in backward": int(m_bwd["bytes"].isin(
                         square_sizes(q.shape, q.element_size(), upcast=name == "sdpa_math")).sum()),
                     "largest backward allocation (KiB)": round(float(m_bwd["bytes"].max()) / 1024, 1)})
    return pd.DataFrame(rows).set_index("variant")
