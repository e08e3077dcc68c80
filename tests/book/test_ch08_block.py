"""Chapter 8's own reading (kernels.book.ch08_block) on Hopper-shaped fixture steps and on CPU ops."""
import pandas as pd
import pytest

from kernels.book import ch08_block
from kernels.notebook import LessonFailed
from tests import hopper_trace as hop

pytestmark = pytest.mark.book


def test_gelu_between_two_hopper_gemms():
    names = ch08_block.gelu_between_matmuls(hop.step("compiled_block", hop.COMPILED_BLOCK).gpu_work)
    assert names.count("triton_poi_fused_gelu_view_2") == 1 and len(names) == 5, names
    ch08_block.gelu_between_matmuls(hop.step("block", hop.EAGER_BLOCK_MLP).gpu_work)


def test_gelu_between_matmuls_on_cpu_ops():
    ops = pd.DataFrame({"name": ["aten::layer_norm", "aten::addmm", "aten::gelu", "aten::addmm"],
                        "start_us": [0.0, 1.0, 2.0, 3.0]})
    ch08_block.gelu_between_matmuls(ops)
    with pytest.raises(LessonFailed):
        ch08_block.gelu_between_matmuls(ops.iloc[[0, 1, 3, 2]].assign(start_us=[0.0, 1.0, 2.0, 3.0]))
