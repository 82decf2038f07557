# Lab skeleton generated from solutions/06-fused-elementwise/autograd.py by `./course labs` [lab-hash 798df4007e0a].
# Students: fill in the TODO(lab06.k) blocks, then run `./course grade 06`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 06, part 5: the fused kernels behind a torch.autograd.Function, so that loss.backward() runs them.

`ops` is the built extension (what jit.load_lab or the grader's build returns). It is an argument rather than an
import so that this file has no build step of its own and works with any build: the labs', the solutions', a
notebook's.

    y = bias_gelu(x, bias, "tanh", ops=lab)   # forward: ops.bias_gelu
    y.sum().backward()                        # backward: ops.bias_gelu_backward fills x.grad and bias.grad
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


# --8<-- [start:autograd]
class BiasGelu(torch.autograd.Function):
    """y = GELU(x + bias); backward gives grad_x and grad_bias from one fused kernel pass."""

    @staticmethod
    def forward(ctx, x, bias, approximate, ops):
        # TODO(lab06.5): compute y with ops.bias_gelu(x, bias, approximate); save x and bias with
        #   ctx.save_for_backward, keep approximate and ops on ctx (they are not tensors); return y
        raise NotImplementedError("lab06.5: BiasGelu.forward is not written yet")

    @staticmethod
    @once_differentiable  # backward is not itself differentiable: a second derivative raises a clear error
    def backward(ctx, grad_y):
        # TODO(lab06.5): return (grad_x, grad_bias, None, None) from ctx.ops.bias_gelu_backward on the saved
        #   x and bias; pass grad_y.contiguous() (the op refuses strided tensors); None for approximate and ops
        raise NotImplementedError("lab06.5: BiasGelu.backward is not written yet")


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *, ops) -> torch.Tensor:
    """GELU(x + bias) for x (..., C) and bias (C,), differentiable in x and bias; approximate: "none" or "tanh"."""
    return BiasGelu.apply(x, bias, approximate, ops)
# --8<-- [end:autograd]
