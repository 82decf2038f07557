"""Speed (marked perf: `./course` times them in a pass of their own): bytes moved per second against a
device-to-device copy of the same bytes, F.rms_norm and torch.compile, held to PERF_BARS (what each bar was measured
at: the comment above it).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import harness
from grader07.common import (
    BF16,
    EPS,
    FP32,
    LAB,
    SOFTMAX_SCALE,
    TRITON_HINT,
    autograd_module,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    check_softmax_backward,
    on_chip_row,
    randn,
    reference_rstd,
    rms_inputs,
    rms_norm_composition,
    rows_of,
    softmax_backward_hint,
    softmax_backward_inputs,
    softmax_hint,
    triton_module,
)
from harness import requires_gpu
from harness.check import dtype_name, first_line, nbytes, shape_id

__all__ = [
    "test_perf_rms_norm_forward_vs_copy", "test_perf_rms_norm_forward_vs_torch",
    "test_perf_rms_norm_forward_vs_compiled", "test_perf_rms_norm_backward_vs_copy",
    "test_perf_softmax_forward_vs_copy", "test_perf_softmax_long_rows_vs_copy",
    "test_perf_softmax_long_rows_streaming_vs_copy", "test_perf_softmax_backward_vs_copy",
    "test_perf_softmax_backward_long_rows_vs_copy", "test_perf_softmax_backward_long_rows_streaming_vs_copy",
    "test_perf_rms_norm_forward_backward_vs_compiled", "test_perf_triton_rms_norm_forward_vs_eager",
    "test_perf_triton_rms_norm_forward_vs_copy",
]


# ---------------------------------------------------------------- GPU: speed
# Memory-bound: bytes moved / time is the measure, against a device-to-device copy of the same bytes. Bytes: the
# forwards read x and write y (2 tensors; weight and rstd under 0.1%); the backwards read two tensors and write
# one (3). Shapes: RMSNorm (8, 4096, 4096) bf16, a transformer's activations (256 MiB a tensor); softmax 8192 x
# 8192 float32 (the register path, a block per row) and 4096 x 65536 float32 (1 GiB a tensor), timed twice: as
# 'auto' runs it (the on-chip path, each row read once, where this GPU takes the row; else streaming) and forced
# through the streaming path (each row read twice, the second time mostly from L2 if at all), the student's kernel.
RMS_PERF_SHAPE = (8, 4096, 4096)
SOFTMAX_PERF_SHAPE = (8192, 8192)
LONG_SOFTMAX_PERF_SHAPE = (4096, 65536)
# (reference target, student bar), held in the same run on the same GPU. Reference targets: issue 13's where the
# reference reaches them, else the measured figure less a margin, with the number beside it. Measured on an
# H100 (./course run site/data/evidence/07-fused-normalization/quick.py and this file's perf tests, 2026-11-22, three
# runs): RMSNorm forward 97-99% of copy; 1.29-1.42x F.rms_norm (F.rms_norm 0.238-0.258 ms over the runs: torch 2.11's
# is a fused kernel, aten::_fused_rms_norm), so 1.2 (issue: 1.3); 1.00-1.01x compiled; backward 84% of copy, so 0.80
# (issue: no separate figure), and forward + backward 1.02x compiled, so 0.95 (issue: 1.1); softmax 8192^2 97-98%
# forward, 99% backward; the streaming path at 4096 x 65536 73-74% forward and 67% backward (H100; on an H200, the
# probe below: 65.7% and 68.2%), so 0.62 both (the second pass re-reads the row through L2, where it is not always
# still there; NOTES.md@8a81008, lab 07); Triton forward 97% of copy and 5.2x the eager composition (issue: 0.85 and
# 3x). Long rows on chip, the 0.85 forward and backward:
# site/data/evidence/07-fused-normalization/softmax_onepass.py on an H200 (2026-11-26) measured the kernels the lab
# adopted at 92.1% (forward) and 100.7% (backward) of copy; the lab's own, in this file's perf tests on the same kind
# of H200 (seed 20261130): 0.93x and 0.88x. On that H200 (2026-11-26, two runs) RMSNorm's forward measured 1.17-1.20x
# F.rms_norm (at 95-98% of copy: the H200's F.rms_norm is relatively faster), so 1.1 for both machines; the backward
# 0.73-0.75x copy (0.261-0.263 ms), so 0.70 (issue 13's 1.1x forward + backward waits on a faster backward: the
# probe's "2rows", NOTES.md@8a81008, measured 0.90x there, but the lab's first version of it measured 0.75x and was
# taken out). The staged backward (2026-11-27, NOTES.md@8a81008): 0.96x copy on an H100 in this file's perf test and
# in site/data/evidence/07-fused-normalization/staged.py (the register kernel: 0.81-0.82x), 0.845x in this file's perf
# test on an H200 (its copy is 4.25 TB/s; the probe: 83.6%): so 0.80. Forward + backward, each side timed as a CUDA
# graph (harness.perf.as_graph; timed as calls, the compiled side's CPU time made this case read 1.09x-1.68x in
# different processes): on an H100 1.104-1.106x in this test, 1.102x in `./course bench 07`, 1.102-1.104x in
# site/data/evidence/07-fused-normalization/pair.py (2026-11-27; 1.07x in runs timed while memory handed back to the
# driver slowed both sides, before perf.settle); 1.151x on an H200: so 1.0 (issue: 1.1, met by a hair;
# lessons/notes/07-fused-normalization.md). Where this GPU does not take 65536-long float32 rows on chip (the forward
# past sm_80's shared memory, the backward before sm_90), 'auto' streams, and is held to the streaming bars
# (_long_row_bars). Student bars (issue 11, class 6): a straightforward fused kernel passes, the lesson's technique
# removed fails:   - forward vs copy 0.65: an unfused RMSNorm (x^2, mean, multiply: 3+ passes) moves >= 2x the bytes:
# <= 0.5;   - softmax long rows 0.55: two full reads from HBM (no L2 reuse) are 3 tensors of traffic: 0.67 at best,
# the     three-pass softmax (max, sum, write) 4 tensors: 0.5; its backward 0.5 (two passes over two inputs); the same
# bars where 'auto' runs the given on-chip kernels, so that they stay the streaming kernel's where it runs;   -
# backward 0.60: a backward that re-reads its inputs for a second reduction moves 5/3 the bytes: <= 0.6;   - vs
# F.rms_norm and vs compiled 0.7: a fused kernel within reach of PyTorch's own;   - forward + backward vs compiled
# 0.8; Triton vs eager 2.0: a fused Triton kernel moves 2 tensors to eager's 7.
PERF_BARS = {
    ("rms_norm forward vs copy", BF16): (0.92, 0.65),
    ("rms_norm forward vs F.rms_norm", BF16): (1.1, 0.7),
    ("rms_norm forward vs compiled", BF16): (0.95, 0.7),
    ("rms_norm backward vs copy", BF16): (0.80, 0.60),
    ("rms_norm forward+backward vs compiled", BF16): (1.0, 0.8),
    ("softmax forward vs copy", FP32): (0.90, 0.65),
    ("softmax forward vs copy, long rows", FP32): (0.85, 0.55),
    ("softmax forward vs copy, long rows, streaming", FP32): (0.62, 0.55),
    ("softmax backward vs copy", FP32): (0.85, 0.60),
    ("softmax backward vs copy, long rows", FP32): (0.85, 0.50),
    ("softmax backward vs copy, long rows, streaming", FP32): (0.62, 0.50),
    ("triton rms_norm forward vs copy", BF16): (0.85, 0.65),
    ("triton rms_norm forward vs eager", BF16): (3.0, 2.0),
}
PERF_HINTS = {
    "rms_norm forward vs copy": "read x once (the register path: the row stays in registers between the sum of "
                                "squares and the write) with 16-byte vectors, enough rows in flight per SM",
    "rms_norm forward vs F.rms_norm": "the forward-vs-copy hints: PyTorch's kernel is fused too",
    "rms_norm forward vs compiled": "Inductor's kernel is fused and vectorized: the forward-vs-copy hints close "
                                    "the gap",
    "rms_norm backward vs copy": "one pass over grad_y and x (the row in registers for the dot and grad_x), "
                                 "grad_weight summed in registers across a block's rows, one row of partials a block",
    "softmax forward vs copy": "the register path: one read of x, the max and the sum from registers, one write",
    "softmax forward vs copy, long rows": "'auto' runs the given on-chip path where this GPU takes the row (one "
                                          "read into a block's registers and shared memory, the threads' pairs "
                                          "merged with your MergeMaxSum), else your streaming kernel: see the "
                                          "streaming case's hint",
    "softmax forward vs copy, long rows, streaming": "the online pass: (max, sum) in ONE pass over the row, then one "
                                                     "pass to write: two reads of x, not three; 16-byte loads, several "
                                                     "in flight",
    "softmax backward vs copy": "one read of grad_y and y (in registers for the dot and grad_x), one write",
    "softmax backward vs copy, long rows": "'auto' runs the given on-chip backward where this GPU has clusters "
                                           "(sm_90), else your streaming kernel: see the streaming case's hint",
    "softmax backward vs copy, long rows, streaming": "two passes (the dot, then grad_x), 16-byte loads, several in "
                                                      "flight; the second pass walks the row last batch first, to "
                                                      "find it in L2",
    "rms_norm forward+backward vs compiled": "the forward and backward hints; autograd.py saves rstd, so the "
                                             "backward reads no more than grad_y and x",
    "triton rms_norm forward vs eager": "one program per row (or per block of short rows), the row loaded once",
    "triton rms_norm forward vs copy": "one program per row (or per block of short rows), the row loaded once",
}
_COMPILED: dict = {}


def _perf(kind, *, dtype, shape, ours, baseline, baseline_name, bytes_moved, verify, inputs, bars=None, graphs=False):
    """Time a case against its baseline and hold it to PERF_BARS[bars or kind] (bars: another kind's bars, for a
    case whose kernel is another case's on this GPU; graphs: each side timed as a CUDA graph, harness.perf;
    inputs: the tensors given new values before each timed call, those no other input is derived from)."""
    target, student_bar = PERF_BARS[bars or kind, dtype]
    try:
        return LAB.perf(name=f"{kind}, {shape_id(shape)} {dtype_name(dtype)}", ours=ours, baseline=baseline,
                        baseline_name=baseline_name, bytes_moved=bytes_moved, student_bar=student_bar, target=target,
                        verify=verify, inputs=inputs, graphs=graphs)
    except harness.GradeFailure as failure:
        raise harness.GradeFailure(f"{failure}\n  hint: {PERF_HINTS[bars or kind]}") from None


def _long_row_bars(kind: str, path: str, backward: bool) -> str:
    """The PERF_BARS kind of a long-row softmax case: the on-chip bars where 'auto' runs the on-chip path on this GPU,
    the streaming bars where it streams (or is forced to)."""
    if path == "auto" and on_chip_row(FP32, backward) >= LONG_SOFTMAX_PERF_SHAPE[-1]:
        return kind
    return kind if kind.endswith(", streaming") else f"{kind}, streaming"


def _copy_of(t: torch.Tensor, tensors: float):
    """A device-to-device copy moving the bytes of `tensors` tensors like t (half read, half written)."""
    src = torch.empty(int(t.numel() * tensors / 2), dtype=t.dtype, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _rms_forward_perf(kind, baseline, baseline_name):
    x, weight, _ = rms_inputs(RMS_PERF_SHAPE, BF16)
    last = {}

    def ours():
        last["out"] = LAB.module.rms_norm(x, weight)

    def verify():
        check_rms_norm(*last["out"], x, weight, EPS,
                       case=f"rms_norm {shape_id(RMS_PERF_SHAPE)}: the output of the timed calls")

    _perf(kind, dtype=BF16, shape=RMS_PERF_SHAPE, ours=ours, baseline=baseline(x, weight), baseline_name=baseline_name,
          bytes_moved=2 * nbytes(x) + nbytes(weight) + rows_of(x.shape) * 4, verify=verify, inputs=(x, weight))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.4")
def test_perf_rms_norm_forward_vs_copy():
    _rms_forward_perf("rms_norm forward vs copy", lambda x, w: _copy_of(x, 2), "dst.copy_(src), the same bytes moved")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.4")
def test_perf_rms_norm_forward_vs_torch():
    _rms_forward_perf("rms_norm forward vs F.rms_norm", lambda x, w: lambda: F.rms_norm(x, (x.shape[-1],), w, EPS),
                      "F.rms_norm(x, (n,), weight)")


def compiled_composition(*example):
    """torch.compile of x * rsqrt(mean(x^2) + eps) * weight in float (as F.rms_norm computes it), compiled once per
    process and warmed on `example` (a compile that cannot run here skips the test: the baseline's failure is not
    the lab's)."""
    if "fn" not in _COMPILED:
        def composition(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w

        _COMPILED["fn"] = torch.compile(composition, dynamic=False)
    fn = _COMPILED["fn"]
    try:
        fn(*example)
        torch.cuda.synchronize()
    except Exception as error:  # Inductor needs Triton and a C compiler
        pytest.skip(f"torch.compile does not run here ({type(error).__name__}: {first_line(error)})")
    return fn


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.4")
def test_perf_rms_norm_forward_vs_compiled():
    def compiled(x, w):
        fn = compiled_composition(x, w)
        return lambda: fn(x, w)

    _rms_forward_perf("rms_norm forward vs compiled", compiled, "torch.compile(x * rsqrt(mean(x^2) + eps) * weight)")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.5", "lab07.6")
def test_perf_rms_norm_backward_vs_copy():
    x, weight, grad_y = rms_inputs(RMS_PERF_SHAPE, BF16)
    rstd = reference_rstd(x, EPS)
    last = {}

    def ours():
        last["grads"] = LAB.module.rms_norm_backward(grad_y, x, weight, rstd)

    def verify():
        check_rms_norm_backward(*last["grads"], grad_y, x, weight, EPS,
                                case=f"rms_norm_backward {shape_id(RMS_PERF_SHAPE)}: the output of the timed calls")

    _perf("rms_norm backward vs copy", dtype=BF16, shape=RMS_PERF_SHAPE, ours=ours, baseline=_copy_of(x, 3),
          baseline_name="a device-to-device copy of the same bytes", bytes_moved=3 * nbytes(x) + 2 * nbytes(weight),
          verify=verify, inputs=(grad_y,))  # not x: rstd was computed from it


def _softmax_forward_perf(kind, shape, path="auto", bars=None):
    x = randn(shape, FP32, SOFTMAX_SCALE)
    last = {}

    def ours():
        last["y"] = LAB.module.softmax(x, path=path)

    def verify():
        check_softmax(last["y"], x, case=f"softmax {shape_id(shape)}, path={path!r}: the output of the timed calls",
                      hint=softmax_hint(shape[-1], FP32, path))

    _perf(kind, dtype=FP32, shape=shape, ours=ours, baseline=_copy_of(x, 2),
          baseline_name="dst.copy_(src), the same bytes moved", bytes_moved=2 * nbytes(x), verify=verify, bars=bars,
          inputs=(x,))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.1")
def test_perf_softmax_forward_vs_copy():
    _softmax_forward_perf("softmax forward vs copy", SOFTMAX_PERF_SHAPE)


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.2")
def test_perf_softmax_long_rows_vs_copy():
    """As 'auto' runs it: on chip where this GPU takes the rows (issue 13's 0.85 for the reference), else streaming."""
    kind = "softmax forward vs copy, long rows"
    _softmax_forward_perf(kind, LONG_SOFTMAX_PERF_SHAPE, bars=_long_row_bars(kind, "auto", backward=False))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.2")
def test_perf_softmax_long_rows_streaming_vs_copy():
    """The student's streaming kernel at the same rows, forced: graded wherever 'auto' runs the on-chip path."""
    _softmax_forward_perf("softmax forward vs copy, long rows, streaming", LONG_SOFTMAX_PERF_SHAPE, path="streaming")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.3")
def test_perf_softmax_backward_vs_copy():
    grad_y, y = softmax_backward_inputs(SOFTMAX_PERF_SHAPE, FP32)
    last = {}

    def ours():
        last["grad_x"] = LAB.module.softmax_backward(grad_y, y)

    def verify():
        check_softmax_backward(last["grad_x"], grad_y, y,
                               case=f"softmax_backward {shape_id(SOFTMAX_PERF_SHAPE)}: the output of the timed calls")

    _perf("softmax backward vs copy", dtype=FP32, shape=SOFTMAX_PERF_SHAPE, ours=ours, baseline=_copy_of(y, 3),
          baseline_name="a device-to-device copy of the same bytes", bytes_moved=3 * nbytes(y), verify=verify,
          inputs=(grad_y,))  # not y: a softmax's rows, which a rotation would mix


def _softmax_backward_long_rows_perf(kind, path):
    grad_y, y = softmax_backward_inputs(LONG_SOFTMAX_PERF_SHAPE, FP32)
    last = {}

    def ours():
        last["grad_x"] = LAB.module.softmax_backward(grad_y, y, path=path)

    def verify():
        check_softmax_backward(last["grad_x"], grad_y, y, case=f"softmax_backward "
                               f"{shape_id(LONG_SOFTMAX_PERF_SHAPE)}, path={path!r}: the output of the timed calls",
                               hint=softmax_backward_hint(LONG_SOFTMAX_PERF_SHAPE[-1], FP32, path))

    _perf(kind, dtype=FP32, shape=LONG_SOFTMAX_PERF_SHAPE, ours=ours, baseline=_copy_of(y, 3),
          baseline_name="a device-to-device copy of the same bytes", bytes_moved=3 * nbytes(y), verify=verify,
          bars=_long_row_bars(kind, path, backward=True), inputs=(grad_y,))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.3")
def test_perf_softmax_backward_long_rows_vs_copy():
    """As 'auto' runs it: on chip where this GPU has clusters (issue 13's 0.85 for the reference), else streaming."""
    _softmax_backward_long_rows_perf("softmax backward vs copy, long rows", "auto")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.3")
def test_perf_softmax_backward_long_rows_streaming_vs_copy():
    """The student's streaming backward at the same rows, forced: graded wherever 'auto' runs the on-chip path."""
    _softmax_backward_long_rows_perf("softmax backward vs copy, long rows, streaming", "streaming")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.4", "lab07.5", "lab07.6", "lab07.7")
def test_perf_rms_norm_forward_backward_vs_compiled():
    """A training step's share: forward and backward through autograd.py, against torch.compile of the composition
    (Inductor compiles its backward too), both with grad_weight."""
    x, weight, grad_y = rms_inputs(RMS_PERF_SHAPE, BF16)
    module = autograd_module()
    xs, ws = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    xc, wc = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    fn = compiled_composition(xc, wc)
    last = {}

    def ours():
        y = module.rms_norm(xs, ws, EPS, ops=LAB.module)
        last["grads"] = torch.autograd.grad(y, (xs, ws), grad_y)

    def compiled():
        torch.autograd.grad(fn(xc, wc), (xc, wc), grad_y)

    def verify():
        check_rms_norm_backward(*last["grads"], grad_y, x, weight, EPS,
                                case=f"autograd rms_norm {shape_id(RMS_PERF_SHAPE)}: the gradients of the timed calls")

    # As CUDA graphs: the compiled side's CPU time a call (408-1287 us, H100) can exceed its GPU time (0.51 ms), and
    # timed as calls its figure then moved between processes (0.507-0.709 ms: this case read 1.09x-1.68x).
    _perf("rms_norm forward+backward vs compiled", dtype=BF16, shape=RMS_PERF_SHAPE, ours=ours, baseline=compiled,
          baseline_name="torch.compile(x * rsqrt(mean(x^2) + eps) * weight), forward and backward",
          bytes_moved=5 * nbytes(x), verify=verify, graphs=True, inputs=(grad_y,))


def _triton_forward_perf(kind, baseline, baseline_name):
    triton_module()
    x, weight, _ = rms_inputs(RMS_PERF_SHAPE, BF16)
    last = {}

    def ours():
        last["out"] = torch.ops.course07.rms_norm_fwd(x, weight, EPS)

    def verify():
        check_rms_norm(*last["out"], x, weight, EPS, case=f"course07::rms_norm_fwd {shape_id(RMS_PERF_SHAPE)}: the "
                       "output of the timed calls", hint=TRITON_HINT)

    _perf(kind, dtype=BF16, shape=RMS_PERF_SHAPE, ours=ours, baseline=baseline(x, weight),
          baseline_name=baseline_name, bytes_moved=2 * nbytes(x) + nbytes(weight) + rows_of(x.shape) * 4,
          verify=verify, inputs=(x, weight))


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.8")
def test_perf_triton_rms_norm_forward_vs_eager():
    _triton_forward_perf("triton rms_norm forward vs eager", lambda x, w: lambda: rms_norm_composition(x, w, EPS),
                         "x * rsqrt(x.pow(2).mean(-1) + eps) * weight, eager")


@requires_gpu
@pytest.mark.perf
@harness.tasks("lab07.8")
def test_perf_triton_rms_norm_forward_vs_copy():
    _triton_forward_perf("triton rms_norm forward vs copy", lambda x, w: _copy_of(x, 2),
                         "dst.copy_(src), the same bytes moved")
