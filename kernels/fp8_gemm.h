// The FP8 GEMMs' C interface: C = diag(scale_a) (A B^T) diag(scale_b), A (M, K) and B (N, K) row-major fp8,
// fp32 accumulation on tensor cores with fp32 promotion at least every 128 of K, C (M, N) row-major in fp32 or
// bf16. Two kernels implement it:
//   fp8_gemm.cu        mma.sync (Ada, sm_89): any M, N, K, any alignment
//   fp8_gemm_sm90.cu   CUTLASS wgmma + TMA (Hopper, sm_90a): K a multiple of 16, N of 8, 16-byte aligned bases
//
// CUDA headers only (no torch), so nvcc compiles both .cu files on any machine; fp8_binding.cpp wraps them as the
// CUDA implementations of torch ops (schemas: src/trainflow/fp8/ops.py) and shapes the inputs for each.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace trainflow {

// The sm90 kernel's configurations (fp8_gemm_sm90.cu; trainflow.fp8.kernels.Schedule holds the same values).
enum Fp8GemmSchedule : int {
  kFp8Cooperative = 0,  // two warpgroups on one 128x128 tile, 2x1 cluster: the default
  kFp8Pingpong = 1,     // a 64x128 tile per warpgroup, one's epilogue overlapping the other's mainloop
  kFp8StreamK = 2,      // cooperative 128x128 tiles with K split across CTAs: for fewer tiles than SMs
};

struct Fp8GemmArgs {
  const void* a;               // (m, k) row-major: e4m3 (activations, weights) or e5m2 (gradients), as a_e5m2 says
  const __nv_fp8_e4m3* b;      // (n, k) row-major e4m3: a Linear's weight layout, so C = A B^T is x W^T
  void* c;                     // (m, n) row-major: __nv_bfloat16 if out_bf16, else float
  const float* scale_a;        // device pointer: m values if scale_a_per_row, else 1 (dequantisation multipliers)
  const float* scale_b;        // device pointer: n values if scale_b_per_row, else 1
  int m, n, k;
  bool a_e5m2;
  bool scale_a_per_row;
  bool scale_b_per_row;
  bool out_bf16;
  int schedule;                // Fp8GemmSchedule (sm90 only)
  int swizzle;                 // the tile scheduler's max_swizzle_size: 1, 2, 4 or 8 (sm90 only)
};

// mma.sync kernel. Launches on `stream`; returns the launch's error (cudaSuccess when m or n is 0: nothing to do).
// Needs compute capability 8.9 (its only machine code is sm_89); the caller checks the device.
cudaError_t fp8_gemm_sm89(const Fp8GemmArgs& args, cudaStream_t stream);

// CUTLASS kernel: the workspace it needs for `args` (bytes of device memory, 0 if none), and the launch itself.
// The caller has padded K to kSm90AlignK, N to kSm90AlignN and checked the bases' 16-byte alignment (TMA's rule);
// returns cudaErrorInvalidValue where CUTLASS's can_implement refuses the arguments. Needs compute capability 9.0.
constexpr int kSm90AlignK = 16;  // bytes of an A or B row are TMA strides: multiples of 16
constexpr int kSm90AlignN = 8;   // a C row of bf16 (2 bytes) or fp32 (4) is then 16 or 32 bytes
size_t fp8_gemm_sm90_workspace_bytes(const Fp8GemmArgs& args, int sm_count);
cudaError_t fp8_gemm_sm90(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

}  // namespace trainflow
