"""Lab 06's shape sweep (`./course bench 06 --sweep`; the machinery is harness/sweep.py): y = GELU(x + bias), the
erf form, forward in bfloat16 and float32, and forward + backward through autograd.py, over model shapes, against
eager PyTorch, torch.compile and the peer libraries.

Ours is called as perf.py calls it: LAB.module.bias_gelu(x, bias) for the forward, autograd.py's bias_gelu(x, bias,
ops=LAB.module) under torch.autograd.grad for forward + backward; checked once per shape with common.py's
check_forward / check_backward (the grader's float64 references and tolerances). Bytes as perf.py counts them:
forward 2 tensors (x read, y written) + bias twice; forward + backward 5 (x read twice, y written, grad_y read,
grad_x written) + bias 4 times. Neither liger-kernel nor quack-kernels has a bias + GELU op (liger's GEGLU computes
gelu(a) * b, quack's GELU is an epilogue of its GEMMs): their rows say so under "skipped".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.check import shape_id
from harness.sweep import Impl, Op, compile_fresh, element_size, pick_shapes

from .common import BF16, FP32, LAB, autograd_module, check_backward, check_forward
from .common import inputs as grader_inputs

TITLE = "GELU(x + bias) over model shapes"
# Per op and dtype: shapes picked over ~1 MiB to ~1.25 GiB, plus the decode steps (1 and 7 rows). Forward +
# backward costs a torch.compile of the joint graph per shape (seconds each): fewer of its shapes.
FORWARD_COUNT, FORWARD_BACKWARD_COUNT = 22, 12
DECODE = [(1, 4096), (7, 8192), (7, 14336)]
NO_PEER_OP = {
    "liger": "liger-kernel has no bias + GELU op (LigerGELUMulFunction computes gelu(a) * b, another op)",
    "quack": "quack-kernels has no standalone bias + GELU op (its GELU is an epilogue of its GEMMs)",
}


def prepare() -> None:
    """The lab built and imported before any shape: a failed build stops the sweep (autograd.py is imported by the
    forward + backward rows' own calls: one that does not import loses those rows, each with the reason)."""
    LAB.module.constants()


def forward_bytes(dtype):
    size = element_size(dtype)
    return lambda rows, hidden: (2 * rows * hidden + 2 * hidden) * size


def forward_backward_bytes(dtype):
    size = element_size(dtype)
    return lambda rows, hidden: (5 * rows * hidden + 4 * hidden) * size


def unfused(x, bias):
    return F.gelu(x + bias)


def _inputs(dtype, grad: bool):
    def make(rows, hidden):
        x, bias, grad_y = grader_inputs((rows, hidden), dtype)
        tensors = {"x": x, "bias": bias, "grad_y": grad_y}
        if grad:  # leaves every implementation differentiates through (torch.autograd.grad accumulates nothing)
            tensors["x_leaf"] = x.detach().clone().requires_grad_()
            tensors["bias_leaf"] = bias.detach().clone().requires_grad_()
        return tensors
    return make


# ---------------------------------------------------------------- forward
def _ours_forward(t):
    return lambda: (LAB.module.bias_gelu(t["x"], t["bias"]),)


def _verify_forward(t, outputs):
    check_forward(outputs[0], t["x"], t["bias"], "none",
                  case=f"bias_gelu {shape_id(t['x'].shape)} in the sweep")


def _eager_forward(t):
    return lambda: (unfused(t["x"], t["bias"]),)


def _compiled_forward(t):
    fn = compile_fresh(unfused)
    return lambda: (fn(t["x"], t["bias"]),)


# ---------------------------------------------------------------- forward + backward
def _grads(forward, t):
    """torch.autograd.grad of forward(x, bias) at the shape's leaves, with the shape's grad_y: (grad_x, grad_bias)."""
    x, bias = t["x_leaf"], t["bias_leaf"]
    return torch.autograd.grad(forward(x, bias), (x, bias), t["grad_y"])


def _ours_forward_backward(t):
    fn = autograd_module().bias_gelu
    return lambda: _grads(lambda x, bias: fn(x, bias, ops=LAB.module), t)


def _verify_forward_backward(t, outputs):
    check_backward(outputs[0], outputs[1], t["grad_y"], t["x"], t["bias"], "none",
                   case=f"autograd.bias_gelu {shape_id(t['x'].shape)} backward in the sweep")


def _eager_forward_backward(t):
    return lambda: _grads(unfused, t)


def _compiled_forward_backward(t):
    fn = compile_fresh(unfused)
    return lambda: _grads(fn, t)


def _no_peers() -> list[Impl]:
    return [Impl(name, peer=name, unsupported=reason) for name, reason in NO_PEER_OP.items()]


def sweep_ops() -> list[Op]:
    ops = []
    for dtype in (BF16, FP32):
        ops.append(Op(
            "bias_gelu_fwd", dtype, pick_shapes(forward_bytes(dtype), FORWARD_COUNT, always=DECODE),
            forward_bytes(dtype), _inputs(dtype, grad=False),
            [Impl("ours", _ours_forward, verify=_verify_forward), Impl("eager", _eager_forward),
             Impl("compiled", _compiled_forward), *_no_peers()]))
    for dtype in (BF16, FP32):
        # Timed as CUDA graphs: torch.compile's forward + backward spends more CPU time a call than GPU time at
        # most of these shapes (lab 07's perf case, grader07/perf.py), which a timing of calls would measure.
        ops.append(Op(
            "bias_gelu_fwd_bwd", dtype, pick_shapes(forward_backward_bytes(dtype), FORWARD_BACKWARD_COUNT,
                                                    always=DECODE[:1]),
            forward_backward_bytes(dtype), _inputs(dtype, grad=True),
            [Impl("ours", _ours_forward_backward, verify=_verify_forward_backward),
             Impl("eager", _eager_forward_backward), Impl("compiled", _compiled_forward_backward), *_no_peers()],
            outputs=2, graphs=True))
    return ops
