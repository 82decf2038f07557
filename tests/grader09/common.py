"""Lab 09's grader: what its parts share. The hints its failures print; the op library and the graded tree's Python
(ops.py's fakes and autograd formulas registered once per process, block.py); one call of an op as a graded case;
the op cases as pytest parameters; the decoder block built from the tree's block.py; a case's arguments on the GPU;
torch.compile's failure as a grade; lessons 07 and 08's own modules compiled early (streams.py's test, builds.py's
fixture).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import harness
from coursekit import trees
from grader09 import support as S
from harness import background
from harness.check import GradeFailure, first_line, run_student

LAB = harness.lab("09")
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16


# ---------------------------------------------------------------- the hints a failure prints
SCHEMA_HINT = ("m.def(\"<schema>\") in ops.cpp's TORCH_LIBRARY block, one per op, with the expected text above: the "
               "argument names are how Python passes keywords, the defaults how it omits them, and Tensor(a!) tells "
               "torch.compile, functionalization and CUDA graphs which arguments an op writes")
IMPL_HINT = ("m.impl(\"<name>\", &function) in ops.cpp's TORCH_LIBRARY_IMPL(namespace, CUDA, m) block: the adapters "
             "(bias_gelu_op, rms_norm_op, ...) and lesson 08's flash_forward / flash_backward")
REGISTER_HINT = ("ops.register(namespace) runs register_fakes(namespace) and register_autograds(namespace) once; a "
                 "torch.library error there names the op: a fake or an autograd formula for an op that ops.cpp does "
                 "not define (its name, its namespace f\"{ns}::name\"), or registered twice")
FAKE_HINT = ("a fake implementation (TODO lab09.3): @torch.library.register_fake(f\"{ns}::<op>\") returning new_empty "
             "tensors of the shapes and dtypes the CUDA wrapper returns, contiguous, on the input's device; "
             "rms_norm_out's returns None")
AUTOGRAD_HINT = ("torch.library.register_autograd(f\"{ns}::<op>\", backward, setup_context=setup) (TODO lab09.4): "
                 "setup saves what the backward op reads (ctx.save_for_backward), marks rstd / lse with "
                 "ctx.mark_non_differentiable; backward calls the op's backward op on grad.contiguous() and returns "
                 "one gradient (or None) per input, in the inputs' order")
LSE_HINT = ("save lse, the forward's second output, in setup_context (ctx.save_for_backward(q, k, v, o, lse)) and "
            "pass it to flash_attention_backward: with L = log(sum exp) per row the backward rebuilds P = exp(S - L) "
            "block by block, and the forward never runs twice")
BLOCK_HINT = ("CourseOps must mean what TorchOps means (TODO lab09.5): rms_norm -> the op's first output (y, not "
              "rstd); attention -> flash_attention(q, k, v, True)[0], causal, on q, k, v as they come (B, S, H, D); "
              "bias_gelu -> bias_gelu(x, bias), the erf form")
BINDING_HINTS = {
    "bias_gelu": "bind bias_gelu to bias_gelu_op, which passes approximate on ('none' is the erf form, 'tanh' the "
                 "tanh form)",
    "bias_gelu_backward": "bind bias_gelu_backward to bias_gelu_backward_op: (grad_x, grad_bias), approximate "
                          "passed on",
    "rms_norm": "bind rms_norm to rms_norm_op, which passes eps on: (y, rstd)",
    "rms_norm_out": "bind rms_norm_out to rms_norm_out_op: it writes out and rstd",
    "rms_norm_backward": "bind rms_norm_backward to rms_norm_backward_op: (grad_x, grad_weight) from the rstd it is "
                         "given",
    "softmax": "bind softmax to softmax_op",
    "softmax_backward": "bind softmax_backward to softmax_backward_op (grad_y first, then y)",
    "flash_attention": "bind flash_attention to lesson 08's flash_forward: causal and scale passed on",
    "flash_attention_backward": "bind flash_attention_backward to lesson 08's flash_backward",
}


# ---------------------------------------------------------------- the build, the ops, the tree's Python
def library():
    """The built op library (harness.build.OpLibrary: .ops = torch.ops.<namespace>, .namespace, .path)."""
    return LAB.module


def raw_op(name: str):
    """torch.ops.<namespace>.<name> as ops.cpp defines it (no fakes or autograd needed), or a failure naming it."""
    lib = library()
    if not hasattr(lib.ops, name):
        raise GradeFailure(f"torch.ops.{lib.namespace}.{name} does not exist: ops.cpp's TORCH_LIBRARY block defines no "
                           f"op {name!r}\n  expected: m.def(\"{S.expected_schemas()[name]}\")\n  hint: {SCHEMA_HINT}")
    return getattr(lib.ops, name)


_REGISTERED: dict[str, object] = {}


def course_ops():
    """torch.ops.<namespace> after the graded tree's ops.py registered its fakes and autograd formulas (once per
    process: torch.library refuses a second registration)."""
    lib = library()
    for name in S.NAMES:  # ops.py registers for ops that ops.cpp defines: a missing one is TODO lab09.1's
        raw_op(name)
    if "ops" not in _REGISTERED:
        try:
            module = LAB.python("ops")
            _REGISTERED["ops"] = run_student(f"ops.register({lib.namespace!r})", lambda: module.register(lib.namespace),
                                             hint=REGISTER_HINT)
        except GradeFailure as failure:
            _REGISTERED["ops"] = failure
    found = _REGISTERED["ops"]
    if isinstance(found, GradeFailure):
        raise GradeFailure(str(found))
    return found


def block_module():
    return LAB.python("block")


def case_name(case: S.OpCase) -> str:
    return f"{library().namespace}::{case.what}"


def call(op_name: str, args, *, case: str, hint: str, ops=None):
    """One call of an op; an exception becomes a failure naming the case, with the hint."""
    op = getattr(ops, op_name) if ops is not None else raw_op(op_name)
    try:
        return op(*args)
    except GradeFailure:
        raise
    except Exception as error:
        if type(error).__name__ == "UnsupportedOperatorException":  # FakeTensorMode found no fake implementation
            raise GradeFailure(f"{case}: {op_name} has no fake implementation (FakeTensorMode raised "
                               f"UnsupportedOperatorException)\n  hint: {FAKE_HINT}") from None
        raise GradeFailure(f"{case} raised {type(error).__name__}: {first_line(error)}\n  hint: {hint}") from None


def op_params(cases, *tasks):
    return [pytest.param(c, id=c.id, marks=[harness.tasks(*tasks)] if tasks else []) for c in cases]


# ---------------------------------------------------------------- the block, GPU arguments, a compile's failure
def _make_block(mod, case: S.BlockCase, device):
    return run_student("DecoderBlock(...)", lambda: mod.DecoderBlock(case.config(mod), dtype=case.dtype, device=device),
                       hint="block.py's DecoderBlock is given code: was it edited?")


def _real_args(case: S.OpCase, requires_grad: bool = False) -> tuple:
    """The case's arguments on the GPU; with requires_grad the differentiable inputs are leaves that require grad
    (views of a packed tensor stay views: detach() keeps their strides)."""
    args = list(case.make("cuda"))
    if requires_grad and case.op in S.DIFFERENTIABLE_INPUTS:
        for i in S.DIFFERENTIABLE_INPUTS[case.op]:
            args[i] = args[i].detach().requires_grad_()
    return tuple(args)


def _compile_failure(what: str, error: Exception) -> GradeFailure:
    if "Cxx" in type(error).__name__ or "CppCompile" in type(error).__name__:  # Inductor's host compiler
        pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {first_line(error)})")
    return GradeFailure(f"{what} failed ({type(error).__name__}): {first_line(error)}\n  hint: the eager block ran; "
                        f"under torch.compile every op runs on fake tensors first: {FAKE_HINT}")


# ---------------------------------------------------------------- lessons 07 and 08's own modules, compiled early
# The lessons whose own modules test_ops_run_beside_the_lessons_modules loads beside lab 09's.
LESSON_MODULES = ("07", "08")


@background.once
def _lesson_module_compiled(number: str, tree_path: str) -> None:
    """Lesson NN's own module compiled (or found up to date) by a python of its own, while lab 09's build and tests
    go on; test_ops_run_beside_the_lessons_modules then only imports it. After an edit of lab 07's rms_norm.cu,
    `./course grade 09` compiled lab 09 (16.5 s), then lab 07's module (16.6 s), one after the other (H100,
    2026-11-26). A failure is left to the test's own build, which reports it."""
    code = ("from coursekit import trees; from harness import build; "
            "build.build(trees.find_lab(sys.argv[1]), trees.resolve_tree(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", "import sys; " + code, number, tree_path], capture_output=True,
                   env=dict(os.environ, PYTHONPATH=trees.pythonpath(os.environ.get("PYTHONPATH"))))
