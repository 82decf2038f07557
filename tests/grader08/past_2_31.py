"""GPU: past 2^31 elements (int64 offsets), forward and backward."""
from __future__ import annotations

import math

import pytest
import torch

import harness
from grader08.common import (
    BACKWARD_HINT,
    BACKWARD_PATH,
    BACKWARD_TASKS,
    BF16,
    FORWARD_PATH,
    FP32,
    INT64_HINT,
    LAB,
    LARGE,
    check_backward,
    check_forward,
    forward_tasks,
    mask_name,
    skip_before_sm80,
)
from harness import attention, requires_gpu
from harness.attention import golden
from harness.check import check_placement, run_past_2_31

__all__ = ["test_flash_forward_past_2_31_elements", "test_flash_backward_past_2_31_elements"]


# ---------------------------------------------------------------- GPU: past 2^31 elements
# bfloat16 (batch, 128, 8, 128) is exactly 2^31 elements at batch 16384: one batch more puts the last batch's every
# element past 2^31 - 1, where an int offset (b * batch_stride) wraps. Checked: batches 0 and 16384 (all heads and
# rows) against the float64 golden of those batches, with the flash rule. Memory: q, k, v, o 4 GiB each (16 GiB);
# the backward adds grad_o (4), grad_q, grad_k, grad_v (12) and the float32 dQ accumulator (8): 40 GiB, which an
# 80 GB H100 holds (gpu_memory skips on a smaller GPU, saying so).
HUGE = (16385, 128, 8, 128)


@requires_gpu
@LARGE
@pytest.mark.parametrize("causal", [pytest.param(c, id=mask_name(c), marks=harness.tasks(*forward_tasks((128, 128), c)))
                                    for c in (False, True)])
def test_flash_forward_past_2_31_elements(causal, gpu_memory):
    skip_before_sm80("flash_forward")
    gpu_memory(18)
    batch, seqlen, heads, head_dim = HUGE
    q, k, v = (torch.randn(HUGE, dtype=BF16, device="cuda") for _ in range(3))
    case = (f"flash_forward of q {list(q.shape)} bfloat16 ({q.numel()} elements = 2^31 + {q.numel() - 2**31}), "
            f"{mask_name(causal)}")
    harness.poison_allocator(q.numel(), BF16)
    o, lse = run_past_2_31(lambda: LAB.module.flash_forward(q, k, v, causal=causal, path=FORWARD_PATH), case,
                           hint=INT64_HINT)
    check_placement(o, shape=q.shape, like=q, name="o", case=case)
    check_placement(lse, shape=(batch, heads, seqlen), like=q, dtype=FP32, name="lse", case=case)
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        check_forward(o[part], lse[part], q[part], k[part], v[part], causal=causal, scale=None, rung="forward",
                      case=f"{case}: batch {b} (the first element of batch 16384 is element 2^31)", hint=INT64_HINT)


@requires_gpu
@LARGE
@harness.tasks(*BACKWARD_TASKS)
def test_flash_backward_past_2_31_elements(gpu_memory):
    """The backward at the same size, causal: o and lse are PyTorch's (and the golden's) for batches 0 and 16384,
    the ones checked; the other batches get o = 0 and lse = log(128), which only need to be finite."""
    skip_before_sm80("flash_backward")
    gpu_memory(44)
    batch, seqlen, heads, head_dim = HUGE
    q, k, v, grad_o = (torch.randn(HUGE, dtype=BF16, device="cuda") for _ in range(4))
    o = torch.zeros(HUGE, dtype=BF16, device="cuda")
    lse = torch.full((batch, heads, seqlen), math.log(seqlen), dtype=FP32, device="cuda")
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        o[part] = attention.same_dtype_attention(q[part], k[part], v[part], True, None)
        lse[part] = golden(q[part], k[part], v[part], True, None)["lse"].float()
    case = f"flash_backward of q {list(q.shape)} bfloat16 ({q.numel()} elements = 2^31 + {q.numel() - 2**31}), causal"
    harness.poison_allocator(q.numel(), BF16)
    grads = run_past_2_31(lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH),
                          case, hint=INT64_HINT)
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        check_backward([g[part] for g in grads], grad_o[part], q[part], k[part], v[part], o[part], causal=True,
                       scale=None, case=f"{case}: batch {b}", hint=INT64_HINT + "; " + BACKWARD_HINT)
