"""Grader for lab 07: softmax and RMSNorm over the last dimension, forward and backward, each with two ways
of reading a row (path="registers": read once into registers, a warp or a block per row; path="streaming":
any length, one block per row, read twice, softmax's first pass with the online (max, sum) recurrence), the
bitwise-deterministic grad_weight, the torch.autograd.Functions (autograd.py) that run them under
loss.backward(), and the same RMSNorm in Triton as a torch.library.triton_op (triton_rms_norm.py) that
torch.compile traces into. Softmax has a third path, given code (issue 13): path="on_chip", a row past the
register path read once and kept in a 1024-thread block's registers and shared memory (forward, float32 and
float64, sm_80 on) or in a cluster of 4 such blocks (backward, sm_90); 'auto' takes it where the GPU does
(LAB.module.on_chip_row) and streams past it. Its forward merges the threads' (max, sum) pairs with the
student's MergeMaxSum (lab07.2); its backward is given whole (reference checks when forced).

This module is the table of contents: the constants tools read from its source or import (POINTS, SANITIZE_CASES,
SANITIZE_EXCLUDE, MUTANTS), and the tests of its parts gathered into its namespace, so that pytest collects them
here, with the ids and in the order they had when this was one file. The parts, in tests/grader07/:
  common.py      what the parts share: dtypes, hints, the tolerances (derived in its docstring), the float64
                 references and the checks, the ops called with outputs from a poisoned pool, the inputs, the GPU
                 cases' shapes and paths and the tasks each grades
  builds.py      the build, the constants, CPU tensors refused (no GPU needed)
  autograd.py    autograd.py (lab07.7): on stand-in ops without a GPU; through the kernels, gradcheck, a small model
  triton_op.py   triton_rms_norm.py (lab07.8-9): registration and fake tensors without a GPU; against float64, eps,
                 determinism, stress, torch.compile without graph breaks
  softmax.py     softmax forward and backward (lab07.1-3), special values, the on-chip path's edges
  rms_norm.py    RMSNorm forward and backward (lab07.4-6), eps, the staged backward, deterministic grad_weight
  edge_cases.py  unaligned inputs, empty inputs, past 2^31 elements
  errors.py      bad input gets a clear error (every argument of every op), inputs on another GPU
  streams.py     every op on the current stream (one CUDA graph)
  perf.py        speed against a copy, F.rms_norm and torch.compile (marked perf)
The notebook's tests and the known-wrong variants (MUTANTS) are at the end of this module.
"""
from __future__ import annotations

import pytest

import harness
from harness import notebooks

# The parts' failed asserts explained as a test module's are (pytest rewrites the asserts of test_*.py files only).
pytest.register_assert_rewrite("grader07")

from grader07 import autograd, builds, edge_cases, errors, perf, rms_norm, softmax, streams, triton_op  # noqa: E402
from grader07.common import LAB  # noqa: E402

# ./course sanitize's full pass leaves out the four on-chip softmax backward cases at 16384 x 32: under racecheck each
# ran past 6 minutes unfinished (H100, 2026-11-26, 8 shards; 1027 x 33 took 91 s). Their kernel gives each row a
# cluster of its own (up to 2^31 / 4 rows), so 9 x 32 and 1027 x 33, which the pass keeps, run the same clusters;
# the grader itself runs these four.
SANITIZE_EXCLUDE = "test_softmax_backward and 16384x32 and on_chip"

# Points per task (of 100), by the work each is: the register softmax is two all-reduces and the exps; the online
# pass is the lesson's new idea (the recurrence and the merge of pairs, with -inf handled); the softmax backward one
# dot a row; the RMSNorm forward both paths of a short formula; its backward the lab's largest kernel (grad_x and
# the per-block grad_weight partials through shared memory); the finalize a fixed-order column sum; the
# autograd.Functions a dozen lines each; the Triton op three kernels in a new language.
POINTS = {"lab07.1": 15, "lab07.2": 15, "lab07.3": 10, "lab07.4": 15, "lab07.5": 15, "lab07.6": 5, "lab07.7": 10,
          "lab07.8": 7, "lab07.9": 8}

# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck, synccheck) by
# default: regular expressions over test names (conftest marks them `sanitize`). Per kernel and path: a warp per row
# on a partial row (7x7: one warp's 8 rows, 7 used; scalar loads), a block per row (3x2047), the streaming kernels
# on a short row and on one past a 4096-pack batch (33x4097: 2 batches, the second of one pack); the RMSNorm
# backward at 1027 rows (343 blocks of partials of 3 rows each, the warps' sums through shared memory) and the
# finalize; the on-chip forward on a short row and on a full one (its shared half and cp.async). (The on-chip
# backward's clusters run under the full `./course sanitize 07` pass only.)
SANITIZE_CASES = [
    r"test_softmax\[7x7-float32-(registers|streaming|on_chip)\]",
    r"test_softmax\[2x65536-float32-on_chip\]",
    r"test_softmax\[3x2047-bfloat16-registers\]",
    r"test_softmax\[33x4097-float32-streaming\]",
    r"test_softmax_backward\[(7x7|3x2047)-float32-(registers|streaming)\]",
    r"test_rms_norm\[(7x7|3x2047)-float32-(registers|streaming)\]",
    r"test_rms_norm\[9x32-bfloat16-registers\]",
    r"test_rms_norm_backward\[(7x7|1027x33|3x2047)-float32-(registers|streaming)\]",
    r"test_rms_norm_backward\[9x32-bfloat16-registers\]",
]


# ---------------------------------------------------------------- the tests of the parts
def _tests_of(part, names=None) -> dict:
    """A part's tests by name: those its __all__ lists, or the given names of them. Every test_ function of a part
    must be in its __all__: one left out would never be collected, so it stops the import instead."""
    unlisted = sorted(name for name in vars(part) if name.startswith("test_") and name not in part.__all__)
    if unlisted:
        raise ImportError(f"{part.__name__}: {unlisted} not in its __all__, so pytest would never collect them")
    return {name: getattr(part, name) for name in (part.__all__ if names is None else names)}


# pytest collects this module's functions in the order they enter its namespace: the grader's sections, what runs
# without a GPU first (the build; autograd.py on stand-in ops; the Triton op on fake tensors), then the kernels on the
# GPU part by part. The tests autograd and triton_op gathered early keep their places when their parts come again.
globals().update(_tests_of(builds))
globals().update(_tests_of(autograd, autograd.WITHOUT_GPU))
globals().update(_tests_of(triton_op, triton_op.WITHOUT_GPU))
globals().update(_tests_of(softmax))
globals().update(_tests_of(rms_norm))
globals().update(_tests_of(edge_cases))
globals().update(_tests_of(autograd))
globals().update(_tests_of(triton_op))
globals().update(_tests_of(errors))
globals().update(_tests_of(streams))
globals().update(_tests_of(perf))


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_STREAM_ROW_OFFSETS = "    const T* x_row = x + row * n;\n    T* y_row = y + row * n;\n    MaxSum<C> stats"
_BACKWARD_CHECKS_X = ('  constexpr const char* op = "rms_norm_backward";\n'
                      '  const RowPath row_path = parse_path(path, op, false);\n  check_x(x, op, "x");\n')
MUTANTS = [
    # exp(x) / sum(exp(x)) without the max: the same numbers for small x, inf / inf = NaN once exp overflows (1e4).
    harness.Mutant("no-max-subtraction", "softmax.cu", "slice.v[j][e] = exp_of(slice.v[j][e] - row_max);",
                   "slice.v[j][e] = exp_of(slice.v[j][e]);",
                   tests="test_softmax_special_values and large and registers", expect="elements wrong"),
    # The online recurrence without its rescale: s' = s + exp(v - m'), the old terms left relative to the old max.
    # Ascending rows raise every thread's max at every element.
    harness.Mutant("online-rescale-missing", "softmax.cu",
                   "stats.s = stats.s * shifted_exp(stats.m, m_new) + shifted_exp(v, m_new);",
                   "stats.s = stats.s + shifted_exp(v, m_new);",
                   tests="test_softmax_special_values and ascending and streaming", expect="elements wrong"),
    # 1 / (sqrt(ms) + eps): within 1e-6 of the right rstd for rows of N(0, 1), 40% off where eps matters.
    harness.Mutant("eps-outside-the-sqrt", "rms_norm.cu", "return rsqrt_of(sum_sq / C(n) + eps);",
                   "return C(1) / (sqrt(sum_sq / C(n)) + eps);", tests="test_rms_norm_eps and tiny", expect="rstd"),
    # The mean over the slots the row's threads hold (a warp's 32 x 32 = 1024 for n = 1000), not over n.
    harness.Mutant("rstd-mean-over-the-slots", "rms_norm.cu", "const C r = inverse_rms(sum_sq, n, eps);",
                   "const C r = inverse_rms(sum_sq, int64_t{kRowThreads} * kElemsPerThread, eps);",
                   tests="test_rms_norm and registers and 5x1000", expect="rstd"),
    # 16-bit accumulation (issue 11, class 5): each thread's sum of squares rounded to the storage type at every add.
    harness.Mutant("sum-of-squares-in-16-bits", "rms_norm.cu",
                   "for (int e = 0; e < kElems; ++e) sum_sq += slice.v[j][e] * slice.v[j][e];",
                   "for (int e = 0; e < kElems; ++e) sum_sq = to_compute(from_compute<T>(sum_sq + slice.v[j][e] * "
                   "slice.v[j][e]));", tests="test_rms_norm and bfloat16 and registers and 7x7", expect="rstd"),
    # The same in softmax's sum of exps: inside bfloat16's per-element tolerance, outside the flash-attention bound.
    harness.Mutant("sum-of-exps-in-16-bits", "softmax.cu", "        sum += slice.v[j][e];\n",
                   "        sum = to_compute(from_compute<T>(sum + slice.v[j][e]));\n",
                   tests="test_softmax and registers and bfloat16 and (1027x33 or 16384x32 or 3x2047)",
                   expect="flash-attention bound"),
    harness.Mutant("grad-weight-from-one-block", "rms_norm.cu",
                   "for (int64_t k = row_lane; k < chunks; k += kRowLanes)",
                   "for (int64_t k = row_lane; k < 1; k += kRowLanes)",
                   tests="test_rms_norm_backward and 1027x33 and float32", expect="grad_weight"),
    # The streaming walk's last, partial batch dropped: rows of 2^17 + 3 scalar packs lose their last 3 elements in
    # both passes (never written: NaN).
    harness.Mutant("streaming-drops-its-last-batch", "row_reduce.cuh",
                   "const int64_t batches = course::ceil_div<int64_t>(packs, kBatch);",
                   "const int64_t batches = packs / kBatch;", tests="test_softmax and streaming and 3x131075",
                   expect="elements wrong"),
    # Out-of-bounds write (issue 11, class 1): the register path stores one slot past the row; the last row's lands
    # in the allocator's slack after y, where no comparison of y sees it; the poisoned pool's guard does.
    harness.Mutant("register-store-bound-off-by-one", "row_reduce.cuh",
                   "      if (col >= n) continue;\n      P pack;", "      if (col > n) continue;\n      P pack;",
                   tests="test_softmax and registers and 7x7", expect="wrote past the end of y"),
    # Shared memory (issue 11, class 2): the block all-reduce without the barrier between the warps' stores and the
    # reads that combine them: a fast warp reads slots the others have not written yet. (Its second barrier, before
    # the next call reuses the slots, guards a race no comparison here shows reliably, as the rows between two
    # calls take thousands of cycles; racecheck, in `./course grade`'s quick sanitizer pass on SANITIZE_CASES, is
    # what finds that one.)
    harness.Mutant("block-reduce-missing-syncthreads", "row_reduce.cuh",
                   "  __syncthreads();  // every warp's result is in shared memory before any warp reads them\n", "",
                   tests="test_softmax and not special and not backward and (3x2047 or 7x4096 or 33x4097 or 2x65536)",
                   expect="elements wrong"),
    # The RMSNorm backward's group sums read by group 0 without the barrier after the other groups' stores: with
    # 3 or 32 rows a block, some groups are still on their last row when group 0 reads their slots (stale sums of
    # the block that ran there before).
    harness.Mutant("grad-weight-sums-missing-syncthreads", "rms_norm.cu",
                   "  __syncthreads();  // every group's sums are in shared memory before group 0 reads them\n", "",
                   tests="test_rms_norm_backward and registers and (1027x33 or 16384x32)", expect="grad_weight"),
    # The staged backward without its last step when a block's rows are not a multiple of kStagedRows: 1000 rows over
    # 132 blocks leave 7 or 8 a block, and each block's last 3 rows go unwritten (NaN from the poisoned pool). Its
    # cases run the staged kernel where the GPU holds its ring (sm_80, sm_90); elsewhere this mutant reads as not
    # caught.
    harness.Mutant("staged-drops-its-last-step", "rms_norm.cu",
                   "const int64_t steps = course::ceil_div<int64_t>(count, kStagedRows);",
                   "const int64_t steps = count / kStagedRows;",
                   tests="test_rms_norm_backward_staged and 1000x4096", expect="grad_x"),
    # Stream misuse (issue 11, class 3): the backward's second kernel on the legacy default stream.
    harness.Mutant("finalize-on-legacy-stream", "rms_norm.cu",
                   "course::launch_after_prior_grid(grad_weight_finalize_kernel<T>, dim3(finalize_blocks), "
                   "dim3(kThreadsPerBlock), 0,\n                                  stream, partials,",
                   "grad_weight_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock>>>(partials,",
                   tests="test_runs_on_current_stream", expect="legacy default stream"),
    # 32-bit index (issue 11, class 4): the streaming softmax's row offset kept in an int wraps at row 65536 of
    # 32768 (2^31): the last row is read and written 4 GiB before x and y.
    harness.Mutant("int32-row-offset", "softmax.cu", _STREAM_ROW_OFFSETS,
                   _STREAM_ROW_OFFSETS.replace("    const T* x_row = x + row * n;\n    T* y_row = y + row * n;\n",
                                               "    const int offset = row * n;  // 32 bits\n    const T* x_row = x + "
                                               "offset;\n    T* y_row = y + offset;\n"),
                   tests="test_softmax_past_2_31_elements and streaming", expect="int64_t"),
    # The on-chip forward (given code) without each thread's rescale: y = exp(x - m_t) / S, every thread's values
    # relative to its own max m_t instead of the row's M; right only in the threads that hold the row's max.
    harness.Mutant("on-chip-thread-max-not-rescaled", "softmax.cu",
                   "const C scale = shifted_exp(m, total.m) / total.s;", "const C scale = C(1) / total.s;",
                   tests="test_softmax and not backward and on_chip and 2x65536", expect="elements wrong"),
    # The on-chip backward's cluster merge reading its own block's part of the dot only (the other blocks' parts
    # never read through distributed shared memory): each quarter of a 65536-long row uses a quarter's dot. Its
    # tests need clusters (sm_90: H100, H200); on an older GPU they skip, and this mutant reads as not caught.
    harness.Mutant("cluster-dot-from-own-block-only", "softmax.cu",
                   "row_dot += *cluster.map_shared_rank(&partial_dot, r);",
                   "row_dot += r == rank ? partial_dot : C(0);",
                   tests="test_softmax_backward and on_chip and 2x65536 and float32", expect="elements wrong"),
    # Triton (lab07.8, lab07.9): eps dropped from the root (zero rows: rstd = inf), and grad_weight from one program.
    harness.Mutant("triton-eps-dropped", "triton_rms_norm.py",
                   "part of the row.\n        rstd = tl.rsqrt(sum_sq / N + eps)",  # the register path's (lab07.8)
                   "part of the row.\n        rstd = tl.rsqrt(sum_sq / N)", tests="test_triton_rms_norm_eps",
                   expect="rstd"),
    # The chunked backward without its barrier (issue 34, class d): threads of a program load each row's dot before
    # the one thread that stores it has (a stale value: NaN from the poisoned pool). A race: the stress test runs
    # each case 16 times, one row a program, 512 programs.
    harness.Mutant("triton-barrier-dropped", "triton_rms_norm.py", "        tl.debug_barrier()\n", "",
                   tests="test_triton_stress", expect="grad_x"),
    harness.Mutant("triton-grad-weight-from-one-program", "triton_rms_norm.py", "for p in range(0, programs):",
                   "for p in range(0, 1):", tests="test_triton_rms_norm and 1027x64", expect="grad_weight"),
    # autograd.py (lab07.7), caught without a GPU: a transposed grad_y passed on as it is; eps not passed on.
    harness.Mutant("grad-y-not-made-contiguous", "autograd.py",
                   "ctx.ops.rms_norm_backward(grad_y.contiguous(), x, weight, rstd)",
                   "ctx.ops.rms_norm_backward(grad_y, x, weight, rstd)", tests="test_autograd_on_cpu and rms_norm",
                   expect="contiguous", needs_gpu=False),
    harness.Mutant("eps-not-passed", "autograd.py", "        y, rstd = ops.rms_norm(x, weight, eps)\n",
                   "        y, rstd = ops.rms_norm(x, weight)\n", tests="test_autograd_on_cpu and rms_norm",
                   expect="elements wrong", needs_gpu=False),
    # An input check kept for one argument, dropped for another (issue 34, class a), caught on fake tensors without
    # a GPU: the backward's x never checked (grad_y's checks against it leave a strided or CPU x through), and the
    # Triton op's weight never checked for contiguity (a strided weight read flat).
    harness.Mutant("backward-x-unchecked", "wrapper.cpp", _BACKWARD_CHECKS_X, _BACKWARD_CHECKS_X.replace(
                   '  check_x(x, op, "x");\n', ""), tests="test_each_argument_checked and rms_norm_backward and fake",
                   expect="rms_norm_backward(x on the CPU", needs_gpu=False),
    harness.Mutant("triton-weight-contiguity-unchecked", "triton_rms_norm.py",
                   '    _check_contiguous(op, "weight", weight)\n', "",
                   tests="test_triton_each_argument_checked and fake", expect="weight a non-contiguous view",
                   needs_gpu=False),
]
