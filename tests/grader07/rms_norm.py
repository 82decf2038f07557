"""RMSNorm on the GPU (lab07.4, lab07.5, lab07.6): the forward on every path and every shape, 3-D inputs, and
the rows where eps decides the result; the backward the same way, its staged kernel, and grad_weight bitwise the
same run after run.
"""
from __future__ import annotations

import pytest
import torch

import harness
from coursekit import jit
from grader07.common import (
    BF16,
    DTYPES,
    EPS,
    FP16,
    FP32,
    LAB,
    LARGE,
    PATTERN_SHAPE,
    RMS_LARGE_SCALE,
    RMS_PATTERNS,
    SHAPES,
    SHAPES_3D,
    _params,
    case_of,
    check_rms_norm,
    check_rms_norm_backward,
    constants,
    path_cases,
    randn,
    reference_rstd,
    rms_backward_case,
    rms_inputs,
    rms_norm,
    rms_norm_backward,
    rms_norm_backward_tasks,
    rms_norm_tasks,
    rows_of,
)
from harness import requires_gpu
from harness.check import dtype_name, shape_id

__all__ = [
    "test_rms_norm", "test_rms_norm_3d", "test_rms_norm_eps", "test_rms_norm_backward", "test_rms_norm_backward_3d",
    "test_rms_norm_backward_staged", "test_grad_weight_is_bitwise_deterministic",
]


# ---------------------------------------------------------------- GPU: RMSNorm forward
@requires_gpu
@pytest.mark.parametrize("shape, dtype, path", _params(path_cases(SHAPES, DTYPES), rms_norm_tasks))
def test_rms_norm(shape, dtype, path):
    x, weight, _ = rms_inputs(shape, dtype)
    case = case_of("rms_norm", x, path)
    y, rstd = rms_norm(x, weight, EPS, path, case=case)
    check_rms_norm(y, rstd, x, weight, EPS, case=case)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, path", _params([(s, d, "auto") for s in SHAPES_3D for d in (FP32, FP16, BF16)],
                                                       rms_norm_tasks))
def test_rms_norm_3d(shape, dtype, path):
    """x (B, S, H): rstd has shape (B, S)."""
    x, weight, _ = rms_inputs(shape, dtype)
    case = case_of("rms_norm", x, path)
    y, rstd = rms_norm(x, weight, EPS, path, case=case)
    check_rms_norm(y, rstd, x, weight, EPS, case=case)


@requires_gpu
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=dtype_name)
@pytest.mark.parametrize("path", ["registers", "streaming"])
@pytest.mark.parametrize("pattern", list(RMS_PATTERNS))
@harness.tasks("lab07.4")
def test_rms_norm_eps(pattern, path, dtype):
    scale, eps = RMS_PATTERNS[pattern]
    x = torch.randn(PATTERN_SHAPE, device="cuda") * (scale if scale is not None else RMS_LARGE_SCALE[dtype])
    if pattern == "zero rows":
        x[0] = 0.0
        x[3] = 0.0
    if dtype == FP16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(dtype)
    weight = randn(PATTERN_SHAPE[-1:], dtype)
    case = case_of("rms_norm", x, path, extra=f", '{pattern}' (eps = {eps:g})")
    y, rstd = rms_norm(x, weight, eps, path, case=case)
    check_rms_norm(y, rstd, x, weight, eps, case=case)


# ---------------------------------------------------------------- GPU: RMSNorm backward
@requires_gpu
@pytest.mark.parametrize("shape, dtype, path", _params(path_cases(SHAPES, DTYPES), rms_norm_backward_tasks))
def test_rms_norm_backward(shape, dtype, path):
    x, weight, grad_y = rms_inputs(shape, dtype)
    rstd = reference_rstd(x, EPS)
    case = rms_backward_case(x, path)
    grad_x, grad_weight = rms_norm_backward(grad_y, x, weight, rstd, path, case=case)
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS, case=case)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, path", _params([(s, d, "auto") for s in SHAPES_3D for d in (FP32, FP16, BF16)],
                                                       rms_norm_backward_tasks))
def test_rms_norm_backward_3d(shape, dtype, path):
    x, weight, grad_y = rms_inputs(shape, dtype)
    case = rms_backward_case(x, path)
    grad_x, grad_weight = rms_norm_backward(grad_y, x, weight, reference_rstd(x, EPS), path, case=case)
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS, case=case)


# The staged backward (rms_norm.cu: rms_norm_backward_staged_kernel), which 'auto' runs for rows that fill its row
# image (16-bit rows of 4096, float rows of 2048, 16-byte aligned) on a GPU that holds its 128 KiB ring (sm_80,
# sm_90). Cases: fewer rows than SMs (a block a row), last steps of 1-3 rows (1000 rows over 132 blocks: 7 or 8
# each), a 3-D input; and rows of 3000 and 2056, in its bucket but not filling it, which 'auto' leaves to the register
# kernel (staged_backward_blocks 0).
STAGED_CASES = [((7, 4096), FP16), ((1000, 4096), BF16), ((133, 4096), BF16), ((265, 2048), FP32), ((1, 2048), FP32),
                ((2, 300, 4096), FP16)]
NOT_STAGED_CASES = [((133, 3000), BF16), ((3, 2056), FP16)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype", [pytest.param(s, d, id=f"{shape_id(s)}-{dtype_name(d)}")
                                          for s, d in STAGED_CASES + NOT_STAGED_CASES])
@harness.tasks("lab07.5", "lab07.6")
def test_rms_norm_backward_staged(shape, dtype):
    """path='auto' in the staged kernel's bucket: the gradients pass the rule, and grad_x has the bits of
    path='registers', since both kernels run the same backward_row_sums and backward_row_grad_x."""
    x, weight, grad_y = rms_inputs(shape, dtype)
    rstd = reference_rstd(x, EPS)
    n, element_bytes = shape[-1], torch.empty((), dtype=dtype).element_size()
    blocks = int(LAB.module.staged_backward_blocks(element_bytes, rows_of(shape), n))
    (major, minor), shared_optin = jit.capability(), jit.shared_bytes_per_block_optin()
    # The ring, and 1 KiB for the kernel's static shared memory (its warps' dots: 256 bytes, ptxas 13.0).
    room = constants()["staged_shared_bytes"] + 1024
    if (shape, dtype) in NOT_STAGED_CASES:
        assert blocks == 0, f"staged_backward_blocks({element_bytes}, {rows_of(shape)}, {n}) is {blocks}, not 0"
    elif (major, minor) >= (8, 0) and shared_optin >= room:
        assert blocks > 0, (f"staged_backward_blocks({element_bytes}, {rows_of(shape)}, {n}) is 0 on a GPU of compute "
                            f"capability {major}.{minor} with "
                            f"{shared_optin} bytes of shared memory a block: the staged "
                            "kernel should run here")
    kernel = f"the staged kernel, {blocks} blocks" if blocks else "the register kernel (this GPU runs no staged one)"
    case = case_of("rms_norm_backward", x, "auto", extra=f"; {kernel}")
    grad_x, grad_weight = rms_norm_backward(grad_y, x, weight, rstd, "auto", case=case)
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS, case=case)
    register_x, _ = LAB.module.rms_norm_backward(grad_y, x, weight, rstd, path="registers")
    if not torch.equal(harness.calls.bits(grad_x), harness.calls.bits(register_x)):
        differ = int((grad_x != register_x).sum())
        raise harness.GradeFailure(
            f"{case}: grad_x differs from path='registers' in {differ} of {grad_x.numel()} elements\n  hint: both "
            "kernels compute a row with backward_row_sums and backward_row_grad_x; a result that depends on anything "
            "but the row's values (the kernel, the row's position, a value left from another row) differs between them")


DETERMINISM_CASES = [
    pytest.param(FP32, (16384, 1000), "registers", id="16384x1000-float32-registers"),  # a warp per row: 8 warps' sums
    # a block per row: 483 chunks of 17 (the register kernel), or one partial row a block of the staged kernel's grid
    pytest.param(BF16, (8197, 4096), "auto", id="8197x4096-bfloat16-auto"),
    pytest.param(BF16, (513, 65536), "streaming", id="513x65536-bfloat16-streaming", marks=LARGE),  # 257 chunks of 2
]


@requires_gpu
@pytest.mark.parametrize("dtype, shape, path", DETERMINISM_CASES)
@harness.tasks("lab07.5", "lab07.6")
def test_grad_weight_is_bitwise_deterministic(dtype, shape, path):
    """The same inputs give the same grad_weight bits on every one of 10 runs: the two-kernel sum's promise."""
    runs = 10
    x, weight, grad_y = rms_inputs(shape, dtype)
    rstd = reference_rstd(x, EPS)
    case = rms_backward_case(x, path)
    grad_x, first = rms_norm_backward(grad_y, x, weight, rstd, path, case=case)
    check_rms_norm_backward(grad_x, first, grad_y, x, weight, EPS, case=case)
    del grad_x
    with harness.calls.unchecked():  # the first call checked the inputs; nine more host copies are waste
        for run in range(2, runs + 1):
            _, again = LAB.module.rms_norm_backward(grad_y, x, weight, rstd, path=path)
            if not torch.equal(first, again):
                differ = (first != again).nonzero().flatten().tolist()
                raise harness.GradeFailure(
                    f"{case}: grad_weight of run {run} differs from run 1 in {len(differ)} of {shape[-1]} columns "
                    f"(the first, column {differ[0]}: {first[differ[0]].item()!r} then {again[differ[0]].item()!r}): "
                    "not bitwise identical\n  hint: every addition's order must be fixed by the shape: each block's "
                    "rows in a fixed order into its own row of partials, the warps' sums added in the order 0, 1, ..., "
                    "and the finalize adding the partial rows in order k = 0, 1, ...; atomicAdd adds in whatever "
                    "order the warps and blocks arrive, and float addition is not associative")

