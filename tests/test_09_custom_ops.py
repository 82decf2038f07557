"""Grader for lab 09: lessons 06-08's kernels registered as PyTorch operators. ops.cpp's TORCH_LIBRARY schemas
(lab09.1) and TORCH_LIBRARY_IMPL(CUDA) bindings (lab09.2), ops.py's fake implementations (lab09.3) and autograd
formulas (lab09.4), and block.py's decoder block on the course's ops (lab09.5).

The lab is an op library (no PYBIND11_MODULE): harness.build loads the shared library and hands back an
OpLibrary whose .ops is torch.ops.<namespace>, the namespace being the module name of the build (course_labs_lab09,
course_solutions_lab09, course_sub_..._lab09), and the graded tree's ops.py registers its fakes and autograd formulas
in that namespace (ops.register).

This file holds what the tools read (POINTS, SANITIZE_CASES, MUTANTS) and brings in the tests from tests/grader09/,
in this order (pytest collects them here, as tests/test_09_custom_ops.py::<test>):
  - registration.py, on every machine: the build; each schema against the lab's; a CUDA kernel and nothing else
    bound to each op; the dispatcher's own error for CPU tensors;
  - fake_tensors.py, on every machine: every fake implementation under FakeTensorMode; the autograd formulas traced
    on fake tensors (which ops each backward calls); the decoder block traced, explained and compiled on fake tensors;
  - opcheck.py, on a GPU: torch.library.opcheck of every op; the fakes against the real outputs;
  - references.py, on a GPU: the ops and their autograd formulas against float64 references (the tolerances);
  - streams.py, on a GPU: every op captured in a CUDA graph on a side stream; beside lessons 07 and 08's own modules;
    inputs on a second GPU;
  - decoder_block.py, on a GPU: the block against PyTorch's, compiled with fullgraph=True, and under CUDA graphs;
  - speed.py, perf (`./course bench 09`): the call overhead against a pybind11 call; the block, eager and compiled;
  - builds.py: the CMake library and the wheel (aot.py), the stable-ABI wheel (stable_abi.py), built early beside
    the other tests;
  - then the notebook's tests (harness.notebooks).
common.py holds what the parts share (the hints, the ops, the graded tree's Python); support.py the ops' contract,
the inputs, the float64 references and the block's golden; schemas.py the nine schemas every build is checked against.
"""
from __future__ import annotations

# isort: off
# The parts in collection order (star imports: each part's __all__, its tests and fixtures).
from grader09.common import LAB  # the lab's handle, here too: tests/conftest.py reads a test module's LAB
from grader09.registration import *  # noqa: F403
from grader09.fake_tensors import *  # noqa: F403
from grader09.opcheck import *  # noqa: F403
from grader09.references import *  # noqa: F403
from grader09.streams import *  # noqa: F403
from grader09.decoder_block import *  # noqa: F403
from grader09.speed import *  # noqa: F403
from grader09.builds import *  # noqa: F403
# isort: on

import harness
from harness import notebooks

# Points per task (of 100), by the work each is: nine schemas with their defaults and one mutation annotation; nine
# m.impl lines; nine fakes (shapes, dtypes, the layout a wrapper allocates); four autograd formulas with what they
# save, the lab's subtlest part; three one-line methods, graded through the whole block.
POINTS = {"lab09.1": 20, "lab09.2": 10, "lab09.3": 25, "lab09.4": 30, "lab09.5": 15}

# The few small cases `./course grade` runs under compute-sanitizer by default (the kernels themselves are lessons
# 06-08's, sanitized there): one binding of each lesson, forward and backward. (No CUDA graph: the sanitizer runs
# without PyTorch's caching allocator, which a capture needs.)
SANITIZE_CASES = [
    r"test_ops_match_references\[bias_gelu(_backward)?-7x3-float32-none\]",
    r"test_ops_match_references\[rms_norm(_backward)?-7x33-float32\]",
    r"test_ops_match_references\[flash_attention(_backward)?-b2-100x100-h4-kv2-d64-bfloat16-causal\]",
]


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_FLASH_SAVES_LSE = """\
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    def flash_attention_backward(ctx, grad_o, _grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
"""
_FLASH_RECOMPUTES_LSE = """\
        ctx.save_for_backward(q, k, v, o)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)

    def flash_attention_backward(ctx, grad_o, _grad_lse):
        q, k, v, o = ctx.saved_tensors
        _o, lse = ops.flash_attention(q, k, v, ctx.causal, ctx.scale)  # the forward again, for lse
"""
_VECTOR_LAUNCH = "<<<blocks_for(n / kElems), kThreadsPerBlock, 0, stream>>>(x, bias, y, n / kElems, cols / kElems);"
# The notebook: committed clean (any machine), and run top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)

MUTANTS = [
    # The fake's lse (batch, seqlen_q, heads_q) instead of (batch, heads_q, seqlen_q): torch.compile would plan every
    # later op with the wrong shape. Caught without a GPU (FakeTensorMode against the lab's shapes), and on a GPU by
    # opcheck's test_faketensor and test_fakes_match_real_ops.
    harness.Mutant("fake-lse-shape", "ops.py", "q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)",
                   "q.new_empty((batch, seqlen_q, heads_q), dtype=torch.float32)",
                   tests="test_fakes_on_cpu and flash_attention", expect="lse is", needs_gpu=False),
    # The fake's o from torch.empty_like(q) (issue 34, class c): for a q of (batch, heads, seq, dim) storage seen as
    # (batch, seq, heads, dim) it keeps q's strides, while the CUDA op returns a contiguous o: torch.compile would
    # plan the ops after it for the wrong layout. Caught without a GPU (the fake against the wrappers' contiguous
    # outputs), and on a GPU by opcheck's test_faketensor and test_fakes_match_real_ops.
    harness.Mutant("fake-o-keeps-q-layout", "ops.py", "return _contiguous_like(q), q.new_empty(",
                   "return torch.empty_like(q), q.new_empty(", tests="test_fakes_on_cpu and heads-first",
                   expect="o is", needs_gpu=False),
    # rms_norm_out's schema without its mutation annotations: functionalization, torch.compile and CUDA graphs would
    # take out and rstd for inputs it only reads. Caught without a GPU (the schema test), and on a GPU by opcheck's
    # test_schema ("mutated but not marked as mutable").
    harness.Mutant("out-schema-without-mutation-annotation", "ops.cpp",
                   "Tensor(a!) out, Tensor(b!) rstd) -> ()", "Tensor out, Tensor rstd) -> ()",
                   tests="(test_schemas or test_opcheck) and rms_norm_out", expect="Tensor(a!)", needs_gpu=False),
    # The backward registered without saving L (lse): it runs the forward again to get it. Right numbers, twice the
    # forward's cost: caught without a GPU by the dispatch recorder on fake tensors.
    harness.Mutant("backward-recomputes-lse", "ops.py", _FLASH_SAVES_LSE, _FLASH_RECOMPUTES_LSE,
                   tests="test_autograd_on_fake_tensors and flash_attention", expect="ran flash_attention again",
                   needs_gpu=False),
    # Lab 06's wrapper (compiled into this lab through depends.txt) without its device guard: the kernel goes to the
    # current device's stream with another GPU's pointers. Only two GPUs show it.
    harness.Mutant("no-device-guard", "../06-fused-elementwise/wrapper.cpp",
                   "  const c10::cuda::CUDAGuard device_guard(x.device());  // launch on x's GPU, whichever is "
                   "current\n", "", tests="test_inputs_on_another_gpu", expect="device guard", gpus=2),
    # Lab 06's vectorized forward (the block's bias + GELU) on the legacy default stream: not captured by a CUDA
    # graph, and unordered with the side stream's work before it.
    harness.Mutant("bias-gelu-on-legacy-stream", "../06-fused-elementwise/forward.cu", _VECTOR_LAUNCH,
                   _VECTOR_LAUNCH.replace(", 0, stream>>>", ">>>"),
                   tests="test_runs_on_current_stream or test_block_on_a_side_stream", expect="legacy default stream"),
    # The stable-ABI op's schema with the tanh form as its default: a caller that leaves `approximate` out gets the
    # other GELU. Only the stable-ABI wheel compiles bias_gelu_stable.cpp: caught because that wheel is built from
    # the graded tree (here the planted submission), without a GPU (the schema registered in this torch).
    harness.Mutant("stable-op-defaults-to-tanh", "stable/bias_gelu_stable.cpp",
                   'str approximate=\\"none\\") -> Tensor");', 'str approximate=\\"tanh\\") -> Tensor");',
                   tests="test_stable_registers_in_this_torch", expect='approximate="tanh"', needs_gpu=False),
    # CourseOps's attention not causal: every query sees the future.
    harness.Mutant("block-attention-not-causal", "block.py", "self.ops.flash_attention(q, k, v, True)[0]",
                   "self.ops.flash_attention(q, k, v)[0]", tests="test_block_matches_torch",
                   expect="flash-attention bound"),
]
