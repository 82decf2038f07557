# Lab skeleton generated from solutions/07-fused-normalization/autograd.py by `./course labs` [lab-hash fc344f7f2025].
# Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 07, part 7: softmax and RMSNorm behind torch.autograd.Functions, so that loss.backward() runs the kernels.

`ops` is the built extension (what jit.load_lab or the grader's build returns), an argument rather than an import,
as in lab 06: this file has no build step of its own and works with any build.

    y = softmax(x, ops=lab)                   # forward: ops.softmax
    z = rms_norm(x, weight, 1e-6, ops=lab)    # forward: ops.rms_norm (its rstd is kept for the backward)
    (y.sum() + z.sum()).backward()            # ops.softmax_backward, ops.rms_norm_backward
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


# --8<-- [start:autograd]
class Softmax(torch.autograd.Function):
    """y = softmax(x) over the last dimension."""

    @staticmethod
    def forward(ctx, x, ops):
        # TODO(lab07.7): y = ops.softmax(x); save y (not x) with ctx.save_for_backward, keep ops on ctx;
        #   return y
        raise NotImplementedError("lab07.7: Softmax.forward is not written yet")

    @staticmethod
    @once_differentiable  # backward is not itself differentiable: a second derivative raises a clear error
    def backward(ctx, grad_y):
        # TODO(lab07.7): return (grad_x, None) from ctx.ops.softmax_backward(grad_y.contiguous(), y), y the
        #   saved tensor; None for ops
        raise NotImplementedError("lab07.7: Softmax.backward is not written yet")


class RMSNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight; backward gives grad_x and grad_weight."""

    @staticmethod
    def forward(ctx, x, weight, eps, ops):
        # TODO(lab07.7): y, rstd = ops.rms_norm(x, weight, eps); save x, weight and rstd with
        #   ctx.save_for_backward, keep ops on ctx; return y
        raise NotImplementedError("lab07.7: RMSNorm.forward is not written yet")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        # TODO(lab07.7): return (grad_x, grad_weight, None, None) from ctx.ops.rms_norm_backward on
        #   grad_y.contiguous() and the saved x, weight and rstd; None for eps and ops
        raise NotImplementedError("lab07.7: RMSNorm.backward is not written yet")


def softmax(x: torch.Tensor, *, ops) -> torch.Tensor:
    """softmax(x) over the last dimension, differentiable in x."""
    return Softmax.apply(x, ops)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, ops) -> torch.Tensor:
    """RMSNorm of x (..., N) over the last dimension with weight (N,), differentiable in x and weight."""
    return RMSNorm.apply(x, weight, eps, ops)
# --8<-- [end:autograd]
