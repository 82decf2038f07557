"""Lab 07's shape sweep (`./course bench 07 --sweep`; the machinery is harness/sweep.py): RMSNorm forward and
backward in bfloat16 (the CUDA kernels and the Triton op side by side) and softmax forward in float32, over model
shapes and vocabulary rows, against eager PyTorch, torch.compile, liger-kernel and quack-kernels.

Ours is called as perf.py calls it: LAB.module.rms_norm(x, weight), LAB.module.rms_norm_backward(grad_y, x, weight,
rstd), LAB.module.softmax(x) (path 'auto'), and the Triton ops torch.ops.course07.rms_norm_fwd / rms_norm_bwd once
triton_rms_norm.py is imported ("ours_triton"); each checked once per shape with common.py's checks (the grader's
float64 references and tolerances). Bytes as perf.py counts them: forwards 2 tensors (+ weight and rstd for RMSNorm),
the backward 3 (grad_y and x read, grad_x written) + weight twice.
The others: eager is what a model calls (F.rms_norm, whose CUDA kernels are aten::_fused_rms_norm and its backward;
torch.softmax); compiled is torch.compile of the composition the grader compiles (perf.py's compiled_composition:
its float formula), and for the backward that formula's gradient, given rstd as every backward here is; liger's
LigerRMSNormFunction (casting mode 'llama', as the composition) and its rms_norm_backward (in place, its default),
LigerSoftmaxFunction; quack's rmsnorm_fwd (rstd stored, as ours does), rmsnorm_bwd and softmax_fwd.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.check import shape_id
from harness.sweep import Impl, Op, compile_fresh, element_size, pick_shapes

from .common import (
    BF16,
    EPS,
    FP32,
    LAB,
    SOFTMAX_SCALE,
    TRITON_HINT,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    randn,
    reference_rstd,
    rms_inputs,
    softmax_hint,
    triton_module,
)

TITLE = "RMSNorm and softmax over model shapes"
RMS_FORWARD_COUNT, RMS_BACKWARD_COUNT, SOFTMAX_COUNT = 22, 18, 18
DECODE = [(1, 4096), (7, 8192), (7, 14336)]
# Softmax over a vocabulary (each of harness.sweep.VOCAB): a decode step, prompts, and a batch of 4096 tokens.
VOCAB_SHAPES = [(7, 128256), (255, 32000), (999, 50257), (999, 128256), (1537, 100003), (4096, 50257)]


def prepare() -> None:
    """The lab built and imported before any shape (triton_rms_norm.py is imported by the Triton rows' own calls: a
    tree whose Triton op does not import loses those rows, each with the reason, not the sweep)."""
    LAB.module.constants()


def rms_forward_bytes(rows, hidden):
    return (2 * rows * hidden + hidden) * element_size(BF16) + rows * 4


def rms_backward_bytes(rows, hidden):
    return (3 * rows * hidden + 2 * hidden) * element_size(BF16)


def softmax_bytes(rows, hidden):
    return 2 * rows * hidden * element_size(FP32)


def rms_composition(x, weight):
    """The formula the grader compiles (perf.py's compiled_composition): in float, as F.rms_norm computes it."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight


def rms_backward_composition(grad_y, x, weight, rstd):
    """The gradient of rms_composition given the forward's rstd: grad_x = rstd g - rstd^3 x mean(g x) with
    g = grad_y weight; grad_weight = the column sums of grad_y x rstd; in float."""
    xf, r = x.float(), rstd.unsqueeze(-1)
    g = grad_y.float() * weight.float()
    grad_x = r * g - r.pow(3) * xf * (g * xf).mean(-1, keepdim=True)
    return grad_x.to(x.dtype), (grad_y.float() * xf * r).sum(0).to(weight.dtype)


def _rms_inputs(rows, hidden):
    x, weight, grad_y = rms_inputs((rows, hidden), BF16)
    return {"x": x, "weight": weight, "grad_y": grad_y, "rstd": reference_rstd(x, EPS)}


def _softmax_inputs(rows, hidden):
    return {"x": randn((rows, hidden), FP32, SOFTMAX_SCALE)}


# ---------------------------------------------------------------- RMSNorm forward
def _verify_rms(hint=None):
    def verify(t, outputs):
        extra = {"hint": hint} if hint else {}
        check_rms_norm(outputs[0], outputs[1], t["x"], t["weight"], EPS,
                       case=f"rms_norm {shape_id(t['x'].shape)} in the sweep", **extra)
    return verify


def _ours_forward(t):
    return lambda: tuple(LAB.module.rms_norm(t["x"], t["weight"]))


def _triton_forward(t):
    triton_module()  # imported once (LAB.python): registers torch.ops.course07.*
    return lambda: tuple(torch.ops.course07.rms_norm_fwd(t["x"], t["weight"], EPS))


def _eager_forward(t):
    n = t["x"].shape[-1]
    return lambda: (F.rms_norm(t["x"], (n,), t["weight"], EPS),)


def _compiled_forward(t):
    fn = compile_fresh(rms_composition)
    return lambda: (fn(t["x"], t["weight"]),)


def _liger_forward(t):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def call():
        with torch.no_grad():
            return (LigerRMSNormFunction.apply(t["x"], t["weight"], EPS),)
    return call


def _quack_forward(t):
    from quack.rmsnorm import rmsnorm_fwd

    return lambda: rmsnorm_fwd(t["x"], t["weight"], eps=EPS, store_rstd=True)


# ---------------------------------------------------------------- RMSNorm backward
def _verify_rms_backward(hint=None):
    def verify(t, outputs):
        extra = {"hint": hint} if hint else {}
        check_rms_norm_backward(outputs[0], outputs[1], t["grad_y"], t["x"], t["weight"], EPS,
                                case=f"rms_norm_backward {shape_id(t['x'].shape)} in the sweep", **extra)
    return verify


def _ours_backward(t):
    return lambda: tuple(LAB.module.rms_norm_backward(t["grad_y"], t["x"], t["weight"], t["rstd"]))


def _triton_backward(t):
    triton_module()
    return lambda: tuple(torch.ops.course07.rms_norm_bwd(t["grad_y"], t["x"], t["weight"], t["rstd"]))


def _eager_backward(t):
    """F.rms_norm's backward kernel as autograd runs it, with the rstd its own forward saved."""
    n = t["x"].shape[-1]
    _, rstd = torch.ops.aten._fused_rms_norm(t["x"], [n], t["weight"], EPS)
    return lambda: tuple(torch.ops.aten._fused_rms_norm_backward(t["grad_y"], t["x"], [n], rstd, t["weight"],
                                                                 [True, True]))


def _compiled_backward(t):
    fn = compile_fresh(rms_backward_composition)
    return lambda: fn(t["grad_y"], t["x"], t["weight"], t["rstd"])


def _liger_backward(t):
    from liger_kernel.ops.rms_norm import rms_norm_backward, rms_norm_forward

    _, x, rstd, block, warps, mode = rms_norm_forward(t["x"], t["weight"], EPS, 0.0, "llama", None)
    grad_y = t["grad_y"].clone()  # in place (liger's default): grad_x overwrites this copy, not the shared grad_y
    return lambda: tuple(rms_norm_backward(dY=grad_y, X=x, W=t["weight"], RSTD=rstd, offset=0.0, casting_mode=mode,
                                           BLOCK_SIZE=block, num_warps=warps, in_place=True, row_mode=None))


def _quack_backward(t):
    from quack.rmsnorm import rmsnorm_bwd

    return lambda: rmsnorm_bwd(t["x"], t["weight"], t["grad_y"], t["rstd"])[:2]


# ---------------------------------------------------------------- softmax forward
def _ours_softmax(t):
    return lambda: (LAB.module.softmax(t["x"]),)


def _verify_softmax(t, outputs):
    n = t["x"].shape[-1]
    check_softmax(outputs[0], t["x"], case=f"softmax {shape_id(t['x'].shape)} in the sweep",
                  hint=softmax_hint(n, FP32, "auto"))


def _eager_softmax(t):
    return lambda: (torch.softmax(t["x"], -1),)


def _compiled_softmax(t):
    fn = compile_fresh(lambda x: torch.softmax(x, -1))
    return lambda: (fn(t["x"]),)


def _liger_softmax(t):
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def call():
        with torch.no_grad():
            return (LigerSoftmaxFunction.apply(t["x"]),)
    return call


def _quack_softmax(t):
    from quack.softmax import softmax_fwd

    return lambda: (softmax_fwd(t["x"]),)


def sweep_ops() -> list[Op]:
    return [
        Op("rms_norm_fwd", BF16, pick_shapes(rms_forward_bytes, RMS_FORWARD_COUNT, always=DECODE), rms_forward_bytes,
           _rms_inputs,
           [Impl("ours", _ours_forward, verify=_verify_rms()),
            Impl("ours_triton", _triton_forward, verify=_verify_rms(TRITON_HINT)),
            Impl("eager", _eager_forward), Impl("compiled", _compiled_forward),
            Impl("liger", _liger_forward, peer="liger"), Impl("quack", _quack_forward, peer="quack")]),
        Op("rms_norm_bwd", BF16, pick_shapes(rms_backward_bytes, RMS_BACKWARD_COUNT, always=DECODE[1:]),
           rms_backward_bytes, _rms_inputs,
           [Impl("ours", _ours_backward, verify=_verify_rms_backward()),
            Impl("ours_triton", _triton_backward, verify=_verify_rms_backward(TRITON_HINT)),
            Impl("eager", _eager_backward), Impl("compiled", _compiled_backward),
            Impl("liger", _liger_backward, peer="liger"), Impl("quack", _quack_backward, peer="quack")],
           outputs=2),
        Op("softmax_fwd", FP32, pick_shapes(softmax_bytes, SOFTMAX_COUNT, always=[*DECODE[2:], *VOCAB_SHAPES]),
           softmax_bytes, _softmax_inputs,
           [Impl("ours", _ours_softmax, verify=_verify_softmax), Impl("eager", _eager_softmax),
            Impl("compiled", _compiled_softmax), Impl("liger", _liger_softmax, peer="liger"),
            Impl("quack", _quack_softmax, peer="quack")]),
    ]
