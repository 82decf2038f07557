"""GPU: strided views of q, k and v, the softmax scale, and scores of up to ~1e4."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import (
    BACKWARD_HINT,
    BACKWARD_TASKS,
    BF16,
    FORWARD_HINT,
    FP16,
    FP32,
    FP32_HINT,
    NAIVE_HINT,
    SCALES,
    STRIDED,
    forward_tasks,
    heads_id,
    run_backward_case,
    run_forward_case,
    skip_before_sm80,
)
from harness import requires_gpu
from harness.attention import randn
from harness.check import dtype_name

__all__ = ["test_naive_strided", "test_flash_fp32_strided", "test_flash_forward_strided",
           "test_flash_backward_strided", "test_scale", "test_large_scores"]


# ---------------------------------------------------------------- GPU: strided views, the softmax scale
# The cases: STRIDED's layouts and heads, and SCALES (common.py, with their reasons).
def _strided_params(dtype, head_dim, tasks):
    return [pytest.param(layout, heads, dtype, head_dim, marks=harness.tasks(*tasks),
                         id=f"{layout}-{heads_id(heads)}-{dtype_name(dtype)}-d{head_dim}") for layout, heads in STRIDED]


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim", _strided_params(BF16, 40, ("lab08.1",)))
def test_naive_strided(layout, heads, dtype, head_dim):
    run_forward_case("attention_naive", "naive", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=NAIVE_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim", _strided_params(FP32, 64, ("lab08.2",)))
def test_flash_fp32_strided(layout, heads, dtype, head_dim):
    run_forward_case("flash_forward_fp32", "fp32", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=FP32_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim",
                         _strided_params(BF16, 64, forward_tasks((200, 200), True)) +
                         _strided_params(FP16, 128, forward_tasks((200, 200), True)))
def test_flash_forward_strided(layout, heads, dtype, head_dim):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=FORWARD_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim",
                         _strided_params(BF16, 64, BACKWARD_TASKS) + _strided_params(FP16, 128, BACKWARD_TASKS))
def test_flash_backward_strided(layout, heads, dtype, head_dim):
    skip_before_sm80("flash_backward")
    run_backward_case((200, 200), dtype, head_dim, True, heads=heads, layout=layout)


SCALE_RUNGS = {
    "attention_naive": ("naive", FP16, 64, ("lab08.1",), NAIVE_HINT),
    "flash_forward_fp32": ("fp32", FP32, 128, ("lab08.2",), FP32_HINT),
    "flash_forward": ("forward", BF16, 128, forward_tasks((113, 203), True), FORWARD_HINT),
    "flash_backward": ("backward", BF16, 128, BACKWARD_TASKS, BACKWARD_HINT),
}


@requires_gpu
@pytest.mark.parametrize("op, scale", [pytest.param(op, scale, marks=harness.tasks(*SCALE_RUNGS[op][3]),
                                                    id=f"{op}-scale{scale:g}")
                                       for op in SCALE_RUNGS for scale in SCALES])
def test_scale(op, scale):
    """The softmax scale passed on (not 1 / sqrt(head_dim)), at 113 x 203, causal."""
    rung, dtype, head_dim, _, hint = SCALE_RUNGS[op]
    if rung in ("forward", "backward"):
        skip_before_sm80(op)
    if op == "flash_backward":
        run_backward_case((113, 203), dtype, head_dim, True, scale=scale)
    else:
        run_forward_case(op, rung, (113, 203), dtype, head_dim, True, scale=scale,
                         hint=hint + "; scale is an argument: S = scale q k^T")


# Scores of about +-1e4 (issue 34, class b): the online softmax subtracts the running max before each exp (exp(89)
# overflows float32, and a row whose scores are all -1e4 underflows to 0 / 0), and the backward's exp(s - lse) is one
# exp, not exp(s) / exp(lse). q and k hold small integers (-4 .. 4, exact in every dtype), so each q . k is an exact
# integer in float32 and, with scale 64 (a power of two), each score exact: two scores tie exactly or differ by 64 or
# more (exp(-64) adds nothing), and what is left to compare is the kernels' own rounding, as with ordinary scores. At
# head_dim 128 a row's largest score is ~1e4 (64 x ~2.7 x 75, the std of q . k).
LARGE_SCORE_SCALE = 64.0
# The float32 rung is held to float32's tolerance (3.5e-5), and the exp2 form of the online softmax (one FMA, s scale
# log2(e) - m scale log2(e), then ex2: the lesson's and FlashAttention's) rounds its argument to float32 first: at
# scores of ~1e4 that is ~1e-3 of absolute error in the exponent, 1e-3 relative in P (the reference, on an H200:
# 700 of 86784 elements of o off by ~1e-3). Scale 0.5 (exact) keeps a row's largest score at ~100-150: past exp's
# float32 range (88.7), so an unshifted exp still overflows, and within the exp2 form's float32 accuracy.
LARGE_SCORE_SCALES = {"flash_forward_fp32": 0.5}


def integer_qk(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout="contiguous"):
    """make_qkv's q, k, v with q and k drawn from the integers -4 .. 4 (v ~ N(0, 1)); contiguous only."""
    q = torch.randint(-4, 5, (batch, seqlen_q, heads_q, head_dim), device="cuda").to(dtype)
    k = torch.randint(-4, 5, (batch, seqlen_k, heads_kv, head_dim), device="cuda").to(dtype)
    return q, k, randn((batch, seqlen_k, heads_kv, head_dim), dtype)


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*SCALE_RUNGS[op][3])) for op in SCALE_RUNGS])
def test_large_scores(op):
    """Every rung at 113 x 203, causal, with scores of up to ~1e4 (exact: integer q and k, scale 64; the float32
    rung up to ~100-150, LARGE_SCORE_SCALES)."""
    rung, dtype, head_dim, _, hint = SCALE_RUNGS[op]
    if rung in ("forward", "backward"):
        skip_before_sm80(op)
    scale = LARGE_SCORE_SCALES.get(op, LARGE_SCORE_SCALE)
    what = f", integer q and k (scores up to ~{scale * 225:.0f})"
    if op == "flash_backward":
        run_backward_case((113, 203), dtype, head_dim, True, scale=scale, make=integer_qk, what=what)
    else:
        run_forward_case(op, rung, (113, 203), dtype, head_dim, True, scale=scale, make=integer_qk,
                         what=what, hint=hint + "; subtract the row's running max before every exp (exp(89) is inf "
                         "in float32), and never compute exp(s) and exp(-m) apart")
