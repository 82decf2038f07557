"""The build, constants(), and what runs without a GPU: CPU tensors refused, each argument checked."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import (
    BF16,
    FLASH_HEAD_DIMS,
    FP16,
    FP32,
    FP64,
    LAB,
    autograd_module,
    constants,
    skip_before_sm80,
    tiles,
)
from harness.attention import make_qkv
from harness.inputs import Arg

__all__ = ["test_builds", "test_constants", "test_refuses_cpu_tensors", "test_each_argument_checked"]


# ---------------------------------------------------------------- builds, constants, and what runs without a GPU
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports, and its autograd.py imports: checked on every machine."""
    for name in ("attention_naive", "flash_forward_fp32", "flash_forward", "flash_backward", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    module = autograd_module()
    for name in ("FlashAttention", "flash_attention"):
        assert hasattr(module, name), f"autograd.py defines no {name!r}"
    assert issubclass(module.FlashAttention, torch.autograd.Function), (
        "autograd.py: FlashAttention must subclass torch.autograd.Function")


@harness.reference_check  # the constants are given
def test_constants():
    """constants() names the head dims and every tensor-core kernel's tile (the where-text and the page use them):
    whole mma steps (16 rows, 16 keys) and, for the forward, whole 16-row warp slices."""
    c = constants()
    assert list(c.get("head_dims", [])) == list(FLASH_HEAD_DIMS), f"constants()['head_dims'] = {c.get('head_dims')}"
    for d in FLASH_HEAD_DIMS:
        for rung in ("forward", "backward"):
            tile = tiles(rung, d)
            assert tile is not None, f"constants() has no {rung}_block_m_d{d} / {rung}_block_n_d{d}: {c}"
            assert all(t > 0 and t % 16 == 0 for t in tile), f"constants(): the {rung} tile for d{d} is {tile}"
        assert tiles("fp32", d) is not None, f"constants() has no fp32_block_m / fp32_block_n: {c}"


_CPU_CALLS = {
    "attention_naive": lambda m, q, k, v, o, lse: m.attention_naive(q, k, v),
    "flash_forward_fp32": lambda m, q, k, v, o, lse: m.flash_forward_fp32(q, k, v),
    "flash_forward": lambda m, q, k, v, o, lse: m.flash_forward(q.bfloat16(), k.bfloat16(), v.bfloat16()),
    "flash_backward": lambda m, q, k, v, o, lse: m.flash_backward(o.bfloat16(), q.bfloat16(), k.bfloat16(),
                                                                  v.bfloat16(), o.bfloat16(), lse),
}


@pytest.mark.parametrize("op", list(_CPU_CALLS))
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors(op):
    q = torch.ones(1, 4, 2, 64)
    lse = torch.zeros(1, 2, 4)
    LAB.assert_raises_clearly(lambda: _CPU_CALLS[op](LAB.module, q, q, q, q, lse), must_mention=("CUDA",),
                              case=f"{op}(tensors on the CPU)")


# Each tensor argument of every rung refused on its own, the others valid (harness.inputs). q sets the dtype (one the
# rung does not take is refused); k and v must match it, and each other's shape. q, k and v may have any strides but a
# contiguous last dimension; the tensor-core rungs also read them, and o and grad_o, in 16-byte chunks (a data
# pointer's alignment: real tensors only). On fake CUDA tensors (no GPU needed) the rungs that read no data pointer
# in their checks (naive, float32) are checked whole; the tensor-core rungs on a GPU.
def _qkv_args(rung_dtype, wrong_dtype, aligned):
    layout = {"strided": True, "aligned": aligned, "words": {"strided": ("stride 1",)}}
    return [Arg("q", dtype=rung_dtype, shape=lambda t: t[..., :-8], **{**layout, "words": {
                "strided": ("stride 1",), "shape": ("head_dim",)}}),
            Arg("k", dtype=wrong_dtype, shape=lambda t: t[:, :-1], **layout),
            Arg("v", dtype=wrong_dtype, shape=lambda t: t[:, :-1], **layout)]


_LIKE_Q = {"dtype": FP16, "shape": lambda t: t[:, :-1], "aligned": True}
ATTENTION_ARGUMENTS = {  # op: (q's dtype, every argument's name in call order, the specs)
    "attention_naive": (BF16, ("q", "k", "v"), _qkv_args(FP64, FP16, aligned=False)),
    "flash_forward_fp32": (FP32, ("q", "k", "v"), _qkv_args(BF16, FP64, aligned=False)),
    "flash_forward": (BF16, ("q", "k", "v"), _qkv_args(FP32, FP16, aligned=True)),
    "flash_backward": (BF16, ("grad_o", "q", "k", "v", "o", "lse"),
                       [Arg("grad_o", **_LIKE_Q), *_qkv_args(FP32, FP16, aligned=True), Arg("o", **_LIKE_Q),
                        Arg("lse", dtype=FP64, shape=lambda t: t[..., :-1])]),
}
_TENSOR_CORE_RUNGS = ("flash_forward", "flash_backward")


@pytest.mark.parametrize("op, real", [
    pytest.param(op, real.values[0], id=f"{op}-{real.id}", marks=real.marks) for op in ATTENTION_ARGUMENTS
    for real in harness.FAKE_AND_REAL if real.values[0] or op not in _TENSOR_CORE_RUNGS])
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(op, real):
    if op in _TENSOR_CORE_RUNGS:
        skip_before_sm80(op)
    dtype, names, specs = ATTENTION_ARGUMENTS[op]

    def make_args():
        q, k, v = make_qkv(2, 64, 80, 4, 2, 64, dtype)
        made = {"q": q, "k": k, "v": v, "o": torch.zeros_like(q), "grad_o": torch.zeros_like(q),
                "lse": torch.zeros(2, 4, 64, device="cuda")}
        return {name: made[name] for name in names}

    harness.inputs.assert_each_argument_checked(op, getattr(LAB.module, op), make_args, specs, real=real)
