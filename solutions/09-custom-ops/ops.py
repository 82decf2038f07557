"""Lab 09, Python side: what the dispatcher needs beside ops.cpp's CUDA kernels.

    torch.ops.load_library(path)       # ops.cpp's TORCH_LIBRARY runs: the schemas and CUDA kernels exist
    ops = register("course")           # this file: a fake implementation and autograd for each op
    o, lse = ops.flash_attention(q, k, v, True)
    o.sum().backward()                 # autograd calls ops.flash_attention_backward

`register` is a function of the namespace rather than import-time decorators because one process may
hold several builds of the lab (the grader's labs and solutions builds, named after their modules);
each namespace is registered once.

A fake implementation ("meta kernel") says what an op returns (shape, dtype, strides, device) without
touching data: torch.compile traces with fake tensors, so an op without one is a graph break. Each
fake here mirrors the allocation its CUDA wrapper makes (lessons 06-08's wrapper.cpp): fresh,
contiguous outputs.
"""
from __future__ import annotations

import torch

_registered: set[str] = set()


def _contiguous_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return t.new_empty(t.shape, dtype=dtype or t.dtype)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # rstd's dtype in lesson 07: float64 for float64 x, float32 for everything else.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# --8<-- [start:fakes]
def register_fakes(ns: str) -> None:
    """torch.library.register_fake for every op of torch.ops.<ns>."""
    # SOLUTION BEGIN lab09.3: a fake for each of the nine ops: empty tensors (new_empty) of the shape and dtype
    #   the CUDA wrapper returns, contiguous, on the input's device; rms_norm_out returns None
    @torch.library.register_fake(f"{ns}::bias_gelu")
    def _(x, bias, approximate="none"):
        return _contiguous_like(x)

    @torch.library.register_fake(f"{ns}::bias_gelu_backward")
    def _(grad_y, x, bias, approximate="none"):
        return _contiguous_like(x), x.new_empty(x.shape[-1:])

    @torch.library.register_fake(f"{ns}::rms_norm")
    def _(x, weight, eps=1e-6):
        # rstd: one value a row, x.shape[:-1], in the compute type.
        return _contiguous_like(x), x.new_empty(x.shape[:-1], dtype=_compute_dtype(x))

    @torch.library.register_fake(f"{ns}::rms_norm_out")
    def _(x, weight, eps, out, rstd):
        return None  # writes out and rstd, returns nothing: the schema's () and (a!) (b!) say so

    @torch.library.register_fake(f"{ns}::rms_norm_backward")
    def _(grad_y, x, weight, rstd):
        return _contiguous_like(x), _contiguous_like(weight)

    @torch.library.register_fake(f"{ns}::softmax")
    def _(x):
        return _contiguous_like(x)

    @torch.library.register_fake(f"{ns}::softmax_backward")
    def _(grad_y, y):
        return _contiguous_like(y)

    @torch.library.register_fake(f"{ns}::flash_attention")
    def _(q, k, v, causal=False, scale=None):
        batch, seqlen_q, heads_q, _head_dim = q.shape
        # o: q's shape and dtype, contiguous, whatever q's strides; lse (batch, heads_q, seqlen_q) float32.
        return _contiguous_like(q), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)

    @torch.library.register_fake(f"{ns}::flash_attention_backward")
    def _(grad_o, q, k, v, o, lse, causal=False, scale=None, deterministic=False):
        return _contiguous_like(q), _contiguous_like(k), _contiguous_like(v)
    # SOLUTION END
# --8<-- [end:fakes]


# --8<-- [start:autograd]
def register_autograds(ns: str) -> None:
    """torch.library.register_autograd for the differentiable ops of torch.ops.<ns>: each backward is
    itself a registered op, so a compiled graph's backward has no Python in it either."""
    ops = getattr(torch.ops, ns)
    # SOLUTION BEGIN lab09.4: for bias_gelu, rms_norm, softmax and flash_attention: a setup_context(ctx, inputs,
    #   output) that saves what the backward op reads (ctx.save_for_backward; non-tensors on ctx) and marks
    #   the outputs that are not differentiable (rstd, lse) with ctx.mark_non_differentiable, and a
    #   backward(ctx, *grads) that calls the op's backward op and returns one gradient (or None) per input

    def bias_gelu_setup(ctx, inputs, output):
        x, bias, approximate = inputs
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate

    def bias_gelu_backward(ctx, grad_y):
        x, bias = ctx.saved_tensors
        # The ops refuse strided tensors; the gradient of y.sum() is an expanded scalar (stride 0).
        grad_x, grad_bias = ops.bias_gelu_backward(grad_y.contiguous(), x, bias, ctx.approximate)
        return grad_x, grad_bias, None

    torch.library.register_autograd(f"{ns}::bias_gelu", bias_gelu_backward, setup_context=bias_gelu_setup)

    def rms_norm_setup(ctx, inputs, output):
        x, weight, _eps = inputs
        _y, rstd = output
        # rstd (one float a row) is saved, not recomputed: recomputing is another read of x.
        ctx.save_for_backward(x, weight, rstd)
        ctx.mark_non_differentiable(rstd)

    def rms_norm_backward(ctx, grad_y, _grad_rstd):
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_weight = ops.rms_norm_backward(grad_y.contiguous(), x, weight, rstd)
        return grad_x, grad_weight, None

    torch.library.register_autograd(f"{ns}::rms_norm", rms_norm_backward, setup_context=rms_norm_setup)

    def softmax_setup(ctx, inputs, output):
        ctx.save_for_backward(output)  # the backward is a function of y alone

    def softmax_backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        return ops.softmax_backward(grad_y.contiguous(), y)

    torch.library.register_autograd(f"{ns}::softmax", softmax_backward, setup_context=softmax_setup)

    def flash_attention_setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        o, lse = output
        # L = log(sum exp) a row: with it the backward rebuilds P = exp(S - L) block by block without
        # the forward's running max and sum. Without it, the backward would have to run the forward again.
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    def flash_attention_backward(ctx, grad_o, _grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = ops.flash_attention_backward(grad_o.contiguous(), q, k, v, o, lse, ctx.causal,
                                                              ctx.scale)
        return grad_q, grad_k, grad_v, None, None

    torch.library.register_autograd(f"{ns}::flash_attention", flash_attention_backward,
                                    setup_context=flash_attention_setup)
    # SOLUTION END
# --8<-- [end:autograd]


def register(ns: str):
    """Register the fakes and autograd formulas of torch.ops.<ns> (once per namespace; the library
    that defines the namespace must be loaded first) and return torch.ops.<ns>."""
    # torch.ops makes any namespace on first access: only the op's lookup can fail.
    if not hasattr(getattr(torch.ops, ns), "bias_gelu"):
        raise RuntimeError(f"torch.ops.{ns}.bias_gelu does not exist: either the op library is not loaded "
                           f"(torch.ops.load_library on the built .so, or import the installed package), or "
                           f"ops.cpp's TORCH_LIBRARY block does not define it yet (TODO lab09.1)")
    if ns not in _registered:
        register_fakes(ns)
        register_autograds(ns)
        _registered.add(ns)
    return getattr(torch.ops, ns)
