"""GPU: through autograd (autograd.py, lab08.9) over the built ops."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import (
    AUTOGRAD_HINT,
    BACKWARD_HINT,
    BACKWARD_TASKS,
    BF16,
    LAB,
    _student,
    autograd_module,
    check_backward,
    check_forward,
    forward_tasks,
    heads_id,
    mask_name,
    seqlen_id,
    skip_before_sm80,
)
from harness import requires_gpu
from harness.attention import describe, golden, make_qkv, randn

__all__ = ["test_autograd"]


# ---------------------------------------------------------------- GPU: through autograd (autograd.py, lab08.9)
AUTOGRAD_CASES = [((128, 217), False, (2, 4, 2), 64), ((128, 217), True, (2, 4, 2), 128),
                  ((203, 113), True, (1, 8, 2), 64)]


@requires_gpu
@pytest.mark.parametrize("seqlens, causal, heads, head_dim", [
    pytest.param(s, c, h, d, id=f"{seqlen_id(s)}-{mask_name(c)}-{heads_id(h)}-d{d}",
                 marks=harness.tasks(*forward_tasks(s, c), *BACKWARD_TASKS, "lab08.9"))
    for s, c, h, d in AUTOGRAD_CASES])
def test_autograd(seqlens, causal, heads, head_dim):
    """loss.backward() through autograd.flash_attention(q, k, v, causal, scale, ops=lab): o against the float64 golden,
    the gradients against float64 autograd of the formula (the flash rule against PyTorch's own bfloat16 attention's
    autograd); and the gradients equal what the ops give when called directly (grad_k, grad_v bitwise; grad_q within
    the rule: its atomics add in any order)."""
    skip_before_sm80("flash_attention")
    module = autograd_module()
    scale = 0.1
    batch, heads_q, heads_kv = heads
    q, k, v = make_qkv(batch, *seqlens, heads_q, heads_kv, head_dim, BF16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    weight = randn(q.shape, BF16)
    case = f"autograd.flash_attention of {describe(q, k, causal=causal, scale=scale)}"
    o = _student(f"{case}: forward", lambda: module.flash_attention(*leaves, causal, scale, ops=LAB.module))
    if not isinstance(o, torch.Tensor) or o.grad_fn is None:
        raise harness.GradeFailure(f"{case}: the output is not a tensor connected to q, k, v (no grad_fn)\n  hint: "
                                   + AUTOGRAD_HINT)
    gold = golden(q, k, v, causal, scale, grad_o=weight)
    check_forward(o.detach(), LAB.module.flash_forward(q, k, v, causal=causal, scale=scale)[1], q, k, v,
                  causal=causal, scale=scale, rung="forward", case=f"{case}: o", hint=AUTOGRAD_HINT, gold=gold)
    _student(f"{case}: (o * w).sum().backward()", lambda: (o * weight).sum().backward())
    grads = [leaf.grad for leaf in leaves]
    if any(g is None for g in grads):
        raise harness.GradeFailure(f"{case}: backward left a gradient None\n  hint: {AUTOGRAD_HINT}")
    check_backward(grads, weight, q, k, v, None, causal=causal, scale=scale, case=f"{case}: loss.backward()",
                   hint=BACKWARD_HINT + "; " + AUTOGRAD_HINT, gold=gold)
    direct_o, direct_lse = LAB.module.flash_forward(q, k, v, causal=causal, scale=scale)
    direct = LAB.module.flash_backward(weight, q, k, v, direct_o, direct_lse, causal=causal, scale=scale)
    for name, got, want in zip(("grad_k", "grad_v"), grads[1:], direct[1:]):
        if not torch.equal(got, want):
            raise harness.GradeFailure(f"{case}: {name} from loss.backward() differs from ops.flash_backward called "
                                       f"directly on the same inputs\n  hint: {AUTOGRAD_HINT}")
