"""GPU: every op on the current stream. Every kernel and memset of both ops captured in a CUDA graph and
replayed."""
from __future__ import annotations

import harness
from harness import requires_gpu

from .common import BF16, FP32, LAB, check_backward, check_forward, inputs

__all__ = [
    "test_runs_on_current_stream",
]


@requires_gpu
@harness.tasks("lab06.1", "lab06.2", "lab06.3", "lab06.4")
def test_runs_on_current_stream():
    """Every kernel and memset of both ops must run on PyTorch's current stream: checked by capturing them all
    in one CUDA graph on a side stream and replaying it on fresh inputs (harness.STREAM_HINT says why)."""
    x, bias, grad_y = inputs((64, 256), FP32)  # 256 % 4 == 0: the 16-byte kernels
    odd_x, odd_bias, odd_grad_y = inputs((33, 3), BF16)  # the scalar kernels, chosen by the launcher
    empty_x, empty_bias, empty_grad_y = inputs((0, 16), FP32)  # grad_bias of no rows: a memset

    def run_all():
        return {
            "bias_gelu (16-byte kernel)": LAB.module.bias_gelu(x, bias, approximate="tanh"),
            "bias_gelu (vectorized=False)": LAB.module.bias_gelu(x, bias, vectorized=False),
            "bias_gelu (33x3 bfloat16, scalar)": LAB.module.bias_gelu(odd_x, odd_bias),
            "bias_gelu_backward (16-byte loads)": LAB.module.bias_gelu_backward(grad_y, x, bias),
            "bias_gelu_backward (vectorized=False)": LAB.module.bias_gelu_backward(grad_y, x, bias, vectorized=False),
            "bias_gelu_backward (33x3 bfloat16)": LAB.module.bias_gelu_backward(odd_grad_y, odd_x, odd_bias),
            "bias_gelu_backward (0 rows)": LAB.module.bias_gelu_backward(empty_grad_y, empty_x, empty_bias),
        }

    outs = LAB.capture_on_current_stream(run_all, inputs=(x, bias, grad_y, odd_x, odd_bias, odd_grad_y),
                                         case="bias_gelu and bias_gelu_backward")
    replayed = " replayed from a CUDA graph"
    hint = harness.STREAM_HINT
    for name, out in outs.items():
        case = name + replayed
        if "(0 rows)" in name:
            assert bool((out[1] == 0).all()), f"{case}: grad_bias must be zeros, got {out[1].tolist()}\n  hint: {hint}"
        elif name.startswith("bias_gelu_backward"):
            g, a, b = (odd_grad_y, odd_x, odd_bias) if "33x3" in name else (grad_y, x, bias)
            check_backward(*out, g, a, b, "none", case=case, hint=hint, grad_bias_hint=hint)
        else:
            a, b = (odd_x, odd_bias) if "33x3" in name else (x, bias)
            check_forward(out, a, b, "tanh" if "16-byte" in name else "none", case=case, hint=hint)
