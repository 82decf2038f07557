"""The build, and what runs without a GPU: the lab compiles and imports (its autograd.py and triton_rms_norm.py
too), its constants are the spec's, and its ops refuse CPU tensors clearly.
"""
from __future__ import annotations

import pytest
import torch

import harness
from grader07.common import (
    _CPU_CALLS,
    DTYPES,
    LAB,
    SPEC_MAX_REGISTER_ROW,
    autograd_module,
    constants,
    max_register_row,
    triton_module,
)
from harness.check import dtype_name

__all__ = ["test_builds", "test_constants", "test_refuses_cpu_tensors"]


# ---------------------------------------------------------------- builds, and what runs without a GPU
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports, and its autograd.py and triton_rms_norm.py import: checked on every machine."""
    for name in ("softmax", "softmax_backward", "rms_norm", "rms_norm_backward", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    module = autograd_module()
    for name in ("Softmax", "RMSNorm", "softmax", "rms_norm"):
        assert hasattr(module, name), f"autograd.py defines no {name!r}"
    for name in ("Softmax", "RMSNorm"):
        assert issubclass(getattr(module, name), torch.autograd.Function), (
            f"autograd.py: {name} must subclass torch.autograd.Function")
    assert hasattr(triton_module(), "rms_norm"), "triton_rms_norm.py defines no 'rms_norm'"


@harness.reference_check  # the constants are given
def test_constants():
    c = constants()
    for key in ("warp_size", "threads_per_block", "vector_bytes", "stream_threads", "max_partial_rows"):
        assert key in c, f"constants() has no {key!r}: {c}"
    assert c["vector_bytes"] == 16, f"constants(): vector_bytes = {c['vector_bytes']}, the widest load is 16 bytes"
    assert c["threads_per_block"] % c["warp_size"] == 0, f"constants(): {c}: blocks of whole warps"
    assert c["stream_threads"] % c["warp_size"] == 0, f"constants(): {c}: streaming blocks of whole warps"
    assert c["max_partial_rows"] > 1, f"constants(): {c}: grad_weight needs several blocks of partials"
    for dtype in DTYPES:
        longest = max_register_row(dtype)
        assert longest == SPEC_MAX_REGISTER_ROW[dtype], (
            f"constants(): the longest register row for {dtype_name(dtype)} is {longest}, the grader's parameters "
            f"assume {SPEC_MAX_REGISTER_ROW[dtype]} (SPEC_MAX_REGISTER_ROW): update one or the other")



@pytest.mark.parametrize("op", list(_CPU_CALLS))
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors(op):
    x, weight, rstd = torch.ones(4, 8), torch.ones(8), torch.ones(4)
    LAB.assert_raises_clearly(lambda: _CPU_CALLS[op](LAB.module, x, weight, rstd), must_mention=("CUDA", ".cuda()"),
                              case=f"{op}(tensors on the CPU)")
