"""Small helpers every chapter notebook uses, so notebooks hold prose, calls and figures only.

- ``setup(device, dtype)``: the device and dtype a chapter runs with, falling back (with a
  printed reason) when the requested one is not here.
- ``inputs(...)``: random q, k, v (never zeros: a kernel that writes nothing must not pass).
- ``glue(name, value)``: hand a computed number to the prose (myst-nb's glue in the book;
  nothing is recorded elsewhere, e.g. in Colab without myst-nb).
- ``lesson(condition, claim)``: the prose's claim, checked on the device that ran it.
- ``say(text)``: a sentence for the reader, shown as prose that wraps (lessons, notices).
- ``timing_claims(claims)``: timing claims checked once per profiled step, asserted only where
  the steps agree.
- ``timed(fn, done)``: a step the reader waits on (a build), and how long it took.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch

from kernels.dtypes import TORCH_NAMES, parse_dtype

# The checkout (or the installed wheel's site-packages): .cu pieces are named relative to it.
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GPU:
    """What the tier logic needs to know about a GPU (from torch, or written by hand in tests)."""

    name: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """The device and dtype a chapter will run with, and why, in words."""

    device: str
    dtype: str
    tier: str
    notes: tuple[str, ...] = ()


def plan(device: str, dtype: str, gpu: GPU | None) -> Plan:
    """Decide device and dtype from what was asked and what this machine has (a pure function).

    Tiers (README): CPU only; T4-class (sm_75: no bfloat16 tensor cores, no SDPA flash or
    cuDNN backend, so float16); Ampere and newer (sm_80+: everything, bfloat16).
    ``device="auto"`` takes the GPU when there is one (a notebook opened in Colab), and
    ``dtype="auto"`` then means bfloat16 (float16 where the GPU lacks it), float32 on a CPU.
    """
    if device == "auto":
        device = "cuda" if gpu is not None else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in TORCH_NAMES:
        raise ValueError(f"dtype must be one of {', '.join(TORCH_NAMES)}, got {dtype!r}")
    if not device.startswith("cuda"):
        return Plan(device, dtype, "cpu")
    if gpu is None:
        return Plan("cpu", "float32", "cpu", ("This chapter asked for a CUDA GPU, but none is visible: "
                                              "running on the CPU in float32 instead.",))
    major, minor = gpu.capability
    if major >= 8:
        return Plan(device, dtype, "ampere+")
    notes = [f"{gpu.name} is sm_{major}{minor}: SDPA's flash and cuDNN backends need sm_80 or newer, "
             "so this chapter skips them."]
    if dtype == "bfloat16":
        notes.append(f"{gpu.name} has no bfloat16 tensor cores: using float16 instead.")
        dtype = "float16"
    return Plan(device, dtype, "t4-class" if (major, minor) >= (7, 5) else "older-gpu", tuple(notes))


def this_gpu() -> GPU | None:
    if not torch.cuda.is_available():
        return None
    return GPU(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))


def setup(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """Resolve the chapter's parameters into a torch device and dtype, saying what changed;
    in a notebook, a cell whose value is a matplotlib Figure then shows it as an image."""
    show_figures_as_images()
    show_tables_for_reading()
    chosen = plan(str(device), dtype, this_gpu())
    for note in chosen.notes:
        print(note)
    return torch.device(chosen.device), parse_dtype(chosen.dtype)


def ran_with(**parameters) -> str:
    """One short line naming the parameters a page runs with ("Parameters: device cpu, dtype
    float32, batch 1, ..."): the setup box prints it, since the parameters cell is not on the
    page. A torch dtype reads by its name ("float32", not "torch.float32")."""
    def shown(value):
        return str(value).removeprefix("torch.") if isinstance(value, (torch.dtype, torch.device)) else readable(value)

    return "Parameters: " + ", ".join(f"{name} {shown(value)}" for name, value in parameters.items())


def readable(value) -> str:
    """A number as a reader reads it: a count with thousands separators ("2,147,483,648", never
    "2.147484e+09"), anything else to 4 significant digits without an exponent and without
    trailing zeros ("119.3", "4.537", "0.01234", "4.85", "17" for 17.0: a whole number never
    reads "17.00"); a value below 1e-3 keeps its exponent ("5.3e-07": an error bound).
    Anything that is not a number comes back as ``str(value)``."""
    import math
    import numbers

    value = python_scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    number = float(value)
    if math.isfinite(number) and number == int(number) and abs(number) >= 1000:
        return f"{int(number):,}"
    if not math.isfinite(number) or number == 0:
        return f"{number:g}"
    if abs(number) < 1e-3:
        return f"{number:.2g}"
    decimals = max(0, 3 - math.floor(math.log10(abs(number))))
    text = f"{number:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def show_tables_for_reading() -> None:
    """pandas shows every column and every cell whole (no "..."), and floats by ``readable``;
    in IPython a DataFrame's HTML is `table_html`'s (one header row, no index noise)."""
    import pandas as pd

    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.width", None)
    pd.set_option("display.float_format", readable)
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing displays
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, table_html)


def table_html(frame) -> str:
    """A table as a reader reads it: a named index's name goes up into the header row (pandas
    would give it a row of its own, empty but for that name), and a row number nobody named
    (0, 1, 2, 6, 7, ... left by a filter) is not shown. A MultiIndex is shown as pandas shows it."""
    import pandas as pd

    rows_are_numbers = frame.index.name is None and not isinstance(frame.index, pd.MultiIndex) \
        and pd.api.types.is_integer_dtype(frame.index.dtype)
    if rows_are_numbers:
        return frame.to_html(index=False, notebook=True)
    if frame.index.name is not None and not isinstance(frame.index, pd.MultiIndex) \
            and not isinstance(frame.columns, pd.MultiIndex) and frame.columns.name is None:
        frame = frame.rename_axis(index=None, columns=frame.index.name)
    return frame.to_html(notebook=True)


def show_figures_as_images() -> None:
    """The library draws on matplotlib ``Figure`` objects, never through pyplot (no global
    state): in IPython, have a cell's Figure value rendered as a PNG, as pyplot's would be,
    with a narrower copy for phones (``kernels.figures.figure_png``)."""
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
    except ImportError:  # plain Python: nothing displays
        return
    from kernels.figures import figure_png

    shell = get_ipython()
    if shell is not None:
        # Loading pyplot's backend in a kernel (the inline one) sets that backend's own PNG
        # formatter, and pyplot loads it lazily: on a reader's first plt call, or pandas' .plot.
        # Have that happen now, before this formatter, not after it.
        import matplotlib
        import matplotlib.pyplot as plt

        plt.switch_backend(matplotlib.get_backend())
        shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)


def inputs(batch: int, heads: int, seq: int, head_dim: int, dtype=torch.float32, device="cpu",
           seed: int = 0, requires_grad: bool = False):
    """q, k, v of shape [batch, heads, seq, head_dim], standard normal, reproducible."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(3, batch, heads, seq, head_dim, generator=g).to(device=device, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in qkv.unbind(0))


T = TypeVar("T")


def timed(fn: Callable[[], T], done: str) -> T:
    """``fn()``, then "<done> in 12.3 s" printed: for a step the reader waits on (a build)."""
    started = time.perf_counter()
    result = fn()
    print(f"{done} in {time.perf_counter() - started:.1f} s")
    return result


def glue(name: str, value):
    """Record ``value`` under ``name`` for ``{glue:text}`` in the prose (returns nothing, so a
    glue on a cell's last line adds no output).

    Strings are glued as they read ("134,217,728" stays that, not a tuple); numbers can be
    formatted in the prose, e.g. ``{glue:text}`name:.2f```.
    """
    import importlib.util

    from IPython.display import display as show

    if importlib.util.find_spec("myst_nb") is None:  # outside the book build (Colab, plain Jupyter): nothing to record
        return
    # What myst_nb.glue writes (myst_nb/ext/glue/__init__.py), written out here because importing
    # myst_nb's glue imports nbformat and jsonschema: seconds of CPU in every notebook.
    mimebundle, metadata = glue_bundle(name, value)
    show(mimebundle, raw=True, metadata=metadata)


def python_scalar(value):
    """A numpy or torch scalar as the Python number it holds (its repr, "np.float32(2.5)", is
    no number to the prose's ``:.2f``); anything else as it is."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def glue_bundle(name: str, value) -> tuple[dict, dict]:
    """The output ``glue`` displays: ``value``'s mimebundle, its mime types prefixed so that the
    page shows it only where the prose cites it, and the metadata that names it.

    A string's text/plain is its quoted repr, as myst_nb's own glue writes it: ``{glue:text}``
    passes text/plain through ``ast.literal_eval`` to strip those quotes, and unquoted text it
    parses as Python instead ("134,217,728" would become the tuple (134, 217, 728), "1_000" the
    number 1000).
    """
    from IPython.core.formatters import format_display_data

    mimebundle, metadata = format_display_data(python_scalar(value))
    metadata["scrapbook"] = {"name": name, "mime_prefix": GLUE_PREFIX}
    return {GLUE_PREFIX + k: v for k, v in mimebundle.items()}, metadata


# The mime prefix of a glued value (myst_nb's GLUE_PREFIX, read by the book build).
GLUE_PREFIX = "application/papermill.record/"


class LessonFailed(AssertionError):
    """A claim the chapter makes did not hold on this run's device."""


def lesson(condition: bool, claim: str, evidence: str = "") -> None:
    """Assert what the prose says. Shows the claim when it holds (see ``say``), fails loudly when not."""
    if not condition:
        raise LessonFailed(f"The chapter claims: {claim}. This run disagrees. {evidence}".strip())
    say(f"{TICK} {claim}" + (f" ({evidence})" if evidence else ""), kind="lesson")


# What starts a lesson's line: in a notebook's plain text, in the book as a green tick.
TICK = "✔"


def timing_claims(claims: list[tuple[list, str, str]], counted: str = "profiled steps") -> bool:
    """Assert several timing claims about the same profiled steps, with one note for those the steps
    could not decide.

    Each claim is (held per step, claim, evidence). The course's rule (the same 80% that
    ``kernels.bench.comparison`` uses): a claim that held in at least 80% of the steps is asserted,
    one that held in at most 20% fails (the trace contradicts the prose); those in between are
    named together in one note, which says "not asserted" (the page explains the noise once, in
    its prose). ``counted`` names what each held-list counts ("timed rounds" for
    ``kernels.bench.comparison.in_turns``' rounds). Returns True when every claim was asserted."""
    if not claims or any(not held for held, _, _ in claims):
        raise ValueError("timing_claims needs at least one claim, each checked in at least one step")
    undecided = []
    for held, claim, evidence in claims:
        share = sum(bool(h) for h in held) / len(held)
        tally = f"held in {sum(bool(h) for h in held)} of {len(held)} {counted}"
        if share >= 0.8 or share <= 0.2:
            lesson(share >= 0.8, claim, f"{evidence}; {tally}" if evidence else tally)
        else:
            undecided.append(f"{claim} ({tally})")
    if undecided:
        say(f"Not asserted on this run, the {counted} disagree (a timing claim is asserted when it held "
            "in at least 80% of them): " + "; ".join(undecided), kind="note")
    return not undecided


# What ``say`` can be: the CSS class of each (book/_static/pages.css styles them).
SAY_KINDS = ("lesson", "note")


def in_notebook() -> bool:
    """Whether output goes to a notebook (a running IPython kernel) rather than a terminal or a test."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def say_html(text: str, kind: str = "note") -> str:
    """``text`` as a box of prose that wraps: HTML-escaped, with `backticks` as code."""
    import html
    import re

    if kind not in SAY_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SAY_KINDS)}, got {kind!r}")
    body = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
    if kind == "lesson" and body.startswith(TICK):  # the tick styled apart: a compact checklist line
        body = f'<span class="ap-tick" title="checked on this run">{TICK} </span>{body[len(TICK):].lstrip()}'
    return f'<div class="ap-say ap-{kind}" role="note"><p>{body}</p></div>'


def say(text: str, kind: str = "note") -> None:
    """A sentence for the reader (a lesson that held, a notice): in a notebook, a box of prose
    that wraps (a 200-character line in an output's code box runs off the page); elsewhere, and
    in the notebook's plain-text view, the line itself."""
    if not in_notebook():
        print(text)
        return
    from IPython.display import display

    display({"text/plain": text, "text/html": say_html(text, kind)}, raw=True)


def reveal(guess, seen, what: str = "ops", source: str = "the trace"):
    """Compare the reader's guess with what the trace shows, and say each difference.

    ``guess`` and ``seen`` are both lists (of op names, kernel names, a ranking...) or both
    numbers. Lists are compared place by place, what is in the trace and where told apart: a
    guessed item at the same place is ✔; one the trace has at another place is "yes, at #k"
    (never "no"); only an item the trace lacks is "no"; and each item of the trace says whether,
    and where, it was guessed. A guess left as ``None`` is reported as missing, never as right. Returns the
    comparison table for lists, the difference for numbers. Nothing here asserts the guess:
    lessons assert what the trace shows.
    """
    if guess is None or guess is ...:
        print(f"No guess written: edit the guess cell above before running this one. {source.capitalize()} shows {what}: {seen}")
        return None
    if isinstance(seen, (int, float)) and not isinstance(seen, bool):
        off = seen - guess
        print(f"{what}: you guessed {short_number(guess)}; in {source}: {short_number(seen)} "
              + ("(exactly right)" if off == 0 else f"({short_number(abs(off))} {'higher' if off > 0 else 'lower'})"))
        return off
    import pandas as pd

    guess, seen = list(guess), list(seen)
    table = pd.DataFrame(compared_rows(guess, seen))
    table.index = range(1, len(table) + 1)
    # Two lists side by side, each row a position in both: yours and its verdict, then the
    # trace's and whether (and where) you had it.
    table.columns = ["you guessed", f"in {source}?", f"{source}'s order", "in your guess?"]
    table.index.name = "#"
    # Both columns place an item in the other list: say which list the number counts in.
    table["in your guess?"] = table["in your guess?"].str.replace(ELSEWHERE, YOURS, regex=False)
    said = table[f"in {source}?"]
    counts = {IN_PLACE: int((said == IN_PLACE).sum()), "elsewhere": int(said.str.startswith(ELSEWHERE).sum()),
              ABSENT: int(said.isin([ABSENT, FEWER]).sum())}
    unguessed = [s for s, g in zip(table[f"{source}'s order"], table["in your guess?"]) if g in (ABSENT, FEWER)]
    if counts[IN_PLACE] == len(guess) == len(seen):
        summary = f"all {len(guess)} where you put them"
    else:
        parts = [f"{counts[IN_PLACE]} where you put them"] * bool(counts[IN_PLACE]) \
            + [f"{counts['elsewhere']} at another place"] * bool(counts["elsewhere"]) \
            + [f"{counts[ABSENT]} not in {source}"] * bool(counts[ABSENT])
        summary = f"of your {len(guess)}, " + ", ".join(parts) \
            + (f"; {len(unguessed)} of its {len(seen)} you did not guess" if unguessed else "")
    print(f"{what}: {summary}")
    return table


# What ``reveal`` says of each item, position by position (a ranking's order is its answer):
# a guessed item in the same place, one the other list has at another place (#k), one it lacks.
IN_PLACE = "✔"
ELSEWHERE = "yes, at #"
YOURS = "yes, your #"   # the same, on the trace's side: where the guess has it
ABSENT = "no"
FEWER = "not that many times"


def compared_rows(guess: list, seen: list) -> list[tuple]:
    """Row i: the i-th guessed item and whether the trace has it (here, at #k, or not), and the
    i-th item of the trace and whether it was guessed. What is in a list and where are told apart:
    an item the other list holds anywhere is never "no"; repeated items are matched one for one."""
    rows = []
    taken: dict[int, set] = {id(guess): set(), id(seen): set()}
    for i in range(max(len(guess), len(seen))):
        g = place_in(guess, i, seen, taken[id(seen)]) if i < len(guess) else ""
        s = place_in(seen, i, guess, taken[id(guess)]) if i < len(seen) else ""
        rows.append((guess[i] if i < len(guess) else "", g, seen[i] if i < len(seen) else "", s))
    return rows


def place_in(mine: list, i: int, other: list, taken: set) -> str:
    """Where ``other`` has ``mine[i]``: ✔ at the same place, else its first place not already
    matched in place or taken by an earlier repeat ("yes, at #k"), else "no" (or, for a repeat the
    other list holds fewer times, "not that many times")."""
    item = mine[i]
    if i < len(other) and other[i] == item:
        return IN_PLACE
    for k, o in enumerate(other):
        in_place_there = k < len(mine) and mine[k] == o
        if o == item and k not in taken and not in_place_there:
            taken.add(k)
            return f"{ELSEWHERE}{k + 1}"
    return FEWER if item in other else ABSENT


def short_number(value) -> str:
    """``readable(value)`` without trailing zeros after the point: a guess of 0.1 reads "0.1"."""
    text = readable(value)
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def mib(nbytes: float) -> float:
    return nbytes / 2**20


def source_piece(source, first: str | None = None, last: str | None = None) -> tuple[str, str]:
    """``(where, code)``: the lines of ``source`` from the first line containing ``first``
    through the next line containing ``last``, and the file and line numbers they come from.
    Without ``first``, all of ``source``: the whole function or class, or the whole file.

    ``source`` is a library function (a @triton.jit kernel included) or a file of C++/CUDA
    (a ``.cu`` kernel). Without ``last`` the piece is what begins at ``first``: in Python the
    statement (until its brackets close), in C++ the block (until its first ``{`` closes: a
    whole loop or function, a comment above it included). The markers are text of the lines
    themselves, so a piece follows its code when lines move, and a marker that no longer
    matches raises ``ValueError`` naming it rather than showing another piece.
    """
    if isinstance(source, (str, Path)):
        path = Path(source).resolve()
        lines, offset = path.read_text().splitlines(), 1
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        brackets, comment, statement = "{}", "//", False
    else:
        import inspect

        fn = getattr(source, "fn", source)  # a @triton.jit kernel wraps the Python function in .fn
        source_lines, offset = inspect.getsourcelines(fn)
        lines = [line.rstrip("\n") for line in source_lines]
        where = f"{fn.__module__.replace('.', '/')}.py, {fn.__qualname__}"
        brackets, comment, statement = "()[]{}", "#", True
    if first is None:
        return f"{where}, lines {offset}-{offset + len(lines) - 1}", dedent_code(lines)
    begin = next((i for i, line in enumerate(lines) if first in line), None)
    if begin is None:
        raise ValueError(f"no line of {where} contains {first!r}")
    if last is not None:
        end = next((i for i in range(begin, len(lines)) if last in lines[i]), None)
        if end is None:
            raise ValueError(f"no line of {where} from {first!r} on contains {last!r}")
    else:
        end = closing_line(lines, begin, brackets, comment, statement)
        if end is None:
            raise ValueError(f"what begins at {first!r} in {where} never closes")
    return f"{where}, lines {offset + begin}-{offset + end}", dedent_code(lines[begin:end + 1])


def closing_line(lines: list[str], begin: int, brackets: str, comment: str, statement: bool) -> int | None:
    """The index of the line where the brackets opened from ``lines[begin]`` on close again
    (a ``statement`` may open none: then its first line closes it); None if they never do."""
    opens, closes = brackets[0::2], brackets[1::2]
    depth, opened = 0, statement
    for i in range(begin, len(lines)):
        code = lines[i].split(comment)[0]
        depth += sum(code.count(c) for c in opens) - sum(code.count(c) for c in closes)
        opened = opened or any(c in code for c in opens)
        if opened and depth == 0:
            return i
    return None


def dedent_code(lines: list[str]) -> str:
    """``lines`` without their common indentation, like textwrap.dedent, but blind to lines
    that start with ``#``: a C++ ``#pragma unroll`` sits in column 0 inside indented code and
    would otherwise keep all the indentation."""
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip() and not l.lstrip().startswith("#")]
    cut = min(indents, default=0)
    return "\n".join(l[cut:] if l[:cut].strip() == "" else l.lstrip(" ") for l in lines).strip("\n")


def show_lines(source, first: str | None = None, last: str | None = None):
    """``source_piece(source, first, last)`` as a highlighted code block (Python, or CUDA for
    a ``.cu`` file) headed by the file, function and line numbers it comes from.

    A chapter shows a kernel in the pieces it explains, each where it is explained; a short
    function or class, ``show_lines(fn)``, whole.
    """
    from IPython.display import Markdown

    where, code = source_piece(source, first, last)
    language, comment = ("python", "#") if not isinstance(source, (str, Path)) else ("cuda", "//")
    return Markdown(f"```{language}\n{comment} {where}\n{code}\n```")


def glue_all(**values) -> None:
    """``glue`` each keyword's value under its name: one call for the numbers a paragraph reads.

    ``glue_all(peak_mib=1.5, total_mib=3.0)`` records exactly what ``glue("peak_mib", 1.5)``
    and ``glue("total_mib", 3.0)`` would, in that order.
    """
    if not values:
        raise ValueError("glue_all needs at least one name=value to glue")
    for name, value in values.items():
        glue(name, value)
