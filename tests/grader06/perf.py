"""GPU: speed. Both ops at 8192 x 8192 in float32 and bfloat16 against a copy of the same bytes, eager PyTorch,
torch.compile, and the lab's own scalar kernel: the bars and targets, and where they come from."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import requires_gpu
from harness.check import dtype_name, nbytes, shape_id

from .common import BF16, FP32, LAB, VECTOR_HINT, autograd_module, check_backward, check_forward, inputs

__all__ = [
    "test_perf_forward_vs_copy",
    "test_perf_forward_vs_eager",
    "test_perf_forward_vs_compiled",
    "test_perf_vectorized_vs_scalar",
    "test_perf_backward_vs_copy",
    "test_perf_forward_backward_vs_compiled",
]


# At (8192, 8192), 256 MiB a float32 tensor, everything is memory-bound: bytes moved / time is the measure.
# Bytes: forward reads x and writes y (2 tensors); backward reads grad_y and x and writes grad_x (3 tensors);
# bias, grad_bias and the partials are under 1% and counted as C elements each.
PERF_SHAPE = (8192, 8192)
PERF_DTYPES = [FP32, BF16]
# (reference target, student bar) per dtype, held in the same run on the same GPU.
# Reference targets: issue 12's "Speed": >= 0.90x copy, forward and backward; >= 2.0x eager and >= 0.95x compiled
# forward; >= 1.05x compiled forward+backward; vectorized >= 1.3x scalar in bf16. Measured on an NVIDIA H100 80GB HBM3
# (2026-11-26, second session, `./course bench 06 --impl solutions --json`, site/data/bench/06-fused-elementwise.json;
# `./course test 06` in the same session agrees to 0.01 on every copy ratio): forward vs copy 1.00 (fp32) / 0.99
# (bf16), backward 0.96 / 0.93; vs eager 2.20 / 2.86; vs compiled 1.00 / 1.17; forward+backward vs compiled 1.17 /
# 1.31; vectorized vs scalar 2.86. Every target that is the issue's own figure holds there with a margin of 5% or
# more. bfloat16 vs copy is the exception to the 0.90: with erff the bf16 erf kernels reached 0.83-0.85x
# forward and 0.87-0.89x backward on an H100 (2026-11-22) and 0.652-0.66x / 0.71-0.713x on an NVIDIA H200
# (2026-11-26), whose 4.2 TB/s copy against the H100's 3.0 with the same SMs leaves an arithmetic-bound kernel further
# behind. The 16-bit erf kernels now compute the exp2 GELU (gelu.cuh, gelu_erf_exp2), and the lab's kernels with it
# reach the H100 figures above (0.99 / 0.93). On the H200 only the probe's kernels with the same formula have been
# timed (site/data/evidence/06-fused-elementwise/gelu_erf.py, 2026-11-26): 0.885x forward (one row a thread),
# 0.892x backward; on the H100 the same probe's kernels came within 1% of the lab's (0.994 vs 0.987, 0.921 vs 0.926).
# So the bf16 copy targets are 0.85 forward and backward: under both machines' figures with a 4-16% margin, and below
# the 0.90, which the H200 figures miss. Student bars stay below what erff reaches (H200: 0.65x / 0.71x),
# since a student may keep erff.
# Student bars (issue 11, class 6): a straightforward fused, vectorized kernel passes, the lesson's technique
# removed fails:
#   - copy: 0.70 fp32 (an unfused x + b pass moves 2x the bytes: <= 0.5); bf16 0.55 (the scalar kernel: 0.31);
#     backward 0.65 / 0.60 likewise (a backward that reads grad_x again for grad_bias moves 4/3 the bytes);
#   - eager 1.5 fp32, 1.4 bf16: no fusion is ~1.0x;
#   - compiled 0.75 and forward+backward 0.85: unfused kernels do not pass;
#   - vectorized vs scalar 1.15 (bf16): the no-vectorization mutant measured 0.999x (H100) and fails; the reference
#     2.86x (H100, the bench above).
PERF_BARS = {
    ("forward vs copy", FP32): (0.90, 0.70), ("forward vs copy", BF16): (0.85, 0.55),
    ("backward vs copy", FP32): (0.90, 0.65), ("backward vs copy", BF16): (0.85, 0.60),
    ("forward vs eager", FP32): (2.0, 1.5), ("forward vs eager", BF16): (2.0, 1.4),
    ("forward vs compiled", FP32): (0.95, 0.75), ("forward vs compiled", BF16): (0.95, 0.75),
    ("forward+backward vs compiled", FP32): (1.05, 0.85), ("forward+backward vs compiled", BF16): (1.05, 0.85),
    ("vectorized vs scalar", BF16): (1.3, 1.15),
}
# Per GPU, where the reference measured under the common target there. The bfloat16 forward against copy on an
# NVIDIA H200: 0.82x in this grader (2026-12-02, `pytest tests/test_06_fused_elementwise.py -m perf`, 76% of copy),
# 0.75-0.82x with triton.testing.do_bench; on an H100 0.99x. The H200 copies 1.4x as fast with the same SMs and clock,
# so the GELU's arithmetic no longer hides under the memory time (a faster kernel there is an open problem: the
# probe's one-row-a-thread kernel measured 0.885x on an H200, 2026-11-26). The lesson's bar table says so.
TARGETS_BY_GPU = {("forward vs copy", BF16): {"H200": 0.75}}
PERF_HINTS = {
    "forward vs copy": "read x once and write y once with 16-byte vectors (one Pack<T, kElems> per access), "
                       "the bias pack loaded once per vector, and no 64-bit division per element",
    "backward vs copy": "one pass: grad_y and x read once, grad_x written once, the column sums kept in registers; a "
                        "warp's lanes on consecutive columns of one row (coalesced), 16-byte loads when aligned",
    "forward vs eager": "fusion is the point: x + b never goes to memory; then the forward-vs-copy hints",
    "forward vs compiled": "Inductor's kernel is fused and vectorized too: the forward-vs-copy hints close the gap",
    "forward+backward vs compiled": "both kernels near copy bandwidth, and nothing saved but x and bias (no x + b "
                                    "tensor written in the forward)",
    "vectorized vs scalar": "the 16-byte kernel must use 16-byte loads and stores (one Pack<T, kElems> per access) "
                            "and the launcher must take it whenever vectorizable()",
}
_COMPILED: dict = {}


def unfused(x, b):
    return F.gelu(x + b)


def compiled_unfused(*example):
    """torch.compile of F.gelu(x + b), compiled once per process and warmed on `example` (a compile is seconds;
    a compile that cannot run here skips the test: the baseline's failure is not the lab's)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(unfused, dynamic=False)
    fn = _COMPILED["fn"]
    try:
        out = fn(*example)
        if any(t.requires_grad for t in example):
            torch.autograd.grad(out, example, torch.ones_like(out))
        torch.cuda.synchronize()
    except Exception as error:  # Inductor needs Triton and a C compiler
        pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {str(error).splitlines()[0][:200]})")
    return fn


def _perf(kind, *, dtype, ours, baseline, baseline_name, bytes_moved, verify, inputs):
    target, student_bar = PERF_BARS[kind, dtype]
    target = harness.perf.target_on_this_gpu(target, TARGETS_BY_GPU.get((kind, dtype), {}))
    try:
        return LAB.perf(name=f"{kind}, {shape_id(PERF_SHAPE)} {dtype_name(dtype)}", ours=ours, baseline=baseline,
                        baseline_name=baseline_name, bytes_moved=bytes_moved, student_bar=student_bar, target=target,
                        verify=verify, inputs=inputs)
    except harness.GradeFailure as failure:
        raise harness.GradeFailure(f"{failure}\n  hint: {PERF_HINTS[kind]}") from None


def _perf_forward(kind, dtype, baseline, baseline_name):
    x, bias, _ = inputs(PERF_SHAPE, dtype)
    last = {}

    def ours():
        last["y"] = LAB.module.bias_gelu(x, bias)

    def verify():
        check_forward(last["y"], x, bias, "none", case=f"bias_gelu {shape_id(PERF_SHAPE)}: the output of the timed "
                      "calls", hint=VECTOR_HINT)

    _perf(kind, dtype=dtype, ours=ours, baseline=baseline(x, bias), baseline_name=baseline_name,
          bytes_moved=2 * nbytes(x) + 2 * nbytes(bias), verify=verify, inputs=(x, bias))


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_copy(dtype):
    def copy_of_same_bytes(x, bias):
        dst = torch.empty_like(x)
        return lambda: dst.copy_(x)

    _perf_forward("forward vs copy", dtype, copy_of_same_bytes, "dst.copy_(x), the same bytes moved")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_eager(dtype):
    _perf_forward("forward vs eager", dtype, lambda x, bias: lambda: F.gelu(x + bias), "F.gelu(x + b)")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_compiled(dtype):
    def compiled(x, bias):
        fn = compiled_unfused(x, bias)
        return lambda: fn(x, bias)

    _perf_forward("forward vs compiled", dtype, compiled, "torch.compile(F.gelu(x + b))")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab06.1", "lab06.3")
def test_perf_vectorized_vs_scalar():
    _perf_forward("vectorized vs scalar", BF16,
                  lambda x, bias: lambda: LAB.module.bias_gelu(x, bias, vectorized=False),
                  "bias_gelu(vectorized=False), the lab's scalar kernel")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.4")
def test_perf_backward_vs_copy(dtype):
    x, bias, grad_y = inputs(PERF_SHAPE, dtype)
    src = torch.empty(x.numel() * 3 // 2, dtype=dtype, device="cuda")  # 3 tensors of traffic: 1.5 read + 1.5 written
    dst = torch.empty_like(src)
    last = {}

    def ours():
        last["grads"] = LAB.module.bias_gelu_backward(grad_y, x, bias)

    def verify():
        check_backward(*last["grads"], grad_y, x, bias, "none",
                       case=f"bias_gelu_backward {shape_id(PERF_SHAPE)}: the output of the timed calls")

    _perf("backward vs copy", dtype=dtype, ours=ours, baseline=lambda: dst.copy_(src),
          baseline_name="a device-to-device copy of the same bytes", bytes_moved=3 * nbytes(x) + 2 * nbytes(bias),
          verify=verify, inputs=(x, bias, grad_y))


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_perf_forward_backward_vs_compiled(dtype):
    """y = bias_gelu(x, b) then torch.autograd.grad(y, (x, b), grad_y), through autograd.py, against the same
    with torch.compile of F.gelu(x + b) (Inductor's fused forward and backward kernels)."""
    x, bias, grad_y = inputs(PERF_SHAPE, dtype)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    compiled = compiled_unfused(x, bias)
    last = {}

    def ours():
        last["grads"] = torch.autograd.grad(fn(x, bias, ops=LAB.module), (x, bias), grad_y)

    def baseline():
        torch.autograd.grad(compiled(x, bias), (x, bias), grad_y)

    def verify():
        check_backward(*last["grads"], grad_y, x.detach(), bias.detach(), "none",
                       case=f"autograd.bias_gelu {shape_id(PERF_SHAPE)} backward: the output of the timed calls")

    _perf("forward+backward vs compiled", dtype=dtype, ours=ours, baseline=baseline,
          baseline_name="torch.compile(F.gelu(x + b)), forward and backward",
          bytes_moved=5 * nbytes(x) + 4 * nbytes(bias), verify=verify, inputs=(x, bias, grad_y))
