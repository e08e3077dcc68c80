"""GPU traces recorded by others on real GPUs, shown where the book has no recording of its own.

Until the course's own GPU run is recorded (``kernels.recorded``), a page about GPU tracks can
still show real ones:

- ``ALEXNET_FORWARD``: one forward of AlexNet on an A100, from Meta's HolisticTraceAnalysis
  project (its test data, MIT licence);
- ``COMPILED_POINTWISE``: one call of a function compiled by torch.compile on an A100 (one
  Inductor-generated Triton kernel), and ``TRAINING_STEP``: one data-parallel training step of a
  convolutional network on an A100 (forward, backward and NCCL's all-reduce), both from the
  same project;
- ``TRACELENS``: one inference step of Hugging Face models in bfloat16 on an NVIDIA H100 and an
  AMD MI300X (BERT-small, Qwen1.5-0.5B, a ViT image classifier, TimeSformer), and one decode step
  of SGLang serving Qwen3-8B on an MI300X, from the test data of AMD's TraceLens (MIT licence),
  sanitised, each trimmed to its profiler step by ``tools/trim_trace.py``; ``SGLANG_DECODE_CAPTURE``:
  the same SGLang run capturing that decode step's graph, whose ops record the attention's heads.

Every use says who recorded it, the model and its input, the GPU and torch version (read from
the trace itself, not typed here), the licence, and that it is not this book's run:
``credit(trace)``.

The files live in ``book/data/borrowed/`` (in an installed package, ``kernels/data/borrowed``),
with the licence notices beside them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Protocol

from kernels.trace.reader import Step, Trace, load_trace

PACKAGE = Path(__file__).resolve().parent


def root() -> Path:
    """The folder of borrowed traces: the checkout's book/data, else the installed package's data."""
    checkout = PACKAGE.parent / "book" / "data" / "borrowed"
    return checkout if checkout.is_dir() else PACKAGE / "data" / "borrowed"


@dataclass(frozen=True)
class Borrowed:
    """One trace recorded by others, and what must be said whenever it is shown."""

    file: str
    label: Optional[str]  # the labelled range that is one step; None: its profiler step, else the whole trace
    what: str             # what was recorded, in words (the model and input where the trace has no metadata)
    recorded_by: str
    source: str           # where the file comes from
    licence: str

    def trace(self) -> Trace:
        path = root() / self.file
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the borrowed traces ship in book/data/borrowed "
                                    "(kernels/data/borrowed when installed)")
        return load_trace(path)

    def step(self, index: int = 0, trace: Optional[Trace] = None) -> Step:
        """The ``index``-th occurrence of the labelled range, as a step (a KeyError lists the labels);
        without a label, the ``index``-th profiler step, or the whole trace when it has none."""
        trace = trace if trace is not None else self.trace()
        if self.label is not None:
            return trace.steps(self.label)[index]
        steps = trace.profiler_steps()
        return steps[index] if steps else trace.whole()

    def gpu(self, trace: Trace) -> str:
        """The GPU the trace says it was recorded on (its deviceProperties), not what we typed."""
        names = sorted({p.get("name", "") for p in trace.device_properties if p.get("name")})
        if not names:
            raise ValueError(f"{self.file} names no GPU in its deviceProperties")
        return " and ".join(names)

    def model_and_input(self, trace: Trace) -> str:
        """The model and its input as the trace's own metadata records them, else ``what``."""
        meta = trace.raw.get("metadata") if isinstance(trace.raw, dict) else None
        experiment = (meta or {}).get("experiment") or {}
        if not experiment.get("repo_id"):
            return self.what
        shape = ((meta or {}).get("current_task") or {}).get("shape") or {}
        given = ", ".join(f"{k} {v}" for k, v in shape.items() if k != "tag")
        return (f"the model {experiment['repo_id']} ({experiment.get('pipeline_tag', 'a model')}, "
                f"{experiment.get('torch_dtype', 'dtype not recorded')}), harness settings "
                f"{given or 'not recorded'} (the tensor shapes say what ran)")

    def torch_version(self, trace: Trace) -> Optional[str]:
        """torch's version as the trace records it (None where it does not)."""
        meta = trace.raw.get("metadata") if isinstance(trace.raw, dict) else None
        return (meta or {}).get("torch_version")

    def credit(self, trace: Optional[Trace] = None) -> str:
        """The sentence that goes with the figure: who, what, on which GPU, with which torch,
        under which licence, and that it is not this book's run."""
        trace = trace if trace is not None else self.trace()
        what = self.model_and_input(trace)
        return (f"{what[0].upper()}{what[1:]}, recorded by {self.recorded_by} on an {self.gpu(trace)} "
                f"({self.torch_words(trace)}; {self.source}; {self.licence}): not this book's run.")

    def facts(self, trace: Optional[Trace] = None) -> str:
        """The credit's facts about this trace alone (what, GPU, torch, where from), for a box
        that says who recorded it and the licence once for all its traces (`recorded`)."""
        trace = trace if trace is not None else self.trace()
        what = self.model_and_input(trace)
        return f"{what[0].upper()}{what[1:]}, on an {self.gpu(trace)} ({self.torch_words(trace)}; {self.source})."

    def torch_words(self, trace: Trace) -> str:
        version = self.torch_version(trace)
        return f"torch {version}" if version else "torch version not recorded in the trace"

    @staticmethod
    def recorded(names, recorded_by: str, licence: str) -> str:
        """The credit's words for the traces ``names`` that one project recorded."""
        which = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return f"{which}: recorded by {recorded_by}; {licence}; not this book's run{'s' if len(names) > 1 else ''}."


class Credited(Protocol):
    """What a "Traces on this page" box needs of a trace: its credit (a ``Borrowed``, or a
    chapter's own record of traces it does not ship, as chapter 11's rank pair)."""

    def credit(self) -> str: ...


def traces_box_html(traces: Mapping[str, Credited]) -> str:
    """One "Traces on this page" box: once for each project the traces come from, the traces'
    short names (how figures and tables name them), who recorded them, the licence and that
    they are not this book's run; then, folded, each trace with what it recorded, on which GPU,
    with which torch and from where. A trace that is not a ``Borrowed`` gives its whole
    ``credit()`` in view."""
    import html

    if not traces:
        raise ValueError("traces_box needs at least one trace: {short name: Borrowed}")
    items: list[str] = []
    projects: dict[tuple[str, str], list[str]] = {}
    whole: list[str] = []
    for name, trace in traces.items():
        if isinstance(trace, Borrowed):
            items.append(f"<li><b>{html.escape(name)}</b>: {html.escape(trace.facts())}</li>")
            projects.setdefault((trace.recorded_by, trace.licence), []).append(name)
        else:
            whole.append(f"<b>{html.escape(name)}</b>: {html.escape(trace.credit())}")
    who = "".join(f'<p class="ap-traces-who">{line}</p>' for line in
                  [html.escape(Borrowed.recorded(names, by, licence)) for (by, licence), names in projects.items()]
                  + whole)
    if not items:
        return f'<div class="ap-traces" role="note"><p class="ap-traces-title">Traces on this page</p>{who}</div>'
    # Who recorded which traces stays in view; what each one recorded (model, input, GPU,
    # torch, where the copy comes from) is a reference a reader opens when a figure needs it.
    return ('<div class="ap-traces" role="note"><p class="ap-traces-title">Traces on this page</p>'
            f'{who}<details class="ap-traces-facts"><summary>What each trace recorded</summary>'
            f"<ul>{''.join(items)}</ul></details></div>")


def traces_box(traces: Mapping[str, Credited]) -> None:
    """Show the page's one "Traces on this page" box (see ``traces_box_html``); in plain Python,
    one line a trace."""
    from kernels.notebook import in_notebook

    if not in_notebook():
        for name, trace in traces.items():
            print(f"{name}: {trace.credit()}")
        return
    from IPython.display import display

    text = "\n".join(f"{name}: {trace.credit()}" for name, trace in traces.items())
    display({"text/plain": text, "text/html": traces_box_html(traces)}, raw=True)


def _hta(file: str, what: str, label: Optional[str] = None, how: str = "") -> Borrowed:
    """One of HolisticTraceAnalysis's test traces (``how``: what was done to the copy, if anything)."""
    return Borrowed(file=file, label=label, what=what, recorded_by="Meta's HolisticTraceAnalysis project",
                    source="the test data of facebookresearch/HolisticTraceAnalysis" + how,
                    licence="MIT licence, notice in book/data/borrowed")


ALEXNET_FORWARD = _hta("hta_critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
                       "one forward of AlexNet in float32", label="[param|pytorch.model.alex_net|0|0|0|measure|forward]")
COMPILED_POINTWISE = _hta(
    "hta_triton_example_triton_example.json.gz",
    "one call of a small function compiled with torch.compile (Inductor generated one Triton kernel)")
TRAINING_STEP = _hta(
    "hta_nccl_parser_config_nccl_data.json.gz",
    "one data-parallel training step (rank 0 of 2, NCCL) of a convolutional network with 53 convolutions "
    "and batch norms, as ResNet-50 has", how=", trimmed to ProfilerStep#4")


def _tracelens(file: str, what: str, folder: str) -> Borrowed:
    return Borrowed(file=file, label=None, what=what, recorded_by="AMD's TraceLens project",
                    source=f"the test data of AMD-AGI/TraceLens, {folder}, commit 171dd747, sanitised",
                    licence="MIT licence, notice in book/data/borrowed/LICENSE-TraceLens")


_MODELS = {   # key: (file name part, words for the model when the trace has no metadata)
    "bert": ("gaunernst_bert-small-uncased__1016001", "one fill-mask step of BERT-small"),
    "qwen": ("Qwen_Qwen1.5-0.5B-Chat__1016005", "one forward of Qwen1.5-0.5B-Chat"),
    "vit": ("Falconsai_nsfw_image_detection__1016002", "one step of a ViT image classifier"),
    "timesformer": ("facebook_timesformer-base-finetuned-k400__1016002", "one step of TimeSformer on a video"),
}
# "h100_qwen", "mi300x_bert", ... and "sglang_decode".
TRACELENS: dict[str, Borrowed] = {
    f"{gpu}_{model}": _tracelens(f"tracelens_{prefix}_{part}.json.gz", what, f"tests/traces/{folder}/")
    for gpu, prefix, folder in (("h100", "h100", "h100"), ("mi300x", "mi300", "mi300"))
    for model, (part, what) in _MODELS.items()
}
TRACELENS["sglang_decode"] = _tracelens(
    "tracelens_inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz",
    "one decode step of SGLang serving Qwen3-8B to a batch of 32 requests (its attention kernels replayed "
    "from a HIP graph)", "tests/traces/inference/sglang_decode/")
# The same SGLang run capturing that step's HIP graph: its attention ops record the heads and head dim the
# replay lacks (``find_attention(step, capture=SGLANG_DECODE_CAPTURE.trace())``). Not in TRACELENS, whose
# entries are each a step with attention kernels timed; this one times none.
SGLANG_DECODE_CAPTURE = _tracelens(
    "tracelens_inference_sglang_decode_capture_bs_32_rank0.json.gz",
    "SGLang capturing the HIP graph of its batch-32 decode step of Qwen3-8B: its attention ops with their "
    "input shapes, no attention kernel timed", "tests/traces/inference/sglang_decode/")

# Two ranks (0 and 1) of a 128-rank training job, from HolisticTraceAnalysis' test data: each trace
# carries its rank and the world size in ``distributedInfo`` and no ``deviceProperties``, so the GPU
# (Ampere: cuBLAS's ``ampere_*`` kernels) is read from kernel names, never from the trace's own word.
HTA_RANK_PAIR = ("hta_trace_filter_sampled_rank-0.json.gz", "hta_trace_filter_sampled_rank-1.json.gz")
HTA_RANK_PAIR_CREDIT = ("two ranks of a 128-rank training job, recorded by Meta's HolisticTraceAnalysis project "
                        "(its test data, tests/data/trace_filter, commit f4d0062c; MIT licence, notice in book/data/borrowed): "
                        "not this book's run")


def rank_pair() -> list[Path]:
    """The borrowed rank traces ``HTA_RANK_PAIR`` as paths, for ``kernels.parallel.rank_traces.load_ranks``."""
    paths = [root() / name for name in HTA_RANK_PAIR]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{missing} missing from {root()}: the borrowed traces ship in book/data/borrowed "
                                "(kernels/data/borrowed when installed)")
    return paths
