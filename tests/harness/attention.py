"""Attention for the graders (lab 08, and lab 09's decoder block): the float64 golden, PyTorch's same-dtype
attention (the flash-attention rule's yardstick), the layouts models hold q, k and v in, and where an element sits
in the kernels' tiles, said in words (harness.check's `locate`).

The golden is solutions/08-flash-attention/flash_model.py's reference (the lab's conventions: layout (batch, seqlen,
heads, head_dim), GQA head map, bottom-right causal, rows that see no key give o = 0 and lse = -inf), computed in
float64 on the inputs' device, in chunks of batch and heads so that a chunk's scores stay near 256 MiB. It is
loaded from the solutions tree, never from the graded one: a submission's copy is not the grader's reference.
"""
from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn.functional as F

from coursekit import trees

from .check import dtype_name

FP64 = torch.float64


def _load_model():
    lab = trees.find_lab("08")
    path = trees.SOLUTIONS / lab.name / "flash_model.py"
    spec = importlib.util.spec_from_file_location("course_lab08_flash_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses, pickling and tracebacks look modules up here
    spec.loader.exec_module(module)
    return module


MODEL = _load_model()


def blind_rows(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """How many leading query rows see no key: causal with seqlen_q > seqlen_k, or every row when seqlen_k = 0."""
    if seqlen_k == 0:
        return seqlen_q
    return min(max(seqlen_q - seqlen_k, 0), seqlen_q) if causal else 0


# ---------------------------------------------------------------- where an element sits: batch, head, row, blocks
def tiles(constants: dict, rung: str, head_dim: int):
    """(block_m, block_n) of a rung's kernel from the lab's constants(): keys like forward_block_m_d64
    (fp32_block_m for the float32 rung, with or without the _d suffix); None for the naive rung or when the lab
    does not say."""
    prefix = {"fp32": "fp32", "forward": "forward", "backward": "backward"}.get(rung)
    if prefix is None:
        return None
    found = []
    for axis in ("m", "n"):
        for key in (f"{prefix}_block_{axis}_d{head_dim}", f"{prefix}_block_{axis}"):
            if key in constants:
                found.append(int(constants[key]))
                break
    return tuple(found) if len(found) == 2 else None


def _unravel(flat: int, shape) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return list(reversed(index))


def _row_text(row: int, seqlen_q: int, seqlen_k: int, causal: bool, rung: str, tile) -> str:
    """What a query row sees and which of the kernel's blocks hold it."""
    end = MODEL.causal_key_end(row, seqlen_q, seqlen_k) if causal else seqlen_k
    sees = f"it sees keys 0 .. {end - 1}" if end > 0 else "it sees no key (o = 0, lse = -inf)"
    if tile is None:
        return sees
    block_m, block_n = tile
    qb = row // block_m
    last = f", the last in key block {(end - 1) // block_n}" if end > 0 else ""
    if rung == "backward":
        return (f"query block {qb} of the backward's {block_m}-row steps; {sees}{last} (key blocks of {block_n}: "
                f"dQ of this row collects from key blocks 0 .. {max(end - 1, -1) // block_n})")
    n_blocks, n_unmasked = MODEL.forward_key_blocks(qb, block_m, block_n, seqlen_q, seqlen_k, causal)
    masked = (f"masked per element from block {n_unmasked}" if n_unmasked < n_blocks else "none masked")
    walk = f"visits key blocks 0 .. {n_blocks - 1} of {block_n} keys, {masked}" if n_blocks else "visits no key block"
    return f"query block {qb} of {block_m} rows, which {walk}; {sees}{last}"


def locator(name: str, shape, *, seqlen_q: int, seqlen_k: int, heads_q: int, heads_kv: int, causal: bool, rung: str,
            tile=None):
    """flat index of `name` (o, lse, grad_q, grad_k, grad_v) -> 'batch b, head h, query row i (query block ..., key
    blocks ...), dim d': harness.check's `locate`. `tile`: a function giving the rung's (block_m, block_n) or None,
    called only when a failure is described."""
    group = heads_q // max(heads_kv, 1)

    def locate(flat: int) -> str:
        try:
            block = tile() if tile is not None else None
        except Exception:  # noqa: BLE001 - the where-text must never hide the failure it explains
            block = None
        index = _unravel(flat, shape)
        if name == "lse":
            b, h, i = index
            return f"batch {b}, head {h}, query row {i}: " + _row_text(i, seqlen_q, seqlen_k, causal, rung, block)
        if name in ("o", "grad_q"):
            b, i, h, d = index
            return (f"batch {b}, query row {i}, head {h}, dim {d}: "
                    + _row_text(i, seqlen_q, seqlen_k, causal, rung, block))
        b, j, g, d = index  # grad_k, grad_v
        text = (f"batch {b}, key {j}, key/value head {g} (query heads {g * group} .. {(g + 1) * group - 1}), "
                f"dim {d}")
        if block is not None:
            block_m, block_n = block
            kb = j // block_n
            first, n_blocks, first_unmasked = MODEL.backward_query_blocks(kb, block_m, block_n, seqlen_q, seqlen_k,
                                                                          causal)
            masked = (f"masked per element in blocks {first} .. {first_unmasked - 1}" if first_unmasked > first
                      else "none masked")
            text += (f": key block {kb} of {block_n} keys (one block of the backward), which walks query blocks "
                     f"{first} .. {n_blocks - 1} of {block_m} rows for each of the {group} query heads, {masked}")
        return text

    return locate


# ---------------------------------------------------------------- references
GOLDEN_SCORES = 2**25  # float64 scores per chunk of the golden (256 MiB; a few such tensors live at once)


def _golden_chunks(batch, heads_q, heads_kv, seqlen_q, seqlen_k):
    """(batch slice, key/value head slice, query head slice) pieces whose scores fit GOLDEN_SCORES."""
    group = heads_q // heads_kv
    per_batch = max(1, heads_q * seqlen_q * seqlen_k)
    if per_batch <= GOLDEN_SCORES:
        step = max(1, GOLDEN_SCORES // per_batch)
        for b in range(0, batch, step):
            yield slice(b, min(b + step, batch)), slice(0, heads_kv), slice(0, heads_q)
        return
    kv_step = max(1, GOLDEN_SCORES // max(1, group * seqlen_q * seqlen_k))
    for b in range(batch):
        for g in range(0, heads_kv, kv_step):
            g_end = min(g + kv_step, heads_kv)
            yield slice(b, b + 1), slice(g, g_end), slice(g * group, g_end * group)


def golden(q, k, v, causal, scale, grad_o=None, o=None) -> dict:
    """float64 results of flash_model's reference on the inputs' device, in chunks: o, lse, o_terms (the floor:
    sum_j p |v_j|); with grad_o: grad_q, grad_k, grad_v (D from `o` when given) and their terms' sizes."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    out = {"o": torch.zeros(q.shape, dtype=FP64, device=q.device),
           "lse": torch.full((batch, heads_q, seqlen_q), float("-inf"), dtype=FP64, device=q.device),
           "o_terms": torch.zeros(q.shape, dtype=FP64, device=q.device)}
    if grad_o is not None:
        for name, like in (("grad_q", q), ("grad_k", k), ("grad_v", v)):
            out[name] = torch.zeros(like.shape, dtype=FP64, device=q.device)
            out[name + "_terms"] = torch.zeros(like.shape, dtype=FP64, device=q.device)
    if q.numel() == 0 or k.numel() == 0:
        return out
    for bs, kvs, qs in _golden_chunks(batch, heads_q, heads_kv, seqlen_q, seqlen_k):
        qc, kc, vc = q[bs, :, qs], k[bs, :, kvs], v[bs, :, kvs]
        o64, lse64 = MODEL.reference_forward(qc, kc, vc, causal, scale)
        out["o"][bs, :, qs], out["lse"][bs, qs] = o64, lse64
        gc = grad_o[bs, :, qs] if grad_o is not None else None
        sizes = MODEL.reference_term_sizes(gc, qc, kc, vc, causal, scale)
        out["o_terms"][bs, :, qs] = sizes["o"]
        if grad_o is not None:
            grads = MODEL.reference_backward(gc, qc, kc, vc, causal, scale, o=None if o is None else o[bs, :, qs])
            for name, value, index in zip(("grad_q", "grad_k", "grad_v"), grads, (qs, kvs, kvs)):
                out[name][bs, :, index] = value
                out[name + "_terms"][bs, :, index] = sizes[name]
    return out


def _sdpa_backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def same_dtype_attention(q, k, v, causal, scale):
    """PyTorch's attention in q's dtype, differentiable: F.scaled_dot_product_attention (EFFICIENT_ATTENTION, or
    MATH where it does not apply) over the rows that see a key, with the bottom-right mask built explicitly and K, V
    repeated per query head (GQA); the rows that see no key are 0 (the convention, whatever a backend gives)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, group = k.shape[1], heads_q // k.shape[2]
    blind = blind_rows(seqlen_q, seqlen_k, causal)
    if blind == seqlen_q or q.numel() == 0:
        return q * 0
    scale = MODEL.default_scale(head_dim, scale)
    qh = q[:, blind:].transpose(1, 2)
    kh = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
    mask = MODEL.visible(seqlen_q - blind, seqlen_k, True, q.device) if causal else None
    with _sdpa_backends():
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale).transpose(1, 2)
    if blind:
        out = torch.cat([q[:, :blind] * 0, out], dim=1)
    return out


def same_dtype_backward(grad_o, q, k, v, causal, scale):
    """PyTorch's gradients in the inputs' dtype, through same_dtype_attention: the flash rule's yardstick."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = same_dtype_attention(*leaves, causal, scale)
    return torch.autograd.grad(out, leaves, grad_o, allow_unused=True)


def randn(shape, dtype, device="cuda"):
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


LAYOUTS = ("contiguous", "packed-qkv", "seq-first", "padded")


def make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout="contiguous"):
    """q, k, v in one of the layouts models hold them in:
      contiguous  three tensors (B, S, H, D);
      packed-qkv  slices of one projection output: (B, S, 3, H, D) (heads_q = heads_kv) or (B, S, Hq + 2 Hkv, D)
                  (GQA), so seq stride 3 H D (or (Hq + 2 Hkv) D); needs seqlen_q = seqlen_k;
      seq-first   (S, B, H, D) storage, transposed: batch stride H D, seq stride B H D;
      padded      a window of a longer, wider buffer: (B, S + 7, H + 1, D)[:, 3:3 + S, 1:]: every stride non-trivial
                  and a storage offset (16-byte aligned for D a multiple of 8)."""
    if layout == "contiguous":
        return (randn((batch, seqlen_q, heads_q, head_dim), dtype), randn((batch, seqlen_k, heads_kv, head_dim), dtype),
                randn((batch, seqlen_k, heads_kv, head_dim), dtype))
    if layout == "packed-qkv":
        assert seqlen_q == seqlen_k, "a packed QKV projection has one sequence length"
        if heads_q == heads_kv:
            qkv = randn((batch, seqlen_q, 3, heads_q, head_dim), dtype)
            return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        qkv = randn((batch, seqlen_q, heads_q + 2 * heads_kv, head_dim), dtype)
        return qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_kv], qkv[:, :, heads_q + heads_kv:]
    if layout == "seq-first":
        return tuple(randn((s, batch, h, head_dim), dtype).transpose(0, 1)
                     for s, h in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv)))
    if layout == "padded":
        return tuple(randn((batch, s + 7, h + 1, head_dim), dtype)[:, 3:3 + s, 1:]
                     for s, h in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv)))
    raise ValueError(layout)


def describe(q, k, *, causal, scale=None, layout="contiguous") -> str:
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    text = (f"q {list(q.shape)} k/v {list(k.shape)} {dtype_name(q.dtype)}, seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, "
            f"{'causal (bottom-right)' if causal else 'not causal'}")
    if heads_q != heads_kv:
        text += f", GQA {heads_q} query heads on {heads_kv} key/value heads"
    if scale is not None:
        text += f", scale {scale:g}"
    if layout != "contiguous":
        text += f", {layout} views (q strides {list(q.stride())})"
    return text
