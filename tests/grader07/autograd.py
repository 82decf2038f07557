"""autograd.py (lab07.7), the torch.autograd.Functions over the lab's ops. Without a GPU, on stand-in ops
(FakeOps): forward and backward call the ops as they should, gradcheck passes, a second derivative raises clearly.
On the GPU, through the lab's kernels: against float64 autograd of the composition, gradcheck on every path
(PathOps), loss.backward() through a small model.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from grader07.common import (
    AUTOGRAD_HINT,
    DTYPES,
    EPS,
    FP32,
    FP64,
    GRAD_WEIGHT_HINT,
    LAB,
    RMS_BACKWARD_HINT,
    SOFTMAX_BACKWARD_HINT,
    autograd_module,
    check_rms_norm_backward,
    check_softmax,
    check_softmax_backward,
    golden_rms_norm,
    require_on_chip,
    rms_inputs,
    rms_norm_composition,
    row_tol,
    softmax_backward_tasks,
    softmax_tasks,
)
from harness import random_tensor, requires_gpu, tolerance
from harness.check import check_placement, dtype_name, first_line, run_student, second_derivative_refused, shape_id

# The tests in their order. Those of the section without a GPU (stand-in ops) are collected with the build's,
# before any kernel's; the others after the kernels' (tests/test_07_fused_normalization.py gathers them).
WITHOUT_GPU = ["test_autograd_on_cpu", "test_second_derivative_raises_clearly"]
__all__ = [*WITHOUT_GPU, "test_autograd", "test_gradcheck", "test_loss_backward_through_a_small_model"]


# ---------------------------------------------------------------- autograd.py without a GPU (stand-in ops)
class FakeOps:
    """Stands in for the built extension on the CPU, so that autograd.py (lab07.7) is graded without a GPU: the
    same four functions, computed by PyTorch and returned detached (the real ops are not differentiable either),
    refusing a non-contiguous grad_y as the real wrapper does."""

    def __init__(self):
        self.calls: list[str] = []

    def _check(self, op, grad_y=None):
        self.calls.append(op)
        if grad_y is not None and not grad_y.is_contiguous():
            raise RuntimeError(f"{op}: grad_y must be contiguous, got strides {list(grad_y.stride())}; "
                               "call grad_y.contiguous() first")

    def softmax(self, x, path="auto"):
        self._check("softmax")
        with torch.no_grad():
            return torch.softmax(x, -1)

    def softmax_backward(self, grad_y, y, path="auto"):
        self._check("softmax_backward", grad_y)
        with torch.no_grad():
            return y * (grad_y - (grad_y * y).sum(-1, keepdim=True))

    def rms_norm(self, x, weight, eps=EPS, path="auto"):
        self._check("rms_norm")
        with torch.no_grad():
            rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
            return x * rstd.unsqueeze(-1) * weight, rstd

    def rms_norm_backward(self, grad_y, x, weight, rstd, path="auto"):
        self._check("rms_norm_backward", grad_y)
        with torch.no_grad():
            r = rstd.unsqueeze(-1)
            g = weight * grad_y
            grad_x = r * g - r**3 * x * (g * x).mean(-1, keepdim=True)
            return grad_x, (grad_y * x * r).reshape(-1, x.shape[-1]).sum(0)


class PathOps:
    """The built extension with every op pinned to one path: autograd.py's Functions call the ops without a path
    (they take 'auto'), and the grader runs them through both paths with this in place of the module."""

    def __init__(self, ops, path: str):
        self.ops, self.path = ops, path

    def softmax(self, x, path="auto"):
        return self.ops.softmax(x, path=self.path)

    def softmax_backward(self, grad_y, y, path="auto"):
        return self.ops.softmax_backward(grad_y, y, path=self.path)

    def rms_norm(self, x, weight, eps=EPS, path="auto"):
        return self.ops.rms_norm(x, weight, eps=eps, path=self.path)

    def rms_norm_backward(self, grad_y, x, weight, rstd, path="auto"):
        return self.ops.rms_norm_backward(grad_y, x, weight, rstd, path=self.path)


def _student(what: str, fn):
    return run_student(what, fn, hint=AUTOGRAD_HINT)


def _apply(module, op, ops, eps=EPS):
    """A function of the tensors alone that calls autograd.py's softmax or rms_norm with ops (and eps)."""
    if op == "softmax":
        return lambda x: module.softmax(x, ops=ops)
    return lambda x, weight: module.rms_norm(x, weight, eps, ops=ops)


def _golden_of(op, eps=EPS):
    return (lambda x: torch.softmax(x.double(), -1)) if op == "softmax" else (
        lambda x, weight: rms_norm_composition(x.double(), weight.double(), eps))


@pytest.mark.parametrize("op", ["softmax", "rms_norm"])
@harness.tasks("lab07.7")
def test_autograd_on_cpu(op):
    """autograd.py with stand-in ops on the CPU (FakeOps): forward calls the op (with eps), backward calls its
    backward with a contiguous grad_y and returns the gradients in forward's input order; gradcheck passes. The
    grad_y of a transposed use of y is a transposed view, and that of y.sum() a 1 expanded to y's shape (every
    stride 0): the Function must pass both on contiguous (the ops refuse strided tensors)."""
    module, ops = autograd_module(), FakeOps()
    eps = 0.01  # not the default: a Function that drops eps gives other numbers
    x = torch.randn(3, 5, 8, dtype=FP64, requires_grad=True)
    weight = torch.randn(8, dtype=FP64, requires_grad=True)
    inputs = (x,) if op == "softmax" else (x, weight)
    fn = _apply(module, op, ops, eps=eps)
    case = f"autograd.{op} on the CPU with stand-in ops"
    y = _student(f"{case}: forward", lambda: fn(*inputs))
    if op not in ops.calls:
        raise harness.GradeFailure(f"{case}: forward never called ops.{op}\n  hint: {AUTOGRAD_HINT}")
    if not isinstance(y, torch.Tensor):
        raise harness.GradeFailure(f"{case}: forward returned {type(y).__name__}, not the tensor y (rms_norm returns "
                                   f"y alone: rstd is saved for the backward)\n  hint: {AUTOGRAD_HINT}")
    LAB.assert_close(y, _golden_of(op, eps=eps)(*inputs), case=f"{case}: y", tol=tolerance(FP64, 8) * 4,
                     hint="pass eps on to the op: " + AUTOGRAD_HINT)
    c = torch.randn(8, 5, dtype=FP64)

    def loss_of(out):  # its gradient with respect to out is a transposed, non-contiguous view
        return (out.transpose(-1, -2) * c).sum()

    _student(f"{case}: loss.backward() with a transposed grad_y", lambda: loss_of(y).backward())
    if f"{op}_backward" not in ops.calls:
        raise harness.GradeFailure(f"{case}: backward never called ops.{op}_backward\n  hint: {AUTOGRAD_HINT}")
    x64 = [t.detach().requires_grad_() for t in inputs]
    golden = torch.autograd.grad(loss_of(_golden_of(op, eps=eps)(*x64)), x64)
    for name, got, want in zip(("x.grad", "weight.grad"), (t.grad for t in inputs), golden):
        if got is None:
            raise harness.GradeFailure(f"{case}: backward left {name} None\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(got, want, case=f"{case}: {name}", tol=tolerance(FP64, 64) * 4, hint=AUTOGRAD_HINT)
    again = _student(f"{case}: forward", lambda: fn(*inputs))
    _student(f"{case}: y.sum().backward() (grad_y a 1 expanded to y's shape, strides 0)",
             lambda: again.sum().backward())
    ok = _student(f"{case}: torch.autograd.gradcheck", lambda: torch.autograd.gradcheck(
        fn, tuple(t.detach().requires_grad_() for t in inputs), raise_exception=False))
    assert ok, f"{case}: torch.autograd.gradcheck failed\n  hint: {AUTOGRAD_HINT}"


@pytest.mark.parametrize("op", ["softmax", "rms_norm"])
@harness.tasks("lab07.7")
def test_second_derivative_raises_clearly(op):
    """backward is @once_differentiable: asking for a second derivative must raise autograd's clear error
    ("trying to differentiate twice"), not a confusing one, nor give a silently wrong number. (A backward that is
    itself differentiable is allowed: then gradgradcheck must pass.)"""
    module, ops = autograd_module(), FakeOps()
    x = torch.randn(4, 8, dtype=FP64, requires_grad=True)
    weight = torch.randn(8, dtype=FP64, requires_grad=True)
    inputs = (x,) if op == "softmax" else (x, weight)
    fn = _apply(module, op, ops)
    y = _student(f"autograd.{op} forward", lambda: fn(*inputs))
    grad_y = torch.randn_like(y, requires_grad=True)  # grad_y needs grad, so a second derivative can exist
    (grad_x,) = _student(f"autograd.grad(autograd.{op}(x), x, grad_y, create_graph=True)",
                         lambda: torch.autograd.grad(y, x, grad_y, create_graph=True))
    if second_derivative_refused(lambda: grad_x.sum().backward(), f"autograd.{op}"):
        return
    ok = torch.autograd.gradgradcheck(fn, tuple(t.detach().requires_grad_() for t in inputs), raise_exception=False)
    assert ok, (f"a second derivative through autograd.{op} ran but gives wrong numbers (gradgradcheck failed)\n  "
                "hint: mark backward @once_differentiable, so that a second derivative raises a clear error instead")


# ---------------------------------------------------------------- GPU: through autograd (autograd.py, lab07.7)
AUTOGRAD_SHAPES = [(7, 33), (2, 5, 4097), (3, 65536)]


def _autograd_tasks(op, n, dtype, path="auto"):
    kernels = (*softmax_tasks(n, dtype, path), *softmax_backward_tasks(n, dtype, path)) if op == "softmax" else (
        "lab07.4", "lab07.5", "lab07.6")
    return (*kernels, "lab07.7")


@requires_gpu
@pytest.mark.parametrize("op, shape, dtype", [
    pytest.param(op, shape, dtype, id=f"{op}-{shape_id(shape)}-{dtype_name(dtype)}",
                 marks=harness.tasks(*_autograd_tasks(op, shape[-1], dtype)))
    for op in ("softmax", "rms_norm") for shape in AUTOGRAD_SHAPES for dtype in DTYPES])
def test_autograd(op, shape, dtype):
    """y = autograd.softmax(x, ops=lab) or autograd.rms_norm(x, weight, ops=lab), then torch.autograd.grad(y, inputs,
    grad_y): the lab's kernels through the student's Function, against float64 autograd of the composition."""
    module = autograd_module()
    x, weight, grad_y = rms_inputs(shape, dtype)
    x.requires_grad_()
    weight.requires_grad_()
    inputs = (x,) if op == "softmax" else (x, weight)
    fn = _apply(module, op, LAB.module)
    case = f"autograd.{op} of x {shape_id(shape)} {dtype_name(dtype)}"
    y = _student(f"{case}: forward", lambda: fn(*inputs))
    if y.grad_fn is None:
        raise harness.GradeFailure(f"{case}: y has no grad_fn: it is not connected to the inputs\n  hint: "
                                   + AUTOGRAD_HINT)
    grads = _student(f"{case}: torch.autograd.grad", lambda: torch.autograd.grad(y, inputs, grad_y))
    if op == "softmax":
        check_softmax(y.detach(), x.detach(), case=f"{case}: y", hint=AUTOGRAD_HINT)
        check_softmax_backward(grads[0], grad_y, y.detach(), case=case, hint=SOFTMAX_BACKWARD_HINT + "; "
                               + AUTOGRAD_HINT)
    else:
        golden_y, _ = golden_rms_norm(x.detach(), weight.detach(), EPS)
        check_placement(y, shape=shape, like=x, name="y", case=case)
        LAB.assert_close(y, golden_y, case=f"{case}: y", tol=row_tol(dtype, shape[-1]), hint=AUTOGRAD_HINT)
        check_rms_norm_backward(*grads, grad_y, x.detach(), weight.detach(), EPS, case=case,
                                hint=RMS_BACKWARD_HINT + "; " + AUTOGRAD_HINT,
                                grad_weight_hint=GRAD_WEIGHT_HINT + "; " + AUTOGRAD_HINT)


@requires_gpu
@pytest.mark.parametrize("op, shape, path", [
    pytest.param(op, shape, path, id=f"{op}-{shape_id(shape)}-{path}",
                 marks=harness.tasks(*_autograd_tasks(op, shape[-1], FP64, path)))
    for op in ("softmax", "rms_norm") for shape in [(4, 3), (3, 8), (2, 3, 5)]
    for path in ("registers", "streaming", *(("on_chip",) if op == "softmax" else ()))])
def test_gradcheck(op, shape, path):
    """torch.autograd.gradcheck in float64 on the real kernels, every path, through the student's Function: the
    analytic gradients (the backward kernels) against finite differences of the forward kernels."""
    if path == "on_chip":
        require_on_chip("softmax", shape[-1], FP64)
        require_on_chip("softmax_backward", shape[-1], FP64)
    module = autograd_module()
    x = random_tensor(shape, FP64).requires_grad_()
    weight = random_tensor(shape[-1:], FP64).requires_grad_()
    inputs = (x,) if op == "softmax" else (x, weight)
    case = f"gradcheck of autograd.{op} on x {shape_id(shape)} float64, path={path!r}"
    try:
        torch.autograd.gradcheck(_apply(module, op, PathOps(LAB.module, path)), inputs)
    except torch.autograd.gradcheck.GradcheckError as error:
        raise harness.GradeFailure(f"{case}: {str(error)[:1500]}\n  hint: the float64 path must compute in double "
                                   "(Compute<double> = double: exp and rsqrt of double); "
                                   + (SOFTMAX_BACKWARD_HINT if op == "softmax" else RMS_BACKWARD_HINT)) from None
    except harness.GradeFailure:
        raise
    except Exception as error:
        raise harness.GradeFailure(f"{case} raised {type(error).__name__}: {first_line(error)}\n"
                                   f"  hint: {AUTOGRAD_HINT}") from None


@requires_gpu
@harness.tasks("lab07.4", "lab07.5", "lab07.6", "lab07.7")
def test_loss_backward_through_a_small_model():
    """loss.backward() through Linear -> autograd.rms_norm -> Linear -> autograd.softmax -> MSE, in float32: every
    parameter's gradient against the same model in float64 with the compositions."""
    module = autograd_module()
    x = random_tensor((2, 33, 64), FP32)
    w1 = (random_tensor((96, 64), FP32) / 8).requires_grad_()
    g = (1 + 0.1 * random_tensor((96,), FP32)).requires_grad_()
    w2 = (random_tensor((40, 96), FP32) / 10).requires_grad_()
    target = torch.softmax(random_tensor((2, 33, 40), FP32), -1)

    def model(norm, soft, x_, w1_, g_, w2_):
        return F.mse_loss(soft(norm(x_ @ w1_.t(), g_) @ w2_.t()), target.to(x_.dtype))

    case = ("loss.backward() through x @ w1.T -> autograd.rms_norm(., g) -> @ w2.T -> autograd.softmax -> mse_loss, "
            "float32")
    loss = _student(f"{case}: forward", lambda: model(lambda h, w: module.rms_norm(h, w, ops=LAB.module),
                                                      lambda h: module.softmax(h, ops=LAB.module), x, w1, g, w2))
    _student(f"{case}: loss.backward()", loss.backward)
    params64 = [p.detach().double().requires_grad_() for p in (w1, g, w2)]
    loss64 = model(lambda h, w: rms_norm_composition(h, w, EPS), lambda h: torch.softmax(h, -1), x.double(), *params64)
    loss64.backward()
    tol = tolerance(FP32, 4096) * 4  # products and sums over 64-132 terms, a 96-long and a 40-long row reduction
    LAB.assert_close(loss.detach(), loss64.detach(), case=f"{case}: the loss", tol=tol, hint=AUTOGRAD_HINT)
    for name, p, p64 in zip(("w1", "g", "w2"), (w1, g, w2), params64):
        if p.grad is None:
            raise harness.GradeFailure(f"{case}: {name}.grad is None after loss.backward()\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(p.grad, p64.grad, case=f"{case}: {name}.grad", tol=tol, hint=AUTOGRAD_HINT)
