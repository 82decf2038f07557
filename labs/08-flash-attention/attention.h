// Lab skeleton generated from solutions/08-flash-attention/attention.h by `./course labs` [lab-hash 55cb15e11b56].
// Students: fill in the TODO(lab08.k) blocks, then run `./course grade 08`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lab 08's kernel launchers: plain pointers, sizes, strides and a stream, no torch types, so the
// kernel files compile without torch headers and wrapper.cpp is the only bridge.
//
// The ladder, one file a rung:
//   naive.cu          rung 1: S = scale Q K^T, written to HBM; softmax; O = P V. The memory baseline.
//   flash_fp32.cu     rung 2: flash attention forward on CUDA cores, float32: S never leaves the chip.
//   flash_forward.cu  rung 3: the same on tensor cores (mma.sync, float16/bfloat16), FlashAttention-2's
//                     work split: each warp owns 16 query rows, K/V tiles stream through shared memory.
//   flash_backward.cu rung 4: dQ, dK, dV on tensor cores, P recomputed from Q, K and the saved L.
//
// Layout, as models hold it: q is (batch, seqlen_q, heads_q, head_dim), k and v are
// (batch, seqlen_k, heads_kv, head_dim), each with any strides except a contiguous last dimension
// (q, k and v may be slices of one packed QKV projection: no hidden .contiguous() copy). Outputs are
// contiguous: o (batch, seqlen_q, heads_q, head_dim), lse (batch, heads_q, seqlen_q) float32.
// Grouped-query attention: heads_q % heads_kv == 0, and query head h reads key/value head
// h / (heads_q / heads_kv), as F.scaled_dot_product_attention(..., enable_gqa=True) does.
// Every offset is int64: batch * seqlen * heads * head_dim may pass 2^31.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

enum class ElementType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// The head dimensions the flash kernels are instantiated for (the naive rung takes any).
constexpr int kHeadDimSmall = 64, kHeadDimLarge = 128;

// Element strides of a (batch, seqlen, heads, head_dim) view; the head_dim stride is 1.
struct Strides {
  int64_t batch, seq, head;
};

// --8<-- [start:params]
struct AttentionParams {
  const void* q;  // (batch, seqlen_q, heads_q, head_dim), q_strides
  const void* k;  // (batch, seqlen_k, heads_kv, head_dim), k_strides
  const void* v;  // (batch, seqlen_k, heads_kv, head_dim), v_strides
  void* o;        // (batch, seqlen_q, heads_q, head_dim), contiguous
  float* lse;     // (batch, heads_q, seqlen_q), contiguous: L = log(sum_j exp(scale * q . k_j)), natural log
  Strides q_strides, k_strides, v_strides;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  float scale;  // the softmax scale, 1 / sqrt(head_dim) unless the caller says otherwise
  bool causal;  // bottom-right aligned: see causal_key_end
};

// The backward's inputs: the forward's (o and lse as the forward wrote them) and grad_o; its
// outputs grad_q (like q), grad_k and grad_v (like k and v), all contiguous.
struct AttentionBackwardParams {
  AttentionParams forward;  // q, k, v, o, lse, shape, scale, causal; o is read, not written
  const void* grad_o;       // (batch, seqlen_q, heads_q, head_dim), contiguous
  void* grad_q;             // (batch, seqlen_q, heads_q, head_dim), contiguous
  void* grad_k;             // (batch, seqlen_k, heads_kv, head_dim), contiguous
  void* grad_v;             // (batch, seqlen_k, heads_kv, head_dim), contiguous
  float* delta;             // workspace (batch, heads_q, seqlen_q): D = rowsum(grad_o * o)
  float* grad_q_accum;      // workspace (batch, seqlen_q, heads_q, head_dim) float32, zeroed by the launcher
                            // (unused, may be null, when deterministic)
  bool deterministic;       // dQ by a second pass over the key blocks instead of float32 atomics:
                            // bitwise reproducible run to run, ~40% more FLOPs (flash_backward.cu)
};
// --8<-- [end:params]

// --8<-- [start:causal]
// Causal masking, bottom-right aligned (FlashAttention's convention): the last query row sees
// every key, so query i sees keys j <= i + (seqlen_k - seqlen_q). With seqlen_q == seqlen_k this
// is the usual lower triangle and equals PyTorch's is_causal=True; with seqlen_q < seqlen_k (a
// chunk of new queries against a longer KV cache) each query also sees the whole past. PyTorch's
// is_causal aligns top-left instead (query i sees j <= i): the two differ only when the lengths do.
// With seqlen_q > seqlen_k the first seqlen_q - seqlen_k rows see no key at all: their output is
// 0 and their L is -inf (log of an empty sum), never NaN.
// Returns one past the last key query row `query` may see (<= 0: none).
__host__ __device__ inline int64_t causal_key_end(int64_t query, int64_t seqlen_q, int64_t seqlen_k) {
  const int64_t end = query + 1 + (seqlen_k - seqlen_q);
  return end < seqlen_k ? end : seqlen_k;
}
// --8<-- [end:causal]

// Rung 1. o and lse as above; scores is a (batch, heads_q, seqlen_q, seqlen_k) float32 workspace
// the caller allocates: the N x N matrix this whole lesson is about not writing. Any head_dim;
// float32, float16 or bfloat16 in, float32 arithmetic.
void launch_attention_naive(ElementType type, const AttentionParams& params, float* scores, cudaStream_t stream);

// Rung 2. float32 only, head_dim 64 or 128.
void launch_flash_forward_fp32(const AttentionParams& params, cudaStream_t stream);

// Rung 2's tiles, for the grader and the page: block_m query rows per block, block_n keys per
// step, warps per block, dynamic shared memory per block. head_dim 64 or 128.
struct FlashFp32Tiles {
  int block_m, block_n, warps, shared_bytes;
};
FlashFp32Tiles flash_fp32_tiles(int head_dim);

// Rung 3. float16 or bfloat16, head_dim 64 or 128, compute capability 8.0 or newer (mma.m16n8k16,
// cp.async); the wrapper checks. Base pointers 16-byte aligned and the batch, seq and head strides
// multiples of 8 elements (but those of a dimension of size 1), so that every 16-byte row chunk is one
// cp.async; the launcher checks and throws std::invalid_argument otherwise, and for a scale <= 0.
void launch_flash_forward(ElementType type, const AttentionParams& params, cudaStream_t stream);

// Rung 3's tiles, for the grader and the page: block_m query rows a block (16 a warp), block_n keys
// a key block, warps a block, stages of the K/V ring, dynamic shared memory a block. head_dim 64 or 128.
struct FlashForwardTiles {
  int block_m, block_n, warps, stages, shared_bytes;
};
FlashForwardTiles flash_forward_tiles(int head_dim);

// Rung 4. Same contract as rung 3; grad_k and grad_v of a key/value head sum over the query
// heads of its group.
void launch_flash_backward(ElementType type, const AttentionBackwardParams& params, cudaStream_t stream);

// Rung 4's tiles, for the grader and the page: block_m query rows per step, block_n keys per block
// (and per dK/dV tile), warps per block, dynamic shared memory per block. head_dim 64 or 128.
struct FlashBackwardTiles {
  int block_m, block_n, warps, shared_bytes;
};
FlashBackwardTiles flash_backward_tiles(int head_dim);

// The reference's Hopper path of rung 3 (flash_forward_hopper.cu): the same contract and results, with
// TMA, mbarriers, wgmma and warp specialization; sm_90a builds on a compute capability 9.0 GPU only.
// overlap: FlashAttention-3's intra-warpgroup pipelining (the softmax of key block j while O += P V of
// block j - 1 runs) instead of the plain pipeline; both are built, so that both can be timed.
void launch_flash_forward_hopper(ElementType type, const AttentionParams& params, bool overlap, cudaStream_t stream);
// Whether this process can run it on the current GPU: compute capability 9.0 and an sm_90a image.
bool flash_forward_hopper_available();
// Why the Hopper path cannot take a call ("" when it can): dtype, head_dim, empty tensors, TMA's
// alignment rule for the views (16-byte base, strides multiples of 16 bytes), the GPU or the build.
std::string flash_forward_hopper_refusal(ElementType type, const AttentionParams& params);
// Its tiles, for the probe and the page: block_m query rows (2 consumer warpgroups of 64), block_n
// keys, warps (12: a producer and 2 consumer warpgroups), stages of the K/V ring, dynamic shared memory.
struct FlashForwardHopperTiles {
  int block_m, block_n, warps, stages, shared_bytes;
};
FlashForwardHopperTiles flash_forward_hopper_tiles(int head_dim);

// The reference's Hopper path of rung 4 (flash_backward_hopper.cu): the same contract and results (dK, dV
// bitwise deterministic; dQ by float32 atomics), with TMA, mbarriers, wgmma and warp specialization; sm_90a
// builds on a compute capability 9.0 GPU only. Its workspaces differ from rung 4's: params.delta and
// lse_log2 are (batch, heads_q, flash_backward_hopper_rows(seqlen_q)) float32 each (seqlen_q padded to
// the kernel's query block), params.grad_q_accum as rung 4's; params.deterministic is refused.
void launch_flash_backward_hopper(ElementType type, const AttentionBackwardParams& params, float* lse_log2,
                                  cudaStream_t stream);
int64_t flash_backward_hopper_rows(int64_t seqlen_q);
// Why the Hopper backward cannot take a call ("" when it can): deterministic, dtype, head_dim, empty
// tensors, TMA's rule for q, k, v and grad_o, the GPU or the build.
std::string flash_backward_hopper_refusal(ElementType type, const AttentionBackwardParams& params);
// Its tiles: block_m queries a step, block_n keys a block (2 consumer warpgroups of 64), warps (12), stages
// of the Q/dO ring, dynamic shared memory.
struct FlashBackwardHopperTiles {
  int block_m, block_n, warps, stages, shared_bytes;
};
FlashBackwardHopperTiles flash_backward_hopper_tiles(int head_dim);
