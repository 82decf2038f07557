# Lab skeleton generated from solutions/08-flash-attention/autograd.py by `./course labs` [lab-hash 15ab124b4660].
# Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 08, part 9: flash attention behind a torch.autograd.Function, so that loss.backward() runs the backward kernel.

`ops` is the built extension (what jit.load_lab or the grader's build returns), an argument rather than an import,
as in labs 06 and 07: this file has no build step of its own and works with any build.

    o = flash_attention(q, k, v, causal=True, ops=lab)   # forward: ops.flash_forward (o and lse saved)
    o.sum().backward()                                    # ops.flash_backward: q.grad, k.grad, v.grad

q is (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim), float16 or bfloat16,
head_dim 64 or 128 (the ops check and say what they need).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


# --8<-- [start:autograd]
class FlashAttention(torch.autograd.Function):
    """o = softmax(scale q k^T) v (causal: bottom-right aligned), with grouped-query heads."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, ops):
        # TODO(lab08.9): o, lse = ops.flash_forward(q, k, v, causal, scale); save q, k, v, o and lse with
        #   ctx.save_for_backward, keep ops, causal and scale on ctx; return o
        raise NotImplementedError("lab08.9: FlashAttention.forward is not written yet")

    @staticmethod
    @once_differentiable  # backward is not itself differentiable: a second derivative raises a clear error
    def backward(ctx, grad_o):
        # TODO(lab08.9): grad_q, grad_k, grad_v = ctx.ops.flash_backward(grad_o.contiguous(), q, k, v, o,
        #   lse, causal, scale) from the saved tensors; return them and None for causal, scale and ops
        raise NotImplementedError("lab08.9: FlashAttention.backward is not written yet")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, ops) -> torch.Tensor:
    """softmax(scale q k^T) v per (batch, query head), differentiable in q, k and v. scale None: 1 / sqrt(head_dim)."""
    return FlashAttention.apply(q, k, v, causal, scale, ops)
# --8<-- [end:autograd]
