"""Lab 09's grader, fakes and autograd on fake tensors (no GPU needed): every fake implementation under
FakeTensorMode (shapes, dtypes, strides); the autograd formulas traced on fake tensors, with a dispatch recorder that
sees which ops each backward calls (flash attention's backward must read the saved lse, not run the forward again);
the decoder block traced on fake tensors (the course's ops called, the shapes of TorchOps), through
torch._dynamo.explain (one graph, no break) and through torch.compile(fullgraph=True, backend="aot_eager") forward
and backward.
"""
from __future__ import annotations

import collections

import pytest
import torch

import harness
from grader09 import support as S
from grader09.common import (
    AUTOGRAD_HINT,
    BF16,
    BLOCK_HINT,
    FAKE_HINT,
    LSE_HINT,
    _make_block,
    block_module,
    call,
    case_name,
    course_ops,
    library,
    op_params,
    raw_op,
)
from harness.check import GradeFailure, first_line, run_student

__all__ = ["test_fakes_on_cpu", "test_autograd_on_fake_tensors", "test_block_on_fake_tensors",
           "test_block_backward_on_fake_tensors", "test_block_compiles_on_fake_tensors"]


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
