"""Grader for lab 09: lessons 06-08's kernels registered as PyTorch operators. ops.cpp's TORCH_LIBRARY schemas
(lab09.1) and TORCH_LIBRARY_IMPL(CUDA) bindings (lab09.2), ops.py's fake implementations (lab09.3) and autograd
formulas (lab09.4), and block.py's decoder block on the course's ops (lab09.5).

The lab is an op library (no PYBIND11_MODULE): harness.build loads the shared library and hands back an
OpLibrary whose .ops is torch.ops.<namespace>, the namespace being the module name of the build (course_labs_lab09,
course_solutions_lab09, course_sub_..._lab09), and the graded tree's ops.py registers its fakes and autograd formulas
in that namespace (ops.register).

What runs where:
  - on every machine (no GPU): the build; each schema against the lab's (argument names, types, defaults, the
    mutation annotations of rms_norm_out); a CUDA kernel and nothing else bound to each op; the dispatcher's own
    error for CPU tensors; every fake implementation under FakeTensorMode (shapes, dtypes, strides); the autograd
    formulas traced on fake tensors, with a dispatch recorder that sees which ops each backward calls (flash
    attention's backward must read the saved lse, not run the forward again); the decoder block traced on fake
    tensors (the course's ops called, the shapes of TorchOps), through torch._dynamo.explain (one graph, no break)
    and through torch.compile(fullgraph=True, backend="aot_eager") forward and backward;
  - on a GPU: torch.library.opcheck of every op on several shapes and dtypes (schema, autograd registration, fake
    tensor, AOT dispatch with dynamic shapes); the fakes against the real outputs; the ops against float64
    references; the autograd formulas against float64 gradients; every op captured in a CUDA graph on a side
    stream; inputs on a second GPU (skipped with one); the decoder block against PyTorch's (outputs and gradients,
    the flash-attention rule of SYLLABUS §4), compiled with fullgraph=True, and under CUDA graphs
    (mode="reduce-overhead") after other work on a side stream;
  - perf (`./course bench 09`): each registration style's call overhead against a direct pybind11 call of the same
    kernel, and the decoder block's forward + backward, eager and compiled, against PyTorch's.

Tolerances. The kernels are lessons 06-08's, graded there with the tolerances derived in those graders; here an
op's output only has to show that the binding passes the right arguments to the right kernel (approximate, eps,
causal, scale, the argument order): float64 references with BINDING_HEADROOM x harness.tolerance, and the
flash-attention rule (k = 2 forward, 3 gradients) for attention and for the decoder block, where PyTorch's own
16-bit error is the yardstick.
"""
from __future__ import annotations

import collections
import importlib
import os
import subprocess
import sys

import lab09_support as S
import pytest
import torch

import harness
from harness import background, notebooks, perf, random_tensor, requires_gpu, trees
from harness import build as lab_build
from harness.check import GradeFailure, first_line, run_student, skip_without_two_gpus

LAB = harness.lab("09")
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Points per task (of 100), by the work each is: nine schemas with their defaults and one mutation annotation; nine
# m.impl lines; nine fakes (shapes, dtypes, the layout a wrapper allocates); four autograd formulas with what they
# save, the lab's subtlest part; three one-line methods, graded through the whole block.
POINTS = {"lab09.1": 20, "lab09.2": 10, "lab09.3": 25, "lab09.4": 30, "lab09.5": 15}

# The few small cases `./course grade` runs under compute-sanitizer by default (the kernels themselves are lessons
# 06-08's, sanitized there): one binding of each lesson, forward and backward. (No CUDA graph: the sanitizer runs
# without PyTorch's caching allocator, which a capture needs.)
SANITIZE_CASES = [
    r"test_ops_match_references\[bias_gelu(_backward)?-7x3-float32-none\]",
    r"test_ops_match_references\[rms_norm(_backward)?-7x33-float32\]",
    r"test_ops_match_references\[flash_attention(_backward)?-b2-100x100-h4-kv2-d64-bfloat16-causal\]",
]

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


# ---------------------------------------------------------------- builds, schemas, registrations (no GPU needed)
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab builds and loads as an op library; ops.py and block.py import and define what the lab's notebook and
    the grader use. Checked on every machine."""
    lib = library()
    assert os.path.isfile(lib.path), f"the build reported {lib.path}, which is not a file"
    module = LAB.python("ops")
    for name in ("register", "register_fakes", "register_autograds"):
        assert callable(getattr(module, name, None)), f"ops.py defines no function {name!r}"
    blocks = block_module()
    for name in ("BlockConfig", "DecoderBlock", "TorchOps", "CourseOps"):
        assert hasattr(blocks, name), f"block.py defines no {name!r}"


@pytest.mark.parametrize("name", S.NAMES)
@harness.tasks("lab09.1")
def test_schemas(name):
    """Each op's schema as the lab specifies it: argument names, types, defaults and order, the mutation annotations
    (rms_norm_out writes out and rstd: Tensor(a!), Tensor(b!)), and the types of the results."""
    op = raw_op(name)
    expected = S.expected_schemas()[name]
    lib = library()
    if "default" not in op.overloads():
        raise GradeFailure(f"{lib.namespace}::{name} has overloads {op.overloads()} but no default one: define it "
                           f"without an overload name\n  expected: {expected}\n  hint: {SCHEMA_HINT}")
    actual = op.default._schema
    problems = S.schema_problems(actual, expected, lib.namespace)
    if problems:
        raise GradeFailure(f"{lib.namespace}::{name}: the schema differs from the lab's: {'; '.join(problems)}\n"
                           f"  registered: {actual}\n  expected:   {lib.namespace}::{expected}\n  hint: {SCHEMA_HINT}")


@pytest.mark.parametrize("name", S.NAMES)
@harness.tasks("lab09.1", "lab09.2")
def test_cuda_kernels_registered(name):
    """Each op has a CUDA kernel (TORCH_LIBRARY_IMPL(ns, CUDA, m)) and no CPU or composite one: the lessons' wrappers
    are CUDA code, and a CPU tensor must reach the dispatcher's own error. Read from the dispatcher's tables: no GPU
    needed."""
    raw_op(name)
    qualified = f"{library().namespace}::{name}"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CUDA"):
        raise GradeFailure(f"{qualified} has no CUDA kernel: the dispatcher would refuse every CUDA tensor\n"
                           f"  hint: {IMPL_HINT}")
    for key in ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
            raise GradeFailure(f"{qualified} has a kernel for the {key} key: the lessons' wrappers run on CUDA tensors "
                               f"only; bind them with TORCH_LIBRARY_IMPL(namespace, CUDA, m), not {key}")


@pytest.mark.parametrize("name", S.NAMES)
@harness.tasks("lab09.1", "lab09.2")
def test_dispatcher_refuses_cpu_tensors(name):
    """CPU tensors get the dispatcher's own error, "Could not run '<ns>::<op>' with arguments from the 'CPU'
    backend", with no check written for it: the op has a CUDA kernel only."""
    op = raw_op(name)
    case = S.cases_of(name)[0]
    qualified = f"{library().namespace}::{name}"
    args = case.make("cpu")
    try:
        op(*args)
    except NotImplementedError as error:
        text = str(error)
        if f"Could not run '{qualified}' with arguments from the 'CPU' backend" in text:
            return
        raise GradeFailure(f"{qualified} on CPU tensors raised the dispatcher's NotImplementedError, but not for the "
                           f"CPU backend:\n    {first_line(text)}") from None
    except Exception as error:
        raise GradeFailure(f"{qualified} on CPU tensors ({case.what}) raised {type(error).__name__}: "
                           f"{first_line(error)}\n  expected the dispatcher's \"Could not run '{qualified}' with "
                           "arguments from the 'CPU' backend\": a kernel registered for CPU (or CompositeImplicit"
                           f"Autograd) ran instead\n  hint: {IMPL_HINT}") from None
    raise GradeFailure(f"{qualified} on CPU tensors ({case.what}) returned normally: only a CUDA kernel may be "
                       f"registered\n  hint: {IMPL_HINT}")


# ---------------------------------------------------------------- fakes and autograd on fake tensors (no GPU needed)
@pytest.mark.parametrize("case", op_params(S.CASES, "lab09.3"))
def test_fakes_on_cpu(case):
    """Under FakeTensorMode (what torch.compile traces with: metadata, no data, no kernel), each op returns outputs of
    the shapes, dtypes, strides and device the CUDA wrapper allocates. Fake CUDA tensors need no GPU."""
    ops = course_ops()
    with S.fake_mode():
        args = case.make("cuda")
        result = call(case.op, args, case=f"{case_name(case)} on fake tensors", hint=FAKE_HINT, ops=ops)
        problems = S.output_problems(case.op, args, result)
    if problems:
        raise GradeFailure(f"{case_name(case)} on fake tensors: " + "; ".join(problems) + f"\n  hint: {FAKE_HINT}")


DIFFERENTIABLE_CASES = [S.cases_of(op)[0] for op in S.BACKWARD_OF]


@pytest.mark.parametrize("case", op_params(DIFFERENTIABLE_CASES, "lab09.3", "lab09.4"))
def test_autograd_on_fake_tensors(case):
    """The autograd formula traced on fake tensors: the outputs require grad (rstd and lse do not: they are marked
    non-differentiable), the backward calls the op's backward op once and no other op of the lab (flash attention's
    must not run flash_attention again: the forward's lse is saved), and each input gets a gradient of its shape."""
    ops = course_ops()
    op = case.op
    backward_op = S.BACKWARD_OF[op]
    what = f"{case_name(case)} on fake tensors"
    with S.fake_mode():
        args = list(case.make(S.AUTOGRAD_FAKE_DEVICE))
        leaves = []
        for i in S.DIFFERENTIABLE_INPUTS[op]:
            args[i] = args[i].detach().requires_grad_()
            leaves.append(args[i])
        outs = S.as_tuple(call(op, args, case=what, hint=AUTOGRAD_HINT, ops=ops))
        names = [n for n, _, _ in S.expected_outputs(op, tuple(args))]
        if not outs or not outs[0].requires_grad:
            raise GradeFailure(f"{what}: the output does not require grad although its inputs do: no autograd formula "
                               f"is registered for {op}\n  hint: {AUTOGRAD_HINT}")
        for name in S.NON_DIFFERENTIABLE.get(op, ()):
            if outs[names.index(name)].requires_grad:
                raise GradeFailure(f"{what}: {name} requires grad: it is not differentiable\n  hint: "
                                   f"ctx.mark_non_differentiable({name}) in setup_context")
        recorder = S.OpRecorder(library().namespace)
        with recorder:
            grads = run_student(f"{what}: torch.autograd.grad", lambda: torch.autograd.grad(
                outs[0], leaves, torch.randn_like(outs[0]), allow_unused=True), hint=AUTOGRAD_HINT)
    if recorder.calls != [backward_op]:
        again = op in recorder.calls
        raise GradeFailure(
            f"{what}: the backward called {recorder.calls or 'no op of the lab'}; it must call {backward_op} once and "
            "nothing else of the lab" + (f": it ran {op} again" if again else "") + "\n  hint: "
            + (LSE_HINT if again and op == "flash_attention" else AUTOGRAD_HINT))
    input_names = [a.name for a in raw_op(op).default._schema.arguments]
    for i, leaf, grad in zip(S.DIFFERENTIABLE_INPUTS[op], leaves, grads):
        if grad is None or tuple(grad.shape) != tuple(leaf.shape):
            got = "no gradient" if grad is None else f"a gradient of shape {list(grad.shape)}"
            raise GradeFailure(f"{what}: {input_names[i]} got {got}, expected one of its shape {list(leaf.shape)}: "
                               f"the backward returns one gradient per input, in the inputs' order\n  hint: "
                               f"{AUTOGRAD_HINT}")


BLOCK_TRACE = S.BlockCase("h256-q4-kv2", 256, 4, 2, 2, 100, BF16)
BLOCK_FORWARD_CALLS = {"rms_norm": 2, "flash_attention": 1, "bias_gelu": 1}
BLOCK_BACKWARD_CALLS = {"rms_norm_backward": 2, "flash_attention_backward": 1, "bias_gelu_backward": 1}


def _make_block(mod, case: S.BlockCase, device):
    return run_student("DecoderBlock(...)", lambda: mod.DecoderBlock(case.config(mod), dtype=case.dtype, device=device),
                       hint="block.py's DecoderBlock is given code: was it edited?")


def _calls_problem(recorded: list[str], wanted: dict) -> str:
    counts = dict(collections.Counter(recorded))
    return "" if counts == wanted else f"called the lab's ops {counts or 'never'}, expected {wanted}"


@harness.tasks("lab09.3", "lab09.5")
def test_block_on_fake_tensors():
    """The decoder block with CourseOps traced on fake CUDA tensors: the course's ops called (rms_norm twice,
    flash_attention and bias_gelu once), and the output of TorchOps's shape, dtype and strides."""
    ops, mod = course_ops(), block_module()
    what = f"{BLOCK_TRACE.describe()} with CourseOps, on fake tensors"
    with S.fake_mode():
        block = _make_block(mod, BLOCK_TRACE, "cuda")
        x = torch.empty(BLOCK_TRACE.batch, BLOCK_TRACE.seqlen, BLOCK_TRACE.hidden, dtype=BF16, device="cuda")
        want = block(x, mod.TorchOps())
        recorder = S.OpRecorder(library().namespace)
        with recorder:
            got = run_student(what, lambda: block(x, mod.CourseOps(ops)), hint=BLOCK_HINT)
    problem = _calls_problem(recorder.calls, BLOCK_FORWARD_CALLS)
    if problem:
        raise GradeFailure(f"{what}: {problem}\n  hint: {BLOCK_HINT}")
    if (got.shape, got.dtype, got.stride()) != (want.shape, want.dtype, want.stride()):
        raise GradeFailure(f"{what}: the output is {S.describe_tensor(got)}, TorchOps's {S.describe_tensor(want)}\n"
                           f"  hint: {BLOCK_HINT}")


@harness.tasks("lab09.3", "lab09.4", "lab09.5")
def test_block_backward_on_fake_tensors():
    """The block's backward traced on fake tensors: each course op's backward op called (and no forward op again),
    every parameter and x given a gradient of its shape."""
    ops, mod = course_ops(), block_module()
    what = f"{BLOCK_TRACE.describe()} with CourseOps, forward and backward on fake tensors"
    with S.fake_mode():
        block = _make_block(mod, BLOCK_TRACE, S.AUTOGRAD_FAKE_DEVICE)
        x = torch.empty(BLOCK_TRACE.batch, BLOCK_TRACE.seqlen, BLOCK_TRACE.hidden, dtype=BF16,
                        device=S.AUTOGRAD_FAKE_DEVICE, requires_grad=True)
        y = run_student(what, lambda: block(x, mod.CourseOps(ops)), hint=BLOCK_HINT)
        params = dict(block.named_parameters())
        recorder = S.OpRecorder(library().namespace)
        with recorder:
            grads = run_student(f"{what}: torch.autograd.grad", lambda: torch.autograd.grad(
                y, [x, *params.values()], torch.randn_like(y), allow_unused=True), hint=AUTOGRAD_HINT)
    problem = _calls_problem(recorder.calls, BLOCK_BACKWARD_CALLS)
    if problem:
        again = [op for op in recorder.calls if op in S.BACKWARD_OF]
        raise GradeFailure(f"{what}: the backward {problem}\n  hint: "
                           + (LSE_HINT if "flash_attention" in again else AUTOGRAD_HINT))
    for name, leaf, grad in zip(["x", *params], [x, *params.values()], grads):
        if grad is None or grad.shape != leaf.shape:
            raise GradeFailure(f"{what}: {name} got {'no gradient' if grad is None else list(grad.shape)}, expected "
                               f"a gradient of shape {list(leaf.shape)}\n  hint: {AUTOGRAD_HINT}")


@harness.tasks("lab09.3", "lab09.4", "lab09.5")
def test_block_compiles_on_fake_tensors():
    """torch._dynamo.explain of the block with CourseOps on fake CUDA tensors finds one graph and no graph break (an
    op without a fake implementation, or Python that torch.compile cannot trace, would break it), and
    torch.compile(fullgraph=True, backend="aot_eager") traces its forward and backward (AOTAutograd's joint graph
    through the registered autograd formulas)."""
    ops, mod = course_ops(), block_module()
    what = f"{BLOCK_TRACE.describe()} with CourseOps, on fake tensors"
    shape = (BLOCK_TRACE.batch, BLOCK_TRACE.seqlen, BLOCK_TRACE.hidden)
    torch._dynamo.reset()
    try:
        with S.fake_mode():
            block = _make_block(mod, BLOCK_TRACE, "cuda")
            x = torch.empty(shape, dtype=BF16, device="cuda")
            explained = run_student(f"torch._dynamo.explain of {what}",
                                    lambda: torch._dynamo.explain(block)(x, mod.CourseOps(ops)), hint=FAKE_HINT)
        if explained.graph_break_count or explained.graph_count != 1:
            reasons = "; ".join(first_line(b.reason) for b in explained.break_reasons[:3])
            raise GradeFailure(f"torch._dynamo.explain of {what}: {explained.graph_count} graphs, "
                               f"{explained.graph_break_count} graph breaks ({reasons})\n  hint: every op needs a fake "
                               f"implementation ({FAKE_HINT}), and CourseOps no Python torch.compile cannot trace "
                               "(.item(), a print of a tensor, a branch on a tensor's values)")
        torch._dynamo.reset()
        with S.fake_mode():
            block = _make_block(mod, BLOCK_TRACE, S.AUTOGRAD_FAKE_DEVICE)
            x = torch.empty(shape, dtype=BF16, device=S.AUTOGRAD_FAKE_DEVICE, requires_grad=True)
            compiled = torch.compile(lambda t: block(t, mod.CourseOps(ops)), fullgraph=True, backend="aot_eager")

            def forward_backward():
                y = compiled(x)
                return torch.autograd.grad(y, [x, *block.parameters()], torch.randn_like(y))

            run_student(f"torch.compile(fullgraph=True, backend='aot_eager') of {what}, forward and backward",
                        forward_backward, hint=f"{AUTOGRAD_HINT}; {FAKE_HINT}")
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------- GPU: opcheck, fakes against the real ops
def _real_args(case: S.OpCase, requires_grad: bool = False) -> tuple:
    """The case's arguments on the GPU; with requires_grad the differentiable inputs are leaves that require grad
    (views of a packed tensor stay views: detach() keeps their strides)."""
    args = list(case.make("cuda"))
    if requires_grad and case.op in S.DIFFERENTIABLE_INPUTS:
        for i in S.DIFFERENTIABLE_INPUTS[case.op]:
            args[i] = args[i].detach().requires_grad_()
    return tuple(args)


OPCHECK_HINTS = {
    "test_schema": "the schema's annotations must say what the op does: an argument it writes is Tensor(a!) (and "
                   "returned or not as the schema says), an output is a fresh tensor, not an input or a view of one",
    "test_autograd_registration": "an op whose inputs require grad needs an autograd formula registered for it (" +
                                  AUTOGRAD_HINT + ")",
    "test_faketensor": "the fake implementation's outputs must match the CUDA kernel's: " + FAKE_HINT,
    "test_aot_dispatch_dynamic": "AOTAutograd traced the op (and its backward) with symbolic shapes and compared with "
                                 "eager: the fake must compute shapes from its inputs' shapes (no int() of a size, "
                                 "no data-dependent branch), and the backward formula must give eager's gradients",
}


@requires_gpu
@pytest.mark.parametrize("case", op_params(S.CASES, "lab09.1", "lab09.2", "lab09.3", "lab09.4"))
def test_opcheck(case):
    """torch.library.opcheck with its default checks: the schema against what the op does (mutations, aliasing),
    the autograd registration, the fake implementation against the CUDA kernel, and AOTAutograd with dynamic
    shapes (forward and, where the inputs require grad, backward) against eager."""
    ops = course_ops()
    args = _real_args(case, requires_grad=True)
    results = run_student(f"torch.library.opcheck of {case_name(case)}",
                          lambda: torch.library.opcheck(getattr(ops, case.op), args, raise_exception=False),
                          hint=FAKE_HINT)
    failed = {name: result for name, result in results.items() if result != "SUCCESS"}
    if failed:
        lines = [f"    {name}: {type(error).__name__}: {first_line(error)}\n      hint: {OPCHECK_HINTS.get(name, '')}"
                 for name, error in failed.items()]
        raise GradeFailure(f"torch.library.opcheck of {case_name(case)} failed {len(failed)} of {len(results)} "
                           "checks:\n" + "\n".join(lines))


@requires_gpu
@pytest.mark.parametrize("case", op_params(S.CASES, "lab09.2", "lab09.3"))
def test_fakes_match_real_ops(case):
    """The fake implementation's outputs have the real op's shapes, strides, dtypes and storage offsets, for the
    same inputs (FakeTensorMode.from_tensor of the real ones)."""
    ops = course_ops()
    args = _real_args(case)
    real = call(case.op, args, case=case_name(case), hint=BINDING_HINTS[case.op], ops=ops)
    with S.fake_mode() as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake = call(case.op, fake_args, case=f"{case_name(case)} on fake tensors", hint=FAKE_HINT, ops=ops)
    problems = S.metadata_problems(real, fake)
    if problems:
        raise GradeFailure(f"{case_name(case)}: " + "; ".join(problems) + f"\n  hint: {FAKE_HINT}")


# ---------------------------------------------------------------- GPU: the ops against float64 references
@requires_gpu
@pytest.mark.parametrize("case", op_params(S.CASES, "lab09.1", "lab09.2"))
def test_ops_match_references(case):
    """Each op's outputs (placement: shape, dtype, device, contiguous) and values against a float64 reference: the
    right kernel, given the right arguments."""
    ops = course_ops()
    args = _real_args(case)
    result = call(case.op, args, case=case_name(case), hint=BINDING_HINTS[case.op], ops=ops)
    problems = S.output_problems(case.op, args, result)
    if problems:
        raise GradeFailure(f"{case_name(case)}: " + "; ".join(problems) + f"\n  hint: {BINDING_HINTS[case.op]}")
    outs = (args[3], args[4]) if case.op == "rms_norm_out" else S.as_tuple(result)
    S.check_against_golden(case.op, args, outs, case=case_name(case), hint=BINDING_HINTS[case.op])


def _strided_like(t: torch.Tensor) -> torch.Tensor:
    """Random values of t's shape in a non-contiguous view (every other element of a wider tensor): a gradient as
    autograd may hand it to a backward formula."""
    wide = random_tensor((*t.shape[:-1], 2 * t.shape[-1]), t.dtype)
    return wide[..., ::2]


@requires_gpu
@pytest.mark.parametrize("case", op_params([c for op in S.BACKWARD_OF for c in S.cases_of(op)], "lab09.4"))
def test_autograd_matches_references(case):
    """torch.autograd.grad through each differentiable op, with a non-contiguous gradient (the backward ops refuse
    one: the formula must pass grad.contiguous()), against float64 gradients."""
    ops = course_ops()
    op = case.op
    args = list(_real_args(case, requires_grad=True))
    leaves = [args[i] for i in S.DIFFERENTIABLE_INPUTS[op]]
    what = f"{case_name(case)}, gradients through autograd"
    out = S.as_tuple(call(op, args, case=what, hint=AUTOGRAD_HINT, ops=ops))[0]
    grad = _strided_like(out)
    grads = run_student(f"{what}: torch.autograd.grad", lambda: torch.autograd.grad(out, leaves, grad),
                        hint=AUTOGRAD_HINT)
    a = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in args)
    g = grad.contiguous()
    names = [f"{arg.name}.grad" for arg in raw_op(op).default._schema.arguments]
    if op == "flash_attention":
        S.check_flash_backward(grads, g, *a[:3], out.detach(), a[3], a[4], case=what, hint=AUTOGRAD_HINT,
                             names=names[:3])
        return
    if op == "bias_gelu":
        backward_args = (g, a[0], a[1], a[2])
    elif op == "rms_norm":
        backward_args = (g, a[0], a[1], torch.rsqrt(a[0].double().pow(2).mean(-1) + a[2]))
    else:
        backward_args = (g, out.detach())
    backward_op = S.BACKWARD_OF[op]
    gold = S.golden(backward_op, backward_args) if op != "rms_norm" else _rms_norm_grads(a, g)
    floors = list(S.gelu_floors(backward_op, backward_args, gold).values())
    rows = a[0].numel() // max(1, a[0].shape[-1])
    for i, got, want in zip(S.DIFFERENTIABLE_INPUTS[op], grads, gold):
        n = S.reduction_length(backward_op, backward_args) + (rows if i else 0)
        LAB.assert_close(got, want, case=f"{what}: {names[i]}", tol=S.binding_tol(a[0].dtype, n),
                         hint=AUTOGRAD_HINT, floor=floors[i] if i < len(floors) else None)


def _rms_norm_grads(args, grad) -> list[torch.Tensor]:
    """float64 gradients of x * rsqrt(mean(x^2) + eps) * weight for x and weight, with the case's eps."""
    x = args[0].double().requires_grad_()
    w = args[1].double().requires_grad_()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args[2]) * w
    return list(torch.autograd.grad(y, (x, w), grad.double()))


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


# ---------------------------------------------------------------- GPU: the decoder block
BLOCK_CASES = [S.BlockCase("h256-q4-kv2-d64-bf16", 256, 4, 2, 2, 100, BF16),
               S.BlockCase("h512-q4-kv1-d128-fp16", 512, 4, 1, 1, 257, FP16)]


def _block_inputs(case: S.BlockCase):
    mod = block_module()
    block = _make_block(mod, case, "cuda")
    shape = (case.batch, case.seqlen, case.hidden)
    return mod, block, random_tensor(shape, case.dtype), random_tensor(shape, case.dtype)


def check_block(got, golden, same, *, case: str, hint: str = BLOCK_HINT) -> None:
    """The block's output and gradients (run_block's pair) against the float64 golden, by the flash-attention rule
    with PyTorch's own same-dtype block as the yardstick (k = 2 for the output, 3 for the gradients)."""
    y, grads = got
    harness.check.assert_flash_rule(y, golden[0], same[0], case=f"{case}: y", k=2.0, hint=hint)
    for name, grad in grads.items():
        harness.check.assert_flash_rule(grad, golden[1][name], same[1][name], case=f"{case}: {name}.grad", k=3.0,
                                        hint=hint + "; a gradient alone off: " + AUTOGRAD_HINT)


@requires_gpu
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in BLOCK_CASES])
@harness.tasks("lab09.1", "lab09.2", "lab09.3", "lab09.4", "lab09.5")
def test_block_matches_torch(case):
    """The decoder block with CourseOps against the same block with TorchOps, same parameters: the output and the
    gradients of x and every parameter, by the flash-attention rule against a float64 golden."""
    ops = course_ops()
    mod, block, x, grad_y = _block_inputs(case)
    golden = S.block_golden(block, x, grad_y, lambda m, t: m(t, mod.TorchOps()))
    same = S.run_block(block, x, grad_y, lambda t: block(t, mod.TorchOps()))
    what = f"{case.describe()} with CourseOps"
    got = run_student(what, lambda: S.run_block(block, x, grad_y, lambda t: block(t, mod.CourseOps(ops))),
                      hint=BLOCK_HINT)
    check_block(got, golden, same, case=what)


def _compile_failure(what: str, error: Exception) -> GradeFailure:
    if "Cxx" in type(error).__name__ or "CppCompile" in type(error).__name__:  # Inductor's host compiler
        pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {first_line(error)})")
    return GradeFailure(f"{what} failed ({type(error).__name__}): {first_line(error)}\n  hint: the eager block ran; "
                        f"under torch.compile every op runs on fake tensors first: {FAKE_HINT}")


@requires_gpu
@harness.tasks("lab09.1", "lab09.2", "lab09.3", "lab09.4", "lab09.5")
def test_block_compiles_without_graph_breaks():
    """torch._dynamo.explain of the block with CourseOps: one graph, no graph break; torch.compile(fullgraph=True)
    of it, forward and backward, against the float64 golden by the flash-attention rule (PyTorch's eager block the
    yardstick)."""
    ops = course_ops()
    case = BLOCK_CASES[0]
    mod, block, x, grad_y = _block_inputs(case)
    what = f"{case.describe()} with CourseOps"
    torch._dynamo.reset()
    explained = run_student(f"torch._dynamo.explain of {what}",
                            lambda: torch._dynamo.explain(block)(x, mod.CourseOps(ops)), hint=FAKE_HINT)
    if explained.graph_break_count or explained.graph_count != 1:
        reasons = "; ".join(first_line(b.reason) for b in explained.break_reasons[:3])
        raise GradeFailure(f"torch._dynamo.explain of {what}: {explained.graph_count} graphs, "
                           f"{explained.graph_break_count} graph breaks ({reasons})\n  hint: {FAKE_HINT}")
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: block(t, mod.CourseOps(ops)), fullgraph=True)
    try:
        got = S.run_block(block, x, grad_y, compiled)
    except Exception as error:
        raise _compile_failure(f"torch.compile(fullgraph=True) of {what}, forward and backward", error) from None
    finally:
        torch._dynamo.reset()
    golden = S.block_golden(block, x, grad_y, lambda m, t: m(t, mod.TorchOps()))
    same = S.run_block(block, x, grad_y, lambda t: block(t, mod.TorchOps()))
    check_block(got, golden, same, case=f"torch.compile(fullgraph=True) of {what}")


SIDE_STREAM_SLEEP_CYCLES = 50_000_000  # a spin kernel of ~25-30 ms: the work still running when the block is called


@requires_gpu
@pytest.mark.parametrize("mode", ["eager", "reduce-overhead"])
@harness.tasks("lab09.2", "lab09.3", "lab09.5")
def test_block_on_a_side_stream(mode):
    """The block (forward, no grad) on a side stream, right after other PyTorch work on that stream produced its
    input: eagerly, and compiled with mode="reduce-overhead" (CUDA graphs: warm-up, capture, replays). Each call
    must see the input its stream produced: a kernel on the legacy default stream does not wait for the side stream
    (and cannot be captured)."""
    ops = course_ops()
    case = BLOCK_CASES[0]
    mod, block, _, _ = _block_inputs(case)
    shape = (case.batch, case.seqlen, case.hidden)
    what = f"{case.describe()} with CourseOps on a side stream" + (", torch.compile(mode='reduce-overhead')"
                                                                    if mode != "eager" else ", eager")
    forward = lambda t: block(t, mod.CourseOps(ops))  # noqa: E731
    if mode != "eager":
        torch._dynamo.reset()
        forward = torch.compile(forward, mode=mode, fullgraph=True)
    sources = [random_tensor(shape, case.dtype) for _ in range(4)]
    x = torch.empty(shape, dtype=case.dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs = []
    try:
        with torch.no_grad(), torch.cuda.stream(side):
            for source in sources:
                torch.cuda._sleep(SIDE_STREAM_SLEEP_CYCLES)  # other work, still running...
                x.copy_(source)  # ...that produces the block's input
                outs.append(forward(x).clone())
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as error:
        if "Cxx" in type(error).__name__ or "CppCompile" in type(error).__name__:  # Inductor's host compiler
            pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {first_line(error)})")
        raise GradeFailure(f"{what}: {type(error).__name__}: {first_line(error)}\n  hint: {harness.STREAM_HINT}") \
            from None
    finally:
        torch._dynamo.reset()
    block64 = S.double_block(block)
    with torch.no_grad():
        for i, (source, out) in enumerate(zip(sources, outs)):
            golden = block64(source.double(), mod.TorchOps())
            same = block(source, mod.TorchOps())
            harness.check.assert_flash_rule(out, golden, same, case=f"{what}: call {i + 1} of {len(sources)}", k=2.0,
                                            hint=harness.STREAM_HINT)


# ---------------------------------------------------------------- GPU: speed
# Call overhead: host microseconds per call on a tiny input (bias_gelu of 8 x 64 float32: ~2 us of GPU time, less
# than a launch), against the direct pybind11 call of the same kernel (lab 06's module, built for the same tree).
# SYLLABUS §5 row 09: the C++ TORCH_LIBRARY op at most 5 us more. Measured under torch.inference_mode(), where the
# dispatcher skips the Autograd keys: the op's own path (Python binding of torch.ops, the dispatcher, the CUDA
# kernel). With grad mode on, register_autograd's Python kernel runs first on every call, whether or not an input
# requires grad: reported, not held to a bar, as is a torch.library.custom_op (Python) wrapped around the pybind11
# call. Measured on an H200 (2026-11-26, `./course bench 09`, two runs): the op 1.26-1.32 us more than the pybind11
# call (7.0-7.4 us against 5.7-6.1 us); with grad mode on 7.3-8.4 us more; a Python custom_op 4.8-4.9 us more (inference
# mode) and 10.5-11.4 us (grad mode). The student bar, 10 us more, leaves room for a wrapper that checks more than
# the reference's and still fails one that does per-call Python work in grad mode as well.
OVERHEAD_SHAPE = (8, 64)
OVERHEAD_TARGET_US, OVERHEAD_STUDENT_US = 5.0, 10.0
# The decoder block at batch 8, seq 2048, hidden 2048, 16 heads on 4 KV heads (head_dim 128), bf16, forward and backward
# (torch.autograd.grad of x and every parameter). PyTorch's block runs SDPA's default backend, cuDNN's attention; the
# projections and the MLP are cuBLAS in both. Measured on an H100 (2026-11-26, the Hopper forward and backward of lesson
# 08, the backward's blocks in groups of heads, longest first): `./course bench 09` 1.03x eager (8.71 against 8.94 ms)
# and 1.00x compiled (8.601 against 8.610 ms); site/data/evidence/09-custom-ops/block_profile.py 1.02x and 1.01x.
# SYLLABUS §5 row 09's "compiled not slower" is a tie there, so the reference targets are the measured ratios less a 5%
# margin for run-to-run noise: 0.95 both (an H200 measured 1.03x and 1.00x too; before the Hopper paths,
# 0.86-0.89x). Student bars 0.55: from lesson 08's bench (FA2 0.483 ms forward, 1.393 ms backward at causal d128, seqlen
# 2048, on an H200), a student whose lesson 08 kernels sit at that lesson's bars (forward 0.5x, backward 0.35x FA2)
# spends about 2.8 ms more on attention here, which puts the block near 0.67-0.69x; a bar near that would grade lesson
# 08 again.
BLOCK_PERF = S.BlockCase("perf", 2048, 16, 4, 8, 2048, BF16)
PERF_BARS = {"decoder block forward+backward, eager": (0.95, 0.55),
             "decoder block forward+backward, compiled": (0.95, 0.55)}
PERF_HINTS = {
    "decoder block forward+backward, eager": "the block's time is mostly cuBLAS in both; the rest is lessons 06-08's "
                                             "kernels (attention forward and backward first): their perf tests say "
                                             "which one is slow",
    "decoder block forward+backward, compiled": "no graph break (one graph each way), and nothing around the ops that "
                                                "Inductor cannot fuse: CourseOps calls the ops on the tensors as they "
                                                "come, with no .contiguous(), transpose or copy",
}


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab09.1", "lab09.2")
def test_perf_call_overhead():
    """Host time per call of bias_gelu on a tiny input: the TORCH_LIBRARY op under inference_mode (held to the bar),
    with grad mode on, and a Python custom_op around the pybind11 call (both reported), each against lab 06's
    pybind11 function."""
    if os.environ.get(perf.PROFILE_ENV):
        pytest.skip("call overhead is host time, not a kernel: not profiled")
    ops = course_ops()
    lab06 = lab_build.build(trees.find_lab("06"), LAB.tree)
    custom = S.pybind_custom_op(lab06, LAB.tree.tag)
    x, bias = random_tensor(OVERHEAD_SHAPE, FP32), random_tensor(OVERHEAD_SHAPE[-1:], FP32)
    direct = lambda: lab06.bias_gelu(x, bias, "none", True)  # noqa: E731
    op = lambda: ops.bias_gelu(x, bias)  # noqa: E731
    wrapped = lambda: custom(x, bias)  # noqa: E731
    if not torch.equal(op().view(torch.int32), direct().view(torch.int32)):  # bitwise: NaN equals NaN
        raise GradeFailure(f"bias_gelu {list(OVERHEAD_SHAPE)}: the op and lab 06's function of the same tree differ\n"
                           f"  hint: {BINDING_HINTS['bias_gelu']}")
    with torch.inference_mode():
        direct_us, op_us, custom_us = S.host_us_per_call([direct, op, wrapped])
    direct_grad_us, op_grad_us, custom_grad_us = S.host_us_per_call([direct, op, wrapped])
    base = "lab 06's pybind11 bias_gelu, the same kernel"
    extra = S.record_overhead(LAB.lab.name, "call overhead: TORCH_LIBRARY op, inference_mode", op_us, direct_us,
                              base, OVERHEAD_TARGET_US, OVERHEAD_STUDENT_US)
    for name, ours_us, direct_at in (
            ("TORCH_LIBRARY op, grad mode (register_autograd's Python kernel)", op_grad_us, direct_grad_us),
            ("torch.library.custom_op around pybind11, inference_mode", custom_us, direct_us),
            ("torch.library.custom_op around pybind11, grad mode", custom_grad_us, direct_grad_us)):
        S.record_overhead(LAB.lab.name, f"call overhead: {name}", ours_us, direct_at, base, None, None)
    bar = OVERHEAD_TARGET_US if LAB.tree.is_reference else OVERHEAD_STUDENT_US
    if extra > bar:
        raise GradeFailure(
            f"call overhead: the TORCH_LIBRARY op takes {op_us:.2f} us a call, {extra:.2f} us more than {base} "
            f"({direct_us:.2f} us): above the {'reference target' if LAB.tree.is_reference else 'student bar'} of "
            f"{bar:g} us (student bar {OVERHEAD_STUDENT_US:g} us, target {OVERHEAD_TARGET_US:g} us)\n  hint: bind the "
            "C++ function itself (m.impl in TORCH_LIBRARY_IMPL(ns, CUDA, m)), not a Python implementation or a "
            "CompositeImplicitAutograd wrapper that dispatches again")


def _block_step(block, x, grad_y, forward):
    def step():
        y = forward(x)
        return y, torch.autograd.grad(y, [x, *block.parameters()], grad_y)
    return step


def _block_perf(kind: str, compiled: bool):
    ops, mod = course_ops(), block_module()
    case = BLOCK_PERF
    block = _make_block(mod, case, "cuda")
    shape = (case.batch, case.seqlen, case.hidden)
    x, grad_y = random_tensor(shape, case.dtype).requires_grad_(), random_tensor(shape, case.dtype)
    ours_fn = lambda t: block(t, mod.CourseOps(ops))  # noqa: E731
    torch_fn = lambda t: block(t, mod.TorchOps())  # noqa: E731
    head_dim = case.hidden // case.heads
    q = random_tensor((case.batch, case.seqlen, case.heads, head_dim), case.dtype)
    k, v = random_tensor((case.batch, case.seqlen, 2, case.kv_heads, head_dim), case.dtype).unbind(2)
    backend = S.sdpa_backend_name(q, k, v)
    del q, k, v
    torch._dynamo.reset()
    if compiled:
        ours_fn = torch.compile(ours_fn, fullgraph=True)
        torch_fn = torch.compile(torch_fn, fullgraph=True)
        try:
            _block_step(block, x, grad_y, torch_fn)()
        except Exception as error:  # the baseline's failure is not the lab's
            pytest.skip(f"torch.compile of PyTorch's block does not run here ({type(error).__name__}: "
                        f"{first_line(error)})")
        try:
            _block_step(block, x, grad_y, ours_fn)()
        except Exception as error:
            raise _compile_failure(f"torch.compile(fullgraph=True) of {case.describe()} with CourseOps", error) \
                from None
    ours_step, torch_step = _block_step(block, x, grad_y, ours_fn), _block_step(block, x, grad_y, torch_fn)
    last = {}

    def ours():
        last["y"] = ours_step()[0]

    def verify():
        y, want = last["y"].float(), torch_step()[0].float()
        error = ((y - want).norm() / want.norm()).item()
        if not error < 0.02:
            raise GradeFailure(f"{kind}: the timed calls' output is {error:.3g} away from PyTorch's block in relative "
                               f"norm (bf16 blocks agree to ~0.5%)\n  hint: {BLOCK_HINT}")

    target, student_bar = PERF_BARS[kind]
    how = "torch.compile(fullgraph=True)" if compiled else "eager"
    try:
        LAB.perf(name=f"{kind}, {case.batch}x{case.seqlen}x{case.hidden} h{case.heads} kv{case.kv_heads} bf16",
                 ours=ours, baseline=torch_step, baseline_name=f"PyTorch's block, {how} (F.rms_norm, SDPA "
                 f"{backend}, F.gelu)", student_bar=student_bar, target=target, verify=verify, inputs=(x,), reps=10)
    except GradeFailure as failure:
        raise GradeFailure(f"{failure}\n  hint: {PERF_HINTS[kind]}") from None
    finally:
        torch._dynamo.reset()


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab09.1", "lab09.2", "lab09.3", "lab09.4", "lab09.5")
def test_perf_block_eager():
    _block_perf("decoder block forward+backward, eager", compiled=False)


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab09.1", "lab09.2", "lab09.3", "lab09.4", "lab09.5")
def test_perf_block_compiled():
    _block_perf("decoder block forward+backward, compiled", compiled=True)


# ---------------------------------------------------------------- the AOT and stable-ABI builds (other helpers' tests)
def _tests_of(module_name: str, prefix: str) -> dict:
    """The test functions named prefix* of tests/<module_name>.py, when that module exists (the CMake / wheel and
    stable-ABI builds of this lab are tested there). One that declares no task is marked harness.reference_check:
    it checks given code of the graded tree (package/, stable/), which has no TODO."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return {}
    found = {name: fn for name, fn in vars(module).items() if name.startswith(prefix) and callable(fn)}
    for name, fn in found.items():
        marks = {mark.name for mark in getattr(fn, "pytestmark", [])}
        if not marks & {harness.todos.MARK, harness.todos.REFERENCE_MARK}:
            found[name] = harness.reference_check(fn)
    return found


globals().update(_tests_of("lab09_aot", "test_aot_"))
globals().update(_tests_of("lab09_stable_abi", "test_stable_"))


# The lessons whose own modules test_ops_run_beside_the_lessons_modules loads beside lab 09's.
LESSON_MODULES = ("07", "08")


@background.once
def _lesson_module_compiled(number: str, tree_path: str) -> None:
    """Lesson NN's own module compiled (or found up to date) by a python of its own, while lab 09's build and tests
    go on; test_ops_run_beside_the_lessons_modules then only imports it. After an edit of lab 07's rms_norm.cu,
    `./course grade 09` compiled lab 09 (16.5 s), then lab 07's module (16.6 s), one after the other (H100,
    2026-11-26). A failure is left to the test's own build, which reports it."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from harness import build, trees; "
            "build.build(trees.find_lab(sys.argv[2]), trees.resolve_tree(sys.argv[3]))")
    subprocess.run([sys.executable, "-c", code, str(trees.TESTS), number, tree_path], capture_output=True)


@pytest.fixture(scope="module", autouse=True)
def _ahead_of_time_builds_early(request):
    """Where the session selected the ahead-of-time tests, their builds start with the module's first test and run
    beside the others (they are subprocesses: cmake, pip, a fresh python): `./course grade 09` ran them one after
    another at the end, ~94 s of its 183 s on an H100 (2026-11-27). On a GPU, lessons 07 and 08's own modules for
    test_ops_run_beside_the_lessons_modules start compiling then too (_lesson_module_compiled)."""
    selected = {item.name for item in request.session.items}
    for module_name, prefix in (("lab09_aot", "test_aot_"), ("lab09_stable_abi", "test_stable_")):
        if any(name.startswith(prefix) for name in selected):
            importlib.import_module(module_name).start_early()
    if torch.cuda.is_available() and "test_ops_run_beside_the_lessons_modules" in selected:
        for number in LESSON_MODULES:
            _lesson_module_compiled.start(number, str(LAB.tree.path))


@pytest.fixture(autouse=True)
def _no_build_beside_a_timing(request):
    """A timed test waits until every build started early has ended: no compile shares the machine with a timing."""
    if request.node.get_closest_marker("perf"):
        background.wait_all()


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_FLASH_SAVES_LSE = """\
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    def flash_attention_backward(ctx, grad_o, _grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
"""
_FLASH_RECOMPUTES_LSE = """\
        ctx.save_for_backward(q, k, v, o)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    def flash_attention_backward(ctx, grad_o, _grad_lse):
        q, k, v, o = ctx.saved_tensors
        _o, lse = ops.flash_attention(q, k, v, ctx.causal, ctx.scale)  # the forward again, for lse
"""
_VECTOR_LAUNCH = "<<<blocks_for(n / kElems), kThreadsPerBlock, 0, stream>>>(x, bias, y, n / kElems, cols / kElems);"
# The notebook: committed clean (any machine), and run top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)

MUTANTS = [
    # The fake's lse (batch, seqlen_q, heads_q) instead of (batch, heads_q, seqlen_q): torch.compile would plan every
    # later op with the wrong shape. Caught without a GPU (FakeTensorMode against the lab's shapes), and on a GPU by
    # opcheck's test_faketensor and test_fakes_match_real_ops.
    harness.Mutant("fake-lse-shape", "ops.py", "q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)",
                   "q.new_empty((batch, seqlen_q, heads_q), dtype=torch.float32)",
                   tests="test_fakes_on_cpu and flash_attention", expect="lse is", needs_gpu=False),
    # The fake's o from torch.empty_like(q) (issue 34, class c): for a q of (batch, heads, seq, dim) storage seen as
    # (batch, seq, heads, dim) it keeps q's strides, while the CUDA op returns a contiguous o: torch.compile would
    # plan the ops after it for the wrong layout. Caught without a GPU (the fake against the wrappers' contiguous
    # outputs), and on a GPU by opcheck's test_faketensor and test_fakes_match_real_ops.
    harness.Mutant("fake-o-keeps-q-layout", "ops.py", "return _contiguous_like(q), q.new_empty(",
                   "return torch.empty_like(q), q.new_empty(", tests="test_fakes_on_cpu and heads-first",
                   expect="o is", needs_gpu=False),
    # rms_norm_out's schema without its mutation annotations: functionalization, torch.compile and CUDA graphs would
    # take out and rstd for inputs it only reads. Caught without a GPU (the schema test), and on a GPU by opcheck's
    # test_schema ("mutated but not marked as mutable").
    harness.Mutant("out-schema-without-mutation-annotation", "ops.cpp",
                   "Tensor(a!) out, Tensor(b!) rstd) -> ()", "Tensor out, Tensor rstd) -> ()",
                   tests="(test_schemas or test_opcheck) and rms_norm_out", expect="Tensor(a!)", needs_gpu=False),
    # The backward registered without saving L (lse): it runs the forward again to get it. Right numbers, twice the
    # forward's cost: caught without a GPU by the dispatch recorder on fake tensors.
    harness.Mutant("backward-recomputes-lse", "ops.py", _FLASH_SAVES_LSE, _FLASH_RECOMPUTES_LSE,
                   tests="test_autograd_on_fake_tensors and flash_attention", expect="ran flash_attention again",
                   needs_gpu=False),
    # Lab 06's wrapper (compiled into this lab through depends.txt) without its device guard: the kernel goes to the
    # current device's stream with another GPU's pointers. Only two GPUs show it.
    harness.Mutant("no-device-guard", "../06-fused-elementwise/wrapper.cpp",
                   "  const c10::cuda::CUDAGuard device_guard(x.device());  // launch on x's GPU, whichever is "
                   "current\n", "", tests="test_inputs_on_another_gpu", expect="device guard", gpus=2),
    # Lab 06's vectorized forward (the block's bias + GELU) on the legacy default stream: not captured by a CUDA
    # graph, and unordered with the side stream's work before it.
    harness.Mutant("bias-gelu-on-legacy-stream", "../06-fused-elementwise/forward.cu", _VECTOR_LAUNCH,
                   _VECTOR_LAUNCH.replace(", 0, stream>>>", ">>>"),
                   tests="test_runs_on_current_stream or test_block_on_a_side_stream", expect="legacy default stream"),
    # The stable-ABI op's schema with the tanh form as its default: a caller that leaves `approximate` out gets the
    # other GELU. Only the stable-ABI wheel compiles bias_gelu_stable.cpp: caught because that wheel is built from
    # the graded tree (here the planted submission), without a GPU (the schema registered in this torch).
    harness.Mutant("stable-op-defaults-to-tanh", "stable/bias_gelu_stable.cpp",
                   'str approximate=\\"none\\") -> Tensor");', 'str approximate=\\"tanh\\") -> Tensor");',
                   tests="test_stable_registers_in_this_torch", expect='approximate="tanh"', needs_gpu=False),
    # CourseOps's attention not causal: every query sees the future.
    harness.Mutant("block-attention-not-causal", "block.py", "self.ops.flash_attention(q, k, v, True)[0]",
                   "self.ops.flash_attention(q, k, v)[0]", tests="test_block_matches_torch",
                   expect="flash-attention bound"),
]
