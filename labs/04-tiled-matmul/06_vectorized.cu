// Lab skeleton generated from solutions/04-tiled-matmul/06_vectorized.cu by `./course labs` [lab-hash c9b9165e4450].
// Students: fill in the TODO(lab04.k) blocks, then run `./course grade 04`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Kernel 6: vectorized loads. Kernel 5's tiles, moved in 16-byte float4s: one float4 load
// from global memory instead of four float loads, and 16-byte loads from shared memory in
// the inner loop, which needs each thread's 8 A values contiguous: so the A tile is stored
// transposed, a_tile[k][m], while it is written to shared memory.
#include <course/cuda.cuh>

#include "tiled_matmul.h"

namespace {
// --8<-- [start:config]
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 8;  // kernel 5's tiles
constexpr int kThreadM = 8, kThreadN = 8;
constexpr int kThreads = (kBlockM / kThreadM) * (kBlockN / kThreadN);  // 256
constexpr int kMinBlocksPerSm = 2;  // at most 128 registers per thread, as in kernel 5
constexpr int kVector = 4;          // floats per float4
// One float4 of A and one of B per thread per step: 128 x 8 / 4 = 8 x 128 / 4 = 256 float4s.
static_assert(kBlockM * kBlockK / kVector == kThreads, "the A tile is one float4 per thread");
static_assert(kBlockK * kBlockN / kVector == kThreads, "the B tile is one float4 per thread");
static_assert(kThreadM % kVector == 0 && kThreadN % kVector == 0, "fragments are read as whole float4s");
// A float4 along K (for A) or along N (for B and C) never straddles the edge of a matrix
// when K and N are multiples of 4: each float4 is all inside or all outside, so a guard per
// float4 is exact. can_vectorize() checks that, and the alignment, before launching.
static_assert(kBlockK % kVector == 0 && kBlockN % kVector == 0, "tile edges fall between float4s");
// --8<-- [end:config]
}  // namespace

// --8<-- [start:can_vectorize]
bool can_vectorize(int64_t M, int64_t N, int64_t K, uintptr_t a_address, uintptr_t b_address, uintptr_t c_address) {
  (void)M;  // rows are guarded one by one: any M works
  // TODO(lab04.3): return true only if every float4 access is whole and 16-byte aligned: each row of A starts
  //   K floats after the previous one, each row of B and C N floats after (so K and N must be multiples of 4), and the
  //   first rows start at a_address, b_address, c_address
  return false;
}
// --8<-- [end:can_vectorize]

// --8<-- [start:vectorized]
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    sgemm_vectorized(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                     int K) {
  __shared__ __align__(16) float a_tile[kBlockK][kBlockM];  // transposed: a_tile[k][r] = A[row0 + r, k0 + k]
  __shared__ __align__(16) float b_tile[kBlockK][kBlockN];  // b_tile[k][c] = B[k0 + k, col0 + c]
  const int row0 = blockIdx.y * kBlockM, col0 = blockIdx.x * kBlockN;
  const int t = threadIdx.x;
  const int thread_row = (t / (kBlockN / kThreadN)) * kThreadM;
  const int thread_col = (t % (kBlockN / kThreadN)) * kThreadN;
  const int a_row = t / (kBlockK / kVector), a_k = (t % (kBlockK / kVector)) * kVector;
  const int b_row = t / (kBlockN / kVector), b_col = (t % (kBlockN / kVector)) * kVector;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  float acc[kThreadM][kThreadN] = {};
  float a_frag[kThreadM], b_frag[kThreadN];
  for (int k0 = 0; k0 < K; k0 += kBlockK) {
    const bool a_inside = row0 + a_row < M && k0 + a_k < K;
    const float4 a = a_inside ? *reinterpret_cast<const float4*>(&A[(row0 + a_row) * K + k0 + a_k]) : zero;
    // Transpose on the way in: the 4 floats of A's row go down column a_row of a_tile.
    a_tile[a_k + 0][a_row] = a.x;
    a_tile[a_k + 1][a_row] = a.y;
    a_tile[a_k + 2][a_row] = a.z;
    a_tile[a_k + 3][a_row] = a.w;
    const bool b_inside = k0 + b_row < K && col0 + b_col < N;
    *reinterpret_cast<float4*>(&b_tile[b_row][b_col]) =
        b_inside ? *reinterpret_cast<const float4*>(&B[(k0 + b_row) * N + col0 + b_col]) : zero;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBlockK; ++k) {
#pragma unroll
      for (int i = 0; i < kThreadM; i += kVector)
        *reinterpret_cast<float4*>(&a_frag[i]) = *reinterpret_cast<const float4*>(&a_tile[k][thread_row + i]);
#pragma unroll
      for (int j = 0; j < kThreadN; j += kVector)
        *reinterpret_cast<float4*>(&b_frag[j]) = *reinterpret_cast<const float4*>(&b_tile[k][thread_col + j]);
#pragma unroll
      for (int i = 0; i < kThreadM; ++i)
#pragma unroll
        for (int j = 0; j < kThreadN; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
    __syncthreads();
  }
  store_tile<kVector>(C, acc, row0 + thread_row, col0 + thread_col, M, N);  // float4 stores, guarded per float4
}
// --8<-- [end:vectorized]

BlockTile sgemm_vectorized_tile() { return {kBlockM, kBlockN}; }

void launch_sgemm_vectorized(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  if (!can_vectorize(M, N, K, reinterpret_cast<uintptr_t>(A), reinterpret_cast<uintptr_t>(B),
                     reinterpret_cast<uintptr_t>(C))) {
    launch_sgemm_blocktiling_2d(A, B, C, M, N, K, stream);  // scalar loads, guarded per element
    return;
  }
  const dim3 grid(course::ceil_div(N, kBlockN), course::ceil_div(M, kBlockM));
  sgemm_vectorized<<<grid, kThreads, 0, stream>>>(A, B, C, M, N, K);
  COURSE_CHECK_LAUNCH();
}
