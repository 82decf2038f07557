# Lab skeleton generated from solutions/09-custom-ops/ops.py by `./course labs` [lab-hash bace68c7b92d].
# Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
# Instructors: edit the solution file instead, then run `./course labs`.
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
    # TODO(lab09.3): a fake for each of the nine ops: empty tensors (new_empty) of the shape and dtype
    #   the CUDA wrapper returns, contiguous, on the input's device; rms_norm_out returns None
# --8<-- [end:fakes]


# --8<-- [start:autograd]
def register_autograds(ns: str) -> None:
    """torch.library.register_autograd for the differentiable ops of torch.ops.<ns>: each backward is
    itself a registered op, so a compiled graph's backward has no Python in it either."""
    ops = getattr(torch.ops, ns)
    # TODO(lab09.4): for bias_gelu, rms_norm, softmax and flash_attention: a setup_context(ctx, inputs,
    #   output) that saves what the backward op reads (ctx.save_for_backward; non-tensors on ctx) and marks
    #   the outputs that are not differentiable (rstd, lse) with ctx.mark_non_differentiable, and a
    #   backward(ctx, *grads) that calls the op's backward op and returns one gradient (or None) per input
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
