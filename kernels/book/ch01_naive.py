"""What only chapter 1's page (notebooks/01_naive.py) needs: the naive forward's copy on a GPU
run, and what TimeSformer's borrowed step was given as input."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import pandas as pd

from kernels.notebook import TICK, in_notebook, lesson, say_html
from kernels.trace.tables import kernel_table

if TYPE_CHECKING:   # for annotations only
    from kernels.trace.reader import Step


def naive_copy_on_gpu(step: Step) -> pd.DataFrame:
    """Chapter 1 on a GPU run: the naive forward runs the article's six GPU activities, one of
    them a copy launched inside ``masked_fill`` (its clone). Returns the step's kernel table."""
    gpu = step.gpu_work
    copies = gpu[gpu["cat"] == "gpu_memcpy"]
    lesson(len(gpu) == 6, "the naive forward runs six GPU activities, as on the article's A100", f"{len(gpu)} on the GPU track")
    fill = step.find("aten::masked_fill").iloc[0]
    lesson(len(copies) == 1 and fill["start_us"] <= copies["launch_start_us"].iloc[0] <= fill["start_us"] + fill["dur_us"],
           "exactly one of them is a copy, launched inside masked_fill (its clone)")
    return kernel_table(step)


def timesformer_input(step: Step) -> dict:
    """What a TimeSformer step (Hugging Face's ``TimesformerModel``) was given and how its divided
    attention split it, read from the recorded shapes:

    - ``batch``, ``frames``, ``image``: the video as the model received it (``pixel_values``
      reshaped to [batch·frames, 3, H, W] for the patch embedding);
    - ``patch``, ``patches_per_frame``: the patch embedding's stride and (H/patch)·(W/patch);
    - ``trained_frames``: the time embedding's length in the checkpoint, and ``stretched_to``:
      the length it was interpolated to (``upsample_nearest1d``) to fit the input;
    - ``space_groups``, ``space_tokens``: the "space" attention's input, concatenated as a
      class token and the patches of each group, [groups, 1 + tokens, hidden]; the layer splits
      the patches into as many groups as the checkpoint has frames.
    """
    pixels = next(r for _, r in step.find("aten::reshape").iterrows()
                  if len(r["input_dims"][0]) == 5 and r["input_dims"][0][2] == 3)
    batch, frames, _, height, width = pixels["input_dims"][0]
    conv = step.find("aten::convolution").iloc[0]
    patch = ast.literal_eval(conv["concrete_inputs"][3])          # the stride: one patch per step
    up = step.find("aten::upsample_nearest1d").iloc[0]
    trained, stretched = up["input_dims"][0][-1], ast.literal_eval(up["concrete_inputs"][1])[0]
    cls_and_patches = [r["input_dims"][0] for _, r in step.find("aten::cat").iterrows()
                       if len(r["input_dims"][0]) == 2 and r["input_dims"][0][0][:2] == [batch * trained, 1]]
    groups, tokens = cls_and_patches[0][1][0], cls_and_patches[0][1][1]
    return {"batch": batch, "frames": frames, "image": [height, width], "patch": patch,
            "patches_per_frame": (height // patch[0]) * (width // patch[1]), "trained_frames": trained,
            "stretched_to": stretched, "space_groups": groups, "space_tokens": 1 + tokens}


def folded_note(summary: str, paragraphs: list[str], checked: bool, claim: str, evidence: str) -> None:
    """A detour the page's main line can skip, folded under ``summary``: its ``paragraphs`` (HTML)
    and the ✔ line of the lesson they rest on. The lesson is checked here and fails as ``lesson``
    does; only its line moves into the fold."""
    if not checked:
        lesson(checked, claim, evidence)            # raises LessonFailed
    line = f"{TICK} {claim} ({evidence})"
    if not in_notebook():
        print(summary, *paragraphs, line, sep="\n")
        return
    from IPython.display import display

    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    html = (f'<details class="ap-hint"><summary>{summary}</summary>{body}'
            f'{say_html(line, kind="lesson")}</details>')
    display({"text/plain": "\n".join([summary, *paragraphs, line]), "text/html": html}, raw=True)
