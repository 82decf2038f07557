"""Builds, and what runs without a GPU: the lab compiles and imports, its constants(), the wrapper's checks
of its arguments (on CPU tensors, and on fake CUDA ones), and autograd.py (lab06.5) run on stand-in ops on
the CPU (FakeOps)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import tolerance
from harness.check import second_derivative_refused
from harness.inputs import Arg

from .common import (
    AUTOGRAD_HINT,
    BF16,
    FORMS,
    FP32,
    FP64,
    LAB,
    _student,
    autograd_module,
    constants,
    golden_backward,
    golden_forward,
    inputs,
)

__all__ = [
    "test_builds",
    "test_constants",
    "test_refuses_cpu_tensors",
    "test_each_argument_checked",
    "test_refuses_unknown_approximate",
    "test_autograd_on_cpu",
    "test_second_derivative_raises_clearly",
]


@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports, and its autograd.py imports: checked on every machine, GPU or not."""
    for name in ("bias_gelu", "bias_gelu_backward", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    module = autograd_module()
    for name in ("BiasGelu", "bias_gelu"):
        assert hasattr(module, name), f"autograd.py defines no {name!r}"
    assert issubclass(module.BiasGelu, torch.autograd.Function), "autograd.py: BiasGelu must subclass "\
        "torch.autograd.Function"


@harness.reference_check  # the constants are given
def test_constants():
    c = constants()
    assert c["vector_bytes"] == 16, f"constants(): vector_bytes = {c['vector_bytes']}, the widest load is 16 bytes"
    assert c["threads_per_block"] % c["warp_size"] == 0, f"constants(): {c}: blocks of whole warps"
    assert c["backward_rows_per_chunk"] > 0, f"constants(): {c}"


@pytest.mark.parametrize("op", ["bias_gelu", "bias_gelu_backward"])
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors(op):
    x, bias = torch.ones(4, 8), torch.ones(8)
    call = (lambda: LAB.module.bias_gelu(x, bias)) if op == "bias_gelu" else (
        lambda: LAB.module.bias_gelu_backward(torch.ones(4, 8), x, bias))
    LAB.assert_raises_clearly(call, must_mention=("CUDA", ".cuda()"), case=f"{op}(tensors on the CPU)")


# Each tensor argument refused on its own, the others valid (harness.inputs): on fake CUDA tensors (no GPU needed)
# and on real ones. x sets the dtype (int32 is refused); bias and grad_y must match it. A strided bias is copied (C
# elements beside rows x C), so it is accepted; x and grad_y are refused.
_X = Arg("x", dtype=torch.int32, shape=lambda t: t[..., :-1], words={"dtype": ("dtype", "torch.float32")})
_BIAS = Arg("bias", dtype=BF16, shape=lambda t: t[:-1], strided=False)
ARGUMENTS = {"bias_gelu": (("x", "bias"), [_X, _BIAS]),
             "bias_gelu_backward": (("grad_y", "x", "bias"), [Arg("grad_y", dtype=FP64, shape=lambda t: t[:8]), _X,
                                                                _BIAS])}


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("op", list(ARGUMENTS))
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(op, real):
    names, specs = ARGUMENTS[op]

    def make_args():
        x, bias, grad_y = inputs((16, 16), FP32)
        return {name: {"x": x, "bias": bias, "grad_y": grad_y}[name] for name in names}

    harness.inputs.assert_each_argument_checked(op, getattr(LAB.module, op), make_args, specs, real=real)


@harness.reference_check
def test_refuses_unknown_approximate():
    x, bias = torch.ones(4, 8), torch.ones(8)
    for op, call in (("bias_gelu", lambda: LAB.module.bias_gelu(x, bias, approximate="tanhh")),
                     ("bias_gelu_backward", lambda: LAB.module.bias_gelu_backward(x, x, bias, approximate="erf"))):
        LAB.assert_raises_clearly(call, must_mention=("approximate", "none", "tanh"),
                                  case=f"{op}(..., approximate=<not 'none' or 'tanh'>)")


class FakeOps:
    """Stands in for the built extension on the CPU, so that autograd.py (lab06.5) is graded without a GPU:
    the same two functions, computed by PyTorch in float64 and returned detached (the real ops are not
    differentiable either), refusing a non-contiguous grad_y as the real wrapper does."""

    def __init__(self):
        self.calls: list[str] = []

    def bias_gelu(self, x, bias, approximate="none", vectorized=True):
        self.calls.append("bias_gelu")
        with torch.no_grad():
            return F.gelu(x + bias, approximate=approximate)

    def bias_gelu_backward(self, grad_y, x, bias, approximate="none", vectorized=True):
        self.calls.append("bias_gelu_backward")
        if not grad_y.is_contiguous():
            raise RuntimeError(f"bias_gelu_backward: grad_y must be contiguous, got strides {list(grad_y.stride())}; "
                               "call grad_y.contiguous() first")
        with torch.no_grad():
            grad_x = torch.ops.aten.gelu_backward(grad_y, x + bias, approximate=approximate)
            return grad_x, grad_x.reshape(-1, x.shape[-1]).sum(0)


@pytest.mark.parametrize("approximate", FORMS)
@harness.tasks("lab06.5")
def test_autograd_on_cpu(approximate):
    """autograd.py with stand-in ops on the CPU (FakeOps): forward calls ops.bias_gelu with the form, backward
    calls ops.bias_gelu_backward with a contiguous grad_y and returns the gradients in forward's input order;
    gradcheck passes; y.sum().backward() (whose grad_y is a stride-0 expanded 1) works."""
    module, ops = autograd_module(), FakeOps()
    x = torch.randn(3, 5, 8, dtype=FP64, requires_grad=True)
    bias = torch.randn(8, dtype=FP64, requires_grad=True)
    case = f"autograd.bias_gelu on the CPU with stand-in ops, approximate={approximate!r}"
    y = _student(f"{case}: forward", lambda: module.bias_gelu(x, bias, approximate, ops=ops))
    if "bias_gelu" not in ops.calls:
        raise harness.GradeFailure(f"{case}: forward never called ops.bias_gelu\n  hint: {AUTOGRAD_HINT}")
    LAB.assert_close(y, golden_forward(x, bias, approximate), case=f"{case}: y", tol=tolerance(FP64) * 4,
                     hint="pass approximate on to ops.bias_gelu: " + AUTOGRAD_HINT)
    _student(f"{case}: y.sum().backward()", lambda: y.sum().backward())
    golden_x, golden_b = golden_backward(torch.ones_like(y), x, bias, approximate)
    for name, got, want in (("x.grad", x.grad, golden_x), ("bias.grad", bias.grad, golden_b)):
        if got is None:
            raise harness.GradeFailure(f"{case}: y.sum().backward() left {name} None\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(got, want, case=f"{case}: {name} after y.sum().backward()", tol=tolerance(FP64, 64) * 4,
                         hint=AUTOGRAD_HINT)
    ok = _student(f"{case}: torch.autograd.gradcheck", lambda: torch.autograd.gradcheck(
        lambda a, b: module.bias_gelu(a, b, approximate, ops=ops), (x.detach().requires_grad_(),
                                                                     bias.detach().requires_grad_()),
        raise_exception=False))
    assert ok, f"{case}: torch.autograd.gradcheck failed\n  hint: {AUTOGRAD_HINT}"


@harness.tasks("lab06.5")
def test_second_derivative_raises_clearly():
    """backward is @once_differentiable: asking for a second derivative must raise autograd's clear error
    ("trying to differentiate twice"), not a confusing one, nor give a silently wrong number. (A backward
    that is itself differentiable is allowed: then gradgradcheck must pass.)"""
    module, ops = autograd_module(), FakeOps()
    x = torch.randn(4, 8, dtype=FP64, requires_grad=True)
    bias = torch.randn(8, dtype=FP64, requires_grad=True)
    y = _student("autograd.bias_gelu forward", lambda: module.bias_gelu(x, bias, ops=ops))
    grad_y = torch.randn_like(y, requires_grad=True)  # grad_y needs grad, so a second derivative can exist
    (grad_x,) = _student("autograd.grad(y, x, grad_y, create_graph=True)",
                         lambda: torch.autograd.grad(y, x, grad_y, create_graph=True))
    if second_derivative_refused(lambda: grad_x.sum().backward(), "BiasGelu"):
        return
    ok = torch.autograd.gradgradcheck(lambda a, b: module.bias_gelu(a, b, ops=ops),
                                      (x.detach().requires_grad_(), bias.detach().requires_grad_()),
                                      raise_exception=False)
    assert ok, ("a second derivative through BiasGelu ran but gives wrong numbers (gradgradcheck failed)\n  hint: "
                "mark backward @once_differentiable, so that a second derivative raises a clear error instead")
