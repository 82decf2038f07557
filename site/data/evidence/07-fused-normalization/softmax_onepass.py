"""Lab 07, softmax over long rows (4096 x 65536 float32): the whole 256 KiB row on chip, read from HBM once.

    ./course run site/data/evidence/07-fused-normalization/softmax_onepass.py [--build-only | --print-cuda]
    (JSON: $OUT/lab07-softmax-onepass.json)

Why: issue 13 asks >= 0.85x copy for long rows, forward (2S bytes) and backward (3S); the lab's streaming kernels
(solutions/07-fused-normalization/softmax.cu) read each row twice, the second time partly from L2, and reach 73% /
67% of copy on an H100 (NOTES.md@8a81008). A row of 65536 floats fits one SM's registers (256 KiB) plus shared
memory (227 KiB a CTA), or a Hopper cluster's. Variants (self-contained kernels; (b) needs sm_90, clusters):
  forward  a 1x1024 reg+smem128K  (a) one CTA of 1024 threads a row, each 32 floats in registers + 32 in dynamic
                                  shared memory (cp.async, each thread re-reads only its own slots: no barrier);
                                  1 CTA an SM, so an SM idles while its row reduces
           b 2x512 reg+smem64K    (b) a cluster of 2 CTAs a row, 32 + 32 floats a thread, 64 KiB each: 2 CTAs an SM
           b 2x512 smem128K       (b) 2 CTAs, 64 floats a thread in shared memory, 128 KiB each
           b 2x1024 reg           (b) 2 CTAs of 1024, 32 floats in registers
           b 4x512 reg            (b) 4 CTAs of 512, 32 floats in registers: 2 CTAs an SM, no shared memory
           b 4x256 reg+smem32K    (b) 4 CTAs of 256, 32 + 32 floats, 32 KiB each: 4 CTAs an SM
  backward (y and grad_y both needed until dot(grad_y, y) is known: 512 KiB a row, more than one SM holds, so no (a))
           b 4x512 y-reg gy-smem  4 CTAs, y 32 floats in registers, grad_y 32 in shared memory (64 KiB)
           b 8x512 reg            8 CTAs, 16 + 16 floats in registers
           b 8x256 y-reg gy-smem  8 CTAs of 256, 32 in registers + 32 in shared memory (32 KiB)
           b 4x1024 reg           4 CTAs of 1024, 16 + 16 in registers
Each thread takes its own max m_t, turns its values into exp(v - m_t) and sums them; (m, s) pairs merge over the CTA
(shuffles, shared memory) and the cluster (each CTA's pair read by all through distributed shared memory,
map_shared_rank, in rank order: the same bits in every CTA; cluster.sync before, barrier_arrive/wait so no CTA exits
while read); y = exp(v - m_t) * exp(m_t - M) / S. The backward reduces dot the same way; grad_x = y (grad_y - dot).
All kernels: at most 64 registers a thread, no spills (ptxas 13.0, sm_90a and sm_80).
Checks first: against float64 (torch.softmax, and y (grad_y - sum(grad_y y)) for the backward) at 7 x 65536, 5 x 65532
(the row's end inside a CTA), 3 rows of specials (all -inf but one element, values ~1e4, all -inf but two), and at
4096 x 65536 (rows 0::128 against float64, every row against the lab's streaming output); then the speed: the lab's
streaming kernels and torch.softmax / _softmax_backward_data, interleaved, as % of the 1 GiB copy at 2S / 3S.
Adoption: errors within 2x the lab streaming kernel's (normwise relative to float64) on every case, exact one-hot and
zero gradient on the -inf rows, no NaN where float64 has none; >= 85% of copy at 4096 x 65536, forward and backward.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

ROOT = Path(__file__).resolve().parents[4]
if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)
LAB_DIR = ROOT / "solutions" / "07-fused-normalization"
FWD = ("a 1x1024 reg+smem128K", "b 2x512 reg+smem64K", "b 2x512 smem128K", "b 2x1024 reg", "b 4x512 reg",
       "b 4x256 reg+smem32K")
BWD = ("b 4x512 y-reg gy-smem", "b 8x512 reg", "b 8x256 y-reg gy-smem", "b 4x1024 reg")
CAPACITY = 65536  # floats of a row that every variant holds
CUDA = r"""
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <stdexcept>
#include <string>
namespace cg = cooperative_groups;

struct MaxSum {
  float m, s;
};
__device__ __forceinline__ float shifted_exp(float a, float m) { return a == -INFINITY ? 0.0f : expf(a - m); }
struct Merge {  // the online softmax pair of a union of two parts (-inf parts give no NaN)
  __device__ static MaxSum identity() { return {-INFINITY, 0.0f}; }
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.m, b.m);
    return {m, a.s * shifted_exp(a.m, m) + b.s * shifted_exp(b.m, m)};
  }
};
struct Add {
  __device__ static float identity() { return 0.0f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};
__device__ __forceinline__ float shfl(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ MaxSum shfl(MaxSum v, int o) { return {shfl(v.m, o), shfl(v.s, o)}; }
// The CTA's reduction, in every thread; once per CTA (scratch is not reused, so one barrier).
template <int kThreads, typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, Op op, V* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, shfl(v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x % 32 < kThreads / 32 ? scratch[threadIdx.x % 32] : Op::identity();
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, shfl(v, o));
  return v;
}
// The cluster's reduction: each CTA's value in its shared memory, read by every CTA through distributed shared
// memory and combined in rank order (the same bits everywhere). The caller ends with cluster_done(token) so that no
// CTA exits while another still reads its part.
template <int kCluster, typename V, typename Op>
__device__ __forceinline__ V cluster_reduce(V v, Op op, V* part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kCluster > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) *part = v;
    cluster.sync();
    v = *cluster.map_shared_rank(part, 0);
#pragma unroll
    for (int r = 1; r < kCluster; ++r) v = op(v, *cluster.map_shared_rank(part, r));
    cluster.barrier_arrive();
  }
#else
  if constexpr (kCluster > 1) __trap();  // clusters are sm_90 only; the host refuses them below that
#endif
  return v;
}
template <int kCluster>
__device__ __forceinline__ void cluster_done() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kCluster > 1) cg::this_cluster().barrier_wait();
#endif
}
__device__ __forceinline__ void cp_async16(float4* dst, const float4* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
// Ordering for the compiler only: shared memory is re-read after it, not kept in registers from before (which
// would hold the row's shared-memory half in registers too and spill).
__device__ __forceinline__ void reload_barrier() { asm volatile("" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_all;\n"); }

// Forward, one read of the row: CTA `rank` of a cluster of kCluster takes float4 columns [rank kPerCta, (rank + 1)
// kPerCta) of row blockIdx.x / kCluster; thread t holds kReg float4 in registers (column j kThreads + t) and kSmem in
// dynamic shared memory (column (kReg + j) kThreads + t, copied there by cp.async, read back by t alone: no barrier).
// Per thread: its max m_t, its values replaced by exp(v - m_t) and summed; the (m, s) pairs merged over the CTA and
// the cluster; then y = exp(v - m_t) * (exp(m_t - M) / S). Past the row's end: -inf (no effect on m or s).
// At most 64 registers a thread: 1, 2 or 4 CTAs of 1024, 512 or 256 threads fit an SM as far as registers go.
template <int kCluster, int kThreads, int kReg, int kSmem>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    softmax_fwd(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
  constexpr int kPerCta = (kReg + kSmem) * kThreads;
  extern __shared__ float4 stash[];  // [kSmem][kThreads]
  __shared__ MaxSum scratch[32], part;
  const int t = threadIdx.x, rank = blockIdx.x % kCluster, valid = n4 - rank * kPerCta;
  const int64_t base = int64_t(blockIdx.x / kCluster) * n4 + int64_t(rank) * kPerCta;
  const float4 kFill = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
#pragma unroll
  for (int j = 0; j < kSmem; ++j) {
    const int i = (kReg + j) * kThreads + t;
    if (i < valid) cp_async16(&stash[j * kThreads + t], x + base + i);
    else stash[j * kThreads + t] = kFill;
  }
  float4 v[kReg > 0 ? kReg : 1];
#pragma unroll
  for (int j = 0; j < kReg; ++j) v[j] = j * kThreads + t < valid ? x[base + j * kThreads + t] : kFill;
  cp_async_wait_all();
  float m = -INFINITY, s = 0.0f;
  auto max4 = [&](const float4& q) { m = fmaxf(m, fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w))); };
  auto exp4 = [&](float4& q) {
    q = make_float4(shifted_exp(q.x, m), shifted_exp(q.y, m), shifted_exp(q.z, m), shifted_exp(q.w, m));
    s += q.x + q.y + q.z + q.w;
  };
#pragma unroll
  for (int j = 0; j < kReg; ++j) max4(v[j]);
#pragma unroll
  for (int j = 0; j < kSmem; ++j) max4(stash[j * kThreads + t]);
  reload_barrier();
#pragma unroll
  for (int j = 0; j < kReg; ++j) exp4(v[j]);
#pragma unroll
  for (int j = 0; j < kSmem; ++j) {
    float4 q = stash[j * kThreads + t];
    exp4(q);
    stash[j * kThreads + t] = q;
  }
  reload_barrier();
  MaxSum total = block_reduce<kThreads>(MaxSum{m, s}, Merge{}, scratch);
  total = cluster_reduce<kCluster>(total, Merge{}, &part);
  const float scale = shifted_exp(m, total.m) / total.s;  // 0 for a thread that saw only -inf
  auto scaled = [&](const float4& q) { return make_float4(q.x * scale, q.y * scale, q.z * scale, q.w * scale); };
#pragma unroll
  for (int j = 0; j < kReg; ++j) {
    if (j * kThreads + t < valid) y[base + j * kThreads + t] = scaled(v[j]);
  }
#pragma unroll
  for (int j = 0; j < kSmem; ++j) {
    if ((kReg + j) * kThreads + t < valid) y[base + (kReg + j) * kThreads + t] = scaled(stash[j * kThreads + t]);
  }
  cluster_done<kCluster>();
}

// Backward, one read of y and grad_y: kVec float4 of each a thread; y in registers, grad_y in registers or (kGyInSmem)
// in dynamic shared memory. dot = sum(grad_y * y) over the CTA, then the cluster; grad_x = y * (grad_y - dot).
template <int kCluster, int kThreads, int kVec, bool kGyInSmem>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    softmax_bwd(const float4* __restrict__ gy, const float4* __restrict__ y, float4* __restrict__ gx, int n4) {
  constexpr int kPerCta = kVec * kThreads;
  extern __shared__ float4 stash[];  // grad_y [kVec][kThreads] when kGyInSmem
  __shared__ float scratch[32], part;
  const int t = threadIdx.x, rank = blockIdx.x % kCluster, valid = n4 - rank * kPerCta;
  const int64_t base = int64_t(blockIdx.x / kCluster) * n4 + int64_t(rank) * kPerCta;
  const float4 kZero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 yv[kVec], gv[kGyInSmem ? 1 : kVec];
  if constexpr (kGyInSmem) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (j * kThreads + t < valid) cp_async16(&stash[j * kThreads + t], gy + base + j * kThreads + t);
      else stash[j * kThreads + t] = kZero;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) gv[j] = j * kThreads + t < valid ? gy[base + j * kThreads + t] : kZero;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) yv[j] = j * kThreads + t < valid ? y[base + j * kThreads + t] : kZero;
  if constexpr (kGyInSmem) cp_async_wait_all();
  reload_barrier();
  auto g_of = [&](int j) -> float4 {
    if constexpr (kGyInSmem) return stash[j * kThreads + t];
    else return gv[j];
  };
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float4 g = g_of(j);
    dot += g.x * yv[j].x + g.y * yv[j].y + g.z * yv[j].z + g.w * yv[j].w;
  }
  dot = cluster_reduce<kCluster>(block_reduce<kThreads>(dot, Add{}, scratch), Add{}, &part);
  reload_barrier();
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float4 g = g_of(j), q = yv[j];
    if (j * kThreads + t < valid) {
      gx[base + j * kThreads + t] =
          make_float4(q.x * (g.x - dot), q.y * (g.y - dot), q.z * (g.z - dot), q.w * (g.w - dot));
    }
  }
  cluster_done<kCluster>();
}

// Host: one launch per row (and CTA of its cluster): cudaLaunchKernelEx with the cluster-dimension attribute.
static void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(e));
}
template <typename... Params, typename... Args>
static int launch(void (*kernel)(Params...), int cluster, int threads, int smem, int64_t rows, bool occupancy_only,
                  cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024) check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(rows * cluster));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(cluster);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = cluster > 1 ? 1 : 0;
  if (occupancy_only) {  // resident clusters (or CTAs) on the whole GPU
    int count = 0;
    if (cluster > 1) {
      check(cudaOccupancyMaxActiveClusters(&count, kernel, &config));
    } else {
      int device = 0, sms = 0;
      check(cudaGetDevice(&device));
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kernel, threads, size_t(smem)));
      count *= sms;
    }
    return count;
  }
  check(cudaLaunchKernelEx(&config, kernel, args...));
  return 0;
}
#define FWD(CL, T, R, S) \
  launch(softmax_fwd<CL, T, R, S>, CL, T, (S) * (T) * 16, rows, occ, stream, x, y, n4)
// Forward variants, in the order of FWD in the script (every one holds rows of up to 65536 floats); occ: return
// the resident clusters (CTAs for variant 0) on the GPU instead of launching.
int run_forward(int variant, const void* xp, void* yp, int64_t rows, int n4, bool occ, cudaStream_t stream) {
  const float4* x = static_cast<const float4*>(xp);
  float4* y = static_cast<float4*>(yp);
  switch (variant) {
    case 0: return FWD(1, 1024, 8, 8);   // (a) one CTA: 32 floats in registers + 32 in shared memory (128 KiB)
    case 1: return FWD(2, 512, 8, 8);    // (b) 2 CTAs: 32 + 32, 64 KiB each
    case 2: return FWD(2, 512, 0, 16);   // (b) 2 CTAs: 64 floats in shared memory, 128 KiB each
    case 3: return FWD(2, 1024, 8, 0);   // (b) 2 CTAs: 32 floats in registers (1 CTA an SM)
    case 4: return FWD(4, 512, 8, 0);    // (b) 4 CTAs: 32 floats in registers (2 CTAs an SM)
    default: return FWD(4, 256, 8, 8);   // (b) 4 CTAs of 256: 32 + 32, 32 KiB each
  }
}
#define BWD(CL, T, V, SM) \
  launch(softmax_bwd<CL, T, V, SM>, CL, T, (SM) ? (V) * (T) * 16 : 0, rows, occ, stream, gy, y, gx, n4)
int run_backward(int variant, const void* gyp, const void* yp, void* gxp, int64_t rows, int n4, bool occ,
                 cudaStream_t stream) {
  const float4 *gy = static_cast<const float4*>(gyp), *y = static_cast<const float4*>(yp);
  float4* gx = static_cast<float4*>(gxp);
  switch (variant) {
    case 0: return BWD(4, 512, 8, true);   // 4 CTAs: y 32 floats in registers, grad_y 32 in shared memory (64 KiB)
    case 1: return BWD(8, 512, 4, false);  // 8 CTAs: y and grad_y 16 floats each in registers
    case 2: return BWD(8, 256, 8, true);   // 8 CTAs of 256: y 32 in registers, grad_y 32 in shared memory (32 KiB)
    default: return BWD(4, 1024, 4, false);  // 4 CTAs of 1024: 16 + 16 in registers (1 CTA an SM)
  }
}
"""
CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
int run_forward(int, const void*, void*, int64_t, int, bool, cudaStream_t);
int run_backward(int, const void*, const void*, void*, int64_t, int, bool, cudaStream_t);
// No numbers in TORCH_CHECK messages (NOTES.md@8a81008: an integer written to an ostringstream crashes on the box).
static void check(const torch::Tensor& t) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.scalar_type() == torch::kFloat && t.dim() == 2,
              "contiguous 2-D float32 CUDA tensors only");
  TORCH_CHECK(t.size(1) % 4 == 0 && t.size(1) <= 65536 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              "rows of at most 65536 floats, a multiple of 4, 16-byte aligned");
}
torch::Tensor fwd(torch::Tensor x, int64_t variant) {
  check(x);
  auto y = torch::empty_like(x);
  run_forward(int(variant), x.data_ptr(), y.data_ptr(), x.size(0), int(x.size(1) / 4), false,
              c10::cuda::getCurrentCUDAStream());
  return y;
}
torch::Tensor bwd(torch::Tensor gy, torch::Tensor y, int64_t variant) {
  check(gy); check(y);
  TORCH_CHECK(gy.sizes() == y.sizes(), "grad_y like y");
  auto gx = torch::empty_like(y);
  run_backward(int(variant), gy.data_ptr(), y.data_ptr(), gx.data_ptr(), y.size(0), int(y.size(1) / 4), false,
               c10::cuda::getCurrentCUDAStream());
  return gx;
}
int64_t resident(bool backward, int64_t variant) {  // clusters (CTAs for the non-cluster kernel) resident at once
  auto s = c10::cuda::getCurrentCUDAStream();
  return backward ? run_backward(int(variant), nullptr, nullptr, nullptr, 1, 16384, true, s)
                  : run_forward(int(variant), nullptr, nullptr, 1, 16384, true, s);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd);
  m.def("bwd", &bwd);
  m.def("resident", &resident);
}
"""
if "--print-cuda" in sys.argv:
    sys.exit(print(CUDA))
from coursekit import jit  # noqa: E402
from harness import perf  # noqa: E402

jit.ensure_arch_list()
mod = load_inline("lab07_softmax_onepass", CPP, cuda_sources=CUDA, extra_cuda_cflags=jit.NVCC_FLAGS)
lab = jit.load_lab(LAB_DIR, ROOT)
if "--build-only" in sys.argv:
    sys.exit(0)
clusters = torch.cuda.get_device_capability() >= (9, 0)
fwd_variants = [(v, n) for v, n in enumerate(FWD) if clusters or not n.startswith("b")]
bwd_variants = [(v, n) for v, n in enumerate(BWD) if clusters]
out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "resident": {}, "errors": [],
             "speed": []}
print(f"{out['device']}; clusters {'yes' if clusters else 'no (sm_90 needed): (b) variants skipped'}")
one_row = torch.randn(1, CAPACITY, device="cuda")
for kind, variants in (("forward", fwd_variants), ("backward", bwd_variants)):
    for v, name in list(variants):  # a variant that cannot launch here is dropped, with its error, not the probe
        try:
            out["resident"][f"{kind} {name}"] = mod.resident(kind == "backward", v)
            mod.fwd(one_row, v) if kind == "forward" else mod.bwd(one_row, one_row, v)
            torch.cuda.synchronize()
        except RuntimeError as error:
            out["resident"][f"{kind} {name}"] = f"dropped: {str(error).splitlines()[0][:160]}"
            variants.remove((v, name))
print("resident at once (clusters, or CTAs for (a)):", out["resident"])


def golden_backward(gy, y):
    g, y64 = gy.double(), y.double()
    return y64 * (g - (g * y64).sum(-1, keepdim=True))


def errors(got, want):
    """(normwise relative error over the rows whose float64 is finite, max abs error there, NaN count there)."""
    finite = want.isfinite().all(-1)
    g, w = got[finite].double(), want[finite]
    return ((g - w).norm() / w.norm()).item(), (g - w).abs().max().item(), int(g.isnan().sum())


def specials():
    x = torch.full((3, CAPACITY), float("-inf"), device="cuda")
    x[0, 12345] = 0.0  # all -inf but one: y one-hot
    x[1] = torch.randn(CAPACITY, device="cuda") * 1e4  # values near 1e4 must not overflow exp
    x[2, 7], x[2, CAPACITY - 1] = 3.0, 3.0  # all -inf but two: 0.5 and 0.5
    return x


gen = torch.Generator(device="cuda").manual_seed(20261124)
cases = [("7x65536", torch.randn(7, CAPACITY, device="cuda", generator=gen) * 3),
         ("5x65532", torch.randn(5, CAPACITY - 4, device="cuda", generator=gen) * 3), ("specials", specials()),
         ("4096x65536", torch.randn(4096, CAPACITY, device="cuda", generator=gen))]
for case, x in cases:
    big = x.shape[0] == 4096
    rows = slice(0, None, 128) if big else slice(None)
    gy = torch.randn(x.shape, device="cuda", generator=gen)
    y_ref = lab.softmax(x, "streaming")
    want_y = torch.softmax(x[rows].double(), -1)
    want_gx = golden_backward(gy[rows], y_ref[rows])
    gx_ref = lab.softmax_backward(gy, y_ref, "streaming")
    lab_err = errors(y_ref[rows], want_y), errors(gx_ref[rows], want_gx)
    out["errors"].append({"case": case, "variant": "lab streaming", "forward": lab_err[0], "backward": lab_err[1]})
    for kind, variants in (("forward", fwd_variants), ("backward", bwd_variants)):
        for v, name in variants:
            got = mod.fwd(x, v) if kind == "forward" else mod.bwd(gy, y_ref, v)
            row = {"case": case, "variant": name, kind: errors(got[rows], want_y if kind == "forward" else want_gx)}
            if big:  # every row against the lab's streaming output
                row["max_abs_vs_lab"] = (got - (y_ref if kind == "forward" else gx_ref)).abs().max().item()
            if case == "specials":
                exact = torch.zeros(CAPACITY, device="cuda")
                exact[12345] = 1.0
                row["one_hot_exact" if kind == "forward" else "zero_grad_exact"] = bool(
                    torch.equal(got[0], exact if kind == "forward" else torch.zeros_like(exact)))
            out["errors"].append(row)
    del x, gy, y_ref, gx_ref
print("errors against float64 (normwise relative, max abs, NaN count where float64 is finite):")
for row in out["errors"]:
    extra = {k: v for k, v in row.items() if k not in ("case", "variant", "forward", "backward")}
    parts = [f"{k} {row[k][0]:.1e} {row[k][1]:.1e} {row[k][2]}" for k in ("forward", "backward") if k in row]
    print(f"  {row['case']:<11} {row['variant']:<22} " + "  ".join(parts) + (f"  {extra}" if extra else ""))

copy = perf.copy_bandwidth()
out["copy_gbps"] = round(copy, 1)
x = torch.randn(4096, CAPACITY, device="cuda")
y = lab.softmax(x, "streaming")
gy = torch.randn_like(x)
S = x.numel() * 4
print(f"speed at 4096 x 65536 float32; copy {copy:.0f} GB/s (1 GiB)")
for kind, moved, fns in (
        ("forward", 2 * S, {"lab streaming": lambda: lab.softmax(x, "streaming"),
                            "torch.softmax": lambda: torch.softmax(x, -1),
                            **{n: (lambda v=v: mod.fwd(x, v)) for v, n in fwd_variants}}),
        ("backward", 3 * S, {"lab streaming": lambda: lab.softmax_backward(gy, y, "streaming"),
                             "torch": lambda: torch._softmax_backward_data(gy, y, -1, torch.float32),
                             **{n: (lambda v=v: mod.bwd(gy, y, v)) for v, n in bwd_variants}})):
    ms = jit.interleaved_median_ms(list(fns.values()), warmup=3, reps=20)
    for name, m in zip(fns, ms):
        pct = 100 * moved / (m * 1e-3) / 1e9 / copy
        out["speed"].append({"kind": kind, "variant": name, "ms": round(m, 4), "pct_of_copy": round(pct, 1)})
        print(f"  {kind:<8} {name:<22} {m:8.4f} ms  {pct:5.1f}% of copy", flush=True)
Path(os.environ.get("OUT", "build")).mkdir(parents=True, exist_ok=True)
Path(os.environ.get("OUT", "build"), "lab07-softmax-onepass.json").write_text(json.dumps(out, indent=1))
