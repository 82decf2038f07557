// Lesson 10: lesson 05's out = gelu(x @ weight^T + bias) through CUTLASS 3.x on Hopper (sm_90a).
// What lesson 05's reference Hopper path (linear_act_wgmma.cu) writes by hand, CUTLASS assembles from parts:
//  - the mainloop: CollectiveBuilder picks TMA loads into 128-byte-swizzled shared memory (the
//    GMMA::Layout_K_SW128_Atom that cute_layouts.cpp prints), wgmma, a ring of stages sized to what shared
//    memory is left after the epilogue's (StageCountAutoCarveout), producer/consumer warp specialization;
//  - the epilogue: an epilogue visitor tree (EVT), a small expression tree evaluated on each accumulator
//    fragment before one rounding to bf16 and a TMA store:
//        Gelu( Plus( AccFetch, RowBroadcast(bias) ) )
//    RowBroadcast reads bias[n] once per tile column (a row vector broadcast down the M rows);
//  - the kernel: GemmUniversal with the cooperative schedule (two consumer warpgroups share a 128 x 256
//    tile) and its persistent tile scheduler (one block per SM walks the tiles), launched by
//    GemmUniversalAdapter, which also checks the problem (can_implement) and sizes the workspace.
// Built for sm_90a only (nvcc -arch=sm_90a; TORCH_CUDA_ARCH_LIST=9.0a): on any other target CUTLASS compiles
// the kernel's body away, and gemm_bias_gelu_sm90_available() says false.
// Compiles for sm_90a with the pinned nvidia-cutlass 4.2.0.0 and nvcc 13.0; its results on an H100 and how its
// configuration was chosen: lesson 10 and its notes (lessons/notes/10-cutlass.md).
// CUTLASS's device-side assert()s (e.g. `k_tile_count >= 1` in the sm90 mainloop) are a function call
// (__assertfail) inside the wgmma pipeline: ptxas then serializes every wgmma (warning C7510, "wgmma pipeline
// crossing function boundary"). torch's JIT build does not define NDEBUG, so this file does, before any
// header can include <cassert>. (K = 0, which that assert guards, is handled before the launch.)
#ifndef NDEBUG
#define NDEBUG
#endif

#include <course/cuda.cuh>

// cute/tensor.hpp before the CUTLASS headers that use it.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/util/packed_stride.hpp>

#include <cxxabi.h>

#include <cmath>
#include <cstdlib>
#include <typeinfo>
#include <stdexcept>
#include <string>

#include "gemm_bias_gelu.h"

namespace {

using namespace cute;

// ---------------------------------------------------------------- the problem: types and layouts
using ElementA = cutlass::bfloat16_t;  // x [M, K], row-major: K-major, as lesson 05
using LayoutA = cutlass::layout::RowMajor;
using ElementB = cutlass::bfloat16_t;  // weight [N, K], row-major = B [K, N] column-major: K-major too ("TN")
using LayoutB = cutlass::layout::ColumnMajor;
using ElementD = cutlass::bfloat16_t;  // out [M, N], row-major
using LayoutD = cutlass::layout::RowMajor;
using ElementC = void;  // no source matrix C: out = f(acc, bias), nothing else is read
using LayoutC = LayoutD;
using ElementBias = cutlass::bfloat16_t;
using ElementAccumulator = float;
using ElementCompute = float;  // the epilogue computes in fp32, and rounds once, to bf16, at the end
constexpr int kAlignment = 128 / cutlass::sizeof_bits<cutlass::bfloat16_t>::value;  // 8 elements = 16 bytes
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// ---------------------------------------------------------------- the shapes (the lesson's tuning knobs)
// The cooperative schedule splits a tile's M between two consumer warpgroups, so tile M is 128 or more; a
// k-slice of 64 bf16 is one 128-byte swizzle row (cute_layouts.cpp's Layout_K_SW128_Atom).
// SOLUTION BEGIN lab10.2: the output tile (M x N x K) and the cluster (blocks along M x N x 1), with your reason
//   in a comment. The given 128 x 128 x 64 tile and 1 x 1 cluster are correct, and slower than they need be.
// 128 x 256 output tile, k-slice 64, as lesson 05's Hopper path: per k-slice a block loads (128 + 256) x 64
// elements for 128 x 256 x 64 multiply-adds, 85 per element loaded against 64 for a 128 x 128 tile. A cluster
// of 2 blocks along M shares each weight tile through TMA multicast, halving the weight's loads from L2.
// Measured against the others at 4096^3 on an H100 (the GEMM alone = 1; lesson 10's notes): this 0.942-0.944x;
// the same tile with a 1 x 2 cluster 0.903x; pingpong 128 x 128 0.856x and 64 x 256 0.797x (64 and 51
// multiply-adds per element loaded; whether that is what they lose to was not profiled).
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;
// SOLUTION STUB
// using TileShape = Shape<_128, _128, _64>;
// using ClusterShape = Shape<_1, _1, _1>;
// SOLUTION END
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

// ---------------------------------------------------------------- the epilogue visitor tree
// GELU, tanh form, exactly lesson 05's activate() (solutions/05-tensor-cores/mma.cuh): x / (1 + exp(-2u)),
// u = sqrt(2/pi) (x + 0.044715 x^3), with __expf and __fdividef. CUTLASS's own GELU_taylor computes the
// same function through tanh.approx.f32 (cutlass/fast_math.h), whose absolute error in tanh becomes a
// large relative error where GELU is near zero (x < -2): to be measured against this one on the GPU.
// An EVT compute node takes ComputeFn<Array<ElementCompute, N>> and calls it on each fragment.
template <class T>
struct CourseGelu {
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
#if defined(__CUDA_ARCH__)
    return __fdividef(x, 1.0f + __expf(-2.0f * kSqrt2OverPi * (x + kCubic * x * x * x)));
#else
    return x / (1.0f + std::exp(-2.0f * kSqrt2OverPi * (x + kCubic * x * x * x)));
#endif
  }
};
template <class T, int N>
struct CourseGelu<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& values) const {
    cutlass::Array<T, N> result;
    CourseGelu<T> gelu;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) result[i] = gelu(values[i]);
    return result;
  }
};

namespace fusion = cutlass::epilogue::fusion;
// --8<-- [start:evt]
// SOLUTION BEGIN lab10.1: the epilogue visitor tree BiasGelu = Gelu(Plus(AccFetch, RowBroadcast(bias))): nodes
//   are fusion::Sm90EVT<parent, children...>; Sm90Compute<Fn, ElementOutput, ElementCompute, kRound> applies Fn;
//   the bias is a row vector (stride 0 along M). Its arguments are filled in make_arguments (lab10.1 too).
// bias[n]: a row vector (stride 0 along M, 1 along N, 0 along the batch), read once per tile into shared memory.
using Bias = fusion::Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute, Stride<_0, _1, _0>, kAlignment>;
using AddBias = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, ElementCompute, ElementCompute, kRound>,
                                fusion::Sm90AccFetch, Bias>;
using BiasGelu = fusion::Sm90EVT<fusion::Sm90Compute<CourseGelu, ElementD, ElementCompute, kRound>, AddBias>;
// SOLUTION STUB
// // out = acc: the accumulator, rounded to bf16, with no bias and no GELU.
// using BiasGelu = fusion::Sm90EVT<
// fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, ElementCompute, kRound>, fusion::Sm90AccFetch>;
// SOLUTION END
// --8<-- [end:evt]

// ---------------------------------------------------------------- the kernel, assembled
// The epilogue walks the output tile in 128 x 64 pieces (the builder's own choice, EpilogueTileAuto, is 128 x 32 for
// this tile): half the pieces, so half the epilogue's barriers and TMA stores a tile. Its staging buffer grows, and
// the main loop keeps 4 stages in 231,424 bytes of shared memory (the limit is 232,448). With the scheduler's
// swizzle below, 0.956x the GEMM alone against 0.954x with the swizzle alone (H100, one run each).
using EpilogueTile = Shape<_128, _64>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTile, ElementAccumulator,
    ElementCompute, ElementC, LayoutC, kAlignment, ElementD, LayoutD, kAlignment, EpilogueSchedule,
    BiasGelu>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignment, ElementB, LayoutB, kAlignment,
    ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>,  // M, N, K, batch
                                                        CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
// course: library kernel device_kernel (GemmUniversalAdapter launches cutlass::device_kernel<GemmKernel>: the
// name ./course sanitize checks, tools/course/sanitizer.py)

COURSE_SM90A_IMAGE_FLAG(built_for_sm90a);

typename Gemm::Arguments make_arguments(const void* x, const void* weight, const void* bias, void* out, int64_t M,
                                        int64_t N, int64_t K) {
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  const auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, make_shape(m, k, 1));
  const auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, make_shape(n, k, 1));
  const auto stride_d = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, make_shape(m, n, 1));
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {static_cast<const ElementA*>(x), stride_a, static_cast<const ElementB*>(weight), stride_b},
      {{},  // the EVT's arguments, filled below
       nullptr,
       typename GemmKernel::StrideC{},
       static_cast<ElementD*>(out),
       stride_d}};
  // Each node's arguments: {first child's, ..., last child's, the node's own}.
  // --8<-- [start:evt_arguments]
  // SOLUTION BEGIN lab10.1: the arguments of BiasGelu, nested as its nodes are (only the bias has any)
  arguments.epilogue.thread = {
      // Gelu(...)
      {
          // Plus(acc, bias)
          {},                                       // AccFetch
          {static_cast<const ElementBias*>(bias)},  // RowBroadcast: ptr_row (null_default 0, dRow {})
          {}                                        // plus
      },
      {}  // CourseGelu
  };
  // SOLUTION STUB
  // arguments.epilogue.thread = {{}, {}};  // {AccFetch's, Identity's}
  // (void)bias;
  // SOLUTION END
  // --8<-- [end:evt_arguments]
  // The persistent scheduler hands each block its next tile in groups of 8 along the rasterized dimension instead of
  // walking a whole row of tiles, meant to let the tiles in flight at once share more A and B panels in L2 (its
  // hit rate was not measured). 0.954x the GEMM alone against 0.942-0.944x without (H100, lesson 10's notes,
  // two runs).
  arguments.scheduler.max_swizzle_size = 8;
  arguments.hw_info.device_id = course::current_device();
  arguments.hw_info.sm_count = course::device_attribute(cudaDevAttrMultiProcessorCount);
  return arguments;
}

void check(cutlass::Status status, const char* what) {
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("gemm_bias_gelu_sm90: ") + what + ": " + cutlassGetStatusString(status));
  }
}

}  // namespace

bool gemm_bias_gelu_sm90_available() {
  static course::PerDeviceCache loaded;
  return course::sm90a_image_loaded(loaded,
                                    [](int* out) { return cudaMemcpyFromSymbol(out, built_for_sm90a, sizeof(int)); });
}

size_t gemm_bias_gelu_sm90_workspace_bytes(int64_t M, int64_t N, int64_t K) {
  return Gemm::get_workspace_size(make_arguments(nullptr, nullptr, nullptr, nullptr, M, N, K));
}

std::string gemm_bias_gelu_sm90_epilogue() {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(BiasGelu).name(), nullptr, nullptr, &status);
  const std::string result = status == 0 && name != nullptr ? name : typeid(BiasGelu).name();
  std::free(name);
  return result;
}

CutlassConfig gemm_bias_gelu_sm90_config() {
  return {size<0>(TileShape{}),
          size<1>(TileShape{}),
          size<2>(TileShape{}),
          size<0>(ClusterShape{}),
          size<1>(ClusterShape{}),
          CollectiveMainloop::DispatchPolicy::Stages,
          static_cast<int>(GemmKernel::SharedStorageSize)};
}

void launch_gemm_bias_gelu_sm90(const void* x, const void* weight, const void* bias, void* out, int64_t M, int64_t N,
                                int64_t K, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!gemm_bias_gelu_sm90_available()) {
    throw std::runtime_error(
        "gemm_bias_gelu_sm90: needs a Hopper GPU (compute capability 9.0) and a build for sm_90a "
        "(TORCH_CUDA_ARCH_LIST=9.0a)");
  }
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no k-tiles: CUTLASS's mainloop requires one (its assert, compiled out here, says so)
    throw std::runtime_error("gemm_bias_gelu_sm90: K = 0 is not supported (the wrapper writes gelu(bias) itself)");
  }
  constexpr int64_t kMaxExtent = 0x7fffffff;  // CUTLASS's problem shape here is int; TMA coordinates are 32-bit
  if (M > kMaxExtent || N > kMaxExtent || K > kMaxExtent) {
    throw std::runtime_error("gemm_bias_gelu_sm90: M, N and K must each be below 2^31");
  }
  const auto arguments = make_arguments(x, weight, bias, out, M, N, K);
  if (workspace_bytes < Gemm::get_workspace_size(arguments)) {
    throw std::runtime_error("gemm_bias_gelu_sm90: workspace smaller than gemm_bias_gelu_sm90_workspace_bytes()");
  }
  Gemm gemm;
  check(gemm.can_implement(arguments), "can_implement (TMA alignment: K and N multiples of 8?)");
  // initialize() fails when cudaFuncSetAttribute refuses the kernel's shared memory (CUTLASS clears the CUDA error
  // and returns kErrorInternal): say how much it asked for. run() likewise consumes the launch's CUDA error; a
  // cluster launch that fails also prints "[ ERROR: CUDA Runtime ] ... cluster_launch.hpp" on stderr.
  const cutlass::Status initialized = gemm.initialize(arguments, workspace, stream);
  if (initialized != cutlass::Status::kSuccess) {
    const std::string what = "initialize (the kernel asks for " + std::to_string(GemmKernel::SharedStorageSize) +
                             " bytes of shared memory; this GPU allows " +
                             std::to_string(course::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) + ")";
    check(initialized, what.c_str());
  }
  check(gemm.run(stream), "run (the kernel's launch)");
  COURSE_CHECK_LAUNCH();
}
