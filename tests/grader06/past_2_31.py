"""GPU: past 2^31 elements. Both ops on a bfloat16 tensor of 2^31 + 2^15 elements, with the 16-byte kernels and
the scalar ones: every index and count must be int64_t."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import requires_gpu
from harness.check import check_placement, run_past_2_31

from .common import (
    BF16,
    FP64,
    GRAD_BIAS_HINT,
    INT64_HINT,
    LAB,
    LARGE,
    backward_case,
    elementwise_tol,
    forward_case,
    grad_bias_tol,
)

__all__ = [
    "test_forward_past_2_31_elements",
    "test_backward_past_2_31_elements",
]


# (2^16 + 1) x 2^15 bfloat16: 2^31 + 2^15 elements, 4 GiB a tensor. cols % 8 == 0, so the default path is the
# 16-byte kernel (whose vector indices stay below 2^31); vectorized=False runs the scalar kernel, whose element
# index passes 2^31.
HUGE = (2**16 + 1, 2**15)


def huge_inputs(with_grad_y: bool):
    x = torch.randn(HUGE, dtype=BF16, device="cuda")
    bias = torch.randn(HUGE[1], dtype=BF16, device="cuda")
    return x, bias, (torch.randn(HUGE, dtype=BF16, device="cuda") if with_grad_y else None)


def _columns(part: slice, cols: int):
    return torch.arange(part.start, part.stop, device="cuda") % cols


@requires_gpu
@LARGE
@pytest.mark.parametrize("vectorized", [pytest.param(True, id="vectorized", marks=harness.tasks("lab06.1", "lab06.3")),
                                        pytest.param(False, id="scalar", marks=harness.tasks("lab06.1", "lab06.2"))])
def test_forward_past_2_31_elements(vectorized, gpu_memory):
    gpu_memory(12)
    x, bias, _ = huge_inputs(False)
    case = forward_case(x, BF16, "none", vectorized) + f", {x.numel()} elements = 2^31 + {x.numel() - 2**31}"
    y = run_past_2_31(lambda: LAB.module.bias_gelu(x, bias, vectorized=vectorized), case, hint=INT64_HINT)
    check_placement(y, shape=HUGE, like=x, name="y", case=case)
    flat_x, b64 = x.reshape(-1), bias.double()
    harness.check.assert_ends_close(
        y, lambda part: F.gelu(flat_x[part].double() + b64[_columns(part, HUGE[1])]), case=case,
        tol=elementwise_tol(BF16), hint=INT64_HINT)


@requires_gpu
@LARGE
@pytest.mark.parametrize("vectorized", [True, False], ids=["vectorized", "scalar"])
@harness.tasks("lab06.1", "lab06.4")
def test_backward_past_2_31_elements(vectorized, gpu_memory):
    """grad_x checked at its first and last elements, grad_bias (every column sums 65537 rows) in full."""
    gpu_memory(20)
    x, bias, grad_y = huge_inputs(True)
    case = backward_case(x, BF16, "none", vectorized) + f", {x.numel()} elements = 2^31 + {x.numel() - 2**31}"
    grad_x, grad_bias = run_past_2_31(lambda: LAB.module.bias_gelu_backward(grad_y, x, bias, vectorized=vectorized),
                                      case, hint=INT64_HINT)
    check_placement(grad_x, shape=HUGE, like=x, name="grad_x", case=case)
    check_placement(grad_bias, shape=HUGE[1:], like=bias, name="grad_bias", case=case)
    flat_x, flat_g, b64 = x.reshape(-1), grad_y.reshape(-1), bias.double()

    def grad_x_of(part):
        u = flat_x[part].double() + b64[_columns(part, HUGE[1])]
        return torch.ops.aten.gelu_backward(flat_g[part].double(), u)

    harness.check.assert_ends_close(grad_x, grad_x_of, case=f"{case}: grad_x", tol=elementwise_tol(BF16),
                                    hint=INT64_HINT)
    del grad_x
    golden = torch.zeros(HUGE[1], dtype=FP64, device="cuda")
    for start in range(0, HUGE[0], 2048):  # float64 in slices of 2048 rows: 512 MiB at a time
        rows = slice(start, start + 2048)
        golden += harness.check.column_sum(torch.ops.aten.gelu_backward(grad_y[rows].double(), x[rows].double() + b64))
    LAB.assert_close(grad_bias, golden, case=f"{case}: grad_bias", tol=grad_bias_tol(BF16, HUGE[0]),
                     hint=INT64_HINT + "; " + GRAD_BIAS_HINT)
