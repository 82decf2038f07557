"""Grader for lab 06: y = GELU(x + bias) forward (a scalar and a 16-byte vectorized kernel), its fused,
bitwise-deterministic backward (grad_x and grad_bias in one pass over grad_y and x), four dtypes, both
GELU forms, and the torch.autograd.Function (autograd.py) that runs them under loss.backward().

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
from harness import notebooks, random_tensor, requires_gpu, tolerance
from harness.check import check_placement, dtype_name, nbytes, run_student, shape_id, skip_without_two_gpus
from harness.inputs import Arg

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

# Points per task (of 100), by the work each is: GELU and its derivative are two short formulas, but every
# output of the lab goes through them; the scalar forward is lesson 00's grid-stride loop plus the column
# arithmetic; the vectorized forward adds 16-byte packs, the bias pack per vector and loads in flight; the
# backward is the lab's largest piece (a tiled column reduction through shared memory, the fixed-order
# second kernel, vectors or not); the autograd.Function is a dozen lines, with the contiguity and
# once_differentiable details.
POINTS = {"lab06.1": 15, "lab06.2": 15, "lab06.3": 20, "lab06.4": 35, "lab06.5": 15}

# The few smallest edge cases `./course grade` runs under compute-sanitizer (memcheck, racecheck,
# synccheck) by default: regular expressions over test names (conftest marks them `sanitize`).
# 8192x8 backward: 64 row chunks of 8 row lanes each, so the shared-memory reduction and the second
# kernel both run with real work; 7x8 bfloat16: the 16-byte kernels on a partial chunk.
SANITIZE_CASES = [
    r"test_forward\[7x3-float32-none\]",
    r"test_forward\[7x8-bfloat16-tanh\]",
    r"test_forward_unaligned\[x\+1-7x8-float32\]",
    r"test_backward\[(7x3|8192x8)-float32-none\]",
    r"test_backward\[7x8-bfloat16-tanh\]",
]

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


# ---------------------------------------------------------------- builds, and what runs without a GPU
@harness.tasks(harness.ALL)  # a TODO that does not compile fails the whole lab
def test_builds():
    """The lab compiles and imports, and its autograd.py imports: checked on every machine, GPU or not."""
    for name in ("bias_gelu", "bias_gelu_backward", "constants"):
        assert hasattr(LAB.module, name), f"the lab module has no function {name!r}"
    module = autograd_module()
    for name in ("BiasGelu", "bias_gelu"):
        assert hasattr(module, name), f"autograd.py defines no {name!r}"
    assert issubclass(module.BiasGelu, torch.autograd.Function), "autograd.py: BiasGelu must subclass "\
        "torch.autograd.Function"


@harness.reference_check  # the constants are given
def test_constants():
    c = constants()
    assert c["vector_bytes"] == 16, f"constants(): vector_bytes = {c['vector_bytes']}, the widest load is 16 bytes"
    assert c["threads_per_block"] % c["warp_size"] == 0, f"constants(): {c}: blocks of whole warps"
    assert c["backward_rows_per_chunk"] > 0, f"constants(): {c}"


@pytest.mark.parametrize("op", ["bias_gelu", "bias_gelu_backward"])
@harness.reference_check  # the wrapper's checks are given
def test_refuses_cpu_tensors(op):
    x, bias = torch.ones(4, 8), torch.ones(8)
    call = (lambda: LAB.module.bias_gelu(x, bias)) if op == "bias_gelu" else (
        lambda: LAB.module.bias_gelu_backward(torch.ones(4, 8), x, bias))
    LAB.assert_raises_clearly(call, must_mention=("CUDA", ".cuda()"), case=f"{op}(tensors on the CPU)")


# Each tensor argument refused on its own, the others valid (harness.inputs): on fake CUDA tensors (no GPU needed)
# and on real ones. x sets the dtype (int32 is refused); bias and grad_y must match it. A strided bias is copied (C
# elements beside rows x C), so it is accepted; x and grad_y are refused.
_X = Arg("x", dtype=torch.int32, shape=lambda t: t[..., :-1], words={"dtype": ("dtype", "torch.float32")})
_BIAS = Arg("bias", dtype=BF16, shape=lambda t: t[:-1], strided=False)
ARGUMENTS = {"bias_gelu": (("x", "bias"), [_X, _BIAS]),
             "bias_gelu_backward": (("grad_y", "x", "bias"), [Arg("grad_y", dtype=FP64, shape=lambda t: t[:8]), _X,
                                                                _BIAS])}


@pytest.mark.parametrize("real", harness.FAKE_AND_REAL)
@pytest.mark.parametrize("op", list(ARGUMENTS))
@harness.reference_check  # the wrapper's checks are given
def test_each_argument_checked(op, real):
    names, specs = ARGUMENTS[op]

    def make_args():
        x, bias, grad_y = inputs((16, 16), FP32)
        return {name: {"x": x, "bias": bias, "grad_y": grad_y}[name] for name in names}

    harness.inputs.assert_each_argument_checked(op, getattr(LAB.module, op), make_args, specs, real=real)


@harness.reference_check
def test_refuses_unknown_approximate():
    x, bias = torch.ones(4, 8), torch.ones(8)
    for op, call in (("bias_gelu", lambda: LAB.module.bias_gelu(x, bias, approximate="tanhh")),
                     ("bias_gelu_backward", lambda: LAB.module.bias_gelu_backward(x, x, bias, approximate="erf"))):
        LAB.assert_raises_clearly(call, must_mention=("approximate", "none", "tanh"),
                                  case=f"{op}(..., approximate=<not 'none' or 'tanh'>)")


class FakeOps:
    """Stands in for the built extension on the CPU, so that autograd.py (lab06.5) is graded without a GPU:
    the same two functions, computed by PyTorch in float64 and returned detached (the real ops are not
    differentiable either), refusing a non-contiguous grad_y as the real wrapper does."""

    def __init__(self):
        self.calls: list[str] = []

    def bias_gelu(self, x, bias, approximate="none", vectorized=True):
        self.calls.append("bias_gelu")
        with torch.no_grad():
            return F.gelu(x + bias, approximate=approximate)

    def bias_gelu_backward(self, grad_y, x, bias, approximate="none", vectorized=True):
        self.calls.append("bias_gelu_backward")
        if not grad_y.is_contiguous():
            raise RuntimeError(f"bias_gelu_backward: grad_y must be contiguous, got strides {list(grad_y.stride())}; "
                               "call grad_y.contiguous() first")
        with torch.no_grad():
            grad_x = torch.ops.aten.gelu_backward(grad_y, x + bias, approximate=approximate)
            return grad_x, grad_x.reshape(-1, x.shape[-1]).sum(0)


def _student(what: str, fn):
    return run_student(what, fn, hint=AUTOGRAD_HINT)


@pytest.mark.parametrize("approximate", FORMS)
@harness.tasks("lab06.5")
def test_autograd_on_cpu(approximate):
    """autograd.py with stand-in ops on the CPU (FakeOps): forward calls ops.bias_gelu with the form, backward
    calls ops.bias_gelu_backward with a contiguous grad_y and returns the gradients in forward's input order;
    gradcheck passes; y.sum().backward() (whose grad_y is a stride-0 expanded 1) works."""
    module, ops = autograd_module(), FakeOps()
    x = torch.randn(3, 5, 8, dtype=FP64, requires_grad=True)
    bias = torch.randn(8, dtype=FP64, requires_grad=True)
    case = f"autograd.bias_gelu on the CPU with stand-in ops, approximate={approximate!r}"
    y = _student(f"{case}: forward", lambda: module.bias_gelu(x, bias, approximate, ops=ops))
    if "bias_gelu" not in ops.calls:
        raise harness.GradeFailure(f"{case}: forward never called ops.bias_gelu\n  hint: {AUTOGRAD_HINT}")
    LAB.assert_close(y, golden_forward(x, bias, approximate), case=f"{case}: y", tol=tolerance(FP64) * 4,
                     hint="pass approximate on to ops.bias_gelu: " + AUTOGRAD_HINT)
    _student(f"{case}: y.sum().backward()", lambda: y.sum().backward())
    golden_x, golden_b = golden_backward(torch.ones_like(y), x, bias, approximate)
    for name, got, want in (("x.grad", x.grad, golden_x), ("bias.grad", bias.grad, golden_b)):
        if got is None:
            raise harness.GradeFailure(f"{case}: y.sum().backward() left {name} None\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(got, want, case=f"{case}: {name} after y.sum().backward()", tol=tolerance(FP64, 64) * 4,
                         hint=AUTOGRAD_HINT)
    ok = _student(f"{case}: torch.autograd.gradcheck", lambda: torch.autograd.gradcheck(
        lambda a, b: module.bias_gelu(a, b, approximate, ops=ops), (x.detach().requires_grad_(),
                                                                     bias.detach().requires_grad_()),
        raise_exception=False))
    assert ok, f"{case}: torch.autograd.gradcheck failed\n  hint: {AUTOGRAD_HINT}"


@harness.tasks("lab06.5")
def test_second_derivative_raises_clearly():
    """backward is @once_differentiable: asking for a second derivative must raise autograd's clear error
    ("trying to differentiate twice"), not a confusing one, nor give a silently wrong number. (A backward
    that is itself differentiable is allowed: then gradgradcheck must pass.)"""
    module, ops = autograd_module(), FakeOps()
    x = torch.randn(4, 8, dtype=FP64, requires_grad=True)
    bias = torch.randn(8, dtype=FP64, requires_grad=True)
    y = _student("autograd.bias_gelu forward", lambda: module.bias_gelu(x, bias, ops=ops))
    grad_y = torch.randn_like(y, requires_grad=True)  # grad_y needs grad, so a second derivative can exist
    (grad_x,) = _student("autograd.grad(y, x, grad_y, create_graph=True)",
                         lambda: torch.autograd.grad(y, x, grad_y, create_graph=True))
    try:
        grad_x.sum().backward()
    except RuntimeError as error:
        text = str(error)
        if "twice" in text or "once_differentiable" in text:
            return
        raise harness.GradeFailure(
            f"a second derivative through BiasGelu raised an unclear error:\n    {text.splitlines()[0][:300]}\n"
            "  hint: decorate backward with @once_differentiable (torch.autograd.function), which makes a second "
            "derivative raise 'trying to differentiate twice a function that was marked with @once_differentiable'"
        ) from None
    ok = torch.autograd.gradgradcheck(lambda a, b: module.bias_gelu(a, b, ops=ops),
                                      (x.detach().requires_grad_(), bias.detach().requires_grad_()),
                                      raise_exception=False)
    assert ok, ("a second derivative through BiasGelu ran but gives wrong numbers (gradgradcheck failed)\n  hint: "
                "mark backward @once_differentiable, so that a second derivative raises a clear error instead")


# ---------------------------------------------------------------- GPU: forward
def _fwd_params(shapes, dtypes, forms, vectorized=True):
    return [pytest.param(shape, dtype, form, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                         marks=[harness.tasks(*forward_tasks(shape[-1], dtype, vectorized)), *large_marks(shape)])
            for shape in shapes for dtype in dtypes for form in forms]


SHAPES = [(rows, cols) for rows in ROWS for cols in COLS if (rows, cols) != BIG]
FORWARD_PARAMS = _fwd_params(SHAPES, DTYPES, FORMS) + _fwd_params([BIG], [FP32, BF16], FORMS)


def forward_case(x, dtype, approximate, vectorized=True, aligned=True, what="bias_gelu"):
    cols = x.shape[-1]
    return (f"{what} of x {shape_id(x.shape)} {dtype_name(dtype)}, approximate={approximate!r} "
            f"({path_name(cols, dtype, vectorized, aligned)})")


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", FORWARD_PARAMS)
def test_forward(shape, dtype, approximate):
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate)
    y = forward(x, bias, approximate, case=case)
    check_forward(y, x, bias, approximate, case=case,
                  hint=VECTOR_HINT if takes_vectors(shape[-1], dtype) else SCALAR_HINT)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate",
                         _fwd_params([s for s in SHAPES if s[-1] % 8 == 0], DTYPES, FORMS, vectorized=False))
def test_forward_scalar(shape, dtype, approximate):
    """vectorized=False forces the scalar kernel on shapes the 16-byte kernel would otherwise take."""
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate, vectorized=False)
    y = forward(x, bias, approximate, vectorized=False, case=case)
    check_forward(y, x, bias, approximate, case=case)


SHAPES_3D = [(2, 3, 8), (4, 5, 4097), (3, 1, 3), (2, 64, 256)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", _fwd_params(SHAPES_3D, DTYPES, ["tanh"]))
def test_forward_3d(shape, dtype, approximate):
    """x (..., C): every leading dimension is rows."""
    x, bias, _ = inputs(shape, dtype)
    case = forward_case(x, dtype, approximate)
    y = forward(x, bias, approximate, case=case)
    check_forward(y, x, bias, approximate, case=case)


UNALIGNED_SHAPES = [(7, 8), (33, 4096), (5, 3, 16)]


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape", UNALIGNED_SHAPES, ids=shape_id)
@pytest.mark.parametrize("offset", ["x", "bias"], ids=["x+1", "bias+1"])
@harness.tasks("lab06.1", "lab06.2")
def test_forward_unaligned(offset, shape, dtype):
    """x (or bias) a contiguous view one element into its storage: not 16-byte aligned, though cols % V == 0.
    The launcher must see it and take the scalar kernel: a 16-byte access there is a 'misaligned address'."""
    x, bias, _ = inputs(shape, dtype, offset=offset)
    case = forward_case(x, dtype, "none", aligned=False) + f", {offset} = a view starting 1 element into its storage"
    y = forward(x, bias, case=case)
    check_forward(y, x, bias, "none", case=case)


@requires_gpu
@pytest.mark.parametrize("shape", [(0, 8), (3, 0, 8), (5, 0)], ids=shape_id)
@harness.reference_check  # the launchers return before any kernel when there is nothing to compute: given code
def test_empty(shape):
    x, bias, grad_y = inputs(shape, FP32)
    y = LAB.module.bias_gelu(x, bias)
    check_placement(y, shape=shape, like=x, name="y", case=f"bias_gelu of x {list(shape)}")
    grad_x, grad_bias = LAB.module.bias_gelu_backward(grad_y, x, bias)
    case = f"bias_gelu_backward of x {list(shape)}"
    check_placement(grad_x, shape=shape, like=x, name="grad_x", case=case)
    check_placement(grad_bias, shape=shape[-1:], like=bias, name="grad_bias", case=case)
    assert bool((grad_bias == 0).all()), f"{case}: grad_bias over zero rows must be all zeros, got {grad_bias.tolist()}"


# ---------------------------------------------------------------- GPU: backward
def _bwd_params(shapes, dtypes, forms):
    return [pytest.param(shape, dtype, form, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                         marks=large_marks(shape)) for shape in shapes for dtype in dtypes for form in forms]


def backward_case(x, dtype, approximate, vectorized=True, aligned=True, what="bias_gelu_backward"):
    cols = x.shape[-1]
    rows = x.numel() // cols
    chunk = constants()["backward_rows_per_chunk"]
    path = "16-byte loads" if takes_vectors(cols, dtype, vectorized, aligned) else "one column per thread"
    return (f"{what} of x {shape_id(x.shape)} {dtype_name(dtype)}, approximate={approximate!r} "
            f"({path}{'' if vectorized else ', vectorized=False'}; {-(-rows // chunk)} row chunks of {chunk})")


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", _bwd_params(SHAPES, DTYPES, FORMS)
                         + _bwd_params([BIG], [FP32, BF16], ["none"]))
@harness.tasks("lab06.1", "lab06.4")
def test_backward(shape, dtype, approximate):
    x, bias, grad_y = inputs(shape, dtype)
    case = backward_case(x, dtype, approximate)
    grad_x, grad_bias = backward(grad_y, x, bias, approximate, case=case)
    check_backward(grad_x, grad_bias, grad_y, x, bias, approximate, case=case)


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", _bwd_params([s for s in SHAPES if s[-1] % 8 == 0], DTYPES,
                                                                  ["tanh"]))
@harness.tasks("lab06.1", "lab06.4")
def test_backward_scalar(shape, dtype, approximate):
    """vectorized=False forces one column per thread on shapes that would take 16-byte loads."""
    x, bias, grad_y = inputs(shape, dtype)
    case = backward_case(x, dtype, approximate, vectorized=False)
    grad_x, grad_bias = backward(grad_y, x, bias, approximate, vectorized=False, case=case)
    check_backward(grad_x, grad_bias, grad_y, x, bias, approximate, case=case)


@requires_gpu
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=dtype_name)
@pytest.mark.parametrize("shape", [(2, 3, 8), (4, 65, 4097), (2, 100, 256)], ids=shape_id)
@harness.tasks("lab06.1", "lab06.4")
def test_backward_3d(shape, dtype):
    x, bias, grad_y = inputs(shape, dtype)
    case = backward_case(x, dtype, "none")
    grad_x, grad_bias = backward(grad_y, x, bias, case=case)
    check_backward(grad_x, grad_bias, grad_y, x, bias, "none", case=case)


@requires_gpu
@pytest.mark.parametrize("dtype", [FP32, BF16, FP64], ids=dtype_name)
@pytest.mark.parametrize("shape", [(7, 8), (300, 4096)], ids=shape_id)
@pytest.mark.parametrize("offset", ["x", "grad_y", "bias"], ids=["x+1", "grad_y+1", "bias+1"])
@harness.tasks("lab06.1", "lab06.4")
def test_backward_unaligned(offset, shape, dtype):
    x, bias, grad_y = inputs(shape, dtype, offset=offset)
    case = (backward_case(x, dtype, "none", aligned=False)
            + f", {offset} = a view starting 1 element into its storage (not 16-byte aligned)")
    grad_x, grad_bias = backward(grad_y, x, bias, case=case)
    check_backward(grad_x, grad_bias, grad_y, x, bias, "none", case=case)


# u = x + bias of about +-1e4 (issue 34, class b): GELU's exps (erf's tail, the tanh form's sigma(2k), the density
# exp(-u^2 / 2)) overflow or underflow there, and a form that divides two of them (tanh as (e^2k - 1) / (e^2k + 1))
# gives inf / inf = NaN where the limit is u, or 0. Every other column of x is scaled by 1e4 (the rest ordinary, so
# that the flash rule's yardstick is not all exact zeros and ones); float16 stops at its range, 6e4. Columns 64 take
# the 16-byte kernels, 63 the scalar ones.
LARGE_MAGNITUDE = 1e4


def large_inputs(shape, dtype):
    x, bias, grad_y = inputs(shape, dtype)
    column_scale = torch.ones(shape[-1], dtype=FP64, device="cuda")
    column_scale[::2] = LARGE_MAGNITUDE
    wide = x.double() * column_scale
    return (wide.clamp(-6e4, 6e4) if dtype == FP16 else wide).to(dtype), bias, grad_y


def _large_params():
    return [pytest.param(op, shape, dtype, form, id=f"{op}-{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                         marks=harness.tasks(*(forward_tasks(shape[-1], dtype) if op == "forward" else
                                               ("lab06.1", "lab06.4"))))
            for op in ("forward", "backward") for shape in ((33, 64), (33, 63)) for dtype in DTYPES for form in FORMS]


@requires_gpu
@pytest.mark.parametrize("op, shape, dtype, approximate", _large_params())
def test_large_magnitudes(op, shape, dtype, approximate):
    x, bias, grad_y = large_inputs(shape, dtype)
    what = ", every other column of x ~1e4"
    if op == "forward":
        case = forward_case(x, dtype, approximate) + what
        check_forward(forward(x, bias, approximate, case=case), x, bias, approximate, case=case)
        return
    case = backward_case(x, dtype, approximate) + what
    grad_x, grad_bias = backward(grad_y, x, bias, approximate, case=case)
    check_backward(grad_x, grad_bias, grad_y, x, bias, approximate, case=case)


@requires_gpu
@LARGE
@pytest.mark.parametrize("dtype, shape", [(FP32, BIG), (BF16, (8197, 4096))], ids=["float32", "bfloat16"])
@harness.tasks("lab06.1", "lab06.4")
def test_grad_bias_is_bitwise_deterministic(dtype, shape):
    """The same inputs give the same grad_bias bits on every one of 10 runs: the fused backward's promise."""
    runs = 10
    x, bias, grad_y = inputs(shape, dtype)
    case = backward_case(x, dtype, "none")
    grad_x, first = backward(grad_y, x, bias, case=case)
    check_backward(grad_x, first, grad_y, x, bias, "none", case=case)
    del grad_x
    with harness.calls.unchecked():  # the first call checked the inputs; nine more host copies of 768 MB are waste
        for run in range(2, runs + 1):
            _, again = LAB.module.bias_gelu_backward(grad_y, x, bias)
            if not torch.equal(first, again):
                differ = (first != again).nonzero().flatten().tolist()
                raise harness.GradeFailure(
                    f"{case}: grad_bias of run {run} differs from run 1 in {len(differ)} of {shape[-1]} columns "
                    f"(the first, column {differ[0]}: {first[differ[0]].item()!r} then {again[differ[0]].item()!r}): "
                    "not bitwise identical\n  hint: every addition's order must be fixed by the shape: each "
                    "block's row lanes added in the order 0, 1, ..., its total stored in its own partials slot, and "
                    "the second kernel adding the chunks in order k = 0, 1, ...; atomicAdd (on global or shared "
                    "memory) adds in whatever order the warps and blocks arrive, and float addition is not "
                    "associative")


# ---------------------------------------------------------------- GPU: past 2^31 elements
# (2^16 + 1) x 2^15 bfloat16: 2^31 + 2^15 elements, 4 GiB a tensor. cols % 8 == 0, so the default path is the
# 16-byte kernel (whose vector indices stay below 2^31); vectorized=False runs the scalar kernel, whose element
# index passes 2^31.
HUGE = (2**16 + 1, 2**15)


def huge_inputs(with_grad_y: bool):
    x = torch.randn(HUGE, dtype=BF16, device="cuda")
    bias = torch.randn(HUGE[1], dtype=BF16, device="cuda")
    return x, bias, (torch.randn(HUGE, dtype=BF16, device="cuda") if with_grad_y else None)


def _huge_call(fn, case):
    try:
        out = fn()
        torch.cuda.synchronize()
        return out
    except RuntimeError as error:
        raise harness.GradeFailure(f"{case}: {str(error).splitlines()[0][:300]}\n  hint: {INT64_HINT}") from None


def _columns(part: slice, cols: int):
    return torch.arange(part.start, part.stop, device="cuda") % cols


@requires_gpu
@LARGE
@pytest.mark.parametrize("vectorized", [pytest.param(True, id="vectorized", marks=harness.tasks("lab06.1", "lab06.3")),
                                        pytest.param(False, id="scalar", marks=harness.tasks("lab06.1", "lab06.2"))])
def test_forward_past_2_31_elements(vectorized, gpu_memory):
    gpu_memory(12)
    x, bias, _ = huge_inputs(False)
    case = forward_case(x, BF16, "none", vectorized) + f", {x.numel()} elements = 2^31 + {x.numel() - 2**31}"
    y = _huge_call(lambda: LAB.module.bias_gelu(x, bias, vectorized=vectorized), case)
    check_placement(y, shape=HUGE, like=x, name="y", case=case)
    flat_x, b64 = x.reshape(-1), bias.double()
    harness.check.assert_ends_close(
        y, lambda part: F.gelu(flat_x[part].double() + b64[_columns(part, HUGE[1])]), case=case,
        tol=elementwise_tol(BF16), hint=INT64_HINT)


@requires_gpu
@LARGE
@pytest.mark.parametrize("vectorized", [True, False], ids=["vectorized", "scalar"])
@harness.tasks("lab06.1", "lab06.4")
def test_backward_past_2_31_elements(vectorized, gpu_memory):
    """grad_x checked at its first and last elements, grad_bias (every column sums 65537 rows) in full."""
    gpu_memory(20)
    x, bias, grad_y = huge_inputs(True)
    case = backward_case(x, BF16, "none", vectorized) + f", {x.numel()} elements = 2^31 + {x.numel() - 2**31}"
    grad_x, grad_bias = _huge_call(lambda: LAB.module.bias_gelu_backward(grad_y, x, bias, vectorized=vectorized),
                                   case)
    check_placement(grad_x, shape=HUGE, like=x, name="grad_x", case=case)
    check_placement(grad_bias, shape=HUGE[1:], like=bias, name="grad_bias", case=case)
    flat_x, flat_g, b64 = x.reshape(-1), grad_y.reshape(-1), bias.double()

    def grad_x_of(part):
        u = flat_x[part].double() + b64[_columns(part, HUGE[1])]
        return torch.ops.aten.gelu_backward(flat_g[part].double(), u)

    harness.check.assert_ends_close(grad_x, grad_x_of, case=f"{case}: grad_x", tol=elementwise_tol(BF16),
                                    hint=INT64_HINT)
    del grad_x
    golden = torch.zeros(HUGE[1], dtype=FP64, device="cuda")
    for start in range(0, HUGE[0], 2048):  # float64 in slices of 2048 rows: 512 MiB at a time
        rows = slice(start, start + 2048)
        golden += harness.check.column_sum(torch.ops.aten.gelu_backward(grad_y[rows].double(), x[rows].double() + b64))
    LAB.assert_close(grad_bias, golden, case=f"{case}: grad_bias", tol=grad_bias_tol(BF16, HUGE[0]),
                     hint=INT64_HINT + "; " + GRAD_BIAS_HINT)


# ---------------------------------------------------------------- GPU: through autograd (autograd.py, lab06.5)
def autograd_tasks(cols, dtype) -> tuple[str, ...]:
    return (*forward_tasks(cols, dtype), "lab06.4", "lab06.5")


AUTOGRAD_SHAPES = [(7, 3), (33, 64), (2, 5, 4097)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype, approximate", [
    pytest.param(shape, dtype, form, id=f"{shape_id(shape)}-{dtype_name(dtype)}-{form}",
                 marks=harness.tasks(*autograd_tasks(shape[-1], dtype)))
    for shape in AUTOGRAD_SHAPES for dtype in DTYPES for form in FORMS])
def test_autograd(shape, dtype, approximate):
    """y = autograd.bias_gelu(x, bias, approximate, ops=lab) and torch.autograd.grad(y, (x, bias), grad_y):
    the lab's kernels, through the student's Function, against float64 autograd of F.gelu(x + b)."""
    x, bias, grad_y = inputs(shape, dtype)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    case = f"autograd.bias_gelu of x {shape_id(shape)} {dtype_name(dtype)}, approximate={approximate!r}"
    y = _student(f"{case}: forward", lambda: fn(x, bias, approximate, ops=LAB.module))
    check_forward(y.detach(), x.detach(), bias.detach(), approximate, case=f"{case}: y")
    if y.grad_fn is None:
        raise harness.GradeFailure(f"{case}: y has no grad_fn: it is not connected to x and bias\n  hint: "
                                   + AUTOGRAD_HINT)
    grad_x, grad_bias = _student(f"{case}: torch.autograd.grad",
                                 lambda: torch.autograd.grad(y, (x, bias), grad_y))
    check_backward(grad_x, grad_bias, grad_y, x.detach(), bias.detach(), approximate, case=case,
                   hint=BACKWARD_HINT + "; " + AUTOGRAD_HINT)


@requires_gpu
@pytest.mark.parametrize("shape, approximate", [
    pytest.param(shape, form, id=f"{shape_id(shape)}-{form}", marks=harness.tasks(*autograd_tasks(shape[-1], FP64)))
    for shape in [(4, 3), (3, 8), (2, 3, 2)] for form in FORMS])
def test_gradcheck(shape, approximate):
    """torch.autograd.gradcheck in float64 on the real kernels, through the student's Function: the analytic
    gradients (the backward kernel) against finite differences of the forward kernel."""
    fn = autograd_module().bias_gelu
    x = random_tensor(shape, FP64).requires_grad_()
    bias = random_tensor(shape[-1:], FP64).requires_grad_()
    case = f"gradcheck of autograd.bias_gelu on x {shape_id(shape)} float64, approximate={approximate!r}"
    try:
        torch.autograd.gradcheck(lambda a, b: fn(a, b, approximate, ops=LAB.module), (x, bias))
    except torch.autograd.gradcheck.GradcheckError as error:
        raise harness.GradeFailure(f"{case}: {str(error)[:1500]}\n  hint: the float64 path must compute in double "
                                   "(Compute<double> = double: erf, tanh and exp of double, not erff); "
                                   + BACKWARD_HINT) from None


@requires_gpu
@pytest.mark.parametrize("how", ["y.sum()", "transposed"])
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_autograd_non_contiguous_grad_y(how):
    """grad_y need not be contiguous: y.sum()'s is a 1 expanded to y's shape (every stride 0), a transposed
    view's is transposed. The Function must accept both (the op itself refuses them)."""
    x, bias, _ = inputs((64, 256), FP32)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    y = fn(x, bias, ops=LAB.module)
    grad_y = torch.ones_like(y).expand_as(y) if how == "y.sum()" else random_tensor((256, 64), FP32).t()
    case = f"autograd.bias_gelu of x 64x256 float32, grad_y {how} (strides {list(grad_y.stride())})"
    if how == "y.sum()":
        _student(f"{case}: y.sum().backward()", lambda: y.sum().backward())
        grad_x, grad_bias = x.grad, bias.grad
    else:
        grad_x, grad_bias = _student(case, lambda: torch.autograd.grad(y, (x, bias), grad_y))
    check_backward(grad_x, grad_bias, grad_y.contiguous(), x.detach(), bias.detach(), "none", case=case,
                   hint=AUTOGRAD_HINT, grad_bias_hint=AUTOGRAD_HINT)


@requires_gpu
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_loss_backward_through_a_small_mlp():
    """loss.backward() through Linear -> bias_gelu -> Linear -> MSE, in float32: every parameter's gradient
    against the same model in float64 with F.gelu(h + b1)."""
    fn = autograd_module().bias_gelu
    x = random_tensor((2, 33, 64), FP32)
    w1 = (random_tensor((96, 64), FP32) / 8).requires_grad_()
    b1 = random_tensor((96,), FP32).requires_grad_()
    w2 = (random_tensor((40, 96), FP32) / 10).requires_grad_()
    target = random_tensor((2, 33, 40), FP32)

    def model(gelu, x_, w1_, b1_, w2_):
        return F.mse_loss(gelu(x_ @ w1_.t(), b1_) @ w2_.t(), target.to(x_.dtype))

    case = "loss.backward() through x @ w1.T -> autograd.bias_gelu(., b1) -> @ w2.T -> mse_loss, float32"
    loss = _student(f"{case}: forward", lambda: model(lambda h, b: fn(h, b, ops=LAB.module), x, w1, b1, w2))
    _student(f"{case}: loss.backward()", loss.backward)
    params64 = [p.detach().double().requires_grad_() for p in (w1, b1, w2)]
    loss64 = model(lambda h, b: F.gelu(h + b), x.double(), *params64)
    loss64.backward()
    tol = tolerance(FP32, 4096) * 2  # products and sums over 64-132 terms, then the GELU: 2x its u sqrt(K)
    LAB.assert_close(loss.detach(), loss64.detach(), case=f"{case}: the loss", tol=tol, hint=AUTOGRAD_HINT)
    for name, p, p64 in zip(("w1", "b1", "w2"), (w1, b1, w2), params64):
        if p.grad is None:
            raise harness.GradeFailure(f"{case}: {name}.grad is None after loss.backward()\n  hint: {AUTOGRAD_HINT}")
        LAB.assert_close(p.grad, p64.grad, case=f"{case}: {name}.grad", tol=tol, hint=AUTOGRAD_HINT)


# ---------------------------------------------------------------- GPU: bad input gets a clear error
@requires_gpu
@harness.reference_check  # the wrapper's checks are given
def test_input_errors():
    x, bias, grad_y = inputs((16, 16), FP32)
    fwd, bwd = LAB.module.bias_gelu, LAB.module.bias_gelu_backward
    cases = [
        (lambda: fwd(x, bias.bfloat16()), ("dtype", "bias.to(torch.float32)"), "bias_gelu(x float32, bias bfloat16)"),
        (lambda: fwd(x.int(), bias.int()), ("dtype", "torch.float32", "x.float()"), "bias_gelu(x and bias int32)"),
        (lambda: fwd(x, bias[:8]), ("bias", "shape", "16"), "bias_gelu(x [16, 16], bias [8])"),
        (lambda: fwd(x, bias.view(4, 4)), ("bias", "shape"), "bias_gelu(x [16, 16], bias [4, 4])"),
        (lambda: fwd(x[0, 0], bias[:1]), ("dimension",), "bias_gelu(x 0-dim)"),
        (lambda: fwd(x.t(), bias), ("contiguous", "x.contiguous()"), "bias_gelu(x.t(), a non-contiguous view)"),
        (lambda: fwd(x[:, ::2], bias[:8]), ("contiguous", "x.contiguous()"), "bias_gelu(x[:, ::2])"),
        (lambda: fwd(x.cpu(), bias), ("CUDA", "x.cuda()"), "bias_gelu(x on the CPU, bias on the GPU)"),
        (lambda: fwd(x, bias.cpu()), ("CUDA", "bias.cuda()"), "bias_gelu(x on the GPU, bias on the CPU)"),
        (lambda: fwd(x, bias, approximate="Tanh"), ("approximate", "none", "tanh"), "bias_gelu(approximate='Tanh')"),
        (lambda: bwd(grad_y[:8], x, bias), ("shape",), "bias_gelu_backward(grad_y [8, 16], x [16, 16])"),
        (lambda: bwd(grad_y.double(), x, bias), ("dtype", "grad_y.to(torch.float32)"),
         "bias_gelu_backward(grad_y float64, x float32)"),
        (lambda: bwd(grad_y.t(), x, bias), ("contiguous", "grad_y.contiguous()"),
         "bias_gelu_backward(grad_y.t(), non-contiguous)"),
        (lambda: bwd(grad_y.cpu(), x, bias), ("CUDA",), "bias_gelu_backward(grad_y on the CPU)"),
        (lambda: bwd(grad_y, x.t(), bias), ("contiguous", "x.contiguous()"), "bias_gelu_backward(x.t())"),
        (lambda: bwd(grad_y, x, bias.half()), ("dtype", "bias.to(torch.float32)"),
         "bias_gelu_backward(x float32, bias float16)"),
    ]
    for fn, words, what in cases:
        LAB.assert_raises_clearly(fn, must_mention=words, case=what)


@requires_gpu
@harness.reference_check  # the same-device check is given
def test_refuses_bias_on_another_gpu():
    skip_without_two_gpus("a bias on another GPU than x")
    x, bias, _ = inputs((16, 16), FP32)
    LAB.assert_raises_clearly(lambda: LAB.module.bias_gelu(x, bias.to("cuda:1")), must_mention=("same device",),
                              case="bias_gelu(x on cuda:0, bias on cuda:1)")


@requires_gpu
@harness.reference_check  # the device guard is given
def test_inputs_on_another_gpu():
    """x and bias on cuda:1 while cuda:0 is current: outputs on cuda:1, computed there."""
    skip_without_two_gpus("a bias on another GPU than x")
    torch.cuda.set_device(0)
    x, bias, grad_y = (t.to("cuda:1") for t in inputs((33, 64), FP32))
    y = LAB.module.bias_gelu(x, bias)
    grad_x, grad_bias = LAB.module.bias_gelu_backward(grad_y, x, bias)
    torch.cuda.synchronize(1)
    check_forward(y, x, bias, "none", case="bias_gelu of inputs on cuda:1 with cuda:0 current")
    check_backward(grad_x, grad_bias, grad_y, x, bias, "none",
                   case="bias_gelu_backward of inputs on cuda:1 with cuda:0 current")


# ---------------------------------------------------------------- GPU: every op on the current stream
@requires_gpu
@harness.tasks("lab06.1", "lab06.2", "lab06.3", "lab06.4")
def test_runs_on_current_stream():
    """Every kernel and memset of both ops must run on PyTorch's current stream: checked by capturing them all
    in one CUDA graph on a side stream and replaying it on fresh inputs (harness.STREAM_HINT says why)."""
    x, bias, grad_y = inputs((64, 256), FP32)  # 256 % 4 == 0: the 16-byte kernels
    odd_x, odd_bias, odd_grad_y = inputs((33, 3), BF16)  # the scalar kernels, chosen by the launcher
    empty_x, empty_bias, empty_grad_y = inputs((0, 16), FP32)  # grad_bias of no rows: a memset

    def run_all():
        return {
            "bias_gelu (16-byte kernel)": LAB.module.bias_gelu(x, bias, approximate="tanh"),
            "bias_gelu (vectorized=False)": LAB.module.bias_gelu(x, bias, vectorized=False),
            "bias_gelu (33x3 bfloat16, scalar)": LAB.module.bias_gelu(odd_x, odd_bias),
            "bias_gelu_backward (16-byte loads)": LAB.module.bias_gelu_backward(grad_y, x, bias),
            "bias_gelu_backward (vectorized=False)": LAB.module.bias_gelu_backward(grad_y, x, bias, vectorized=False),
            "bias_gelu_backward (33x3 bfloat16)": LAB.module.bias_gelu_backward(odd_grad_y, odd_x, odd_bias),
            "bias_gelu_backward (0 rows)": LAB.module.bias_gelu_backward(empty_grad_y, empty_x, empty_bias),
        }

    outs = LAB.capture_on_current_stream(run_all, inputs=(x, bias, grad_y, odd_x, odd_bias, odd_grad_y),
                                         case="bias_gelu and bias_gelu_backward")
    replayed = " replayed from a CUDA graph"
    hint = harness.STREAM_HINT
    for name, out in outs.items():
        case = name + replayed
        if "(0 rows)" in name:
            assert bool((out[1] == 0).all()), f"{case}: grad_bias must be zeros, got {out[1].tolist()}\n  hint: {hint}"
        elif name.startswith("bias_gelu_backward"):
            g, a, b = (odd_grad_y, odd_x, odd_bias) if "33x3" in name else (grad_y, x, bias)
            check_backward(*out, g, a, b, "none", case=case, hint=hint, grad_bias_hint=hint)
        else:
            a, b = (odd_x, odd_bias) if "33x3" in name else (x, bias)
            check_forward(out, a, b, "tanh" if "16-byte" in name else "none", case=case, hint=hint)


# ---------------------------------------------------------------- GPU: speed
# At (8192, 8192), 256 MiB a float32 tensor, everything is memory-bound: bytes moved / time is the measure.
# Bytes: forward reads x and writes y (2 tensors); backward reads grad_y and x and writes grad_x (3 tensors);
# bias, grad_bias and the partials are under 1% and counted as C elements each.
PERF_SHAPE = (8192, 8192)
PERF_DTYPES = [FP32, BF16]
# (reference target, student bar) per dtype, held in the same run on the same GPU.
# Reference targets: issue 12's "Speed": >= 0.90x copy, forward and backward; >= 2.0x eager and >= 0.95x compiled
# forward; >= 1.05x compiled forward+backward; vectorized >= 1.3x scalar in bf16. Measured on an NVIDIA H100 80GB HBM3
# (2026-11-26, second session, `./course bench 06 --impl solutions --json`, site/data/bench/06-fused-elementwise.json;
# `./course test 06` in the same session agrees to 0.01 on every copy ratio): forward vs copy 1.00 (fp32) / 0.99
# (bf16), backward 0.96 / 0.93; vs eager 2.20 / 2.86; vs compiled 1.00 / 1.17; forward+backward vs compiled 1.17 /
# 1.31; vectorized vs scalar 2.86. Every target that is the issue's own figure holds there with a margin of 5% or
# more. bfloat16 vs copy is the exception to the 0.90: with erff the bf16 erf kernels reached 0.83-0.85x
# forward and 0.87-0.89x backward on an H100 (2026-11-22) and 0.652-0.66x / 0.71-0.713x on an NVIDIA H200
# (2026-11-26), whose 4.2 TB/s copy against the H100's 3.0 with the same SMs leaves an arithmetic-bound kernel further
# behind. The 16-bit erf kernels now compute the exp2 GELU (gelu.cuh, gelu_erf_exp2), and the lab's kernels with it
# reach the H100 figures above (0.99 / 0.93). On the H200 only the probe's kernels with the same formula have been
# timed (site/data/evidence/06-fused-elementwise/gelu_erf.py, 2026-11-26): 0.885x forward (one row a thread),
# 0.892x backward; on the H100 the same probe's kernels came within 1% of the lab's (0.994 vs 0.987, 0.921 vs 0.926).
# So the bf16 copy targets are 0.85 forward and backward: under both machines' figures with a 4-16% margin, and below
# the 0.90, which the H200 figures miss. Student bars stay below what erff reaches (H200: 0.65x / 0.71x),
# since a student may keep erff.
# Student bars (issue 11, class 6): a straightforward fused, vectorized kernel passes, the lesson's technique
# removed fails:
#   - copy: 0.70 fp32 (an unfused x + b pass moves 2x the bytes: <= 0.5); bf16 0.55 (the scalar kernel: 0.31);
#     backward 0.65 / 0.60 likewise (a backward that reads grad_x again for grad_bias moves 4/3 the bytes);
#   - eager 1.5 fp32, 1.4 bf16: no fusion is ~1.0x;
#   - compiled 0.75 and forward+backward 0.85: unfused kernels do not pass;
#   - vectorized vs scalar 1.15 (bf16): the no-vectorization mutant measured 0.999x (H100) and fails; the reference
#     2.86x (H100, the bench above).
PERF_BARS = {
    ("forward vs copy", FP32): (0.90, 0.70), ("forward vs copy", BF16): (0.85, 0.55),
    ("backward vs copy", FP32): (0.90, 0.65), ("backward vs copy", BF16): (0.85, 0.60),
    ("forward vs eager", FP32): (2.0, 1.5), ("forward vs eager", BF16): (2.0, 1.4),
    ("forward vs compiled", FP32): (0.95, 0.75), ("forward vs compiled", BF16): (0.95, 0.75),
    ("forward+backward vs compiled", FP32): (1.05, 0.85), ("forward+backward vs compiled", BF16): (1.05, 0.85),
    ("vectorized vs scalar", BF16): (1.3, 1.15),
}
# Per GPU, where the reference measured under the common target there. The bfloat16 forward against copy on an
# NVIDIA H200: 0.82x in this grader (2026-12-02, `pytest tests/test_06_fused_elementwise.py -m perf`, 76% of copy),
# 0.75-0.82x with triton.testing.do_bench; on an H100 0.99x. The H200 copies 1.4x as fast with the same SMs and clock,
# so the GELU's arithmetic no longer hides under the memory time (a faster kernel there is an open problem: the
# probe's one-row-a-thread kernel measured 0.885x on an H200, 2026-11-26). The lesson's bar table says so.
TARGETS_BY_GPU = {("forward vs copy", BF16): {"H200": 0.75}}
PERF_HINTS = {
    "forward vs copy": "read x once and write y once with 16-byte vectors (one Pack<T, kElems> per access), "
                       "the bias pack loaded once per vector, and no 64-bit division per element",
    "backward vs copy": "one pass: grad_y and x read once, grad_x written once, the column sums kept in registers; a "
                        "warp's lanes on consecutive columns of one row (coalesced), 16-byte loads when aligned",
    "forward vs eager": "fusion is the point: x + b never goes to memory; then the forward-vs-copy hints",
    "forward vs compiled": "Inductor's kernel is fused and vectorized too: the forward-vs-copy hints close the gap",
    "forward+backward vs compiled": "both kernels near copy bandwidth, and nothing saved but x and bias (no x + b "
                                    "tensor written in the forward)",
    "vectorized vs scalar": "the 16-byte kernel must use 16-byte loads and stores (one Pack<T, kElems> per access) "
                            "and the launcher must take it whenever vectorizable()",
}
_COMPILED: dict = {}


def unfused(x, b):
    return F.gelu(x + b)


def compiled_unfused(*example):
    """torch.compile of F.gelu(x + b), compiled once per process and warmed on `example` (a compile is seconds;
    a compile that cannot run here skips the test: the baseline's failure is not the lab's)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(unfused, dynamic=False)
    fn = _COMPILED["fn"]
    try:
        out = fn(*example)
        if any(t.requires_grad for t in example):
            torch.autograd.grad(out, example, torch.ones_like(out))
        torch.cuda.synchronize()
    except Exception as error:  # Inductor needs Triton and a C compiler
        pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {str(error).splitlines()[0][:200]})")
    return fn


def _perf(kind, *, dtype, ours, baseline, baseline_name, bytes_moved, verify, inputs):
    target, student_bar = PERF_BARS[kind, dtype]
    target = harness.perf.target_on_this_gpu(target, TARGETS_BY_GPU.get((kind, dtype), {}))
    try:
        return LAB.perf(name=f"{kind}, {shape_id(PERF_SHAPE)} {dtype_name(dtype)}", ours=ours, baseline=baseline,
                        baseline_name=baseline_name, bytes_moved=bytes_moved, student_bar=student_bar, target=target,
                        verify=verify, inputs=inputs)
    except harness.GradeFailure as failure:
        raise harness.GradeFailure(f"{failure}\n  hint: {PERF_HINTS[kind]}") from None


def _perf_forward(kind, dtype, baseline, baseline_name):
    x, bias, _ = inputs(PERF_SHAPE, dtype)
    last = {}

    def ours():
        last["y"] = LAB.module.bias_gelu(x, bias)

    def verify():
        check_forward(last["y"], x, bias, "none", case=f"bias_gelu {shape_id(PERF_SHAPE)}: the output of the timed "
                      "calls", hint=VECTOR_HINT)

    _perf(kind, dtype=dtype, ours=ours, baseline=baseline(x, bias), baseline_name=baseline_name,
          bytes_moved=2 * nbytes(x) + 2 * nbytes(bias), verify=verify, inputs=(x, bias))


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_copy(dtype):
    def copy_of_same_bytes(x, bias):
        dst = torch.empty_like(x)
        return lambda: dst.copy_(x)

    _perf_forward("forward vs copy", dtype, copy_of_same_bytes, "dst.copy_(x), the same bytes moved")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_eager(dtype):
    _perf_forward("forward vs eager", dtype, lambda x, bias: lambda: F.gelu(x + bias), "F.gelu(x + b)")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3")
def test_perf_forward_vs_compiled(dtype):
    def compiled(x, bias):
        fn = compiled_unfused(x, bias)
        return lambda: fn(x, bias)

    _perf_forward("forward vs compiled", dtype, compiled, "torch.compile(F.gelu(x + b))")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab06.1", "lab06.3")
def test_perf_vectorized_vs_scalar():
    _perf_forward("vectorized vs scalar", BF16,
                  lambda x, bias: lambda: LAB.module.bias_gelu(x, bias, vectorized=False),
                  "bias_gelu(vectorized=False), the lab's scalar kernel")


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.4")
def test_perf_backward_vs_copy(dtype):
    x, bias, grad_y = inputs(PERF_SHAPE, dtype)
    src = torch.empty(x.numel() * 3 // 2, dtype=dtype, device="cuda")  # 3 tensors of traffic: 1.5 read + 1.5 written
    dst = torch.empty_like(src)
    last = {}

    def ours():
        last["grads"] = LAB.module.bias_gelu_backward(grad_y, x, bias)

    def verify():
        check_backward(*last["grads"], grad_y, x, bias, "none",
                       case=f"bias_gelu_backward {shape_id(PERF_SHAPE)}: the output of the timed calls")

    _perf("backward vs copy", dtype=dtype, ours=ours, baseline=lambda: dst.copy_(src),
          baseline_name="a device-to-device copy of the same bytes", bytes_moved=3 * nbytes(x) + 2 * nbytes(bias),
          verify=verify, inputs=(x, bias, grad_y))


@requires_gpu
@pytest.mark.perf
@pytest.mark.parametrize("dtype", PERF_DTYPES, ids=dtype_name)
@harness.tasks("lab06.1", "lab06.3", "lab06.4", "lab06.5")
def test_perf_forward_backward_vs_compiled(dtype):
    """y = bias_gelu(x, b) then torch.autograd.grad(y, (x, b), grad_y), through autograd.py, against the same
    with torch.compile of F.gelu(x + b) (Inductor's fused forward and backward kernels)."""
    x, bias, grad_y = inputs(PERF_SHAPE, dtype)
    x.requires_grad_()
    bias.requires_grad_()
    fn = autograd_module().bias_gelu
    compiled = compiled_unfused(x, bias)
    last = {}

    def ours():
        last["grads"] = torch.autograd.grad(fn(x, bias, ops=LAB.module), (x, bias), grad_y)

    def baseline():
        torch.autograd.grad(compiled(x, bias), (x, bias), grad_y)

    def verify():
        check_backward(*last["grads"], grad_y, x.detach(), bias.detach(), "none",
                       case=f"autograd.bias_gelu {shape_id(PERF_SHAPE)} backward: the output of the timed calls")

    _perf("forward+backward vs compiled", dtype=dtype, ours=ours, baseline=baseline,
          baseline_name="torch.compile(F.gelu(x + b)), forward and backward",
          bytes_moved=5 * nbytes(x) + 4 * nbytes(bias), verify=verify, inputs=(x, bias, grad_y))


# ---------------------------------------------------------------- the notebook
# The notebook is clean (no outputs, valid cells) everywhere, and runs top to bottom on a GPU.
test_notebook_is_clean, test_notebook_runs = notebooks.tests_for(LAB)


# ---------------------------------------------------------------- known-wrong variants the grader must fail
_SCALAR_LOOP = ("for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; "
                "i += grid_threads) {")
_BLOCK_REDUCE = """\
#pragma unroll
    for (int e = 0; e < kElems; ++e) lane_sums[row_lane][e][lane] = sums[e];
    __syncthreads();  // every row lane's sums are in shared memory before row lane 0 reads them
    if (row_lane == 0 && in_matrix) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        C total = lane_sums[0][e][lane];
#pragma unroll
        for (int r = 1; r < kRowLanes; ++r) total += lane_sums[r][e][lane];
"""
# The block's row lanes combined with atomicAdd on one shared slot per column: right to rounding, but the adds
# happen in the order the 8 warps arrive, which varies from run to run.
_ATOMIC_BLOCK_REDUCE = """\
    if (row_lane == 0) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) lane_sums[0][e][lane] = C(0);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < kElems; ++e) atomicAdd(&lane_sums[0][e][lane], sums[e]);
    __syncthreads();
    if (row_lane == 0 && in_matrix) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        C total = lane_sums[0][e][lane];
"""
MUTANTS = [
    # Out-of-bounds write (issue 11, class 1): one index past the end, y[n], lands in the allocator's slack after y,
    # where no comparison of y sees it; the poisoned pool's guard does.
    harness.Mutant("scalar-bound-off-by-one", "forward.cu", _SCALAR_LOOP, _SCALAR_LOOP.replace("i < n;", "i <= n;"),
                   tests="test_forward and 7x3", expect="wrote past the end of y"),
    harness.Mutant("vector-bound-off-by-one", "forward.cu", "v < n_vectors; v += grid_threads) {",
                   "v <= n_vectors; v += grid_threads) {", tests="test_forward and 7x8",
                   expect="wrote past the end of y"),
    # The backward's last chunk: rows past the end computed and stored from registers never loaded.
    harness.Mutant("backward-rows-unguarded", "backward.cu",
                   "        if (in_matrix && row < rows) {\n          Vector gx;",
                   "        if (in_matrix) {\n          Vector gx;", tests="test_backward and 7x3",
                   expect="wrote past the end of grad_x"),
    harness.Mutant("bias-indexed-by-row", "forward.cu", "u = to_compute(x[i]) + to_compute(bias[i % cols]);",
                   "u = to_compute(x[i]) + to_compute(bias[i / cols]);",
                   tests="test_forward and 7x3", expect="elements wrong"),
    # The erf form's formula under approximate='tanh' and the other way round (they differ by up to ~2e-4); float32,
    # whose erf form is the erff one (the 16-bit types' exp2 branch comes first and stays the erf form's).
    harness.Mutant("gelu-forms-swapped", "gelu.cuh",
                   "  } else if constexpr (kForm == GeluForm::kErf) {\n    return F(0.5) * u * (F(1) + erf_of(",
                   "  } else if constexpr (kForm == GeluForm::kTanh) {\n    return F(0.5) * u * (F(1) + erf_of(",
                   tests="test_forward and float32", expect="elements wrong"),
    # float64 run through float's erf: right to 1e-7, which float64's tolerance (and gradcheck) must not accept.
    harness.Mutant("erff-in-the-double-path", "gelu.cuh", "double erf_of(double v) { return erf(v); }",
                   "double erf_of(double v) { return erff(v); }", tests="test_forward and float64 and none",
                   expect="elements wrong"),
    # GELU'(u) = Phi(u) + u phi(u): the product rule's second term forgotten.
    # tanh by its definition, (e^2k - 1) / (e^2k + 1) (issue 34, class b): the same numbers for |u| up to ~10,
    # inf / inf = NaN past it (e^2k overflows float32 for u > ~11).
    harness.Mutant("tanh-by-its-definition", "gelu.cuh", "return u * sigmoid_2k(k).value;",
                   "return F(0.5) * u * (F(1) + (exp_of(F(2) * k) - F(1)) / (exp_of(F(2) * k) + F(1)));",
                   tests="test_large_magnitudes and forward and tanh", expect="elements wrong"),
    harness.Mutant("derivative-missing-u-phi", "gelu.cuh", "    return cdf + u * pdf;", "    return cdf;",
                   tests="test_backward and float32 and none", expect="elements wrong"),
    harness.Mutant("grad-bias-from-one-chunk", "backward.cu", "for (int64_t k = row_lane; k < chunks; k += kRowLanes)",
                   "for (int64_t k = row_lane; k < 1; k += kRowLanes)", tests="test_backward and 8192x3",
                   expect="grad_bias"),
    # 32-bit count (issue 11, class 4): rows * cols = 2^31 + 2^15 wraps negative in an int: the 16-byte kernel's
    # launch fails, the scalar kernel writes nothing. (A wrapped int loop index would more likely hang.)
    harness.Mutant("int32-element-count", "forward.cu", "  const int64_t n = rows * cols;\n  if (vectorized",
                   "  const int n = rows * cols;\n  if (vectorized", tests="test_forward_past_2_31", expect="int64_t"),
    # Stream misuse (issue 11, class 3): the backward's second kernel on the legacy default stream.
    harness.Mutant("finalize-on-legacy-stream", "backward.cu",
                   "grad_bias_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock, 0, stream>>>",
                   "grad_bias_finalize_kernel<T><<<finalize_blocks, kThreadsPerBlock>>>",
                   tests="test_runs_on_current_stream", expect="legacy default stream"),
    harness.Mutant("atomic-block-reduce", "backward.cu", _BLOCK_REDUCE, _ATOMIC_BLOCK_REDUCE,
                   tests="bitwise", expect="not bitwise identical"),
    # The alignment test dropped from vectorizable(): x[1:] then takes 16-byte loads at a 4-byte offset.
    harness.Mutant("alignment-ignored", "forward.cu",
                   "if (vectorized && vectorizable(cols, kElemsPerVector<T>, {x, bias, y})) {",
                   "if (vectorized && cols % kElemsPerVector<T> == 0) {",
                   tests="test_forward_unaligned", expect="misaligned address"),
    # Perf (issue 11, class 6): the lesson's technique removed: the launcher never takes the 16-byte kernel.
    harness.Mutant("no-vectorization", "forward.cu",
                   "if (vectorized && vectorizable(cols, kElemsPerVector<T>, {x, bias, y}))",
                   "if (false && vectorizable(cols, kElemsPerVector<T>, {x, bias, y}))",
                   tests="test_perf_vectorized_vs_scalar", expect="below the student bar", perf=True),
    # autograd.py (lab06.5), caught without a GPU: y.sum()'s grad_y (a stride-0 expanded 1) passed on as it is.
    harness.Mutant("grad-y-not-made-contiguous", "autograd.py", "bias_gelu_backward(grad_y.contiguous(), x,",
                   "bias_gelu_backward(grad_y, x,", tests="test_autograd_on_cpu", expect="contiguous",
                   needs_gpu=False),
    harness.Mutant("approximate-not-passed", "autograd.py", "y = ops.bias_gelu(x, bias, approximate)",
                   "y = ops.bias_gelu(x, bias)", tests="test_autograd_on_cpu and tanh", expect="elements wrong",
                   needs_gpu=False),
]
