"""Lab 09's grader, the ops against float64 references (GPU): each op's outputs, and the autograd formulas'
gradients.

Tolerances. The kernels are lessons 06-08's, graded there with the tolerances derived in those graders; here an
op's output only has to show that the binding passes the right arguments to the right kernel (approximate, eps,
causal, scale, the argument order): float64 references with BINDING_HEADROOM x harness.tolerance, and the
flash-attention rule (k = 2 forward, 3 gradients) for attention and for the decoder block, where PyTorch's own
16-bit error is the yardstick.
"""
from __future__ import annotations

import pytest
import torch

from grader09 import support as S
from grader09.common import (
    AUTOGRAD_HINT,
    BINDING_HINTS,
    LAB,
    _real_args,
    call,
    case_name,
    course_ops,
    op_params,
    raw_op,
)
from harness import random_tensor, requires_gpu
from harness.check import GradeFailure, run_student

__all__ = ["test_ops_match_references", "test_autograd_matches_references"]


# ---------------------------------------------------------------- GPU: the ops against float64 references
@requires_gpu
@pytest.mark.parametrize("case", op_params(S.CASES, "lab09.1", "lab09.2"))
def test_ops_match_references(case):
    """Each op's outputs (placement: shape, dtype, device, contiguous) and values against a float64 reference: the
    right kernel, given the right arguments."""
    ops = course_ops()
    args = _real_args(case)
    result = call(case.op, args, case=case_name(case), hint=BINDING_HINTS[case.op], ops=ops)
    problems = S.output_problems(case.op, args, result)
    if problems:
        raise GradeFailure(f"{case_name(case)}: " + "; ".join(problems) + f"\n  hint: {BINDING_HINTS[case.op]}")
    outs = (args[3], args[4]) if case.op == "rms_norm_out" else S.as_tuple(result)
    S.check_against_golden(case.op, args, outs, case=case_name(case), hint=BINDING_HINTS[case.op])


def _strided_like(t: torch.Tensor) -> torch.Tensor:
    """Random values of t's shape in a non-contiguous view (every other element of a wider tensor): a gradient as
    autograd may hand it to a backward formula."""
    wide = random_tensor((*t.shape[:-1], 2 * t.shape[-1]), t.dtype)
    return wide[..., ::2]


@requires_gpu
@pytest.mark.parametrize("case", op_params([c for op in S.BACKWARD_OF for c in S.cases_of(op)], "lab09.4"))
def test_autograd_matches_references(case):
    """torch.autograd.grad through each differentiable op, with a non-contiguous gradient (the backward ops refuse
    one: the formula must pass grad.contiguous()), against float64 gradients."""
    ops = course_ops()
    op = case.op
    args = list(_real_args(case, requires_grad=True))
    leaves = [args[i] for i in S.DIFFERENTIABLE_INPUTS[op]]
    what = f"{case_name(case)}, gradients through autograd"
    out = S.as_tuple(call(op, args, case=what, hint=AUTOGRAD_HINT, ops=ops))[0]
    grad = _strided_like(out)
    grads = run_student(f"{what}: torch.autograd.grad", lambda: torch.autograd.grad(out, leaves, grad),
                        hint=AUTOGRAD_HINT)
    a = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in args)
    g = grad.contiguous()
    names = [f"{arg.name}.grad" for arg in raw_op(op).default._schema.arguments]
    if op == "flash_attention":
        S.check_flash_backward(grads, g, *a[:3], out.detach(), a[3], a[4], case=what, hint=AUTOGRAD_HINT,
                             names=names[:3])
        return
    if op == "bias_gelu":
        backward_args = (g, a[0], a[1], a[2])
    elif op == "rms_norm":
        backward_args = (g, a[0], a[1], torch.rsqrt(a[0].double().pow(2).mean(-1) + a[2]))
    else:
        backward_args = (g, out.detach())
    backward_op = S.BACKWARD_OF[op]
    gold = S.golden(backward_op, backward_args) if op != "rms_norm" else _rms_norm_grads(a, g)
    floors = list(S.gelu_floors(backward_op, backward_args, gold).values())
    rows = a[0].numel() // max(1, a[0].shape[-1])
    for i, got, want in zip(S.DIFFERENTIABLE_INPUTS[op], grads, gold):
        n = S.reduction_length(backward_op, backward_args) + (rows if i else 0)
        LAB.assert_close(got, want, case=f"{what}: {names[i]}", tol=S.binding_tol(a[0].dtype, n),
                         hint=AUTOGRAD_HINT, floor=floors[i] if i < len(floors) else None)


def _rms_norm_grads(args, grad) -> list[torch.Tensor]:
    """float64 gradients of x * rsqrt(mean(x^2) + eps) * weight for x and weight, with the case's eps."""
    x = args[0].double().requires_grad_()
    w = args[1].double().requires_grad_()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args[2]) * w
    return list(torch.autograd.grad(y, (x, w), grad.double()))
