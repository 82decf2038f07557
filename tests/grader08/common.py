"""What the parts of lab 08's grader share: dtypes, the hints, small helpers, the checks of o, lse and the
gradients against the float64 golden (their tolerances derived below), the calls of the ops with their outputs
guarded, and the GPU cases' shapes and runners.

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

import os

import pytest
import torch

import harness
from coursekit import jit
from harness import attention, tolerance
from harness.attention import LAYOUTS, blind_rows, describe, golden, make_qkv, randn
from harness.check import check_placement, dtype_name, nbytes, run_student

LAB = harness.lab("08")
FP32, FP16, BF16, FP64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
SIXTEEN_BIT = (FP16, BF16)
LARGE = pytest.mark.large  # too big for compute-sanitizer (./course sanitize skips it)
REDUCTION_HEADROOM = 4.0  # see the docstring
FLASH_HEAD_DIMS = (64, 128)


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
    if jit.capability()[0] < 8:
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


def _model_inputs(seqlen_q, seqlen_k, heads, head_dim=16, batch=2):
    g = torch.Generator().manual_seed(seqlen_q * 1000 + seqlen_k)
    hq, hkv = heads
    return tuple(torch.randn(batch, s, h, head_dim, dtype=FP64, generator=g)
                 for s, h in ((seqlen_q, hq), (seqlen_k, hkv), (seqlen_k, hkv), (seqlen_q, hq)))


def _student(what: str, fn):
    return run_student(what, fn, hint=AUTOGRAD_HINT)


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


# ---------------------------------------------------------------- GPU: the shapes of every rung
# (seqlen_q, seqlen_k): one of each (the one-element case); tails on both sides (113, 203: neither a multiple of 16);
# a whole query block against a key tail (128, 217); seqlen_q > seqlen_k (203, 113: causal rows 0 .. 89 see no key);
# one past a power of two (1023, 1024: the last query block is one row short); long rows (2048, 4224 = 33 x 128:
# many key blocks, the online rescale at every one). The long ones are LARGE (compute-sanitizer skips them) and
# run on fewer dtype combinations.
SMALL_SEQLENS = [(1, 1), (113, 203), (128, 217), (203, 113), (1023, 1024)]
BIG_SEQLENS = [(2048, 2048), (4224, 4224)]
MAIN_HEADS = (2, 3, 3)  # batch, heads_q, heads_kv: an odd head count; (1, 2, 2) for the big seqlens
# The case lists of heads.py and strides_scale.py (tools/gpu/probe/lab08_hopper*.py run the Hopper paths
# over these lists too).
# (batch, heads_q, heads_kv): one (batch, head); GQA 8 on 2 (groups of 4, as Llama's); 4 on 1 (multi-query);
# batch x heads = 128 (16 x 8); batch 128 of one head. At two seqlens each: a causal tail case and a noncausal one.
HEADS = [(1, 1, 1), (1, 8, 2), (2, 4, 1), (16, 8, 8), (128, 1, 1)]
HEADS_SEQLENS = [((113, 203), True), ((128, 217), False)]
# Each layout of make_qkv, at seqlen 200 (packed QKV needs one length; a tail), causal, MHA and GQA.
STRIDED = [(layout, heads) for layout in LAYOUTS[1:] for heads in ((2, 4, 4), (2, 4, 2))]
# scale 1.0 (sharper than the default: |s| up to ~30 at d 128, so the max must be subtracted) and 0.05 (flatter).
SCALES = [1.0, 0.05]


def seqlen_id(seqlens) -> str:
    return f"{seqlens[0]}x{seqlens[1]}"


def main_heads(seqlens):
    return MAIN_HEADS if max(seqlens) <= 1024 else (1, 2, 2)


def heads_id(heads) -> str:
    return f"b{heads[0]}-h{heads[1]}-kv{heads[2]}"


def forward_tasks(seqlens, causal):
    """Rung 3's tasks for a case: S (lab08.3) and the online softmax (lab08.4) always; the masks and skipping
    (lab08.5) where a block is masked: causal, or a key tail (seqlen_k not a multiple of 128, the largest key block
    the spec allows)."""
    return ("lab08.3", "lab08.4", "lab08.5") if causal or seqlens[1] % 128 else ("lab08.3", "lab08.4")


def forward_hint(causal, seqlens):
    return FORWARD_HINT + ("; " + MASK_HINT if causal or seqlens[1] % 128 else "")


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
