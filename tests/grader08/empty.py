"""GPU: empty sizes (batch 0, seqlen_q 0, seqlen_k 0)."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import BACKWARD_PATH, BACKWARD_TASKS, BF16, FP32, LAB, LSE_HINT, check_forward, skip_before_sm80
from harness import requires_gpu
from harness.attention import describe, make_qkv, randn
from harness.check import check_placement

__all__ = ["test_empty"]


# ---------------------------------------------------------------- GPU: empty sizes
EMPTY_SHAPES = {"batch 0": (0, 16, 16), "seqlen_q 0": (2, 0, 16), "seqlen_k 0": (2, 16, 0)}
EMPTY_OPS = {"attention_naive": (FP32, ("lab08.1",)), "flash_forward_fp32": (FP32, ("lab08.2",)),
             "flash_forward": (BF16, ("lab08.3", "lab08.4")), "flash_backward": (BF16, BACKWARD_TASKS)}


@requires_gpu
@pytest.mark.parametrize("op, what", [pytest.param(op, what, marks=harness.tasks(*EMPTY_OPS[op][1]),
                                                   id=f"{op}-{what.replace(' ', '')}")
                                      for op in EMPTY_OPS for what in EMPTY_SHAPES])
def test_empty(op, what):
    """batch 0, seqlen_q 0, seqlen_k 0: no crash, outputs of the right shapes; with no key o = 0 and lse = -inf
    (grad_q = 0); with no query grad_k = grad_v = 0."""
    dtype = EMPTY_OPS[op][0]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    batch, seqlen_q, seqlen_k = EMPTY_SHAPES[what]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 2, 2, 64, dtype)
    case = f"{op} with {what} ({describe(q, k, causal=True)})"
    if op != "flash_backward":
        o, lse = getattr(LAB.module, op)(q, k, v, causal=True)
        torch.cuda.synchronize()
        check_forward(o, lse, q, k, v, causal=True, scale=None, rung="naive", case=case, hint=LSE_HINT)
        return
    grad_o = randn(q.shape, dtype)
    o = torch.zeros_like(q)
    lse = torch.full((batch, 2, seqlen_q), float("-inf"), device=q.device)
    grads = LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH)
    torch.cuda.synchronize()
    for name, got, like in zip(("grad_q", "grad_k", "grad_v"), grads, (q, k, v)):
        check_placement(got, shape=like.shape, like=like, name=name, case=case)
        if got.numel() and not bool((got == 0).all()):
            raise harness.GradeFailure(f"{case}: {name} must be all zeros (nothing to sum), got "
                                       f"{int((got != 0).sum())} nonzero elements\n  hint: zero grad_k and grad_v "
                                       "(and the float32 dQ accumulator) before any early return")
