"""GPU traces recorded by others on real GPUs, shown where the book has no recording of its own.

Until the course's own GPU run is recorded (``kernels.recorded``), a page about GPU tracks can
still show real ones: ``ALEXNET_FORWARD`` is one forward of AlexNet recorded on an A100 by
Meta's HolisticTraceAnalysis project (its test data, MIT licence). Every use says who recorded
it, on what GPU (read from the trace itself) and under which licence: ``credit(trace)``.

The files live in ``book/data/borrowed/`` (in an installed package, ``kernels/data/borrowed``),
with the licence notice beside them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    label: str          # the labelled range that is one step
    what: str           # what was recorded, in words
    recorded_by: str
    source: str         # where the file comes from
    licence: str

    def trace(self) -> Trace:
        path = root() / self.file
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the borrowed traces ship in book/data/borrowed "
                                    "(kernels/data/borrowed when installed)")
        return load_trace(path)

    def step(self, index: int = 0) -> Step:
        """The ``index``-th occurrence of the labelled range, as a step (a KeyError lists the labels)."""
        return self.trace().steps(self.label)[index]

    def gpu(self, trace: Trace) -> str:
        """The GPU the trace says it was recorded on (its deviceProperties), not what we typed."""
        names = sorted({p.get("name", "") for p in trace.device_properties if p.get("name")})
        if not names:
            raise ValueError(f"{self.file} names no GPU in its deviceProperties")
        return " and ".join(names)

    def credit(self, trace: Trace) -> str:
        """The sentence that goes with the figure: who, what, on which GPU, under which licence."""
        return (f"{self.what[0].upper()}{self.what[1:]}, recorded by {self.recorded_by} on an {self.gpu(trace)} "
                f"({self.source}; {self.licence}): not this book's run.")


ALEXNET_FORWARD = Borrowed(
    file="hta_critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    label="[param|pytorch.model.alex_net|0|0|0|measure|forward]",
    what="one forward of AlexNet in float32",
    recorded_by="Meta's HolisticTraceAnalysis project",
    source="the test data of facebookresearch/HolisticTraceAnalysis",
    licence="MIT licence, notice in book/data/borrowed",
)
