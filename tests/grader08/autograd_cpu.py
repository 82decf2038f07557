"""autograd.py (lab08.9) without a GPU: FlashAttention over stand-in ops (FakeOps) on the CPU."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import AUTOGRAD_HINT, FP64, LAB, _model_inputs, _student, autograd_module, mask_name
from harness.attention import MODEL
from harness.check import second_derivative_refused

__all__ = ["test_autograd_on_cpu", "test_autograd_second_derivative_raises_clearly"]


# ---------------------------------------------------------------- autograd.py without a GPU (stand-in ops)
class FakeOps:
    """Stands in for the built extension on the CPU, so that autograd.py (lab08.9) is graded without a GPU: the
    forward and backward computed by flash_model.py's reference and returned detached (the real ops are not
    differentiable either), refusing a non-contiguous grad_o as the real wrapper does."""

    def __init__(self):
        self.calls: list[tuple] = []

    def flash_forward(self, q, k, v, causal=False, scale=None):
        self.calls.append(("flash_forward", bool(causal), scale))
        with torch.no_grad():
            o, lse = MODEL.reference_forward(q, k, v, causal, scale)
        return o.to(q.dtype), lse.float()

    def flash_backward(self, grad_o, q, k, v, o, lse, causal=False, scale=None):
        self.calls.append(("flash_backward", bool(causal), scale))
        if not grad_o.is_contiguous():
            raise RuntimeError(f"flash_backward: grad_o must be contiguous, got strides {list(grad_o.stride())}; "
                               "call grad_o.contiguous() first")
        with torch.no_grad():
            grads = MODEL.reference_backward(grad_o, q, k, v, causal, scale, o=o)
        return tuple(g.to(q.dtype) for g in grads)


def _flash_attention(module, ops, causal, scale):
    return lambda q, k, v: module.flash_attention(q, k, v, causal, scale, ops=ops)


@pytest.mark.parametrize("causal", [False, True], ids=mask_name)
@harness.tasks("lab08.9")
def test_autograd_on_cpu(causal):
    """autograd.py with stand-in ops on the CPU (FakeOps, float64): forward calls ops.flash_forward with causal and
    scale, backward calls ops.flash_backward with a contiguous grad_o and returns (grad_q, grad_k, grad_v) in the
    forward's order; loss.backward() matches float64 autograd of the formula; gradcheck passes. GQA (4 query heads on
    2 key/value heads), seqlen_q != seqlen_k, a scale that is not the default; the loss makes grad_o a transposed,
    non-contiguous view."""
    module, ops = autograd_module(), FakeOps()
    scale = 0.37
    q, k, v, _ = _model_inputs(5, 7, (4, 2), head_dim=3, batch=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn = _flash_attention(module, ops, causal, scale)
    case = f"autograd.flash_attention on the CPU with stand-in ops ({mask_name(causal)}, scale {scale})"
    o = _student(f"{case}: forward", lambda: fn(*leaves))
    if not any(call[0] == "flash_forward" for call in ops.calls):
        raise harness.GradeFailure(f"{case}: forward never called ops.flash_forward\n  hint: {AUTOGRAD_HINT}")
    if not isinstance(o, torch.Tensor):
        raise harness.GradeFailure(f"{case}: flash_attention returned {type(o).__name__}, not the tensor o (lse is "
                                   f"saved for the backward, not returned)\n  hint: {AUTOGRAD_HINT}")
    want_o = MODEL.attention_autograd(q, k, v, causal, scale)
    LAB.assert_close(o, want_o, case=f"{case}: o", tol=1e-12, hint="pass causal and scale on to the op: "
                     + AUTOGRAD_HINT)
    c = torch.randn(o.shape[0], o.shape[2], o.shape[1], o.shape[3], dtype=FP64)

    def loss_of(out):  # its gradient with respect to out is a transposed, non-contiguous view
        return (out.transpose(1, 2) * c).sum()

    _student(f"{case}: loss.backward() with a transposed grad_o", lambda: loss_of(o).backward())
    if not any(call[0] == "flash_backward" for call in ops.calls):
        raise harness.GradeFailure(f"{case}: backward never called ops.flash_backward\n  hint: {AUTOGRAD_HINT}")
    if any(call[1:] != (causal, scale) for call in ops.calls):
        raise harness.GradeFailure(f"{case}: the ops were called with (causal, scale) = "
                                   f"{sorted({call[1:] for call in ops.calls}, key=str)}, not ({causal}, {scale})\n"
                                   f"  hint: {AUTOGRAD_HINT}")
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(loss_of(MODEL.attention_autograd(*refs, causal, scale)), refs)
    for name, leaf, w in zip(("q.grad", "k.grad", "v.grad"), leaves, want):
        if leaf.grad is None:
            raise harness.GradeFailure(f"{case}: backward left {name} None\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(leaf.grad, w, case=f"{case}: {name}", tol=1e-10, hint=AUTOGRAD_HINT)
    ok = _student(f"{case}: torch.autograd.gradcheck", lambda: torch.autograd.gradcheck(
        fn, tuple(t.clone().requires_grad_() for t in (q, k, v)), raise_exception=False))
    assert ok, f"{case}: torch.autograd.gradcheck failed\n  hint: {AUTOGRAD_HINT}"


@harness.tasks("lab08.9")
def test_autograd_second_derivative_raises_clearly():
    """backward is @once_differentiable: a second derivative must raise autograd's clear error ("trying to
    differentiate twice"), not give a silently wrong number."""
    module, ops = autograd_module(), FakeOps()
    q, k, v, _ = _model_inputs(4, 6, (2, 2), head_dim=3, batch=1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = _student("autograd.flash_attention forward", lambda: module.flash_attention(*leaves, ops=ops))
    grad_o = torch.randn_like(o, requires_grad=True)
    (grad_q,) = _student("autograd.grad(flash_attention(q, k, v), q, grad_o, create_graph=True)",
                         lambda: torch.autograd.grad(o, leaves[0], grad_o, create_graph=True))
    if second_derivative_refused(lambda: grad_q.sum().backward(), "autograd.flash_attention",
                                 hint="decorate backward with @once_differentiable (torch.autograd.function)"):
        return
    raise harness.GradeFailure("a second derivative through autograd.flash_attention ran (the stand-in ops are not "
                               "differentiable, so its numbers are wrong)\n  hint: decorate backward with "
                               "@once_differentiable, so that it raises a clear error instead")
