"""What the parts of lab 07's grader share: the dtypes and the spec's row lengths, the failure hints, the
tolerances, the float64 references and the checks against them, the ops called with their outputs from a poisoned
pool, the inputs, and the GPU cases' shapes and paths with the tasks each grades.

Tolerances, derived. Every reference is float64, computed from the SAME (already rounded) inputs, so input
rounding cancels and what remains is the kernel's own arithmetic:
  - every output depends on a length-n reduction of its row (the max and the sum of exps, the sum of squares,
    a row dot): float32 (float64 for float64) additions whose rounding errors grow like sqrt(n) when they are
    independent, which is harness.tolerance(accumulator, n), the house rule; then an exp (expf: 2 ulps), an
    rsqrt (2 ulps) and a few products, each rounding once. REDUCTION_HEADROOM (4) covers those ulps:
    tolerance(float32, 7) x 4 is 5.1e-6 (85 ulps), tolerance(float32, 4097) x 4 is 1.2e-4, while the errors
    of the wrong formulas graded here are larger by far: a mean over the slots a row's threads hold (1024 for
    n = 1000) moves rstd by 1.2%, eps outside the root by up to 40% where eps matters, a lost batch of a
    streamed row leaves elements unwritten.
    16-bit outputs add ONE rounding to the dtype on the store (2^-9 or 2^-12 relative, against float's 2^-24
    a step), harness.tolerance(dtype), which dominates; the flash-attention rule (SYLLABUS §4) then bounds
    the worst error by k x PyTorch's own 16-bit error (k = 2 forward, 3 gradients), which catches a
    systematic error (a sum of squares accumulated in 16 bits, an intermediate rounded) that the
    per-element tolerance lets through.
  - rstd (float32 for 16-bit and float32 inputs, float64 for float64) is checked on its own against
    float64 with the float tolerance alone: a 16-bit x widens to float exactly, so only the float sum of
    squares and the rsqrt round. A sum of squares accumulated in 16 bits, a mean over the wrong length or
    eps outside the root miss it by far.
  - grad_weight (a column sum over `rows` rows of grad_y * x * rstd): tolerance(accumulator, rows) x the
    headroom plus the row tolerance of its terms. A column sum of random-signed terms can be near zero;
    assert_close's floor at the rms of grad_weight (which grows like sqrt(rows), as the accumulated error
    does) keeps that from failing a right one, while a lost block of partials (terms the size of the sum
    itself) still misses by far.
  - Softmax of a fully -inf row: torch.softmax gives NaN for every element (exp(-inf - (-inf)) = exp(NaN));
    the grader requires the same NaN (test_softmax_special_values, 'all -inf row'), so that a masked-out
    row behaves as it does in PyTorch. Every other row of that input must be finite and right.
Outputs the wrapper allocates come from a poisoned pool (harness.check.PoisonedPool): an unwritten element
reads NaN, and bytes written past an output's end (into the allocator's slack) fail the test. Inputs are
checked unchanged after every call (harness.calls, through LAB.module).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import tolerance
from harness.check import check_placement, column_sum, dtype_name, nbytes, shape_id

LAB = harness.lab("07")
FP32, FP16, BF16, FP64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
DTYPES = [FP32, FP16, BF16, FP64]
SIXTEEN_BIT = (FP16, BF16)
TRITON_DTYPES = [FP32, FP16, BF16]  # triton_rms_norm.py leaves float64 to the CUDA extension
LARGE = pytest.mark.large  # too big for compute-sanitizer (./course sanitize skips it)
REDUCTION_HEADROOM = 4.0  # see the docstring
EPS = 1e-6  # the ops' default eps, as torch.nn.RMSNorm's

# The spec's longest register row (normalization.h, max_register_row<T>(): 256 threads x 128 bytes of the compute
# type a thread: 8192 elements for float, half and bfloat16, 4096 for double). Used only at collection, to decide
# which path a parametrized case takes and which task it grades; the tests read the lab's constants() for the rest.
SPEC_MAX_REGISTER_ROW = {FP32: 8192, FP16: 8192, BF16: 8192, FP64: 4096}
# The on-chip path's longest rows at their largest (normalization.h: max_on_chip_forward_row, 1024 threads x (32 + 32)
# floats or (16 + 16) doubles, none for 16-bit; max_on_chip_backward_row, 4 blocks x 1024 threads x 16 floats or 8
# doubles): which cases force path='on_chip' at collection. Whether this GPU takes a row, the tests ask the lab at run
# time (on_chip_row: shared memory, clusters) and skip a forced case it does not.
SPEC_MAX_ON_CHIP_ROW = {False: {FP32: 65536, FP16: 0, BF16: 0, FP64: 32768},
                        True: {FP32: 65536, FP16: 65536, BF16: 65536, FP64: 32768}}

SOFTMAX_REGISTERS_HINT = (
    "the register path (lab07.1): the row's max over all the threads of the row (row_all_reduce with MaxOp), "
    "each value replaced by exp(value - max), their sum over the row (row_all_reduce with SumOp), each value "
    "times 1 / sum; in float (double for float64). A NaN is an element never written, or exp of a value not "
    "shifted by the max (exp(1e4) = inf, and inf / inf = NaN)")
SOFTMAX_STREAMING_HINT = (
    "the streaming path (lab07.2): pass 1 folds each value v into the thread's (m, s) with m' = max(m, v), "
    "s' = s * exp(m - m') + exp(v - m') (shifted_exp: 0 for -inf), then merges the block's pairs (MergeMaxSum: "
    "m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)); pass 2 writes exp(x - m) / s. Every pack of the row "
    "is visited in both passes, the last partial batch too; a NaN is an element never written")
SOFTMAX_ON_CHIP_HINT = (
    "the on-chip path (given code) merges the threads' pairs (m_t, s_t = sum of exp(x - m_t)) over the block with "
    "your MergeMaxSum (lab07.2): m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m), with shifted_exp so that a "
    "thread whose elements are all -inf (m_t = -inf) adds nothing instead of NaN; the streaming path's own cases "
    "test the rest of lab07.2")
SOFTMAX_BACKWARD_ON_CHIP_HINT = (
    "the on-chip backward is given code (sm_90: a cluster of 4 blocks a row, each block's part of dot(grad_y, y) "
    "read by all four through distributed shared memory): no TODO of yours runs in it. If it fails on the "
    "reference solution too, report it with this message")
SOFTMAX_BACKWARD_HINT = (
    "softmax backward (lab07.3): grad_x = y * (grad_y - d) with d = sum(grad_y * y) over the row (one all-reduce "
    "over the row's threads, or pass 1 of the streaming kernel), in float; every element of grad_x written")
RMS_NORM_HINT = (
    "RMSNorm (lab07.4): rstd = 1 / sqrt(sum(x^2) / n + eps), the sum over the row's n elements divided by n (not by "
    "the slots the threads hold), eps inside the root, in float; rstd[row] stored once a row; y = (x * rstd) * "
    "weight[col], rounded once")
RSTD_HINT = ("rstd[row] = 1 / sqrt(mean(x[row]^2) + eps): the squares summed in float (not in 16 bits), divided by "
             "the row's length n, eps inside the square root (1 / (sqrt(ms) + eps) is a different number); "
             + RMS_NORM_HINT)
RMS_BACKWARD_HINT = (
    "RMSNorm backward (lab07.5): with g = weight * grad_y, grad_x = rstd * g - rstd^3 * x * mean(g * x), the mean "
    "over the row's n elements; in float, rounded once; every element of grad_x written")
GRAD_WEIGHT_HINT = (
    "grad_weight[c] = the sum over every row of grad_y * x * rstd (lab07.5, lab07.6): each block sums its own rows "
    "(its warps' sums combined through shared memory, a __syncthreads() between their stores and the reads) into "
    "its own row of partials, and the finalize adds partials[k, c] for every k = 0 .. chunks - 1, in that order, "
    "rounding once at the store")
FLASH_HINT = ("further from the exact result than PyTorch's own {dtype} path: a sum (of exps, of squares, a row "
              "dot) accumulated in 16 bits, an intermediate rounded to 16 bits, or a formula slightly off")
AUTOGRAD_HINT = (
    "autograd.py (lab07.7): Softmax.forward: y = ops.softmax(x), save y; backward: "
    "ops.softmax_backward(grad_y.contiguous(), y) -> (grad_x, None). RMSNorm.forward: y, rstd = ops.rms_norm(x, "
    "weight, eps), save x, weight and rstd, return y; backward: ops.rms_norm_backward(grad_y.contiguous(), x, weight, "
    "rstd) -> (grad_x, grad_weight, None, None): one gradient per input of forward, in their order")
TRITON_HINT = (
    "triton_rms_norm.py: forward (lab07.8): rows of x as float32, the sum of squares with tl.sum over the row "
    "(masked lanes loaded as 0), rstd = rsqrt(sum / N + eps), y = x * rstd * w stored in y's dtype; backward "
    "(lab07.9): dx = rstd * (w dy) - rstd^3 x mean(w dy x), and each program's float32 partial of grad_weight, "
    "added in program order by the finalize. Rows longer than the register path take the given chunked branches")
INT64_HINT = ("index with int64_t: rows * n passes 2^31 here, and a row offset (row * n) or an element index kept "
              "in an int wraps")


def constants() -> dict:
    """The numbers the kernels are built with (normalization.h's NormConstants), from the lab itself: read inside
    the tests, so a lab that does not build fails each test, not the import."""
    return LAB.module.constants()


def autograd_module():
    """The graded tree's autograd.py (lab07.7), imported fresh (a syntax error there fails the tests that use it)."""
    return LAB.python("autograd")


def triton_module():
    """The graded tree's triton_rms_norm.py (lab07.8, lab07.9): importing it registers torch.ops.course07.*."""
    return LAB.python("triton_rms_norm")


def accumulator(dtype):
    return FP64 if dtype == FP64 else FP32


def large_marks(shape) -> list:
    return [LARGE] if math.prod(shape) >= 2**24 else []


def max_register_row(dtype) -> int:
    """The longest row path='registers' takes for this dtype: constants()['max_register_row'] (by element size)
    where the lab gives it, else the spec's."""
    by_size = constants().get("max_register_row")
    if isinstance(by_size, dict):
        size = torch.empty((), dtype=dtype).element_size()
        for key in (size, str(size), dtype_name(dtype)):
            if key in by_size:
                return int(by_size[key])
    return SPEC_MAX_REGISTER_ROW[dtype]


def spec_path(n: int, dtype, path: str) -> str:
    """The path a call takes, decided at collection from the spec: 'registers', or past the register path 'on_chip'
    or 'streaming' (both of whose softmax forwards use lab07.2's merge). 'auto' there is 'streaming' here: which of
    the two runs is the GPU's to say (taken_path)."""
    if path == "auto":
        return "registers" if n <= SPEC_MAX_REGISTER_ROW[dtype] else "streaming"
    return path


def on_chip_row(dtype, backward: bool) -> int:
    """The longest row softmax's path='on_chip' takes on this GPU for this dtype (0: none), from the lab."""
    size = torch.empty((), dtype=dtype).element_size()
    return int(LAB.module.on_chip_row(size, backward)) if hasattr(LAB.module, "on_chip_row") else 0


def taken_path(what: str, n: int, dtype, path: str) -> str:
    """The path a call of op `what` takes on this GPU: 'auto' resolved as the launchers resolve it."""
    if path != "auto":
        return path
    if n <= max_register_row(dtype):
        return "registers"
    if what.startswith("softmax") and n <= on_chip_row(dtype, what.startswith("softmax_backward")):
        return "on_chip"
    return "streaming"


def require_on_chip(what: str, n: int, dtype) -> None:
    """Skip a case that forces path='on_chip' on a row this GPU's on-chip path does not take (the GPU's shared
    memory, no clusters before sm_90): the refusal itself is test_on_chip_refused_where_it_does_not_run's."""
    backward = what.startswith("softmax_backward")
    longest = on_chip_row(dtype, backward)
    if n > longest:
        where = f"up to {longest} elements" if longest else "no rows"
        pytest.skip(f"{what}: the on-chip path takes {where} of {dtype_name(dtype)} on this GPU "
                    f"({torch.cuda.get_device_name()}), and this case has rows of {n}")


def path_words(n: int, dtype, path: str, aligned: bool = True, what: str = "softmax") -> str:
    """What a case runs, for its failure message: the path, a warp or a block per row, the load width."""
    c = constants()
    taken = taken_path(what, n, dtype, path)
    if taken == "registers":
        longest_warp_row = max_register_row(dtype) * c["warp_size"] // c["threads_per_block"]
        who = "one warp per row" if n <= longest_warp_row else "one block per row"
        text = f"the register path, {who}"
    elif taken == "on_chip" and what.startswith("softmax_backward"):
        text = (f"the on-chip path, a cluster of {c.get('cluster_blocks', 4)} blocks of "
                f"{c.get('on_chip_threads', 1024)} threads per row")
    elif taken == "on_chip":
        text = f"the on-chip path, one block of {c.get('on_chip_threads', 1024)} threads per row"
    else:
        text = f"the streaming path, {c.get('stream_threads', 1024)} threads per row"
    vector = c["vector_bytes"] // torch.empty((), dtype=dtype).element_size()
    text += ", 16-byte loads" if aligned and n % vector == 0 else ", scalar loads"
    return ("path='auto': " if path == "auto" else "") + text


def row_tol(dtype, n: int) -> float:
    """An output computed from its row's length-n reduction (see the docstring)."""
    tol = tolerance(accumulator(dtype), n) * REDUCTION_HEADROOM
    return tol + tolerance(dtype) if dtype in SIXTEEN_BIT else tol


def rstd_tol(dtype, n: int) -> float:
    return tolerance(accumulator(dtype), n) * REDUCTION_HEADROOM


def grad_weight_tol(dtype, rows: int, n: int) -> float:
    return tolerance(accumulator(dtype), rows) * REDUCTION_HEADROOM + row_tol(dtype, n)


def rows_of(shape) -> int:
    return math.prod(shape[:-1])


# ---------------------------------------------------------------- references
def golden_softmax(x):
    return torch.softmax(x.double(), -1)


def golden_softmax_backward(grad_y, y):
    """float64 of grad_x = y * (grad_y - sum(grad_y * y)): the softmax's backward at the x whose softmax is y."""
    g, y64 = grad_y.double(), y.double()
    return y64 * (g - (g * y64).sum(-1, keepdim=True))


def softmax_backward_terms(grad_y, y):
    """float64 |y| * (|grad_y| + sum |grad_y * y|), per element: the size of the terms grad_x is computed from.
    Where y is one-hot to float precision (a row of large values), grad_y - d cancels at the row's max to about 0
    in float64 while any float32 kernel, PyTorch's own among them, keeps a few ulps of these terms there (measured
    on an H200: 'got 0, expected 1.6e-11' at a row's max); the checks allow for that rounding and no more."""
    g, y64 = grad_y.double().abs(), y.double().abs()
    return y64 * (g + (g * y64).sum(-1, keepdim=True))


def same_softmax_backward(grad_y, y):
    """PyTorch's own softmax backward in the inputs' dtype: the flash rule's yardstick."""
    return torch._softmax_backward_data(grad_y, y, -1, y.dtype)


def golden_rms_norm(x, weight, eps):
    """float64 (y, rstd) of y = x * rsqrt(mean(x^2) + eps) * weight."""
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1) + eps)
    return x64 * rstd.unsqueeze(-1) * weight.double(), rstd


def rms_norm_composition(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def golden_rms_norm_backward(grad_y, x, weight, eps):
    """float64 (grad_x, grad_weight) of the composition x * rsqrt(mean(x^2) + eps) * weight: grad_x by autograd,
    grad_weight = the column sums of grad_y x rstd (column_sum: autograd's own is one torch.sum over the rows)."""
    x64 = x.detach().double().requires_grad_()
    (grad_x,) = torch.autograd.grad(rms_norm_composition(x64, weight.detach().double(), eps), (x64,), grad_y.double())
    return grad_x, column_sum(grad_y.double() * x.double() * golden_rms_norm(x, weight, eps)[1].unsqueeze(-1))


def same_rms_norm_backward(grad_y, x, weight, eps):
    """PyTorch's own autograd of F.rms_norm in the inputs' dtype: the flash rule's yardstick."""
    xs, ws = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    return torch.autograd.grad(F.rms_norm(xs, (x.shape[-1],), ws, eps), (xs, ws), grad_y)


def reference_rstd(x, eps):
    """rstd as the backward's input, computed by PyTorch (not by the lab's forward), in the ops' rstd dtype."""
    return torch.rsqrt(x.double().pow(2).mean(-1) + eps).to(accumulator(x.dtype))


# ---------------------------------------------------------------- checks
def flash_rule(out, golden, same, *, case, k, hint="", slack=None):
    """harness.check.assert_flash_rule over the rows whose golden is finite (a fully -inf softmax row is NaN in
    all three, and NaN has no error to bound). `slack`: per element, as out (assert_flash_rule's)."""
    finite = golden.isfinite().reshape(-1, golden.shape[-1]).all(-1) if golden.dim() else golden.isfinite()
    if golden.dim() and not bool(finite.all()):
        n = golden.shape[-1]
        out, golden, same = (t.reshape(-1, n)[finite] for t in (out, golden, same))
        slack = None if slack is None else slack.reshape(-1, n)[finite]
    if not bool(same.isfinite().all()):
        return  # PyTorch's own 16-bit path overflowed here: it sets no bound, and the per-element check stands
    harness.check.assert_flash_rule(out, golden, same, case=case, k=k, slack=0.0 if slack is None else slack,
                                    hint=hint or FLASH_HINT.format(dtype=dtype_name(out.dtype)))


def check_softmax(y, x, *, case, hint):
    check_placement(y, shape=x.shape, like=x, name="y", case=case)
    golden = golden_softmax(x)
    n = x.shape[-1]
    finite = golden.isfinite().reshape(-1, n).all(-1) if n else None
    if finite is not None and not bool(finite.all()):
        # Rows whose softmax is NaN (all -inf): checked by the caller; the rest compared here (an rms over the
        # whole tensor would be NaN).
        y, x, golden = (t.reshape(-1, n)[finite] for t in (y, x, golden))
        case += f" (rows {finite.logical_not().nonzero().flatten().tolist()} left out: all -inf; row numbers below " \
                "count the others)"
    LAB.assert_close(y, golden, case=case, tol=row_tol(x.dtype, n), hint=hint)
    if x.dtype in SIXTEEN_BIT:
        flash_rule(y, golden, torch.softmax(x, -1), case=case, k=2.0)


def cancellation(golden: torch.Tensor, terms: torch.Tensor) -> float:
    """How much larger the terms of a difference are than the difference (rms over rms, at least 1): a gradient
    that is the difference of two near-equal terms (RMSNorm's grad_x for rows of one element: rstd g and
    rstd^3 x^2 g, equal but for eps) carries the rounding errors of its terms, not of its own size. The tolerance
    grows by this factor, as lab 03's sum tolerance grows by ||x|| / |sum x|; where it is large (> 16) the flash
    rule, which compares worst errors between two equally ill-conditioned computations, is not applied."""
    ref = golden.double().pow(2).mean().sqrt().item() if golden.numel() else 0.0
    size = terms.double().pow(2).mean().sqrt().item() if terms.numel() else 0.0
    return max(1.0, size / ref) if ref > 0 else 1.0


def check_softmax_backward(grad_x, grad_y, y, *, case, hint=SOFTMAX_BACKWARD_HINT):
    check_placement(grad_x, shape=y.shape, like=y, name="grad_x", case=case)
    golden = golden_softmax_backward(grad_y, y)
    terms = softmax_backward_terms(grad_y, y)
    # Elements below the dtype's smallest normal number keep fewer bits (a product of subnormals rounds to their
    # grid): judged on that absolute scale.
    floor = terms + torch.finfo(y.dtype).tiny
    LAB.assert_close(grad_x, golden, case=f"{case}: grad_x", tol=row_tol(y.dtype, y.shape[-1]), hint=hint,
                     floor=floor)
    if y.dtype in SIXTEEN_BIT:
        flash_rule(grad_x, golden, same_softmax_backward(grad_y, y), case=f"{case}: grad_x", k=3.0,
                   slack=tolerance(FP32, y.shape[-1]) * terms)


RSTD_PLACEMENT_HINT = (harness.check.PLACEMENT_HINT + "; rstd: at::empty(rows, x.options().dtype(at::kFloat)), "
                       "float64 for float64 x")


def check_rms_norm(y, rstd, x, weight, eps, *, case, hint=RMS_NORM_HINT):
    n = x.shape[-1]
    check_placement(y, shape=x.shape, like=x, name="y", case=case)
    check_placement(rstd, shape=x.shape[:-1], like=x, dtype=accumulator(x.dtype), name="rstd", case=case,
                    hint=RSTD_PLACEMENT_HINT)
    golden_y, golden_rstd = golden_rms_norm(x, weight, eps)
    # rstd first: when it is wrong, y is too, and rstd's message names the cause.
    LAB.assert_close(rstd, golden_rstd, case=f"{case}: rstd", tol=rstd_tol(x.dtype, n),
                     hint=RSTD_HINT if hint == RMS_NORM_HINT else hint)
    LAB.assert_close(y, golden_y, case=f"{case}: y", tol=row_tol(x.dtype, n), hint=hint)
    if x.dtype in SIXTEEN_BIT:
        flash_rule(y, golden_y, F.rms_norm(x, (n,), weight, eps), case=f"{case}: y", k=2.0)


def check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, eps, *, case, hint=RMS_BACKWARD_HINT,
                            grad_weight_hint=GRAD_WEIGHT_HINT):
    n = x.shape[-1]
    rows = rows_of(x.shape)
    check_placement(grad_x, shape=x.shape, like=x, name="grad_x", case=case)
    check_placement(grad_weight, shape=(n,), like=weight, name="grad_weight", case=case)
    golden_x, golden_w = golden_rms_norm_backward(grad_y, x, weight, eps)
    rstd = golden_rms_norm(x, weight, eps)[1].unsqueeze(-1)
    # grad_x = rstd g - rstd^3 x mean(g x): its first term sets the size of the rounding errors.
    terms = rstd * weight.double() * grad_y.double()
    ill = cancellation(golden_x, terms)
    LAB.assert_close(grad_x, golden_x, case=f"{case}: grad_x", tol=row_tol(x.dtype, n) * ill, hint=hint)
    # grad_weight[c] sums rows of dy x rstd that can cancel (a few rows, random signs): its rounding error scales
    # with the sum of the terms' sizes, not with the result's (seen: lab 06's 7-row grad_bias, 4.9e-4 relative).
    # 16-bit: the final rounding dominates, and the flash rule below is the sharp check.
    term_sizes = (grad_y.double() * x.double() * rstd).abs()
    LAB.assert_close(grad_weight, golden_w, case=f"{case}: grad_weight", tol=grad_weight_tol(x.dtype, rows, n),
                     hint=grad_weight_hint,
                     floor=column_sum(term_sizes) if rows and x.dtype not in SIXTEEN_BIT else None)
    if x.dtype in SIXTEEN_BIT:
        same_x, same_w = same_rms_norm_backward(grad_y, x, weight, eps)
        if ill <= 16:
            flash_rule(grad_x, golden_x, same_x, case=f"{case}: grad_x", k=3.0)
        flash = FLASH_HINT.format(dtype=dtype_name(x.dtype))
        flash_rule(grad_weight, golden_w, same_w, case=f"{case}: grad_weight", k=3.0,
                   hint=flash + "; or grad_weight's partials kept in 16 bits instead of float")


# ---------------------------------------------------------------- calling the ops, outputs guarded
def _pool_bytes(*sizes: int) -> int:
    """PoisonedPool's large_bytes: the allocations over 1 MiB (which the allocator takes from the large pool), each
    rounded up to the allocator's 512 bytes."""
    return sum(-(-s // 512) * 512 for s in sizes if s > 2**20)


def softmax(x, path="auto", *, case):
    """The lab's softmax with y from a poisoned pool: unwritten elements read NaN, a write past y's end fails."""
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(nbytes(x))) as pool:
        y = LAB.module.softmax(x, path=path)
    pool.assert_no_spill(y, name="y", case=case)
    return y


def softmax_backward(grad_y, y, path="auto", *, case):
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(nbytes(y))) as pool:
        grad_x = LAB.module.softmax_backward(grad_y, y, path=path)
    pool.assert_no_spill(grad_x, name="grad_x", case=case)
    return grad_x


def rms_norm(x, weight, eps=EPS, path="auto", *, case):
    rstd_bytes = rows_of(x.shape) * torch.empty((), dtype=accumulator(x.dtype)).element_size()
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(nbytes(x), rstd_bytes)) as pool:
        y, rstd = LAB.module.rms_norm(x, weight, eps=eps, path=path)
    pool.assert_no_spill(y, name="y", case=case)
    pool.assert_no_spill(rstd, name="rstd", case=case)
    return y, rstd


def partial_rows(rows: int) -> int:
    """The rows of grad_weight partials (= blocks of the backward) for `rows` rows: the lab's grad_weight_chunks."""
    return int(LAB.module.grad_weight_chunks(rows)) if rows else 0


def rms_norm_backward(grad_y, x, weight, rstd, path="auto", *, case):
    """rms_norm_backward with grad_x, grad_weight (and the partials) from a poisoned pool."""
    compute = torch.empty((), dtype=accumulator(x.dtype)).element_size()
    partials = partial_rows(rows_of(x.shape)) * x.shape[-1] * compute
    with harness.check.PoisonedPool(large_bytes=_pool_bytes(nbytes(x), nbytes(weight), partials)) as pool:
        grad_x, grad_weight = LAB.module.rms_norm_backward(grad_y, x, weight, rstd, path=path)
    pool.assert_no_spill(grad_x, name="grad_x", case=case)
    pool.assert_no_spill(grad_weight, name="grad_weight", case=case)
    return grad_x, grad_weight


def randn(shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float32, device="cuda") * scale).to(dtype)


def offset_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that starts one element into its storage: not 16-byte aligned."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


# Softmax inputs: x ~ 2 N(0, 1), so that a row's probabilities range over a few orders of magnitude. RMSNorm:
# x ~ N(0, 1), weight ~ N(0, 1) (signed, some near zero), grad_y ~ N(0, 1).
SOFTMAX_SCALE = 2.0


def softmax_backward_inputs(shape, dtype):
    """grad_y ~ N(0, 1) and y = softmax(2 N(0, 1)) by PyTorch (so that a wrong forward does not fail the backward)."""
    y = torch.softmax(torch.randn(shape, device="cuda", dtype=FP64) * SOFTMAX_SCALE, -1).to(dtype)
    return randn(shape, dtype), y


def rms_inputs(shape, dtype):
    """x ~ N(0, 1), weight ~ N(0, 1) of shape[-1:], grad_y ~ N(0, 1)."""
    return randn(shape, dtype), randn(shape[-1:], dtype), randn(shape, dtype)


# The special-value cases' shape (softmax's row patterns, RMSNorm's eps cases, the Triton op's):
PATTERN_SHAPE = (6, 4097)  # a block per row (32 elements a thread), and 2 streaming batches of 4096 packs

# RMSNorm's eps cases (rms_norm.py, triton_op.py).
# eps where it decides the result. 'zero rows': rows 0 and 3 all zeros: y = 0 and rstd = eps^-1/2 = 1000 exactly
# (1 / (sqrt(0) + eps) would be 10^6). 'tiny rows': x ~ 1e-3 N(0, 1), so mean(x^2) ~ 1e-6 ~ eps: rstd ~ 707 inside
# the root, ~ 999 outside it. 'eps=0.1' and 'eps=0': other eps passed on as they are. 'large': |x| near 1e4 in
# float16 (x^2 overflows float16, not float), 1e15 in float32 and bfloat16 (x^2 ~ 1e30, summed in float).
RMS_PATTERNS = {"zero rows": (1.0, EPS), "tiny rows": (1e-3, EPS), "eps=0.1": (1.0, 0.1), "eps=0": (1.0, 0.0),
                "large": (None, EPS)}
RMS_LARGE_SCALE = {FP32: 1e15, FP16: 1e4, BF16: 1e15}


# Each op called with (the lab module, x, weight, rstd): on CPU tensors in builds.py; by name in errors.py.
_CPU_CALLS = {
    "softmax": lambda m, x, w, r: m.softmax(x),
    "softmax_backward": lambda m, x, w, r: m.softmax_backward(x, x),
    "rms_norm": lambda m, x, w, r: m.rms_norm(x, w),
    "rms_norm_backward": lambda m, x, w, r: m.rms_norm_backward(x, x, w, r),
}


# ---------------------------------------------------------------- GPU: the shapes, the paths, the tasks
# (rows, n): n covers every register bucket of normalization.h (a warp per row with 8 elements a thread: n <= 256;
# a warp with 32: <= 1024; a block with 8, 16, 32: <= 2048, 4096, 8192), the longest register row (8192) and one
# past it (8193: streaming under 'auto'), and two streaming rows (65536, 2^17 + 3); odd n (1, 7, 33, 2047, 4097,
# 8193, 2^17 + 3) take scalar loads, the others 16-byte vectors. Rows: 1; 7 and 9 (a warp-per-row block holds 8
# rows: a partial block, and one past a full one); 1027 (RMSNorm backward: 343 blocks of partials, 3 rows each);
# 16384 rows of 32 (8 warps a block, 2048 blocks).
SHAPES = [(1, 1), (7, 7), (9, 32), (1027, 33), (16384, 32), (5, 1000), (3, 2047), (7, 4096), (33, 4097), (2, 8192),
          (3, 8193), (2, 65536), (3, 2**17 + 3)]
SHAPES_3D = [(2, 3, 33), (4, 5, 4097), (2, 2, 65536)]


def path_cases(shapes, dtypes, on_chip=None):
    """(shape, dtype, path) for each op: path='registers' wherever the row fits, 'streaming' everywhere (also at
    small n, so the long-row code is graded, and sanitizer-checkable, on small cases), 'auto' where the choice
    matters (from 4096 on); for softmax (on_chip: False forward, True backward) 'on_chip' wherever its spec takes
    the row, short rows too, for the same reasons."""
    cases = []
    for shape in shapes:
        for dtype in dtypes:
            n = shape[-1]
            if n <= SPEC_MAX_REGISTER_ROW[dtype]:
                cases.append((shape, dtype, "registers"))
            if on_chip is not None and n <= SPEC_MAX_ON_CHIP_ROW[on_chip][dtype]:
                cases.append((shape, dtype, "on_chip"))
            cases.append((shape, dtype, "streaming"))
            if n >= 4096:
                cases.append((shape, dtype, "auto"))
    return cases


def _params(cases, tasks_of):
    """pytest params of (shape, dtype, path), marked with the tasks they grade, or as reference checks where
    tasks_of gives none (given code: the on-chip backward)."""
    def marks(shape, dtype, path):
        tasks = tasks_of(shape[-1], dtype, path)
        return [harness.tasks(*tasks) if tasks else harness.reference_check, *large_marks(shape)]

    return [pytest.param(shape, dtype, path, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{path}",
                         marks=marks(shape, dtype, path))
            for shape, dtype, path in cases]


def softmax_tasks(n, dtype, path):
    return ("lab07.1",) if spec_path(n, dtype, path) == "registers" else ("lab07.2",)


def softmax_backward_tasks(n, dtype, path):
    """The streaming and register backwards are lab07.3's ('auto' included: past the register path it streams on
    a GPU without clusters); a forced on-chip backward runs given code alone."""
    return () if path == "on_chip" else ("lab07.3",)


def rms_norm_tasks(n, dtype, path):
    return ("lab07.4",)


def rms_norm_backward_tasks(n, dtype, path):
    return ("lab07.5", "lab07.6")


def softmax_hint(n, dtype, path):
    taken = taken_path("softmax", n, dtype, path)
    if taken == "on_chip":
        return SOFTMAX_ON_CHIP_HINT
    return SOFTMAX_REGISTERS_HINT if taken == "registers" else SOFTMAX_STREAMING_HINT


def softmax_backward_hint(n, dtype, path):
    return SOFTMAX_BACKWARD_ON_CHIP_HINT if taken_path("softmax_backward", n, dtype, path) == "on_chip" else \
        SOFTMAX_BACKWARD_HINT


def case_of(what, x, path, aligned=True, extra=""):
    n = x.shape[-1]
    words = path_words(n, x.dtype, path, aligned, what)
    return f"{what} of x {shape_id(x.shape)} {dtype_name(x.dtype)} ({words}){extra}"


def rms_backward_case(x, path, aligned=True, extra=""):
    chunks = partial_rows(rows_of(x.shape))
    return case_of("rms_norm_backward", x, path, aligned, f"; {chunks} blocks of grad_weight partials{extra}")
