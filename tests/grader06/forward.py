"""GPU: forward. bias_gelu in every dtype and form, on the 16-byte kernel and the scalar one (vectorized=False),
on 3-d inputs, on inputs not 16-byte aligned, and on empty ones."""
from __future__ import annotations

import pytest

import harness
from harness import requires_gpu
from harness.check import check_placement, dtype_name, shape_id

from .common import (
    BF16,
    BIG,
    DTYPES,
    FORMS,
    FP32,
    LAB,
    SCALAR_HINT,
    SHAPES,
    VECTOR_HINT,
    check_forward,
    forward,
    forward_case,
    forward_tasks,
    inputs,
    large_marks,
    takes_vectors,
)

__all__ = [
    "test_forward",
    "test_forward_scalar",
    "test_forward_3d",
    "test_forward_unaligned",
    "test_empty",
]


def _fwd_params(shapes, dtypes, forms, vectorized=True):
    return [pytest.param(shape, dtype, form, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                         marks=[harness.tasks(*forward_tasks(shape[-1], dtype, vectorized)), *large_marks(shape)])
            for shape in shapes for dtype in dtypes for form in forms]


FORWARD_PARAMS = _fwd_params(SHAPES, DTYPES, FORMS) + _fwd_params([BIG], [FP32, BF16], FORMS)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", FORWARD_PARAMS)
def test_forward(shape, dtype, approximate):
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate)
    y = forward(x, bias, approximate, case=case)
    check_forward(y, x, bias, approximate, case=case,
                  hint=VECTOR_HINT if takes_vectors(shape[-1], dtype) else SCALAR_HINT)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate",
                         _fwd_params([s for s in SHAPES if s[-1] % 8 == 0], DTYPES, FORMS, vectorized=False))
def test_forward_scalar(shape, dtype, approximate):
    """vectorized=False forces the scalar kernel on shapes the 16-byte kernel would otherwise take."""
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate, vectorized=False)
    y = forward(x, bias, approximate, vectorized=False, case=case)
    check_forward(y, x, bias, approximate, case=case)


SHAPES_3D = [(2, 3, 8), (4, 5, 4097), (3, 1, 3), (2, 64, 256)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", _fwd_params(SHAPES_3D, DTYPES, ["tanh"]))
def test_forward_3d(shape, dtype, approximate):
    """x (..., C): every leading dimension is rows."""
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate)
    y = forward(x, bias, approximate, case=case)
    check_forward(y, x, bias, approximate, case=case)


UNALIGNED_SHAPES = [(7, 8), (33, 4096), (5, 3, 16)]


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape", UNALIGNED_SHAPES, ids=shape_id)
@pytest.mark.parametrize("offset", ["x", "bias"], ids=["x+1", "bias+1"])
@harness.tasks("lab06.1", "lab06.2")
def test_forward_unaligned(offset, shape, dtype):
    """x (or bias) a contiguous view one element into its storage: not 16-byte aligned, though cols % V == 0.
    The launcher must see it and take the scalar kernel: a 16-byte access there is a 'misaligned address'."""
    x, bias, _ = inputs(shape, dtype, offset=offset)
    case = forward_case(x, dtype, "none", aligned=False) + f", {offset} = a view starting 1 element into its storage"
    y = forward(x, bias, case=case)
    check_forward(y, x, bias, "none", case=case)


@requires_gpu
@pytest.mark.parametrize("shape", [(0, 8), (3, 0, 8), (5, 0)], ids=shape_id)
@harness.reference_check  # the launchers return before any kernel when there is nothing to compute: given code
def test_empty(shape):
    x, bias, grad_y = inputs(shape, FP32)
    y = LAB.module.bias_gelu(x, bias)
    check_placement(y, shape=shape, like=x, name="y", case=f"bias_gelu of x {list(shape)}")
    grad_x, grad_bias = LAB.module.bias_gelu_backward(grad_y, x, bias)
    case = f"bias_gelu_backward of x {list(shape)}"
    check_placement(grad_x, shape=shape, like=x, name="grad_x", case=case)
    check_placement(grad_bias, shape=shape[-1:], like=bias, name="grad_bias", case=case)
    assert bool((grad_bias == 0).all()), f"{case}: grad_bias over zero rows must be all zeros, got {grad_bias.tolist()}"
