"""Correctness checks: tolerances derived from the dtype, poisoned outputs, and
failure messages that say what went wrong, where, and what to do next."""
from __future__ import annotations

import math

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


def random_tensor(shape, dtype: torch.dtype, device="cuda", generator=None) -> torch.Tensor:
    """Standard normal values: signed, varied magnitudes, never all zeros."""
    return torch.randn(shape, dtype=torch.float32, device=device, generator=generator).to(dtype)


# ---------------------------------------------------------------- comparison
def _where(flat_index: int, shape: tuple[int, ...], block: int | None, tile: tuple[int, int] | None) -> str:
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
) -> float:
    """Check `out` against a float64 reference; return the relative error.

    An element is wrong when |out - ref| > tol * (|ref| + rms(ref)): relative to
    its own size, with a floor at the tensor's typical size so that values near
    zero are judged on the scale of the data. NaN is always wrong where the
    reference is finite: outputs start poisoned with NaN, so a NaN usually means
    the element was never written.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise GradeFailure(f"{case}: output shape {tuple(out.shape)} but expected {tuple(ref.shape)}")
    got = out.detach().to(torch.float64)
    want = ref.detach().to(torch.float64).to(got.device)
    diff = (got - want).abs()
    scale = want.abs().pow(2).mean().sqrt().item() if want.numel() else 0.0
    allowed = tol * (want.abs() + scale)
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
        f"  first wrong element at {_where(first, tuple(out.shape), block, tile)}: "
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
                      hint: str = "") -> float:
    """The rule flash-attention's tests use for 16-bit outputs (SYLLABUS §4); returns the worst error.

    `golden` is the float64 result from the same (already rounded) inputs; `reference` is what PyTorch
    computes in the output's own dtype. The worst |out - golden| may be at most k times the
    reference's worst |reference - golden|, plus the golden's own rounding noise (the worst error of
    rounding it once to the output dtype): a kernel may be as inexact as PyTorch's own 16-bit path,
    with room for a different summation order, and no more. A per-element tolerance wide enough for
    16-bit rounding lets a small systematic error through (a constant 1% off, a 16-bit accumulator);
    this bound is set by what the dtype can do, measured, not by a guess at it.
    """
    got = out.detach().to(torch.float64)
    want = golden.detach().to(torch.float64).to(got.device)
    ref_error = (reference.detach().to(torch.float64).to(got.device) - want).abs().max().item()
    noise = (want.to(out.dtype).to(torch.float64) - want).abs().max().item()
    bound = k * ref_error + noise
    error = (got - want).abs()
    worst = error.nan_to_num(float("inf")).max().item() if error.numel() else 0.0
    if worst <= bound:
        return worst
    over = ~(error <= bound)
    first = int(over.flatten().nonzero()[0].item())
    dtype = str(out.dtype).replace("torch.", "")
    lines = [
        f"{case}: worst error {worst:.3g} against the float64 golden is above the flash-attention bound {bound:.3g} "
        f"= {k:g} x PyTorch's own {dtype} error ({ref_error:.3g}) + the golden's rounding to {dtype} ({noise:.3g})",
        f"  {int(over.sum().item())} of {out.numel()} elements over the bound; the first at "
        f"{_where(first, tuple(out.shape), None, None)}: got {got.flatten()[first].item():.6g}, "
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
