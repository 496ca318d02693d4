// FP8 GEMM for Hopper (sm_90a) on CUTLASS 3.x collectives: C = diag(scale_a) (A B^T) diag(scale_b).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr \
//        -isystem <cutlass>/include -c kernels/fp8_gemm_sm90.cu      # tests/unit/test_fp8_sass.py does this
//
// <cutlass> is the nvidia-cutlass wheel's cutlass_library/source (pinned in pyproject.toml's test extra).
//
// What CUTLASS gives (its collective builders pick every piece from the types below):
// - Mainloop: MainloopSm90TmaGmmaWarpSpecializedFP8, which the builder selects for fp8 operands under the
//   KernelTmaWarpSpecializedCooperative and ...Pingpong schedules (the *FP8FastAccum schedules would select the
//   plain mainloop, which accumulates the whole K inside the tensor core). A producer warp issues TMA loads of
//   A and B tiles (128 bytes of K) into 128-byte-swizzled shared memory through a multi-stage mbarrier pipeline
//   (as many stages as fit beside the epilogue's storage); consumer warpgroups issue wgmma (m64n128k32,
//   e4m3/e5m2 x e4m3, fp32 accumulators). Every mma_promotion_interval = 4 wgmmas (4 x 32 = 128 of K, one
//   k-tile) the tensor core's partial sums, begun from zero, are added into separate fp32 registers
//   (GmmaFP8Accumulation): fp32 promotion every 128 of K, as DeepGEMM does.
// - Kernel: GemmUniversal with a persistent tile scheduler (a grid of at most one CTA per SM walks the tiles in
//   a raster swizzled by the runtime max_swizzle_size), or the stream-K scheduler.
// - Epilogue: the TMA warp-specialized epilogue collective, running the visitor tree below.
// What is ours: the three configurations below; the epilogue's visitor tree (acc * scale_a[row] * scale_b[col],
// each scale a vector or, with a zero stride, one value, written as fp32 or bf16); the twelve instantiations
// (3 configurations x A e4m3 / e5m2 x C fp32 / bf16); and the C interface of fp8_gemm.h.
//
// The configurations (Fp8GemmSchedule; trainflow.fp8.kernels chooses one per shape, kernels/README.md):
// - Cooperative: two consumer warpgroups on one 128x128x128 tile, 64 rows each, 2x1 clusters sharing B by TMA
//   multicast. Promotion makes a warpgroup wait for its wgmmas (warpgroup_wait<0>) and spend 64 FADDs per
//   thread each k-tile; the other warpgroup's wgmmas keep the tensor core busy meanwhile. Its epilogue runs
//   after the mainloop on both warpgroups: the tensor core idles through it.
// - Pingpong: one 64x128x128 tile per warpgroup, the two warpgroups taking turns on the tensor core, so one's
//   epilogue (and promotion waits) overlap the other's mainloop; 2x1 clusters. For short K, where the epilogue
//   is a large share of a tile's time.
// - StreamK: the cooperative kernel on 128x128x128 tiles, no cluster, with CUTLASS's stream-K scheduler, which
//   splits K across CTAs when there are fewer tiles than SMs (the 70B's N = 128 per tp8 rank: 64 tiles on 132
//   SMs) and sums the fp32 partial tiles in a workspace in a fixed order (ReductionMode::Deterministic: a GEMM
//   gives the same bits every run).
//
// TMA's rule: global strides other than the innermost are multiples of 16 bytes and the bases 16-byte aligned.
// So K % 16 == 0 (A and B rows) and N % 8 == 0 (C rows of bf16 or fp32); the binding pads other shapes with
// zeros and copies misaligned tensors (fp8_binding.cpp), and CUTLASS's can_implement checks what arrives here.

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "fp8_gemm.h"

namespace trainflow {
namespace {

using namespace cute;  // CuTe's shapes and integral constants (_1, _128, Shape<...>) spell the configuration
namespace fusion = cutlass::epilogue::fusion;

constexpr int kAlignAB = 16;  // elements of A and B per 16-byte TMA access

// One configuration: (M, N, K) of one CTA's tile (K in fp8 elements = bytes), its cluster, schedules, scheduler.
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

// Calls fn(Sm90Gemm<Config, A, Out>{}) for the element types `p` names: four instantiations per configuration.
template <class Config, class Fn>
auto dispatch_types(const Fp8GemmArgs& p, Fn&& fn) {
  using cutlass::bfloat16_t;
  using cutlass::float_e4m3_t;
  using cutlass::float_e5m2_t;
  if (p.a_e5m2) {
    return p.out_bf16 ? fn(Sm90Gemm<Config, float_e5m2_t, bfloat16_t>{}) : fn(Sm90Gemm<Config, float_e5m2_t, float>{});
  }
  return p.out_bf16 ? fn(Sm90Gemm<Config, float_e4m3_t, bfloat16_t>{}) : fn(Sm90Gemm<Config, float_e4m3_t, float>{});
}

// The same for the configuration `p.schedule` names (checked by the callers below).
template <class Fn>
auto dispatch(const Fp8GemmArgs& p, Fn&& fn) {
  if (p.schedule == kFp8Pingpong) return dispatch_types<Pingpong>(p, fn);
  if (p.schedule == kFp8StreamK) return dispatch_types<StreamK>(p, fn);
  return dispatch_types<Cooperative>(p, fn);
}

bool valid_config(const Fp8GemmArgs& p) {
  const bool schedule = p.schedule == kFp8Cooperative || p.schedule == kFp8Pingpong || p.schedule == kFp8StreamK;
  return schedule && (p.swizzle == 1 || p.swizzle == 2 || p.swizzle == 4 || p.swizzle == 8);
}

}  // namespace

size_t fp8_gemm_sm90_workspace_bytes(const Fp8GemmArgs& args, int sm_count) {
  if (!valid_config(args)) return 0;
  return dispatch(args, [&](auto gemm) { return decltype(gemm)::workspace_bytes(args, sm_count); });
}

cudaError_t fp8_gemm_sm90(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (args.k <= 0 || args.k % kSm90AlignK != 0 || args.n % kSm90AlignN != 0) return cudaErrorInvalidValue;
  if (!valid_config(args)) return cudaErrorInvalidValue;
  return dispatch(args, [&](auto gemm) { return decltype(gemm)::run(args, sm_count, workspace, stream); });
}

}  // namespace trainflow
