"""Grader for lab 08: attention, forward and backward, as a ladder of four rungs: attention_naive (rung 1: the scores
written to HBM, any head_dim, float32/float16/bfloat16), flash_forward_fp32 (rung 2: tiles on CUDA cores, float32),
flash_forward (rung 3: tensor cores, float16/bfloat16, FlashAttention-2's work split) and flash_backward (rung 4),
plus autograd.py's torch.autograd.Function over rungs 3 and 4, and the CPU model flash_model.py (the page's
model_online and model_blocks) that the grader checks on every machine and uses as its float64 reference.

Conventions (attention.h): q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim),
any strides but a contiguous last dimension; o contiguous like q, lse (batch, heads_q, seqlen_q) float32, natural
log; query head h reads key/value head h // (heads_q / heads_kv); causal aligned bottom-right (query i sees keys
j <= i + seqlen_k - seqlen_q); a row that sees no key has o = 0 and lse = -inf, and no NaN anywhere.

The tests live in tests/grader08/, one module per part, imported below in their collection order (the node ids
stay tests/test_08_flash_attention.py::test_...). This module keeps what tools read from it: LAB, POINTS,
SANITIZE_CASES, SANITIZE_EXCLUDE and MUTANTS, and the notebook's tests.
  common.py         shared: dtypes, hints, the checks against the float64 golden (its docstring derives the
                    tolerances), the ops called with poisoned output pools, the Hopper path's selection
                    (COURSE_FLASH_FORWARD_PATH, COURSE_FLASH_BACKWARD_PATH), the GPU cases' shapes and runners
  builds.py         the build, constants(), CPU tensors refused, each argument checked (no GPU needed)
  model.py          the CPU model flash_model.py: forward, backward, the blocks visited and masked
  autograd_cpu.py   autograd.py (lab08.9) over stand-in ops on the CPU
  hopper.py         hopper_plan.py (lab08.10, lab08.11): the shared-memory plan, the ring's parities simulated
  rungs.py          GPU: rungs 1 to 4 at every shape (naive, float32, tensor-core forward, backward)
  heads.py          GPU: batch and heads, GQA
  strides_scale.py  GPU: strided views, the softmax scale, scores of ~1e4
  empty.py          GPU: empty sizes
  determinism.py    GPU: the backward's determinism, atomic and deterministic=True
  stream.py         GPU: every op on the current stream
  past_2_31.py      GPU: past 2^31 elements
  memory.py         GPU: no hidden copy, peak memory O(seqlen)
  errors.py         GPU: bad input gets a clear error
  autograd_gpu.py   GPU: through autograd.flash_attention over the built ops
  perf.py           GPU: speed against SDPA's backends
"""
from __future__ import annotations

import pytest

import harness
from harness import notebooks

pytest.register_assert_rewrite("grader08")  # the parts' asserts explained as a test module's are

from grader08.common import LAB  # noqa: E402

# Points per task (of 100), by the work each is: the naive softmax is lesson 07's; the float32 online update the
# lesson's idea in its plainest form; the tensor-core S = Q K^T a fragment walk (lesson 05); the online softmax in
# registers with P fed back as A fragments the lab's hardest step; the causal skipping and masks a short but subtle
# piece; D a dot per row; the backward's P recompute, dS, dV and dK the largest task; dQ's atomics and conversion;
# the autograd.Function a dozen lines; the Hopper path's shared-memory plan and its ring's parities (hopper_plan.py)
# a few lines of arithmetic each (their 6 points came from lab08.2 and lab08.7).
POINTS = {"lab08.1": 8, "lab08.2": 9, "lab08.3": 12, "lab08.4": 15, "lab08.5": 10, "lab08.6": 5, "lab08.7": 15,
          "lab08.8": 10, "lab08.9": 10, "lab08.10": 3, "lab08.11": 3}

# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck, synccheck) by
# default: per kernel a tail case (seqlen_k not a multiple of any key block: 203, 217), a causal one with rows that
# see no key (203 x 113), and GQA (8 query heads on 2 key/value heads).
SANITIZE_CASES = [
    r"test_naive\[113x203-float32-d33-causal\]",
    r"test_naive\[203x113-bfloat16-d64-causal\]",
    r"test_naive_heads\[113x203-b1-h8-kv2-float32-d33-causal\]",
    r"test_flash_fp32\[(113x203|203x113)-float32-d64-causal\]",
    r"test_flash_fp32_heads\[113x203-b1-h8-kv2-float32-d64-causal\]",
    r"test_flash_forward\[(113x203|203x113)-bfloat16-d64-causal\]",
    r"test_flash_forward\[128x217-float16-d128-noncausal\]",
    r"test_flash_forward_heads\[113x203-b1-h8-kv2-bfloat16-d64-causal\]",
    r"test_flash_backward\[(113x203|203x113)-bfloat16-d64-causal\]",
    r"test_flash_backward_heads\[113x203-b1-h8-kv2-bfloat16-d64-causal\]",
    r"test_flash_backward_deterministic_mode\[113x203-b2-h3-kv3-bfloat16-d64-causal\]",
]

# Left out of `./course sanitize 08` (the full pass): the large cases repeat the small ones' code paths (tails, causal
# diagonal, GQA, strides are all in 113x203, 203x113, 128x217 and 1x1, and batch x heads in b1-h8-kv2, b2-h4-kv1) at
# sizes that cost minutes under the tools. On an H200 (2026-11-26) memcheck over every case ran past 7 minutes, and
# the four tools at once without the three large sizes ran past 8. The model tests (test_model_*) run flash_model.py
# in float64 on the CPU: no kernel of the lab, nothing for the tools to see. Two more are left out for what they
# measure, not a code path: test_no_hidden_copy reads the caching allocator's peak, which the tools turn off (it fails
# under them whatever the kernel does), at 4 x 4096 x 8 heads, where the naive rung alone holds 2 GiB of scores; and
# test_flash_backward_deterministic repeats test_flash_backward's atomic kernel ten times at 1023 x 1024 to compare
# the runs' bits. The pair under racecheck ran past 140 s and 170 s without a line of output (H100, 2026-11-27).
SANITIZE_EXCLUDE = ("1023x1024 or 2048x2048 or 4224x4224 or b16 or b128 or test_model or test_no_hidden_copy or "
                    "(test_flash_backward_deterministic and not deterministic_mode)")


# ---------------------------------------------------------------- the tests, in collection order
# The order of these imports is the order pytest collects the tests in: keep it (isort leaves it).
# isort: off
from grader08.builds import *  # noqa: E402, F403
from grader08.model import *  # noqa: E402, F403
from grader08.autograd_cpu import *  # noqa: E402, F403
from grader08.hopper import *  # noqa: E402, F403
from grader08.rungs import *  # noqa: E402, F403
from grader08.heads import *  # noqa: E402, F403
from grader08.strides_scale import *  # noqa: E402, F403
from grader08.empty import *  # noqa: E402, F403
from grader08.determinism import *  # noqa: E402, F403
from grader08.stream import *  # noqa: E402, F403
from grader08.past_2_31 import *  # noqa: E402, F403
from grader08.memory import *  # noqa: E402, F403
from grader08.errors import *  # noqa: E402, F403
from grader08.autograd_gpu import *  # noqa: E402, F403
from grader08.perf import *  # noqa: E402, F403
# isort: on


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU. Until the lesson's
# notebook is written, both tests skip, saying so.
_notebook_is_clean, _notebook_runs = notebooks.tests_for(LAB)
_NO_NOTEBOOK = pytest.mark.skipif(
    not notebooks.notebook_path(LAB.lab, LAB.tree).exists(),
    reason=f"lab 08 has no notebook yet ({notebooks.notebook_path(LAB.lab, LAB.tree).name} is not in "
           f"{LAB.lab.dir_in(LAB.tree)}): the notebook tests run once it is written")
test_notebook_is_clean = _NO_NOTEBOOK(_notebook_is_clean)
test_notebook_runs = _NO_NOTEBOOK(_notebook_runs)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_FORWARD_END = "    const int64_t end = causal ? causal_key_end(row, seqlen_q, seqlen_k) : seqlen_k;\n"
MUTANTS = [
    # The online recurrence without the rescale of O when the row's max grows: O keeps terms relative to an old max.
    # Random scores raise some row's max in most key blocks; 113 x 203 has 2 key blocks at d 64, 1023 x 1024 16.
    harness.Mutant("forward-o-rescale-missing", "flash_forward.cu",
                   "        o_acc[n][2 * half] *= alpha;\n        o_acc[n][2 * half + 1] *= alpha;\n", "",
                   tests="test_flash_forward and not heads and not strided and (113x203 or 1023x1024)",
                   expect="elements wrong"),
    # The same in the float32 rung (lab08.2).
    harness.Mutant("fp32-o-rescale-missing", "flash_fp32.cu",
                   "        for (int e = 0; e < kDimsPerThread; ++e) o_acc[i][e] *= alpha;\n", "",
                   tests="test_flash_fp32 and not heads and not strided and (113x203 or 1023x1024)",
                   expect="elements wrong"),
    # L not updated with the row's sum: lse = scale m, log(l) dropped. o stays right: only the lse check sees it.
    harness.Mutant("forward-lse-without-log-l", "flash_forward.cu", "? m[half] * p.scale + logf(row_l) : -INFINITY;",
                   "? m[half] * p.scale : -INFINITY;",
                   tests="test_flash_forward and not heads and not strided and 128x217", expect="lse"),
    # Causal mask off by one: each row also sees the key just past its causal_key_end. Rows with few visible keys
    # (the first rows of 1023 x 1024, the first visible rows of 203 x 113) change by far.
    harness.Mutant("forward-causal-off-by-one", "flash_forward.cu", _FORWARD_END,
                   _FORWARD_END.replace("causal_key_end(row, seqlen_q, seqlen_k)",
                                        "causal_key_end(row, seqlen_q, seqlen_k) + 1"),
                   tests="test_flash_forward and causal and not noncausal and not heads and not strided and "
                         "(1023x1024 or 113x203)",
                   expect="elements wrong"),
    # Tail keys not masked: without causal the mask ends a block past seqlen_k, so the tail block's rows past
    # seqlen_k (zero-filled K and V: scores 0, counted in l) take part. 113 x 203 and 128 x 217 have key tails.
    harness.Mutant("forward-tail-keys-not-masked", "flash_forward.cu", _FORWARD_END,
                   _FORWARD_END.replace(": seqlen_k;", ": seqlen_k + kKeyTiles * kMmaN;"),
                   tests="test_flash_forward and noncausal and not heads and not strided and (113x203 or 128x217)",
                   expect="elements wrong"),
    # Race (issue 11, class 2): a tile read before its cp.async copies landed, here Q_i, read into fragments right
    # after it is issued (the prologue's wait lets Q's own group stay in flight): the ldmatrix reads whatever the
    # last block on the SM left in shared memory. The same off-by-one at K_j's wait (wait_copies<2> at the loop
    # top) was tried first and passed every case on an H200 (NOTES.md@8a81008): K_0 is issued just
    # after Q_i and lands while Q's wait and fragment loads run, and each later K_j had a whole block's work to land.
    harness.Mutant("forward-q-read-before-it-landed", "flash_forward.cu",
                   "  wait_copies<2>();\n  __syncthreads();\n  uint32_t q_fragments",
                   "  wait_copies<3>();\n  __syncthreads();\n  uint32_t q_fragments",
                   tests="test_flash_forward and not heads and not strided and (1023x1024 or 2048x2048)",
                   expect="elements wrong"),
    # The -inf guard removed: a row that sees no key (203 x 113 causal: rows 0 .. 89) gets exp2(-inf - (-inf)) =
    # NaN in its P and alpha, so o = NaN instead of 0.
    harness.Mutant("forward-inf-guard-removed", "flash_forward.cu",
                   "offset[half] = row_max == -INFINITY ? 0.0f : row_max * scale_log2;",
                   "offset[half] = row_max * scale_log2;",
                   tests="test_flash_forward and 203x113 and not noncausal and not heads", expect="see no key"),
    harness.Mutant("naive-inf-guard-removed", "naive.cu", "  return x == -INFINITY ? 0.0f : expf(x - m);\n",
                   "  return expf(x - m);\n",
                   tests="test_naive and 203x113 and not noncausal and not heads", expect="see no key"),
    # exp(s - m) computed as exp(s) * exp(-m) (issue 34, class b), in each forward rung: the same numbers for scores
    # of a few units (and for test_scale's ~30), inf * 0 = NaN once they reach ~1e4.
    harness.Mutant("naive-exp-unshifted", "naive.cu", "  return x == -INFINITY ? 0.0f : expf(x - m);\n",
                   "  return x == -INFINITY ? 0.0f : expf(x) * expf(-m);\n",
                   tests="test_large_scores and attention_naive", expect="elements wrong"),
    harness.Mutant("fp32-exp-unshifted", "flash_fp32.cu", "exp2f(fmaf(s[i][t], scale_log2, -offset));",
                   "exp2f(s[i][t] * scale_log2) * exp2f(-offset);", tests="test_large_scores and fp32",
                   expect="elements wrong"),
    harness.Mutant("forward-exp-unshifted", "flash_forward.cu",
                   "exp2_approx(fmaf(s[n][r], scale_log2, -offset[r / 2]));",
                   "exp2_approx(s[n][r] * scale_log2) * exp2_approx(-offset[r / 2]);",
                   tests="test_large_scores and flash_forward and not fp32", expect="elements wrong"),
    # Wrong GQA head map: query head h reads key/value head h % heads_kv instead of h / (heads_q / heads_kv). The
    # same for MHA and for one key/value head; 8 query heads on 2 differ at every odd head.
    harness.Mutant("forward-gqa-head-map", "flash_forward.cu",
                   "const int64_t kv_head = head / (p.heads_q / p.heads_kv);",
                   "const int64_t kv_head = head % p.heads_kv;",
                   tests="test_flash_forward_heads and kv2", expect="elements wrong"),
    # dV missing a term: half of the d tiles of dV += P^T dO never accumulate (zero columns of grad_v).
    harness.Mutant("backward-dv-missing-term", "flash_backward.cu",
                   "          mma_16816<T>(dv[n + 1], p_a[kk], do1);\n", "",
                   tests="test_flash_backward and not heads and not strided and (113x203 or 128x217)",
                   expect="grad_v"),
    # Out of bounds (issue 11, class 1): the epilogue's row guard lets row seqlen_q through, the zero Q row of the
    # last query block: o's next row (another head's) is written, and for the last batch that is past o's end,
    # in the allocator slack the poisoned pool checks.
    harness.Mutant("forward-row-guard-off-by-one", "flash_forward.cu", "    if (row >= seqlen_q) continue;\n",
                   "    if (row > seqlen_q) continue;\n",
                   tests="test_flash_forward and 113x203 and not heads and not strided",
                   expect="wrote past the end of o"),
    # Stream misuse (issue 11, class 3): the backward's grad_q conversion on the legacy default stream.
    harness.Mutant("backward-convert-on-legacy-stream", "flash_backward.cu",
                   "convert_grad_q_kernel<T><<<static_cast<unsigned>(convert_blocks), kConvertThreads, 0, stream>>>(",
                   "convert_grad_q_kernel<T><<<static_cast<unsigned>(convert_blocks), kConvertThreads>>>(",
                   tests="test_runs_on_current_stream and flash_backward", expect="legacy default stream"),
    # 32-bit index (issue 11, class 4): o's row offset kept in an int: past 2^31 elements it wraps (batch 16384
    # of (16385, 128, 8, 128) starts at element 2^31), and the last batch is written elsewhere or faults.
    harness.Mutant("forward-int32-output-offset", "flash_forward.cu",
                   "T* const o_row = o + ((batch * seqlen_q + row) * p.heads_q + head) * kHeadDim + lane_col;",
                   "T* const o_row = o + static_cast<int>(((batch * seqlen_q + row) * p.heads_q + head) * kHeadDim) "
                   "+ lane_col;", tests="test_flash_forward_past_2_31_elements and noncausal", expect="int64_t"),
    # autograd.py (lab08.9), caught without a GPU: a transposed grad_o passed on as it is; the scale dropped.
    harness.Mutant("autograd-grad-o-not-contiguous", "autograd.py",
                   "ctx.ops.flash_backward(grad_o.contiguous(), q, k, v, o, lse, ctx.causal, ctx.scale)",
                   "ctx.ops.flash_backward(grad_o, q, k, v, o, lse, ctx.causal, ctx.scale)",
                   tests="test_autograd_on_cpu", expect="contiguous", needs_gpu=False),
    harness.Mutant("autograd-scale-dropped", "autograd.py",
                   "        o, lse = ops.flash_forward(q, k, v, causal, scale)\n",
                   "        o, lse = ops.flash_forward(q, k, v, causal)\n", tests="test_autograd_on_cpu",
                   expect="elements wrong", needs_gpu=False),
    # hopper_plan.py (lab08.10, lab08.11), caught without a GPU: the base's alignment slack left out of the total
    # (the kernel would ask for 1024 bytes too few and its last barrier would sit past the allocation); the producer
    # waiting on the empty barrier with its own lap's parity (a fresh barrier's phase 0 never completes: deadlock).
    harness.Mutant("hopper-plan-no-alignment-slack", "hopper_plan.py",
                   "    total = SWIZZLE_ATOM_BYTES + barriers + barrier_count * BARRIER_BYTES\n",
                   "    total = barriers + barrier_count * BARRIER_BYTES\n", tests="test_hopper_ring_plan",
                   expect="kSharedBytes", needs_gpu=False),
    harness.Mutant("hopper-ring-producer-parity", "hopper_plan.py", "    return j % stages, lap & 1, (lap & 1) ^ 1\n",
                   "    return j % stages, lap & 1, lap & 1\n", tests="test_hopper_ring_waits", expect="deadlock",
                   needs_gpu=False),
]
