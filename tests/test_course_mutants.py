"""The grader must fail every known-wrong variant of every lab, with a useful message."""
from __future__ import annotations

import importlib

import pytest
import torch

from coursekit import trees
from harness import HAS_GPU, NO_GPU_REASON, mutants


def _mutants():
    for lab in trees.all_labs():
        if not lab.test_file.exists():
            continue
        module = importlib.import_module(lab.test_file.stem)
        for mutant in getattr(module, "MUTANTS", []):
            yield lab, mutant


def _cases():
    for lab, mutant in _mutants():
        marks = [pytest.mark.skipif(mutant.needs_gpu and not HAS_GPU, reason=NO_GPU_REASON),
                 pytest.mark.skipif(HAS_GPU and torch.cuda.device_count() < mutant.gpus,
                                    reason=f"needs {mutant.gpus} GPUs to show this bug; this machine has fewer")]
        yield pytest.param(lab, mutant, id=f"{lab.number}-{mutant.name}", marks=marks)


@pytest.mark.parametrize("lab, mutant", [pytest.param(lab, mutant, id=f"{lab.number}-{mutant.name}")
                                         for lab, mutant in _mutants()])
def test_mutant_text_occurs_once(lab, mutant):
    """What mutants.plant requires of each variant, checked on every machine: its `old` text occurs exactly once
    in its solution file, so an edit of a solution that moves or duplicates it shows without a GPU."""
    path = (lab.dir_in(trees.resolve_tree("solutions")) / mutant.file).resolve()
    count = path.read_text().count(mutant.old)
    assert count == 1, f"lab {lab.name}, variant {mutant.name!r}: its old text occurs {count} times in {mutant.file}"


@pytest.mark.parametrize("lab, mutant", list(_cases()))
def test_grader_fails_mutant(lab, mutant):
    failures = mutants.grade(lab, mutant)
    assert failures, f"lab {lab.name}: the grader passed the known-wrong variant {mutant.name!r} ({mutant.file})"
    messages = "\n".join(f["message"] for f in failures)
    assert mutant.expect.lower() in messages.lower(), (
        f"lab {lab.name}, variant {mutant.name!r}: the grader failed it, "
        f"but no message says {mutant.expect!r}:\n{messages[:2000]}"
    )
