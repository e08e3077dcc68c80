"""What chapters 1 and 12 read of the borrowed TimeSformer steps: the input the model was given
and how its divided attention split it, from the recorded shapes alone."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # for annotations only
    from kernels.trace.reader import Step


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
      the patches into as many groups as the checkpoint has frames, ``space_frames`` frames'
      patches in each.
    """
    pixels = next((r for _, r in step.find("aten::reshape").iterrows()
                   if len(r["input_dims"][0]) == 5 and r["input_dims"][0][2] == 3), None)
    if pixels is None or step.find("aten::convolution").empty or step.find("aten::upsample_nearest1d").empty:
        raise ValueError("no recorded video reshape, patch convolution and time-embedding upsample in this "
                         "step: not a TimeSformer step (or recorded without shapes)")
    batch, frames, _, height, width = pixels["input_dims"][0]
    conv = step.find("aten::convolution").iloc[0]
    patch = ast.literal_eval(conv["concrete_inputs"][3])          # the stride: one patch per step
    up = step.find("aten::upsample_nearest1d").iloc[0]
    trained, stretched = up["input_dims"][0][-1], ast.literal_eval(up["concrete_inputs"][1])[0]
    cls_and_patches = [r["input_dims"][0] for _, r in step.find("aten::cat").iterrows()
                       if len(r["input_dims"][0]) == 2 and r["input_dims"][0][0][:2] == [batch * trained, 1]]
    if not cls_and_patches:
        raise ValueError("no recorded cat of a class token and the patches of each group in this step")
    groups, tokens = cls_and_patches[0][1][0], cls_and_patches[0][1][1]
    return {"batch": batch, "frames": frames, "image": [height, width], "patch": patch,
            "patches_per_frame": (height // patch[0]) * (width // patch[1]), "trained_frames": trained,
            "stretched_to": stretched, "space_groups": groups, "space_tokens": 1 + tokens,
            "space_frames": tokens // ((height // patch[0]) * (width // patch[1]))}
