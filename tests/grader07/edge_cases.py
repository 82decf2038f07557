"""Both ops at the edges of their inputs, on the GPU: unaligned (a view one element into its storage: scalar
loads), empty, and past 2^31 elements (the indexing in int64).
"""
from __future__ import annotations

import pytest
import torch

import harness
from grader07.common import (
    BF16,
    EPS,
    FP32,
    FP64,
    GRAD_WEIGHT_HINT,
    INT64_HINT,
    LAB,
    LARGE,
    RSTD_PLACEMENT_HINT,
    SOFTMAX_SCALE,
    case_of,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    check_softmax_backward,
    golden_rms_norm,
    golden_rms_norm_backward,
    golden_softmax,
    golden_softmax_backward,
    grad_weight_tol,
    offset_view,
    randn,
    reference_rstd,
    require_on_chip,
    rms_backward_case,
    rms_inputs,
    rms_norm,
    rms_norm_backward,
    rms_norm_backward_tasks,
    rms_norm_tasks,
    row_tol,
    rstd_tol,
    softmax,
    softmax_backward,
    softmax_backward_inputs,
    softmax_backward_tasks,
    softmax_hint,
    softmax_tasks,
)
from harness import requires_gpu
from harness.check import check_placement, column_sum, dtype_name, run_past_2_31, shape_id

__all__ = [
    "test_softmax_unaligned", "test_softmax_backward_unaligned", "test_rms_norm_unaligned",
    "test_rms_norm_backward_unaligned", "test_empty", "test_softmax_past_2_31_elements",
    "test_rms_norm_past_2_31_elements", "test_softmax_backward_past_2_31_elements",
    "test_rms_norm_backward_past_2_31_elements",
]


# ---------------------------------------------------------------- GPU: unaligned inputs, the scalar loads
UNALIGNED = [((7, 32), FP32), ((5, 4096), BF16), ((2, 65536), FP32)]


def _unaligned_params(offsets, tasks_of):
    return [pytest.param(offset, shape, dtype, id=f"{offset}+1-{shape_id(shape)}-{dtype_name(dtype)}",
                         marks=harness.tasks(*tasks_of(shape[-1], dtype, "auto")))
            for offset in offsets for shape, dtype in UNALIGNED]


@requires_gpu
@pytest.mark.parametrize("offset, shape, dtype", _unaligned_params(["x"], softmax_tasks))
def test_softmax_unaligned(offset, shape, dtype):
    """x a contiguous view one element into its storage: not 16-byte aligned, though n % V == 0. The launcher must
    see it and take scalar loads: a 16-byte access there is a 'misaligned address'."""
    x = offset_view(randn(shape, dtype, SOFTMAX_SCALE))
    case = case_of("softmax", x, "auto", aligned=False, extra=", x a view 1 element into its storage")
    hint = softmax_hint(shape[-1], dtype, "auto")
    check_softmax(softmax(x, case=case), x, case=case, hint=hint)


@requires_gpu
@pytest.mark.parametrize("offset, shape, dtype", _unaligned_params(["grad_y", "y"], softmax_backward_tasks))
def test_softmax_backward_unaligned(offset, shape, dtype):
    grad_y, y = softmax_backward_inputs(shape, dtype)
    grad_y, y = (offset_view(grad_y), y) if offset == "grad_y" else (grad_y, offset_view(y))
    case = case_of("softmax_backward", y, "auto", aligned=False, extra=f", {offset} a view 1 element into its storage")
    check_softmax_backward(softmax_backward(grad_y, y, case=case), grad_y, y, case=case)


@requires_gpu
@pytest.mark.parametrize("offset, shape, dtype", _unaligned_params(["x", "weight"], rms_norm_tasks))
def test_rms_norm_unaligned(offset, shape, dtype):
    x, weight, _ = rms_inputs(shape, dtype)
    x, weight = (offset_view(x), weight) if offset == "x" else (x, offset_view(weight))
    case = case_of("rms_norm", x, "auto", aligned=False, extra=f", {offset} a view 1 element into its storage")
    y, rstd = rms_norm(x, weight, case=case)
    check_rms_norm(y, rstd, x, weight, EPS, case=case)


@requires_gpu
@pytest.mark.parametrize("offset, shape, dtype", _unaligned_params(["x", "grad_y", "weight"], rms_norm_backward_tasks))
def test_rms_norm_backward_unaligned(offset, shape, dtype):
    x, weight, grad_y = rms_inputs(shape, dtype)
    rstd = reference_rstd(x, EPS)
    if offset == "x":
        x = offset_view(x)
    elif offset == "grad_y":
        grad_y = offset_view(grad_y)
    else:
        weight = offset_view(weight)
    case = rms_backward_case(x, "auto", aligned=False, extra=f", {offset} a view 1 element into its storage")
    grad_x, grad_weight = rms_norm_backward(grad_y, x, weight, rstd, case=case)
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS, case=case)


# ---------------------------------------------------------------- GPU: empty inputs
@requires_gpu
@pytest.mark.parametrize("shape", [(0, 8), (3, 0, 8), (5, 0)], ids=shape_id)
@harness.reference_check  # the launchers return before any kernel when there is nothing to compute: given code
def test_empty(shape):
    x, weight, grad_y = rms_inputs(shape, FP32)
    y = LAB.module.softmax(x)
    check_placement(y, shape=shape, like=x, name="y", case=f"softmax of x {list(shape)}")
    grad_x = LAB.module.softmax_backward(grad_y, y)
    check_placement(grad_x, shape=shape, like=x, name="grad_x", case=f"softmax_backward of x {list(shape)}")
    if shape[-1] == 0:
        return  # RMSNorm of rows of no elements: the mean of nothing is NaN (as torch's); not graded
    y, rstd = LAB.module.rms_norm(x, weight)
    case = f"rms_norm of x {list(shape)}"
    check_placement(y, shape=shape, like=x, name="y", case=case)
    check_placement(rstd, shape=shape[:-1], like=x, dtype=FP32, name="rstd", case=case, hint=RSTD_PLACEMENT_HINT)
    grad_x, grad_weight = LAB.module.rms_norm_backward(grad_y, x, weight, rstd)
    case = f"rms_norm_backward of x {list(shape)}"
    check_placement(grad_x, shape=shape, like=x, name="grad_x", case=case)
    check_placement(grad_weight, shape=shape[-1:], like=weight, name="grad_weight", case=case)
    assert bool((grad_weight == 0).all()), (
        f"{case}: grad_weight over zero rows must be all zeros, got {grad_weight.tolist()}")


# ---------------------------------------------------------------- GPU: past 2^31 elements
# bfloat16, 4 GiB a tensor: (2^16 + 1) x 2^15 = 2^31 + 2^15 elements with rows of 32768 (streaming: past the
# longest register row), and (2^19 + 1) x 4096 = 2^31 + 4096 with rows of 4096 (the register path, a block per row).
# In both the last row starts past element 2^31 - 1: a row offset row * n kept in an int wraps there. The on-chip
# forward (float32 and float64 only) in float32, 8 GiB a tensor: (2^15 + 1) x 2^16 = 2^31 + 2^16 elements, rows of
# 65536 that fill its registers and its shared memory.
HUGE = {"registers": (2**19 + 1, 4096), "streaming": (2**16 + 1, 2**15), "on_chip": (2**15 + 1, 2**16)}
HUGE_DTYPE = {"registers": BF16, "streaming": BF16, "on_chip": FP32}


def _rows_reference(rows_fn, n):
    """assert_ends_close's reference_of for a per-row op: the float64 result of the rows that the flat slice
    touches (rows_fn(r0, r1) -> float64 (r1 - r0, n)), cut to the slice."""
    def reference_of(part):
        r0, r1 = part.start // n, (part.stop - 1) // n + 1
        return rows_fn(r0, r1).reshape(-1)[part.start - r0 * n:part.stop - r0 * n]
    return reference_of


def _huge_case(what, x, path):
    return case_of(what, x, path, extra=f", {x.numel()} elements = 2^31 + {x.numel() - 2**31}")


@requires_gpu
@LARGE
@pytest.mark.parametrize("path", [pytest.param("registers", marks=harness.tasks("lab07.1")),
                                  pytest.param("streaming", marks=harness.tasks("lab07.2")),
                                  pytest.param("on_chip", marks=harness.tasks("lab07.2"))])
def test_softmax_past_2_31_elements(path, gpu_memory):
    dtype = HUGE_DTYPE[path]
    if path == "on_chip":
        require_on_chip("softmax", HUGE[path][-1], dtype)
    gpu_memory(12 if dtype == BF16 else 20)
    x = torch.randn(HUGE[path], dtype=dtype, device="cuda")
    n = x.shape[-1]
    case = _huge_case("softmax", x, path)
    y = run_past_2_31(lambda: LAB.module.softmax(x, path=path), case, hint=INT64_HINT)
    check_placement(y, shape=x.shape, like=x, name="y", case=case)
    harness.check.assert_ends_close(y, _rows_reference(lambda r0, r1: golden_softmax(x[r0:r1]), n), case=case,
                                    tol=row_tol(dtype, n), hint=INT64_HINT)


@requires_gpu
@LARGE
@pytest.mark.parametrize("path", ["registers", "streaming"])
@harness.tasks("lab07.4")
def test_rms_norm_past_2_31_elements(path, gpu_memory):
    gpu_memory(12)
    x = torch.randn(HUGE[path], dtype=BF16, device="cuda")
    weight = torch.randn(x.shape[-1], dtype=BF16, device="cuda")
    n = x.shape[-1]
    case = _huge_case("rms_norm", x, path)
    y, rstd = run_past_2_31(lambda: LAB.module.rms_norm(x, weight, path=path), case, hint=INT64_HINT)
    check_placement(y, shape=x.shape, like=x, name="y", case=case)
    check_placement(rstd, shape=x.shape[:-1], like=x, dtype=FP32, name="rstd", case=case)
    rows = x.shape[0]
    for part in (slice(0, 2), slice(rows - 2, rows)):
        LAB.assert_close(rstd[part], golden_rms_norm(x[part], weight, EPS)[1], case=f"{case}: rstd of rows "
                         f"{part.start} .. {part.stop - 1}", tol=rstd_tol(BF16, n), hint=INT64_HINT)
    harness.check.assert_ends_close(y, _rows_reference(lambda r0, r1: golden_rms_norm(x[r0:r1], weight, EPS)[0], n),
                                    case=case, tol=row_tol(BF16, n), hint=INT64_HINT)


@requires_gpu
@LARGE
@pytest.mark.parametrize("path", [pytest.param("streaming", marks=harness.tasks("lab07.3")),
                                  pytest.param("on_chip", marks=harness.reference_check)])  # given code
def test_softmax_backward_past_2_31_elements(path, gpu_memory):
    shape = HUGE["streaming"]
    if path == "on_chip":
        require_on_chip("softmax_backward", shape[-1], BF16)
    gpu_memory(16)
    y = torch.rand(shape, dtype=BF16, device="cuda") / shape[-1]  # positive, about 1/n: the scale of a softmax
    grad_y = torch.randn(shape, dtype=BF16, device="cuda")
    n = shape[-1]
    case = _huge_case("softmax_backward", y, path)
    grad_x = run_past_2_31(lambda: LAB.module.softmax_backward(grad_y, y, path=path), case, hint=INT64_HINT)
    check_placement(grad_x, shape=shape, like=y, name="grad_x", case=case)
    harness.check.assert_ends_close(
        grad_x, _rows_reference(lambda r0, r1: golden_softmax_backward(grad_y[r0:r1], y[r0:r1]), n), case=case,
        tol=row_tol(BF16, n), hint=INT64_HINT)


@requires_gpu
@LARGE
@harness.tasks("lab07.5", "lab07.6")
def test_rms_norm_backward_past_2_31_elements(gpu_memory):
    """grad_x checked at its first and last elements, grad_weight (every column sums 65537 rows) in full."""
    gpu_memory(20)
    shape = HUGE["streaming"]
    x = torch.randn(shape, dtype=BF16, device="cuda")
    weight = torch.randn(shape[-1], dtype=BF16, device="cuda")
    grad_y = torch.randn(shape, dtype=BF16, device="cuda")
    n, rows = shape[-1], shape[0]
    rstd = torch.cat([reference_rstd(x[r:r + 2048], EPS) for r in range(0, rows, 2048)])
    case = _huge_case("rms_norm_backward", x, "auto")
    grad_x, grad_weight = run_past_2_31(lambda: LAB.module.rms_norm_backward(grad_y, x, weight, rstd), case,
                                        hint=INT64_HINT)
    check_placement(grad_x, shape=shape, like=x, name="grad_x", case=case)
    check_placement(grad_weight, shape=(n,), like=weight, name="grad_weight", case=case)
    harness.check.assert_ends_close(
        grad_x, _rows_reference(lambda r0, r1: golden_rms_norm_backward(grad_y[r0:r1], x[r0:r1], weight, EPS)[0], n),
        case=f"{case}: grad_x", tol=row_tol(BF16, n), hint=INT64_HINT)
    del grad_x
    golden = torch.zeros(n, dtype=FP64, device="cuda")
    for start in range(0, rows, 2048):  # float64 in slices of 2048 rows: 512 MiB at a time
        part = slice(start, start + 2048)
        golden += column_sum(grad_y[part].double() * x[part].double() * rstd[part].double().unsqueeze(-1))
    LAB.assert_close(grad_weight, golden, case=f"{case}: grad_weight", tol=grad_weight_tol(BF16, rows, n),
                     hint=INT64_HINT + "; " + GRAD_WEIGHT_HINT)
