"""Lab 09's nine op schemas, once: what ops.cpp's TORCH_LIBRARY block must define (TODO lab09.1).

Every build of the lab is checked against this one list: the grader's JIT build (tests/grader09/support.py reads
SCHEMAS from here), the CMake library and the wheel (tests/grader09/aot.py). The text is the schema without its
namespace, as ops.cpp writes it; `qualified(ns)` gives what torch prints for torch.ops.<ns>.<op>.default._schema
(PyTorch's own spelling: a default of 1e-06 prints as 9.9999999999999995e-07, so compare parsed schemas).
"""
from __future__ import annotations

SCHEMAS = {
    "bias_gelu": 'bias_gelu(Tensor x, Tensor bias, str approximate="none") -> Tensor',
    "bias_gelu_backward": 'bias_gelu_backward(Tensor grad_y, Tensor x, Tensor bias, str approximate="none") -> '
                          '(Tensor grad_x, Tensor grad_bias)',
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> (Tensor y, Tensor rstd)",
    "rms_norm_out": "rms_norm_out(Tensor x, Tensor weight, float eps, Tensor(a!) out, Tensor(b!) rstd) -> ()",
    "rms_norm_backward": "rms_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd) -> "
                         "(Tensor grad_x, Tensor grad_weight)",
    "softmax": "softmax(Tensor x) -> Tensor",
    "softmax_backward": "softmax_backward(Tensor grad_y, Tensor y) -> Tensor",
    "flash_attention": "flash_attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> "
                       "(Tensor o, Tensor lse)",
    "flash_attention_backward": "flash_attention_backward(Tensor grad_o, Tensor q, Tensor k, Tensor v, Tensor o, "
                                "Tensor lse, bool causal=False, float? scale=None, bool deterministic=False) -> "
                                "(Tensor grad_q, Tensor grad_k, Tensor grad_v)",
}


def qualified(namespace: str) -> dict[str, str]:
    """{op: str(schema)} in `namespace`, in PyTorch's printed form (parsed, then printed)."""
    import torch

    return {name: str(torch._C.parse_schema(f"{namespace}::{text}")) for name, text in SCHEMAS.items()}
