"""kernels.book.timesformer: what chapters 1 and 12 read of the borrowed TimeSformer steps."""
import pytest

from kernels import borrowed
from kernels.book.timesformer import timesformer_input
from kernels.trace.attention import find_attention


@pytest.mark.parametrize("key", ["h100_timesformer", "mi300x_timesformer"])
def test_timesformer_was_given_128_frames_for_a_checkpoint_of_8(key):
    step = borrowed.TRACELENS[key].step()
    video = timesformer_input(step)
    assert video == {"batch": 1, "frames": 128, "image": [224, 224], "patch": [16, 16], "patches_per_frame": 196,
                     "trained_frames": 8, "stretched_to": 128, "space_groups": 8, "space_tokens": 3137,
                     "space_frames": 16}
    # the space attention's tokens: a class token and 128 / 8 = 16 frames' patches (197 with 8 frames)
    assert video["space_tokens"] == 1 + video["frames"] // video["trained_frames"] * video["patches_per_frame"]
    longest = max(find_attention(step).calls, key=lambda c: c.gpu_us)
    assert (longest.batch_heads, longest.sq, longest.sk) == (96, video["space_tokens"], video["space_tokens"]), \
        "the longest attention call runs over the space sequences the input made"


def test_a_step_without_timesformer_s_space_sequences_says_so():
    with pytest.raises(ValueError, match="not a TimeSformer step"):
        timesformer_input(borrowed.TRACELENS["h100_bert"].step())
