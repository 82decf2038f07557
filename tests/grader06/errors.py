"""GPU: bad input gets a clear error. The wrapper's checks on real CUDA tensors, and inputs on another GPU than
the current one."""
from __future__ import annotations

import torch

import harness
from harness import requires_gpu
from harness.check import skip_without_two_gpus

from .common import FP32, LAB, check_backward, check_forward, inputs

__all__ = [
    "test_input_errors",
    "test_refuses_bias_on_another_gpu",
    "test_inputs_on_another_gpu",
]


@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_input_errors():
    x, bias, grad_y = inputs((16, 16), FP32)
    fwd, bwd = LAB.module.bias_gelu, LAB.module.bias_gelu_backward
    cases = [
        (lambda: fwd(x, bias.bfloat16()), ("dtype", "bias.to(torch.float32)"), "bias_gelu(x float32, bias bfloat16)"),
        (lambda: fwd(x.int(), bias.int()), ("dtype", "torch.float32", "x.float()"), "bias_gelu(x and bias int32)"),
        (lambda: fwd(x, bias[:8]), ("bias", "shape", "16"), "bias_gelu(x [16, 16], bias [8])"),
        (lambda: fwd(x, bias.view(4, 4)), ("bias", "shape"), "bias_gelu(x [16, 16], bias [4, 4])"),
        (lambda: fwd(x[0, 0], bias[:1]), ("dimension",), "bias_gelu(x 0-dim)"),
        (lambda: fwd(x.t(), bias), ("contiguous", "x.contiguous()"), "bias_gelu(x.t(), a non-contiguous view)"),
        (lambda: fwd(x[:, ::2], bias[:8]), ("contiguous", "x.contiguous()"), "bias_gelu(x[:, ::2])"),
        (lambda: fwd(x.cpu(), bias), ("CUDA", "x.cuda()"), "bias_gelu(x on the CPU, bias on the GPU)"),
        (lambda: fwd(x, bias.cpu()), ("CUDA", "bias.cuda()"), "bias_gelu(x on the GPU, bias on the CPU)"),
        (lambda: fwd(x, bias, approximate="Tanh"), ("approximate", "none", "tanh"), "bias_gelu(approximate='Tanh')"),
        (lambda: bwd(grad_y[:8], x, bias), ("shape",), "bias_gelu_backward(grad_y [8, 16], x [16, 16])"),
        (lambda: bwd(grad_y.double(), x, bias), ("dtype", "grad_y.to(torch.float32)"),
         "bias_gelu_backward(grad_y float64, x float32)"),
        (lambda: bwd(grad_y.t(), x, bias), ("contiguous", "grad_y.contiguous()"),
         "bias_gelu_backward(grad_y.t(), non-contiguous)"),
        (lambda: bwd(grad_y.cpu(), x, bias), ("CUDA",), "bias_gelu_backward(grad_y on the CPU)"),
        (lambda: bwd(grad_y, x.t(), bias), ("contiguous", "x.contiguous()"), "bias_gelu_backward(x.t())"),
        (lambda: bwd(grad_y, x, bias.half()), ("dtype", "bias.to(torch.float32)"),
         "bias_gelu_backward(x float32, bias float16)"),
    ]
    for fn, words, what in cases:
        LAB.assert_raises_clearly(fn, must_mention=words, case=what)


@requires_gpu
@harness.reference_check  # the same-device check is given
def test_refuses_bias_on_another_gpu():
    skip_without_two_gpus("a bias on another GPU than x")
    x, bias, _ = inputs((16, 16), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.bias_gelu(x, bias.to("cuda:1")), must_mention=("same device",),
                              case="bias_gelu(x on cuda:0, bias on cuda:1)")


@requires_gpu
@harness.reference_check  # the device guard is given
def test_inputs_on_another_gpu():
    """x and bias on cuda:1 while cuda:0 is current: outputs on cuda:1, computed there."""
    skip_without_two_gpus("a bias on another GPU than x")
    torch.cuda.set_device(0)
    x, bias, grad_y = (t.to("cuda:1") for t in inputs((33, 64), FP32))
    y = LAB.module.bias_gelu(x, bias)
    grad_x, grad_bias = LAB.module.bias_gelu_backward(grad_y, x, bias)
    torch.cuda.synchronize(1)
    check_forward(y, x, bias, "none", case="bias_gelu of inputs on cuda:1 with cuda:0 current")
    check_backward(grad_x, grad_bias, grad_y, x, bias, "none",
                   case="bias_gelu_backward of inputs on cuda:1 with cuda:0 current")
