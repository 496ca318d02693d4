// FP8 GEMM for Hopper (sm_90a) on CUTLASS 3.x collectives: C = diag(scale_a) (A B^T) diag(scale_b).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr \
//        -isystem <cutlass>/include -c kernels/fp8_gemm_sm90.cu      # tests/unit/test_fp8_sass.py does this
//
// <cutlass> is the nvidia-cutlass wheel's cutlass_library/source (pinned in pyproject.toml's test extra).
//
// What CUTLASS gives (its collective builders pick every piece from the types below):
// - Mainloop: MainloopSm90TmaGmmaWarpSpecializedFP8, which the builder selects for fp8 operands under the
//   KernelTmaWarpSpecializedCooperative schedule (the *FP8FastAccum schedules would select the plain mainloop,
//   which accumulates the whole K inside the tensor core). A producer warp issues TMA loads of 128 x 128-byte
//   A and B tiles into 128-byte-swizzled shared memory through a multi-stage mbarrier pipeline (as many stages
//   as fit beside the epilogue's storage); two consumer warpgroups issue wgmma (m64n128k32, e4m3/e5m2 x e4m3,
//   fp32 accumulators) on one 128 x 128 tile of C, 64 rows each. Every mma_promotion_interval = 4 wgmmas
//   (4 x 32 = 128 of K, one k-tile) the tensor core's partial sums, begun from zero, are added into separate
//   fp32 registers (GmmaFP8Accumulation): fp32 promotion every 128 of K, as DeepGEMM does.
// - Kernel: GemmUniversal with the persistent tile scheduler (a grid of at most one CTA per SM walks the
//   tiles), in clusters of 2 CTAs along M that share each B tile through TMA multicast.
// - Epilogue: the TMA warp-specialized epilogue collective, running the visitor tree below.
// What is ours: the choice of schedule, tile and cluster above; the epilogue's visitor tree
// (acc * scale_a[row] * scale_b[col], each scale a vector or, with a zero stride, one value, written as fp32 or
// bf16); the four instantiations (A e4m3 / e5m2, C fp32 / bf16); and the C interface of fp8_gemm.h.
// Why cooperative, not ping-pong: promotion makes a consumer wait for its wgmmas (warpgroup_wait<0>) and spend
// 64 FADDs per thread each k-tile; with both warpgroups on one tile the other warpgroup's wgmmas keep the tensor
// core busy meanwhile, and 128 x 128 keeps the doubled accumulators (2 x 64 fp32 per thread) in registers.
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

using TileShape = Shape<_128, _128, _128>;  // (M, N, K) of one CTA's tile; K in fp8 elements = bytes
using ClusterShape = Shape<_2, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
constexpr int kAlignAB = 16;  // elements of A and B per 16-byte TMA access

// Scale vectors. A stride of `true` along their dimension reads one value per row (of A) or column (of C);
// `false` (a zero stride) broadcasts element 0: a per-tensor scale. One instantiation serves both.
using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<bool, _0, int64_t>>;
using ScaleB = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, bool, int64_t>>;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// (acc * scale_a[row]) * scale_b[col]: fp32 throughout, one rounding to Out at the end.
template <class Out>
using ScaleEpilogue = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::multiplies, Out, float, kRound>, ScaleB,
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleA, fusion::Sm90AccFetch>>;

template <class ElementA, class Out>
struct Sm90Gemm {
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<Out>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignC,  // no source matrix C: D = scales * acc only
      Out, cutlass::layout::RowMajor, kAlignC, EpilogueSchedule, ScaleEpilogue<Out>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cutlass::layout::RowMajor, kAlignAB,                // A (M, K), K contiguous
      cutlass::float_e4m3_t, cutlass::layout::ColumnMajor, kAlignAB,  // B as CUTLASS's (K, N) column-major = our (N, K)
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(std::is_same_v<typename Mainloop::DispatchPolicy,
                               cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<
                                   Mainloop::DispatchPolicy::Stages, ClusterShape, KernelSchedule>>,
                "the builder must pick the FP8 mainloop that promotes partial sums into fp32");

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

// Calls Fn::template call<Sm90Gemm<A, Out>> for the element types `p` names: the four instantiations.
template <class Fn>
auto dispatch(const Fp8GemmArgs& p, Fn&& fn) {
  using cutlass::bfloat16_t;
  using cutlass::float_e4m3_t;
  using cutlass::float_e5m2_t;
  if (p.a_e5m2) {
    return p.out_bf16 ? fn(Sm90Gemm<float_e5m2_t, bfloat16_t>{}) : fn(Sm90Gemm<float_e5m2_t, float>{});
  }
  return p.out_bf16 ? fn(Sm90Gemm<float_e4m3_t, bfloat16_t>{}) : fn(Sm90Gemm<float_e4m3_t, float>{});
}

}  // namespace

size_t fp8_gemm_sm90_workspace_bytes(const Fp8GemmArgs& args, int sm_count) {
  return dispatch(args, [&](auto gemm) { return decltype(gemm)::workspace_bytes(args, sm_count); });
}

cudaError_t fp8_gemm_sm90(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (args.k <= 0 || args.k % kSm90AlignK != 0 || args.n % kSm90AlignN != 0) return cudaErrorInvalidValue;
  return dispatch(args, [&](auto gemm) { return decltype(gemm)::run(args, sm_count, workspace, stream); });
}

}  // namespace trainflow
