"""Grader for lab 08: attention, forward and backward, as a ladder of four rungs: attention_naive (rung 1: the scores
written to HBM, any head_dim, float32/float16/bfloat16), flash_forward_fp32 (rung 2: tiles on CUDA cores, float32),
flash_forward (rung 3: tensor cores, float16/bfloat16, FlashAttention-2's work split) and flash_backward (rung 4),
plus autograd.py's torch.autograd.Function over rungs 3 and 4, and the CPU model flash_model.py (the page's
model_online and model_blocks) that the grader checks on every machine and uses as its float64 reference.

Conventions (attention.h): q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim),
any strides but a contiguous last dimension; o contiguous like q, lse (batch, heads_q, seqlen_q) float32, natural
log; query head h reads key/value head h // (heads_q / heads_kv); causal aligned bottom-right (query i sees keys
j <= i + seqlen_k - seqlen_q); a row that sees no key has o = 0 and lse = -inf, and no NaN anywhere.

Tolerances, derived. Every golden is float64 (flash_model.py's reference, on the GPU), computed from the SAME
(already rounded) inputs, so input rounding cancels and what remains is the kernel's own arithmetic:
  - o_i = sum_j p_ij v_j / l_i with l_i = sum_j p_ij: a float32 sum of seqlen_k terms (error ~ sqrt(n) roundings
    of its terms, harness.tolerance(float32, n)), exps (2 ulps each), a rescale per key block (1 ulp each), the
    scores a float32 dot of head_dim products. REDUCTION_HEADROOM (4) covers those ulps, with n = seqlen_k +
    head_dim. The terms p_ij |v_j| / l are far larger than o_i, a weighted mean of random-signed values (o ~
    1/sqrt(seqlen_k) of |v| for flat attention): the rounding error scales with the terms, so the per-element
    check's floor is sum_j p_ij |v_j| / l_i (flash_model.reference_term_sizes), as lab 07's grad_weight floor is.
    On a CPU emulation (float32 tiles against float64, flash_model's walk with 64x64 blocks, seqlens 1 to 2048)
    the worst o error was 0.2-0.9% of this allowance: a rescale forgotten, a mask off by one key, a tail key
    counted, are errors of the size of o itself.
  - lse = m + log(l) in float32 (every rung): absolute error ~ the score's (a float32 dot) plus log(l)'s; checked
    relative to |lse| + rms(lse) with the same float tolerance (the emulation's worst: 0.1-0.4% of it), plus, in a
    16-bit rung, 2 u of the dtype absolute: l may be summed from P after its rounding to 16 bits (each term then
    off by u relative, l and so lse by u absolute) as well as before (FlashAttention-2's choice), and both are
    right. Rows that see no key must be exactly -inf, and their o exactly 0.
  - 16-bit outputs (rung 1 in float16/bfloat16, rungs 3 and 4): a per-element check first (the float tolerance
    plus harness.tolerance(dtype) for the rounding of P to 16 bits before P V and of the output: each at most one
    16-bit rounding of a term, 8x under that allowance), which catches never-written and grossly wrong elements
    with their position; then the flash-attention rule (SYLLABUS §4): the worst error against the float64 golden
    at most k x the worst error of PyTorch's own attention in the same dtype (k = 2 for o, 3 for grad_q, grad_k,
    grad_v) plus the golden's rounding to the dtype. PyTorch's attention is F.scaled_dot_product_attention,
    EFFICIENT_ATTENTION backend (a tiled kernel in the dtype, P rounded to 16 bits as here; MATH where that backend
    does not apply), with the bottom-right mask built explicitly and K/V heads expanded for GQA, over the rows that
    see a key (a backend's choice for an all-masked row is not the convention). A per-element slack of float32's
    tolerance times the terms' sizes is added to the bound: gradients of a row that sees one key are exactly 0 in
    float64 and a few float32 ulps of their terms in any kernel (the rule would otherwise demand exact zeros).
    On the CPU emulation (P rounded to 16 bits, output rounded), a correct kernel's worst error is ~1x the
    golden's rounding, 0.33-0.44 of the bound even against a float32-exact reference; the backward's 0.25-0.62.
  - The backward is graded on its own: o is PyTorch's same-dtype output and lse the float64 golden's in float32
    (so a wrong forward does not fail it), and the golden gradient takes D = rowsum(dO * o) from that same o (the
    kernel's contract: o as the forward stored it).
  - float32 rungs (1 and 2 in float32): the per-element float check alone.
  - Determinism: grad_k and grad_v bitwise identical run to run (summed inside one block in a fixed order); grad_q
    is not with the default float32 atomics (any order of the key blocks), so each run's grad_q passes the rule
    instead; with deterministic=True (dQ by a second pass) all three are bitwise identical.
Outputs the wrapper allocates come from a poisoned pool (harness.check.PoisonedPool): an unwritten element reads NaN,
bytes written past an output's end fail the test. Inputs are checked unchanged after every call (harness.calls,
through LAB.module; a strided view through the bytes of its storage). Every failure names batch, head, query row
and the key blocks (or, for grad_k and grad_v, key row, key block and the query blocks that visit it), from the
lab's tile sizes (constants()).
"""
from __future__ import annotations

import importlib.util
import math
import os
import random

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import attention, notebooks, requires_gpu, tolerance
from harness.attention import LAYOUTS, MODEL, blind_rows, describe, golden, make_qkv, randn
from harness.check import check_placement, dtype_name, first_line, nbytes, run_student
from harness.inputs import Arg

LAB = harness.lab("08")
FP32, FP16, BF16, FP64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
SIXTEEN_BIT = (FP16, BF16)
LARGE = pytest.mark.large  # too big for compute-sanitizer (./course sanitize skips it)
REDUCTION_HEADROOM = 4.0  # see the docstring
FLASH_HEAD_DIMS = (64, 128)


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

NAIVE_HINT = (
    "the naive rung (lab08.1): S = scale q k^T for every (query, key) pair into the float32 workspace, -inf where "
    "causal_key_end says the key is not visible; then a row's max m and l = sum_j exp(s_j - m) over the seqlen_k "
    "scores, p_j = exp(s_j - m) / l, lse = m + log(l); a row with no visible key: p = 0 and lse = -inf (guard "
    "exp(-inf - (-inf))); then o = P V")
FP32_HINT = (
    "the float32 rung (lab08.2): per key block, m' = max(m, rowmax(S)), alpha = exp(m - m'), P = exp(S - m'), "
    "l = alpha l + rowsum(P), O = alpha O + P V; with 0 as the offset while m' = -inf (a row that has seen no key); "
    "at the end o = O / l (0 when l = 0) and lse = m + log(l) (-inf when l = 0)")
FORWARD_HINT = (
    "the tensor-core forward: S = Q K^T for the key block from the ldmatrix fragments (lab08.3); per row "
    "m' = max(m, rowmax(S)) over the 4 lanes of the row (two shuffles), O and l rescaled by exp(m - m') whenever "
    "the max grows, P = exp(S - m') packed to 16-bit A fragments, O += P V (lab08.4); key blocks past the last "
    "row's causal_key_end skipped, the diagonal and tail blocks masked per element (lab08.5)")
MASK_HINT = (
    "causal blocks and masks (lab08.5): query i sees keys j < causal_key_end(i, seqlen_q, seqlen_k) = i + 1 + "
    "seqlen_k - seqlen_q (bottom-right), and none at or past seqlen_k; the loop visits key blocks up to the one "
    "holding the block's last row's last visible key, and masks every element of the diagonal and tail blocks")
BACKWARD_HINT = (
    "the backward: D = rowsum(dO * o) per row (lab08.6); per key block, P = exp(scale q k^T - lse) recomputed (0 "
    "where lse = -inf), dV += P^T dO, dP = dO V^T, dS = P (dP - D), dK += scale dS^T Q over every query block that "
    "sees the key block and every query head of the GQA group (lab08.7); dQ += scale dS K in float32 with atomics, "
    "then converted (lab08.8)")
LSE_HINT = ("lse = m + log(l) per row, natural log (with exp2 and scale * log2(e) folded in, divide the base-2 max by "
            "log2(e), or keep m in natural units), in float32, written for every row; -inf for a row that sees no "
            "key")
GQA_HINT = ("query head h reads key/value head h / (heads_q / heads_kv) (not h % heads_kv); grad_k and grad_v of a "
            "key/value head sum over its group's query heads")
FLASH_HINT = ("further from the exact result than PyTorch's own {dtype} attention: a sum (of exps, of P V, of a "
              "gradient) accumulated in 16 bits, an intermediate (S, the rescale, 1 / l) rounded to 16 bits, or a "
              "formula slightly off")
AUTOGRAD_HINT = (
    "autograd.py (lab08.9): FlashAttention.forward: o, lse = ops.flash_forward(q, k, v, causal, scale); save q, k, "
    "v, o and lse with ctx.save_for_backward, keep ops, causal and scale on ctx; return o. backward "
    "(@once_differentiable): ops.flash_backward(grad_o.contiguous(), q, k, v, o, lse, causal, scale) -> "
    "(grad_q, grad_k, grad_v, None, None, None): one gradient per input of forward, in their order")
INT64_HINT = ("index with int64_t: batch * seqlen * heads * head_dim passes 2^31 here, and an offset (b * "
              "batch_stride, a row's start) kept in an int wraps")
LSE_PLACEMENT_HINT = "lse: at::empty({batch, heads_q, seqlen_q}, q.options().dtype(at::kFloat))"


def constants() -> dict:
    """The lab's tile sizes and head dims (wrapper.cpp's constants()), read inside the tests: a lab that does not
    build fails each test, not the import."""
    return LAB.module.constants()


def autograd_module():
    """The graded tree's autograd.py (lab08.9), imported fresh (a syntax error there fails the tests that use it)."""
    return LAB.python("autograd")


def skip_before_sm80(rung: str) -> None:
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip(f"{rung} needs compute capability 8.0+ (mma.m16n8k16 in bfloat16, cp.async); this GPU runs the "
                    "naive and float32 rungs only")


def mask_name(causal: bool) -> str:
    return "causal" if causal else "noncausal"


def tiles(rung: str, head_dim: int):
    """(block_m, block_n) of a rung's kernel, from the lab's constants()."""
    return attention.tiles(constants(), rung, head_dim)


def where_of(q, k, *, causal, rung) -> dict:
    """The keyword arguments of attention.locator for a call on q, k: the failure text's batch, head, row, blocks."""
    return dict(seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2], causal=causal,
                rung=rung, tile=lambda: tiles(rung, q.shape[3]))


# ---------------------------------------------------------------- checks
def _float_tol(dtype, seqlen_k: int, head_dim: int) -> float:
    tol = tolerance(FP32, seqlen_k + head_dim) * REDUCTION_HEADROOM
    return tol + tolerance(dtype) if dtype in SIXTEEN_BIT else tol


def _check_blind_rows(o, lse, blind, case) -> None:
    """Rows that see no key: o exactly 0 and lse exactly -inf (never NaN)."""
    if not blind:
        return
    rows = o[:, :blind].float()
    if not bool((rows == 0).all()):
        bad = (rows != 0) | rows.isnan()
        b, i, h, d = (int(x) for x in bad.nonzero()[0].tolist())
        raise harness.GradeFailure(
            f"{case}: query rows 0 .. {blind - 1} see no key, so their o must be 0; "
            f"{int(bad.sum())} of {rows.numel()} elements are not, the first at batch {b}, query row {i}, head {h}, "
            f"dim {d}: {rows[b, i, h, d].item()!r}\n  hint: the -inf guard: while a row's max is -inf, use 0 as the "
            "offset (exp(-inf - 0) = 0, not exp(-inf + inf) = NaN), and at the end o = 0 when l = 0; a key block "
            "visited by a row that sees none of it is masked to -inf for that row")
    if lse is not None:
        lse_rows = lse[:, :, :blind]
        if not bool((lse_rows == float("-inf")).all()):
            b, h, i = (int(x) for x in (lse_rows != float("-inf")).nonzero()[0].tolist())
            raise harness.GradeFailure(
                f"{case}: lse of query rows 0 .. {blind - 1} (they see no key) must be -inf, the log of an empty "
                f"sum; batch {b}, head {h}, query row {i} has {lse_rows[b, h, i].item()!r}\n  hint: " + LSE_HINT)


def lse_floor(dtype, lse, tol):
    """assert_close's floor for lse in a 16-bit forward: an absolute 2 u of the dtype. l may be summed from P after
    its rounding to 16 bits (each term off by at most u relative, so l by at most u, and lse = m + log(l) by u
    absolute) as well as before it (FlashAttention-2's choice); a mask off by one key moves lse by p of that key,
    1 / (the keys the row sees) for flat attention, and o shows it where that is small."""
    if dtype not in SIXTEEN_BIT:
        return None
    return torch.full_like(lse, 2 * harness.check.UNIT_ROUNDOFF[dtype] / tol, dtype=FP64)


def check_forward(o, lse, q, k, v, *, causal, scale, rung, case, hint, gold=None):
    """o and lse of one forward call against the float64 golden (and, for 16-bit, the flash rule)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k = k.shape[1]
    check_placement(o, shape=q.shape, like=q, name="o", case=case)
    check_placement(lse, shape=(batch, heads_q, seqlen_q), like=q, dtype=FP32, name="lse", case=case,
                    hint=LSE_PLACEMENT_HINT)
    if o.numel() == 0:
        return
    gold = gold or golden(q, k, v, causal, scale)
    where = where_of(q, k, causal=causal, rung=rung)
    blind = blind_rows(seqlen_q, seqlen_k, causal)
    _check_blind_rows(o, lse, blind, case)
    # lse first: when it is wrong, o is too, and lse's message names the cause. Blind rows (checked above) compare
    # as 0, so that -inf - (-inf) does not count.
    lse_got, lse_want = lse.clone(), gold["lse"].clone()
    lse_got[:, :, :blind] = 0.0
    lse_want[:, :, :blind] = 0.0
    tol = tolerance(FP32, seqlen_k + head_dim) * REDUCTION_HEADROOM
    LAB.assert_close(lse_got, lse_want, case=f"{case}: lse", tol=tol, hint=LSE_HINT, floor=lse_floor(q.dtype, lse, tol),
                     locate=attention.locator("lse", lse.shape, **where))
    locate = attention.locator("o", o.shape, **where)
    LAB.assert_close(o, gold["o"], case=f"{case}: o", tol=_float_tol(q.dtype, seqlen_k, head_dim), hint=hint,
                     floor=gold["o_terms"], locate=locate)
    if q.dtype in SIXTEEN_BIT:
        same = attention.same_dtype_attention(q, k, v, causal, scale)
        harness.check.assert_flash_rule(o, gold["o"], same, case=f"{case}: o", k=2.0, locate=locate,
                                        hint=FLASH_HINT.format(dtype=dtype_name(q.dtype)),
                                        slack=tolerance(FP32, seqlen_k + head_dim) * gold["o_terms"])


def check_backward(grads, grad_o, q, k, v, o, *, causal, scale, case, hint=BACKWARD_HINT, same=None, gold=None):
    """grad_q, grad_k, grad_v against the float64 golden (D from the o the kernel was given) and the flash rule."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    names = ("grad_q", "grad_k", "grad_v")
    for name, got, like in zip(names, grads, (q, k, v)):
        check_placement(got, shape=like.shape, like=like, dtype=q.dtype, name=name, case=case)
    gold = gold or golden(q, k, v, causal, scale, grad_o=grad_o, o=o)
    where = where_of(q, k, causal=causal, rung="backward")
    blind = blind_rows(seqlen_q, seqlen_k, causal)
    if blind and grads[0].numel():
        rows = grads[0][:, :blind].float()
        if not bool((rows == 0).all()):
            b, i, h, d = (int(x) for x in ((rows != 0) | rows.isnan()).nonzero()[0].tolist())
            raise harness.GradeFailure(
                f"{case}: grad_q of query rows 0 .. {blind - 1} (they see no key) must be 0; batch {b}, query row "
                f"{i}, head {h}, dim {d} has {rows[b, i, h, d].item()!r}\n  hint: P = 0 in a row whose lse is -inf: "
                "guard exp(s - lse) (exp(-inf - (-inf)) is NaN); " + hint)
    for name, got in zip(names, grads):
        if got.numel() == 0:
            continue
        n = seqlen_k if name == "grad_q" else seqlen_q * (heads_q // heads_kv)  # the terms each element sums
        LAB.assert_close(got, gold[name], case=f"{case}: {name}", tol=_float_tol(q.dtype, n, head_dim), hint=hint,
                         floor=gold[name + "_terms"], locate=attention.locator(name, got.shape, **where))
    if q.dtype not in SIXTEEN_BIT:
        return
    same = same or attention.same_dtype_backward(grad_o, q, k, v, causal, scale)
    for name, got, ref in zip(names, grads, same):
        if got.numel() == 0:
            continue
        n = seqlen_k if name == "grad_q" else seqlen_q * (heads_q // heads_kv)
        ref = ref if ref is not None else torch.zeros_like(got)
        harness.check.assert_flash_rule(got, gold[name], ref, case=f"{case}: {name}", k=3.0,
                                        hint=FLASH_HINT.format(dtype=dtype_name(q.dtype)),
                                        slack=tolerance(FP32, n + head_dim) * gold[name + "_terms"],
                                        locate=attention.locator(name, got.shape, **where))


# ---------------------------------------------------------------- calling the ops, outputs guarded
def _pool_bytes(*sizes: int) -> int:
    """PoisonedPool's large_bytes: the allocations over 1 MiB, each rounded up to the allocator's 512 bytes."""
    return sum(-(-s // 512) * 512 for s in sizes if s > 2**20)


def _lse_bytes(q) -> int:
    return q.shape[0] * q.shape[2] * q.shape[1] * 4


# flash_forward's path in the tests of rung 3 (its cases, its perf, past 2^31, peak memory): the portable kernel, the
# student's, which path='auto' would replace by the reference's Hopper kernel (flash_forward_hopper.cu) on an sm_90a
# build, grading code the student did not write. COURSE_FLASH_FORWARD_PATH=auto (or hopper_simple, ...) runs the
# same tests through the Hopper path instead: issue 17's "test 08 with the Hopper path selected and disabled".
FORWARD_PATH = os.environ.get("COURSE_FLASH_FORWARD_PATH", "portable")
# The same for flash_backward (rung 4) and the reference's Hopper backward (flash_backward_hopper.cu):
# COURSE_FLASH_BACKWARD_PATH=auto or hopper runs rung 4's tests through it. The deterministic mode always runs the
# portable kernel (path='auto' falls back to it; 'hopper' refuses it), and the tests of the autograd Function call
# the ops as autograd.py does, with path 'auto'.
BACKWARD_PATH = os.environ.get("COURSE_FLASH_BACKWARD_PATH", "portable")


def forward_op(op, q, k, v, causal, scale, *, case):
    """One forward rung's (o, lse), both from a poisoned pool (the naive rung's scores workspace too)."""
    sizes = [nbytes(q), _lse_bytes(q)]
    if op == "attention_naive":
        sizes.append(q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1] * 4)
    path = {"path": FORWARD_PATH} if op == "flash_forward" else {}
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(*sizes)) as pool:
        o, lse = getattr(LAB.module, op)(q, k, v, causal=causal, scale=scale, **path)
    pool.assert_no_spill(o, name="o", case=case)
    pool.assert_no_spill(lse, name="lse", case=case)
    return o, lse


def backward_op(grad_o, q, k, v, o, lse, causal, scale, *, case, deterministic=False):
    """flash_backward's (grad_q, grad_k, grad_v) from a poisoned pool (with its workspaces: D and the float32 dQ)."""
    sizes = [nbytes(q), nbytes(k), nbytes(v), _lse_bytes(q), q.numel() * 4]
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(*sizes)) as pool:
        grads = LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=causal, scale=scale,
                                          deterministic=deterministic,
                                          path="auto" if deterministic else BACKWARD_PATH)
    for name, got in zip(("grad_q", "grad_k", "grad_v"), grads):
        pool.assert_no_spill(got, name=name, case=case)
    return grads


# ---------------------------------------------------------------- builds, constants, and what runs without a GPU
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports, and its autograd.py imports: checked on every machine."""
    for name in ("attention_naive", "flash_forward_fp32", "flash_forward", "flash_backward", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    module = autograd_module()
    for name in ("FlashAttention", "flash_attention"):
        assert hasattr(module, name), f"autograd.py defines no {name!r}"
    assert issubclass(module.FlashAttention, torch.autograd.Function), (
        "autograd.py: FlashAttention must subclass torch.autograd.Function")


@harness.reference_check  # the constants are given
def test_constants():
    """constants() names the head dims and every tensor-core kernel's tile (the where-text and the page use them):
    whole mma steps (16 rows, 16 keys) and, for the forward, whole 16-row warp slices."""
    c = constants()
    assert list(c.get("head_dims", [])) == list(FLASH_HEAD_DIMS), f"constants()['head_dims'] = {c.get('head_dims')}"
    for d in FLASH_HEAD_DIMS:
        for rung in ("forward", "backward"):
            tile = tiles(rung, d)
            assert tile is not None, f"constants() has no {rung}_block_m_d{d} / {rung}_block_n_d{d}: {c}"
            assert all(t > 0 and t % 16 == 0 for t in tile), f"constants(): the {rung} tile for d{d} is {tile}"
        assert tiles("fp32", d) is not None, f"constants() has no fp32_block_m / fp32_block_n: {c}"


_CPU_CALLS = {
    "attention_naive": lambda m, q, k, v, o, lse: m.attention_naive(q, k, v),
    "flash_forward_fp32": lambda m, q, k, v, o, lse: m.flash_forward_fp32(q, k, v),
    "flash_forward": lambda m, q, k, v, o, lse: m.flash_forward(q.bfloat16(), k.bfloat16(), v.bfloat16()),
    "flash_backward": lambda m, q, k, v, o, lse: m.flash_backward(o.bfloat16(), q.bfloat16(), k.bfloat16(),
                                                                  v.bfloat16(), o.bfloat16(), lse),
}


@pytest.mark.parametrize("op", list(_CPU_CALLS))
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors(op):
    q = torch.ones(1, 4, 2, 64)
    lse = torch.zeros(1, 2, 4)
    LAB.assert_raises_clearly(lambda: _CPU_CALLS[op](LAB.module, q, q, q, q, lse), must_mention=("CUDA",),
                              case=f"{op}(tensors on the CPU)")


# Each tensor argument of every rung refused on its own, the others valid (harness.inputs). q sets the dtype (one the
# rung does not take is refused); k and v must match it, and each other's shape. q, k and v may have any strides but a
# contiguous last dimension; the tensor-core rungs also read them, and o and grad_o, in 16-byte chunks (a data
# pointer's alignment: real tensors only). On fake CUDA tensors (no GPU needed) the rungs that read no data pointer
# in their checks (naive, float32) are checked whole; the tensor-core rungs on a GPU.
def _qkv_args(rung_dtype, wrong_dtype, aligned):
    layout = {"strided": True, "aligned": aligned, "words": {"strided": ("stride 1",)}}
    return [Arg("q", dtype=rung_dtype, shape=lambda t: t[..., :-8], **{**layout, "words": {
                "strided": ("stride 1",), "shape": ("head_dim",)}}),
            Arg("k", dtype=wrong_dtype, shape=lambda t: t[:, :-1], **layout),
            Arg("v", dtype=wrong_dtype, shape=lambda t: t[:, :-1], **layout)]


_LIKE_Q = {"dtype": FP16, "shape": lambda t: t[:, :-1], "aligned": True}
ATTENTION_ARGUMENTS = {  # op: (q's dtype, every argument's name in call order, the specs)
    "attention_naive": (BF16, ("q", "k", "v"), _qkv_args(FP64, FP16, aligned=False)),
    "flash_forward_fp32": (FP32, ("q", "k", "v"), _qkv_args(BF16, FP64, aligned=False)),
    "flash_forward": (BF16, ("q", "k", "v"), _qkv_args(FP32, FP16, aligned=True)),
    "flash_backward": (BF16, ("grad_o", "q", "k", "v", "o", "lse"),
                       [Arg("grad_o", **_LIKE_Q), *_qkv_args(FP32, FP16, aligned=True), Arg("o", **_LIKE_Q),
                        Arg("lse", dtype=FP64, shape=lambda t: t[..., :-1])]),
}
_TENSOR_CORE_RUNGS = ("flash_forward", "flash_backward")


@pytest.mark.parametrize("op, real", [
    pytest.param(op, real.values[0], id=f"{op}-{real.id}", marks=real.marks) for op in ATTENTION_ARGUMENTS
    for real in harness.FAKE_AND_REAL if real.values[0] or op not in _TENSOR_CORE_RUNGS])
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(op, real):
    if op in _TENSOR_CORE_RUNGS:
        skip_before_sm80(op)
    dtype, names, specs = ATTENTION_ARGUMENTS[op]

    def make_args():
        q, k, v = make_qkv(2, 64, 80, 4, 2, 64, dtype)
        made = {"q": q, "k": k, "v": v, "o": torch.zeros_like(q), "grad_o": torch.zeros_like(q),
                "lse": torch.zeros(2, 4, 64, device="cuda")}
        return {name: made[name] for name in names}

    harness.inputs.assert_each_argument_checked(op, getattr(LAB.module, op), make_args, specs, real=real)


# ---------------------------------------------------------------- the CPU model (flash_model.py), no GPU needed
MODEL_CASES = [((1, 1), False, (1, 1)), ((1, 1), True, (1, 1)), ((113, 203), False, (2, 2)),
               ((113, 203), True, (4, 2)), ((128, 217), False, (3, 1)), ((128, 217), True, (2, 2)),
               ((203, 113), True, (4, 2)), ((203, 113), False, (2, 1)), ((64, 64), True, (2, 2)),
               ((0, 5), True, (2, 1)), ((5, 0), False, (2, 1)), ((1023, 1024), True, (1, 1))]
MODEL_TILES = [(64, 64), (64, 128), (64, 16), (128, 64), (16, 32)]  # the kernels' (constants()) and others


def _model_inputs(seqlen_q, seqlen_k, heads, head_dim=16, batch=2):
    g = torch.Generator().manual_seed(seqlen_q * 1000 + seqlen_k)
    hq, hkv = heads
    return tuple(torch.randn(batch, s, h, head_dim, dtype=FP64, generator=g)
                 for s, h in ((seqlen_q, hq), (seqlen_k, hkv), (seqlen_k, hkv), (seqlen_q, hq)))


def _model_id(case):
    (sq, sk), causal, (hq, hkv) = case
    return f"{sq}x{sk}-{mask_name(causal)}-h{hq}-kv{hkv}"


def _assert_model_close(got, want, what):
    both_inf = torch.isinf(got) & torch.isinf(want) & (got == want)
    diff = (got - want).abs().masked_fill(both_inf, 0.0)
    worst = diff.nan_to_num(float("inf")).max().item() if diff.numel() else 0.0
    assert worst <= 1e-12 * max(1.0, want.nan_to_num(0.0, 0.0, 0.0).abs().max().item() if want.numel() else 1.0), (
        f"flash_model.py: {what} differs from the reference by {worst:.3g}")


@pytest.mark.parametrize("tile", MODEL_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", MODEL_CASES, ids=_model_id)
@harness.reference_check  # flash_model.py is given
def test_model_forward(case, tile):
    """The tiled forward (online recurrence, block skipping, masks) equals the formula to 1e-12, rows that see no key
    included (o = 0, lse = -inf), at every tile shape; and it visits exactly forward_key_blocks' blocks."""
    (sq, sk), causal, heads = case
    q, k, v, _ = _model_inputs(sq, sk, heads)
    o, lse = MODEL.reference_forward(q, k, v, causal)
    visits = []
    to, tlse = MODEL.tiled_forward(q, k, v, causal, block_m=tile[0], block_n=tile[1], visits=visits)
    _assert_model_close(to, o, f"tiled_forward's o ({_model_id(case)}, tiles {tile})")
    _assert_model_close(tlse, lse, f"tiled_forward's lse ({_model_id(case)}, tiles {tile})")
    blind = blind_rows(sq, sk, causal)
    assert bool((o[:, :blind] == 0).all()) and bool((lse[:, :, :blind] == float("-inf")).all())
    assert not bool(o.isnan().any()) and not bool(lse.isnan().any())
    o_scaled, _ = MODEL.reference_forward(q, k, v, causal, scale=0.37)
    to_scaled, _ = MODEL.tiled_forward(q, k, v, causal, scale=0.37, block_m=tile[0], block_n=tile[1])
    _assert_model_close(to_scaled, o_scaled, "tiled_forward with scale 0.37")


@pytest.mark.parametrize("tile", MODEL_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", MODEL_CASES, ids=_model_id)
@harness.reference_check  # flash_model.py is given
def test_model_backward(case, tile):
    """The tiled backward's loop (per key block, over the group's query heads and the query blocks that see it)
    equals the explicit formulas to 1e-12; the explicit formulas equal torch.autograd of the float64 composition."""
    (sq, sk), causal, heads = case
    if sq > 300 and tile != (64, 64):
        pytest.skip("the long case runs at one tile shape (its loops are slow in Python)")
    q, k, v, do = _model_inputs(sq, sk, heads)
    o, lse = MODEL.reference_forward(q, k, v, causal)
    grads = MODEL.reference_backward(do, q, k, v, causal)
    tiled = MODEL.tiled_backward(do, q, k, v, o, lse, causal, block_m=tile[0], block_n=tile[1])
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), tiled, grads):
        _assert_model_close(got, want, f"tiled_backward's {name} ({_model_id(case)}, tiles {tile})")
    if sq * sk and tile == (64, 64):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        auto = torch.autograd.grad(MODEL.attention_autograd(*leaves, causal), leaves, do, allow_unused=True)
        for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, auto):
            _assert_model_close(got, want if want is not None else torch.zeros_like(got),
                                f"reference_backward's {name} against torch.autograd ({_model_id(case)})")


BLOCK_SHAPES = [(16, 16), (16, 32), (32, 16), (64, 16), (64, 32), (64, 64), (128, 64), (64, 128)]


def _block_truth(seqlen_q, seqlen_k, block_m, block_n, causal):
    """From the (query, key) visibility matrix alone, per (query block, key block) including one key block past the
    end: (some pair visible, every pair of a valid row visible), keys past seqlen_k counting as not visible."""
    n_q, n_k = MODEL.ceil_div(seqlen_q, block_m), MODEL.ceil_div(seqlen_k, block_n) + 1
    vis = torch.zeros(n_q * block_m, n_k * block_n, dtype=torch.bool)
    vis[:seqlen_q, :seqlen_k] = MODEL.visible(seqlen_q, seqlen_k, causal)
    padding_row = (torch.arange(n_q * block_m) >= seqlen_q).view(n_q, block_m, 1, 1)
    blocks = vis.view(n_q, block_m, n_k, block_n)
    return blocks.any(3).any(1), (blocks | padding_row).all(3).all(1)


def _seqlens(block):
    """Every length to 17, and one short of, at and one past 1, 2 and 3 of either block size (tails of one key,
    whole blocks, a block and one)."""
    return sorted(set(range(0, 18)) | {b * j + e for b in block for j in (1, 2, 3) for e in (-1, 0, 1)})


@pytest.mark.parametrize("block", BLOCK_SHAPES, ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=mask_name)
@harness.reference_check  # flash_model.py is given
def test_model_blocks(causal, block):
    """forward_key_blocks and backward_query_blocks visit exactly the blocks with at least one visible (query, key)
    pair (the rest skipped, never loaded), and leave unmasked exactly the blocks where every pair is visible, for
    lengths with tails, seqlen_q > seqlen_k, one block and none: checked against the visibility matrix."""
    block_m, block_n = block
    lengths = _seqlens(block)
    for seqlen_q in lengths:
        for seqlen_k in lengths:
            anything, everything = _block_truth(seqlen_q, seqlen_k, block_m, block_n, causal)
            n_q, n_k = anything.shape
            for qb in range(n_q):
                n_blocks, n_unmasked = MODEL.forward_key_blocks(qb, block_m, block_n, seqlen_q, seqlen_k, causal)
                visited = torch.arange(n_k) < n_blocks
                unmasked = torch.arange(n_k) < n_unmasked
                where = f"seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, blocks {block_m}x{block_n}, query block {qb}"
                assert torch.equal(visited, anything[qb]), (
                    f"forward_key_blocks: {where}: visits {visited.tolist()}, blocks with a visible pair "
                    f"{anything[qb].tolist()}")
                assert torch.equal(unmasked[visited], everything[qb][visited]), (
                    f"forward_key_blocks: {where}: unmasked {unmasked.tolist()}, wholly visible "
                    f"{everything[qb].tolist()}")
            for kb in range(n_k - 1):
                first, n_blocks, first_unmasked = MODEL.backward_query_blocks(kb, block_m, block_n, seqlen_q,
                                                                              seqlen_k, causal)
                visited = (torch.arange(n_q) >= first) & (torch.arange(n_q) < n_blocks)
                unmasked = torch.arange(n_q) >= first_unmasked
                where = f"seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, blocks {block_m}x{block_n}, key block {kb}"
                assert n_blocks == n_q and torch.equal(visited, anything[:, kb]), (
                    f"backward_query_blocks: {where}: visits {visited.tolist()}, blocks with a visible pair "
                    f"{anything[:, kb].tolist()}")
                assert torch.equal(unmasked[visited], everything[:, kb][visited]), (
                    f"backward_query_blocks: {where}: unmasked {unmasked.tolist()}, wholly visible "
                    f"{everything[:, kb].tolist()}")


@harness.reference_check  # flash_model.py is given
def test_model_causal_skips_half_the_blocks():
    """The page's count: at seqlen 4096 with 64 x 64 blocks, a causal forward visits the T(T + 1) / 2 = 2080 blocks on
    or below the diagonal of T^2 = 4096, masking only the 64 diagonal ones."""
    visited = masked = 0
    for qb in range(64):
        n_blocks, n_unmasked = MODEL.forward_key_blocks(qb, 64, 64, 4096, 4096, True)
        visited += n_blocks
        masked += n_blocks - n_unmasked
    assert (visited, masked) == (2080, 64), (visited, masked)


# ---------------------------------------------------------------- autograd.py without a GPU (stand-in ops)
class FakeOps:
    """Stands in for the built extension on the CPU, so that autograd.py (lab08.9) is graded without a GPU: the
    forward and backward computed by flash_model.py's reference and returned detached (the real ops are not
    differentiable either), refusing a non-contiguous grad_o as the real wrapper does."""

    def __init__(self):
        self.calls: list[tuple] = []

    def flash_forward(self, q, k, v, causal=False, scale=None):
        self.calls.append(("flash_forward", bool(causal), scale))
        with torch.no_grad():
            o, lse = MODEL.reference_forward(q, k, v, causal, scale)
        return o.to(q.dtype), lse.float()

    def flash_backward(self, grad_o, q, k, v, o, lse, causal=False, scale=None):
        self.calls.append(("flash_backward", bool(causal), scale))
        if not grad_o.is_contiguous():
            raise RuntimeError(f"flash_backward: grad_o must be contiguous, got strides {list(grad_o.stride())}; "
                               "call grad_o.contiguous() first")
        with torch.no_grad():
            grads = MODEL.reference_backward(grad_o, q, k, v, causal, scale, o=o)
        return tuple(g.to(q.dtype) for g in grads)


def _student(what: str, fn):
    return run_student(what, fn, hint=AUTOGRAD_HINT)


def _flash_attention(module, ops, causal, scale):
    return lambda q, k, v: module.flash_attention(q, k, v, causal, scale, ops=ops)


@pytest.mark.parametrize("causal", [False, True], ids=mask_name)
@harness.tasks("lab08.9")
def test_autograd_on_cpu(causal):
    """autograd.py with stand-in ops on the CPU (FakeOps, float64): forward calls ops.flash_forward with causal and
    scale, backward calls ops.flash_backward with a contiguous grad_o and returns (grad_q, grad_k, grad_v) in the
    forward's order; loss.backward() matches float64 autograd of the formula; gradcheck passes. GQA (4 query heads on
    2 key/value heads), seqlen_q != seqlen_k, a scale that is not the default; the loss makes grad_o a transposed,
    non-contiguous view."""
    module, ops = autograd_module(), FakeOps()
    scale = 0.37
    q, k, v, _ = _model_inputs(5, 7, (4, 2), head_dim=3, batch=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn = _flash_attention(module, ops, causal, scale)
    case = f"autograd.flash_attention on the CPU with stand-in ops ({mask_name(causal)}, scale {scale})"
    o = _student(f"{case}: forward", lambda: fn(*leaves))
    if not any(call[0] == "flash_forward" for call in ops.calls):
        raise harness.GradeFailure(f"{case}: forward never called ops.flash_forward\n  hint: {AUTOGRAD_HINT}")
    if not isinstance(o, torch.Tensor):
        raise harness.GradeFailure(f"{case}: flash_attention returned {type(o).__name__}, not the tensor o (lse is "
                                   f"saved for the backward, not returned)\n  hint: {AUTOGRAD_HINT}")
    want_o = MODEL.attention_autograd(q, k, v, causal, scale)
    LAB.assert_close(o, want_o, case=f"{case}: o", tol=1e-12, hint="pass causal and scale on to the op: "
                     + AUTOGRAD_HINT)
    c = torch.randn(o.shape[0], o.shape[2], o.shape[1], o.shape[3], dtype=FP64)

    def loss_of(out):  # its gradient with respect to out is a transposed, non-contiguous view
        return (out.transpose(1, 2) * c).sum()

    _student(f"{case}: loss.backward() with a transposed grad_o", lambda: loss_of(o).backward())
    if not any(call[0] == "flash_backward" for call in ops.calls):
        raise harness.GradeFailure(f"{case}: backward never called ops.flash_backward\n  hint: {AUTOGRAD_HINT}")
    if any(call[1:] != (causal, scale) for call in ops.calls):
        raise harness.GradeFailure(f"{case}: the ops were called with (causal, scale) = "
                                   f"{sorted({call[1:] for call in ops.calls}, key=str)}, not ({causal}, {scale})\n"
                                   f"  hint: {AUTOGRAD_HINT}")
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(loss_of(MODEL.attention_autograd(*refs, causal, scale)), refs)
    for name, leaf, w in zip(("q.grad", "k.grad", "v.grad"), leaves, want):
        if leaf.grad is None:
            raise harness.GradeFailure(f"{case}: backward left {name} None\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(leaf.grad, w, case=f"{case}: {name}", tol=1e-10, hint=AUTOGRAD_HINT)
    ok = _student(f"{case}: torch.autograd.gradcheck", lambda: torch.autograd.gradcheck(
        fn, tuple(t.clone().requires_grad_() for t in (q, k, v)), raise_exception=False))
    assert ok, f"{case}: torch.autograd.gradcheck failed\n  hint: {AUTOGRAD_HINT}"


@harness.tasks("lab08.9")
def test_autograd_second_derivative_raises_clearly():
    """backward is @once_differentiable: a second derivative must raise autograd's clear error ("trying to
    differentiate twice"), not give a silently wrong number."""
    module, ops = autograd_module(), FakeOps()
    q, k, v, _ = _model_inputs(4, 6, (2, 2), head_dim=3, batch=1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = _student("autograd.flash_attention forward", lambda: module.flash_attention(*leaves, ops=ops))
    grad_o = torch.randn_like(o, requires_grad=True)
    (grad_q,) = _student("autograd.grad(flash_attention(q, k, v), q, grad_o, create_graph=True)",
                         lambda: torch.autograd.grad(o, leaves[0], grad_o, create_graph=True))
    try:
        grad_q.sum().backward()
    except RuntimeError as error:
        text = str(error)
        if "twice" in text or "once_differentiable" in text:
            return
        raise harness.GradeFailure(
            f"a second derivative through autograd.flash_attention raised an unclear error:\n    {first_line(text)}\n"
            "  hint: decorate backward with @once_differentiable (torch.autograd.function)") from None
    raise harness.GradeFailure("a second derivative through autograd.flash_attention ran (the stand-in ops are not "
                               "differentiable, so its numbers are wrong)\n  hint: decorate backward with "
                               "@once_differentiable, so that it raises a clear error instead")


# ---------------------------------------------------------------- hopper_plan.py (lab08.10, lab08.11), no GPU needed
# The Hopper forward (flash_forward_hopper.cu) is the reference's; these two tasks are its bookkeeping in Python. The
# grader's reference for the shared-memory plan is the solutions tree's hopper_plan.py (never the graded copy, as
# harness.attention's MODEL), and test_hopper_plan_is_the_kernels checks that reference against the kernel's own
# constants(); the ring's parities are checked against a simulation of its mbarriers.
PLAN_HINT = (
    "hopper_plan.py (lab08.10): from the aligned base, Q's tile (BLOCK_M x head_dim elements) at 0, then stages K "
    "tiles and stages V tiles (BLOCK_N x head_dim each), then 1 + 3 x stages mbarriers of BARRIER_BYTES (q_full; "
    "k_full, v_full and empty per stage); total = SWIZZLE_ATOM_BYTES of alignment slack + all of that; "
    "deepest_ring: the most stages whose total <= limit")
WAITS_HINT = (
    "hopper_plan.py (lab08.11): key block j uses stage j % stages in lap j // stages; the consumers wait on the full "
    "barriers with the lap's parity (lap & 1), the producer on the empty barrier with the other one ((lap & 1) ^ 1): "
    "it waits for the consumers' release of lap - 1, and a fresh barrier's wait on parity 1 returns at once")
HOPPER_PLAN_CASES = [(d, s) for d in FLASH_HEAD_DIMS for s in range(1, 9)] + [(32, 3), (256, 1), (256, 2)]


def hopper_plan_module():
    """The graded tree's hopper_plan.py (lab08.10 and lab08.11)."""
    return LAB.python("hopper_plan")


def _reference_hopper_plan():
    path = harness.trees.SOLUTIONS / LAB.lab.name / "hopper_plan.py"
    spec = importlib.util.spec_from_file_location("course_lab08_hopper_plan_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@harness.reference_check  # the reference's plan against the kernel it describes
def test_hopper_plan_is_the_kernels():
    """The reference hopper_plan.py describes flash_forward_hopper.cu as built: its given constants are the kernel's
    tile (constants(): hopper_block_m, hopper_block_n), and at the kernel's stage count per head dim (hopper_stages)
    its total is the dynamic shared memory the kernel launches with (hopper_shared_bytes, HopperTiles::kSharedBytes)
    and fits 227 KiB."""
    ref, c = _reference_hopper_plan(), constants()
    for d in FLASH_HEAD_DIMS:
        key = f"d{d}"
        assert (c.get(f"hopper_block_m_{key}"), c.get(f"hopper_block_n_{key}")) == (ref.BLOCK_M, ref.BLOCK_N), (
            f"constants(): the Hopper tile for {key} is not hopper_plan.py's ({ref.BLOCK_M}, {ref.BLOCK_N}): {c}")
        stages = c.get(f"hopper_stages_{key}")
        plan = ref.ring_plan(d, stages)
        assert plan.total == c.get(f"hopper_shared_bytes_{key}"), (
            f"hopper_plan.ring_plan({d}, {stages}).total = {plan.total}, the kernel's kSharedBytes = "
            f"{c.get(f'hopper_shared_bytes_{key}')}: the page and the task describe another kernel")
        assert plan.total <= ref.SHARED_LIMIT and stages <= ref.deepest_ring(d)
        for s in range(1, ref.deepest_ring(d) + 1):  # TMA's swizzled boxes: every tile on a 1024-byte boundary
            tiles = ref.ring_plan(d, s)
            offsets = (tiles.q, tiles.k, tiles.v, tiles.kv_tile_bytes)
            assert all(offset % ref.SWIZZLE_ATOM_BYTES == 0 for offset in offsets), (d, s, tiles)


@harness.tasks("lab08.10")
def test_hopper_ring_plan():
    """ring_plan's offsets and total equal the kernel's layout for head dims 64 and 128 (and 32, 256: the rule, not
    a table) at 1 to 8 stages; deepest_ring is the most stages that fit, at
    227 KiB and at other limits."""
    module, ref = hopper_plan_module(), _reference_hopper_plan()
    for d, stages in HOPPER_PLAN_CASES:
        got = run_student(f"hopper_plan.ring_plan({d}, {stages})", lambda: module.ring_plan(d, stages),
                          hint=PLAN_HINT)
        want = ref.ring_plan(d, stages)
        fields = want._fields
        try:
            got_fields = tuple(getattr(got, name) for name in fields)
        except AttributeError:
            raise harness.GradeFailure(f"hopper_plan.ring_plan({d}, {stages}) returned {got!r}, not a RingPlan "
                                       f"(fields {', '.join(fields)})\n  hint: {PLAN_HINT}") from None
        wrong = [f"{name} = {g} (the kernel: {w})" for name, g, w in zip(fields, got_fields, want) if g != w]
        if wrong:
            raise harness.GradeFailure(
                f"hopper_plan.ring_plan({d}, {stages}): " + "; ".join(wrong) + " (flash_forward_hopper.cu's "
                f"HopperTiles<{d}>: kSharedBytes, the q_tile / k_tiles / v_tiles / q_full offsets)\n"
                f"  hint: {PLAN_HINT}")
    for d in (*FLASH_HEAD_DIMS, 256):
        for limit in (ref.SHARED_LIMIT, 100 * 1024, 48 * 1024, 1024):
            got = run_student(f"hopper_plan.deepest_ring({d}, {limit})", lambda: module.deepest_ring(d, limit),
                              hint=PLAN_HINT)
            want = ref.deepest_ring(d, limit)
            if got != want:
                totals = ", ".join(f"{s} stages {ref.ring_plan(d, s).total} B" for s in range(max(want, 1), want + 2))
                raise harness.GradeFailure(
                    f"hopper_plan.deepest_ring({d}, limit={limit}) = {got!r}, expected {want} ({totals})\n"
                    f"  hint: {PLAN_HINT}")


class _Mbarrier:
    """An mbarrier's phases (PTX ISA, mbarrier): a phase completes when `expected` arrivals have been made and the
    bytes announced by expect-tx arrivals have landed; a wait on parity p returns once the phase of parity p has
    completed, i.e. while the current phase's parity is not p. A fresh barrier is in phase 0."""

    def __init__(self, expected: int):
        self.expected, self.arrivals, self.bytes, self.phase = expected, 0, 0, 0

    def arrive(self, expect_bytes: int = 0) -> None:
        self.arrivals += 1
        self.bytes += expect_bytes
        self._complete()

    def landed(self, count: int) -> None:
        self.bytes -= count
        self._complete()

    def _complete(self) -> None:
        if self.arrivals == self.expected and self.bytes == 0:
            self.phase, self.arrivals = self.phase + 1, 0

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity


class RingFailure(Exception):
    pass


def simulate_ring(waits, stages: int, blocks: int, consumers: int, seed: int) -> None:
    """The kernel's ring with `waits` (ring_waits) as its bookkeeping: one producer thread (waits on empty, arms the
    stage's full barriers with the tile bytes, issues the K and V copies), a copy engine landing the copies in any
    order, `consumers` warps (wait for K_j, then V_j, read them, arrive on empty: kEmptyArrivals of them). Each step
    runs one actor that can move, chosen at random. RingFailure says what went wrong: a wait that let a consumer
    read a stage before its block landed or after it was refilled, a producer refilling a stage still being read, or
    every actor waiting (a deadlock)."""
    rng = random.Random(seed)
    tile = 1  # bytes a tile: the simulation counts copies, not bytes
    k_full, v_full = [_Mbarrier(1) for _ in range(stages)], [_Mbarrier(1) for _ in range(stages)]
    empty = [_Mbarrier(consumers) for _ in range(stages)]
    held = [[None, None] for _ in range(stages)]  # the key block whose K (0) and V (1) a stage holds; None: in flight
    in_flight: list[tuple[int, int, int]] = []  # (stage, 0 K / 1 V, key block)
    producer = 0  # the next key block the producer loads
    consumer_next = [0] * consumers  # each consumer's next key block
    consumer_step = [0] * consumers  # 0: waits for K, 1: waits for V

    def position(j):
        answer = waits(j, stages)
        ok = (isinstance(answer, tuple) and len(answer) == 3 and 0 <= answer[0] < stages
              and answer[1] in (0, 1) and answer[2] in (0, 1))
        if not ok:
            raise RingFailure(f"ring_waits({j}, {stages}) = {answer!r}: expected (stage in 0..{stages - 1}, "
                              "full_parity 0 or 1, empty_parity 0 or 1)")
        return answer

    def producer_move():
        nonlocal producer
        stage, _, parity = position(producer)
        if not empty[stage].passes(parity):
            return False
        late = [c for c in range(consumers) if consumer_next[c] <= producer - stages]
        if late:
            raise RingFailure(f"the producer's wait on empty[{stage}] with parity {parity} let it copy key block "
                              f"{producer} into stage {stage} while consumer {late[0]} had not released key block "
                              f"{producer - stages} from it")
        for kind, barrier in ((0, k_full[stage]), (1, v_full[stage])):
            barrier.arrive(expect_bytes=tile)
            held[stage][kind] = None
            in_flight.append((stage, kind, producer))
        producer += 1
        return True

    def copy_lands():
        stage, kind, block = in_flight.pop(rng.randrange(len(in_flight)))
        held[stage][kind] = block
        (k_full if kind == 0 else v_full)[stage].landed(tile)
        return True

    def consumer_move(c):
        j = consumer_next[c]
        stage, parity, _ = position(j)
        kind = consumer_step[c]
        if not (k_full if kind == 0 else v_full)[stage].passes(parity):
            return False
        name = "KV"[kind]
        if held[stage][kind] != j:
            what = "still in flight" if held[stage][kind] is None else f"key block {held[stage][kind]}'s"
            raise RingFailure(f"consumer {c}'s wait on {name.lower()}_full[{stage}] with parity {parity} returned "
                              f"for key block {j}, but stage {stage}'s {name} tile is {what}: it has not landed")
        if kind == 0:
            consumer_step[c] = 1
        else:
            empty[stage].arrive()
            consumer_step[c], consumer_next[c] = 0, j + 1
        return True

    while producer < blocks or in_flight or min(consumer_next) < blocks:
        movers = ([producer_move] if producer < blocks else []) + ([copy_lands] if in_flight else [])
        movers += [lambda c=c: consumer_move(c) for c in range(consumers) if consumer_next[c] < blocks]
        rng.shuffle(movers)
        if not any(move() for move in movers):
            parts = []
            if producer < blocks:
                stage, _, parity = position(producer)
                parts.append(f"the producer waits on empty[{stage}] (phase {empty[stage].phase}) with parity "
                             f"{parity} to load key block {producer}")
            for c in range(consumers):
                if consumer_next[c] < blocks:
                    j = consumer_next[c]
                    stage, parity, _ = position(j)
                    name = "kv"[consumer_step[c]]
                    barrier = (k_full if consumer_step[c] == 0 else v_full)[stage]
                    parts.append(f"consumer {c} waits on {name}_full[{stage}] (phase {barrier.phase}) with parity "
                                 f"{parity} for key block {j}")
            raise RingFailure(f"deadlock with {stages} stages, {blocks} key blocks: " + "; ".join(parts))


RING_CASES = [(stages, blocks) for stages in (1, 2, 3, 4) for blocks in (0, 1, 2, 3, 5, 8, 13)]


@harness.tasks("lab08.11")
def test_hopper_ring_waits():
    """ring_waits drives a simulated ring (a producer, a copy engine landing copies in any order, 4 consumer warps
    scheduled at random, 20 orders a case) at 1 to 4 stages over 0 to 13 key blocks: no consumer reads a tile before
    it lands or after it is refilled, the producer never refills a stage still being read, and nothing deadlocks."""
    module = hopper_plan_module()
    for stages, blocks in RING_CASES:
        for seed in range(20):
            try:
                simulate_ring(lambda j, s: module.ring_waits(j, s), stages, blocks, consumers=4, seed=seed)
            except RingFailure as failure:
                raise harness.GradeFailure(f"hopper_plan.ring_waits, ring of {stages} stages, {blocks} key blocks "
                                           f"(schedule {seed}): {failure}\n  hint: {WAITS_HINT}") from None
            except Exception as error:
                raise harness.GradeFailure(f"hopper_plan.ring_waits raised {type(error).__name__}: "
                                           f"{first_line(error)}\n  hint: {WAITS_HINT}") from None


@harness.reference_check  # the grader's own simulation
def test_ring_simulation_catches_wrong_parities():
    """The simulation passes the reference's ring_waits and fails three classic slips, each with its own words: the
    producer waiting on the lap's own parity (deadlock at its first wait), the consumers waiting on j's parity
    instead of the lap's (a read before the copy landed), and no wait on empty at all (a refill under a reader)."""
    ref = _reference_hopper_plan()
    for stages, blocks in RING_CASES:
        for seed in range(5):
            simulate_ring(ref.ring_waits, stages, blocks, consumers=4, seed=seed)
    slips = {  # what each must fail with, in at least one schedule; every schedule must fail
        "deadlock": lambda j, s: (j % s, (j // s) & 1, (j // s) & 1),  # the producer waits on its own lap's phase
        "has not landed": lambda j, s: (j % s, j & 1, ((j // s) & 1) ^ 1),  # consumers: j's parity, not the lap's
        "had not released": lambda j, s: (j % s, (j // s) & 1, 1),  # the producer's parity never changes
    }
    for phrase, waits in slips.items():
        caught = []
        for seed in range(20):
            try:
                simulate_ring(waits, 2, 8, consumers=4, seed=seed)
            except RingFailure as failure:
                caught.append(str(failure))
        assert len(caught) == 20 and any(phrase in text for text in caught), (phrase, len(caught), caught[:2])


# ---------------------------------------------------------------- GPU: the shapes of every rung
# (seqlen_q, seqlen_k): one of each (the one-element case); tails on both sides (113, 203: neither a multiple of 16);
# a whole query block against a key tail (128, 217); seqlen_q > seqlen_k (203, 113: causal rows 0 .. 89 see no key);
# one past a power of two (1023, 1024: the last query block is one row short); long rows (2048, 4224 = 33 x 128:
# many key blocks, the online rescale at every one). The long ones are LARGE (compute-sanitizer skips them) and
# run on fewer dtype combinations.
SMALL_SEQLENS = [(1, 1), (113, 203), (128, 217), (203, 113), (1023, 1024)]
BIG_SEQLENS = [(2048, 2048), (4224, 4224)]
MAIN_HEADS = (2, 3, 3)  # batch, heads_q, heads_kv: an odd head count; (1, 2, 2) for the big seqlens


def seqlen_id(seqlens) -> str:
    return f"{seqlens[0]}x{seqlens[1]}"


def main_heads(seqlens):
    return MAIN_HEADS if max(seqlens) <= 1024 else (1, 2, 2)


def forward_tasks(seqlens, causal):
    """Rung 3's tasks for a case: S (lab08.3) and the online softmax (lab08.4) always; the masks and skipping
    (lab08.5) where a block is masked: causal, or a key tail (seqlen_k not a multiple of 128, the largest key block
    the spec allows)."""
    return ("lab08.3", "lab08.4", "lab08.5") if causal or seqlens[1] % 128 else ("lab08.3", "lab08.4")


BACKWARD_TASKS = ("lab08.6", "lab08.7", "lab08.8")


def _case_param(seqlens, dtype, head_dim, causal, tasks, extra_marks=()):
    marks = [harness.tasks(*tasks), *extra_marks]
    if max(seqlens) >= 2048:
        marks.append(LARGE)
    return pytest.param(seqlens, dtype, head_dim, causal, marks=marks,
                        id=f"{seqlen_id(seqlens)}-{dtype_name(dtype)}-d{head_dim}-{mask_name(causal)}")


def run_forward_case(op, rung, seqlens, dtype, head_dim, causal, *, heads=None, scale=None, layout="contiguous",
                     hint, make=make_qkv, what=""):
    """One forward call on fresh inputs (make: make_qkv's signature; `what` says how they differ from its)."""
    batch, heads_q, heads_kv = heads or main_heads(seqlens)
    q, k, v = make(batch, *seqlens, heads_q, heads_kv, head_dim, dtype, layout)
    case = f"{op} of {describe(q, k, causal=causal, scale=scale, layout=layout)}{what}"
    o, lse = forward_op(op, q, k, v, causal, scale, case=case)
    check_forward(o, lse, q, k, v, causal=causal, scale=scale, rung=rung, case=case, hint=hint)


def run_backward_case(seqlens, dtype, head_dim, causal, *, heads=None, scale=None, layout="contiguous",
                      deterministic=False, make=make_qkv, what=""):
    """flash_backward on fresh inputs, with o and lse from PyTorch and the golden (a wrong forward fails its own
    tests, not this one); returns what the check needs to repeat the call."""
    batch, heads_q, heads_kv = heads or main_heads(seqlens)
    q, k, v = make(batch, *seqlens, heads_q, heads_kv, head_dim, dtype, layout)
    grad_o = randn(q.shape, dtype)
    o = attention.same_dtype_attention(q, k, v, causal, scale).contiguous()
    gold = golden(q, k, v, causal, scale, grad_o=grad_o, o=o)
    lse = gold["lse"].float()
    case = f"flash_backward of {describe(q, k, causal=causal, scale=scale, layout=layout)}{what}"
    if deterministic:
        case += ", deterministic=True (dQ by the second pass)"
    grads = backward_op(grad_o, q, k, v, o, lse, causal, scale, case=case, deterministic=deterministic)
    check_backward(grads, grad_o, q, k, v, o, causal=causal, scale=scale, case=case, gold=gold)
    return grads, (grad_o, q, k, v, o, lse), case


# ---------------------------------------------------------------- GPU: rung 1, attention_naive
NAIVE_CASES = ([_case_param(s, dtype, d, causal, ("lab08.1",)) for s in SMALL_SEQLENS[:4]
                for dtype in (FP32, FP16, BF16) for d in (1, 33, 64) for causal in (False, True)]
               + [_case_param((1023, 1024), dtype, 128, True, ("lab08.1",)) for dtype in (FP32, BF16)])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", NAIVE_CASES)
def test_naive(seqlens, dtype, head_dim, causal):
    run_forward_case("attention_naive", "naive", seqlens, dtype, head_dim, causal, hint=NAIVE_HINT)


# ---------------------------------------------------------------- GPU: rung 2, flash_forward_fp32
FP32_CASES = ([_case_param(s, FP32, d, causal, ("lab08.2",)) for s in SMALL_SEQLENS for d in FLASH_HEAD_DIMS
               for causal in (False, True)]
              + [_case_param(BIG_SEQLENS[0], FP32, d, causal, ("lab08.2",)) for d in FLASH_HEAD_DIMS
                 for causal in (False, True)]
              + [_case_param(BIG_SEQLENS[1], FP32, 128, True, ("lab08.2",))])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", FP32_CASES)
def test_flash_fp32(seqlens, dtype, head_dim, causal):
    run_forward_case("flash_forward_fp32", "fp32", seqlens, dtype, head_dim, causal, hint=FP32_HINT)


# ---------------------------------------------------------------- GPU: rung 3, flash_forward
FORWARD_CASES = ([_case_param(s, dtype, d, causal, forward_tasks(s, causal)) for s in SMALL_SEQLENS
                  for dtype in SIXTEEN_BIT for d in FLASH_HEAD_DIMS for causal in (False, True)]
                 + [_case_param(BIG_SEQLENS[0], dtype, d, causal, forward_tasks(BIG_SEQLENS[0], causal))
                    for dtype in SIXTEEN_BIT for d in FLASH_HEAD_DIMS for causal in (False, True)]
                 + [_case_param(BIG_SEQLENS[1], BF16, d, causal, forward_tasks(BIG_SEQLENS[1], causal))
                    for d in FLASH_HEAD_DIMS for causal in (False, True)])


def forward_hint(causal, seqlens):
    return FORWARD_HINT + ("; " + MASK_HINT if causal or seqlens[1] % 128 else "")


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", FORWARD_CASES)
def test_flash_forward(seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", seqlens, dtype, head_dim, causal,
                     hint=forward_hint(causal, seqlens))


# ---------------------------------------------------------------- GPU: rung 4, flash_backward
BACKWARD_CASES = ([_case_param(s, dtype, d, causal, BACKWARD_TASKS) for s in SMALL_SEQLENS for dtype in SIXTEEN_BIT
                   for d in FLASH_HEAD_DIMS for causal in (False, True)]
                  + [_case_param(BIG_SEQLENS[0], BF16, d, causal, BACKWARD_TASKS) for d in FLASH_HEAD_DIMS
                     for causal in (False, True)]
                  + [_case_param(BIG_SEQLENS[1], BF16, 128, causal, BACKWARD_TASKS) for causal in (False, True)])


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal", BACKWARD_CASES)
def test_flash_backward(seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_backward")
    run_backward_case(seqlens, dtype, head_dim, causal)


# ---------------------------------------------------------------- GPU: batch and heads, GQA
# (batch, heads_q, heads_kv): one (batch, head); GQA 8 on 2 (groups of 4, as Llama's); 4 on 1 (multi-query);
# batch x heads = 128 (16 x 8); batch 128 of one head. At two seqlens each: a causal tail case and a noncausal one.
HEADS = [(1, 1, 1), (1, 8, 2), (2, 4, 1), (16, 8, 8), (128, 1, 1)]
HEADS_SEQLENS = [((113, 203), True), ((128, 217), False)]


def heads_id(heads) -> str:
    return f"b{heads[0]}-h{heads[1]}-kv{heads[2]}"


def _heads_params(dtypes, head_dims, tasks_of):
    return [pytest.param(heads, seqlens, dtype, d, causal, marks=harness.tasks(*tasks_of(seqlens, causal)),
                         id=f"{seqlen_id(seqlens)}-{heads_id(heads)}-{dtype_name(dtype)}-d{d}-{mask_name(causal)}")
            for heads in HEADS for seqlens, causal in HEADS_SEQLENS for dtype in dtypes for d in head_dims]


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((FP32,), (33,), lambda s, c: ("lab08.1",)))
def test_naive_heads(heads, seqlens, dtype, head_dim, causal):
    run_forward_case("attention_naive", "naive", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=NAIVE_HINT + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((FP32,), (64,), lambda s, c: ("lab08.2",)))
def test_flash_fp32_heads(heads, seqlens, dtype, head_dim, causal):
    run_forward_case("flash_forward_fp32", "fp32", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=FP32_HINT + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal", _heads_params((BF16,), (64, 128), forward_tasks))
def test_flash_forward_heads(heads, seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", seqlens, dtype, head_dim, causal, heads=heads,
                     hint=forward_hint(causal, seqlens) + "; " + GQA_HINT)


@requires_gpu
@pytest.mark.parametrize("heads, seqlens, dtype, head_dim, causal",
                         _heads_params((BF16,), (64, 128), lambda s, c: BACKWARD_TASKS))
def test_flash_backward_heads(heads, seqlens, dtype, head_dim, causal):
    skip_before_sm80("flash_backward")
    run_backward_case(seqlens, dtype, head_dim, causal, heads=heads)


# ---------------------------------------------------------------- GPU: strided views, the softmax scale
# Each layout of make_qkv, at seqlen 200 (packed QKV needs one length; a tail), causal, MHA and GQA.
STRIDED = [(layout, heads) for layout in LAYOUTS[1:] for heads in ((2, 4, 4), (2, 4, 2))]


def _strided_params(dtype, head_dim, tasks):
    return [pytest.param(layout, heads, dtype, head_dim, marks=harness.tasks(*tasks),
                         id=f"{layout}-{heads_id(heads)}-{dtype_name(dtype)}-d{head_dim}") for layout, heads in STRIDED]


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim", _strided_params(BF16, 40, ("lab08.1",)))
def test_naive_strided(layout, heads, dtype, head_dim):
    run_forward_case("attention_naive", "naive", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=NAIVE_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim", _strided_params(FP32, 64, ("lab08.2",)))
def test_flash_fp32_strided(layout, heads, dtype, head_dim):
    run_forward_case("flash_forward_fp32", "fp32", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=FP32_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim",
                         _strided_params(BF16, 64, forward_tasks((200, 200), True)) +
                         _strided_params(FP16, 128, forward_tasks((200, 200), True)))
def test_flash_forward_strided(layout, heads, dtype, head_dim):
    skip_before_sm80("flash_forward")
    run_forward_case("flash_forward", "forward", (200, 200), dtype, head_dim, True, heads=heads, layout=layout,
                     hint=FORWARD_HINT + "; read q, k and v through their strides (batch, seq, head)")


@requires_gpu
@pytest.mark.parametrize("layout, heads, dtype, head_dim",
                         _strided_params(BF16, 64, BACKWARD_TASKS) + _strided_params(FP16, 128, BACKWARD_TASKS))
def test_flash_backward_strided(layout, heads, dtype, head_dim):
    skip_before_sm80("flash_backward")
    run_backward_case((200, 200), dtype, head_dim, True, heads=heads, layout=layout)


# scale 1.0 (sharper than the default: |s| up to ~30 at d 128, so the max must be subtracted) and 0.05 (flatter).
SCALES = [1.0, 0.05]
SCALE_RUNGS = {
    "attention_naive": ("naive", FP16, 64, ("lab08.1",), NAIVE_HINT),
    "flash_forward_fp32": ("fp32", FP32, 128, ("lab08.2",), FP32_HINT),
    "flash_forward": ("forward", BF16, 128, forward_tasks((113, 203), True), FORWARD_HINT),
    "flash_backward": ("backward", BF16, 128, BACKWARD_TASKS, BACKWARD_HINT),
}


@requires_gpu
@pytest.mark.parametrize("op, scale", [pytest.param(op, scale, marks=harness.tasks(*SCALE_RUNGS[op][3]),
                                                    id=f"{op}-scale{scale:g}")
                                       for op in SCALE_RUNGS for scale in SCALES])
def test_scale(op, scale):
    """The softmax scale passed on (not 1 / sqrt(head_dim)), at 113 x 203, causal."""
    rung, dtype, head_dim, _, hint = SCALE_RUNGS[op]
    if rung in ("forward", "backward"):
        skip_before_sm80(op)
    if op == "flash_backward":
        run_backward_case((113, 203), dtype, head_dim, True, scale=scale)
    else:
        run_forward_case(op, rung, (113, 203), dtype, head_dim, True, scale=scale,
                         hint=hint + "; scale is an argument: S = scale q k^T")


# Scores of about +-1e4 (issue 34, class b): the online softmax subtracts the running max before each exp (exp(89)
# overflows float32, and a row whose scores are all -1e4 underflows to 0 / 0), and the backward's exp(s - lse) is one
# exp, not exp(s) / exp(lse). q and k hold small integers (-4 .. 4, exact in every dtype), so each q . k is an exact
# integer in float32 and, with scale 64 (a power of two), each score exact: two scores tie exactly or differ by 64 or
# more (exp(-64) adds nothing), and what is left to compare is the kernels' own rounding, as with ordinary scores. At
# head_dim 128 a row's largest score is ~1e4 (64 x ~2.7 x 75, the std of q . k).
LARGE_SCORE_SCALE = 64.0
# The float32 rung is held to float32's tolerance (3.5e-5), and the exp2 form of the online softmax (one FMA, s scale
# log2(e) - m scale log2(e), then ex2: the lesson's and FlashAttention's) rounds its argument to float32 first: at
# scores of ~1e4 that is ~1e-3 of absolute error in the exponent, 1e-3 relative in P (the reference, on an H200:
# 700 of 86784 elements of o off by ~1e-3). Scale 0.5 (exact) keeps a row's largest score at ~100-150: past exp's
# float32 range (88.7), so an unshifted exp still overflows, and within the exp2 form's float32 accuracy.
LARGE_SCORE_SCALES = {"flash_forward_fp32": 0.5}


def integer_qk(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout="contiguous"):
    """make_qkv's q, k, v with q and k drawn from the integers -4 .. 4 (v ~ N(0, 1)); contiguous only."""
    q = torch.randint(-4, 5, (batch, seqlen_q, heads_q, head_dim), device="cuda").to(dtype)
    k = torch.randint(-4, 5, (batch, seqlen_k, heads_kv, head_dim), device="cuda").to(dtype)
    return q, k, randn((batch, seqlen_k, heads_kv, head_dim), dtype)


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*SCALE_RUNGS[op][3])) for op in SCALE_RUNGS])
def test_large_scores(op):
    """Every rung at 113 x 203, causal, with scores of up to ~1e4 (exact: integer q and k, scale 64; the float32
    rung up to ~100-150, LARGE_SCORE_SCALES)."""
    rung, dtype, head_dim, _, hint = SCALE_RUNGS[op]
    if rung in ("forward", "backward"):
        skip_before_sm80(op)
    scale = LARGE_SCORE_SCALES.get(op, LARGE_SCORE_SCALE)
    what = f", integer q and k (scores up to ~{scale * 225:.0f})"
    if op == "flash_backward":
        run_backward_case((113, 203), dtype, head_dim, True, scale=scale, make=integer_qk, what=what)
    else:
        run_forward_case(op, rung, (113, 203), dtype, head_dim, True, scale=scale, make=integer_qk,
                         what=what, hint=hint + "; subtract the row's running max before every exp (exp(89) is inf "
                         "in float32), and never compute exp(s) and exp(-m) apart")


# ---------------------------------------------------------------- GPU: empty sizes
EMPTY_SHAPES = {"batch 0": (0, 16, 16), "seqlen_q 0": (2, 0, 16), "seqlen_k 0": (2, 16, 0)}
EMPTY_OPS = {"attention_naive": (FP32, ("lab08.1",)), "flash_forward_fp32": (FP32, ("lab08.2",)),
             "flash_forward": (BF16, ("lab08.3", "lab08.4")), "flash_backward": (BF16, BACKWARD_TASKS)}


@requires_gpu
@pytest.mark.parametrize("op, what", [pytest.param(op, what, marks=harness.tasks(*EMPTY_OPS[op][1]),
                                                   id=f"{op}-{what.replace(' ', '')}")
                                      for op in EMPTY_OPS for what in EMPTY_SHAPES])
def test_empty(op, what):
    """batch 0, seqlen_q 0, seqlen_k 0: no crash, outputs of the right shapes; with no key o = 0 and lse = -inf
    (grad_q = 0); with no query grad_k = grad_v = 0."""
    dtype = EMPTY_OPS[op][0]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    batch, seqlen_q, seqlen_k = EMPTY_SHAPES[what]
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 2, 2, 64, dtype)
    case = f"{op} with {what} ({describe(q, k, causal=True)})"
    if op != "flash_backward":
        o, lse = getattr(LAB.module, op)(q, k, v, causal=True)
        torch.cuda.synchronize()
        check_forward(o, lse, q, k, v, causal=True, scale=None, rung="naive", case=case, hint=LSE_HINT)
        return
    grad_o = randn(q.shape, dtype)
    o = torch.zeros_like(q)
    lse = torch.full((batch, 2, seqlen_q), float("-inf"), device=q.device)
    grads = LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH)
    torch.cuda.synchronize()
    for name, got, like in zip(("grad_q", "grad_k", "grad_v"), grads, (q, k, v)):
        check_placement(got, shape=like.shape, like=like, name=name, case=case)
        if got.numel() and not bool((got == 0).all()):
            raise harness.GradeFailure(f"{case}: {name} must be all zeros (nothing to sum), got "
                                       f"{int((got != 0).sum())} nonzero elements\n  hint: zero grad_k and grad_v "
                                       "(and the float32 dQ accumulator) before any early return")


# ---------------------------------------------------------------- GPU: determinism of the backward
@requires_gpu
@harness.tasks(*BACKWARD_TASKS)
def test_flash_backward_deterministic():
    """grad_k and grad_v are bitwise identical over 10 runs: each key block's dK and dV are summed inside one
    block of the kernel, over the query blocks and the group's query heads in a fixed order. grad_q is NOT: the
    lab adds dQ with float32 atomics, in whatever order the key blocks arrive, and float addition is not
    associative; every run's grad_q must still pass the flash-attention rule."""
    seqlens, heads = (1023, 1024), (2, 8, 2)
    q, k, v = make_qkv(heads[0], *seqlens, heads[1], heads[2], 64, BF16)
    grad_o = randn(q.shape, BF16)
    o = attention.same_dtype_attention(q, k, v, True, None).contiguous()
    gold = golden(q, k, v, True, None, grad_o=grad_o, o=o)
    lse = gold["lse"].float()
    case = f"flash_backward of {describe(q, k, causal=True)}"
    first = backward_op(grad_o, q, k, v, o, lse, True, None, case=case)
    same = attention.same_dtype_backward(grad_o, q, k, v, True, None)
    check_backward(first, grad_o, q, k, v, o, causal=True, scale=None, case=case, same=same, gold=gold)
    with harness.calls.unchecked():  # the first call checked the inputs; nine more host copies are waste
        for run in range(2, 11):
            again = LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH)
            for name, a, b in zip(("grad_k", "grad_v"), first[1:], again[1:]):
                if not torch.equal(a, b):
                    differ = (a != b).nonzero()[0].tolist()
                    raise harness.GradeFailure(
                        f"{case}: {name} of run {run} differs from run 1 in {int((a != b).sum())} elements (the "
                        f"first at batch {differ[0]}, key {differ[1]}, key/value head {differ[2]}, dim {differ[3]}): "
                        "not bitwise identical\n  hint: a key block's dK and dV are summed in registers of ONE "
                        "block, over the query blocks and the group's query heads in a fixed order; no atomics "
                        "for them")
            harness.check.assert_flash_rule(
                again[0], gold["grad_q"], same[0], case=f"{case}: grad_q of run {run}", k=3.0,
                slack=tolerance(FP32, 1024 + 64) * gold["grad_q_terms"])


DETERMINISTIC_CASES = [((113, 203), BF16, 64, True, (2, 3, 3)), ((203, 113), FP16, 128, True, (1, 8, 2)),
                       ((128, 217), BF16, 128, False, (2, 4, 1)), ((1023, 1024), BF16, 64, True, (2, 8, 2))]


@requires_gpu
@pytest.mark.parametrize("seqlens, dtype, head_dim, causal, heads", [
    pytest.param(s, dt, d, c, h, marks=harness.tasks(*BACKWARD_TASKS),
                 id=f"{seqlen_id(s)}-{heads_id(h)}-{dtype_name(dt)}-d{d}-{mask_name(c)}")
    for s, dt, d, c, h in DETERMINISTIC_CASES])
def test_flash_backward_deterministic_mode(seqlens, dtype, head_dim, causal, heads):
    """flash_backward(..., deterministic=True): dQ by a second pass over the key blocks instead of atomics. Right
    (as every backward case), and grad_q, grad_k, grad_v bitwise identical over 3 runs."""
    skip_before_sm80("flash_backward")
    first, args, case = run_backward_case(seqlens, dtype, head_dim, causal, heads=heads, deterministic=True)
    with harness.calls.unchecked():
        for run in (2, 3):
            again = LAB.module.flash_backward(*args, causal=causal, deterministic=True)
            for name, a, b in zip(("grad_q", "grad_k", "grad_v"), first, again):
                if not torch.equal(a, b):
                    raise harness.GradeFailure(
                        f"{case}: {name} of run {run} differs from run 1 in {int((a != b).sum())} elements: not "
                        "bitwise identical\n  hint: with deterministic=True no sum may depend on the order in which "
                        "blocks run: each dQ element summed by one thread, over the key blocks in order")


# ---------------------------------------------------------------- GPU: every op on the current stream
STREAM_OPS = {"attention_naive": (FP16, 33, ("lab08.1",)), "flash_forward_fp32": (FP32, 64, ("lab08.2",)),
              "flash_forward": (BF16, 64, forward_tasks((113, 203), True)),
              "flash_backward": (BF16, 128, BACKWARD_TASKS)}


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*STREAM_OPS[op][2])) for op in STREAM_OPS])
def test_runs_on_current_stream(op):
    """Every kernel, memset and copy of each op runs on PyTorch's current stream: the op is captured in a CUDA graph
    on a side stream and replayed on fresh inputs (harness.STREAM_HINT says why). The backward's fresh input is
    grad_o (q, k, v, o and lse stay, so that lse still belongs to q and k)."""
    dtype, head_dim, _ = STREAM_OPS[op]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    q, k, v = make_qkv(2, 113, 203, 4, 2, head_dim, dtype)
    case = f"{op} of {describe(q, k, causal=True)}, replayed from a CUDA graph"
    if op != "flash_backward":
        o, lse = LAB.capture_on_current_stream(lambda: getattr(LAB.module, op)(q, k, v, causal=True),
                                               inputs=(q, k, v), case=op)
        rung = {"attention_naive": "naive", "flash_forward_fp32": "fp32"}.get(op, "forward")
        check_forward(o, lse, q, k, v, causal=True, scale=None, rung=rung, case=case, hint=harness.STREAM_HINT)
        return
    grad_o = randn(q.shape, dtype)
    o = attention.same_dtype_attention(q, k, v, True, None).contiguous()
    lse = golden(q, k, v, True, None)["lse"].float()
    grads = LAB.capture_on_current_stream(lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True,
                                                                            path=BACKWARD_PATH),
                                          inputs=(grad_o,), case=op)
    check_backward(grads, grad_o, q, k, v, o, causal=True, scale=None, case=case, hint=harness.STREAM_HINT)


# ---------------------------------------------------------------- GPU: past 2^31 elements
# bfloat16 (batch, 128, 8, 128) is exactly 2^31 elements at batch 16384: one batch more puts the last batch's every
# element past 2^31 - 1, where an int offset (b * batch_stride) wraps. Checked: batches 0 and 16384 (all heads and
# rows) against the float64 golden of those batches, with the flash rule. Memory: q, k, v, o 4 GiB each (16 GiB);
# the backward adds grad_o (4), grad_q, grad_k, grad_v (12) and the float32 dQ accumulator (8): 40 GiB, which an
# 80 GB H100 holds (gpu_memory skips on a smaller GPU, saying so).
HUGE = (16385, 128, 8, 128)


def _huge_call(fn, case):
    try:
        out = fn()
        torch.cuda.synchronize()
        return out
    except RuntimeError as error:
        raise harness.GradeFailure(f"{case}: {first_line(error)}\n  hint: {INT64_HINT}") from None


@requires_gpu
@LARGE
@pytest.mark.parametrize("causal", [pytest.param(c, id=mask_name(c), marks=harness.tasks(*forward_tasks((128, 128), c)))
                                    for c in (False, True)])
def test_flash_forward_past_2_31_elements(causal, gpu_memory):
    skip_before_sm80("flash_forward")
    gpu_memory(18)
    batch, seqlen, heads, head_dim = HUGE
    q, k, v = (torch.randn(HUGE, dtype=BF16, device="cuda") for _ in range(3))
    case = (f"flash_forward of q {list(q.shape)} bfloat16 ({q.numel()} elements = 2^31 + {q.numel() - 2**31}), "
            f"{mask_name(causal)}")
    harness.poison_allocator(q.numel(), BF16)
    o, lse = _huge_call(lambda: LAB.module.flash_forward(q, k, v, causal=causal, path=FORWARD_PATH), case)
    check_placement(o, shape=q.shape, like=q, name="o", case=case)
    check_placement(lse, shape=(batch, heads, seqlen), like=q, dtype=FP32, name="lse", case=case)
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        check_forward(o[part], lse[part], q[part], k[part], v[part], causal=causal, scale=None, rung="forward",
                      case=f"{case}: batch {b} (the first element of batch 16384 is element 2^31)", hint=INT64_HINT)


@requires_gpu
@LARGE
@harness.tasks(*BACKWARD_TASKS)
def test_flash_backward_past_2_31_elements(gpu_memory):
    """The backward at the same size, causal: o and lse are PyTorch's (and the golden's) for batches 0 and 16384,
    the ones checked; the other batches get o = 0 and lse = log(128), which only need to be finite."""
    skip_before_sm80("flash_backward")
    gpu_memory(44)
    batch, seqlen, heads, head_dim = HUGE
    q, k, v, grad_o = (torch.randn(HUGE, dtype=BF16, device="cuda") for _ in range(4))
    o = torch.zeros(HUGE, dtype=BF16, device="cuda")
    lse = torch.full((batch, heads, seqlen), math.log(seqlen), dtype=FP32, device="cuda")
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        o[part] = attention.same_dtype_attention(q[part], k[part], v[part], True, None)
        lse[part] = golden(q[part], k[part], v[part], True, None)["lse"].float()
    case = f"flash_backward of q {list(q.shape)} bfloat16 ({q.numel()} elements = 2^31 + {q.numel() - 2**31}), causal"
    harness.poison_allocator(q.numel(), BF16)
    grads = _huge_call(lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH),
                       case)
    for b in (0, batch - 1):
        part = slice(b, b + 1)
        check_backward([g[part] for g in grads], grad_o[part], q[part], k[part], v[part], o[part], causal=True,
                       scale=None, case=f"{case}: batch {b}", hint=INT64_HINT + "; " + BACKWARD_HINT)


# ---------------------------------------------------------------- GPU: no hidden copy, memory O(N)
def _peak_bytes(fn):
    """(result, bytes allocated at the peak of fn() beyond what was allocated before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with harness.calls.unchecked():  # the per-call checks' snapshots are host copies, but keep the count clean
        result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


NO_COPY_OPS = {"flash_forward_fp32": (FP32, ("lab08.2",)), "flash_forward": (BF16, ("lab08.3", "lab08.4")),
               "flash_backward": (BF16, BACKWARD_TASKS)}
MIB = 2**20


@requires_gpu
@pytest.mark.parametrize("op", [pytest.param(op, marks=harness.tasks(*NO_COPY_OPS[op][1])) for op in NO_COPY_OPS])
def test_no_hidden_copy(op):
    """On q, k, v sliced from one packed (batch, seqlen, 3, heads, head_dim) tensor, the op's peak memory is its
    outputs and workspaces (the backward's D and float32 dQ, attention.h) plus 4 MiB: a .contiguous() copy of q, k
    or v (32 MiB each here) would show."""
    dtype = NO_COPY_OPS[op][0]
    if op in ("flash_forward", "flash_backward"):
        skip_before_sm80(op)
    q, k, v = make_qkv(4, 4096, 4096, 8, 8, 128, dtype, "packed-qkv")
    if op == "flash_backward":
        grad_o, o = randn(q.shape, dtype), randn(q.shape, dtype)
        lse = torch.zeros(4, 8, 4096, device="cuda")
        grads, peak = _peak_bytes(
            lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH))
        allowed = sum(nbytes(g) for g in grads) + q.numel() * 4 + _lse_bytes(q)
    else:
        (o, lse), peak = _peak_bytes(lambda: getattr(LAB.module, op)(q, k, v, causal=True))
        allowed = nbytes(o) + nbytes(lse)
    if peak > allowed + 4 * MIB:
        raise harness.GradeFailure(
            f"{op} of q, k, v sliced from one packed {list(q.shape[:2])} x 3 x {list(q.shape[2:])} "
            f"{dtype_name(dtype)} tensor (seq stride {q.stride(1)}): peak memory {peak / MIB:.1f} MiB, but its outputs "
            f"and workspaces are {allowed / MIB:.1f} MiB (each of q, k, v is {nbytes(q) / MIB:.0f} MiB)\n  hint: no "
            ".contiguous() (or .clone()) of the inputs: pass their strides (q.stride(0), q.stride(1), q.stride(2)) "
            "to the kernel and read through them")


@requires_gpu
@LARGE
@harness.tasks("lab08.1", "lab08.3", "lab08.4", *BACKWARD_TASKS)
def test_memory_is_linear_in_seqlen():
    """At seqlen 16384 (one head, d 64, bfloat16) the naive forward's peak memory holds the float32 scores (1 GiB);
    flash_forward's and flash_backward's stay at their outputs and workspaces, O(seqlen): the page's table."""
    skip_before_sm80("flash_forward")
    seqlen = 16384
    q, k, v = make_qkv(1, seqlen, seqlen, 1, 1, 64, BF16)
    _, naive = _peak_bytes(lambda: LAB.module.attention_naive(q, k, v, causal=True))
    (o, lse), forward = _peak_bytes(lambda: LAB.module.flash_forward(q, k, v, causal=True, path=FORWARD_PATH))
    grad_o = randn(q.shape, BF16)
    grads, backward = _peak_bytes(
        lambda: LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=True, path=BACKWARD_PATH))
    linear = 3 * nbytes(q) + q.numel() * 4 + 2 * _lse_bytes(q)  # outputs, dQ accumulator, lse and D
    print(f"peak memory at seqlen {seqlen}: naive {naive / MIB:.1f} MiB, flash forward {forward / MIB:.1f} MiB, "
          f"flash backward {backward / MIB:.1f} MiB")
    scores = seqlen * seqlen * 4
    assert naive >= scores, (f"attention_naive at seqlen {seqlen}: peak {naive / MIB:.1f} MiB, less than its "
                             f"float32 scores ({scores / MIB:.0f} MiB): the baseline is not the one the page describes")
    for what, peak in (("flash_forward", forward), ("flash_backward", backward)):
        if peak > linear + 4 * MIB:
            raise harness.GradeFailure(
                f"{what} at seqlen {seqlen}: peak memory {peak / MIB:.1f} MiB, above the O(seqlen) outputs and "
                f"workspaces ({linear / MIB:.1f} MiB); the naive rung's is {naive / MIB:.0f} MiB\n  hint: S and P "
                "never leave the chip: no (seqlen_q, seqlen_k) buffer, and no copy of the inputs")


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_input_errors():
    q, k, v = make_qkv(2, 64, 80, 4, 2, 64, BF16)
    lse = torch.zeros(2, 4, 64, device="cuda")
    o = torch.zeros_like(q)
    m = LAB.module
    q96, k96 = randn((2, 64, 4, 96), BF16), randn((2, 80, 2, 96), BF16)
    strided_last = randn((2, 64, 4, 128), BF16)[..., ::2]  # head_dim 64 with stride 2
    shifted = torch.zeros(q.numel() + 1, dtype=BF16, device="cuda")[1:].view(q.shape)  # storage offset 1: 2 bytes
    cases = [
        (lambda: m.flash_forward(q, k.half(), v), ("dtype",), "flash_forward(q bfloat16, k float16)"),
        (lambda: m.attention_naive(q, k.float(), v), ("dtype",), "attention_naive(q bfloat16, k float32)"),
        (lambda: m.flash_forward(q.float(), k.float(), v.float()), ("float32", "flash_forward_fp32"),
         "flash_forward(float32 tensors): the tensor-core rung takes float16 and bfloat16"),
        (lambda: m.flash_forward_fp32(q, k, v), ("float32",), "flash_forward_fp32(bfloat16 tensors)"),
        (lambda: m.flash_forward(q96, k96, k96), ("head_dim", "96"), "flash_forward(head_dim 96)"),
        (lambda: m.flash_forward_fp32(q96.float(), k96.float(), k96.float()), ("head_dim", "96"),
         "flash_forward_fp32(head_dim 96)"),
        (lambda: m.flash_backward(q96, q96, k96, k96, q96, lse), ("head_dim", "96"), "flash_backward(head_dim 96)"),
        (lambda: m.flash_forward(q[:, :, :3], k, v), ("heads",), "flash_forward(3 query heads on 2 key/value heads)"),
        (lambda: m.attention_naive(q[:, :, :3], k, v), ("heads",),
         "attention_naive(3 query heads on 2 key/value heads)"),
        (lambda: m.flash_forward(strided_last, k, v), ("stride",), "flash_forward(q with head_dim stride 2)"),
        (lambda: m.attention_naive(strided_last, k, v), ("stride",), "attention_naive(q with head_dim stride 2)"),
        (lambda: m.flash_forward(shifted, k, v), ("align",), "flash_forward(q a view 1 element into its storage)"),
        (lambda: m.flash_backward(o, shifted, k, v, o, lse), ("align",),
         "flash_backward(q a view 1 element into its storage)"),
        (lambda: m.flash_forward(q, k, v[:, :40]), ("shape",), "flash_forward(k [2, 80, 2, 64], v [2, 40, 2, 64])"),
        (lambda: m.flash_forward(q, k[:1], v[:1]), ("batch",), "flash_forward(q batch 2, k and v batch 1)"),
        (lambda: m.flash_backward(o, q, k, v, o, lse[:, :, :32]), ("lse", "shape"),
         "flash_backward(lse [2, 4, 32] for q [2, 64, 4, 64])"),
        (lambda: m.flash_backward(o, q, k, v, o, lse.double()), ("lse", "float32"), "flash_backward(lse float64)"),
        (lambda: m.flash_backward(o[:, :32], q, k, v, o, lse), ("grad_o", "shape"),
         "flash_backward(grad_o [2, 32, 4, 64] for q [2, 64, 4, 64])"),
        (lambda: m.flash_backward(o, q, k, v, o.cpu(), lse), ("CUDA",), "flash_backward(o on the CPU)"),
    ]
    for fn, words, what in cases:
        LAB.assert_raises_clearly(fn, must_mention=words, case=what)


@requires_gpu
@harness.reference_check  # the capability check is given
def test_tensor_core_rungs_refused_before_sm80():
    if torch.cuda.get_device_capability()[0] >= 8:
        pytest.skip("this GPU has compute capability 8.0+; the refusal only applies before sm_80")
    q, k, v = make_qkv(1, 16, 16, 1, 1, 64, FP16)
    LAB.assert_raises_clearly(lambda: LAB.module.flash_forward(q, k, v), must_mention=("8.0",),
                              case="flash_forward on a GPU before sm_80")


# ---------------------------------------------------------------- GPU: through autograd (autograd.py, lab08.9)
AUTOGRAD_CASES = [((128, 217), False, (2, 4, 2), 64), ((128, 217), True, (2, 4, 2), 128),
                  ((203, 113), True, (1, 8, 2), 64)]


@requires_gpu
@pytest.mark.parametrize("seqlens, causal, heads, head_dim", [
    pytest.param(s, c, h, d, id=f"{seqlen_id(s)}-{mask_name(c)}-{heads_id(h)}-d{d}",
                 marks=harness.tasks(*forward_tasks(s, c), *BACKWARD_TASKS, "lab08.9"))
    for s, c, h, d in AUTOGRAD_CASES])
def test_autograd(seqlens, causal, heads, head_dim):
    """loss.backward() through autograd.flash_attention(q, k, v, causal, scale, ops=lab): o against the float64 golden,
    the gradients against float64 autograd of the formula (the flash rule against PyTorch's own bfloat16 attention's
    autograd); and the gradients equal what the ops give when called directly (grad_k, grad_v bitwise; grad_q within
    the rule: its atomics add in any order)."""
    skip_before_sm80("flash_attention")
    module = autograd_module()
    scale = 0.1
    batch, heads_q, heads_kv = heads
    q, k, v = make_qkv(batch, *seqlens, heads_q, heads_kv, head_dim, BF16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    weight = randn(q.shape, BF16)
    case = f"autograd.flash_attention of {describe(q, k, causal=causal, scale=scale)}"
    o = _student(f"{case}: forward", lambda: module.flash_attention(*leaves, causal, scale, ops=LAB.module))
    if not isinstance(o, torch.Tensor) or o.grad_fn is None:
        raise harness.GradeFailure(f"{case}: the output is not a tensor connected to q, k, v (no grad_fn)\n  hint: "
                                   + AUTOGRAD_HINT)
    gold = golden(q, k, v, causal, scale, grad_o=weight)
    check_forward(o.detach(), LAB.module.flash_forward(q, k, v, causal=causal, scale=scale)[1], q, k, v,
                  causal=causal, scale=scale, rung="forward", case=f"{case}: o", hint=AUTOGRAD_HINT, gold=gold)
    _student(f"{case}: (o * w).sum().backward()", lambda: (o * weight).sum().backward())
    grads = [leaf.grad for leaf in leaves]
    if any(g is None for g in grads):
        raise harness.GradeFailure(f"{case}: backward left a gradient None\n  hint: {AUTOGRAD_HINT}")
    check_backward(grads, weight, q, k, v, None, causal=causal, scale=scale, case=f"{case}: loss.backward()",
                   hint=BACKWARD_HINT + "; " + AUTOGRAD_HINT, gold=gold)
    direct_o, direct_lse = LAB.module.flash_forward(q, k, v, causal=causal, scale=scale)
    direct = LAB.module.flash_backward(weight, q, k, v, direct_o, direct_lse, causal=causal, scale=scale)
    for name, got, want in zip(("grad_k", "grad_v"), grads[1:], direct[1:]):
        if not torch.equal(got, want):
            raise harness.GradeFailure(f"{case}: {name} from loss.backward() differs from ops.flash_backward called "
                                       f"directly on the same inputs\n  hint: {AUTOGRAD_HINT}")



# ---------------------------------------------------------------- GPU: speed
# FLOPs: the forward's two products, 4 x batch x heads x head_dim x (the visible (query, key) pairs: seqlen^2, or
# seqlen (seqlen + 1) / 2 causal); the backward's five, 2.5x the forward's (FlashAttention-2's count). Baselines,
# each SDPA backend named and chosen with torch.nn.attention.sdpa_kernel: FLASH_ATTENTION (FlashAttention-2) for
# the bfloat16 forward and backward; the default choice (cuDNN on Hopper with torch 2.11: issue 14) reported
# without a bar; EFFICIENT_ATTENTION for float32 (FLASH_ATTENTION takes no float32). SDPA gets the same
# (batch, seqlen, heads, head_dim) tensors, transposed: the layout FlashAttention-2 reads natively, no copy.
# (reference target, student bar). Targets: issue 14 and SYLLABUS §5. Student bars are PROVISIONAL until measured
# on the GPU box (issue 11, class 6: a straightforward correct kernel must pass them, one without the lesson's
# technique must not): forward 0.5x FlashAttention-2 (a tensor-core kernel without cp.async pipelining or with
# bank-conflicted ldmatrix loses about half), backward 0.35x, float32 0.25x of SDPA's efficient float32.
# A bar of 0 is a figure reported with no bar (the ratio to SDPA's default backend).
PERF_SHAPES = [(8, 16, s, d) for s in (2048, 4096) for d in (64, 128)]
PERF_BARS = {
    "flash_forward vs SDPA FLASH_ATTENTION": (0.90, 0.50),
    "flash_forward vs SDPA default backend (no bar)": (0.0, 0.0),
    "flash_backward vs SDPA FLASH_ATTENTION backward": (0.70, 0.35),
    "flash_forward_fp32 vs SDPA EFFICIENT_ATTENTION float32": (0.50, 0.25),
}
PERF_HINTS = {
    "flash_forward vs SDPA FLASH_ATTENTION": (
        "Q fragments resident in registers, K and V double-buffered with cp.async so the next block's copies overlap "
        "this block's mma, swizzled shared memory (ldmatrix without bank conflicts), P kept in registers as the "
        "next product's A fragments, causal blocks skipped (not masked)"),
    "flash_forward vs SDPA default backend (no bar)": "reported only",
    "flash_backward vs SDPA FLASH_ATTENTION backward": (
        "P recomputed from lse (not from a second softmax), dK and dV in registers across the query blocks, dQ added "
        "with float32 atomics (one per element per key block), causal query blocks before the key block skipped"),
    "flash_forward_fp32 vs SDPA EFFICIENT_ATTENTION float32": (
        "register blocking of both products (lesson 04): each thread a few rows x a few keys of S, K and V tiles in "
        "shared memory read as float4"),
}


def perf_id(shape, causal):
    return f"{shape[0]}x{shape[1]}x{shape[2]}-d{shape[3]}-{mask_name(causal)}"


def attention_flops(shape, causal, backward=False) -> int:
    batch, heads, seqlen, head_dim = shape
    pairs = seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen
    flops = 4 * batch * heads * head_dim * pairs
    return int(flops * 2.5) if backward else flops


def _sdpa(backend=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend is None:
        return lambda fn: fn()

    def run(fn):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return fn()

    return run


def _perf_inputs(shape, dtype):
    batch, heads, seqlen, head_dim = shape
    return make_qkv(batch, seqlen, seqlen, heads, heads, head_dim, dtype)


def _timed_slices(q):
    """(batch index, the index of the batch and 2 heads): the first and the last such slice of a (batch, seqlen, heads,
    head_dim) tensor, where the timed calls' results are checked."""
    heads = q.shape[2]
    return [(b, (slice(b, b + 1), slice(None), hs)) for b, hs in ((0, slice(0, 2)),
                                                                   (q.shape[0] - 1, slice(heads - 2, heads)))]


def _verify_slices(o, lse, q, k, v, causal, rung, what):
    """The timed calls' output, checked on the first and last (batch, 2 heads): a kernel fast because it skips work
    fails here. The whole outputs' placement first; then each slice as a contiguous copy (a slice of heads is a
    strided view, which check_forward's placement check would refuse)."""
    case = f"{what}: the timed calls' output"
    check_placement(o, shape=q.shape, like=q, name="o", case=case)
    check_placement(lse, shape=(q.shape[0], q.shape[2], q.shape[1]), like=q, dtype=FP32, name="lse", case=case,
                    hint=LSE_PLACEMENT_HINT)
    for b, part in _timed_slices(q):
        check_forward(o[part].contiguous(), lse[part[0], part[2]].contiguous(), q[part], k[part], v[part],
                      causal=causal, scale=None, rung=rung, case=f"{case}, batch {b}", hint=FORWARD_HINT)


def _perf(kind, *, shape, causal, ours, baseline, baseline_name, flops, verify, inputs):
    target, student_bar = PERF_BARS[kind]
    try:
        return LAB.perf(name=f"{kind}, {perf_id(shape, causal)}", ours=ours, baseline=baseline,
                        baseline_name=baseline_name, flops=flops, student_bar=student_bar, target=target, verify=verify,
                        inputs=inputs)
    except harness.GradeFailure as failure:
        raise harness.GradeFailure(f"{failure}\n  hint: {PERF_HINTS[kind]}") from None


def _forward_perf(kind, shape, causal, backend):
    skip_before_sm80("flash_forward")
    q, k, v = _perf_inputs(shape, BF16)
    last = {}

    def ours():
        last["out"] = LAB.module.flash_forward(q, k, v, causal=causal, path=FORWARD_PATH)

    sdpa = _sdpa(backend)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def baseline():
        sdpa(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))

    _perf(kind, shape=shape, causal=causal, ours=ours, baseline=baseline,
          baseline_name=f"F.scaled_dot_product_attention, {backend or 'default'} backend",
          flops=attention_flops(shape, causal),
          verify=lambda: _verify_slices(*last["out"], q, k, v, causal, "forward", kind), inputs=(q, k, v))


PERF_PARAMS = [pytest.param(shape, causal, id=perf_id(shape, causal)) for shape in PERF_SHAPES
               for causal in (False, True)]


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("shape, causal", PERF_PARAMS)
@harness.tasks("lab08.3", "lab08.4", "lab08.5")
def test_perf_flash_forward_vs_flash_attention(shape, causal):
    _forward_perf("flash_forward vs SDPA FLASH_ATTENTION", shape, causal, "FLASH_ATTENTION")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("shape, causal", PERF_PARAMS)
@harness.tasks("lab08.3", "lab08.4", "lab08.5")
def test_perf_flash_forward_vs_sdpa_default(shape, causal):
    """Reported in the bench JSON, no bar: SDPA's default backend (cuDNN on Hopper) is faster than
    FlashAttention-2 there (issue 14: 458-628 TFLOP/s at d 64 and 128 on an H100)."""
    _forward_perf("flash_forward vs SDPA default backend (no bar)", shape, causal, None)


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("shape, causal", PERF_PARAMS)
@harness.tasks(*BACKWARD_TASKS)
def test_perf_flash_backward_vs_flash_attention(shape, causal):
    skip_before_sm80("flash_backward")
    q, k, v = _perf_inputs(shape, BF16)
    grad_o = randn(q.shape, BF16)
    o, lse = LAB.module.flash_forward(q, k, v, causal=causal)
    last = {}

    def ours():
        last["grads"] = LAB.module.flash_backward(grad_o, q, k, v, o, lse, causal=causal, path=BACKWARD_PATH)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = _sdpa("FLASH_ATTENTION")(lambda: F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in leaves), is_causal=causal))
    grad_t = grad_o.transpose(1, 2)

    def baseline():
        torch.autograd.grad(out, leaves, grad_t, retain_graph=True)

    def verify():
        case = f"flash_backward {perf_id(shape, causal)}: the timed calls' gradients"
        for name, got, like in zip(("grad_q", "grad_k", "grad_v"), last["grads"], (q, k, v)):
            check_placement(got, shape=like.shape, like=like, name=name, case=case)
        for b, part in _timed_slices(q):
            check_backward([g[part].contiguous() for g in last["grads"]], grad_o[part], q[part], k[part], v[part],
                           o[part], causal=causal, scale=None, case=f"{case}, batch {b}")

    _perf("flash_backward vs SDPA FLASH_ATTENTION backward", shape=shape, causal=causal, ours=ours, baseline=baseline,
          baseline_name="F.scaled_dot_product_attention's backward, FLASH_ATTENTION backend",
          flops=attention_flops(shape, causal, backward=True), verify=verify,
          inputs=(grad_o,))  # not q, k, v: o and lse were computed from them


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("shape, causal", [pytest.param(s, c, id=perf_id(s, c)) for s in PERF_SHAPES[:2]
                                           for c in (False, True)])
@harness.tasks("lab08.2")
def test_perf_flash_fp32_vs_sdpa_fp32(shape, causal):
    q, k, v = _perf_inputs(shape, FP32)
    last = {}

    def ours():
        last["out"] = LAB.module.flash_forward_fp32(q, k, v, causal=causal)

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa = _sdpa("EFFICIENT_ATTENTION")

    def baseline():
        sdpa(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))

    _perf("flash_forward_fp32 vs SDPA EFFICIENT_ATTENTION float32", shape=shape, causal=causal, ours=ours,
          baseline=baseline, baseline_name="F.scaled_dot_product_attention in float32, EFFICIENT_ATTENTION backend",
          flops=attention_flops(shape, causal),
          verify=lambda: _verify_slices(*last["out"], q, k, v, causal, "fp32", "flash_forward_fp32"), inputs=(q, k, v))


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
    # top) was tried first and passed every case on an H200 (2026-11-26, tools/gpu/NOTES.md): K_0 is issued just
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
