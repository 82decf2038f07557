"""Lab 09's grader, the decoder block (GPU): block.py's block on the course's ops against PyTorch's (outputs and
gradients, the flash-attention rule of SYLLABUS §4), compiled with fullgraph=True, and under CUDA graphs
(mode="reduce-overhead") after other work on a side stream.
"""
from __future__ import annotations

import pytest
import torch

import harness
from grader09 import support as S
from grader09.common import (
    AUTOGRAD_HINT,
    BF16,
    BLOCK_HINT,
    FAKE_HINT,
    FP16,
    _compile_failure,
    _make_block,
    block_module,
    course_ops,
)
from harness import random_tensor, requires_gpu
from harness.check import GradeFailure, first_line, run_student

__all__ = ["test_block_matches_torch", "test_block_compiles_without_graph_breaks", "test_block_on_a_side_stream"]


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
