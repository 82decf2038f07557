"""Every call of a lab's op is checked for what comparing its output cannot see.

Tests reach a lab's functions through `LAB.module`, which hands out this module's wrappers:
  - inputs are read-only: every CUDA tensor argument that is not an output parameter (named
    `out` or `dst`) must come back bitwise unchanged. An op that writes into its input (or
    past the end of a neighbouring output into it) passes a comparison of its own output;
    it fails here, with "wrote into its input";
  - outputs are placed where the caller expects: a tensor the op returns (other than an
    output argument handed back) is on the device of its inputs and contiguous.
Snapshots cost a copy of each input to the host per call, so timing turns the checks off (`unchecked`),
and so does a CUDA graph capture (a comparison synchronizes, which a capture forbids).
"""
from __future__ import annotations

import contextlib
import re

import torch

from .check import GradeFailure

# Parameters an op writes into; every other tensor argument is an input.
OUTPUT_PARAMS = frozenset({"out", "dst"})
# Inputs larger than this are not snapshotted (a copy of a multi-GiB tensor could exhaust memory).
MAX_SNAPSHOT_BYTES = 2 * 2**30
_enabled = [True]
# pybind11's signature line: "name(x: torch.Tensor, blocks: int = 0) -> torch.Tensor"
_SIGNATURE = re.compile(r"^\w+\((?P<params>.*)\)\s*->")
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@contextlib.contextmanager
def unchecked():
    """Call ops without the checks (timing, graph capture)."""
    previous = _enabled[0]
    _enabled[0] = False
    try:
        yield
    finally:
        _enabled[0] = previous


def parameter_names(fn) -> list[str]:
    """The parameter names pybind11 recorded for a bound function (empty when it recorded none)."""
    first = (getattr(fn, "__doc__", None) or "").strip().splitlines()[:1]
    match = _SIGNATURE.match(first[0]) if first else None
    if not match:
        return []
    names = []
    depth, current = 0, ""
    for char in match.group("params") + ",":
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            names.append(current.split(":")[0].strip().lstrip("*"))
            current = ""
        else:
            current += char
    return [name for name in names if name]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits, as a same-size integer view (NaN compares equal to the same NaN)."""
    return t.view(_SAME_SIZE_INT[t.element_size()]) if t.element_size() in _SAME_SIZE_INT else t


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of t's storage, as one contiguous uint8 tensor on t's device (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy of what an input holds: its elements' bits, or, for a strided view (a slice of a packed
    tensor, say), every byte of its storage. Copying a strided CUDA view to the host would first make a
    contiguous copy on the device, an allocation that, inside a harness.check.PoisonedPool, leaves
    unpoisoned memory where the op's outputs then land; the storage is contiguous, and a write anywhere
    in it (into the packed neighbour of the view, too) shows."""
    return bits(t).cpu() if t.is_contiguous() else _storage_bytes(t).cpu()


def _snapshot_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size() if t.is_contiguous() else t.untyped_storage().nbytes()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


class CheckedModule:
    """A lab's module whose callables check their inputs and outputs on every call."""

    def __init__(self, module, lab_name: str):
        self._module = module
        self._lab_name = lab_name

    def __getattr__(self, name: str):
        attr = getattr(self._module, name)
        if not callable(attr) or isinstance(attr, type):
            return attr
        names = parameter_names(attr)

        def checked(*args, **kwargs):
            # (CUDA not initialized: no capture can be under way, and asking would initialize it.)
            if not _enabled[0] or (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()):
                return attr(*args, **kwargs)
            named = list(zip(names, args)) if names else [(f"argument {i}", a) for i, a in enumerate(args)]
            named += list(kwargs.items())
            inputs = [(param, t) for param, value in named if param not in OUTPUT_PARAMS for t in _tensors(value)
                      if t.is_cuda and _snapshot_bytes(t) <= MAX_SNAPSHOT_BYTES]
            outputs = [t for param, value in named if param in OUTPUT_PARAMS for t in _tensors(value)]
            # Snapshots live in host memory: a GPU copy would take the block harness.poison_allocator just
            # filled with NaN for the op's output, and unwritten output elements would no longer show.
            snapshots = [(param, t, snapshot(t)) for param, t in inputs]
            result = attr(*args, **kwargs)
            for param, t, before in snapshots:
                after = snapshot(t)
                if not torch.equal(after, before):
                    changed = int((after != before).sum().item())
                    what = (f"{changed} of {t.numel()} elements" if t.is_contiguous() else
                            f"{changed} of the {before.numel()} bytes of the storage it is a view of")
                    raise GradeFailure(
                        f"{name}: wrote into its input `{param}` ({what} changed): an op "
                        "must leave its inputs as they were\n  hint: a store through the wrong pointer, or an output "
                        "index that runs past the output's end into the memory that follows")
            devices = {t.device for _, t in inputs}
            for t in _tensors(result):
                if any(t is o or (t.data_ptr() == o.data_ptr() and t.shape == o.shape) for o in outputs):
                    continue
                if t.is_cuda and devices and t.device not in devices:
                    where = ", ".join(map(str, sorted(devices, key=str)))
                    raise GradeFailure(f"{name}: returned an output on {t.device}, but its inputs are on {where}\n"
                                       "  hint: allocate outputs with the input's options (at::empty(sizes, "
                                       "x.options())) under a device guard")
                if t.numel() > 1 and not t.is_contiguous():
                    raise GradeFailure(f"{name}: returned a non-contiguous output (shape {list(t.shape)}, strides "
                                       f"{list(t.stride())}): the course's ops return row-major, gap-free tensors")
            return result

        checked.__name__ = name
        checked.__doc__ = attr.__doc__
        # Kept as an attribute, so __getattr__ (and the signature parsing) runs once per name.
        setattr(self, name, checked)
        return checked

    def __dir__(self):
        return dir(self._module)
