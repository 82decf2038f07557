"""Lab 09's grader, the build and the registrations (no GPU needed): the lab builds and loads as an op library;
each schema against the lab's (argument names, types, defaults, the mutation annotations of rms_norm_out); a CUDA
kernel and nothing else bound to each op; the dispatcher's own error for CPU tensors.
"""
from __future__ import annotations

import os

import pytest
import torch

import harness
from grader09 import support as S
from grader09.common import IMPL_HINT, LAB, SCHEMA_HINT, block_module, library, raw_op
from harness.check import GradeFailure, first_line

__all__ = ["test_builds", "test_schemas", "test_cuda_kernels_registered", "test_dispatcher_refuses_cpu_tensors"]


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
