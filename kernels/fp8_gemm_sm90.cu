// FP8 GEMM for Hopper (sm_90a) on CUTLASS 3.x collectives: C = diag(scale_a) (A B^T) diag(scale_b).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr \
//        -isystem <cutlass>/include -c kernels/fp8_gemm_sm90_cooperative.cu   # tests/unit/test_fp8_sass.py does this
//
// Five files: this one (the C interface's entry points, dispatching on the configuration, no CUTLASS),
// fp8_gemm_sm90.cuh (the CUTLASS kernel below), fp8_gemm_sm90.h (what this file sees of it), and one translation unit
// per configuration, fp8_gemm_sm90_{cooperative,pingpong,stream_k}.cu, each instantiating its four kernels, so that
// a build compiles the three in parallel.
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

#include "fp8_gemm_sm90.h"

namespace trainflow {
namespace {

bool valid_config(const Fp8GemmArgs& p) {
  const bool schedule = p.schedule == kFp8Cooperative || p.schedule == kFp8Pingpong || p.schedule == kFp8StreamK;
  return schedule && (p.swizzle == 1 || p.swizzle == 2 || p.swizzle == 4 || p.swizzle == 8);
}

}  // namespace

// Each branch calls the instantiation of one translation unit (fp8_gemm_sm90.h).
size_t fp8_gemm_sm90_workspace_bytes(const Fp8GemmArgs& args, int sm_count) {
  using namespace sm90;
  if (!valid_config(args)) return 0;
  const bool e5m2 = args.a_e5m2;
  switch (args.schedule) {
    case kFp8Pingpong:
      return e5m2 ? workspace_bytes<Pingpong, E5m2>(args, sm_count) : workspace_bytes<Pingpong, E4m3>(args, sm_count);
    case kFp8StreamK:
      return e5m2 ? workspace_bytes<StreamK, E5m2>(args, sm_count) : workspace_bytes<StreamK, E4m3>(args, sm_count);
    default:
      return e5m2 ? workspace_bytes<Cooperative, E5m2>(args, sm_count)
                  : workspace_bytes<Cooperative, E4m3>(args, sm_count);
  }
}

cudaError_t fp8_gemm_sm90(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream) {
  using namespace sm90;
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (args.k <= 0 || args.k % kSm90AlignK != 0 || args.n % kSm90AlignN != 0) return cudaErrorInvalidValue;
  if (!valid_config(args)) return cudaErrorInvalidValue;
  const bool e5m2 = args.a_e5m2;
  switch (args.schedule) {
    case kFp8Pingpong:
      return e5m2 ? run<Pingpong, E5m2>(args, sm_count, workspace, stream)
                  : run<Pingpong, E4m3>(args, sm_count, workspace, stream);
    case kFp8StreamK:
      return e5m2 ? run<StreamK, E5m2>(args, sm_count, workspace, stream)
                  : run<StreamK, E4m3>(args, sm_count, workspace, stream);
    default:
      return e5m2 ? run<Cooperative, E5m2>(args, sm_count, workspace, stream)
                  : run<Cooperative, E4m3>(args, sm_count, workspace, stream);
  }
}

}  // namespace trainflow
