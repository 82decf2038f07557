"""The same call again and again (issue 34, class d): a race (a dropped barrier, a read before the write it needs)
shows in a few runs of many, so a stress test runs a kernel many times, each run's allocations from memory filled
with NaN first (a read of scratch before it is written gives NaN), and requires every run bitwise equal to the first
where the kernel promises determinism."""
from __future__ import annotations

import torch

from . import check
from .calls import bits


def run_poisoned(fn, *sizes: int):
    """fn() with every allocation in it (outputs and scratch alike) from a pool filled with NaN first; `sizes`: the
    bytes of its allocations (those over 1 MiB need room of their own in the pool)."""
    with check.PoisonedPool(large_bytes=check.pool_bytes(*sizes)):
        return fn()


def assert_bitwise_equal(name: str, out: torch.Tensor, first: torch.Tensor, *, case: str, hint: str) -> None:
    """`out` has the bits of the first run's `first` (NaN included: compared as bits)."""
    now, then = bits(out), bits(first)
    if torch.equal(now, then):
        return
    differ = int((now != then).sum())
    nan = int(out.isnan().sum()) if out.dtype.is_floating_point else 0
    raise check.GradeFailure(f"{case}: {name} differs from run 1 in {differ} of {out.numel()} elements ({nan} NaN): "
                             f"not bitwise identical\n  hint: {hint}")
