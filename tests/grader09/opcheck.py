"""Lab 09's grader, opcheck (GPU): torch.library.opcheck of every op on several shapes and dtypes (schema, autograd
registration, fake tensor, AOT dispatch with dynamic shapes), and the fakes against the real outputs.
"""
from __future__ import annotations

import pytest
import torch

from grader09 import support as S
from grader09.common import AUTOGRAD_HINT, BINDING_HINTS, FAKE_HINT, _real_args, call, case_name, course_ops, op_params
from harness import requires_gpu
from harness.check import GradeFailure, first_line, run_student

__all__ = ["test_opcheck", "test_fakes_match_real_ops"]


# ---------------------------------------------------------------- GPU: opcheck, fakes against the real ops


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
