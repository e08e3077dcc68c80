"""kernels.book.ch05_cuda: the reading half of chapter 5's GPU branch, run on Hopper-shaped
fixture steps and sweep points (tests/hopper_trace.py): each lesson holds on a right run and
fails on a run that breaks it."""
import pytest

from kernels.bench.results import FORWARD
from kernels.book import ch05_cuda as ch05
from kernels.cuda import flash as cuda_flash
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop

B, H, S = 2, 16, 1024


def test_chapter5_forwards_table_has_one_column_per_kernel():
    steps = {f"cuda_{v}": hop.step(f"cuda_{v}", hop.cuda_forward(v, cuda_flash.launch_config(v, 64), B, H, S))
             for v in ("v1", "v2")}
    table = ch05.cuda_forwards(steps, 64, B, H, S)
    assert list(table.columns) == ["cuda_v1", "cuda_v2"]
    assert table.loc["shared memory (trace, B)", "cuda_v2"] == cuda_flash.launch_config("v2", 64).dynamic_shared_bytes
    with pytest.raises(LessonFailed):  # v1's trace read against v2's launcher
        ch05.cuda_forwards({"cuda_v2": steps["cuda_v1"]}, 64, B, H, S)


def test_chapter5_tensor_cores_win():
    results = hop.sweep_points(["sdpa_flash", "triton", "cuda_v1", "cuda_v2"], seqs=(S,))
    assert ch05.tensor_cores_win(results) is True
    slower = hop.sweep_points(["cuda_v1", "cuda_v2"], seqs=(S,))
    slower[0].median_ms, slower[1].median_ms = slower[1].median_ms, slower[0].median_ms
    with pytest.raises(LessonFailed, match="tensor cores win"):
        ch05.tensor_cores_win(slower)
    with pytest.raises(LessonFailed, match="not both timed: v1 ok, v2 error"):
        ch05.tensor_cores_win(hop.sweep_points(["cuda_v1", "cuda_v2"], seqs=(S,),
                                               failed={("cuda_v2", S, FORWARD): "error"}))
    assert ch05.tensor_cores_win(hop.sweep_points(["cuda_v2"], seqs=(S,))) is False, \
        "v1 not in the sweep (it could not run): nothing to compare, nothing asserted"


def test_chapter5_excerpts_share_one_block_in_the_order_given():
    v1 = cuda_flash.CSRC / "flash_v1.cu"
    text = ch05.excerpts(v1, ("extern __shared__ float smem[];", "float* row_s = s_s"),
                         ("for (int d = 0; d < D; ++d) {",)).data
    assert text.startswith("```cuda\n// kernels/cuda/csrc/flash_v1.cu, lines ") and text.count("```") == 2
    assert text.index("float* row_s = s_s") < text.index("for (int d = 0; d < D; ++d) {")
    with pytest.raises(ValueError, match="no line"):
        ch05.excerpts(v1, ("a marker no line of the kernel holds",))


def test_compiler_words_keep_the_version_and_the_whole_snapshot_note():
    assert ch05.compiler_words("compiled now by nvcc 13.0, V13.0.88 in 18.6 s") == "compiled with nvcc 13.0 on this run"
    snapshot = "read from a snapshot of nvcc 12.8 taken on 2026-01-01, because this machine has no nvcc"
    assert ch05.compiler_words(snapshot) == snapshot, "numbers not made on this run must say so in full"


def test_reveal_revisions_prints_both_sets_and_each_revision_once(capsys):
    text = ch05.reveal_revisions([4, 4], [1], "revisions that grow shared memory", {1: "Q grows", 4: "reused"})
    assert capsys.readouterr().out.strip() == text
    assert "you guessed [4], the compiler's report shows [1]" in text and "exactly right" not in text
    assert "revision 1: yes, not guessed (Q grows)" in text and "revision 4: no (reused)" in text
    assert text.count("revision 4") == 1
    right = ch05.reveal_revisions([1], [1], "x", {})
    assert "(exactly right)" in right and "revision 1: yes, as you guessed" in right
