"""Lab 09's grader, in parts: tests/test_09_custom_ops.py (the entry pytest collects, with POINTS, SANITIZE_CASES and
MUTANTS) imports the tests of each part from here, in this order:

    registration.py    the build, the schemas, the CUDA kernels bound, CPU tensors refused (no GPU)
    fake_tensors.py    the fakes, the autograd formulas and the decoder block on fake tensors (no GPU)
    opcheck.py         torch.library.opcheck of every op; the fakes against the real ops (GPU)
    references.py      the ops and their gradients against float64 references (GPU)
    streams.py         CUDA graphs on a side stream, lessons 07-08's modules beside, a second GPU (GPU)
    decoder_block.py   the block against PyTorch's: eager, compiled, on a side stream (GPU)
    speed.py           the call overhead and the block's time (perf)
    builds.py          the ahead-of-time and stable-ABI builds' tests (from aot.py, stable_abi.py), started early

and what they share: common.py (hints, the ops, the graded tree's Python), support.py (the ops' contract, inputs,
float64 references, the block's golden), schemas.py (the nine schemas). No module here is named test_*.py: pytest
collects the tests once, in the entry module. Not named lab09/: that is the lab's compiled extension's name.
"""
