"""GPU: through autograd (autograd.py, lab06.5). The lab's kernels through the student's torch.autograd.Function:
against float64 autograd, under gradcheck, with a grad_y that is not contiguous, and under loss.backward()
through a small MLP."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import random_tensor, requires_gpu, tolerance
from harness.check import dtype_name, shape_id

from .common import (
    AUTOGRAD_HINT,
    BACKWARD_HINT,
    DTYPES,
    FORMS,
    FP32,
    FP64,
    LAB,
    _student,
    autograd_module,
    check_backward,
    check_forward,
    forward_tasks,
    inputs,
)

__all__ = [
    "test_autograd",
    "test_gradcheck",
    "test_autograd_non_contiguous_grad_y",
    "test_loss_backward_through_a_small_mlp",
]


def autograd_tasks(cols, dtype) -> tuple[str, ...]:
    return (*forward_tasks(cols, dtype), "lab06.4", "lab06.5")


AUTOGRAD_SHAPES = [(7, 3), (33, 64), (2, 5, 4097)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", [
    pytest.param(shape, dtype, form, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                 marks=harness.tasks(*autograd_tasks(shape[-1], dtype)))
    for shape in AUTOGRAD_SHAPES for dtype in DTYPES for form in FORMS])
def test_autograd(shape, dtype, approximate):
    """y = autograd.bias_gelu(x, bias, approximate, ops=lab) and torch.autograd.grad(y, (x, bias), grad_y):
    the lab's kernels, through the student's Function, against float64 autograd of F.gelu(x + b)."""
    x, bias, grad_y = inputs(shape, dtype)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    case = f"autograd.bias_gelu of x {shape_id(shape)} {dtype_name(dtype)}, approximate={approximate!r}"
    y = _student(f"{case}: forward", lambda: fn(x, bias, approximate, ops=LAB.module))
    check_forward(y.detach(), x.detach(), bias.detach(), approximate, case=f"{case}: y")
    if y.grad_fn is None:
        raise harness.GradeFailure(f"{case}: y has no grad_fn: it is not connected to x and bias\n  hint: "
                                   + AUTOGRAD_HINT)
    grad_x, grad_bias = _student(f"{case}: torch.autograd.grad",
                                 lambda: torch.autograd.grad(y, (x, bias), grad_y))
    check_backward(grad_x, grad_bias, grad_y, x.detach(), bias.detach(), approximate, case=case,
                   hint=BACKWARD_HINT + "; " + AUTOGRAD_HINT)


@requires_gpu
@pytest.mark.parametrize("shape, approximate", [
    pytest.param(shape, form, id=f"{shape_id(shape)}-{form}", marks=harness.tasks(*autograd_tasks(shape[-1], FP64)))
    for shape in [(4, 3), (3, 8), (2, 3, 2)] for form in FORMS])
def test_gradcheck(shape, approximate):
    """torch.autograd.gradcheck in float64 on the real kernels, through the student's Function: the analytic
    gradients (the backward kernel) against finite differences of the forward kernel."""
    fn = autograd_module().bias_gelu
    x = random_tensor(shape, FP64).requires_grad_()
    bias = random_tensor(shape[-1:], FP64).requires_grad_()
    case = f"gradcheck of autograd.bias_gelu on x {shape_id(shape)} float64, approximate={approximate!r}"
    try:
        torch.autograd.gradcheck(lambda a, b: fn(a, b, approximate, ops=LAB.module), (x, bias))
    except torch.autograd.gradcheck.GradcheckError as error:
        raise harness.GradeFailure(f"{case}: {str(error)[:1500]}\n  hint: the float64 path must compute in double "
                                   "(Compute<double> = double: erf, tanh and exp of double, not erff); "
                                   + BACKWARD_HINT) from None


@requires_gpu
@pytest.mark.parametrize("how", ["y.sum()", "transposed"])
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_autograd_non_contiguous_grad_y(how):
    """grad_y need not be contiguous: y.sum()'s is a 1 expanded to y's shape (every stride 0), a transposed
    view's is transposed. The Function must accept both (the op itself refuses them)."""
    x, bias, _ = inputs((64, 256), FP32)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    y = fn(x, bias, ops=LAB.module)
    grad_y = torch.ones_like(y).expand_as(y) if how == "y.sum()" else random_tensor((256, 64), FP32).t()
    case = f"autograd.bias_gelu of x 64x256 float32, grad_y {how} (strides {list(grad_y.stride())})"
    if how == "y.sum()":
        _student(f"{case}: y.sum().backward()", lambda: y.sum().backward())
        grad_x, grad_bias = x.grad, bias.grad
    else:
        grad_x, grad_bias = _student(case, lambda: torch.autograd.grad(y, (x, bias), grad_y))
    check_backward(grad_x, grad_bias, grad_y.contiguous(), x.detach(), bias.detach(), "none", case=case,
                   hint=AUTOGRAD_HINT, grad_bias_hint=AUTOGRAD_HINT)


@requires_gpu
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_loss_backward_through_a_small_mlp():
    """loss.backward() through Linear -> bias_gelu -> Linear -> MSE, in float32: every parameter's gradient
    against the same model in float64 with F.gelu(h + b1)."""
    fn = autograd_module().bias_gelu
    x = random_tensor((2, 33, 64), FP32)
    w1 = (random_tensor((96, 64), FP32) / 8).requires_grad_()
    b1 = random_tensor((96,), FP32).requires_grad_()
    w2 = (random_tensor((40, 96), FP32) / 10).requires_grad_()
    target = random_tensor((2, 33, 40), FP32)

    def model(gelu, x_, w1_, b1_, w2_):
        return F.mse_loss(gelu(x_ @ w1_.t(), b1_) @ w2_.t(), target.to(x_.dtype))

    case = "loss.backward() through x @ w1.T -> autograd.bias_gelu(., b1) -> @ w2.T -> mse_loss, float32"
    loss = _student(f"{case}: forward", lambda: model(lambda h, b: fn(h, b, ops=LAB.module), x, w1, b1, w2))
    _student(f"{case}: loss.backward()", loss.backward)
    params64 = [p.detach().double().requires_grad_() for p in (w1, b1, w2)]
    loss64 = model(lambda h, b: F.gelu(h + b), x.double(), *params64)
    loss64.backward()
    tol = tolerance(FP32, 4096) * 2  # products and sums over 64-132 terms, then the GELU: 2x its u sqrt(K)
    LAB.assert_close(loss.detach(), loss64.detach(), case=f"{case}: the loss", tol=tol, hint=AUTOGRAD_HINT)
    for name, p, p64 in zip(("w1", "b1", "w2"), (w1, b1, w2), params64):
        if p.grad is None:
            raise harness.GradeFailure(f"{case}: {name}.grad is None after loss.backward()\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(p.grad, p64.grad, case=f"{case}: {name}.grad", tol=tol, hint=AUTOGRAD_HINT)
