"""GPU: batch and heads, GQA, for every rung."""
from __future__ import annotations

import pytest

import harness
from grader08.common import (
    BACKWARD_TASKS,
    BF16,
    FP32,
    FP32_HINT,
    GQA_HINT,
    HEADS,
    HEADS_SEQLENS,
    NAIVE_HINT,
    forward_hint,
    forward_tasks,
    heads_id,
    mask_name,
    run_backward_case,
    run_forward_case,
    seqlen_id,
    skip_before_sm80,
)
from harness import requires_gpu
from harness.check import dtype_name

__all__ = ["test_naive_heads", "test_flash_fp32_heads", "test_flash_forward_heads", "test_flash_backward_heads"]


# ---------------------------------------------------------------- GPU: batch and heads, GQA
# The cases: HEADS at HEADS_SEQLENS (common.py, with their reasons).
def _heads_params(dtypes, head_dims, tasks_of):
    return [pytest.param(heads, seqlens, dtype, d, causal, marks=harness.tasks(*tasks_of(seqlens, causal)),
                         id=f"{seqlen_id(seqlens)}-{heads_id(heads)}-{dtype_name(dtype)}-d{d}-{mask_name(causal)}")
            for heads in HEADS for seqlens, causal in HEADS_SEQLENS for dtype in dtypes for d in head_dims]


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((FP32,), (33,), lambda s, c: ("lab08.1",)))
def test_naive_heads(heads, seqlens, dtype, head_dim, causal):
    run_forward_case("attention_naive", "naive", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=NAIVE_HINT + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((FP32,), (64,), lambda s, c: ("lab08.2",)))
def test_flash_fp32_heads(heads, seqlens, dtype, head_dim, causal):
    run_forward_case("flash_forward_fp32", "fp32", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=FP32_HINT + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal", _heads_params((BF16,), (64, 128), forward_tasks))
def test_flash_forward_heads(heads, seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=forward_hint(causal, seqlens) + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((BF16,), (64, 128), lambda s, c: BACKWARD_TASKS))
def test_flash_backward_heads(heads, seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_backward")
    run_backward_case(seqlens, dtype, head_dim, causal, heads=heads)
