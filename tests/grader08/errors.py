"""GPU: bad input gets a clear error; the tensor-core rungs refused before sm_80."""
from __future__ import annotations

import pytest
import torch

import harness
from coursekit import jit
from grader08.common import BF16, FP16, LAB
from harness import requires_gpu
from harness.attention import make_qkv, randn

__all__ = ["test_input_errors", "test_tensor_core_rungs_refused_before_sm80"]


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_input_errors():
    q, k, v = make_qkv(2, 64, 80, 4, 2, 64, BF16)
    lse = torch.zeros(2, 4, 64, device="cuda")
    o = torch.zeros_like(q)
    m = LAB.module
    q96, k96 = randn((2, 64, 4, 96), BF16), randn((2, 80, 2, 96), BF16)
    strided_last = randn((2, 64, 4, 128), BF16)[..., ::2]  # head_dim 64 with stride 2
    shifted = torch.zeros(q.numel() + 1, dtype=BF16, device="cuda")[1:].view(q.shape)  # storage offset 1: 2 bytes
    cases = [
        (lambda: m.flash_forward(q, k.half(), v), ("dtype",), "flash_forward(q bfloat16, k float16)"),
        (lambda: m.attention_naive(q, k.float(), v), ("dtype",), "attention_naive(q bfloat16, k float32)"),
        (lambda: m.flash_forward(q.float(), k.float(), v.float()), ("float32", "flash_forward_fp32"),
         "flash_forward(float32 tensors): the tensor-core rung takes float16 and bfloat16"),
        (lambda: m.flash_forward_fp32(q, k, v), ("float32",), "flash_forward_fp32(bfloat16 tensors)"),
        (lambda: m.flash_forward(q96, k96, k96), ("head_dim", "96"), "flash_forward(head_dim 96)"),
        (lambda: m.flash_forward_fp32(q96.float(), k96.float(), k96.float()), ("head_dim", "96"),
         "flash_forward_fp32(head_dim 96)"),
        (lambda: m.flash_backward(q96, q96, k96, k96, q96, lse), ("head_dim", "96"), "flash_backward(head_dim 96)"),
        (lambda: m.flash_forward(q[:, :, :3], k, v), ("heads",), "flash_forward(3 query heads on 2 key/value heads)"),
        (lambda: m.attention_naive(q[:, :, :3], k, v), ("heads",),
         "attention_naive(3 query heads on 2 key/value heads)"),
        (lambda: m.flash_forward(strided_last, k, v), ("stride",), "flash_forward(q with head_dim stride 2)"),
        (lambda: m.attention_naive(strided_last, k, v), ("stride",), "attention_naive(q with head_dim stride 2)"),
        (lambda: m.flash_forward(shifted, k, v), ("align",), "flash_forward(q a view 1 element into its storage)"),
        (lambda: m.flash_backward(o, shifted, k, v, o, lse), ("align",),
         "flash_backward(q a view 1 element into its storage)"),
        (lambda: m.flash_forward(q, k, v[:, :40]), ("shape",), "flash_forward(k [2, 80, 2, 64], v [2, 40, 2, 64])"),
        (lambda: m.flash_forward(q, k[:1], v[:1]), ("batch",), "flash_forward(q batch 2, k and v batch 1)"),
        (lambda: m.flash_backward(o, q, k, v, o, lse[:, :, :32]), ("lse", "shape"),
         "flash_backward(lse [2, 4, 32] for q [2, 64, 4, 64])"),
        (lambda: m.flash_backward(o, q, k, v, o, lse.double()), ("lse", "float32"), "flash_backward(lse float64)"),
        (lambda: m.flash_backward(o[:, :32], q, k, v, o, lse), ("grad_o", "shape"),
         "flash_backward(grad_o [2, 32, 4, 64] for q [2, 64, 4, 64])"),
        (lambda: m.flash_backward(o, q, k, v, o.cpu(), lse), ("CUDA",), "flash_backward(o on the CPU)"),
    ]
    for fn, words, what in cases:
        LAB.assert_raises_clearly(fn, must_mention=words, case=what)


@requires_gpu
@harness.reference_check  # the capability check is given
def test_tensor_core_rungs_refused_before_sm80():
    if jit.capability()[0] >= 8:
        pytest.skip("this GPU has compute capability 8.0+; the refusal only applies before sm_80")
    q, k, v = make_qkv(1, 16, 16, 1, 1, 64, FP16)
    LAB.assert_raises_clearly(lambda: LAB.module.flash_forward(q, k, v), must_mention=("8.0",),
                              case="flash_forward on a GPU before sm_80")
