"""kernels.attention.inplace: where writing in place breaks autograd, and where it does not."""
from __future__ import annotations

import torch

import kernels
from kernels.attention.inplace import attention_with_inplace_dropout
from tests.helpers import make_qkv


def test_inplace_dropout_without_grad_runs_and_drops_nothing_at_p0():
    q, k, v = make_qkv(1, 2, 16, 16)
    torch.manual_seed(0)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 4, dim=-1) @ v
    torch.testing.assert_close(attention_with_inplace_dropout(q, k, v, p=0.0), expected)


def test_backward_error_names_the_inplace_failure_and_is_none_when_backward_works():
    from kernels.attention.inplace import attention_with_inplace_dropout, backward_error
    from kernels.notebook import inputs

    qkv = inputs(1, 2, 16, 16, requires_grad=True)
    assert "modified by an inplace operation" in backward_error(attention_with_inplace_dropout, *qkv)
    assert backward_error(kernels.get("inplace"), *inputs(1, 2, 16, 16, requires_grad=True)) is None
