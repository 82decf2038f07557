"""Lab 09's grader, streams and devices (GPU): every op captured in a CUDA graph on a side stream; the ops beside
lessons 07 and 08's own modules in one process; inputs on a second GPU (skipped with one).
"""
from __future__ import annotations

import torch

import harness
from coursekit import trees
from grader09 import support as S
from grader09.common import BF16, FP16, FP32, LAB, LESSON_MODULES, _lesson_module_compiled, course_ops, library
from harness import build as lab_build
from harness import random_tensor, requires_gpu
from harness.check import GradeFailure, first_line, run_student, skip_without_two_gpus

__all__ = ["test_runs_on_current_stream", "test_ops_run_beside_the_lessons_modules", "test_inputs_on_another_gpu"]


# ---------------------------------------------------------------- GPU: streams and devices
@requires_gpu
@harness.tasks("lab09.2")
def test_runs_on_current_stream():
    """Every op's kernels run on PyTorch's current stream: all nine captured in one CUDA graph on a side stream
    (the backward ops fed by the forward ops inside the graph), replayed on fresh inputs (harness.STREAM_HINT)."""
    ops = course_ops()
    x, bias, grad = (random_tensor((64, 256), FP32), random_tensor((256,), FP32), random_tensor((64, 256), FP32))
    weight = 1 + 0.1 * random_tensor((256,), FP32)
    q, k, v = (random_tensor((2, 100, 4, 64), BF16), random_tensor((2, 100, 2, 64), BF16),
               random_tensor((2, 100, 2, 64), BF16))
    grad_o = random_tensor((2, 100, 4, 64), BF16)
    out, rstd_out = torch.empty_like(x), torch.empty(64, dtype=FP32, device="cuda")

    def run():
        y, rstd = ops.rms_norm(x, weight, S.EPS)
        s = ops.softmax(x)
        o, lse = ops.flash_attention(q, k, v, True)
        ops.rms_norm_out(x, weight, S.EPS, out, rstd_out)
        return {"bias_gelu": ops.bias_gelu(x, bias), "bias_gelu_backward": ops.bias_gelu_backward(grad, x, bias),
                "rms_norm": (y, rstd), "rms_norm_out": (out, rstd_out),
                "rms_norm_backward": ops.rms_norm_backward(grad, x, weight, rstd), "softmax": s,
                "softmax_backward": ops.softmax_backward(grad, s), "flash_attention": (o, lse),
                "flash_attention_backward": ops.flash_attention_backward(grad_o, q, k, v, o, lse, True)}

    outs = LAB.capture_on_current_stream(run, inputs=(x, bias, grad, weight, q, k, v, grad_o),
                                         case="the lab's nine ops")
    args = {"bias_gelu": (x, bias, "none"), "bias_gelu_backward": (grad, x, bias, "none"),
            "rms_norm": (x, weight, S.EPS), "rms_norm_out": (x, weight, S.EPS),
            "rms_norm_backward": (grad, x, weight, outs["rms_norm"][1]), "softmax": (x,),
            "softmax_backward": (grad, outs["softmax"]), "flash_attention": (q, k, v, True, None),
            "flash_attention_backward": (grad_o, q, k, v, outs["flash_attention"][0], outs["flash_attention"][1],
                                         True, None)}
    for name in S.NAMES:
        S.check_against_golden(name, args[name], S.as_tuple(outs[name]),
                             case=f"{library().namespace}::{name} replayed from a CUDA graph", hint=harness.STREAM_HINT)


@requires_gpu
@harness.tasks("lab09.2")
def test_ops_run_beside_the_lessons_modules():
    """Lab 09 compiles lessons 07 and 08's sources again, so one process (a notebook, a pytest run over several labs)
    may hold both copies of a launcher. A function-local static of a template is one object in the whole process
    (a unique global symbol that the dynamic linker merges across libraries): a launcher that remembers "this
    kernel opted in to its shared memory" in such a static skips the opt-in for the other library's kernel, whose
    launch then fails (cudaErrorInvalidValue). Lessons 07 and 08's modules run first here, then the lab's ops on the
    same instantiations (both attention head dims and 16-bit types, both directions; softmax's long rows)."""
    ops = course_ops()
    hint = ("a launcher that remembers a side effect on its kernel (cudaFuncSetAttribute) in a static: key it by the "
            "kernel's address (course::opt_in_dynamic_shared in include/course/cuda.cuh)")
    for number in LESSON_MODULES:
        _lesson_module_compiled(number, str(LAB.tree.path))
    lab07 = lab_build.build(trees.find_lab("07"), LAB.tree)
    lab08 = lab_build.build(trees.find_lab("08"), LAB.tree)
    for dtype in (BF16, FP16):
        for head_dim in (64, 128):
            q, k, v, grad_o = (random_tensor(shape, dtype) for shape in
                               ((2, 100, 4, head_dim), (2, 100, 2, head_dim), (2, 100, 2, head_dim),
                                (2, 100, 4, head_dim)))
            what = f"flash attention, head_dim {head_dim}, {dtype}"
            o, lse = run_student(f"lab 08's module: {what}", lambda: lab08.flash_forward(q, k, v, True), hint=hint)
            run_student(f"lab 08's module: {what}, backward",
                        lambda: lab08.flash_backward(grad_o, q, k, v, o, lse, True), hint=hint)
            ours = run_student(f"{library().namespace}::flash_attention beside lab 08's module: {what}",
                               lambda: ops.flash_attention(q, k, v, True), hint=hint)
            run_student(f"{library().namespace}::flash_attention_backward beside lab 08's module: {what}",
                        lambda: ops.flash_attention_backward(grad_o, q, k, v, ours[0], ours[1], True), hint=hint)
            torch.cuda.synchronize()
            harness.check.assert_close(ours[0].double(), o.double(), tol=1e-2,
                                       case=f"flash_attention's o beside lab 08's module ({what})")
    for n in (8192, 16384, 32768):
        x = random_tensor((64, n), FP32)
        run_student(f"lab 07's module: softmax, rows of {n}", lambda: lab07.softmax(x), hint=hint)
        y = run_student(f"{library().namespace}::softmax beside lab 07's module, rows of {n}", lambda: ops.softmax(x),
                        hint=hint)
        torch.cuda.synchronize()
        harness.check.assert_close(y.double(), torch.softmax(x.double(), -1), tol=1e-5,
                                   case=f"softmax beside lab 07's module (rows of {n})")


@requires_gpu
@harness.tasks("lab09.2")
def test_inputs_on_another_gpu():
    """Inputs on cuda:1 while cuda:0 is current, and cuda:0 busy: each op computes on cuda:1 (its wrapper's device
    guard), so its outputs are ready once cuda:1 is synchronized. The dispatcher adds no device guard to a custom
    op's kernel: without the wrapper's, the kernel goes to cuda:0's stream. Needs two GPUs."""
    skip_without_two_gpus("inputs on a GPU other than the current one")
    ops = course_ops()
    torch.cuda.set_device(0)
    device = torch.device("cuda:1")
    x, bias = random_tensor((64, 256), FP32, device=device), random_tensor((256,), FP32, device=device)
    weight = 1 + 0.1 * random_tensor((256,), FP32, device=device)
    q, k, v = (random_tensor(s, BF16, device=device) for s in ((2, 100, 4, 64), (2, 100, 2, 64), (2, 100, 2, 64)))
    cases = {"bias_gelu": (x, bias, "none"), "rms_norm": (x, weight, S.EPS), "softmax": (x,),
             "flash_attention": (q, k, v, True, None)}
    for name, args in cases.items():
        what = f"{library().namespace}::{name} of inputs on cuda:1 with cuda:0 current"
        hint = ("the wrapper's device guard (const c10::cuda::CUDAGuard device_guard(x.device())) before allocating "
                "and launching: without it the kernel goes to the current device's stream (cuda:0's), with pointers "
                "of cuda:1")
        torch.cuda.synchronize(device)
        harness.poison_allocator(x.numel(), FP32, device=device)  # y of bias_gelu, rms_norm, softmax: NaN until written
        try:
            torch.cuda._sleep(200_000_000)  # cuda:0 busy for ~0.1 s: a kernel queued there has not run yet
            outs = S.as_tuple(getattr(ops, name)(*args))
            torch.cuda.synchronize(device)
            ready = [t.clone() for t in outs]
            torch.cuda.synchronize()
        except RuntimeError as error:
            raise GradeFailure(f"{what}: {first_line(error)}\n  hint: {hint}") from None
        for t in outs:
            if t.device != device:
                raise GradeFailure(f"{what}: an output is on {t.device}\n  hint: {hint}")
        S.check_against_golden(name, args, tuple(ready), case=f"{what}, read once cuda:1 was synchronized", hint=hint)
