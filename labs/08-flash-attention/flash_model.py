# Lab skeleton generated from solutions/08-flash-attention/flash_model.py by `./course labs` [lab-hash e7f886c29e71].
# Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
# Instructors: edit the solution file instead, then run `./course labs`.
"""Lab 08's model of attention on the CPU (or any device), in float64: what the kernels compute and how they walk it.

Three parts, each checked by the grader on every machine (tests/test_08_flash_attention.py, test_model_*):

  - the reference: attention by its formula, with the lab's conventions (attention.h): layout (batch, seqlen,
    heads, head_dim); scale = 1 / sqrt(head_dim) unless given; causal aligned bottom-right (causal_key_end);
    grouped-query heads (query head h reads key/value head h // (heads_q // heads_kv)); a row that sees no key
    has o = 0 and lse = -inf. Forward and backward, the backward by its explicit formulas
    (D = rowsum(dO * O), dS = P * (dP - D)), which the grader also checks against torch.autograd;
  - the tiled forward, exactly as the kernels walk it: query blocks of block_m rows, key blocks of block_n keys,
    the online (m, l) recurrence with O rescaled whenever a row's maximum grows, causal blocks skipped (never
    loaded) and the per-element mask applied only to the blocks that need it;
  - the tiled backward's loop: per key block (one block of the kernel), over the query heads of its GQA group and
    over the query blocks that can see it, dK and dV accumulated for the key block, dQ added into a float
    accumulator (the kernel's atomics).

The tiled functions compute in float64, so they equal the reference to ~1e-12: the tiling, the rescaling and the
block skipping are exact rearrangements of the formula, not approximations. `p_dtype` (optional) rounds P to a
16-bit type before the P V product, as the tensor-core kernels do, to show where their rounding enters.

Tensors are torch tensors on any device; the reference functions take any floating dtype and compute in float64.
Run `python flash_model.py` for a self-check.
"""
from __future__ import annotations

import math

import torch

F64 = torch.float64


# ---------------------------------------------------------------- conventions (attention.h)
def causal_key_end(query: int, seqlen_q: int, seqlen_k: int) -> int:
    """One past the last key that query row `query` may see, bottom-right aligned (attention.h's causal_key_end):
    query i sees keys j <= i + (seqlen_k - seqlen_q). <= 0: the row sees no key."""
    return min(query + 1 + (seqlen_k - seqlen_q), seqlen_k)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def kv_head_of(heads_q: int, heads_kv: int) -> torch.Tensor:
    """The key/value head each query head reads: h // (heads_q // heads_kv)."""
    if heads_kv <= 0 or heads_q % heads_kv:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    return torch.arange(heads_q) // (heads_q // heads_kv)


def visible(seqlen_q: int, seqlen_k: int, causal: bool, device=None) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool: True where query i may see key j."""
    if not causal:
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) -> (B, H, S, D) float64."""
    return x.detach().to(F64).permute(0, 2, 1, 3)


def _expand_kv(x: torch.Tensor, heads_q: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hq, S, D): each query head's key/value head."""
    return x[:, kv_head_of(heads_q, x.shape[1]).to(x.device)]


def _sum_groups(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, Hq, S, D) -> (B, Hkv, S, D): a key/value head's gradient sums over the query heads that read it."""
    b, hq, s, d = x.shape
    return x.reshape(b, heads_kv, hq // heads_kv, s, d).sum(2)


# ---------------------------------------------------------------- (a) the reference
def _scores(q, k, causal, scale):
    """float64 (B, Hq, Sq, Sk) scale * q k^T with -inf where the key is masked; q (B, Hq, Sq, D), k expanded."""
    s = scale * (q @ k.transpose(-1, -2))
    if causal:
        s = s.masked_fill(~visible(q.shape[2], k.shape[2], True, q.device), float("-inf"))
    return s


def _softmax_stats(s):
    """(P, lse) of scores with -inf for masked keys; a row with every key masked gets P = 0 and lse = -inf."""
    lse = torch.logsumexp(s, dim=-1)  # -inf for an all -inf row (and no NaN)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe.unsqueeze(-1))  # exp(-inf - 0) = 0 in such a row
    return p, lse


def reference_forward(q, k, v, causal: bool = False, scale: float | None = None):
    """(o, lse) by the formula, in float64: o (B, Sq, Hq, D), lse (B, Hq, Sq). q (B, Sq, Hq, D); k, v (B, Sk, Hkv, D).
    Rows that see no key (causal with seqlen_q > seqlen_k, or seqlen_k == 0): o = 0, lse = -inf."""
    scale = default_scale(q.shape[-1], scale)
    hq = q.shape[2]
    qh, kh, vh = _heads_first(q), _expand_kv(_heads_first(k), hq), _expand_kv(_heads_first(v), hq)
    p, lse = _softmax_stats(_scores(qh, kh, causal, scale))
    o = p @ vh
    return o.permute(0, 2, 1, 3).contiguous(), lse.contiguous()


def reference_backward(grad_o, q, k, v, causal: bool = False, scale: float | None = None, *, o=None):
    """(grad_q, grad_k, grad_v) in float64 by the explicit formulas, per (batch, query head):
        P = softmax(scale q k^T) (masked), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O) (= rowsum(P * dP)),
        dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q,
    dK and dV of a key/value head summed over the query heads of its group. `o`: the forward output D is taken
    from (the exact one when None; the kernels take the o the forward stored)."""
    scale = default_scale(q.shape[-1], scale)
    hq, hkv = q.shape[2], k.shape[2]
    qh, kh, vh = _heads_first(q), _expand_kv(_heads_first(k), hq), _expand_kv(_heads_first(v), hq)
    do = _heads_first(grad_o)
    p, _ = _softmax_stats(_scores(qh, kh, causal, scale))
    oh = p @ vh if o is None else _heads_first(o)
    d = (do * oh).sum(-1, keepdim=True)  # (B, Hq, Sq, 1)
    dp = do @ vh.transpose(-1, -2)
    ds = p * (dp - d)
    dq = scale * (ds @ kh)
    dk = _sum_groups(scale * (ds.transpose(-1, -2) @ qh), hkv)
    dv = _sum_groups(p.transpose(-1, -2) @ do, hkv)
    back = (lambda t: t.permute(0, 2, 1, 3).contiguous())
    return back(dq), back(dk), back(dv)


def attention_autograd(q, k, v, causal: bool = False, scale: float | None = None):
    """o by differentiable torch ops (float64 in, float64 out), for torch.autograd: the backward's cross-check."""
    scale = default_scale(q.shape[-1], scale)
    hq = q.shape[2]
    qh, kh, vh = q.permute(0, 2, 1, 3), _expand_kv(k.permute(0, 2, 1, 3), hq), _expand_kv(v.permute(0, 2, 1, 3), hq)
    s = _scores(qh, kh, causal, scale)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a fully masked row: softmax gives NaN, the convention 0
    return (p @ vh).permute(0, 2, 1, 3)


def reference_term_sizes(grad_o, q, k, v, causal: bool = False, scale: float | None = None):
    """float64 per-element sums of the magnitudes of the terms each output adds up (B, S, H, D layout each):
    o: sum_j P |v_j|; grad_q: scale sum_j P (|dP| + |D|) |k_j|; grad_k: scale sum_i P (|dP| + |D|) |q_i|;
    grad_v: sum_i P |dO_i|. A float accumulator's rounding error scales with these, not with the result, which
    cancels (a weighted mean of random-signed values is much smaller than its terms)."""
    scale = default_scale(q.shape[-1], scale)
    hq, hkv = q.shape[2], k.shape[2]
    qh, kh, vh = _heads_first(q), _expand_kv(_heads_first(k), hq), _expand_kv(_heads_first(v), hq)
    p, _ = _softmax_stats(_scores(qh, kh, causal, scale))
    sizes = {"o": p @ vh.abs()}
    if grad_o is not None:
        do = _heads_first(grad_o)
        dp = do @ vh.transpose(-1, -2)
        d = (do * (p @ vh)).sum(-1, keepdim=True)
        ds_size = p * (dp.abs() + d.abs())
        sizes["grad_q"] = scale * (ds_size @ kh.abs())
        sizes["grad_k"] = _sum_groups(scale * (ds_size.transpose(-1, -2) @ qh.abs()), hkv)
        sizes["grad_v"] = _sum_groups(p.transpose(-1, -2) @ do.abs(), hkv)
    return {name: t.permute(0, 2, 1, 3).contiguous() for name, t in sizes.items()}


# ---------------------------------------------------------------- (b) which blocks a block visits
# --8<-- [start:model_blocks]
def forward_key_blocks(query_block: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                       causal: bool) -> tuple[int, int]:
    """The key blocks the forward's query block visits: 0 .. n_blocks - 1 (the rest are skipped: never loaded).
    The first n_unmasked of them need no per-element mask; blocks n_unmasked .. n_blocks - 1 are masked
    (the causal diagonal, and the tail block when seqlen_k % block_n != 0)."""
    row_begin = query_block * block_m
    row_last = min(row_begin + block_m, seqlen_q) - 1
    if causal:
        # causal_key_end grows with the row: the block's last row sees the most keys, its first the fewest.
        key_end_last = causal_key_end(row_last, seqlen_q, seqlen_k)
        key_end_first = causal_key_end(row_begin, seqlen_q, seqlen_k)
    else:
        key_end_last = key_end_first = seqlen_k
    n_blocks = ceil_div(max(key_end_last, 0), block_n)  # 0 when no row of the block sees a key
    # A block is unmasked when every one of its keys is visible to the first row (hence to all of them, and
    # inside seqlen_k, since causal_key_end <= seqlen_k).
    n_unmasked = min(max(key_end_first, 0) // block_n, n_blocks)
    return n_blocks, n_unmasked


def backward_query_blocks(key_block: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                          causal: bool) -> tuple[int, int, int]:
    """The query blocks the backward's key block visits: first .. n_blocks - 1. From first_unmasked on, every
    row of the block sees every key of the key block (no per-element mask); before it, masked."""
    n_blocks = ceil_div(seqlen_q, block_m)
    key_begin = key_block * block_n
    key_last = min(key_begin + block_n, seqlen_k) - 1
    full = key_begin + block_n <= seqlen_k  # a tail key block is masked in every query block
    if not causal:
        return 0, n_blocks, 0 if full else n_blocks
    # Row i sees key j when j < causal_key_end(i), i.e. i >= j - (seqlen_k - seqlen_q).
    first_row = max(key_begin - (seqlen_k - seqlen_q), 0)  # the first row that sees the block's first key
    all_row = max(key_last - (seqlen_k - seqlen_q), 0)  # the first row that sees every key of the block
    first = min(first_row // block_m, n_blocks)
    first_unmasked = min(ceil_div(all_row, block_m), n_blocks) if full else n_blocks
    return first, n_blocks, max(first_unmasked, first)
# --8<-- [end:model_blocks]


# ---------------------------------------------------------------- (b) the tiled forward
def _mask_block(s, rows, cols, seqlen_q, seqlen_k, causal):
    """Set s[..., r, c] to -inf where key cols[c] is past seqlen_k or not visible to row rows[r]."""
    keep = cols.unsqueeze(0) < seqlen_k
    if causal:
        keep = keep & (cols.unsqueeze(0) <= rows.unsqueeze(1) + (seqlen_k - seqlen_q))
    return s.masked_fill(~keep, float("-inf"))


def tiled_forward(q, k, v, causal: bool = False, scale: float | None = None, *, block_m: int = 64,
                  block_n: int = 64, p_dtype: torch.dtype | None = None, visits: list | None = None):
    """(o, lse) as the flash forward computes them: for each query block (a thread block of the kernel; batch and
    heads vectorized here), walk key blocks 0 .. n_blocks - 1 with the online recurrence. float64 throughout,
    except P rounded to `p_dtype` before P V when given (the tensor-core kernels' one 16-bit rounding inside the
    loop; l sums the unrounded P, as FlashAttention-2 does). `visits`, when a list, receives (query_block,
    key_block, masked) for every block visited."""
    scale = default_scale(q.shape[-1], scale)
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k = k.shape[1]
    qh, kh, vh = _heads_first(q), _expand_kv(_heads_first(k), heads_q), _expand_kv(_heads_first(v), heads_q)
    o = torch.zeros(batch, heads_q, seqlen_q, head_dim, dtype=F64, device=qh.device)
    lse = torch.full((batch, heads_q, seqlen_q), float("-inf"), dtype=F64, device=qh.device)
    for qb in range(ceil_div(seqlen_q, block_m)):
        rows = torch.arange(qb * block_m, min(qb * block_m + block_m, seqlen_q), device=qh.device)
        q_tile = qh[:, :, rows]  # (B, H, Br, D): loaded once, kept for every key block
        # --8<-- [start:model_online]
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=F64, device=qh.device)  # running max per row
        l = torch.zeros_like(m)  # noqa: E741 - the page's l: running sum of exp(s - m) per row
        acc = torch.zeros_like(q_tile)  # running sum of exp(s - m) v per row, not yet divided by l
        n_blocks, n_unmasked = forward_key_blocks(qb, block_m, block_n, seqlen_q, seqlen_k, causal)
        for kb in range(n_blocks):
            cols = torch.arange(kb * block_n, min(kb * block_n + block_n, seqlen_k), device=qh.device)
            s = scale * (q_tile @ kh[:, :, cols].transpose(-1, -2))  # (B, H, Br, Bc) S tile
            if kb >= n_unmasked:  # the diagonal and tail blocks only
                s = _mask_block(s, rows, cols, seqlen_q, seqlen_k, causal)
            if visits is not None:
                visits.append((qb, kb, kb >= n_unmasked))
            m_new = torch.maximum(m, s.amax(-1))
            # The -inf guard: while a row has seen no visible key, m_new = -inf and exp(s - m_new) would be
            # exp(-inf + inf) = NaN; offset by 0 instead, so that every exp(-inf - 0) is 0 and l stays 0.
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)  # rescale of the old state: exp(old max - new max), 0 when m = -inf
            p = torch.exp(s - m_safe.unsqueeze(-1))
            l = alpha * l + p.sum(-1)  # noqa: E741
            p_v = p if p_dtype is None else p.to(p_dtype).to(F64)  # the kernels' P -> 16-bit A fragments
            acc = alpha.unsqueeze(-1) * acc + p_v @ vh[:, :, cols]
            m = m_new
        # Epilogue: one division per row; a row that saw no key has l = 0: o = 0 and lse = log(0) = -inf.
        inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
        o[:, :, rows] = acc * inv_l.unsqueeze(-1)
        lse[:, :, rows] = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("-inf")))
        # --8<-- [end:model_online]
    return o.permute(0, 2, 1, 3).contiguous(), lse


# ---------------------------------------------------------------- (c) the tiled backward
def backward_preprocess(grad_o, o):
    """D = rowsum(dO * O) per (batch, head, query row): (B, Hq, Sq) float64 (the kernels keep it in float32)."""
    return (_heads_first(grad_o) * _heads_first(o)).sum(-1)


def tiled_backward(grad_o, q, k, v, o, lse, causal: bool = False, scale: float | None = None, *,
                   block_m: int = 64, block_n: int = 64, visits: list | None = None):
    """(grad_q, grad_k, grad_v) as the flash backward computes them. One block of the kernel per (batch, key/value
    head, key block): its dK and dV stay in registers while it walks, for each query head of its GQA group, the
    query blocks that can see the key block, recomputing P = exp(scale q k^T - lse) (0 where lse = -inf). dQ of
    a query block collects from every key block: the kernel adds into a float32 accumulator with atomics (here a
    float64 +=). Batch and key/value heads are vectorized; `visits` receives (key_block, group_member,
    query_block, masked)."""
    scale = default_scale(q.shape[-1], scale)
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)  # (B, Hq, Sq, D), (B, Hkv, Sk, D)
    do = _heads_first(grad_o)
    lse = lse.to(F64)
    delta = backward_preprocess(grad_o, o)  # lab08.6's kernel
    dq_accum = torch.zeros_like(qh)  # the kernel's grad_q_accum (float32, zeroed by the launcher)
    dk = torch.zeros_like(kh)
    dv = torch.zeros_like(vh)
    for kb in range(ceil_div(seqlen_k, block_n)):
        cols = torch.arange(kb * block_n, min(kb * block_n + block_n, seqlen_k), device=qh.device)
        k_tile, v_tile = kh[:, :, cols], vh[:, :, cols]  # (B, Hkv, Bc, D): loaded once per block
        dk_acc = torch.zeros_like(k_tile)
        dv_acc = torch.zeros_like(v_tile)
        first, n_blocks, first_unmasked = backward_query_blocks(kb, block_m, block_n, seqlen_q, seqlen_k, causal)
        for member in range(group):  # query head h = g * group + member of key/value head g, in a fixed order
            heads = torch.arange(heads_kv, device=qh.device) * group + member
            for qb in range(first, n_blocks):
                rows = torch.arange(qb * block_m, min(qb * block_m + block_m, seqlen_q), device=qh.device)
                q_tile, do_tile = qh[:, heads][:, :, rows], do[:, heads][:, :, rows]
                s = scale * (q_tile @ k_tile.transpose(-1, -2))  # (B, Hkv, Br, Bc)
                masked = qb < first_unmasked
                if masked:
                    s = _mask_block(s, rows, cols, seqlen_q, seqlen_k, causal)
                if visits is not None:
                    visits.append((kb, member, qb, masked))
                row_lse = lse[:, heads][:, :, rows]
                safe = torch.where(torch.isinf(row_lse), torch.full_like(row_lse, float("inf")), row_lse)
                p = torch.exp(s - safe.unsqueeze(-1))  # lse = -inf (no visible key): exp(s - inf) = 0, not NaN
                dv_acc += p.transpose(-1, -2) @ do_tile
                dp = do_tile @ v_tile.transpose(-1, -2)
                ds = p * (dp - delta[:, heads][:, :, rows].unsqueeze(-1))
                dk_acc += ds.transpose(-1, -2) @ q_tile
                dq_accum[:, heads.unsqueeze(-1), rows.unsqueeze(0)] += scale * (ds @ k_tile)  # the atomics
        dk[:, :, cols] = scale * dk_acc
        dv[:, :, cols] = dv_acc
    back = (lambda t: t.permute(0, 2, 1, 3).contiguous())
    return back(dq_accum), back(dk), back(dv)


def _self_check() -> None:
    torch.manual_seed(0)
    for (sq, sk), causal, (hq, hkv), (bm, bn) in [((113, 203), True, (4, 2), (64, 32)),
                                                  ((203, 113), True, (3, 1), (32, 64)),
                                                  ((128, 217), False, (2, 2), (128, 64))]:
        q, k, v, do = (torch.randn(2, s, h, 64, dtype=F64) for s, h in ((sq, hq), (sk, hkv), (sk, hkv), (sq, hq)))
        o, lse = reference_forward(q, k, v, causal)
        to, tlse = tiled_forward(q, k, v, causal, block_m=bm, block_n=bn)
        grads = reference_backward(do, q, k, v, causal)
        tiled = tiled_backward(do, q, k, v, o, lse, causal, block_m=bm, block_n=bn)
        worst = max((to - o).abs().max().item(), (tlse - lse).nan_to_num(0.0).abs().max().item(),
                    *((a - b).abs().max().item() for a, b in zip(tiled, grads)))
        print(f"Sq {sq} Sk {sk} causal {causal} heads {hq}/{hkv} blocks {bm}x{bn}: worst difference {worst:.1e}")


if __name__ == "__main__":
    _self_check()
