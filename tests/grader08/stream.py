"""GPU: every op on the current stream (captured in a CUDA graph on a side stream)."""
from __future__ import annotations

import pytest

import harness
from grader08.common import (
    BACKWARD_PATH,
    BACKWARD_TASKS,
    BF16,
    FP16,
    FP32,
    LAB,
    check_backward,
    check_forward,
    forward_tasks,
    skip_before_sm80,
)
from harness import attention, requires_gpu
from harness.attention import describe, golden, make_qkv, randn

__all__ = ["test_runs_on_current_stream"]


# ---------------------------------------------------------------- GPU: every op on the current stream
STREAM_OPS = {"attention_naive": (FP16, 33, ("lab08.1",)), "flash_forward_fp32": (FP32, 64, ("lab08.2",)),
              "flash_forward": (BF16, 64, forward_tasks((113, 203), True)),
              "flash_backward": (BF16, 128, BACKWARD_TASKS)}


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*STREAM_OPS[op][2])) for op in STREAM_OPS])
def test_runs_on_current_stream(op):
    """Every kernel, memset and copy of each op runs on PyTorch's current stream: the op is captured in a CUDA graph
    on a side stream and replayed on fresh inputs (harness.STREAM_HINT says why). The backward's fresh input is
    grad_o (q, k, v, o and lse stay, so that lse still belongs to q and k)."""
    dtype, head_dim, _ = STREAM_OPS[op]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    q, k, v = make_qkv(2, 113, 203, 4, 2, head_dim, dtype)
    case = f"{op} of {describe(q, k, causal=True)}, replayed from a CUDA graph"
    if op != "flash_backward":
        o, lse = LAB.capture_on_current_stream(lambda: getattr(LAB.module, op)(q, k, v, causal=True),
                                               inputs=(q, k, v), case=op)
        rung = {"attention_naive": "naive", "flash_forward_fp32": "fp32"}.get(op, "forward")
        check_forward(o, lse, q, k, v, causal=True, scale=None, rung=rung, case=case, hint=harness.STREAM_HINT)
        return
    grad_o = randn(q.shape, dtype)
    o = attention.same_dtype_attention(q, k, v, True, None).contiguous()
    lse = golden(q, k, v, True, None)["lse"].float()
    grads = LAB.capture_on_current_stream(lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True,
                                                                            path=BACKWARD_PATH),
                                          inputs=(grad_o,), case=op)
    check_backward(grads, grad_o, q, k, v, o, causal=True, scale=None, case=case, hint=harness.STREAM_HINT)
