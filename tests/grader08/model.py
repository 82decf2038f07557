"""The CPU model (flash_model.py, the page's model_online and model_blocks), no GPU needed."""
from __future__ import annotations

import pytest
import torch

import harness
from grader08.common import _model_inputs, mask_name
from harness.attention import MODEL, blind_rows

__all__ = ["test_model_forward", "test_model_backward", "test_model_blocks",
           "test_model_causal_skips_half_the_blocks"]


# ---------------------------------------------------------------- the CPU model (flash_model.py), no GPU needed
MODEL_CASES = [((1, 1), False, (1, 1)), ((1, 1), True, (1, 1)), ((113, 203), False, (2, 2)),
               ((113, 203), True, (4, 2)), ((128, 217), False, (3, 1)), ((128, 217), True, (2, 2)),
               ((203, 113), True, (4, 2)), ((203, 113), False, (2, 1)), ((64, 64), True, (2, 2)),
               ((0, 5), True, (2, 1)), ((5, 0), False, (2, 1)), ((1023, 1024), True, (1, 1))]
MODEL_TILES = [(64, 64), (64, 128), (64, 16), (128, 64), (16, 32)]  # the kernels' (constants()) and others


def _model_id(case):
    (sq, sk), causal, (hq, hkv) = case
    return f"{sq}x{sk}-{mask_name(causal)}-h{hq}-kv{hkv}"


def _assert_model_close(got, want, what):
    both_inf = torch.isinf(got) & torch.isinf(want) & (got == want)
    diff = (got - want).abs().masked_fill(both_inf, 0.0)
    worst = diff.nan_to_num(float("inf")).max().item() if diff.numel() else 0.0
    assert worst <= 1e-12 * max(1.0, want.nan_to_num(0.0, 0.0, 0.0).abs().max().item() if want.numel() else 1.0), (
        f"flash_model.py: {what} differs from the reference by {worst:.3g}")


@pytest.mark.parametrize("tile", MODEL_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", MODEL_CASES, ids=_model_id)
@harness.reference_check  # flash_model.py is given
def test_model_forward(case, tile):
    """The tiled forward (online recurrence, block skipping, masks) equals the formula to 1e-12, rows that see no key
    included (o = 0, lse = -inf), at every tile shape; and it visits exactly forward_key_blocks' blocks."""
    (sq, sk), causal, heads = case
    q, k, v, _ = _model_inputs(sq, sk, heads)
    o, lse = MODEL.reference_forward(q, k, v, causal)
    visits = []
    to, tlse = MODEL.tiled_forward(q, k, v, causal, block_m=tile[0], block_n=tile[1], visits=visits)
    _assert_model_close(to, o, f"tiled_forward's o ({_model_id(case)}, tiles {tile})")
    _assert_model_close(tlse, lse, f"tiled_forward's lse ({_model_id(case)}, tiles {tile})")
    blind = blind_rows(sq, sk, causal)
    assert bool((o[:, :blind] == 0).all()) and bool((lse[:, :, :blind] == float("-inf")).all())
    assert not bool(o.isnan().any()) and not bool(lse.isnan().any())
    o_scaled, _ = MODEL.reference_forward(q, k, v, causal, scale=0.37)
    to_scaled, _ = MODEL.tiled_forward(q, k, v, causal, scale=0.37, block_m=tile[0], block_n=tile[1])
    _assert_model_close(to_scaled, o_scaled, "tiled_forward with scale 0.37")


@pytest.mark.parametrize("tile", MODEL_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", MODEL_CASES, ids=_model_id)
@harness.reference_check  # flash_model.py is given
def test_model_backward(case, tile):
    """The tiled backward's loop (per key block, over the group's query heads and the query blocks that see it)
    equals the explicit formulas to 1e-12; the explicit formulas equal torch.autograd of the float64 composition."""
    (sq, sk), causal, heads = case
    if sq > 300 and tile != (64, 64):
        pytest.skip("the long case runs at one tile shape (its loops are slow in Python)")
    q, k, v, do = _model_inputs(sq, sk, heads)
    o, lse = MODEL.reference_forward(q, k, v, causal)
    grads = MODEL.reference_backward(do, q, k, v, causal)
    tiled = MODEL.tiled_backward(do, q, k, v, o, lse, causal, block_m=tile[0], block_n=tile[1])
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), tiled, grads):
        _assert_model_close(got, want, f"tiled_backward's {name} ({_model_id(case)}, tiles {tile})")
    if sq * sk and tile == (64, 64):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        auto = torch.autograd.grad(MODEL.attention_autograd(*leaves, causal), leaves, do, allow_unused=True)
        for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, auto):
            _assert_model_close(got, want if want is not None else torch.zeros_like(got),
                                f"reference_backward's {name} against torch.autograd ({_model_id(case)})")


BLOCK_SHAPES = [(16, 16), (16, 32), (32, 16), (64, 16), (64, 32), (64, 64), (128, 64), (64, 128)]


def _block_truth(seqlen_q, seqlen_k, block_m, block_n, causal):
    """From the (query, key) visibility matrix alone, per (query block, key block) including one key block past the
    end: (some pair visible, every pair of a valid row visible), keys past seqlen_k counting as not visible."""
    n_q, n_k = MODEL.ceil_div(seqlen_q, block_m), MODEL.ceil_div(seqlen_k, block_n) + 1
    vis = torch.zeros(n_q * block_m, n_k * block_n, dtype=torch.bool)
    vis[:seqlen_q, :seqlen_k] = MODEL.visible(seqlen_q, seqlen_k, causal)
    padding_row = (torch.arange(n_q * block_m) >= seqlen_q).view(n_q, block_m, 1, 1)
    blocks = vis.view(n_q, block_m, n_k, block_n)
    return blocks.any(3).any(1), (blocks | padding_row).all(3).all(1)


def _seqlens(block):
    """Every length to 17, and one short of, at and one past 1, 2 and 3 of either block size (tails of one key,
    whole blocks, a block and one)."""
    return sorted(set(range(0, 18)) | {b * j + e for b in block for j in (1, 2, 3) for e in (-1, 0, 1)})


@pytest.mark.parametrize("block", BLOCK_SHAPES, ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=mask_name)
@harness.reference_check  # flash_model.py is given
def test_model_blocks(causal, block):
    """forward_key_blocks and backward_query_blocks visit exactly the blocks with at least one visible (query, key)
    pair (the rest skipped, never loaded), and leave unmasked exactly the blocks where every pair is visible, for
    lengths with tails, seqlen_q > seqlen_k, one block and none: checked against the visibility matrix."""
    block_m, block_n = block
    lengths = _seqlens(block)
    for seqlen_q in lengths:
        for seqlen_k in lengths:
            anything, everything = _block_truth(seqlen_q, seqlen_k, block_m, block_n, causal)
            n_q, n_k = anything.shape
            for qb in range(n_q):
                n_blocks, n_unmasked = MODEL.forward_key_blocks(qb, block_m, block_n, seqlen_q, seqlen_k, causal)
                visited = torch.arange(n_k) < n_blocks
                unmasked = torch.arange(n_k) < n_unmasked
                where = f"seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, blocks {block_m}x{block_n}, query block {qb}"
                assert torch.equal(visited, anything[qb]), (
                    f"forward_key_blocks: {where}: visits {visited.tolist()}, blocks with a visible pair "
                    f"{anything[qb].tolist()}")
                assert torch.equal(unmasked[visited], everything[qb][visited]), (
                    f"forward_key_blocks: {where}: unmasked {unmasked.tolist()}, wholly visible "
                    f"{everything[qb].tolist()}")
            for kb in range(n_k - 1):
                first, n_blocks, first_unmasked = MODEL.backward_query_blocks(kb, block_m, block_n, seqlen_q,
                                                                              seqlen_k, causal)
                visited = (torch.arange(n_q) >= first) & (torch.arange(n_q) < n_blocks)
                unmasked = torch.arange(n_q) >= first_unmasked
                where = f"seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, blocks {block_m}x{block_n}, key block {kb}"
                assert n_blocks == n_q and torch.equal(visited, anything[:, kb]), (
                    f"backward_query_blocks: {where}: visits {visited.tolist()}, blocks with a visible pair "
                    f"{anything[:, kb].tolist()}")
                assert torch.equal(unmasked[visited], everything[:, kb][visited]), (
                    f"backward_query_blocks: {where}: unmasked {unmasked.tolist()}, wholly visible "
                    f"{everything[:, kb].tolist()}")


@harness.reference_check  # flash_model.py is given
def test_model_causal_skips_half_the_blocks():
    """The page's count: at seqlen 4096 with 64 x 64 blocks, a causal forward visits the T(T + 1) / 2 = 2080 blocks on
    or below the diagonal of T^2 = 4096, masking only the 64 diagonal ones."""
    visited = masked = 0
    for qb in range(64):
        n_blocks, n_unmasked = MODEL.forward_key_blocks(qb, 64, 64, 4096, 4096, True)
        visited += n_blocks
        masked += n_blocks - n_unmasked
    assert (visited, masked) == (2080, 64), (visited, masked)
