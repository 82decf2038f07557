"""The course's grading harness: the one module every `test_NN_slug.py` goes through.

Tests never build, locate or time a lab themselves; they ask `harness.lab("NN")`
for a handle and call its methods. Which tree is graded (labs, solutions or a
submission) comes from `./course grade --impl` through the COURSE_IMPL variable.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import traceback

import pytest
import torch

from coursekit import trees

from . import build as _build
from . import calls, check, inputs, perf
from .check import GradeFailure, poison_allocator, poisoned, random_tensor, tolerance
from .mutants import Mutant
from .todos import ALL, reference_check, tasks

HAS_GPU = torch.cuda.is_available()
NO_GPU_REASON = (
    "no CUDA GPU on this machine: the lab was built and imported, but its kernels can only run "
    "on a CUDA GPU (grade there, or on Colab)"
)
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
# The two runs of an input-check test (harness.inputs), as the parameter `real`: on fake CUDA tensors (any machine:
# the wrappers' checks read only metadata) and on real ones (a GPU; alignment too).
FAKE_AND_REAL = [pytest.param(False, id="fake"), pytest.param(True, id="cuda", marks=requires_gpu)]
# For checks of outputs replayed from a CUDA graph (LabHandle.capture_on_current_stream).
STREAM_HINT = ("a kernel launched on the legacy default stream (<<<blocks, threads>>> with no stream) instead of the "
               "current stream is not part of a CUDA graph, and outside graphs runs unordered with the PyTorch work "
               "around it: launch with <<<blocks, threads, shared_bytes, stream>>> "
               "where stream = course::current_stream()")
# Generic error lines of nvcc and g++ ("file(12): error: ..." or "file:12:3: error: ...").
_COMPILER_ERROR = re.compile(r"(error[: ]|Error [0-9]|undefined symbol)", re.IGNORECASE)


class LabHandle:
    """One lab in the tree under grading: its build, its checks, its timings."""

    def __init__(self, number: str):
        self.lab = trees.find_lab(number)
        self.tree = trees.resolve_tree()
        self._checked = None
        self._python: dict[str, object] = {}  # name -> module, or the GradeFailure its import raised

    @property
    def module(self):
        """The built lab, its functions checked on every call (harness.calls: inputs left unchanged,
        outputs on the inputs' device and contiguous). harness.build caches the module, or the
        build's failure, per process."""
        if self._checked is None:
            try:
                raw = _build.build(self.lab, self.tree)
            except _build.BuildInfrastructureError as error:  # the machine's failure: the test cannot say anything
                pytest.skip(str(error))
            except Exception as error:  # nvcc/g++/ninja failures arrive as RuntimeError with the log
                text = str(error)
                first = [line for line in text.splitlines() if _COMPILER_ERROR.search(line)][:8]
                detail = "\n    ".join(first) if first else text[-2000:]
                raise GradeFailure(
                    f"lab {self.lab.name} ({self.tree.path}) did not build:\n    {detail}\n"
                    f"  hint: run `./course build {self.lab.number} --impl {self.tree.path}` "
                    "for the full compiler output"
                ) from None
            self._checked = calls.CheckedModule(raw, self.lab.name)
        return self._checked

    def python(self, name: str):
        """The graded tree's `<lab dir>/<name>.py` (e.g. lab 06's autograd.py), imported as a fresh module
        under a name unique to the tree, once per handle. A file that does not import (a syntax error,
        an exception at import time) fails every test that asks for it, naming the file and line."""
        if name not in self._python:
            path = self.lab.dir_in(self.tree) / f"{name}.py"
            module_name = f"course_{self.tree.tag}_{self.lab.module_stem}_{name}"
            try:
                if not path.is_file():
                    raise GradeFailure(f"lab {self.lab.name} ({self.tree.path}) has no {name}.py: expected {path}")
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module  # dataclasses, pickling and tracebacks look modules up here
                try:
                    spec.loader.exec_module(module)
                except SyntaxError as error:
                    raise GradeFailure(f"{path}:{error.lineno}: {name}.py does not parse: {error.msg}\n"
                                       f"    {(error.text or '').strip()}") from None
                except Exception as error:
                    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
                    where = f"{path}:{frames[-1].lineno}" if frames else str(path)
                    raise GradeFailure(f"{where}: importing {name}.py raised {type(error).__name__}: {error}") from None
                self._python[name] = module
            except GradeFailure as failure:
                sys.modules.pop(module_name, None)
                self._python[name] = failure
        found = self._python[name]
        if isinstance(found, GradeFailure):
            raise GradeFailure(str(found))
        return found

    def assert_close(self, out, ref, *, case, tol, **kw) -> float:
        return check.assert_close(out, ref, case=case, tol=tol, **kw)

    def assert_raises_clearly(self, fn, *, must_mention, case) -> str:
        return check.assert_raises_clearly(fn, must_mention=must_mention, case=case)

    def capture_on_current_stream(self, run, *, inputs, case):
        """Capture `run()` (which launches the lab's ops on `inputs` and returns their outputs)
        in a CUDA graph on a side stream; then give the inputs fresh values, poison the outputs,
        replay, and return the outputs, for the test to compare with the new inputs' reference.

        Only work launched on the current stream is captured. A kernel launched elsewhere (the
        legacy default stream: `<<<blocks, threads>>>` with no stream) either breaks the capture
        or runs once, eagerly, outside the graph: then the replay does not recompute the outputs,
        and the NaN poison (or the old inputs' results) shows it.
        """
        hint = "  " + STREAM_HINT
        try:
            graph, outputs = perf.capture(run)  # one warm-up on a side stream, then the capture
        except perf.CaptureFailed as error:
            raise GradeFailure(
                f"{case}: launching it while PyTorch captured a CUDA graph on the current stream failed:\n"
                f"    {str(error).splitlines()[0][:300]}\n{hint}"
            ) from None
        torch.cuda.synchronize()
        for tensor in _tensors(inputs):
            tensor.copy_(random_tensor(tuple(tensor.shape), tensor.dtype))
        for tensor in _tensors(outputs):
            if tensor.dtype.is_floating_point:
                tensor.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return outputs

    def perf(self, **kw) -> perf.PerfCase:
        return perf.perf_case(lab=self.lab.name, is_reference=self.tree.is_reference, **kw)


# More than 2^31 elements: the size at which a 32-bit index wraps (class 4 of the grader's bugs).
PAST_INT32 = 2**31 + 33


def require_gpu_memory(gib: float) -> None:
    """Skip (with the reason) on a GPU without `gib` GiB free: the past-2^31 cases need 8-30 GiB."""
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2**30:
        pytest.skip(f"needs {gib:.0f} GiB of free GPU memory for a tensor of more than 2^31 elements; "
                    f"this GPU has {free / 2**30:.0f} GiB free")


def _tensors(value):
    """Every tensor in a tensor, or a (nested) tuple, list or dict of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def lab(number: str) -> LabHandle:
    return LabHandle(number)


__all__ = [
    "ALL", "FAKE_AND_REAL", "PAST_INT32", "GradeFailure", "HAS_GPU", "Mutant", "LabHandle", "lab", "poison_allocator",
    "poisoned", "random_tensor", "reference_check", "require_gpu_memory", "requires_gpu", "STREAM_HINT", "tasks",
    "tolerance", "trees", "perf", "check", "inputs",
]
