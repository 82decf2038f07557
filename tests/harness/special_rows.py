"""Rows that a row reduction with an exp or a log in it must survive (issue 34, class b).

A softmax written as exp(x) / sum(exp(x)), without the row's max subtracted first, gives the same numbers as the
right one for the values random_tensor draws; exp(89) overflows float32 and exp(710) float64, so only rows of
large values show it. Each pattern is one case of its own, so that a failure names it:

  'large'        values ~ N(0, 1) x 1e4 (float32, float16 clamped to its range, float64), x 1e30 (bfloat16): a
                 row's exps overflow unless its max is subtracted first, and underflow to 0 if only the sum is
                 rescaled afterwards;
  'ascending'    every row sorted, so a running max rises at every element and an online (max, sum) recurrence
                 must rescale its sum every time;
  'one finite'   every element -inf but one (a one-hot; two -inf parts merged give NaN without a guard);
  'masked'       about half of each row -inf, as an attention mask, with one finite element a row at least;
  'constant'     rows of one value (1e4, -1e4, 0, 3.5, -60000, 1): exp of a large negative value underflows to 0
                 unless shifted, and 0 / 0 is NaN;
  'all -inf row' row 1 entirely -inf: its max is -inf and exp(-inf - (-inf)) = exp(NaN), so a softmax of it is NaN
                 (torch.softmax's result); the other rows finite.
"""
from __future__ import annotations

import torch

PATTERNS = ["large", "ascending", "one finite", "masked", "constant", "all -inf row"]
LARGE_SCALE = {torch.float32: 1e4, torch.float16: 1e4, torch.bfloat16: 1e30, torch.float64: 1e4}
FLOAT16_LARGEST = 6e4  # float16's largest finite value is 65504
CONSTANT_LEVELS = [1e4, -1e4, 0.0, 3.5, -60000.0, 1.0]
ALL_INF_ROW = 1  # the row 'all -inf row' fills


def special_rows(pattern: str, shape: tuple[int, int], dtype: torch.dtype, scale: float = 2.0,
                 device: str = "cuda") -> torch.Tensor:
    """A (rows, n) tensor of `pattern`, drawn in float32 (float64 for float64) and rounded to dtype once. `scale`:
    the spread of the finite values of the patterns other than 'large' and 'constant' (values ~ N(0, scale))."""
    rows, n = shape
    inf = float("inf")
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(shape, device=device, dtype=wide) * scale
    if pattern == "large":
        x = torch.randn(shape, device=device, dtype=wide) * LARGE_SCALE[dtype]
        if dtype == torch.float16:
            x = x.clamp(-FLOAT16_LARGEST, FLOAT16_LARGEST)
    elif pattern == "ascending":
        x = x.sort(-1).values
    elif pattern == "one finite":
        hot = torch.randint(0, n, (rows,), device=device)
        hot[0], hot[-1] = 0, n - 1  # the first and the last column among them
        values = x[torch.arange(rows, device=device), hot]
        x = torch.full(shape, -inf, device=device, dtype=wide)
        x[torch.arange(rows, device=device), hot] = values
    elif pattern == "masked":
        x[torch.rand(shape, device=device) < 0.5] = -inf
        x[:, n // 2] = 1.0  # at least one finite element a row
    elif pattern == "constant":
        levels = torch.tensor(CONSTANT_LEVELS, device=device, dtype=wide)
        levels = levels[torch.arange(rows, device=device) % len(levels)]
        x = levels.unsqueeze(-1).expand(shape).contiguous()
    elif pattern == "all -inf row":
        x[ALL_INF_ROW] = -inf
    else:
        raise ValueError(f"special_rows: no pattern {pattern!r}; the patterns are {PATTERNS}")
    return x.to(dtype)
