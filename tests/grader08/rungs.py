"""GPU: the shapes of every rung: attention_naive, flash_forward_fp32, flash_forward, flash_backward."""
from __future__ import annotations

import pytest

from grader08.common import (
    BACKWARD_TASKS,
    BF16,
    BIG_SEQLENS,
    FLASH_HEAD_DIMS,
    FP16,
    FP32,
    FP32_HINT,
    NAIVE_HINT,
    SIXTEEN_BIT,
    SMALL_SEQLENS,
    _case_param,
    forward_hint,
    forward_tasks,
    run_backward_case,
    run_forward_case,
    skip_before_sm80,
)
from harness import requires_gpu

__all__ = ["test_naive", "test_flash_fp32", "test_flash_forward", "test_flash_backward"]


# ---------------------------------------------------------------- GPU: rung 1, attention_naive
NAIVE_CASES = ([_case_param(s, dtype, d, causal, ("lab08.1",)) for s in SMALL_SEQLENS[:4]
                for dtype in (FP32, FP16, BF16) for d in (1, 33, 64) for causal in (False, True)]
               + [_case_param((1023, 1024), dtype, 128, True, ("lab08.1",)) for dtype in (FP32, BF16)])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", NAIVE_CASES)
def test_naive(seqlens, dtype, head_dim, causal):
    run_forward_case("attention_naive", "naive", seqlens, dtype, head_dim, causal, hint=NAIVE_HINT)


# ---------------------------------------------------------------- GPU: rung 2, flash_forward_fp32
FP32_CASES = ([_case_param(s, FP32, d, causal, ("lab08.2",)) for s in SMALL_SEQLENS for d in FLASH_HEAD_DIMS
               for causal in (False, True)]
              + [_case_param(BIG_SEQLENS[0], FP32, d, causal, ("lab08.2",)) for d in FLASH_HEAD_DIMS
                 for causal in (False, True)]
              + [_case_param(BIG_SEQLENS[1], FP32, 128, True, ("lab08.2",))])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", FP32_CASES)
def test_flash_fp32(seqlens, dtype, head_dim, causal):
    run_forward_case("flash_forward_fp32", "fp32", seqlens, dtype, head_dim, causal, hint=FP32_HINT)


# ---------------------------------------------------------------- GPU: rung 3, flash_forward
FORWARD_CASES = ([_case_param(s, dtype, d, causal, forward_tasks(s, causal)) for s in SMALL_SEQLENS
                  for dtype in SIXTEEN_BIT for d in FLASH_HEAD_DIMS for causal in (False, True)]
                 + [_case_param(BIG_SEQLENS[0], dtype, d, causal, forward_tasks(BIG_SEQLENS[0], causal))
                    for dtype in SIXTEEN_BIT for d in FLASH_HEAD_DIMS for causal in (False, True)]
                 + [_case_param(BIG_SEQLENS[1], BF16, d, causal, forward_tasks(BIG_SEQLENS[1], causal))
                    for d in FLASH_HEAD_DIMS for causal in (False, True)])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", FORWARD_CASES)
def test_flash_forward(seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", seqlens, dtype, head_dim, causal,
                     hint=forward_hint(causal, seqlens))


# ---------------------------------------------------------------- GPU: rung 4, flash_backward
BACKWARD_CASES = ([_case_param(s, dtype, d, causal, BACKWARD_TASKS) for s in SMALL_SEQLENS for dtype in SIXTEEN_BIT
                   for d in FLASH_HEAD_DIMS for causal in (False, True)]
                  + [_case_param(BIG_SEQLENS[0], BF16, d, causal, BACKWARD_TASKS) for d in FLASH_HEAD_DIMS
                     for causal in (False, True)]
                  + [_case_param(BIG_SEQLENS[1], BF16, 128, causal, BACKWARD_TASKS) for causal in (False, True)])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", BACKWARD_CASES)
def test_flash_backward(seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_backward")
    run_backward_case(seqlens, dtype, head_dim, causal)
