# Lab skeleton generated from solutions/07-fused-normalization/triton_rms_norm.py by `./course labs` [lab-hash a790ed826510].
# Students: fill in the TODO(lab07.k) blocks, then run `./course grade 07`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 07, tasks 8 (forward) and 9 (backward): RMSNorm in Triton, as PyTorch custom operators that torch.compile
sees into.

    y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight        x (..., N), weight (N,)

Two operators, registered when this file is imported (no build step: Triton compiles each kernel on its first
launch, for the constexprs and dtypes of that launch):

    torch.ops.course07.rms_norm_fwd(x, weight, eps) -> (y, rstd)
    torch.ops.course07.rms_norm_bwd(grad_y, x, weight, rstd) -> (grad_x, grad_weight)

and the function a model calls, differentiable in x and weight:

    y = rms_norm(x, weight, eps=1e-6)
    y.sum().backward()                   # runs rms_norm_bwd: fills x.grad and weight.grad

Why operators (torch.library.triton_op) and not a function that launches the kernels: an operator is known to
the dispatcher, like torch.add. Fake and meta tensors go through it (its body runs on them with the kernel
launches as no-ops, so output shapes come out without a GPU), torch.export keeps it as one named call, and
torch.compile(fullgraph=True) traces a model that calls rms_norm into one graph. Unlike torch.library.custom_op,
whose body the compiler never looks into, a triton_op's body is traced: Inductor gets the kernels themselves
(the wrap_triton calls) and launches them from the code it generates.
"""
from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

# The longest rows kept in registers: the forward holds the row between its sum of squares and the normalization
# (one read of x from memory), the backward holds x, dy, weight and a grad_weight accumulator, BLOCK =
# next_power_of_2(N) float32 values each, spread over the program's threads. Measured at compile time (Triton 3.6
# for sm_90; ptxas's resource usage, `cuobjdump --dump-resource-usage`): no stack, so no spills, up to these
# BLOCKs; the next power of two spills (a stack of 72 to 112 bytes). Longer rows take the chunked path: CHUNK elements
# at a time, the row read twice (sum of squares, then normalize), for any N.
MAX_BLOCK_FWD = 16384
MAX_BLOCK_BWD = 8192
CHUNK = 4096
# Short rows share a program: each program gets about TILE elements (TILE // BLOCK rows of BLOCK), so the work
# that a program does once (index math, its launch slot, the loads of weight) is spread over as many elements for
# a row of 128 as for a row of 4096. A power of two, as every tl.arange length must be.
TILE = 4096
# The backward splits the rows into at most this many blocks, one program each, and each program writes one
# float32 partial row of grad_weight. A fixed number rather than the GPU's SM count, so the split, and with it
# every bit of grad_weight, is the same on every GPU. 512 gives a 132-SM H100 about 4 programs per SM; the
# number is not tuned.
MAX_PARTIALS = 512
# Columns per program of the grad_weight finalize: one warp, a 16-byte float32 vector per thread per partial row,
# N / 128 programs. It reads programs x N x 4 bytes (8 MiB for 512 programs and N = 4096); its time is not
# measured here.
FINALIZE_BLOCK = 128

# The kernels compute in float32 whatever the storage type; float64 (gradcheck) is the CUDA extension's job.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _num_warps(tile: int) -> int:
    # 8 float32 values of each tile-sized array per thread (one 16-byte vector of a 16-bit row), up to 32 warps
    # (1024 threads, the most a CUDA block can have). A starting point like TILE, not a measured optimum.
    return min(32, max(1, tile // 256))


def _row_block(n: int, max_block: int) -> tuple[int, bool]:
    """(BLOCK, CHUNKED) for rows of n elements: the whole row in one power-of-two block, or CHUNK at a time."""
    if n <= max_block:
        # tl.arange needs a power-of-two length (Triton splits a block over registers, lanes and warps by powers
        # of two); the masks turn off the next_power_of_2(n) - n lanes past the row's end.
        return triton.next_power_of_2(n), False
    return CHUNK, True


# --8<-- [start:fwd_kernel]
@triton.jit
def _rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, rows, N, eps,
                         ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKED: tl.constexpr):
    """Rows pid*ROWS .. pid*ROWS + ROWS - 1 of x (rows x N, contiguous): y = x * rstd * w, rstd[row] =
    rsqrt(mean(x^2) + eps). CHUNKED=False: BLOCK >= N, the rows stay in registers. CHUNKED=True: ROWS == 1,
    the row is read in BLOCK-element chunks twice: sum of squares, then normalize."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,): int64, so row * N cannot wrap
    row_ok = row < rows
    cols = tl.arange(0, BLOCK)
    # Float32 arithmetic whatever x's type: in bfloat16 (8 significant bits) each addition of the sum of squares
    # would round off up to 0.4%, and in float16 x * x overflows for |x| > 256. The one rounding to x's type is
    # on the final store.
    if CHUNKED:  # given: a row too long for registers, read twice, BLOCK elements at a time
        sum_sq = tl.zeros([ROWS], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            mask = row_ok[:, None] & (start + cols[None, :] < N)
            chunk = tl.load(x_ptr + row[:, None] * N + start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            sum_sq += tl.sum(chunk * chunk, axis=1)
        rstd = tl.rsqrt(sum_sq / N + eps)
        tl.store(rstd_ptr + row, rstd, mask=row_ok)
        for start in range(0, N, BLOCK):
            col_ok = start + cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            offsets = row[:, None] * N + start + cols[None, :]
            chunk = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + start + cols, mask=col_ok, other=0.0).to(tl.float32)
            y = chunk * rstd[:, None] * w[None, :]
            tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # TODO(lab07.8): the forward's rows in registers (BLOCK >= N). Load the ROWS x BLOCK tile of x
        #   (rows `row`, columns `cols`, masked to row_ok and cols < N, other=0.0) as float32, its sum of squares
        #   per row (tl.sum over axis 1), rstd = rsqrt(sum / N + eps) stored to rstd_ptr + row, then
        #   y = x * rstd * w stored in y's dtype: the chunked branch above does the same a chunk at a time
        tl.static_assert(False, "lab07.8: the Triton RMSNorm forward (rows in registers) is not written yet")
# --8<-- [end:fwd_kernel]


# --8<-- [start:bwd_kernel]
@triton.jit
def _rms_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dot_ptr, partial_ptr, rows, N, rows_per_program,
                         BLOCK: tl.constexpr, CHUNKED: tl.constexpr):
    """Rows pid*rows_per_program .. (pid+1)*rows_per_program - 1 (those < rows: the last program may have
    fewer), one after another: dx = rstd * (w*dy) - rstd^3 * x * mean(w*dy*x) per row, and this program's partial
    of grad_weight, the sum over its rows of dy * x * rstd, stored as float32 row pid of partial (programs x N).
    dot: a float32 scratch of one value per row, for the CHUNKED path's mean(w*dy*x)."""
    first = tl.program_id(0).to(tl.int64) * rows_per_program  # int64, so row * N cannot wrap past 2^31
    cols = tl.arange(0, BLOCK)
    partial_row = partial_ptr + tl.program_id(0).to(tl.int64) * N
    if CHUNKED:  # given: neither a row nor a grad_weight accumulator of N columns fits in registers
        # Pass 1: each row's mean(w*dy*x), kept in dot (4 bytes a row). Pass 2 goes column chunk by column chunk,
        # each over all of this program's rows, so the accumulator is one chunk, kept in registers and stored once.
        for i in range(0, rows_per_program):
            row = first + i
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                col_ok = start + cols < N
                mask = col_ok & (row < rows)
                x = tl.load(x_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + start + cols, mask=col_ok, other=0.0).to(tl.float32)
                acc += w * dy * x
            tl.store(dot_ptr + row, tl.sum(acc, axis=0) / N, mask=row < rows)
        # dot[row] was stored by one thread of this program and is read below by all of them: the barrier
        # (__syncthreads) makes the global stores before it visible to every thread of the program after it.
        tl.debug_barrier()
        for start in range(0, N, BLOCK):
            col_ok = start + cols < N
            w = tl.load(w_ptr + start + cols, mask=col_ok, other=0.0).to(tl.float32)
            dw = tl.zeros([BLOCK], dtype=tl.float32)
            for i in range(0, rows_per_program):
                row = first + i
                mask = col_ok & (row < rows)
                x = tl.load(x_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(rstd_ptr + row, mask=row < rows, other=0.0)
                dot = tl.load(dot_ptr + row, mask=row < rows, other=0.0)
                dx = rstd * w * dy - rstd * rstd * rstd * x * dot
                tl.store(dx_ptr + row * N + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                dw += dy * x * rstd
            tl.store(partial_row + start + cols, dw, mask=col_ok)
    else:
        # TODO(lab07.9): the backward's rows in registers (BLOCK >= N). Load w once (cols < N, as
        #   float32); for i in range(0, rows_per_program), row = first + i, masked to row < rows: dx from the
        #   formula above in float32, stored in dx's dtype, and dy * x * rstd added into a float32 accumulator of
        #   BLOCK columns; then store the accumulator as row pid of partial (not an atomic add: see the
        #   finalize). The chunked branch above does the same a chunk of columns at a time
        tl.static_assert(False, "lab07.9: the Triton RMSNorm backward (rows in registers) is not written yet")
# --8<-- [end:bwd_kernel]


# --8<-- [start:finalize_kernel]
@triton.jit
def _grad_weight_finalize_kernel(partial_ptr, dw_ptr, programs, N, BLOCK: tl.constexpr):
    """Columns pid*BLOCK .. pid*BLOCK + BLOCK - 1 of grad_weight: the sum of the backward's `programs` partial
    rows (float32, programs x N), added in row order, stored in grad_weight's dtype."""
    # Why a second kernel rather than tl.atomic_add of each program's partial into grad_weight: float addition
    # is not associative, and atomics add in the order the programs happen to arrive, which changes from run to
    # run, and so do the last bits of grad_weight. Here the order is fixed (the split into programs is too), so
    # the same inputs give the same bits every run. The partials are float32 even for 16-bit weights: rounding
    # each to 16 bits before the sum would add `programs` roundings; this way there is one, on the store.
    # TODO(lab07.9): finalize. A float32 accumulator of BLOCK columns; add partial rows 0, 1, ...,
    #   programs - 1 in that order (a plain loop); store it in dw's dtype, masked to the columns < N
    tl.static_assert(False, "lab07.9: the grad_weight finalize kernel is not written yet")
# --8<-- [end:finalize_kernel]


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)} on {t.device}"


def _check_cuda(op: str, name: str, t: torch.Tensor) -> None:
    # A Triton kernel dereferences device memory: refuse a CPU tensor here, where the error can still say what
    # to do. Tensors that only carry metadata pass: fake tensors of device 'cuda' (compile tracing runs these
    # checks on them) and meta tensors (a model built on device='meta'); no kernel is launched for either.
    if t.device.type not in ("cuda", "meta"):
        raise ValueError(f"{op}: {name} must be a CUDA tensor, got {_describe(t)}; move it with {name}.cuda() or "
                         f"create it with device='cuda'")


def _check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    # The kernels index row * N + col: right only for row-major storage without gaps. Refused rather than copied:
    # a hidden .contiguous() would add a read and a write of the whole tensor to an op whose cost is its bytes.
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous, got {_describe(t)} with strides {list(t.stride())}; "
                         f"pass {name}.contiguous()")


def _check_like(op: str, name: str, t: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    if t.device != like.device:
        raise ValueError(f"{op}: {name} and {like_name} must be on the same device, got {_describe(t)} and "
                         f"{_describe(like)}")
    if t.dtype != like.dtype:
        raise TypeError(f"{op}: {name} must have {like_name}'s dtype {like.dtype}, got {_describe(t)}; convert it "
                        f"with {name}.to({like.dtype})")


def _check_x_weight(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    _check_cuda(op, "x", x)
    if x.dtype not in DTYPES:
        raise TypeError(f"{op}: x must be one of {', '.join(map(str, DTYPES))}, got {_describe(x)}; for float64 "
                        f"(gradcheck) use the CUDA extension's rms_norm")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must have a last dimension of at least 1 element to normalize over, got "
                         f"{_describe(x)}")
    _check_contiguous(op, "x", x)
    _check_like(op, "weight", weight, "x", x)
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"{op}: weight must have shape [{x.shape[-1]}] (x's last dimension), got "
                         f"{_describe(weight)}")
    _check_contiguous(op, "weight", weight)


def _on_device(t: torch.Tensor):
    # Triton launches on the current CUDA device (and its current stream), not on the tensor's: a tensor on
    # cuda:1 while cuda:0 is current would be read by a kernel on the wrong GPU. Fake and meta tensors launch
    # nothing (and entering a CUDA device would need a GPU), so they skip the switch; code that Inductor
    # generates sets the device itself.
    real = t.device.type == "cuda" and not is_fake(t)
    return torch.cuda.device(t.device) if real else contextlib.nullcontext()


# --8<-- [start:ops]
@triton_op("course07::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y = x * rstd * weight with x's shape and dtype; rstd = rsqrt(mean(x^2) + eps), float32, shape
    x.shape[:-1], saved for the backward: 4 bytes a row. (The backward reads x anyway and could recompute it; the
    CUDA version's contract stores it, and so does this one.)"""
    op = "course07::rms_norm_fwd"
    _check_x_weight(op, x, weight)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"{op}: eps must be finite and >= 0, got {eps}")
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows == 0:
        return y, rstd  # nothing to compute, and a grid of 0 programs is not a valid launch
    block, chunked = _row_block(n, MAX_BLOCK_FWD)
    rows_per_program = 1 if chunked else max(1, TILE // block)
    grid = (triton.cdiv(rows, rows_per_program),)
    with _on_device(x):
        wrap_triton(_rms_norm_fwd_kernel)[grid](x, weight, y, rstd, rows, n, eps, ROWS=rows_per_program,
                                                BLOCK=block, CHUNKED=chunked,
                                                num_warps=_num_warps(rows_per_program * block))
    return y, rstd


@triton_op("course07::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of y = rms_norm_fwd(x, weight, eps)[0], from the forward's rstd. grad_weight is
    deterministic: the same inputs give the same bits on every run."""
    op = "course07::rms_norm_bwd"
    _check_x_weight(op, x, weight)
    _check_like(op, "grad_y", grad_y, "x", x)
    if grad_y.shape != x.shape:
        raise ValueError(f"{op}: grad_y must have x's shape {list(x.shape)}, got {_describe(grad_y)}")
    _check_contiguous(op, "grad_y", grad_y)
    if rstd.device != x.device or rstd.dtype != torch.float32 or rstd.shape != x.shape[:-1]:
        raise ValueError(f"{op}: rstd must be the forward's: torch.float32{list(x.shape[:-1])} on {x.device}, got "
                         f"{_describe(rstd)}")
    _check_contiguous(op, "rstd", rstd)
    n = x.shape[-1]
    rows = x.numel() // n
    grad_x = torch.empty_like(x)
    if rows == 0:
        return grad_x, torch.zeros_like(weight)  # a sum over no rows
    block, chunked = _row_block(n, MAX_BLOCK_BWD)
    # Every program gets rows_per_program rows (the last one the rest): a split that depends on rows alone.
    rows_per_program = triton.cdiv(rows, MAX_PARTIALS)
    programs = triton.cdiv(rows, rows_per_program)
    partial = torch.empty((programs, n), dtype=torch.float32, device=x.device)
    dot = torch.empty(rows, dtype=torch.float32, device=x.device)  # read and written by the chunked path only
    grad_weight = torch.empty_like(weight)
    with _on_device(x):
        wrap_triton(_rms_norm_bwd_kernel)[(programs,)](grad_y, x, weight, rstd, grad_x, dot, partial, rows, n,
                                                       rows_per_program, BLOCK=block, CHUNKED=chunked,
                                                       num_warps=_num_warps(block))
        wrap_triton(_grad_weight_finalize_kernel)[(triton.cdiv(n, FINALIZE_BLOCK),)](
            partial, grad_weight, programs, n, BLOCK=FINALIZE_BLOCK, num_warps=_num_warps(FINALIZE_BLOCK))
    return grad_x, grad_weight
# --8<-- [end:ops]


# --8<-- [start:autograd]
def _setup_context(ctx, inputs, output) -> None:
    x, weight, _eps = inputs
    _y, rstd = output
    # x, not y: the backward needs x (dx has a term in x), and recovering x from y would divide by weight.
    ctx.save_for_backward(x, weight, rstd)
    # rstd is an output for the backward's sake, not a result to differentiate: a loss that used it would get a
    # silently wrong gradient, so autograd is told it has none.
    ctx.mark_non_differentiable(rstd)


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    # grad_y need not be contiguous: the gradient of y.sum() is one value expanded to y's shape (all strides 0).
    # .contiguous() returns grad_y itself when it already is.
    grad_x, grad_weight = torch.ops.course07.rms_norm_bwd(grad_y.contiguous(), x, weight, rstd)
    return grad_x, grad_weight, None  # eps is a float: no gradient


torch.library.register_autograd("course07::rms_norm_fwd", _backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight for contiguous CUDA x (..., N) and weight (N,) of x's dtype
    (float32, float16 or bfloat16); differentiable in x and weight, and traceable by torch.compile(fullgraph=True)."""
    y, _rstd = torch.ops.course07.rms_norm_fwd(x, weight, eps)
    return y
# --8<-- [end:autograd]
