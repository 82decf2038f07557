"""The per-call checks every lab op gets through LAB.module (harness.calls)."""
from __future__ import annotations

import types

import pytest
import torch

from harness import HAS_GPU, NO_GPU_REASON, GradeFailure, calls


def test_parameter_names_from_pybind_signatures():
    def fn():
        pass

    fn.__doc__ = "copy_strided(dst: torch.Tensor, src: torch.Tensor, stride: int, blocks: int = 0) -> torch.Tensor\n"
    assert calls.parameter_names(fn) == ["dst", "src", "stride", "blocks"]
    fn.__doc__ = ("linear_act(x: torch.Tensor, weight: torch.Tensor, activation: str = 'gelu', "
                  "out: Optional[torch.Tensor] = None) -> torch.Tensor")
    assert calls.parameter_names(fn) == ["x", "weight", "activation", "out"]
    fn.__doc__ = "tiles() -> dict"
    assert calls.parameter_names(fn) == []
    fn.__doc__ = None
    assert calls.parameter_names(fn) == []


def _module(**functions):
    """A stand-in for a built lab: plain functions with pybind11-style signature docstrings."""
    module = types.SimpleNamespace()
    for name, (fn, signature) in functions.items():
        fn.__doc__ = signature
        setattr(module, name, fn)
    return calls.CheckedModule(module, "99-demo")


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_an_op_that_writes_into_its_input_fails():
    def in_place(alpha, x, y):
        y.add_(alpha * x)  # the right values, in y's memory: the classic in-place bug
        return y

    def fresh(alpha, x, y):
        return alpha * x + y

    def copy(dst, src):
        return dst.copy_(src)  # writing dst is the op's job

    module = _module(in_place=(in_place, "in_place(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor"),
                     fresh=(fresh, "fresh(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor"),
                     copy=(copy, "copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor"))
    x, y = torch.randn(33, device="cuda"), torch.randn(33, device="cuda")
    module.fresh(2.0, x, y)
    module.copy(torch.empty_like(x), x)
    with pytest.raises(GradeFailure, match="wrote into its input `y` \\(33 of 33 elements changed\\)"):
        module.in_place(2.0, x, y)
    with calls.unchecked():
        module.in_place(2.0, x, y)  # timing turns the checks off


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_a_non_contiguous_output_fails():
    def transposed(x):
        return x.t().contiguous().t()  # column-major storage

    module = _module(transposed=(transposed, "transposed(x: torch.Tensor) -> torch.Tensor"))
    with pytest.raises(GradeFailure, match="non-contiguous output"):
        module.transposed(torch.randn(4, 5, device="cuda"))


def test_a_strided_input_is_snapshotted_through_its_storage():
    """A strided view (a slice of a packed tensor) is snapshotted as its storage's bytes: no device copy of the view
    (which inside a PoisonedPool would leave unpoisoned memory for the outputs), and a write into the packed
    neighbour of the view shows too."""
    packed = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    view = packed[:, 1]  # strides (12, 1): not contiguous
    before = calls.snapshot(view).clone()  # (on the CPU, .cpu() is the tensor itself; CUDA inputs are copied)
    assert before.dtype == torch.uint8 and before.numel() == packed.numel() * 4
    packed[0, 2, 0] = -1.0  # outside the view, inside its storage
    assert not torch.equal(calls.snapshot(view), before)
    assert calls.snapshot(packed).dtype == torch.int32  # a contiguous tensor: its elements' bits


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_an_op_that_writes_next_to_a_strided_input_fails():
    def writes_neighbour(q):
        q.as_strided((1,), (1,), q.storage_offset() + q.shape[-1]).fill_(7.0)  # the element after q's first row
        return q.sum(-1)

    module = _module(writes_neighbour=(writes_neighbour, "writes_neighbour(q: torch.Tensor) -> torch.Tensor"))
    qkv = torch.zeros(4, 3, 8, device="cuda")
    with pytest.raises(GradeFailure, match="wrote into its input `q` .* bytes of the storage it is a view of"):
        module.writes_neighbour(qkv[:, 0])
