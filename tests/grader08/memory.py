"""GPU: no hidden copy of strided inputs, and peak memory O(seqlen)."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import (
    BACKWARD_PATH,
    BACKWARD_TASKS,
    BF16,
    FORWARD_PATH,
    FP32,
    LAB,
    LARGE,
    _lse_bytes,
    skip_before_sm80,
)
from harness import requires_gpu
from harness.attention import make_qkv, randn
from harness.check import dtype_name, nbytes

__all__ = ["test_no_hidden_copy", "test_memory_is_linear_in_seqlen"]


# ---------------------------------------------------------------- GPU: no hidden copy, memory O(N)
def _peak_bytes(fn):
    """(result, bytes allocated at the peak of fn() beyond what was allocated before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with harness.calls.unchecked():  # the per-call checks' snapshots are host copies, but keep the count clean
        result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


NO_COPY_OPS = {"flash_forward_fp32": (FP32, ("lab08.2",)), "flash_forward": (BF16, ("lab08.3", "lab08.4")),
               "flash_backward": (BF16, BACKWARD_TASKS)}
MIB = 2**20


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*NO_COPY_OPS[op][1])) for op in NO_COPY_OPS])
def test_no_hidden_copy(op):
    """On q, k, v sliced from one packed (batch, seqlen, 3, heads, head_dim) tensor, the op's peak memory is its
    outputs and workspaces (the backward's D and float32 dQ, attention.h) plus 4 MiB: a .contiguous() copy of q, k
    or v (32 MiB each here) would show."""
    dtype = NO_COPY_OPS[op][0]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    q, k, v = make_qkv(4, 4096, 4096, 8, 8, 128, dtype, "packed-qkv")
    if op == "flash_backward":
        grad_o, o = randn(q.shape, dtype), randn(q.shape, dtype)
        lse = torch.zeros(4, 8, 4096, device="cuda")
        grads, peak = _peak_bytes(
            lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH))
        allowed = sum(nbytes(g) for g in grads) + q.numel() * 4 + _lse_bytes(q)
    else:
        (o, lse), peak = _peak_bytes(lambda: getattr(LAB.module, op)(q, k, v, causal=True))
        allowed = nbytes(o) + nbytes(lse)
    if peak > allowed + 4 * MIB:
        raise harness.GradeFailure(
            f"{op} of q, k, v sliced from one packed {list(q.shape[:2])} x 3 x {list(q.shape[2:])} "
            f"{dtype_name(dtype)} tensor (seq stride {q.stride(1)}): peak memory {peak / MIB:.1f} MiB, but its outputs "
            f"and workspaces are {allowed / MIB:.1f} MiB (each of q, k, v is {nbytes(q) / MIB:.0f} MiB)\n  hint: no "
            ".contiguous() (or .clone()) of the inputs: pass their strides (q.stride(0), q.stride(1), q.stride(2)) "
            "to the kernel and read through them")


@requires_gpu
@LARGE
@harness.tasks("lab08.1", "lab08.3", "lab08.4", *BACKWARD_TASKS)
def test_memory_is_linear_in_seqlen():
    """At seqlen 16384 (one head, d 64, bfloat16) the naive forward's peak memory holds the float32 scores (1 GiB);
    flash_forward's and flash_backward's stay at their outputs and workspaces, O(seqlen): the page's table."""
    skip_before_sm80("flash_forward")
    seqlen = 16384
    q, k, v = make_qkv(1, seqlen, seqlen, 1, 1, 64, BF16)
    _, naive = _peak_bytes(lambda: LAB.module.attention_naive(q, k, v, causal=True))
    (o, lse), forward = _peak_bytes(lambda: LAB.module.flash_forward(q, k, v, causal=True, path=FORWARD_PATH))
    grad_o = randn(q.shape, BF16)
    grads, backward = _peak_bytes(
        lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH))
    linear = 3 * nbytes(q) + q.numel() * 4 + 2 * _lse_bytes(q)  # outputs, dQ accumulator, lse and D
    print(f"peak memory at seqlen {seqlen}: naive {naive / MIB:.1f} MiB, flash forward {forward / MIB:.1f} MiB, "
          f"flash backward {backward / MIB:.1f} MiB")
    scores = seqlen * seqlen * 4
    assert naive >= scores, (f"attention_naive at seqlen {seqlen}: peak {naive / MIB:.1f} MiB, less than its "
                             f"float32 scores ({scores / MIB:.0f} MiB): the baseline is not the one the page describes")
    for what, peak in (("flash_forward", forward), ("flash_backward", backward)):
        if peak > linear + 4 * MIB:
            raise harness.GradeFailure(
                f"{what} at seqlen {seqlen}: peak memory {peak / MIB:.1f} MiB, above the O(seqlen) outputs and "
                f"workspaces ({linear / MIB:.1f} MiB); the naive rung's is {naive / MIB:.0f} MiB\n  hint: S and P "
                "never leave the chip: no (seqlen_q, seqlen_k) buffer, and no copy of the inputs")
