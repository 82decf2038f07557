"""The grader's comparisons (harness.check), on CPU tensors: the tolerance grows with the length of a reduction;
assert_close passes rounding and fails a real error, a wrong shape and elements a kernel never wrote, naming the row,
column, tile or block of what it found; check.column_sum is the sum over rows for every shape, empty ones included."""
from __future__ import annotations

import pytest
import torch

from harness import check


def test_tolerance_grows_with_reduction_length():
    assert check.tolerance(torch.float32) < check.tolerance(torch.bfloat16)
    assert check.tolerance(torch.float32, 10_000) == pytest.approx(100 * check.tolerance(torch.float32))


def test_assert_close_reports_unwritten_elements():
    ref = torch.arange(1, 1001, dtype=torch.float64).reshape(10, 100)
    out = ref.float().clone()
    out[3, 70:] = float("nan")  # a tile the kernel never wrote
    with pytest.raises(check.GradeFailure) as failure:
        check.assert_close(out, ref, case="demo", tol=check.tolerance(torch.float32), tile=(4, 32))
    message = str(failure.value)
    assert "30 of 1000 elements wrong" in message
    assert "row 3, col 70" in message and "tile (0, 2)" in message
    assert "never written" in message


def test_assert_close_passes_rounding_and_fails_real_error():
    ref = torch.randn(4097, dtype=torch.float64)
    check.assert_close(ref.float(), ref, case="rounding only", tol=check.tolerance(torch.float32))
    wrong = ref.float().clone()
    wrong[4096] += 1e-3
    with pytest.raises(check.GradeFailure, match=r"index 4096 \(flat 4096: block 16, thread 0 of 256\)"):
        check.assert_close(wrong, ref, case="one bad element", tol=check.tolerance(torch.float32), block=256)


@pytest.mark.parametrize("shape", [(0, 5), (1, 3), (127, 4), (128, 4), (129, 4), (16384, 10), (3, 5, 7),
                                   (2**15 + 3, 2)])
def test_column_sum_is_the_sum_over_rows(shape):
    t = torch.randn(shape, dtype=torch.float64)
    got = check.column_sum(t)
    want = t.reshape(-1, shape[-1]).sum(0)
    assert got.shape == (shape[-1],) and torch.allclose(got, want, rtol=1e-12, atol=1e-9)


def test_assert_close_rejects_wrong_shape():
    with pytest.raises(check.GradeFailure, match="shape"):
        check.assert_close(torch.zeros(3), torch.zeros(4, dtype=torch.float64), case="shape", tol=1e-6)
