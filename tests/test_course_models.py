"""CPU models of reference kernels (tools/gpu/): lab 08's Hopper flash-attention backward, its shared-memory layouts,
descriptors and fragment maps replayed in float64, agrees with an attention backward, and each mutant of the replayed
kernel code is caught. No GPU."""
from __future__ import annotations

import importlib.util

from coursekit import trees


def test_lab08_hopper_backward_model(capsys):
    """tools/gpu/lab08_hopper_bwd_model.py: the Hopper backward's shared-memory layouts, descriptors and fragment maps
    replayed in float64 agree with an attention backward on tails, causal, GQA and both head dims, and each of its
    mutants (a slip in the replayed kernel code) is caught."""
    spec = importlib.util.spec_from_file_location("lab08_hopper_bwd_model",
                                                  trees.ROOT / "tools" / "gpu" / "lab08_hopper_bwd_model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert model.main() == 0, capsys.readouterr().out
