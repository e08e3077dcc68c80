"""Chapter 5's source excerpts: lines of the kernels' ``.cu`` files, to show in the book.

``cuda_excerpt(source, start, end)`` cuts them out by markers in the text (not by line
numbers, which every edit would move; a marker a ``.cu`` file lost raises ``ValueError`` naming
it, so the chapter fails to execute), and ``cuda_markdown(code)`` shows them highlighted as CUDA.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union


def cuda_excerpt(source: Union[str, Path], start: str, end: Optional[str] = None) -> str:
    """Lines of ``source`` from the first one containing ``start`` up to (not including) the
    first later one containing ``end``; without ``end``, the brace-balanced block that begins
    at ``start`` (a whole function or loop). Common indentation removed."""
    lines = Path(source).read_text().splitlines()
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"{start!r} does not occur in {Path(source).name}")
    if end is not None:
        last = next((i for i in range(first + 1, len(lines)) if end in lines[i]), None)
        if last is None:
            raise ValueError(f"{end!r} does not occur after {start!r} in {Path(source).name}")
    else:
        depth, opened, last = 0, False, None
        for i in range(first, len(lines)):
            code = lines[i].split("//")[0]
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth == 0:
                last = i + 1
                break
        if last is None:
            raise ValueError(f"the block at {start!r} in {Path(source).name} never closes")
    return _dedent(lines[first:last])


def _dedent(lines: list[str]) -> str:
    # Like textwrap.dedent, but blind to preprocessor lines: `#pragma unroll` sits in column 0
    # inside indented code and would otherwise keep all the indentation.
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip() and not l.lstrip().startswith("#")]
    cut = min(indents, default=0)
    return "\n".join(l[cut:] if l[:cut].strip() == "" else l.lstrip(" ") for l in lines).strip("\n")


def cuda_markdown(code: str):
    """A code block the book highlights as CUDA."""
    from IPython.display import Markdown

    return Markdown(f"```cuda\n{code}\n```")

