"""A CPU model of lab 08's Hopper backward (solutions/08-flash-attention/flash_backward_hopper.cu): its data path
replayed element by element, in float64, against a float64 attention backward.

    .venv/bin/./course run tools/gpu/lab08_hopper_bwd_model.py        # a few seconds; exit status 1 on a mismatch

What is modelled, and from where (nothing here ran on a GPU):
  - shared memory as an array of 16-bit slots indexed by byte address / 2, from the kernel's own 1024-aligned carve-up;
  - TMA's 128-byte swizzle as the XOR of address bits 4-6 with bits 7-9 (CU_TENSOR_MAP_SWIZZLE_128B on a
    1024-aligned box of 128-byte rows), boxes of 64 head dims x box rows, rows past seqlen as zeros;
  - the wgmma matrix descriptor as the kernel encodes it (hopper::tile_descriptor, hopper::mn_major_descriptor:
    address, leading and stride byte offsets, swizzle mode), decoded back, and read through the PTX ISA's
    canonical 128-byte-swizzled layouts: K-major (mn, k) at (mn % 8) 128 + (mn / 8) SBO + 2 k; MN-major (mn, k) at
    2 (mn % 64) + (mn / 64) LBO + (k % 8) 128 + (k / 8) SBO; the swizzle applied to the whole address. The forward
    (correct on an H100) uses the same two descriptors for Q, K (K-major) and V (MN-major, N 64 and 128), so
    check_forward_operands replays those too: the model of the hardware is held to the kernel that is known to work;
  - the accumulator fragment of wgmma m64nNk16 (warp w of the warpgroup: rows 16 w + lane / 4 (+ 8), register
    4 n + r at column 8 n + 2 (lane % 4) + r % 2) and the RS A fragment (register j: row + 8 (j % 2), columns
    2 (lane % 4) + 8 (j / 2) + {0, 1}), the PTX ISA's figures;
  - the consumer code itself: P^T, the mask, dS^T, the packing into A fragments, the dS^T stores with their XOR,
    dV, dK, dQ through the descriptors, the dQ reductions and the dK, dV stores at the kernel's addresses.
It also checks that every dS^T slot the dQ product reads was written in the same step (and, at head_dim 64 where
only a warpgroup barrier hands it over, by the same warpgroup), that no slot is written twice, and that each
dS^T store instruction of a warp touches 32 distinct banks.

Not modelled: timing (the mbarrier ring: its parities are the forward's, graded by lab08.11's simulation), the
register pressure, rounding to 16 bits (everything is float64 here, so a layout slip shows as an O(1) error).
"""
from __future__ import annotations

import itertools

import numpy as np

# The kernel's constants (flash_backward_hopper.cu).
WG = 128  # threads a warpgroup
CONSUMERS = 2
WGMMA_M = 64
BLOCK_N = CONSUMERS * WGMMA_M  # keys a block
BLOCK_M = 64  # queries a step
WGMMA_K = 16
STAGES = 2
ELEM = 2
BOX_COLS = 64
SWIZZLE_BYTES = BOX_COLS * ELEM  # 128
ATOM = 8 * SWIZZLE_BYTES  # 1024
CHUNK = 16
LOG2E = 1.4426950408889634
# A deliberate slip in the replayed kernel code (main() runs each: the model must catch it), None for the kernel as is.
MUTANT: str | None = None
MUTANTS = {
    "ds_store_without_xor": "the dS^T stores at chunk c instead of c ^ (row % 8)",
    "ds_read_k_major": "dQ's A read K-major (imm-trans-a 0) from dS^T",
    "k_mn_lbo_sbo_swapped": "K_j's MN-major descriptor for dQ with LBO and SBO exchanged",
    "a_fragment_rows_cols": "P^T packed as (s[8 kk + r], s[8 kk + r + 4]) instead of the A fragment's pairs",
    "lse_of_key_row": "P^T's L taken by the key row instead of the query column",
    "dq_rows_without_8h": "the dQ reductions of register pair h at row group_row, not group_row + 8 h",
}


def swizzle128(address):
    """TMA's and wgmma's 128-byte swizzle: the 16-byte chunk (bits 4-6) XOR the row in the 1024-byte atom (7-9)."""
    return address ^ (((address >> 7) & 7) << 4)


# ---------------------------------------------------------------- descriptors, as the kernel encodes them
def tile_descriptor(address: int) -> int:  # wgmma.cuh: K-major, LBO 16 (unused), SBO 1024, 128-byte swizzle
    return ((address & 0x3FFFF) >> 4) | ((16 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)


def mn_major_descriptor(address: int, box_bytes: int) -> int:  # hopper_attention.cuh
    return ((address & 0x3FFFF) >> 4) | (((box_bytes >> 4) & 0x3FFF) << 16) | ((1024 >> 4) << 32) | (1 << 62)


def decode(descriptor: int):
    start = (descriptor & 0x3FFF) << 4
    lbo = ((descriptor >> 16) & 0x3FFF) << 4
    sbo = ((descriptor >> 32) & 0x3FFF) << 4
    mode = descriptor >> 62
    assert mode == 1, "the model knows the 128-byte swizzle only"
    return start, lbo, sbo


def operand_addresses(descriptor: int, extent: int, major: str) -> np.ndarray:
    """Byte addresses [extent (M or N), 16 (K)] a wgmma reads for its operand, per the PTX ISA's canonical layouts."""
    start, lbo, sbo = decode(descriptor)
    mn = np.arange(extent)[:, None]
    k = np.arange(WGMMA_K)[None, :]
    if major == "K":
        offset = (mn % 8) * SWIZZLE_BYTES + (mn // 8) * sbo + ELEM * k
    else:
        offset = ELEM * (mn % 64) + (mn // 64) * lbo + (k % 8) * SWIZZLE_BYTES + (k // 8) * sbo
    return swizzle128(start + offset)


def read_operand(smem, descriptor, extent, major, readers=None):
    addresses = operand_addresses(descriptor, extent, major)
    assert np.all(addresses % ELEM == 0)
    if readers is not None:
        readers.append(addresses)
    slots = addresses // ELEM
    inside = slots < smem.size  # a read past the block's shared memory: NaN, so that it shows
    return np.where(inside, smem[np.minimum(slots, smem.size - 1)], np.nan)


def tma_box(smem, destination: int, rows: np.ndarray):
    """A box of rows x 64 16-bit values into shared memory at `destination` (1024-aligned), 128-byte swizzled."""
    assert destination % ATOM == 0 and rows.shape[1] == BOX_COLS
    r = np.arange(rows.shape[0])[:, None]
    c = np.arange(BOX_COLS)[None, :]
    smem[swizzle128(destination + r * SWIZZLE_BYTES + ELEM * c) // ELEM] = rows


# ---------------------------------------------------------------- fragments (PTX ISA, wgmma m64nNk16)
def accumulator_coords(n: int):
    """(row, col) of register i of warpgroup thread t in a 64 x n fp32 accumulator: arrays [128, n / 2]."""
    t = np.arange(WG)[:, None]
    i = np.arange(n // 2)[None, :]
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * ((i % 4) // 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return row, col


def a_fragment_matrix(registers: np.ndarray) -> np.ndarray:
    """The 64 x 16 A operand held as registers[t, j, e] (register j of thread t, its 16-bit half e)."""
    t = np.arange(WG)[:, None, None]
    j = np.arange(4)[None, :, None]
    e = np.arange(2)[None, None, :]
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * (j % 2)
    col = 2 * (lane % 4) + 8 * (j // 2) + e
    a = np.full((WGMMA_M, WGMMA_K), np.nan)
    row, col = np.broadcast_arrays(row, col)
    a[row, col] = registers
    assert not np.isnan(a).any()
    return a


def scatter(values: np.ndarray, n: int) -> np.ndarray:
    """A 64 x n matrix as the warpgroup's accumulator registers [128, n / 2]."""
    row, col = accumulator_coords(n)
    return values[row, col]


# ---------------------------------------------------------------- reference
def reference(q, k, v, do, causal, scale):
    batch, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kk = np.repeat(k, group, axis=2)
    vv = np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)
    lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(np.where(total[..., 0] > 0, total[..., 0], 1)), -np.inf)
    o = np.einsum("bhqk,bkhd->bqhd", p, vv)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
    delta = np.einsum("bqhd,bqhd->bhq", do, o)
    ds = p * (dp - delta[..., None])
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dk = dk.reshape(batch, sk, hkv, group, d).sum(3)
    dv = dv.reshape(batch, sk, hkv, group, d).sum(3)
    return o, lse, dq, dk, dv


# ---------------------------------------------------------------- the kernel, replayed
class Layout:
    def __init__(self, d: int):
        self.d, self.boxes = d, d // BOX_COLS
        self.q_box = BLOCK_M * SWIZZLE_BYTES
        self.kv_box = BLOCK_N * SWIZZLE_BYTES
        self.q_bytes = self.boxes * self.q_box
        self.kv_bytes = self.boxes * self.kv_box
        self.ds_bytes = BLOCK_N * BLOCK_M * ELEM
        base = 3 * ATOM  # any 1024-aligned base: the kernel rounds its dynamic shared memory up to one
        self.k_tile = base
        self.v_tile = self.k_tile + self.kv_bytes
        self.q_tiles = self.v_tile + self.kv_bytes
        self.do_tiles = self.q_tiles + STAGES * self.q_bytes
        self.ds_tiles = self.do_tiles + STAGES * self.q_bytes
        self.end = self.ds_tiles + 2 * self.ds_bytes
        self.dq_splits_keys = d == 64
        self.dq_steps = (WGMMA_M if self.dq_splits_keys else BLOCK_N) // WGMMA_K


def run_block(lay: Layout, g, out, key_block, b, kv_head, failures):
    """One block of the main kernel (both consumer warpgroups), TMA and products replayed."""
    q, k, v, do, lse_log2, delta, scale, causal = (g[x] for x in ("q", "k", "v", "do", "lse_log2", "delta", "scale",
                                                                    "causal"))
    d = lay.d
    _, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale_log2 = scale * LOG2E
    smem = np.full(lay.end // ELEM, np.nan)
    writer = np.full(lay.end // ELEM, -1)  # which consumer wrote a dS^T slot in this step
    key0 = key_block * BLOCK_N
    group = hq // hkv
    head0 = kv_head * group
    query_blocks = -(-sq // BLOCK_M)
    first_query_block = max(0, key0 + sq - sk) // BLOCK_M if causal else 0
    steps_per_head = query_blocks - first_query_block
    assert steps_per_head >= 1

    def rows_of(t, first, count, head):  # a TMA box's rows: zeros past the tensor's end
        block = np.zeros((count, d))
        n = max(0, min(count, t.shape[1] - first))
        block[:n] = t[b, first:first + n, head]
        return block

    kr = rows_of(k, key0, BLOCK_N, kv_head)
    vr = rows_of(v, key0, BLOCK_N, kv_head)
    for box in range(lay.boxes):
        tma_box(smem, lay.k_tile + box * lay.kv_box, kr[:, 64 * box:64 * box + 64])
        tma_box(smem, lay.v_tile + box * lay.kv_box, vr[:, 64 * box:64 * box + 64])

    acc = d // 2
    dk = np.zeros((CONSUMERS, WG, acc))
    dv = np.zeros((CONSUMERS, WG, acc))
    t_ = np.arange(WG)[:, None]
    warp, lane = t_ // 32, t_ % 32
    group_row, pair_col = lane // 4, 2 * (lane % 4)
    key_end = min(sk - key0, BLOCK_N)

    for step in range(group * steps_per_head):
        stage = step % STAGES
        head = head0 + step // steps_per_head
        query0 = (first_query_block + step % steps_per_head) * BLOCK_M
        qr = rows_of(q, query0, BLOCK_M, head)
        dor = rows_of(do, query0, BLOCK_M, head)
        for box in range(lay.boxes):
            tma_box(smem, lay.q_tiles + stage * lay.q_bytes + box * lay.q_box, qr[:, 64 * box:64 * box + 64])
            tma_box(smem, lay.do_tiles + stage * lay.q_bytes + box * lay.q_box, dor[:, 64 * box:64 * box + 64])
        row = (b * hq + head) * g["rows"] + query0
        lse_row = lse_log2.reshape(-1)[row:row + BLOCK_M]
        delta_row = delta.reshape(-1)[row:row + BLOCK_M]
        q_tile = lay.q_tiles + stage * lay.q_bytes
        do_tile = lay.do_tiles + stage * lay.q_bytes
        ds_tile = lay.ds_tiles + (step & 1) * lay.ds_bytes
        # the buffer about to be rewritten: poison it, so that a read of a slot this step did not write shows
        smem[ds_tile // ELEM:(ds_tile + lay.ds_bytes) // ELEM] = np.nan
        writer[ds_tile // ELEM:(ds_tile + lay.ds_bytes) // ELEM] = -1
        query_end = min(sq - query0, BLOCK_M)
        diagonal = max(min(sk - sq - key0 + query0, BLOCK_N), -BLOCK_M) if causal else BLOCK_N
        masked = key_end < BLOCK_N or query_end < BLOCK_M or diagonal < BLOCK_N - 1
        for consumer in range(CONSUMERS):
            warp_key = consumer * WGMMA_M + warp * 16

            def kv_rows_descriptor(tile, kk, consumer=consumer):
                return tile_descriptor(tile + (kk // 4) * lay.kv_box + consumer * WGMMA_M * SWIZZLE_BYTES
                                       + (kk % 4) * WGMMA_K * ELEM)

            def step_rows_descriptor(tile, kk):
                return tile_descriptor(tile + (kk // 4) * lay.q_box + (kk % 4) * WGMMA_K * ELEM)

            s_mat = np.zeros((WGMMA_M, BLOCK_M))
            dp_mat = np.zeros((WGMMA_M, BLOCK_M))
            for kk in range(d // WGMMA_K):
                s_mat += read_operand(smem, kv_rows_descriptor(lay.k_tile, kk), WGMMA_M, "K") @ read_operand(
                    smem, step_rows_descriptor(q_tile, kk), BLOCK_M, "K").T
                dp_mat += read_operand(smem, kv_rows_descriptor(lay.v_tile, kk), WGMMA_M, "K") @ read_operand(
                    smem, step_rows_descriptor(do_tile, kk), BLOCK_M, "K").T
            s = scatter(s_mat, BLOCK_M)
            dp = scatter(dp_mat, BLOCK_M)
            # P^T = exp2(S^T scale log2(e) - L log2(e)), L of column 8 n + pair_col + r % 2
            i = np.arange(BLOCK_M // 2)[None, :]
            n, r = i // 4, i % 4
            col = 8 * n + pair_col + r % 2
            lse_at = lse_row[col]
            if MUTANT == "lse_of_key_row":
                lse_at = lse_row[(group_row + 8 * (r // 2) + 16 * warp) % BLOCK_M]
            with np.errstate(over="ignore", invalid="ignore"):
                s = np.exp2(s * scale_log2 - lse_at)
            if masked:
                key_r = warp_key + group_row + 8 * (r // 2)
                visible = (key_r < key_end) & (col < query_end) & (key_r - col <= diagonal)
                s = np.where(visible, s, 0.0)
            dp = s * (dp - delta_row[col])
            # pack: prob[kk][r] = (s[8 kk + 2 r], s[8 kk + 2 r + 1])
            prob = np.stack([s[:, 8 * kk:8 * kk + 8].reshape(WG, 4, 2) for kk in range(BLOCK_M // 16)], 1)
            if MUTANT == "a_fragment_rows_cols":
                prob = np.stack([s[:, 8 * kk:8 * kk + 8].reshape(WG, 2, 4).transpose(0, 2, 1)
                                 for kk in range(BLOCK_M // 16)], 1)
            grad_s = np.stack([dp[:, 8 * kk:8 * kk + 8].reshape(WG, 4, 2) for kk in range(BLOCK_M // 16)], 1)
            # the dS^T stores: 4-byte words (two 16-bit values) at the kernel's swizzled addresses
            for kk in range(BLOCK_M // 16):
                for ii in range(4):
                    key_row = warp_key + group_row + 8 * (ii % 2)
                    chunk = 2 * kk + ii // 2
                    swizzled = chunk if MUTANT == "ds_store_without_xor" else chunk ^ group_row
                    address = ds_tile + key_row * SWIZZLE_BYTES + swizzled * CHUNK + (lane % 4) * 4
                    address = address[:, 0]
                    for w in range(4):  # one store instruction of warp w: 32 distinct banks?
                        banks = (address[32 * w:32 * w + 32] // 4) % 32
                        if len(set(banks.tolist())) != 32:
                            failures.append(f"dS^T store kk {kk} i {ii} warp {w}: bank conflict")
                    for e in range(2):
                        slot = address // ELEM + e
                        if np.any(writer[slot] != -1):
                            failures.append("a dS^T slot written twice in one step")
                        smem[slot] = grad_s[:, kk, ii, e]
                        writer[slot] = consumer
            for kk in range(BLOCK_M // WGMMA_K):
                bd = mn_major_descriptor(do_tile + kk * WGMMA_K * SWIZZLE_BYTES, lay.q_box)
                bq = mn_major_descriptor(q_tile + kk * WGMMA_K * SWIZZLE_BYTES, lay.q_box)
                dv[consumer] += scatter(a_fragment_matrix(prob[:, kk]) @ read_operand(smem, bd, d, "MN").T, d)
                dk[consumer] += scatter(a_fragment_matrix(grad_s[:, kk]) @ read_operand(smem, bq, d, "MN").T, d)
        # past the barrier: dQ (+)= dS K_j, A = dS^T MN-major (imm-trans-a), B = K_j MN-major (imm-trans-b)
        for consumer in range(CONSUMERS):
            dq_col0 = 0 if lay.dq_splits_keys else consumer * BOX_COLS
            dq_key0 = consumer * WGMMA_M if lay.dq_splits_keys else 0
            dq_mat = np.zeros((BLOCK_M, 64))
            readers = []
            for kk in range(lay.dq_steps):
                ad = mn_major_descriptor(ds_tile + (dq_key0 + kk * WGMMA_K) * SWIZZLE_BYTES, lay.ds_bytes)
                b_address = lay.k_tile + (dq_col0 // BOX_COLS) * lay.kv_box + (dq_key0 + kk * WGMMA_K) * SWIZZLE_BYTES
                bd = mn_major_descriptor(b_address, lay.kv_box)
                if MUTANT == "ds_read_k_major":
                    a_major, ad = "K", tile_descriptor(ds_tile + (dq_key0 + kk * WGMMA_K) * SWIZZLE_BYTES)
                else:
                    a_major = "MN"
                if MUTANT == "k_mn_lbo_sbo_swapped":
                    bd = (bd & ~((0x3FFF << 16) | (0x3FFF << 32))) | ((1024 >> 4) << 16) | ((lay.kv_box >> 4) << 32)
                dq_mat += read_operand(smem, ad, BLOCK_M, a_major, readers) @ read_operand(smem, bd, 64, "MN").T
            slots = np.minimum(np.concatenate([a.reshape(-1) for a in readers]) // ELEM, writer.size - 1)
            if np.any(writer[slots] == -1):
                failures.append(f"dQ reads a dS^T slot not written this step (consumer {consumer})")
            if lay.dq_splits_keys and np.any(writer[slots] != consumer):
                failures.append("head_dim 64: dQ reads the other warpgroup's dS^T (only a warpgroup barrier)")
            dq = scatter(dq_mat, 64)
            # the reductions: accum_base + query0 row_stride + head D + query row_stride + 8 n (+ 0, 1)
            row_stride = hq * d
            flat = out["dq_accum"].reshape(-1)
            for h in range(2):
                query = (warp * 16 + group_row + (0 if MUTANT == "dq_rows_without_8h" else 8) * h)[:, 0]
                ok = query < query_end
                for n8 in range(8):
                    at = (b * sq * hq * d + dq_col0 + pair_col[:, 0] + query0 * row_stride + head * d
                          + query * row_stride + 8 * n8)
                    np.add.at(flat, at[ok], dq[ok, 4 * n8 + 2 * h])
                    np.add.at(flat, at[ok] + 1, dq[ok, 4 * n8 + 2 * h + 1])
    # the dK, dV stores
    gk = out["dk"].reshape(-1)
    gv = out["dv"].reshape(-1)
    for consumer in range(CONSUMERS):
        warp_key = consumer * WGMMA_M + warp[:, 0] * 16
        for h in range(2):
            key = warp_key + group_row[:, 0] + 8 * h
            ok = key < key_end
            offset = ((b * sk + key0 + key) * hkv + kv_head) * d + pair_col[:, 0]
            for n8 in range(d // 8):
                for e in range(2):
                    gk[offset[ok] + 8 * n8 + e] = scale * dk[consumer][ok, 4 * n8 + 2 * h + e]
                    gv[offset[ok] + 8 * n8 + e] = dv[consumer][ok, 4 * n8 + 2 * h + e]


def run_case(batch, sq, sk, hq, hkv, d, causal, scale, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, sq, hq, d))
    k = rng.standard_normal((batch, sk, hkv, d))
    v = rng.standard_normal((batch, sk, hkv, d))
    do = rng.standard_normal((batch, sq, hq, d))
    scale = scale if scale is not None else 1 / np.sqrt(d)
    o, lse, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, causal, scale)
    # the preprocess: D = rowsum(dO O), L log2(e) (+inf where L = -inf), padded rows (+inf, 0)
    rows = -(-sq // BLOCK_M) * BLOCK_M
    lse_log2 = np.full((batch, hq, rows), np.inf)
    delta = np.zeros((batch, hq, rows))
    lse_log2[:, :, :sq] = np.where(lse == -np.inf, np.inf, lse * LOG2E)
    delta[:, :, :sq] = np.einsum("bqhd,bqhd->bhq", do, o)
    g = dict(q=q, k=k, v=v, do=do, lse_log2=lse_log2, delta=delta, scale=scale, causal=causal, rows=rows)
    out = dict(dq_accum=np.zeros_like(q), dk=np.full_like(k, np.nan), dv=np.full_like(v, np.nan))
    lay = Layout(d)
    failures: list[str] = []
    for key_block, b, kv_head in itertools.product(range(-(-sk // BLOCK_N)), range(batch), range(hkv)):
        run_block(lay, g, out, key_block, b, kv_head, failures)
    dq = scale * out["dq_accum"]
    name = f"(B {batch}, Sq {sq}, Sk {sk}, Hq {hq}, Hkv {hkv}, d {d}, {'causal' if causal else 'full'})"
    for what, got, want in (("dq", dq, dq_ref), ("dk", out["dk"], dk_ref), ("dv", out["dv"], dv_ref)):
        err = np.nanmax(np.abs(got - want)) if not np.isnan(got).any() else np.inf
        if not err <= 1e-9 * max(1.0, np.abs(want).max()):
            failures.append(f"{what}: max |error| {err:.3g} (max |ref| {np.abs(want).max():.3g})")
    return name, sorted(set(failures))


def check_forward_operands() -> list[str]:
    """The forward's descriptors (flash_forward_hopper.cu, correct on an H100) through the same model of the
    hardware: Q K^T with both K-major, P V with V MN-major at N = head_dim (two 64-column boxes at 128)."""
    failures = []
    rng = np.random.default_rng(1)
    for d in (64, 128):
        boxes, q_box, kv_box = d // 64, 128 * SWIZZLE_BYTES, 128 * SWIZZLE_BYTES
        q_tile, k_tile = ATOM, ATOM + boxes * q_box
        v_tile = k_tile + boxes * kv_box
        smem = np.full((v_tile + boxes * kv_box) // ELEM, np.nan)
        q, k, v = (rng.standard_normal((128, d)) for _ in range(3))
        for box in range(boxes):
            tma_box(smem, q_tile + box * q_box, q[:, 64 * box:64 * box + 64])
            tma_box(smem, k_tile + box * kv_box, k[:, 64 * box:64 * box + 64])
            tma_box(smem, v_tile + box * kv_box, v[:, 64 * box:64 * box + 64])
        for consumer in range(2):
            s = np.zeros((64, 128))
            for kk in range(d // 16):
                a = tile_descriptor(q_tile + (kk // 4) * q_box + consumer * 64 * SWIZZLE_BYTES + (kk % 4) * 32)
                bd = tile_descriptor(k_tile + (kk // 4) * kv_box + (kk % 4) * 32)
                s += read_operand(smem, a, 64, "K") @ read_operand(smem, bd, 128, "K").T
            if not np.allclose(s, q[64 * consumer:64 * consumer + 64] @ k.T):
                failures.append(f"forward d {d}: S = Q K^T through the model differs")
        p = rng.standard_normal((64, 128))
        o = np.zeros((64, d))
        for kk in range(128 // 16):
            bd = mn_major_descriptor(v_tile + kk * 16 * SWIZZLE_BYTES, kv_box)
            o += p[:, 16 * kk:16 * kk + 16] @ read_operand(smem, bd, d, "MN").T
        if not np.allclose(o, p @ v):
            failures.append(f"forward d {d}: O = P V through the model differs")
    return failures


CASES = [  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, scale)
    (1, 64, 128, 2, 2, 64, False, None),
    (1, 64, 128, 2, 2, 128, False, None),
    (1, 113, 203, 4, 2, 64, True, None),
    (1, 113, 203, 4, 2, 128, True, None),
    (1, 203, 113, 2, 1, 64, True, 0.3),
    (1, 203, 113, 2, 1, 128, True, 0.3),
    (2, 130, 130, 3, 3, 128, False, None),
    (1, 1, 1, 1, 1, 64, True, None),
    (1, 300, 70, 1, 1, 128, True, None),  # causal: rows that see no key (L = -inf)
]


def main() -> int:
    failures = 0
    for message in check_forward_operands():
        print("FAIL", message)
        failures += 1
    print(f"{'ok  ' if not failures else 'FAIL'} the forward's operands (Q K^T, P V at d 64 and 128) through the model")
    for case in CASES:
        name, problems = run_case(*case)
        failures += bool(problems)
        print(f"{'ok  ' if not problems else 'FAIL'} {name}" + "".join(f"\n       {p}" for p in problems))
    # The model must catch each slip: each mutant of the replayed kernel code has to fail one of two cases.
    global MUTANT
    for MUTANT, what in MUTANTS.items():
        caught = any(run_case(*case)[1] for case in (CASES[3], CASES[4]))
        failures += not caught
        print(f"{'ok  ' if caught else 'FAIL'} the model catches: {what}")
    MUTANT = None
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
