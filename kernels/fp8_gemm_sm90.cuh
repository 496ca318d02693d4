// The CUTLASS 3.x kernel of fp8_gemm_sm90.cu (Hopper, sm_90a): its configurations and epilogue, included by one
// translation unit per configuration and A type (fp8_gemm_sm90_<config>_<a>.cu, two kernels each: C fp32 and bf16),
// which the build compiles in parallel (MAX_JOBS). All twelve kernels in one unit took 126 s on an H200 node and
// 112 s here (2 cores); one unit of two kernels takes 47 s here, of four 65-76 s.
//
// What CUTLASS gives and what is ours: fp8_gemm_sm90.cu's header comment.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "fp8_gemm_sm90.h"

namespace trainflow::sm90 {

using namespace cute;  // CuTe's shapes and integral constants (_1, _128, Shape<...>) spell the configuration
namespace fusion = cutlass::epilogue::fusion;

constexpr int kAlignAB = 16;  // elements of A and B per 16-byte TMA access

// The configurations fp8_gemm_sm90.h names: (M, N, K) of one CTA's tile (K in fp8 elements = bytes), its cluster,
// schedules, scheduler.
struct Cooperative {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};
struct Pingpong {
  using Tile = Shape<_64, _128, _128>;  // per warpgroup: each takes a whole tile
  using Cluster = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};
struct StreamK {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;  // the scheduler's unit is a cluster: single CTAs split K the finest
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::StreamKScheduler;
};

// Scale vectors. A stride of `true` along their dimension reads one value per row (of A) or column (of C);
// `false` (a zero stride) broadcasts element 0: a per-tensor scale. One instantiation serves both.
template <class Tile>
using ScaleA = fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<bool, _0, int64_t>>;
template <class Tile>
using ScaleB = fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, bool, int64_t>>;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// (acc * scale_a[row]) * scale_b[col]: fp32 throughout, one rounding to Out at the end.
template <class Tile, class Out>
using ScaleEpilogue = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, Out, float, kRound>, ScaleB<Tile>,
                                      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
                                                      ScaleA<Tile>, fusion::Sm90AccFetch>>;

template <class Config, class ElementA, class Out>
struct Sm90Gemm {
  using TileShape = typename Config::Tile;
  using ClusterShape = typename Config::Cluster;
  using KernelSchedule = typename Config::KernelSchedule;
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<Out>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignC,  // no source matrix C: D = scales * acc only
      Out, cutlass::layout::RowMajor, kAlignC, typename Config::EpilogueSchedule,
      ScaleEpilogue<TileShape, Out>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cutlass::layout::RowMajor, kAlignAB,                // A (M, K), K contiguous
      cutlass::float_e4m3_t, cutlass::layout::ColumnMajor, kAlignAB,  // B as CUTLASS's (K, N) column-major = our (N, K)
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      typename Config::Scheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(std::is_same_v<typename Mainloop::DispatchPolicy,
                               cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<
                                   Mainloop::DispatchPolicy::Stages, ClusterShape, KernelSchedule>>,
                "the builder must pick the FP8 mainloop that promotes partial sums into fp32");
  // Ping-pong: one warpgroup (128 threads) owns each 64x128 tile, so the other's mainloop runs beside its epilogue;
  // cooperative and stream-K: two warpgroups (256) share a 128x128 one.
  static constexpr bool kPingpong = std::is_same_v<KernelSchedule, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  static constexpr int kMmaThreads = size(typename Mainloop::TiledMma{});
  static_assert(kMmaThreads == (kPingpong ? 128 : 256) && size<0>(TileShape{}) * 2 == kMmaThreads,
                "ping-pong runs a 64-row tile per warpgroup, cooperative a 128-row tile over two (64 rows each)");

  static typename Device::Arguments arguments(const Fp8GemmArgs& p, int sm_count) {
    // Row-major (rows, cols) strides: (cols, 1, batch), one batch. Each matrix is contiguous (the binding's job).
    const auto stride_a = make_stride(int64_t{p.k}, _1{}, int64_t{0});
    const auto stride_b = make_stride(int64_t{p.k}, _1{}, int64_t{0});
    const auto stride_d = make_stride(int64_t{p.n}, _1{}, int64_t{0});
    static_assert(std::is_same_v<decltype(stride_a), const typename Kernel::StrideA> &&
                  std::is_same_v<decltype(stride_b), const typename Kernel::StrideB> &&
                  std::is_same_v<decltype(stride_d), const typename Kernel::StrideD>);
    const auto a = static_cast<const ElementA*>(p.a);
    const auto b = reinterpret_cast<const cutlass::float_e4m3_t*>(p.b);
    const auto c = static_cast<Out*>(p.c);
    cutlass::KernelHardwareInfo hw{};
    hw.sm_count = sm_count;  // the persistent grid's size; device_id only labels it (the current device runs)
    // Visitor arguments nest as the tree does: {children..., node}; the scales are {pointer, default, stride}.
    typename Epilogue::Arguments epilogue{
        {{p.scale_b, 0.0f, {_0{}, p.scale_b_per_row, 0}},
         {{p.scale_a, 0.0f, {p.scale_a_per_row, _0{}, 0}}, {}, {}},
         {}},
        nullptr, stride_d, c, stride_d};
    typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                    {p.m, p.n, p.k, 1},
                                    {a, stride_a, b, stride_b},
                                    epilogue,
                                    hw};
    args.scheduler.max_swizzle_size = p.swizzle;  // raster order: CUTLASS's heuristic (along the longer side)
    if constexpr (std::is_same_v<typename Config::Scheduler, cutlass::gemm::StreamKScheduler>) {
      using Reduction = typename Kernel::TileScheduler::ReductionMode;  // the default too: said here, relied on
      args.scheduler.reduction_mode = Reduction::Deterministic;
    }
    return args;
  }

  static size_t workspace_bytes(const Fp8GemmArgs& p, int sm_count) {
    return Device::get_workspace_size(arguments(p, sm_count));
  }

  static cudaError_t run(const Fp8GemmArgs& p, int sm_count, void* workspace, cudaStream_t stream) {
    const auto args = arguments(p, sm_count);
    if (Device::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    Device gemm;
    if (gemm.run(args, workspace, stream) != cutlass::Status::kSuccess) {
      const cudaError_t err = cudaGetLastError();
      return err == cudaSuccess ? cudaErrorLaunchFailure : err;
    }
    return cudaGetLastError();
  }
};

// CUTLASS's element type of each tag of fp8_gemm_sm90.h.
template <class A>
struct Element;
template <>
struct Element<E4m3> {
  using type = cutlass::float_e4m3_t;
};
template <>
struct Element<E5m2> {
  using type = cutlass::float_e5m2_t;
};

// fp8_gemm_sm90.h's entry points: each translation unit instantiates them for one configuration and one A type, the
// two output types (fp32, bf16) inside.
template <class Config, class A>
size_t workspace_bytes(const Fp8GemmArgs& args, int sm_count) {
  using ElementA = typename Element<A>::type;
  return args.out_bf16 ? Sm90Gemm<Config, ElementA, cutlass::bfloat16_t>::workspace_bytes(args, sm_count)
                       : Sm90Gemm<Config, ElementA, float>::workspace_bytes(args, sm_count);
}

template <class Config, class A>
cudaError_t run(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream) {
  using ElementA = typename Element<A>::type;
  return args.out_bf16 ? Sm90Gemm<Config, ElementA, cutlass::bfloat16_t>::run(args, sm_count, workspace, stream)
                       : Sm90Gemm<Config, ElementA, float>::run(args, sm_count, workspace, stream);
}

}  // namespace trainflow::sm90
