"""triton_rms_norm.py (lab07.8 the forward, lab07.9 the backward), the same RMSNorm in Triton as a
torch.library.triton_op. Without a GPU: the ops registered, their outputs' metadata on fake tensors (and on a GPU,
the same as the real outputs'), their checks. On the GPU: against float64, where eps decides, grad_weight bitwise the
same run after run, the kernels under stress, and torch.compile of a small model around the op without a graph break."""
from __future__ import annotations

import pytest
import torch

import harness
from grader07.common import (
    BF16,
    EPS,
    FP16,
    FP32,
    LAB,
    LARGE,
    PATTERN_SHAPE,
    REDUCTION_HEADROOM,
    RMS_PATTERNS,
    TRITON_DTYPES,
    TRITON_HINT,
    check_rms_norm,
    check_rms_norm_backward,
    randn,
    rms_inputs,
    rows_of,
    triton_module,
)
from harness import random_tensor, requires_gpu, stress, tolerance
from harness.check import dtype_name, first_line, nbytes, run_student, shape_id

# The tests in their order. Those of the section without a GPU (fake tensors; test_triton_fake_matches_real
# compares them with a GPU's) are collected with the build's, before any kernel's; the others after the kernels'.
WITHOUT_GPU = [
    "test_triton_op_is_registered", "test_triton_fake_shapes", "test_triton_fake_matches_real",
    "test_triton_refuses_bad_input",
]
__all__ = [
    *WITHOUT_GPU, "test_triton_rms_norm", "test_triton_rms_norm_eps",
    "test_triton_grad_weight_is_bitwise_deterministic", "test_triton_stress",
    "test_triton_op_compiles_without_graph_breaks",
]


# ---------------------------------------------------------------- the Triton op without a GPU
def _student_triton(what: str, fn):
    return run_student(what, fn, hint=TRITON_HINT)


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@harness.reference_check  # the registration (triton_op, register_autograd) is given
def test_triton_op_is_registered():
    """Importing triton_rms_norm.py registers course07::rms_norm_fwd and course07::rms_norm_bwd with the dispatcher,
    and an autograd formula for the forward: on any machine, no GPU needed."""
    triton_module()
    for name in ("rms_norm_fwd", "rms_norm_bwd"):
        assert hasattr(torch.ops.course07, name), (
            f"torch.ops.course07.{name} does not exist after importing triton_rms_norm.py: register it with "
            f"@torch.library.triton_op('course07::{name}', mutates_args=())")


@pytest.mark.parametrize("dtype", TRITON_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 4097), (2, 20000), (0, 64)], ids=shape_id)
@harness.reference_check  # the ops' bodies outside the kernels (outputs, grid, checks) are given
def test_triton_fake_shapes(shape, dtype):
    """On fake tensors (FakeTensorMode: metadata only, as torch.compile traces), the ops give outputs of the right
    shapes, dtypes and (contiguous) strides without launching anything: what lets torch.compile plan a graph around
    them."""
    triton_module()
    n = shape[-1]
    with _fake_mode():
        x = torch.empty(shape, dtype=dtype, device="cuda")
        weight = torch.empty(n, dtype=dtype, device="cuda")
        y, rstd = torch.ops.course07.rms_norm_fwd(x, weight, EPS)
        grad_x, grad_weight = torch.ops.course07.rms_norm_bwd(torch.empty_like(x), x, weight, rstd)
    case = f"course07::rms_norm_fwd / rms_norm_bwd on fake tensors x {shape_id(shape)} {dtype_name(dtype)}"
    for name, out, want_shape, want_dtype in (("y", y, shape, dtype), ("rstd", rstd, shape[:-1], FP32),
                                              ("grad_x", grad_x, shape, dtype), ("grad_weight", grad_weight, (n,),
                                                                                 dtype)):
        want_strides = torch.empty(want_shape, device="meta").stride()
        assert (tuple(out.shape) == tuple(want_shape) and out.dtype == want_dtype and out.device.type == "cuda"
                and out.stride() == want_strides), (
            f"{case}: {name} is {dtype_name(out.dtype)}{list(out.shape)} strides {list(out.stride())} on {out.device}, "
            f"expected {dtype_name(want_dtype)}{list(want_shape)} strides {list(want_strides)} on cuda")


def _metadata(t: torch.Tensor) -> tuple:
    """What a layout is: shape, the strides of the dimensions longer than 1 (a size-1 dimension's stride addresses
    nothing, and PyTorch's own empty_like keeps it on real tensors but not on fake ones: (231, 33, 5, 1) against
    (231, 33, 33, 1) for a (2, 7, 1, 33) x), dtype, storage offset."""
    strides = tuple(stride if size > 1 else None for stride, size in zip(t.stride(), t.shape))
    return tuple(t.shape), strides, t.dtype, t.storage_offset()


# Inputs the ops take whose layout is not the plain one (issue 34, class c): a size-1 dimension with a stride of its own
# (still contiguous), a weight that starts inside its storage, a 3-D x.
def _odd_layout_inputs(dtype):
    x = torch.randn(2, 7, 1, 33, device="cuda").to(dtype).as_strided((2, 7, 1, 33), (231, 33, 5, 1))
    weight = torch.randn(40, device="cuda").to(dtype)[5:38]
    return x, weight, torch.randn(2, 7, 1, 33, device="cuda").to(dtype)


@requires_gpu
@pytest.mark.parametrize("dtype", TRITON_DTYPES, ids=dtype_name)
@harness.tasks("lab07.8", "lab07.9")
def test_triton_fake_matches_real(dtype):
    """The ops on fake copies of real inputs (FakeTensorMode.from_tensor, as torch.compile sees them) give outputs of
    the real ones' shapes, strides, dtypes and storage offsets, on inputs of an unusual but accepted layout."""
    triton_module()
    x, weight, grad_y = _odd_layout_inputs(dtype)
    ops = torch.ops.course07
    real_y, real_rstd = _student_triton("rms_norm_fwd", lambda: ops.rms_norm_fwd(x, weight, EPS))
    real = (real_y, real_rstd, *_student_triton("rms_norm_bwd", lambda: ops.rms_norm_bwd(grad_y, x, weight,
                                                                                         real_rstd)))
    with _fake_mode() as mode:
        fx, fw, fg = (mode.from_tensor(t) for t in (x, weight, grad_y))
        fake_y, fake_rstd = ops.rms_norm_fwd(fx, fw, EPS)
        fake = (fake_y, fake_rstd, *ops.rms_norm_bwd(fg, fx, fw, fake_rstd))
    case = f"course07::rms_norm_fwd / rms_norm_bwd of x {list(x.shape)} strides {list(x.stride())} {dtype_name(dtype)}"
    for name, r, f in zip(("y", "rstd", "grad_x", "grad_weight"), real, fake):
        if _metadata(r) != _metadata(f):
            raise harness.GradeFailure(f"{case}: {name} on the GPU is (shape, strides, dtype, offset) {_metadata(r)}, "
                                       f"on fake tensors {_metadata(f)}: torch.compile plans with the fake's\n  hint: "
                                       "allocate outputs the same way whatever the tensors are (torch.empty_like(x) "
                                       "of the checked, contiguous x; no branch on is_fake)")


@harness.reference_check  # the ops' checks are given
def test_triton_refuses_bad_input():
    """The Triton op's checks run before any launch, on fake tensors too (torch.compile traces them): testable
    without a GPU."""
    triton_module()
    fwd, bwd = torch.ops.course07.rms_norm_fwd, torch.ops.course07.rms_norm_bwd
    LAB.assert_raises_clearly(lambda: fwd(torch.ones(4, 8), torch.ones(8), EPS), must_mention=("CUDA", "x.cuda()"),
                              case="course07::rms_norm_fwd(x on the CPU)")
    with _fake_mode():
        x = torch.empty(16, 32, dtype=BF16, device="cuda")
        w = torch.empty(32, dtype=BF16, device="cuda")
        rstd = torch.empty(16, dtype=FP32, device="cuda")
        cases = [
            (lambda: fwd(x, w.float(), EPS), ("dtype", "weight.to(torch.bfloat16)"),
             "rms_norm_fwd(x bfloat16, weight float32)"),
            (lambda: fwd(x, w[:16], EPS), ("weight", "shape", "32"), "rms_norm_fwd(x [16, 32], weight [16])"),
            (lambda: fwd(x.t(), torch.empty(16, dtype=BF16, device="cuda"), EPS), ("contiguous", "x.contiguous()"),
             "rms_norm_fwd(x.t())"),
            (lambda: fwd(x.double(), w.double(), EPS), ("float64",), "rms_norm_fwd(x float64)"),
            (lambda: fwd(x, w, -1.0), ("eps",), "rms_norm_fwd(eps=-1)"),
            (lambda: fwd(x, w, float("nan")), ("eps", "finite"), "rms_norm_fwd(eps=nan)"),
            (lambda: bwd(x[:8], x, w, rstd), ("grad_y", "shape"), "rms_norm_bwd(grad_y [8, 32], x [16, 32])"),
            (lambda: bwd(x, x, w, rstd.double()), ("rstd", "float32"), "rms_norm_bwd(rstd float64)"),
            (lambda: bwd(x, x, w, rstd[:8]), ("rstd", "16"), "rms_norm_bwd(rstd [8] for 16 rows)"),
        ]
        for fn, words, what in cases:
            LAB.assert_raises_clearly(fn, must_mention=words, case=what)


# ---------------------------------------------------------------- GPU: the Triton op (triton_rms_norm.py, lab07.8-9)
# n: 33 (64-lane blocks, 64 rows a program), 4097 (one row a program, a block of 8192), 20000 (past MAX_BLOCK =
# 16384: the chunked path), 64 with 1027 rows (the backward: 343 programs of 3 rows, and a 17-program forward).
# Each (dtype, block, divisibility of n and rows by 16) is a Triton compile of its own on a cold cache: few
# cases, each dtype on some path, and the eps and determinism tests below reuse these compiles.
TRITON_CASES = [((7, 33), FP32), ((7, 33), FP16), ((4, 5, 4097), BF16), ((3, 20000), FP32), ((1027, 64), BF16)]


@requires_gpu
@pytest.mark.parametrize("shape, dtype", [pytest.param(s, d, id=f"{shape_id(s)}-{dtype_name(d)}")
                                          for s, d in TRITON_CASES])
@harness.tasks("lab07.8", "lab07.9")
def test_triton_rms_norm(shape, dtype):
    """course07::rms_norm_fwd and rms_norm_bwd on the GPU: y and rstd, then grad_x and grad_weight through
    triton_rms_norm.rms_norm and torch.autograd.grad (register_autograd's backward), against float64."""
    module = triton_module()
    x, weight, grad_y = rms_inputs(shape, dtype)
    case = f"triton_rms_norm of x {shape_id(shape)} {dtype_name(dtype)}"
    x.requires_grad_()
    weight.requires_grad_()
    y, rstd = torch.ops.course07.rms_norm_fwd(x.detach(), weight.detach(), EPS)
    check_rms_norm(y, rstd, x.detach(), weight.detach(), EPS, case=f"{case}: course07::rms_norm_fwd",
                   hint=TRITON_HINT)
    out = module.rms_norm(x, weight, EPS)
    LAB.assert_close(out, y, case=f"{case}: rms_norm(x, weight) against course07::rms_norm_fwd", tol=0.0,
                     hint=TRITON_HINT)
    grad_x, grad_weight = torch.autograd.grad(out, (x, weight), grad_y)
    check_rms_norm_backward(grad_x, grad_weight, grad_y, x.detach(), weight.detach(), EPS, case=f"{case}: backward",
                            hint=TRITON_HINT, grad_weight_hint=TRITON_HINT)


@requires_gpu
@pytest.mark.parametrize("pattern", ["zero rows", "tiny rows"])
@harness.tasks("lab07.8")
def test_triton_rms_norm_eps(pattern):
    triton_module()
    scale, eps = RMS_PATTERNS[pattern]
    x = torch.randn(PATTERN_SHAPE, device="cuda") * scale
    if pattern == "zero rows":
        x[0] = 0.0
    x = x.to(BF16)
    weight = randn(PATTERN_SHAPE[-1:], BF16)
    y, rstd = torch.ops.course07.rms_norm_fwd(x, weight, eps)
    check_rms_norm(y, rstd, x, weight, eps, case=f"course07::rms_norm_fwd of x {shape_id(PATTERN_SHAPE)} bfloat16, "
                   f"'{pattern}' (eps = {eps:g})", hint=TRITON_HINT)


@requires_gpu
@harness.tasks("lab07.9")
def test_triton_grad_weight_is_bitwise_deterministic():
    triton_module()
    x, weight, grad_y = rms_inputs((8197, 64), BF16)  # 483 programs of 17 rows
    _, rstd = torch.ops.course07.rms_norm_fwd(x, weight, EPS)
    _, first = torch.ops.course07.rms_norm_bwd(grad_y, x, weight, rstd)
    for run in range(2, 11):
        _, again = torch.ops.course07.rms_norm_bwd(grad_y, x, weight, rstd)
        if not torch.equal(first, again):
            raise harness.GradeFailure(
                f"course07::rms_norm_bwd of x 8197x64 bfloat16: grad_weight of run {run} differs from run 1: not "
                "bitwise identical\n  hint: each program stores its own partial row; the finalize adds them in "
                "program order (no tl.atomic_add)")


# The Triton kernels, again and again (issue 34, class d): a dropped barrier (the chunked backward's tl.debug_barrier()
# between each row's dot, stored by one thread, and its loads by every thread of the program) is a race that one run
# rarely shows. Each case runs TRITON_STRESS_RUNS times, every output and scratch buffer from a poisoned pool (a value
# read before it is written is NaN), each run bitwise equal to the first (no atomics, a fixed split into programs:
# nothing may depend on timing) and the first against float64. Cases: the chunked paths (n past MAX_BLOCK_FWD and
# MAX_BLOCK_BWD) with one row a program (512 programs, each row's dot read right after its store) and with 3 rows a
# program; the register path with 17 rows a program.
TRITON_STRESS_CASES = [((512, 20000), FP32), ((1500, 9000), BF16), ((8197, 64), BF16)]
TRITON_STRESS_RUNS = 16
RACE_HINT = ("a value one thread of a program stores and others load needs a tl.debug_barrier() between (the chunked "
             "backward's dot, stored once a row, read by every thread of the program); NaN: scratch read before it was "
             "written (its memory starts as NaN here); " + TRITON_HINT)


@requires_gpu
@LARGE  # 16 runs of each case: long under compute-sanitizer, whose racecheck sees shared memory, not these races
@pytest.mark.parametrize("shape, dtype", [pytest.param(s, d, id=f"{shape_id(s)}-{dtype_name(d)}")
                                          for s, d in TRITON_STRESS_CASES])
@harness.tasks("lab07.8", "lab07.9")
def test_triton_stress(shape, dtype):
    module = triton_module()
    ops = torch.ops.course07
    x, weight, grad_y = rms_inputs(shape, dtype)
    rows, n = rows_of(shape), shape[-1]
    per_program = -(-rows // module.MAX_PARTIALS)
    partials_bytes = -(-rows // per_program) * n * 4
    rows_text = "1 row" if per_program == 1 else f"{per_program} rows"
    case = f"course07 RMSNorm of x {shape_id(shape)} {dtype_name(dtype)} ({rows_text} a program)"
    first = None
    for run in range(1, TRITON_STRESS_RUNS + 1):
        y, rstd = stress.run_poisoned(lambda: ops.rms_norm_fwd(x, weight, EPS), nbytes(x))
        grad_x, grad_weight = stress.run_poisoned(lambda: ops.rms_norm_bwd(grad_y, x, weight, rstd), nbytes(x),
                                                  partials_bytes)
        outs = {"y": y, "rstd": rstd, "grad_x": grad_x, "grad_weight": grad_weight}
        if first is None:
            check_rms_norm(y, rstd, x, weight, EPS, case=f"{case}, run 1", hint=TRITON_HINT)
            check_rms_norm_backward(grad_x, grad_weight, grad_y, x, weight, EPS, case=f"{case}, run 1",
                                    hint=RACE_HINT, grad_weight_hint=TRITON_HINT)
            first = outs
            continue
        for name, out in outs.items():
            stress.assert_bitwise_equal(name, out, first[name], case=f"{case}, run {run} of {TRITON_STRESS_RUNS}",
                                        hint=RACE_HINT)


class _SmallModel(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(256))
        self.down = torch.nn.Linear(256, 32)
        self.norm = norm

    def forward(self, x):
        return self.down(self.norm(self.up(x), self.weight, EPS))


@requires_gpu
@harness.tasks("lab07.8", "lab07.9")
def test_triton_op_compiles_without_graph_breaks():
    """Linear -> triton_rms_norm.rms_norm -> Linear: torch._dynamo.explain finds one graph (no graph break: the op
    is an operator torch.compile traces, not an opaque call), and torch.compile(fullgraph=True) of it gives the
    eager output and gradients."""
    module = triton_module()
    model = _SmallModel(module.rms_norm).cuda()
    x = random_tensor((4, 33, 64), FP32)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    if explained.graph_break_count != 0 or explained.graph_count != 1:
        reasons = "; ".join(str(b.reason)[:200] for b in explained.break_reasons[:3])
        raise harness.GradeFailure(
            f"torch._dynamo.explain of Linear -> triton_rms_norm.rms_norm -> Linear: {explained.graph_count} graphs, "
            f"{explained.graph_break_count} graph breaks ({reasons})\n  hint: rms_norm must call "
            "torch.ops.course07.rms_norm_fwd (a torch.library.triton_op, its kernels launched through wrap_triton), "
            "and nothing torch.compile cannot trace (no .item(), no print of a tensor, no data-dependent Python)")
    eager = _student_triton("the model run eagerly", lambda: model(x))
    eager_grads = _student_triton("the model's backward, eagerly",
                                  lambda: torch.autograd.grad(eager.sum(), list(model.parameters())))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(x)
        grads = torch.autograd.grad(out.sum(), list(model.parameters()))
    except Exception as error:
        text = first_line(error)
        if "Cxx" in type(error).__name__ or "CppCompile" in type(error).__name__:  # Inductor's host compiler
            pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {text})")
        raise harness.GradeFailure(f"torch.compile(fullgraph=True) of Linear -> triton_rms_norm.rms_norm -> Linear "
                                   f"failed ({type(error).__name__}): {text}\n  hint: the eager model ran; Inductor "
                                   "launches the kernels itself from the graph, so they must compile as Triton "
                                   "kernels for every launch the op makes: " + TRITON_HINT) from None
    tol = tolerance(FP32, 256) * REDUCTION_HEADROOM
    LAB.assert_close(out, eager.detach(), case="the compiled model's output against eager", tol=tol, hint=TRITON_HINT)
    for (name, _), got, want in zip(model.named_parameters(), grads, eager_grads):
        LAB.assert_close(got, want, case=f"the compiled model's {name}.grad against eager", tol=tol, hint=TRITON_HINT)
