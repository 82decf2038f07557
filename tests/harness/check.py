"""Correctness checks: tolerances derived from the dtype, poisoned outputs, and
failure messages that say what went wrong, where, and what to do next."""
from __future__ import annotations

import math
import os

import torch

# Unit roundoff u = 2^-(mantissa bits + 1): the largest relative error of one rounding.
UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
# Headroom over one rounding: a handful of operations per element, each rounding once.
SAFETY = 8.0


def tolerance(dtype: torch.dtype, reduction_length: int = 1) -> float:
    """Relative tolerance for a result computed in `dtype`.

    Rounding errors of a length-K reduction grow like sqrt(K) when they are
    independent (the typical case; the worst case is K). Elementwise ops have K = 1.
    """
    return SAFETY * UNIT_ROUNDOFF[dtype] * math.sqrt(max(1, reduction_length))


class GradeFailure(AssertionError):
    """A failed check; its message is what the student reads."""


# ---------------------------------------------------------------- inputs and outputs
def poisoned(shape, dtype: torch.dtype, device="cuda") -> torch.Tensor:
    """An output buffer whose every element fails the comparison until written."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).max, dtype=dtype, device=device)


def poison_allocator(numel: int, dtype: torch.dtype, device="cuda") -> None:
    """Make the next allocation of this size come back full of NaN.

    An op that allocates its own output gets it from PyTorch's caching allocator,
    which may hand back a block still holding a correct earlier result. Filling a
    block of the same size with NaN and freeing it puts that block first in line.
    """
    block = poisoned((max(1, numel),), dtype, device)
    del block


# The caching allocator rounds every request up to a multiple of this many bytes: the bytes after a
# tensor's end up to that boundary belong to its block alone (PyTorch's CUDACachingAllocator, kMinBlockSize).
ALLOCATOR_ROUNDING = 512
_SMALL_REQUEST = 2**20  # the largest request served from the allocator's small pool (2 MiB segments)
_LARGE_SEGMENT = 2 * 2**20  # large segments are whole multiples of this; requests of 10 MiB+ get their own
POISON_BYTE = 0xFF  # a byte that makes NaN in every floating dtype (and -1 / the max in integer ones)
SPILL_HINT = ("a loop bound that lets one more index through (<= n instead of < n), or a vector access that starts "
              "inside the output and runs past its end")


def device_bytes(address: int, count: int) -> torch.Tensor:
    """A uint8 tensor aliasing `count` bytes of device memory at `address`, without owning them: for
    reading memory the caching allocator holds but no tensor covers (the slack after a tensor's end)."""
    class Alias:
        __cuda_array_interface__ = {"shape": (count,), "typestr": "|u1", "data": (address, False), "version": 2}

    return torch.as_tensor(Alias(), device="cuda")


class PoisonedPool:
    """Outputs an op allocates itself, poisoned and guarded (issue 11, class 1):

        with harness.check.PoisonedPool(large_bytes=y_bytes) as pool:
            y = LAB.module.op(x)  # one op call; inputs made before, outside the pool
        pool.assert_no_spill(y, name="y", case=case)

    Inside the block every allocation of this thread comes from a private memory pool (torch.cuda.MemPool)
    whose memory was filled with POISON_BYTE first: an output element the op never writes reads as NaN,
    wherever in the pool the op's allocator calls land, and the bytes between an output's end and its
    allocator block's end (up to 511 bytes: ALLOCATOR_ROUNDING) stay POISON_BYTE unless a kernel writes past
    the output's end. That slack is where a `<=` loop bound or a vector that runs past the last element
    writes without any comparison of the output seeing it. `large_bytes`: the bytes of the op's
    allocations over 1 MiB, poisoned in one segment (the small ones share a 2 MiB segment).

    Memory freed inside the block no longer holds poison: an output carved from a temporary that the op
    freed first would show the temporary's bytes in its slack. So the block holds one op call whose
    outputs are allocated before it frees any temporary (as a wrapper that allocates every output, then
    launches, does), with its inputs made before the block.

    The pool object is destroyed on leaving the block (the outputs keep their memory, which returns to
    the allocator when they die): PyTorch aborts the process if a MemPool is destroyed while another
    pool or a CUDA graph capture is routing allocations, which a pool left to the garbage collector
    (kept alive by a failure's traceback, say) could be. So no graph capture or second PoisonedPool
    inside the block.

    Without the caching allocator (PYTORCH_NO_CUDA_MEMORY_CACHING=1, as under compute-sanitizer, where
    memcheck sees such writes itself) it does nothing: outputs come from the op's own cudaMalloc.
    """

    def __init__(self, large_bytes: int = 0):
        self.large_bytes = large_bytes
        self._pool = None
        self._context = None
        self._ranges: list[tuple[int, int]] = []  # [start, end) addresses filled with POISON_BYTE

    def __enter__(self) -> "PoisonedPool":
        if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
            return self
        if self.large_bytes:
            # An earlier pool's memory goes back to the driver only at an empty_cache (its outputs outlived it):
            # release it before taking another large segment.
            torch.cuda.empty_cache()
        self._pool = torch.cuda.MemPool()
        self._context = torch.cuda.use_mem_pool(self._pool)
        self._context.__enter__()
        # Two requests of the small pool's largest size fill one 2 MiB small segment; one request of 10 MiB
        # or more gets a large segment of exactly its size, rounded up to 2 MiB.
        sizes = [_SMALL_REQUEST, _SMALL_REQUEST]
        if self.large_bytes:
            want = max(self.large_bytes + _LARGE_SEGMENT, 10 * 2**20)
            sizes.append(-(-want // _LARGE_SEGMENT) * _LARGE_SEGMENT)
        fills = [torch.full((n,), POISON_BYTE, dtype=torch.uint8, device="cuda") for n in sizes]
        self._ranges = [(t.data_ptr(), t.data_ptr() + t.numel()) for t in fills]
        del fills  # back to the pool: the op's allocations are carved out of this memory
        return self

    def __exit__(self, *exc) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)
            self._context = None
            self._pool = None  # destroyed here, while no pool routes allocations (see above)

    def assert_no_spill(self, out: torch.Tensor, *, name: str, case: str, hint: str = "") -> None:
        """The allocator slack after `out`'s storage is still poison: nothing was written past its end."""
        if not self._ranges or out.numel() == 0:
            return
        storage = out.untyped_storage()
        start, nbytes = storage.data_ptr(), storage.nbytes()
        end = start + nbytes
        block_end = start + -(-nbytes // ALLOCATOR_ROUNDING) * ALLOCATOR_ROUNDING
        if end == block_end or not any(lo <= start and block_end <= hi for lo, hi in self._ranges):
            return  # no slack, or memory that was not poisoned first (nothing known about what it held)
        torch.cuda.synchronize()
        slack = device_bytes(end, block_end - end)
        written = (slack != POISON_BYTE).nonzero().flatten().tolist()
        if written:
            size = out.element_size()
            # Indices past out's last element, counted from out's first: a view (row_stats' s, say) may start
            # inside its storage.
            elements = sorted({(nbytes + i) // size - out.storage_offset() for i in written})
            shown = ", ".join(f"{name}.flatten()[{e}]" for e in elements[:4])
            raise GradeFailure(
                f"{case}: wrote past the end of {name}: {len(written)} bytes after its last element changed, "
                f"at {shown}{' ...' if len(elements) > 4 else ''} ({name} has {out.numel()} elements)\n"
                f"  hint: {hint or SPILL_HINT}")


def pool_bytes(*sizes: int) -> int:
    """PoisonedPool's large_bytes for an op whose allocations are `sizes` bytes: those over 1 MiB, which the
    allocator serves from its large pool, each rounded up to ALLOCATOR_ROUNDING."""
    return sum(-(-s // ALLOCATOR_ROUNDING) * ALLOCATOR_ROUNDING for s in sizes if s > _SMALL_REQUEST)


def random_tensor(shape, dtype: torch.dtype, device="cuda", generator=None) -> torch.Tensor:
    """Standard normal values: signed, varied magnitudes, never all zeros."""
    return torch.randn(shape, dtype=torch.float32, device=device, generator=generator).to(dtype)


# ---------------------------------------------------------------- comparison
def _where(flat_index: int, shape: tuple[int, ...], block: int | None, tile: tuple[int, int] | None,
           locate=None) -> str:
    if locate is not None:  # the grader's own words for where an element sits (lab 08: batch, head, row, key block)
        return locate(flat_index)
    index = []
    rest = flat_index
    for size in reversed(shape):
        index.append(rest % size if size else 0)
        rest = rest // size if size else 0
    index = list(reversed(index))
    text = f"index {index}" if len(shape) != 1 else f"index {flat_index}"
    if tile is not None and len(shape) >= 2:
        row, col = index[-2], index[-1]
        text += f" (row {row}, col {col}; tile ({row // tile[0]}, {col // tile[1]}) of {tile[0]}x{tile[1]})"
    elif block is not None:
        text += f" (flat {flat_index}: block {flat_index // block}, thread {flat_index % block} of {block})"
    return text


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    case: str,
    tol: float,
    block: int | None = None,
    tile: tuple[int, int] | None = None,
    hint: str = "",
    floor: torch.Tensor | None = None,
    locate=None,
) -> float:
    """Check `out` against a float64 reference; return the relative error.

    An element is wrong when |out - ref| > tol * (|ref| + rms(ref) + floor): relative to
    its own size, with a floor at the tensor's typical size so that values near
    zero are judged on the scale of the data. `floor` (per element, broadcast to out) adds
    the scale of an error that does not shrink with the output: a formula that cancels,
    such as 0.5 u (1 + erf(u / sqrt 2)) for u << 0, is off by an ulp of 1 times 0.5 |u| however
    small the result, and a one-element tensor has no rms to absorb that. NaN is always wrong
    where the reference is finite: outputs start poisoned with NaN, so a NaN usually means
    the element was never written. `locate` (flat index -> text), when given, says where the first wrong
    element is in the grader's own words instead of its index.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise GradeFailure(f"{case}: output shape {tuple(out.shape)} but expected {tuple(ref.shape)}")
    got = out.detach().to(torch.float64)
    want = ref.detach().to(torch.float64).to(got.device)
    diff = (got - want).abs()
    scale = want.abs().pow(2).mean().sqrt().item() if want.numel() else 0.0
    allowed = tol * (want.abs() + scale)
    if floor is not None:
        allowed = allowed + tol * floor.detach().to(torch.float64).to(got.device).abs()
    bad = ~(diff <= allowed)  # NaN compares False, so NaN counts as wrong
    bad &= ~(want.isnan() & got.isnan())
    # ||out - ref|| / ||ref|| over the elements that were written (NaN ones are counted below);
    # the largest absolute error when the reference is all zeros.
    finite = ~got.isnan()
    error_norm = (got - want)[finite].norm().item() if finite.any() else 0.0
    ref_norm = want.nan_to_num().norm().item()
    rel_error = error_norm / ref_norm if ref_norm else (diff[finite].max().item() if finite.any() else 0.0)
    n_bad = int(bad.sum().item())
    if n_bad == 0:
        return rel_error
    n_nan = int((bad & got.isnan()).sum().item())
    first = int(bad.flatten().nonzero()[0].item())
    got_first = got.flatten()[first].item()
    want_first = want.flatten()[first].item()
    lines = [
        f"{case}: {n_bad} of {out.numel()} elements wrong ({100.0 * n_bad / max(1, out.numel()):.3g}%), "
        f"relative error {rel_error:.2e} over the finite ones "
        f"(tolerance {tol:.1e}, dtype {str(out.dtype).replace('torch.', '')})",
        f"  first wrong element at {_where(first, tuple(out.shape), block, tile, locate)}: "
        f"got {got_first:.6g}, expected {want_first:.6g}",
    ]
    if n_nan:
        lines.append(
            f"  {n_nan} wrong elements are NaN: the output starts filled with NaN, "
            "so these were most likely never written"
        )
    if hint:
        lines.append(f"  hint: {hint}")
    raise GradeFailure("\n".join(lines))


def assert_raises_clearly(fn, *, must_mention: tuple[str, ...], case: str) -> str:
    """Bad input must raise an error whose message names the problem."""
    try:
        fn()
    except (RuntimeError, ValueError, TypeError) as error:  # TORCH_CHECK raises RuntimeError subclasses
        text = str(error)
        missing = [word for word in must_mention if word.lower() not in text.lower()]
        if missing:
            raise GradeFailure(
                f"{case}: raised, but the message does not mention {missing}; "
                f"it said:\n    {text.splitlines()[0][:300]}"
            ) from None
        return text
    raise GradeFailure(f"{case}: expected a clear error, but the call returned normally")


def assert_flash_rule(out: torch.Tensor, golden: torch.Tensor, reference: torch.Tensor, *, case: str, k: float = 2.0,
                      hint: str = "", slack: torch.Tensor | float = 0.0, locate=None) -> float:
    """The rule flash-attention's tests use for 16-bit outputs (SYLLABUS §4); returns the worst error.

    `golden` is the float64 result from the same (already rounded) inputs; `reference` is what PyTorch
    computes in the output's own dtype. The worst |out - golden| may be at most k times the
    reference's worst |reference - golden|, plus the golden's own rounding noise (the worst error of
    rounding it once to the output dtype): a kernel may be as inexact as PyTorch's own 16-bit path,
    with room for a different summation order, and no more. A per-element tolerance wide enough for
    16-bit rounding lets a small systematic error through (a constant 1% off, a 16-bit accumulator);
    this bound is set by what the dtype can do, measured, not by a guess at it.

    `slack` (a float, or per element, broadcast to out) is added to the bound: the rounding a float32
    accumulator may leave where the golden cancels to about 0 (attention's gradients at a row that sees one
    key are exactly 0 in float64, a few float32 ulps of their terms in any kernel, and in PyTorch's own
    result sometimes exactly 0, which would make the bound 0). Keep it at float32's scale, far below the
    16-bit rounding the rule is about.
    """
    got = out.detach().to(torch.float64)
    want = golden.detach().to(torch.float64).to(got.device)
    ref_error = (reference.detach().to(torch.float64).to(got.device) - want).abs().max().item() if want.numel() else 0.0
    noise = (want.to(out.dtype).to(torch.float64) - want).abs().max().item() if want.numel() else 0.0
    bound = k * ref_error + noise
    error = (got - want).abs()
    has_slack = isinstance(slack, torch.Tensor) or bool(slack)
    if isinstance(slack, torch.Tensor):
        error = error - slack.detach().to(torch.float64).to(got.device)  # NaN stays NaN: never within the bound
    elif slack:
        error = error - slack
    worst = error.nan_to_num(float("inf")).max().item() if error.numel() else 0.0
    if worst <= bound:
        return worst
    over = ~(error <= bound)
    first = int(over.flatten().nonzero()[0].item())
    dtype = str(out.dtype).replace("torch.", "")
    lines = [
        f"{case}: worst error {worst:.3g}{' (beyond the float32 slack)' if has_slack else ''} against the float64 "
        f"golden is above the flash-attention bound {bound:.3g} "
        f"= {k:g} x PyTorch's own {dtype} error ({ref_error:.3g}) + the golden's rounding to {dtype} ({noise:.3g})",
        f"  {int(over.sum().item())} of {out.numel()} elements over the bound; the first at "
        f"{_where(first, tuple(out.shape), None, None, locate)}: got {got.flatten()[first].item():.6g}, "
        f"golden {want.flatten()[first].item():.6g}",
    ]
    if hint:
        lines.append(f"  hint: {hint}")
    raise GradeFailure("\n".join(lines))


def assert_ends_close(out: torch.Tensor, reference_of, *, case: str, tol: float, count: int = 4097, **kw) -> None:
    """For an output of more than 2^31 elements, where a float64 copy of the whole would not fit:
    compare its first and last `count` elements (in flat order) with `reference_of(flat_slice)`, the
    float64 reference of just those elements. A 32-bit index wraps past element 2^31 - 1: the last
    elements then were never written, or were written over the first ones."""
    flat = out.reshape(-1)
    n = flat.numel()
    for where, part in (("first", slice(0, min(count, n))), ("last", slice(max(0, n - count), n))):
        assert_close(flat[part], reference_of(part), case=f"{case}: its {where} {part.stop - part.start} elements "
                     f"(flat {part.start} .. {part.stop - 1})", tol=tol, **kw)


# ---------------------------------------------------------------- names and small checks every grader uses
def shape_id(shape) -> str:
    """(33, 17) -> '33x17': the shape in test ids and messages."""
    return "x".join(map(str, shape))


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> 'bfloat16'."""
    return str(dtype).removeprefix("torch.")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def first_line(error) -> str:
    """The first line of an exception's message (or of a text), cut to 300 characters; '' for an empty one."""
    lines = str(error).splitlines()
    return lines[0][:300] if lines else ""


def run_student(what: str, fn, *, hint: str):
    """Run the student's Python code (an autograd.Function, a Triton op); an exception it raises becomes a
    failure that says where, with `hint`. A GradeFailure passes through as it is."""
    try:
        return fn()
    except GradeFailure:
        raise
    except Exception as error:
        raise GradeFailure(f"{what} raised {type(error).__name__}: {first_line(error)}\n  hint: {hint}") from None


def run_past_2_31(fn, case: str, *, hint: str):
    """Call a kernel on inputs past 2^31 elements and wait for it: a RuntimeError on the way (an index that wrapped
    and faulted, a launch the wrapper refused) becomes a failure naming the case, with `hint`."""
    try:
        out = fn()
        torch.cuda.synchronize()
        return out
    except RuntimeError as error:
        raise GradeFailure(f"{case}: {first_line(error)}\n  hint: {hint}") from None


ONCE_DIFFERENTIABLE_HINT = (
    "decorate backward with @once_differentiable (torch.autograd.function), which makes a second derivative raise "
    "'trying to differentiate twice a function that was marked with @once_differentiable'")


def second_derivative_refused(backward, what: str, *, hint: str = ONCE_DIFFERENTIABLE_HINT) -> bool:
    """Run `backward` (a backward through a gradient made with create_graph=True): True when autograd refuses it with
    its clear once_differentiable error, False when it runs; any other RuntimeError is a failure naming `what`."""
    try:
        backward()
    except RuntimeError as error:
        text = str(error)
        if "twice" in text or "once_differentiable" in text:
            return True
        raise GradeFailure(f"a second derivative through {what} raised an unclear error:\n    {first_line(text)}\n"
                           f"  hint: {hint}") from None
    return False


PLACEMENT_HINT = "allocate outputs with at::empty(sizes, x.options())"


def check_placement(out, *, shape, like, name, case, dtype=None, hint: str = PLACEMENT_HINT) -> None:
    """Issue 11, class 7: an output's device (like's), dtype (like's unless given), shape and contiguity."""
    dtype = dtype or like.dtype
    problems = []
    if out.device != like.device:
        problems.append(f"on {out.device}, not on the inputs' {like.device}")
    if out.dtype != dtype:
        problems.append(f"of dtype {dtype_name(out.dtype)}, not {dtype_name(dtype)}")
    if tuple(out.shape) != tuple(shape):
        problems.append(f"of shape {list(out.shape)}, not {list(shape)}")
    elif not out.is_contiguous():
        problems.append(f"with strides {list(out.stride())}: not contiguous")
    if problems:
        raise GradeFailure(f"{case}: {name} is " + "; ".join(problems) + f"\n  hint: {hint}")


# column_sum's stage: rows summed at a time, few enough that PyTorch keeps each column's sum inside one block.
COLUMN_CHUNK = 128


def column_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum over the rows of a (..., n) tensor (a golden's column sums, float64), in stages of COLUMN_CHUNK rows.
    One torch.sum over 16384 rows of 1000 columns splits each column over several blocks through a staging buffer,
    and compute-sanitizer initcheck reported 24556 reads of it as uninitialized (at::native::reduce_kernel, in lab
    07's test_grad_weight_is_bitwise_deterministic[16384x1000-float32-registers] reference; H100, 2026-11-26): a
    report in PyTorch's kernel that a lab's sanitizer pass must not carry. Short stages keep every column in a block."""
    n = t.shape[-1]
    t = t.reshape(-1, n)
    while t.shape[0] > COLUMN_CHUNK:
        t = torch.nn.functional.pad(t, (0, 0, 0, -t.shape[0] % COLUMN_CHUNK)).view(-1, COLUMN_CHUNK, n).sum(1)
    return t.sum(0)


def skip_without_two_gpus(what: str) -> None:
    """Skip a test that needs a second GPU (issue 11, class 8: a missing device guard only shows there)."""
    import pytest

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs: {what}, and a missing device guard (c10::cuda::CUDAGuard), only show with "
                    "inputs on a GPU other than the current one")
