"""Bad input gets a clear error: each op's checks, the CUDA wrapper's and the Triton op's (every tensor argument
refused on its own, on fake tensors and on a GPU), a register row past the longest, a weight on another GPU; and
inputs on another GPU than the current one, computed there.
"""
from __future__ import annotations

import pytest
import torch

import harness
from grader07.common import (
    _CPU_CALLS,
    BF16,
    EPS,
    FP32,
    FP64,
    LAB,
    SOFTMAX_REGISTERS_HINT,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    max_register_row,
    reference_rstd,
    rms_inputs,
    triton_module,
)
from harness import inputs, requires_gpu
from harness.check import dtype_name, skip_without_two_gpus
from harness.inputs import Arg

__all__ = [
    "test_input_errors", "test_each_argument_checked", "test_triton_each_argument_checked",
    "test_registers_refused_past_the_longest_row", "test_refuses_weight_on_another_gpu", "test_inputs_on_another_gpu",
]


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_input_errors():
    x, weight, grad_y = rms_inputs((16, 32), FP32)
    rstd = reference_rstd(x, EPS)
    y = torch.softmax(x, -1)
    m = LAB.module
    cases = [
        (lambda: m.softmax(x.int()), ("dtype", "torch.float32"), "softmax(x int32)"),
        (lambda: m.softmax(x.t()), ("contiguous", "x.contiguous()"), "softmax(x.t(), a non-contiguous view)"),
        (lambda: m.softmax(x[:, ::2]), ("contiguous", "x.contiguous()"), "softmax(x[:, ::2])"),
        (lambda: m.softmax(x, path="register"), ("path", "auto", "registers", "streaming"), "softmax(path='register')"),
        (lambda: m.softmax_backward(grad_y[:8], y), ("shape",), "softmax_backward(grad_y [8, 32], y [16, 32])"),
        (lambda: m.softmax_backward(grad_y.double(), y), ("dtype", "grad_y.to(torch.float32)"),
         "softmax_backward(grad_y float64, y float32)"),
        (lambda: m.softmax_backward(grad_y.t(), y), ("contiguous", "grad_y.contiguous()"),
         "softmax_backward(grad_y.t())"),
        (lambda: m.softmax_backward(grad_y.cpu(), y), ("CUDA", "grad_y.cuda()"), "softmax_backward(grad_y on the CPU)"),
        (lambda: m.softmax_backward(grad_y, y, path="fast"), ("path",), "softmax_backward(path='fast')"),
        (lambda: m.rms_norm(x, weight.cpu()), ("CUDA", "weight.cuda()"), "rms_norm(x on the GPU, weight on the CPU)"),
        (lambda: m.rms_norm(x, weight[:16]), ("weight", "shape", "32"), "rms_norm(x [16, 32], weight [16])"),
        (lambda: m.rms_norm(x, weight.view(4, 8)), ("weight", "shape"), "rms_norm(x [16, 32], weight [4, 8])"),
        (lambda: m.rms_norm(x, weight.bfloat16()), ("dtype", "weight.to(torch.float32)"),
         "rms_norm(x float32, weight bfloat16)"),
        (lambda: m.rms_norm(x.int(), weight.int()), ("dtype", "torch.float32"), "rms_norm(x and weight int32)"),
        (lambda: m.rms_norm(x.t(), weight[:16]), ("contiguous", "x.contiguous()"), "rms_norm(x.t())"),
        (lambda: m.rms_norm(x, weight, eps=-1e-6), ("eps",), "rms_norm(eps=-1e-6)"),
        (lambda: m.rms_norm(x, weight, eps=float("nan")), ("eps",), "rms_norm(eps=nan)"),
        (lambda: m.rms_norm(x, weight, eps=float("inf")), ("eps",), "rms_norm(eps=inf)"),
        (lambda: m.rms_norm(x, weight, path="stream"), ("path", "auto", "registers", "streaming"),
         "rms_norm(path='stream')"),
        (lambda: m.rms_norm(x, weight, path="on_chip"), ("on_chip", "softmax", "streaming"),
         "rms_norm(path='on_chip', softmax's path only)"),
        (lambda: m.rms_norm_backward(grad_y[:8], x, weight, rstd), ("shape",),
         "rms_norm_backward(grad_y [8, 32], x [16, 32])"),
        (lambda: m.rms_norm_backward(grad_y.half(), x, weight, rstd), ("dtype", "grad_y.to(torch.float32)"),
         "rms_norm_backward(grad_y float16, x float32)"),
        (lambda: m.rms_norm_backward(grad_y.t(), x, weight, rstd), ("contiguous", "grad_y.contiguous()"),
         "rms_norm_backward(grad_y.t())"),
        (lambda: m.rms_norm_backward(grad_y, x, weight, rstd.double()), ("rstd", "dtype"),
         "rms_norm_backward(rstd float64 for x float32)"),
        (lambda: m.rms_norm_backward(grad_y, x, weight, rstd[:8]), ("rstd", "shape"),
         "rms_norm_backward(rstd [8] for x [16, 32])"),
        (lambda: m.rms_norm_backward(grad_y, x, weight, rstd.cpu()), ("CUDA", "rstd.cuda()"),
         "rms_norm_backward(rstd on the CPU)"),
        (lambda: m.rms_norm_backward(grad_y, x, weight[:16], rstd), ("weight", "shape"),
         "rms_norm_backward(weight [16] for x [16, 32])"),
    ]
    for fn, words, what in cases:
        LAB.assert_raises_clearly(fn, must_mention=words, case=what)


# Every tensor argument of every op, one at a time (harness.inputs): what each wrapper promises to refuse of it. weight
# and rstd are copied when strided (N or rows elements beside the whole x), so a strided one is accepted; x, y and
# grad_y are refused. The argument that sets the dtype is given int32, the others another supported dtype.
_SETS_DTYPE = {"dtype": ("dtype", "torch.float32")}
_X = Arg("x", dtype=torch.int32, shape=lambda t: t[..., :-1], words=_SETS_DTYPE)
_FOLLOWER = {"dtype": FP64, "shape": lambda t: t[:8]}  # grad_y beside x or y
_WEIGHT = Arg("weight", dtype=BF16, shape=lambda t: t[:-1], strided=False)
_RSTD = Arg("rstd", dtype=FP64, shape=lambda t: t[:8], strided=False)
ARGUMENTS = {
    "softmax": (lambda m: m.softmax, ("x",), [Arg("x", dtype=torch.int32, shape=lambda t: t[0, 0],
                                                  words={**_SETS_DTYPE, "shape": ("dimension",)})]),
    "softmax_backward": (lambda m: m.softmax_backward, ("grad_y", "y"),
                         [Arg("grad_y", **_FOLLOWER), Arg("y", dtype=torch.int32, shape=lambda t: t[:8],
                                                          words=_SETS_DTYPE)]),
    "rms_norm": (lambda m: m.rms_norm, ("x", "weight"), [_X, _WEIGHT]),
    "rms_norm_backward": (lambda m: m.rms_norm_backward, ("grad_y", "x", "weight", "rstd"),
                          [Arg("grad_y", **_FOLLOWER), _X, _WEIGHT, _RSTD]),
}


def argument_values(names) -> dict:
    """Valid arguments of an op, by name, in its order: x, y, grad_y 16 x 32 float32, weight (32,), rstd (16,)."""
    x, weight, grad_y = rms_inputs((16, 32), FP32)
    made = {"x": x, "y": torch.softmax(x, -1), "grad_y": grad_y, "weight": weight, "rstd": reference_rstd(x, EPS)}
    return {name: made[name] for name in names}


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("op", list(ARGUMENTS))
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(op, real):
    """Each tensor argument refused on its own, the others valid: on the CPU, of another dtype, of a wrong shape,
    strided where the op reads it flat. On fake tensors (any machine) and on a GPU."""
    fn, names, specs = ARGUMENTS[op]
    inputs.assert_each_argument_checked(op, fn(LAB.module), lambda: argument_values(names), specs, real=real)


# The Triton op's Python checks (triton_rms_norm.py), the same way: its weight must be contiguous (Triton indexes it
# flat), rstd is the forward's float32; a tensor on another device than x is refused as such ("same device").
_TRITON_X = Arg("x", dtype=FP64, shape=lambda t: t[..., :-1], words={"dtype": ("one of", "torch.float32")})
_TRITON_LIKE_X = {"device": ("same device",), "dtype": ("dtype",)}
_TRITON_RSTD = Arg("rstd", dtype=FP64, shape=lambda t: t[:8], words={
    "device": ("forward's", "torch.float32"), "dtype": ("forward's", "torch.float32"), "shape": ("forward's",)})
TRITON_ARGUMENTS = {
    "rms_norm_fwd": (("x", "weight"), [_TRITON_X, Arg("weight", dtype=BF16, shape=lambda t: t[:-1],
                                                       words=_TRITON_LIKE_X)]),
    "rms_norm_bwd": (("grad_y", "x", "weight", "rstd"),
                     [Arg("grad_y", dtype=BF16, shape=lambda t: t[:8], words=_TRITON_LIKE_X), _TRITON_X,
                      Arg("weight", dtype=BF16, shape=lambda t: t[:-1], words=_TRITON_LIKE_X), _TRITON_RSTD]),
}


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("op", list(TRITON_ARGUMENTS))
@harness.reference_check  # the ops' checks are given
def test_triton_each_argument_checked(op, real):
    """course07::rms_norm_fwd and rms_norm_bwd refuse each bad tensor argument on its own, the others valid."""
    triton_module()
    names, specs = TRITON_ARGUMENTS[op]
    call = getattr(torch.ops.course07, op)
    with_eps = (lambda *args: call(*args, EPS)) if op == "rms_norm_fwd" else call
    inputs.assert_each_argument_checked(f"course07::{op}", with_eps, lambda: argument_values(names), specs, real=real)


@requires_gpu
@pytest.mark.parametrize("dtype", [FP32, FP64], ids=dtype_name)
@pytest.mark.parametrize("op", list(_CPU_CALLS))
@harness.reference_check  # the wrapper's path check is given
def test_registers_refused_past_the_longest_row(op, dtype):
    """path='registers' for a row one element longer than the longest register row (constants()) is a clear error,
    not a kernel that reads past its registers; 'auto' takes the streaming path there."""
    n = max_register_row(dtype) + 1
    x, weight, grad_y = rms_inputs((2, n), dtype)
    rstd = reference_rstd(x, EPS)
    calls = {
        "softmax": lambda path: LAB.module.softmax(x, path=path),
        "softmax_backward": lambda path: LAB.module.softmax_backward(grad_y, x, path=path),
        "rms_norm": lambda path: LAB.module.rms_norm(x, weight, path=path),
        "rms_norm_backward": lambda path: LAB.module.rms_norm_backward(grad_y, x, weight, rstd, path=path),
    }
    LAB.assert_raises_clearly(lambda: calls[op]("registers"), must_mention=("registers", str(n - 1), "streaming"),
                              case=f"{op}(x 2x{n} {dtype_name(dtype)}, path='registers')")


@requires_gpu
@harness.reference_check  # the same-device check is given
def test_refuses_weight_on_another_gpu():
    skip_without_two_gpus("a weight on another GPU than x")
    x, weight, _ = rms_inputs((16, 32), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.rms_norm(x, weight.to("cuda:1")), must_mention=("same device",),
                              case="rms_norm(x on cuda:0, weight on cuda:1)")


@requires_gpu
@harness.reference_check  # the device guard is given
def test_inputs_on_another_gpu():
    """Inputs on cuda:1 while cuda:0 is current: outputs on cuda:1, computed there."""
    skip_without_two_gpus("a weight on another GPU than x")
    torch.cuda.set_device(0)
    x, weight, grad_y = (t.to("cuda:1") for t in rms_inputs((33, 64), FP32))
    y, rstd = LAB.module.rms_norm(x, weight)
    grad_x, grad_weight = LAB.module.rms_norm_backward(grad_y, x, weight, rstd)
    s = LAB.module.softmax(x)
    torch.cuda.synchronize(1)
    check_rms_norm(y, rstd, x, weight, EPS, case="rms_norm of inputs on cuda:1 with cuda:0 current")
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS,
                            case="rms_norm_backward of inputs on cuda:1 with cuda:0 current")
    check_softmax(s, x, case="softmax of x on cuda:1 with cuda:0 current", hint=SOFTMAX_REGISTERS_HINT)
