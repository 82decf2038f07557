"""What the parts of lab 06's grader share: dtypes, shapes and hints; the float64 references and the checks
against them; and the two ops called with their outputs guarded.

Tolerances, derived. Every reference is float64, computed from the SAME (already rounded) inputs, so
input rounding cancels and what remains is the kernel's own arithmetic:
  - y and grad_x (elementwise): a handful of float32 operations (float64 for float64) and one erf,
    tanh or exp, each within an ulp or two, then ONE rounding to the output dtype. For 16-bit
    outputs that last rounding dominates (2^-9 and 2^-12 relative against 2^-24), and
    harness.tolerance(dtype) covers it; the flash-attention rule (SYLLABUS §4) then bounds the
    worst error by k x PyTorch's own 16-bit error (k = 2 forward, 3 gradients), which catches a
    systematic error (a GELU constant 1% off, a 16-bit intermediate) that the per-element tolerance
    lets through. For float32 and float64 outputs the library functions' ulps are comparable with
    the one rounding, and where GELU cancels (1 + erf(u / sqrt 2), 1 + tanh(k) for u << 0) the
    error is absolute, an ulp of 1 times the factors around it, not relative to the output:
    assert_close's floor at the output's rms absorbs most of that. Not all: the tanh form's
    derivative multiplies 1 + tanh(k) by 0.5 u (1 - tanh k) dk/du, which grows like u^3, times
    grad_y. On an H100 the reference's float32 and float64 tanh-form grad_x reached 2.5x
    harness.tolerance(dtype) at a few elements in 33 Mi (PyTorch's own float32 gelu_backward, and
    the float64 golden itself, have the same cancellation), so ELEMENTWISE_HEADROOM is 16 for
    float32 and float64: 128 ulps with the rms floor, still 100x under the smallest error a wrong
    formula makes (the erf and tanh forms differ by up to 2e-4).
  - grad_bias (a column sum over `rows` rows): harness.tolerance(accumulator, rows), the house rule
    for a length-rows float32 reduction (float64 for float64), plus one rounding to the dtype. A
    column sum of random-signed terms can be near zero; assert_close's floor at the rms of grad_bias
    (which grows like sqrt(rows), as the accumulated error does) keeps that from failing a right one,
    while a lost row chunk (a term the size of the sum itself) still misses by far.
Outputs the wrapper allocates come from a poisoned pool (harness.check.PoisonedPool): an unwritten
element reads NaN, and bytes written past an output's end (into the allocator's slack) fail the test.
Inputs are checked unchanged after every call (harness.calls, through LAB.module).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from harness import random_tensor, tolerance
from harness.check import check_placement, dtype_name, nbytes, run_student, shape_id

LAB = harness.lab("06")
FP32, FP16, BF16, FP64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
DTYPES = [FP32, FP16, BF16, FP64]
SIXTEEN_BIT = (FP16, BF16)
FORMS = ["none", "tanh"]  # F.gelu's approximate=: the erf form and the tanh form
ROWS = [1, 7, 8192]
COLS = [1, 3, 8, 4097, 8192]  # 8 and 8192 take the 16-byte kernels in every dtype; 1, 3 and 4097 never
BIG = (8192, 8192)  # fp32 and bf16 only (and in the perf tests): 64 Mi elements in every dtype is slow to check
LARGE = pytest.mark.large  # too big for compute-sanitizer (./course sanitize skips them)
ELEMENTWISE_HEADROOM = 16.0  # float32 and float64 outputs: see the docstring
# The spec's 16-byte vectors. Used only to declare which task a parametrized case grades (decided at
# collection, before any build); the tests read the lab's own constants() for everything else.
SPEC_VECTOR_BYTES = 16

GELU_HINT = ("if every element is off, GELU itself (lab06.1): erf form 0.5 u (1 + erf(u / sqrt 2)), tanh form "
             "0.5 u (1 + tanh(sqrt(2 / pi) (u + 0.044715 u^3))), computed in float (double for float64), with "
             "approximate='tanh' selecting the tanh form")
SCALAR_HINT = ("the scalar kernel: y[i] = GELU(x[i] + bias[i % cols]) for every i < n = rows * cols, in a grid-stride "
               "loop (the column of flat element i is i % cols; i / cols is its row); a NaN is an element never "
               "written; " + GELU_HINT)
VECTOR_HINT = ("the 16-byte kernel: vector v holds elements [v * V, v * V + V) of one row, and its V biases are the "
               "one pack bias_vectors[v % packs_per_row]; every vector below n_vectors is loaded, computed and stored "
               "(a NaN is a vector never written); " + GELU_HINT)
BACKWARD_HINT = ("grad_x = grad_y * GELU'(x + bias), GELU'(u) = Phi(u) + u phi(u) in the erf form (both terms of the "
                 "product rule; the tanh form's derivative likewise has two), computed in float; a NaN is an "
                 "element of grad_x never written: every row of every chunk, every column of every strip")
GRAD_BIAS_HINT = ("grad_bias[c] = the sum of grad_x[:, c] over every row: each block's row lanes combined through "
                  "shared memory (a __syncthreads() between their stores and the reads), its total stored in "
                  "partials[chunk, c], and the second kernel adding partials[k, c] for every k = 0 .. chunks - 1")
FLASH_HINT = ("further from the exact result than PyTorch's own {dtype} path: a constant of GELU a little off, "
              "x + bias or an intermediate rounded to 16 bits, or float arithmetic replaced by 16-bit arithmetic")
AUTOGRAD_HINT = ("BiasGelu.forward: y = ops.bias_gelu(x, bias, approximate), ctx.save_for_backward(x, bias); "
                 "backward: ops.bias_gelu_backward(grad_y.contiguous(), x, bias, approximate) -> "
                 "(grad_x, grad_bias, None, None), one gradient per input of forward, in their order")
INT64_HINT = "index with int64_t: rows * cols passes 2^31 here, and an int index or count wraps"


def constants() -> dict:
    """The numbers the kernels are built with ({warp_size, threads_per_block, vector_bytes, backward_rows_per_chunk,
    ...}), from the lab itself: read inside the tests, so a lab that does not build fails each test, not the import."""
    return LAB.module.constants()


def autograd_module():
    """The graded tree's autograd.py (lab06.5), imported fresh (a syntax error there fails the tests that use it)."""
    return LAB.python("autograd")


def elems_per_vector(dtype, vector_bytes: int = SPEC_VECTOR_BYTES) -> int:
    return vector_bytes // torch.empty((), dtype=dtype).element_size()


def takes_vectors(cols: int, dtype, vectorized: bool = True, aligned: bool = True) -> bool:
    """Whether the launcher takes the 16-byte kernel (the spec's rule: aligned pointers, cols % V == 0)."""
    return vectorized and aligned and cols % elems_per_vector(dtype) == 0


def forward_tasks(cols, dtype, vectorized=True, aligned=True) -> tuple[str, ...]:
    return ("lab06.1", "lab06.3") if takes_vectors(cols, dtype, vectorized, aligned) else ("lab06.1", "lab06.2")


def path_name(cols, dtype, vectorized=True, aligned=True) -> str:
    if takes_vectors(cols, dtype, vectorized, aligned):
        return f"16-byte kernel, {elems_per_vector(dtype, constants()['vector_bytes'])} elements per vector"
    return "scalar kernel" + ("" if vectorized else " (vectorized=False)")


def large_marks(shape) -> list:
    return [LARGE] if torch.Size(shape).numel() >= 2**24 else []


def elementwise_tol(dtype) -> float:
    return tolerance(dtype) * (1.0 if dtype in SIXTEEN_BIT else ELEMENTWISE_HEADROOM)


def grad_bias_tol(dtype, rows: int) -> float:
    accumulator = FP64 if dtype == FP64 else FP32
    return tolerance(accumulator, rows) + elementwise_tol(dtype)


# ---------------------------------------------------------------- references
def golden_forward(x, bias, approximate):
    return F.gelu(x.double() + bias.double(), approximate=approximate)


def cancellation_floor_forward(x, bias):
    """The scale of y's error that does not shrink with y: both forms compute 0.5 u (1 + f(u)) (the golden
    too: F.gelu in float64), and 1 + f(u) for u << 0 is off by an ulp of 1, so y by an ulp times 0.5 |u|, however
    small y is. A many-element tensor's rms floor absorbs it; a one-element one (1x1, seen failing at 1.4e-13
    relative in float64, u << 0) has only this."""
    return 0.5 * (x.double() + bias.double()).abs()


def cancellation_floor_backward(grad_y, x, bias):
    """The same for grad_x: Phi(u) = 0.5 (1 + erf) cancels (an ulp of 0.5), and the tanh form's
    0.5 u (1 - tanh^2 k) dk/du has 1 - tanh^2 k cancelling, times a factor that grows like 0.05 |u|^3."""
    u = (x.double() + bias.double()).abs()
    return grad_y.double().abs() * (0.5 + 0.5 * u + 0.1 * u**3)


def golden_backward(grad_y, x, bias, approximate):
    """float64 autograd of F.gelu(x + b): (grad_x, grad_bias)."""
    x64 = x.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    return torch.autograd.grad(F.gelu(x64 + b64, approximate=approximate), (x64, b64), grad_y.double())


def same_dtype_backward(grad_y, x, bias, approximate):
    """PyTorch's own autograd of F.gelu(x + b) in the inputs' dtype: the flash rule's yardstick."""
    xs, bs = x.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    return torch.autograd.grad(F.gelu(xs + bs, approximate=approximate), (xs, bs), grad_y)


def check_forward(y, x, bias, approximate, *, case, hint=SCALAR_HINT, k=2.0):
    check_placement(y, shape=x.shape, like=x, name="y", case=case)
    golden = golden_forward(x, bias, approximate)
    LAB.assert_close(y, golden, case=case, tol=elementwise_tol(y.dtype), hint=hint,
                     floor=cancellation_floor_forward(x, bias))
    if y.dtype in SIXTEEN_BIT:
        same = F.gelu(x + bias, approximate=approximate)
        harness.check.assert_flash_rule(y, golden, same, case=case, k=k,
                                        hint=FLASH_HINT.format(dtype=dtype_name(y.dtype)))


def check_backward(grad_x, grad_bias, grad_y, x, bias, approximate, *, case, hint=BACKWARD_HINT,
                   grad_bias_hint=GRAD_BIAS_HINT):
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    check_placement(grad_x, shape=x.shape, like=x, name="grad_x", case=case)
    check_placement(grad_bias, shape=(cols,), like=bias, name="grad_bias", case=case)
    golden_x, golden_b = golden_backward(grad_y, x, bias, approximate)
    LAB.assert_close(grad_x, golden_x, case=f"{case}: grad_x", tol=elementwise_tol(x.dtype), hint=hint,
                     floor=cancellation_floor_backward(grad_y, x, bias))
    # grad_bias[c] sums rows that can cancel (7 rows of O(1) summing to 1.2e-4 was seen failing at 4.9e-4 relative,
    # float32): the rounding error of a sum scales with the sum of its terms' sizes, not with the result.
    # (16-bit outputs: their rounding, relative to the result, dominates that, and the flash rule below is the
    # sharp check.)
    wide = rows and x.dtype not in SIXTEEN_BIT
    floor = harness.check.column_sum(golden_x.abs() + cancellation_floor_backward(grad_y, x, bias)) if wide else None
    LAB.assert_close(grad_bias, golden_b, case=f"{case}: grad_bias", tol=grad_bias_tol(x.dtype, rows),
                     hint=grad_bias_hint, floor=floor)
    if x.dtype in SIXTEEN_BIT:
        same_x, same_b = same_dtype_backward(grad_y, x, bias, approximate)
        flash = FLASH_HINT.format(dtype=dtype_name(x.dtype))
        harness.check.assert_flash_rule(grad_x, golden_x, same_x, case=f"{case}: grad_x", k=3.0, hint=flash)
        harness.check.assert_flash_rule(grad_bias, golden_b, same_b, case=f"{case}: grad_bias", k=3.0,
                                        hint=flash + "; or grad_bias summed from grad_x's 16-bit values")


# ---------------------------------------------------------------- calling the ops, outputs guarded
def forward(x, bias, approximate="none", vectorized=True, *, case):
    """bias_gelu with y from a poisoned pool: unwritten elements read NaN, a write past y's end fails."""
    with harness.check.PoisonedPool(large_bytes=nbytes(x) if nbytes(x) > 2**20 else 0) as pool:
        y = LAB.module.bias_gelu(x, bias, approximate=approximate, vectorized=vectorized)
    pool.assert_no_spill(y, name="y", case=case)
    return y


def backward(grad_y, x, bias, approximate="none", vectorized=True, *, case):
    """bias_gelu_backward with grad_x, grad_bias (and the partials) from a poisoned pool."""
    large = 2 * nbytes(x) + 2**22 if nbytes(x) > 2**19 else 0  # grad_x, and the partials' rows of float
    with harness.check.PoisonedPool(large_bytes=large) as pool:
        grad_x, grad_bias = LAB.module.bias_gelu_backward(grad_y, x, bias, approximate=approximate,
                                                          vectorized=vectorized)
    pool.assert_no_spill(grad_x, name="grad_x", case=case, hint=BACKWARD_HINT)
    pool.assert_no_spill(grad_bias, name="grad_bias", case=case, hint=GRAD_BIAS_HINT)
    return grad_x, grad_bias


def inputs(shape, dtype, offset=None):
    """x ~ N(0, 1) of `shape`, bias ~ N(0, 1) of shape[-1:], grad_y ~ N(0, 1): u = x + bias ~ N(0, 2) covers
    both of GELU's tails. offset ('x', 'bias' or 'grad_y'): that tensor is a contiguous view starting one
    element into its storage, so it is not 16-byte aligned and the launcher must take the scalar path."""
    def make(shape_, name):
        if offset == name:
            numel = torch.Size(shape_).numel()
            return random_tensor((numel + 1,), dtype)[1:].view(shape_)
        return random_tensor(shape_, dtype)
    return make(shape, "x"), make(shape[-1:], "bias"), make(shape, "grad_y")


# ---------------------------------------------------------------- shared by several parts
def _student(what: str, fn):
    return run_student(what, fn, hint=AUTOGRAD_HINT)


SHAPES = [(rows, cols) for rows in ROWS for cols in COLS if (rows, cols) != BIG]


def forward_case(x, dtype, approximate, vectorized=True, aligned=True, what="bias_gelu"):
    cols = x.shape[-1]
    return (f"{what} of x {shape_id(x.shape)} {dtype_name(dtype)}, approximate={approximate!r} "
            f"({path_name(cols, dtype, vectorized, aligned)})")


def backward_case(x, dtype, approximate, vectorized=True, aligned=True, what="bias_gelu_backward"):
    cols = x.shape[-1]
    rows = x.numel() // cols
    chunk = constants()["backward_rows_per_chunk"]
    path = "16-byte loads" if takes_vectors(cols, dtype, vectorized, aligned) else "one column per thread"
    return (f"{what} of x {shape_id(x.shape)} {dtype_name(dtype)}, approximate={approximate!r} "
            f"({path}{'' if vectorized else ', vectorized=False'}; {-(-rows // chunk)} row chunks of {chunk})")
