"""Every kernel and memset of the four ops on PyTorch's current stream: all captured in one CUDA graph on a side
stream, then replayed on fresh inputs and checked.
"""
from __future__ import annotations

import torch

import harness
from grader07.common import (
    BF16,
    EPS,
    FP32,
    LAB,
    check_rms_norm,
    check_softmax,
    check_softmax_backward,
    grad_weight_tol,
    on_chip_row,
    reference_rstd,
    rms_inputs,
    row_tol,
    rows_of,
)
from harness import requires_gpu
from harness.check import column_sum

__all__ = ["test_runs_on_current_stream"]


# ---------------------------------------------------------------- GPU: every op on the current stream
@requires_gpu
@harness.tasks("lab07.1", "lab07.2", "lab07.3", "lab07.4", "lab07.5", "lab07.6")
def test_runs_on_current_stream():
    """Every kernel and memset of the four ops must run on PyTorch's current stream: checked by capturing them all
    in one CUDA graph on a side stream and replaying it on fresh inputs (harness.STREAM_HINT says why)."""
    x, weight, grad_y = rms_inputs((64, 256), FP32)  # a warp per row, 16-byte loads
    long_x, long_weight, long_grad_y = rms_inputs((5, 4097), BF16)  # scalar loads
    y, long_y = torch.softmax(x, -1), torch.softmax(long_x.float(), -1).to(BF16)
    rstd, long_rstd = reference_rstd(x, EPS), reference_rstd(long_x, EPS)
    empty_x, empty_weight, empty_grad_y = rms_inputs((0, 16), FP32)  # grad_weight of no rows: a memset
    empty_rstd = reference_rstd(empty_x, EPS)
    m = LAB.module
    on_chip_forward = on_chip_row(FP32, False) >= 256  # asked here, not while the graph is captured
    on_chip_backward = on_chip_row(FP32, True) >= 4097 and on_chip_row(BF16, True) >= 4097

    def run_all():
        outs = {}
        for path in ("registers", "streaming"):
            outs[f"softmax 64x256 float32, {path}"] = m.softmax(x, path=path)
            outs[f"softmax 5x4097 bfloat16, {path}"] = m.softmax(long_x, path=path)
            outs[f"softmax_backward 64x256 float32, {path}"] = m.softmax_backward(grad_y, y, path=path)
            outs[f"softmax_backward 5x4097 bfloat16, {path}"] = m.softmax_backward(long_grad_y, long_y, path=path)
            outs[f"rms_norm 64x256 float32, {path}"] = m.rms_norm(x, weight, path=path)
            outs[f"rms_norm 5x4097 bfloat16, {path}"] = m.rms_norm(long_x, long_weight, path=path)
            outs[f"rms_norm_backward 64x256 float32, {path}"] = m.rms_norm_backward(grad_y, x, weight, rstd, path=path)
            outs[f"rms_norm_backward 5x4097 bfloat16, {path}"] = m.rms_norm_backward(long_grad_y, long_x, long_weight,
                                                                                    long_rstd, path=path)
        outs["rms_norm_backward 0 rows"] = m.rms_norm_backward(empty_grad_y, empty_x, empty_weight, empty_rstd)
        # The on-chip softmax, where this GPU runs it: the forward's kernel, the backward's cluster launch
        # (cudaLaunchKernelEx, with the stream in its configuration).
        if on_chip_forward:
            outs["softmax 64x256 float32, on_chip"] = m.softmax(x, path="on_chip")
        if on_chip_backward:
            outs["softmax_backward 64x256 float32, on_chip"] = m.softmax_backward(grad_y, y, path="on_chip")
            outs["softmax_backward 5x4097 bfloat16, on_chip"] = m.softmax_backward(long_grad_y, long_y, path="on_chip")
        return outs

    outs = LAB.capture_on_current_stream(
        run_all, inputs=(x, weight, grad_y, long_x, long_weight, long_grad_y), case="the lab's four ops")
    # The replay ran on fresh x, weight and grad_y; y and rstd (inputs of the backward) were kept as they were.
    hint = harness.STREAM_HINT
    for name, out in outs.items():
        case = name + " replayed from a CUDA graph"
        short = "64x256" in name
        a, w, g, yy, r = (x, weight, grad_y, y, rstd) if short else (long_x, long_weight, long_grad_y, long_y,
                                                                    long_rstd)
        if "0 rows" in name:
            assert bool((out[1] == 0).all()), (f"{case}: grad_weight must be zeros, got {out[1].tolist()}\n"
                                               f"  hint: {hint}")
        elif name.startswith("softmax_backward"):
            check_softmax_backward(out, g, yy, case=case, hint=hint)
        elif name.startswith("softmax"):
            check_softmax(out, a, case=case, hint=hint)
        elif name.startswith("rms_norm_backward"):
            # The backward used the rstd it was captured with (of the old x); its reference uses the same rstd.
            check_rms_norm_backward_with_rstd(*out, g, a, w, r, case=case, hint=hint)
        else:
            check_rms_norm(*out, a, w, EPS, case=case, hint=hint)


def check_rms_norm_backward_with_rstd(grad_x, grad_weight, grad_y, x, weight, rstd, *, case, hint):
    """The backward's formula in float64 from a given rstd (which need not be x's): for the graph replay, whose x is
    fresh and whose rstd is the captured one."""
    n = x.shape[-1]
    r = rstd.double().unsqueeze(-1)
    g = weight.double() * grad_y.double()
    x64 = x.double()
    golden_x = r * g - r**3 * x64 * (g * x64).mean(-1, keepdim=True)
    golden_w = column_sum(grad_y.double() * x64 * r)
    LAB.assert_close(grad_x, golden_x, case=f"{case}: grad_x", tol=row_tol(x.dtype, n), hint=hint)
    LAB.assert_close(grad_weight, golden_w, case=f"{case}: grad_weight", tol=grad_weight_tol(x.dtype, rows_of(x.shape),
                                                                                             n), hint=hint)
